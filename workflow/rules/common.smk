# Config validation, naming and input functions shared by the rule files. What each experiment runs comes from its
# config entry; how its records become a table and a figure comes from the suite's experiment registry.
import sys
from pathlib import Path

from snakemake.utils import validate

validate(config, schema="../schemas/config.schema.yaml")

sys.path.insert(0, workflow.basedir)  # the suite of this repository: its registry and run settings plan the jobs
from specter.experiments import EXPERIMENTS as REGISTRY, own_numerics, records_experiment, sweep_flags  # noqa: E402

for _name, _spec in config["models"].items():
    if "path" in _spec and not (Path(_spec["path"]) / "config.json").is_file():
        raise ValueError(
            f"config models.{_name}.path: {_spec['path']!r} holds no checkpoint (no config.json); fix the path"
        )
for _name, _spec in config["datasets"].items():
    if "path" in _spec and not Path(_spec["path"]).is_file():
        raise ValueError(f"config datasets.{_name}.path: {_spec['path']!r} does not exist; fix the path")
for _name, _entry in config["experiments"].items():
    if _name not in REGISTRY:
        raise ValueError(f"config experiments.{_name}: no such experiment; experiments: {', '.join(REGISTRY)}")
    _source = records_experiment(_name)
    if _source != _name and _source not in config["experiments"]:
        raise ValueError(f"config experiments.{_name} reads the records of {_source}: configure {_source} too")
    if REGISTRY[_source].source in ("runs", "sweep") and not config["experiments"][_source].get("systems"):
        raise ValueError(f"config experiments.{_source}: give its systems")

# Every rule runs the suite from this repository, in the environment of ENV under `--use-conda` (else the current one).
ENV = "../envs/specter.yaml"
shell.prefix(f"export PYTHONPATH='{workflow.basedir}'${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")

MODELS = list(config["models"])
DATASETS = list(config["datasets"])
SWEEP_DATASET = DATASETS[0]  # the sweeps run on the first prompt set
PROTOCOL = config["protocol"]
MAIN_PREFIX = PROTOCOL["prefix_tokens"]
K = config["k"]
BUDGET = config["budget"]
HW = config["hardware"]
EXPERIMENTS = list(config["experiments"])
ENTRY = config["experiments"]
SWEEPS = [n for n in EXPERIMENTS if REGISTRY[n].source == "sweep"]
OWN_NUMERICS = [n for n in SWEEPS if own_numerics(ENTRY[n])]  # they record their own; the rest replay the main memo
MAIN_SYSTEMS = ENTRY["main"]["systems"] if "main" in ENTRY else []
# What the main memo records: every system of the experiments that replay it.
RECORD_SYSTEMS = list(dict.fromkeys(MAIN_SYSTEMS + [s for n in SWEEPS if n not in OWN_NUMERICS
                                                     for s in ENTRY[n]["systems"]]))


wildcard_constraints:
    model="|".join(MODELS),
    dataset="|".join(DATASETS),
    experiment="|".join(EXPERIMENTS),
    prefix=str(MAIN_PREFIX),
    sweep="|".join(SWEEPS) or "(?!)",


def draft_name(d):
    return f"{d['method']}-int{d['bits']}-g{d['group_size']}"


MAIN_DRAFT = draft_name(config["drafts"][0])


def model_dir(name):
    """The checkpoint of model `name`: its configured path, or where the workflow builds it."""
    spec = config["models"][name]
    return spec["path"] if "path" in spec else f"results/models/{name}"


def model_config(wc):
    return f"{model_dir(wc.model)}/config.json"


def main_draft_meta(wc):
    return f"results/drafts/{wc.model}/{MAIN_DRAFT}/meta.json"


def dataset_args(name):
    """`--dataset` (and `--field`) of a configured prompt set."""
    spec = config["datasets"][name]
    args = f"--dataset {spec.get('path', name)}"
    return args + (f" --field {spec['field']}" if "field" in spec else "")


def memo_path(model, dataset):
    """The main recording of a prompt set: the numerics every run and replaying sweep reads."""
    return f"results/memo/{model}/{dataset}-p{MAIN_PREFIX}.pkl"


def own_memo(model, dataset, experiment):
    """The recording of an experiment that varies the numerics (K, prompt length)."""
    return f"results/memo/{model}/{dataset}-p{MAIN_PREFIX}-{experiment}.pkl"


def common_args(model, dataset):
    """The options every run of `model` on `dataset` shares (model, draft, prompt set and protocol)."""
    return (
        f"--model {model_dir(model)} --draft results/drafts/{model}/{MAIN_DRAFT} {dataset_args(dataset)} "
        f"--num-prompts {PROTOCOL['num_prompts']} --max-new-tokens {PROTOCOL['max_new_tokens']} "
        f"--seed {PROTOCOL['seed']}"
    )


def measured_profile():
    return ["results/profile/measured/profile.yaml"] if HW["measure"] else []


def all_fidelity_reports():
    return [
        f"results/fidelity/{model}/{draft_name(d)}.json" for model in config["models"] for d in config["drafts"]
    ]


def all_runs():
    return [
        f"results/runs/{model}/{dataset}/{system}.jsonl"
        for model in MODELS
        for dataset in DATASETS
        for system in MAIN_SYSTEMS
    ]


def sweep_records(sweep):
    return [f"results/experiments/{sweep}/{model}/{SWEEP_DATASET}.jsonl" for model in MODELS]


def experiment_inputs(wc):
    """The files an experiment's table is aggregated from (by its registry source)."""
    source = REGISTRY[wc.experiment].source
    if source == "runs":
        return all_runs()
    if source == "fidelity":
        return all_fidelity_reports()
    return sweep_records(records_experiment(wc.experiment))


def all_figures():
    return [f"results/figures/{name}.png" for name in EXPERIMENTS]


RECORD_TIMING = f"--hardware {HW['main']} --resident-fraction {BUDGET['main']}"  # recording numerics: simulated
MAIN_TIMING = f"{RECORD_TIMING} --engine {HW['engine']}"  # the main runs
MAIN = dict(k=K["main"], hardware=HW["main"], prefix_tokens=MAIN_PREFIX, resident_fraction=BUDGET["main"],
            engine=HW["engine"])
# Simulated runs take one thread each (two jobs at once use 2 cores best); a measured run takes every core, so that it
# has the machine and its GPU to itself.
RUN_THREADS = 1 if HW["engine"] == "sim" else workflow.cores


def grid_args(experiment, numerics_only=False):
    """The `specter sweep` flags of an experiment (see `specter.experiments.sweep_flags`)."""
    return " ".join(sweep_flags(ENTRY[experiment], MAIN, numerics_only, tuple(measured_profile())))


def sweep_memo(wc):
    return [own_memo(wc.model, wc.dataset, wc.sweep) if wc.sweep in OWN_NUMERICS else memo_path(wc.model, wc.dataset)]
