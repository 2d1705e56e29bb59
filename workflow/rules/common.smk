# Config validation, naming and input functions shared by the rule files.
from pathlib import Path

from snakemake.utils import validate

validate(config, schema="../schemas/config.schema.yaml")

for _name, _spec in config["models"].items():
    if "path" in _spec and not (Path(_spec["path"]) / "config.json").is_file():
        raise ValueError(
            f"config models.{_name}.path: {_spec['path']!r} holds no checkpoint (no config.json); fix the path"
        )
for _name, _spec in config["datasets"].items():
    if "path" in _spec and not Path(_spec["path"]).is_file():
        raise ValueError(f"config datasets.{_name}.path: {_spec['path']!r} does not exist; fix the path")

# Every rule runs the suite from this repository, in the environment of ENV under `--use-conda` (else the current one).
ENV = "../envs/specter.yaml"
shell.prefix(f"export PYTHONPATH='{workflow.basedir}'${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")

MODELS = list(config["models"])
DATASETS = list(config["datasets"])
SWEEP_DATASET = DATASETS[0]  # the sweeps run on the first prompt set
PROTOCOL = config["protocol"]
# Experiments drawn from sweeps (one `specter sweep` per model); main is one `specter run` per system and set.
SWEEPS = ["k_sweep", "prefix_sweep", "prefetch_policy", "ablation", "oracle", "budget", "hardware"]
EXPERIMENTS = ["main", *SWEEPS, "routing", "working_set", "fidelity"]


wildcard_constraints:
    model="|".join(MODELS),
    dataset="|".join(DATASETS),
    experiment="|".join(EXPERIMENTS),
    prefix=r"\d+",
    sweep="|".join(SWEEPS),


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


def memo_path(model, dataset, prefix):
    return f"results/memo/{model}/{dataset}-p{prefix}.pkl"


def common_args(model, dataset):
    """The options every run of `model` on `dataset` shares (model, draft, prompt set and protocol)."""
    return (
        f"--model {model_dir(model)} --draft results/drafts/{model}/{MAIN_DRAFT} {dataset_args(dataset)} "
        f"--num-prompts {PROTOCOL['num_prompts']} --max-new-tokens {PROTOCOL['max_new_tokens']} "
        f"--seed {PROTOCOL['seed']}"
    )


def measured_profile():
    return ["results/profile/measured/profile.yaml"] if config["hardware"]["measure"] else []


def all_fidelity_reports():
    return [
        f"results/fidelity/{model}/{draft_name(d)}.json" for model in config["models"] for d in config["drafts"]
    ]


def all_runs():
    return [
        f"results/runs/{model}/{dataset}/{system}.jsonl"
        for model in MODELS
        for dataset in DATASETS
        for system in config["systems"]
    ]


def sweep_records(sweep):
    return [f"results/experiments/{sweep}/{model}/{SWEEP_DATASET}.jsonl" for model in MODELS]


def experiment_inputs(wc):
    """The files an experiment's table is aggregated from."""
    name = wc.experiment
    if name == "main":
        return all_runs()
    if name == "fidelity":
        return all_fidelity_reports()
    if name in ("routing", "working_set"):  # Specter's expert prediction and working set at every K of the sweep
        return sweep_records("k_sweep")
    return sweep_records(name)


def all_figures():
    return [f"results/figures/{name}.png" for name in EXPERIMENTS]


# Run settings (run.smk).
MAIN_PREFIX = PROTOCOL["prefix_tokens"]
K = config["k"]
BUDGET = config["budget"]
HW = config["hardware"]
EXP = config["experiments"]


def _record_systems(wc):
    """What the memo must cover: the main systems at the main K (or the prefix sweep's systems at other lengths)."""
    prefix = int(wc.prefix)
    systems = list(config["systems"]) if prefix == MAIN_PREFIX else []
    if wc.dataset == SWEEP_DATASET and prefix in EXP["prefix_sweep"]["prefixes"]:
        systems += [s for s in EXP["prefix_sweep"]["systems"] if s not in systems]
    return ",".join(systems)


def _csv(values):
    return ",".join(str(v) for v in values)


ENGINE = f"--engine {HW['engine']}"  # every run but the hardware sweep's (always simulated: it replays other profiles)
RECORD_TIMING = f"--hardware {HW['main']} --resident-fraction {BUDGET['main']}"  # recording numerics: simulated
MAIN_TIMING = f"{RECORD_TIMING} {ENGINE}"  # every run but the budget and hardware sweeps
# Simulated runs take one thread each (two jobs at once use 2 cores best); a measured run takes every core, so that it
# has the machine and its GPU to itself.
RUN_THREADS = 1 if HW["engine"] == "sim" else workflow.cores
K_SWEEP = _csv([*K["sweep"], *K["governor"]])  # the k_sweep's K values and governors


def k_sweep_memo(model):
    """The k_sweep's own recorded numerics (Specter at every K and governor), recorded beside the main memo."""
    return memo_path(model, SWEEP_DATASET, MAIN_PREFIX).replace(".pkl", "-k_sweep.pkl")


def _sweep_args(wc):
    """The grid of one sweep experiment."""
    main = f"--k {K['main']} {MAIN_TIMING}"
    prefix = f"--prefix-tokens {MAIN_PREFIX}"
    name = wc.sweep
    if name == "k_sweep":
        return f"--systems specter --k {K_SWEEP} {MAIN_TIMING} {prefix}"
    if name == "prefix_sweep":
        return f"--systems {_csv(EXP['prefix_sweep']['systems'])} {main} --prefix-tokens {_csv(EXP['prefix_sweep']['prefixes'])}"
    if name == "prefetch_policy":
        return f"--systems specter {main} {prefix} --prefetch {_csv(EXP['prefetch_policy'])}"
    if name == "ablation":
        return f"--systems specter {main} {prefix} --prefetch adaptive,none --system-option serialize-demand=false,true"
    if name == "oracle":
        return f"--systems specter,specter-oracle {main} {prefix} --system-option noise={_csv(EXP['oracle_noise'])}"
    if name == "budget":
        return (
            f"--systems {_csv(EXP['budget_systems'])} --k {K['main']} --hardware {HW['main']} {ENGINE} {prefix} "
            f"--resident-fraction {_csv(BUDGET['sweep'])}"
        )
    if name == "hardware":
        return (
            f"--systems {_csv(EXP['hardware_systems'])} --k {K['main']} --resident-fraction {BUDGET['main']} {prefix} "
            f"--hardware {_csv(HW['sweep'] + measured_profile())}"
        )
    raise ValueError(f"unknown sweep {name}")


def _sweep_memos(wc):
    if wc.sweep == "k_sweep":
        return [k_sweep_memo(wc.model)]
    prefixes = EXP["prefix_sweep"]["prefixes"] if wc.sweep == "prefix_sweep" else [MAIN_PREFIX]
    return [memo_path(wc.model, wc.dataset, p) for p in prefixes]
