# Specter suite workflow. Skeleton: builds the configured models, quantizes their drafts and writes fidelity reports.
# Runs, aggregation, figures and the report join as the runtime and baselines land (see README).
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/quantize.smk"


rule all:
    input:
        all_fidelity_reports(),
