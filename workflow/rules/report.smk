# Each experiment's tidy table (pandas) and figure (seaborn), in one job; `snakemake --report results/report.html`
# collects the figures with their captions.


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
    params:
        caption=lambda wc: Path(workflow.basedir, "workflow", "report", f"{wc.experiment}.rst").read_text(),
    shell:
        "python -m specter aggregate {wildcards.experiment} {input} --out {output.table} --figure {output.figure} "
        "> {log} 2>&1"
