# Runs: the numerics recorded once per (model, prompt set, prompt length), then every system and sweep replayed on them.


rule record:
    input:
        model=model_config,
        draft=main_draft_meta,
    output:
        memo="results/memo/{model}/{dataset}-p{prefix}.pkl",
    conda:
        ENV
    log:
        "results/logs/record/{model}/{dataset}-p{prefix}.log",
    params:
        args=lambda wc: common_args(wc.model, wc.dataset),
        systems=_record_systems,
        timing=RECORD_TIMING,
        k=K["main"],
    threads: 1  # one thread per job, two jobs at once: better use of 2 cores than one job on two
    shell:
        "python -m specter sweep --systems {params.systems} --k {params.k} {params.args} --prefix-tokens {wildcards.prefix} "
        "{params.timing} --threads {threads} --memo-out {output.memo} > {log} 2>&1"


rule record_k_sweep:
    """Specter at every K of the k_sweep and with each governor: a job of its own, beside the main record."""
    input:
        model=model_config,
        draft=main_draft_meta,
    output:
        memo="results/memo/{model}/{dataset}-p{prefix}-k_sweep.pkl",
    conda:
        ENV
    log:
        "results/logs/record/{model}/{dataset}-p{prefix}-k_sweep.log",
    params:
        args=lambda wc: common_args(wc.model, wc.dataset),
        ks=K_SWEEP,
        timing=RECORD_TIMING,
    threads: 1
    shell:
        "python -m specter sweep --systems specter --k {params.ks} {params.args} --prefix-tokens {wildcards.prefix} "
        "{params.timing} --threads {threads} --memo-out {output.memo} > {log} 2>&1"


rule run:
    """One system on one prompt set at the main settings: `snakemake results/runs/<model>/<set>/<system>.jsonl`."""
    input:
        model=model_config,
        draft=main_draft_meta,
        memo=lambda wc: memo_path(wc.model, wc.dataset, MAIN_PREFIX),
    output:
        "results/runs/{model}/{dataset}/{system}.jsonl",
    conda:
        ENV
    log:
        "results/logs/run/{model}/{dataset}/{system}.log",
    params:
        args=lambda wc: common_args(wc.model, wc.dataset),
        timing=MAIN_TIMING,
        k=K["main"],
        prefix=MAIN_PREFIX,
    threads: RUN_THREADS
    shell:
        "python -m specter run --system {wildcards.system} {params.args} --prefix-tokens {params.prefix} --k {params.k} "
        "{params.timing} --memo {input.memo} --threads {threads} --out {output} > {log} 2>&1"


rule sweep:
    input:
        model=model_config,
        draft=main_draft_meta,
        memos=_sweep_memos,
        profile=lambda wc: measured_profile() if wc.sweep == "hardware" else [],
    output:
        "results/experiments/{sweep}/{model}/{dataset}.jsonl",
    conda:
        ENV
    log:
        "results/logs/sweep/{sweep}/{model}/{dataset}.log",
    params:
        args=lambda wc: common_args(wc.model, wc.dataset),
        grid=_sweep_args,
        memos=lambda wc, input: " ".join(f"--memo {m}" for m in input.memos),
    threads: RUN_THREADS
    shell:
        "python -m specter sweep {params.args} {params.grid} {params.memos} --threads {threads} --out {output} > {log} 2>&1"
