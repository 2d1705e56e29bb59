# Runs: the numerics recorded once per (model, prompt set), then every system and sweep replayed on them. Experiments
# that vary the numerics themselves (K, prompt length) record their own.


rule record:
    """The main recording: every system of the experiments that replay it, at the main settings."""
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
        systems=",".join(RECORD_SYSTEMS),
        timing=RECORD_TIMING,
        k=K["main"],
    threads: 1  # one thread per job, two jobs at once: better use of 2 cores than one job on two
    shell:
        "python -m specter sweep --systems {params.systems} --k {params.k} {params.args} --prefix-tokens {wildcards.prefix} "
        "{params.timing} --threads {threads} --memo-out {output.memo} > {log} 2>&1"


rule record_experiment:
    """An experiment's own recording (it varies K or the prompt length): its grid's numerics, a job of its own."""
    input:
        model=model_config,
        draft=main_draft_meta,
    output:
        memo="results/memo/{model}/{dataset}-p{prefix}-{sweep}.pkl",
    conda:
        ENV
    log:
        "results/logs/record/{model}/{dataset}-p{prefix}-{sweep}.log",
    params:
        args=lambda wc: common_args(wc.model, wc.dataset),
        grid=lambda wc: grid_args(wc.sweep, numerics_only=True),
    threads: 1
    shell:
        "python -m specter sweep {params.args} {params.grid} --threads {threads} --memo-out {output.memo} > {log} 2>&1"


rule run:
    """One system on one prompt set at the main settings: `snakemake results/runs/<model>/<set>/<system>.jsonl`."""
    input:
        model=model_config,
        draft=main_draft_meta,
        memo=lambda wc: memo_path(wc.model, wc.dataset),
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
    """One experiment's grid (its config entry's systems, axes and options) on the first prompt set."""
    input:
        model=model_config,
        draft=main_draft_meta,
        memos=sweep_memo,
        profile=lambda wc: measured_profile() if "hardware" in (ENTRY[wc.sweep].get("axes") or {}) else [],
    output:
        "results/experiments/{sweep}/{model}/{dataset}.jsonl",
    conda:
        ENV
    log:
        "results/logs/sweep/{sweep}/{model}/{dataset}.log",
    params:
        args=lambda wc: common_args(wc.model, wc.dataset),
        grid=lambda wc: grid_args(wc.sweep),
        memos=lambda wc, input: " ".join(f"--memo {m}" for m in input.memos),
    threads: RUN_THREADS
    shell:
        "python -m specter sweep {params.args} {params.grid} {params.memos} --threads {threads} --out {output} > {log} 2>&1"
