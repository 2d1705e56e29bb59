# Models the workflow builds offline (configured `build:` names); checkpoints given by `path:` are used as they are.


rule build_model:
    output:
        config="results/models/{model}/config.json",
    conda:
        ENV
    log:
        "results/logs/build_model/{model}.log",
    params:
        name=lambda wc: config["models"][wc.model]["build"],
        out=lambda wc: f"results/models/{wc.model}",
    threads: 2  # part of the model's numerics (the card records it): the same checkpoint needs the same count
    shell:
        "rm -rf {params.out} && python -m specter build-model {params.name} --threads 2 --out {params.out} > {log} 2>&1"
