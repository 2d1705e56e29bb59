# Runs: the numerics recorded once per (model, prompt set, K), then every system and sweep replayed on them.
# Experiments that vary the numerics themselves (K, prompt length) record their own, per case.


rule record:
    """The main recording of a model at window K (and at the governors' K, where an experiment that replays it asks
    for them): every system of the experiments that replay it. A prompt set's
    recording starts from the previous set's (`prior_dataset_memo`), so their shared warm-up traces are decoded once."""
    input:
        model=lambda wc: f"{model_dir(wc.model)}/config.json",
        draft=lambda wc: f"{main_draft(wc.model)}/meta.json",
        prior=lambda wc: prior_dataset_memo(wc.model, wc.dataset, wc.k),
    output:
        memo="results/memo/{model}/{dataset}-p{prefix}-k{k}.json.gz",
    conda:
        ENV
    log:
        "results/logs/record/{model}/{dataset}-p{prefix}-k{k}.log",
    benchmark:
        "results/benchmarks/record/{model}/{dataset}-p{prefix}-k{k}.tsv"
    params:
        args=lambda wc, input, output: join([
            "--systems", ",".join(record_systems(wc.model, wc.k)), "--k", ",".join(record_ks(wc.model, wc.k)),
            *common_args(wc.model, wc.dataset), "--prefix-tokens", wc.prefix, "--hardware", HW["main"],
            "--resident-per-layer", 1, *[a for m in input.prior for a in ("--memo", m)], "--memo-out", output.memo]),
    priority: lambda wc: PRIORITY["record_first" if wc.dataset == DATASETS[0] else "record"]
    threads: 1  # one thread per job, two jobs at once: better use of 2 cores than one job on two
    shell:
        "python -m specter sweep {params.args} --threads {threads} > {log:q} 2>&1"


rule record_experiment:
    """An experiment's own recording in one case (it varies K or the prompt length): its grid's numerics, starting from
    the same experiment's recording in an earlier case of the same model (so what two cases share is computed once)."""
    input:
        model=lambda wc: f"{model_dir(case_model(wc.case))}/config.json",
        draft=lambda wc: f"{main_draft(case_model(wc.case))}/meta.json",
        prior=lambda wc: prior_memo(wc.case, wc.dataset, wc.sweep),
    output:
        memo="results/memo/{case}/{dataset}-p{prefix}-{sweep}.json.gz",
    conda:
        ENV
    log:
        "results/logs/record/{case}/{dataset}-p{prefix}-{sweep}.log",
    benchmark:
        "results/benchmarks/record/{case}/{dataset}-p{prefix}-{sweep}.tsv"
    params:
        args=lambda wc, input, output: join([*common_args(case_model(wc.case), wc.dataset),
                                             *[a for m in input.prior for a in ("--memo", m)], "--memo-out", output.memo]),
        grid=lambda wc: grid_args(wc.sweep, wc.case, numerics_only=True),
    priority: PRIORITY["record_experiment"]
    threads: 1
    shell:
        "python -m specter sweep {params.args} {params.grid} --threads {threads} > {log:q} 2>&1"


rule run:
    """One system in one case on one prompt set, at the case's settings (same slots):
    `snakemake results/runs/<case>/<set>/<system>.jsonl`."""
    input:
        model=lambda wc: f"{model_dir(case_model(wc.case))}/config.json",
        draft=lambda wc: f"{main_draft(case_model(wc.case))}/meta.json",
        memo=lambda wc: case_memo(wc.case, wc.dataset),
    output:
        "results/runs/{case}/{dataset}/{system}.jsonl",
    conda:
        ENV
    log:
        "results/logs/run/{case}/{dataset}/{system}.log",
    benchmark:
        "results/benchmarks/run/{case}/{dataset}/{system}.tsv"
    params:
        args=lambda wc, input, output: join([
            "--system", wc.system, *common_args(case_model(wc.case), wc.dataset), "--prefix-tokens", MAIN_PREFIX,
            "--k", CASES[wc.case]["k"], "--hardware", main_settings(wc.case)["hardware"],
            "--resident-per-layer", CASES[wc.case]["slots"],
            "--engine", case_engine(wc.case), *(["--device", LIVE_DEVICE] if case_engine(wc.case) == "live" else []),
            *(["--cost-as", CASES[wc.case]["cost_as"]] if CASES[wc.case].get("cost_as") else []),
            "--memo", input.memo, "--out", output[0]]),
    threads: run_threads
    shell:
        "python -m specter run {params.args} --threads {threads} > {log:q} 2>&1"


rule sweep:
    """One experiment's grid in one case (its config entry's systems, axes and options) on one prompt set."""
    input:
        model=lambda wc: f"{model_dir(case_model(wc.case))}/config.json",
        draft=lambda wc: f"{main_draft(case_model(wc.case))}/meta.json",
        memos=sweep_memo,
        profile=sweep_profiles,
    output:
        "results/experiments/{sweep}/{case}/{dataset}.jsonl",
    conda:
        ENV
    log:
        "results/logs/sweep/{sweep}/{case}/{dataset}.log",
    benchmark:
        "results/benchmarks/sweep/{sweep}/{case}/{dataset}.tsv"
    params:
        args=lambda wc, input, output: join([*common_args(case_model(wc.case), wc.dataset),
                                             *[a for m in input.memos for a in ("--memo", m)], "--out", output[0]]),
        grid=lambda wc: grid_args(wc.sweep, wc.case),
    priority: sweep_priority
    threads: sweep_threads
    shell:
        "python -m specter sweep {params.args} {params.grid} --threads {threads} > {log:q} 2>&1"
