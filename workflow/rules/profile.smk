# This machine's host-to-device bandwidth and compute, measured (only with `hardware.measure: true`).


rule profile:
    output:
        profile="results/profile/measured/profile.yaml",
        csv="results/profile/measured/bandwidth.csv",
    conda:
        ENV
    log:
        "results/logs/profile/measured.log",
    benchmark:
        "results/benchmarks/profile/measured.tsv"
    threads: 2
    shell:
        "python -m specter profile-bandwidth --out results/profile/measured --name measured > {log:q} 2>&1"
