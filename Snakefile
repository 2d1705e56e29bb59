# Specter suite workflow: build the models, quantize their drafts, record the numerics once, replay every system and
# sweep on them, and aggregate tables, figures and the report. See docs/workflow.md and results/README.md.
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


# A config file given on the command line (`--configfile .test/config.yaml`) replaces config/config.yaml instead of
# merging into it: merged, its models and prompt sets would run beside the default ones.
if workflow.overwrite_configfiles:
    import copy

    config.clear()
    config.update(copy.deepcopy(workflow.config_settings.overwrite_config))


# The report's front page: the paper's claims and their verdicts, once the run has judged them (rule summary), else
# the workflow's description alone.
# the working directory's results (absolute: a relative path here is read beside the Snakefile)
FRONT_PAGE = Path("results/report/front.rst").resolve()


report: str(FRONT_PAGE) if FRONT_PAGE.is_file() else "workflow/report/workflow.rst"


# The image every job runs in under `--software-deployment-method apptainer` (ignored otherwise): the Dockerfile's,
# built with `docker build -t specter-suite .` (apptainer reads it from the local Docker daemon), or wherever you
# pushed it (`--config container=docker://REGISTRY/specter-suite:TAG`), or an apptainer .sif file.
container: config.get("container", "docker-daemon://specter-suite:latest")


include: "workflow/rules/common.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/quantize.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/run.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        all_figures(),
        [f"results/tables/{name}.csv" for name in EXPERIMENTS],
        "results/summary.md",
