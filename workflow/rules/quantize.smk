# Drafts and their fidelity against the target. `specter quantize` writes into a temporary sibling and renames it.


rule quantize:
    input:
        lambda wc: f"{model_dir(wc.model)}/config.json",
    output:
        meta="results/drafts/{model}/{method}-int{bits}-g{group}/meta.json",
    conda:
        ENV
    log:
        main="results/logs/quantize/{model}/{method}-int{bits}-g{group}.log",
        gptqmodel="results/logs/quantize/{model}/{method}-int{bits}-g{group}.gptqmodel.log",  # its own output
    benchmark:
        "results/benchmarks/quantize/{model}/{method}-int{bits}-g{group}.tsv"
    params:
        args=lambda wc, output: join([
            "--model", model_dir(wc.model), "--method", wc.method, "--bits", wc.bits, "--group-size", wc.group,
            "--calibration-sequences", config["calibration"]["num_sequences"],
            "--calibration-length", config["calibration"]["seq_len"], "--out", str(Path(output.meta).parent),
            "--gptq-log", f"results/logs/quantize/{wc.model}/{wc.method}-int{wc.bits}-g{wc.group}.gptqmodel.log"]),
    priority: PRIORITY["quantize"]
    threads: 1
    shell:
        "python -m specter quantize --threads 1 {params.args} > {log.main:q} 2>&1"


rule fidelity:
    input:
        model=lambda wc: f"{model_dir(wc.model)}/config.json",
        draft="results/drafts/{model}/{draft}/meta.json",
    output:
        csv="results/fidelity/{model}/{draft}.csv",
        json="results/fidelity/{model}/{draft}.json",
    conda:
        ENV
    log:
        "results/logs/fidelity/{model}/{draft}.log",
    benchmark:
        "results/benchmarks/fidelity/{model}/{draft}.tsv"
    params:
        args=lambda wc, input, output: join([
            "--model", model_dir(wc.model), "--draft", str(Path(input.draft).parent),
            "--dataset", config["fidelity"]["dataset"], "--num-prompts", config["fidelity"]["num_prompts"],
            "--prefix-tokens", config["fidelity"]["prefix_tokens"], "--new-tokens", config["fidelity"]["new_tokens"],
            "--stride", config["fidelity"]["stride"], "--out", output.csv]),
    priority: PRIORITY["fidelity"]
    threads: 1
    shell:
        "python -m specter fidelity {params.args} --threads {threads} > {log:q} 2>&1"
