# Drafts and their fidelity against the target.


rule quantize:
    input:
        model_config,
    output:
        meta="results/drafts/{model}/{method}-int{bits}-g{group}/meta.json",
    conda:
        ENV
    log:
        "results/logs/quantize/{model}/{method}-int{bits}-g{group}.log",
    params:
        model=lambda wc: model_dir(wc.model),
        out=lambda wc, output: str(Path(output.meta).parent),
        seqs=config["calibration"]["num_sequences"],
        seq_len=config["calibration"]["seq_len"],
    threads: 1
    shell:
        "rm -rf {params.out} && python -m specter quantize --threads 1 --model {params.model} --method {wildcards.method} "
        "--bits {wildcards.bits} --group-size {wildcards.group} --calibration-sequences {params.seqs} "
        "--calibration-length {params.seq_len} --out {params.out} > {log} 2>&1"


rule fidelity:
    input:
        model=model_config,
        draft="results/drafts/{model}/{draft}/meta.json",
    output:
        csv="results/fidelity/{model}/{draft}.csv",
        json="results/fidelity/{model}/{draft}.json",
    conda:
        ENV
    log:
        "results/logs/fidelity/{model}/{draft}.log",
    params:
        model=lambda wc: model_dir(wc.model),
        draft=lambda wc, input: str(Path(input.draft).parent),
        f=config["fidelity"],
    threads: 1
    shell:
        "python -m specter fidelity --model {params.model} --draft {params.draft} --dataset {params.f[dataset]} "
        "--num-prompts {params.f[num_prompts]} --prefix-tokens {params.f[prefix_tokens]} "
        "--new-tokens {params.f[new_tokens]} --stride {params.f[stride]} --threads {threads} "
        "--out {output.csv} > {log} 2>&1"
