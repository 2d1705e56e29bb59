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
    # One thread, and the builds side by side: the count is part of the model's numerics (the card records it), so
    # it is fixed whatever the machine. The two default builds (2026-12-03, 2 AMD EPYC cores) took 460 s side by side
    # at one thread each, 517 s one after the other at two (a build's two threads kept 1.5 cores busy).
    threads: 1
    shell:
        "python -m specter build-model {params.args} --threads 1 > {log:q} 2>&1"


rule routing_stats:
    """A model's routing statistics (`specter routing-stats`): a proxy's from its model card, any other model's
    measured on held-out text."""
    input:
        config=lambda wc: f"{model_dir(wc.model)}/config.json",
    output:
        "results/routing/{model}.json",
    conda:
        ENV
    log:
        "results/logs/routing_stats/{model}.log",
    benchmark:
        "results/benchmarks/routing_stats/{model}.tsv"
    params:
        args=lambda wc, input, output: join(["--model", model_dir(wc.model), "--out", output[0]]),
    threads: 1
    shell:
        "python -m specter routing-stats {params.args} --threads 1 > {log:q} 2>&1"
