# Each experiment's tidy table (pandas), the same table as an HTML page (units in the headers, sortable) and its figure
# (seaborn), in one job, as its registry entry defines them; `snakemake --report results/report.html` collects each
# figure and its table with the experiment's caption (the CSV stays out: the report would only offer it as a download).


rule aggregate:
    input:
        experiment_inputs,
    output:
        table="results/tables/{experiment}.csv",
        page=report(
            "results/tables/{experiment}.html",
            caption="../report/table.rst",
            category="Experiments",
            subcategory="{experiment}",
        ),
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
        "--figure {output.figure:q} --html {output.page:q} > {log:q} 2>&1"


# The headline numbers, from the tables and the models' and drafts' files (hashes, no wall-clock times): quote this
# file, not numbers copied by hand. Two reproductions of one commit write the same file. Beside it, the report's front
# page: the paper's claims and their verdicts, which `snakemake --report` shows first (the Snakefile's `report:`).
rule summary:
    input:
        tables=[f"results/tables/{name}.csv" for name in EXPERIMENTS],
        models=[f"{model_dir(m)}/config.json" for m in MODELS],
        drafts=[f"results/drafts/{m}/{draft_name(d)}/meta.json" for m in MODELS for d in drafts_of(m)],
    output:
        summary="results/summary.md",
        front="results/report/front.rst",
    conda:
        ENV
    log:
        "results/logs/summary.log",
    benchmark:
        "results/benchmarks/summary.tsv"
    shell:
        "python -m specter summary results --out {output.summary:q} --front {output.front:q} > {log:q} 2>&1"
