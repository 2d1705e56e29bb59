# Each experiment's tidy table (pandas) and figure (seaborn), in one job, as its registry entry defines them;
# `snakemake --report results/report.html` collects the figures with their captions.


rule aggregate:
    input:
        experiment_inputs,
    output:
        table="results/tables/{experiment}.csv",
        figure=report(
            "results/figures/{experiment}.png",
            caption="../report/figure.rst",
            category="Experiments",
            subcategory="{experiment}",
        ),
    conda:
        ENV
    log:
        "results/logs/aggregate/{experiment}.log",
    benchmark:
        "results/benchmarks/aggregate/{experiment}.tsv"
    params:
        caption=lambda wc: REGISTRY[wc.experiment].caption,
    shell:
        "python -m specter aggregate {wildcards.experiment:q} {input:q} --out {output.table:q} "
        "--figure {output.figure:q} > {log:q} 2>&1"
