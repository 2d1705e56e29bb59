# Config validation, naming and input functions shared by the rule files. What each experiment runs comes from its
# config entry and its cases; how its records become a table and a figure comes from the suite's experiment registry.
# Every value from the config that reaches a shell command goes through shlex (`q`, `join`).
import shlex
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)  # the suite of this repository: its registry and run settings plan the jobs
from specter.bytecode import cache_bytecode  # noqa: E402

# Planning imports the suite, and with it torch and transformers: where the environment forbids writing bytecode beside
# the sources, Snakemake's own process (and, under SLURM, each job's) keeps it in the suite's cache, as the suite's
# commands do, instead of compiling them from source on every start.
cache_bytecode()
from specter.config_document import check_schema, check_unique_keys  # noqa: E402
from specter.workflow_checks import ConfigError, check_config  # noqa: E402

# The schema, then names, paths, numbers and cross-field checks, before Snakemake plans any job: a problem is one
# line naming the key, and exit 2 (as the CLI's errors), not a traceback.
try:
    check_unique_keys(workflow.overwrite_configfiles or workflow.configfiles)
    check_schema(config, Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml")
    check_config(config)
except ConfigError as err:
    print(f"specter: error: {err}", file=sys.stderr)
    sys.exit(2)

from specter.experiments import EXPERIMENTS as REGISTRY, own_numerics, records_experiment, sweep_flags  # noqa: E402
from specter.experiments import cases_of as experiment_cases  # noqa: E402

# Every rule runs the suite from this repository, in the environment of ENV under `--use-conda` (else the current one).
ENV = "../envs/specter.yaml"
shell.prefix(f"export PYTHONPATH={shlex.quote(workflow.basedir)}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")


def q(value):
    return shlex.quote(str(value))


def join(args):
    return shlex.join(str(a) for a in args)


MODELS = list(config["models"])
DATASETS = list(config["datasets"])
SWEEP_DATASET = DATASETS[0]  # the experiments other than main run on the first prompt set
PROTOCOL = config["protocol"]
MAIN_PREFIX = PROTOCOL["prefix_tokens"]
HW = config["hardware"]
CASES = config["cases"]
EXPERIMENTS = list(config["experiments"])
ENTRY = config["experiments"]
SWEEPS = [n for n in EXPERIMENTS if REGISTRY[n].source == "sweep"]
OWN_NUMERICS = [n for n in SWEEPS if own_numerics(ENTRY[n])]  # they record their own; the rest replay the main memo


def cases_of(experiment):
    """The cases an experiment runs in: its `cases`, else every case (main) or the first one."""
    return experiment_cases(config, experiment)


def datasets_of(experiment):
    return DATASETS if REGISTRY[records_experiment(experiment)].all_datasets else [SWEEP_DATASET]


wildcard_constraints:
    model="|".join(MODELS),
    case="|".join(CASES),
    dataset="|".join(DATASETS),
    experiment="|".join(EXPERIMENTS),
    prefix=str(MAIN_PREFIX),
    k=r"\d+",
    sweep="|".join(SWEEPS) or "(?!)",


def drafts_of(model):
    """The drafts made of `model`: its own list, else the config's; the first is the one every run uses."""
    return config["models"][model].get("drafts") or config["drafts"]


def draft_name(d):
    return f"{d['method']}-int{d['bits']}-g{d['group_size']}"


def main_draft(model):
    return f"results/drafts/{model}/{draft_name(drafts_of(model)[0])}"


def model_dir(name):
    """The checkpoint of model `name`: its configured path, or where the workflow builds it."""
    spec = config["models"][name]
    return spec["path"] if "path" in spec else f"results/models/{name}"


def case_model(case):
    return CASES[case]["model"]


def main_settings(case):
    """The settings an experiment in `case` does not vary."""
    c = CASES[case]
    return dict(k=c["k"], hardware=c.get("hardware", HW["main"]), prefix_tokens=MAIN_PREFIX, slots=c["slots"],
                engine=case_engine(case), device=LIVE_DEVICE, cost_as=c.get("cost_as"))


def case_engine(case):
    """The engine of a case's runs: the config's, except that a case priced at another architecture's shapes is
    simulated (a measured run times this model's own kernels)."""
    return "sim" if CASES[case].get("cost_as") else HW["engine"]


def dataset_args(name):
    """`--dataset` (and `--field`) of a configured prompt set."""
    spec = config["datasets"][name]
    return ["--dataset", spec.get("path", name)] + (["--field", spec["field"]] if "field" in spec else [])


def common_args(model, dataset):
    """The options every run of `model` on `dataset` shares (model, draft, prompt set and protocol)."""
    return ["--model", model_dir(model), "--draft", main_draft(model), *dataset_args(dataset),
            "--num-prompts", PROTOCOL["num_prompts"], "--max-new-tokens", PROTOCOL["max_new_tokens"],
            "--seed", PROTOCOL["seed"], "--repeats", PROTOCOL.get("repeats", 1)]


def measured_profile():
    return ["results/profile/measured/profile.yaml"] if HW["measure"] else []


LIVE_DEVICE = HW.get("device", "cpu")
#: the profile a live run's simulated twin is scheduled on: the live engine's device, measured on this machine
LIVE_PROFILE = f"results/profile/{LIVE_DEVICE}/profile.yaml"


def live_model():
    """The model the live runs decode (the first case of the first measured experiment the config runs), on whose
    class and widths the live device's profile times the host's dispatch per kernel; None where nothing decodes
    live."""
    for name, entry in ENTRY.items():
        if name in REGISTRY and REGISTRY[name].measured and entry.get("systems"):
            return case_model((entry.get("cases") or list(CASES))[0])
    return None


def dispatch_model(wc):
    """The live device's profile times dispatch on the model its live runs decode (`live_model`)."""
    return [] if wc.profiled == "measured" or live_model() is None else [model_dir(live_model())]


def sweep_profiles(wc):
    """The measured profiles a sweep reads: this machine's where it varies `hardware`, the live device's where it
    decodes live."""
    if REGISTRY[wc.sweep].measured:
        return [LIVE_PROFILE]
    return measured_profile() if "hardware" in (ENTRY[wc.sweep].get("axes") or {}) else []


def memo_path(model, dataset, k):
    """The main recording of a prompt set at window K: the numerics every run and replaying sweep reads."""
    return f"results/memo/{model}/{dataset}-p{MAIN_PREFIX}-k{k}.json.gz"


def case_memo(case, dataset):
    return memo_path(case_model(case), dataset, CASES[case]["k"])


def own_memo(case, dataset, experiment):
    """The recording of an experiment that varies the numerics (K, prompt length), in one case."""
    return f"results/memo/{case}/{dataset}-p{MAIN_PREFIX}-{experiment}.json.gz"


def prior_memo(case, dataset, experiment):
    """The recording this one starts from, so that what they share is computed once (only what it lacks is
    computed): the same experiment's in the last case before `case` with the same model, else main's recording of
    the case (the grid's point at the case's own K and prompt length), else none."""
    model = case_model(case)
    before = cases_of(experiment)[: cases_of(experiment).index(case)]
    same = [c for c in before if case_model(c) == model]
    if same:
        return [own_memo(same[-1], dataset, experiment)]
    if "main" in ENTRY and case in cases_of("main") and dataset in datasets_of("main"):
        return [case_memo(case, dataset)]
    return []


def prior_dataset_memo(model, dataset, k):
    """The main recording a prompt set's starts from: the previous prompt set's at the same model and K (its warm-up
    and calibration traces, decoded from the calibration split whatever the prompt set, are then decoded once per
    model, not once per set), else none."""
    i = DATASETS.index(dataset)
    return [memo_path(model, DATASETS[i - 1], k)] if i else []


# Job priorities (Snakemake runs the ready job of the highest first): the long chains first (builds, drafts, the
# recordings the most jobs wait on, the experiments' own recordings of many K), then the experiments drawing live
# numerics, then replays; leaves that nothing else waits on (fidelity reports, tables) fill idle cores. Measured on
# 2 cores, without them Snakemake started the 6-minute K-sweep recordings last and one core idled for minutes.
PRIORITY = dict(build_model=100, quantize=90, record_experiment=85, record_first=80, record=70, sweep_live=60,
                sweep=50, fidelity=40)


def sweep_priority(wc):
    live = "temperature" in (ENTRY[wc.sweep].get("axes") or {})  # sampled decodes are drawn live, not replayed
    return PRIORITY["sweep_live" if live else "sweep"]


def replaying(model, k):
    """The config entries of the experiments that replay the main recording of `model` at window K."""
    return [ENTRY[name] for name in SWEEPS if name not in OWN_NUMERICS
            and any(case_model(c) == model and CASES[c]["k"] == int(k) for c in cases_of(name))]


def record_systems(model, k):
    """What the main recording of `model` at window K must cover: every system of the experiments that replay it."""
    systems = []
    for entry in replaying(model, k):
        systems += [s for s in entry["systems"] if s not in systems]
    return systems or ["on-demand"]


def record_ks(model, k):
    """The K settings the main recording of `model` at window K covers: K, and the governors of the experiments that
    replay it (their chosen windows and the governors' calibration decodes are then recorded once, with the rest)."""
    ks = [str(k)]
    for entry in replaying(model, k):
        ks += [g for g in entry.get("governors") or [] if g not in ks]
    return ks


def all_fidelity_reports():
    return [f"results/fidelity/{model}/{draft_name(d)}.json" for model in MODELS for d in drafts_of(model)]


def sweep_records(experiment):
    return [f"results/experiments/{experiment}/{case}/{dataset}.jsonl"
            for case in cases_of(experiment) for dataset in datasets_of(experiment)]


def experiment_inputs(wc):
    """The files an experiment's table is aggregated from (by its registry source)."""
    source = REGISTRY[wc.experiment].source
    if source == "fidelity":
        return all_fidelity_reports()
    if source == "memo":  # the main recordings (the target's routes), once per model, prompt set and K
        return sorted({case_memo(c, d) for c in CASES for d in DATASETS})
    if source == "routing":  # every configured model's routing statistics
        return [f"results/routing/{m}.json" for m in MODELS]
    also = [name for name in REGISTRY[wc.experiment].reads if name in ENTRY]
    return sweep_records(records_experiment(wc.experiment)) + [
        f for name in also
        for f in (all_fidelity_reports() if REGISTRY[name].source == "fidelity" else sweep_records(name))]


def all_figures():
    return [f"results/figures/{name}.png" for name in EXPERIMENTS]


# Simulated runs take one thread each (two jobs at once use 2 cores best); a measured run takes every core, so that it
# has the machine and its GPU to itself.
def run_threads(wc):
    """A case's run: one thread simulated, every core measured."""
    return 1 if case_engine(wc.case) == "sim" else workflow.cores


def sweep_threads(wc):
    """A sweep: every core where it measures (it decodes live, or the config's engine measures its case)."""
    measured = REGISTRY[wc.sweep].measured or (case_engine(wc.case) != "sim"
                                               and "hardware" not in (ENTRY[wc.sweep].get("axes") or {}))
    return workflow.cores if measured else 1


def grid_args(experiment, case, numerics_only=False):
    """The `specter sweep` flags of an experiment in a case (see `specter.experiments.sweep_flags`); an experiment
    that decodes live does so on the live device, its twins simulated on that device's measured profile."""
    main = main_settings(case)
    if REGISTRY[experiment].measured and not numerics_only:
        main = {**main, "engine": "live", "hardware": LIVE_PROFILE}
    return join(sweep_flags(ENTRY[experiment], main, numerics_only, tuple(measured_profile())))


def sweep_memo(wc):
    if wc.sweep in OWN_NUMERICS:
        return [own_memo(wc.case, wc.dataset, wc.sweep)]
    return [case_memo(wc.case, wc.dataset)]
