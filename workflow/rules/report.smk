# Tidy tables (pandas) and figures (seaborn) of every experiment; `snakemake --report results/report.html` collects them.


rule aggregate:
    input:
        experiment_inputs,
    output:
        "results/tables/{experiment}.csv",
    conda:
        ENV
    log:
        "results/logs/aggregate/{experiment}.log",
    shell:
        "python -m specter aggregate {wildcards.experiment} {input} --out {output} > {log} 2>&1"


rule plot:
    input:
        "results/tables/{experiment}.csv",
    output:
        report(
            "results/figures/{experiment}.png",
            caption="../report/{experiment}.rst",
            category="Experiments",
            subcategory="{experiment}",
        ),
    conda:
        ENV
    log:
        "results/logs/plot/{experiment}.log",
    shell:
        "python -m specter plot {wildcards.experiment} --table {input} --out {output} > {log} 2>&1"
