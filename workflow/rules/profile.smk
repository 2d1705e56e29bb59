# This machine's host-to-device bandwidth and compute, measured (only with `hardware.measure: true`).


rule profile:
    output:
        profile="results/profile/measured/profile.yaml",
        csv="results/profile/measured/bandwidth.csv",
    conda:
        ENV
    log:
        "results/logs/profile/measured.log",
    params:
        out=lambda wc, output: str(Path(output.profile).parent),
    threads: 2
    shell:
        "python -m specter profile-bandwidth --out {params.out} --name measured > {log} 2>&1"
