# This machine's host-to-device bandwidth and compute, measured: `measured` (the GPU where there is one, else the CPU)
# joins the experiments that vary `hardware` with `hardware.measure: true`; `cpu` and `cuda` are the live engine's
# device (`hardware.device`), the profile the live runs' simulated twins are scheduled on (on the CPU at the threads
# those runs use; its dispatch time per kernel timed on the class and widths of the model the live runs decode).


rule profile:
    input:
        models=lambda wc: [f"{d}/config.json" for d in dispatch_model(wc)],
    output:
        profile="results/profile/{profiled}/profile.yaml",
        csv="results/profile/{profiled}/bandwidth.csv",
    wildcard_constraints:
        profiled="measured|cpu|cuda",
    conda:
        ENV
    log:
        "results/logs/profile/{profiled}.log",
    benchmark:
        "results/benchmarks/profile/{profiled}.tsv"
    params:
        args=lambda wc: join(["--device", "auto" if wc.profiled == "measured" else wc.profiled,
                              "--out", f"results/profile/{wc.profiled}",
                              "--name", "measured" if wc.profiled == "measured" else f"measured-{wc.profiled}",
                              *[a for d in dispatch_model(wc) for a in ("--dispatch-model", d)]]),
    threads: lambda wc: 2 if wc.profiled == "measured" else workflow.cores
    shell:
        "python -m specter profile-bandwidth {params.args} --threads {threads} > {log:q} 2>&1"
