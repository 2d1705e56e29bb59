# Models the workflow builds offline (configured `build:` names); checkpoints given by `path:` are used as they are.
# The builder writes into a temporary sibling and renames it when complete, so no rule deletes anything.


rule build_model:
    output:
        config="results/models/{model}/config.json",
    conda:
        ENV
    log:
        "results/logs/build_model/{model}.log",
    benchmark:
        "results/benchmarks/build_model/{model}.tsv"
    params:
        args=lambda wc: join([config["models"][wc.model]["build"], "--out", f"results/models/{wc.model}"]),
    priority: PRIORITY["build_model"]
    threads: 2  # part of the model's numerics (the card records it): the same checkpoint needs the same count
    shell:
        "python -m specter build-model {params.args} --threads 2 > {log:q} 2>&1"
