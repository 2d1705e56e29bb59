"""The Snakemake workflow parses, plans the configured jobs, and passes Snakemake's linter."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = __import__("specter.experiments", fromlist=["EXPERIMENTS"]).EXPERIMENTS


def _snakemake(*args):
    return subprocess.run(["snakemake", *args], cwd=ROOT, capture_output=True, text=True)


def test_dry_run_plans_models_drafts_and_fidelity():
    proc = _snakemake("-n", "--cores", "1", "--forceall")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    for rule in ("build_model", "quantize", "fidelity", "all"):
        assert rule in proc.stdout


def test_unknown_config_key_fails_before_any_job_naming_the_key(tmp_path):
    import yaml

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["fidelity"]["strides"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    proc = _snakemake("-n", "--cores", "1", "--configfile", str(bad))
    assert proc.returncode != 0
    assert "'strides' was unexpected" in proc.stdout + proc.stderr


def test_wrong_type_fails_naming_the_value(tmp_path):
    import yaml

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["calibration"]["seq_len"] = "long"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    proc = _snakemake("-n", "--cores", "1", "--configfile", str(bad))
    assert proc.returncode != 0 and "'long' is not of type 'integer'" in proc.stdout + proc.stderr


def test_missing_model_path_fails_before_any_job_naming_the_key(tmp_path):
    import yaml

    config = yaml.safe_load((ROOT / ".test" / "config.yaml").read_text())
    config["models"] = {"mine": {"path": str(tmp_path / "nowhere")}}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    proc = _snakemake("-n", "--cores", "1", "--configfile", str(bad), "--directory", str(tmp_path))
    assert proc.returncode != 0
    assert "config models.mine.path" in proc.stdout + proc.stderr and "holds no checkpoint" in proc.stdout + proc.stderr


def test_the_paper_config_plans_every_case(tmp_path):
    """config/paper.yaml (all the paper's cases) passes every check and plans; its 16-neuron proxies take group 16."""
    proc = _snakemake("-n", "--cores", "1", "--configfile", "config/paper.yaml", "--directory", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "smollm2-moe-64x6/gptq-int4-g16" in proc.stdout


@pytest.mark.parametrize("name", ["calibration", "locality"])
def test_each_shipped_config_plans(name, tmp_path):
    """config/calibration.yaml and config/locality.yaml (the matched proxies beside their as-built twins) pass every
    check and plan."""
    proc = _snakemake("-n", "--cores", "1", "--configfile", f"config/{name}.yaml", "--directory", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert name != "locality" or "smollm2-moe-64x6-matched/gptq-int4-g16" in proc.stdout


def test_a_same_memory_budget_past_the_device_fails_before_any_job(tmp_path):
    """Specter's memory at 3 Phi-3.5-MoE slots per layer is 40.7 GB, past the A100-40GB: refused with the config, not
    once the job runs."""
    bad = _config(tmp_path, lambda c: c["experiments"]["hit_rate"]["axes"].update(same_memory_as=[1, 2, 3]),
                  base="config/config.yaml")
    work = tmp_path / "work"
    work.mkdir()
    proc = _snakemake("-n", "--cores", "1", "--configfile", bad, "--directory", str(work))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    want = "config experiments.hit_rate in case phi_high: the same-memory budget at 3 slots per layer"
    assert want in out, out[-2000:]
    assert "more than a100-40gb-pcie4's 40 GB" in out and "use fewer slots" in out


@pytest.mark.parametrize("arms, message", [
    ({"x": {"draft-kv": "own"}}, "option draft-kv='own' is not one of shared"),
    ({"x": {"depth": 2}}, "config experiments.ablation.arms.x: --arm 'x:depth=2': no listed system has option 'depth'"),
    ({"x": {"k": 4}}, "an arm cannot set k"),
    ({"x": {"expert_bits": "q5_k"}}, "expert_bits='q5_k' is not one of 16, 2, 3, 4, q4_k_m"),
    ({"a:b": {}}, "an arm's name cannot be empty or hold ':'"),
    ({"a\nb": {}}, "or a control character (a newline, a tab)"),
])
def test_a_bad_arm_is_refused_with_the_config(arms, message):
    from specter.workflow_checks import ConfigError, check_config

    config = yaml.safe_load((ROOT / ".test" / "config.yaml").read_text())
    config["experiments"]["ablation"]["arms"] = arms
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(config)


def test_the_ablation_arms_reach_the_sweep_as_flags():
    from specter.experiments import sweep_flags
    from specter.runspec import Arm

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    entry = config["experiments"]["ablation"]
    main = {"k": 16, "hardware": "a100-40gb-pcie4", "prefix_tokens": 16, "slots": 2, "engine": "sim"}
    flags = sweep_flags(entry, main)
    arms = [Arm.parse(flags[i + 1]) for i, flag in enumerate(flags) if flag == "--arm"]
    assert [a.name for a in arms] == list(entry["arms"])
    assert arms[-1].options == (("draft-kv", "copied"), ("serialize-demand", "true"))
    assert arms[1].settings == (("draft_kernel", "unfused"),)


def test_mains_governors_run_beside_the_cases_k():
    from specter.experiments import sweep_flags

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    main = {"k": 16, "hardware": "a100-40gb-pcie4", "prefix_tokens": 16, "slots": 2, "engine": "sim"}
    flags = sweep_flags(config["experiments"]["main"], main)
    assert flags[flags.index("--k") + 1] == "16,auto"
    flags = sweep_flags(config["experiments"]["k_sweep"], main)  # a k axis lists its K itself
    assert flags[flags.index("--k") + 1] == "2,4,8,16,32,auto,profile,online"


@pytest.mark.parametrize("edit, message", [
    (lambda e: e["k_sweep"].update(governors=["auto"]),
     "config experiments.k_sweep.governors: the experiment also has a k axis"),
    (lambda e: e["main"].update(systems=["on-demand", "resident"]),
     "config experiments.main.governors: none of its systems (on-demand, resident) drafts a window"),
])
def test_governors_without_a_window_to_choose_are_refused(edit, message):
    from specter.workflow_checks import ConfigError, check_config

    config = yaml.safe_load((ROOT / ".test" / "config.yaml").read_text())
    edit(config["experiments"])
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(config)


def test_lint_is_clean():
    for extra in ([], ["--configfile", ".test/config.yaml"]):
        proc = _snakemake("--lint", *extra)
        assert proc.returncode == 0 and "Congratulations" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_test_config_replaces_the_default_one_instead_of_merging():
    proc = _snakemake("-n", "--cores", "1", "--forceall", "--configfile", ".test/config.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "smollm2-moe" not in proc.stdout and "tiny-olmoe" in proc.stdout


def _shell_commands() -> dict[str, str]:
    """{rule name: its shell command template} of every rule file."""
    out = {}
    for path in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        for rule, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", path.read_text(), re.S | re.M):
            shell = re.search(r"^    shell:\n((?:        \".*\"\n)+)", body, re.M)
            if shell:
                out[rule] = "".join(re.findall(r'"(.*)"', shell[1]))
    return out


def test_no_unquoted_config_value_in_a_rule_shell_command():
    """Every placeholder in a rule's shell is `:q`-quoted, a thread count, or a `params` entry that the rule builds
    with `join` (shlex.join) or `grid_args` (which does too): no config text is ever read as shell."""
    commands = _shell_commands()
    assert len(commands) >= 8, commands
    rules = {m[0]: m[1] for path in (ROOT / "workflow" / "rules").glob("*.smk")
             for m in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", path.read_text(), re.S | re.M)}
    for rule, command in commands.items():
        for placeholder in re.findall(r"(?<!\{)\{([^{}]+)\}(?!\})", command):
            if placeholder.endswith(":q") or placeholder == "threads":
                continue
            assert placeholder.startswith("params."), f"rule {rule}: unquoted {{{placeholder}}} in {command!r}"
            name = placeholder.removeprefix("params.")
            built = re.search(rf"^        {name}=lambda [^:]*: (\w+)\(", rules[rule], re.M)
            assert built and built[1] in ("join", "grid_args"), f"rule {rule}: params.{name} is not built by join"
    assert "return join(" in (ROOT / "workflow" / "rules" / "common.smk").read_text().split("def grid_args")[1]


def _config(tmp_path, edit, base=".test/config.yaml") -> str:
    config = yaml.safe_load((ROOT / base).read_text())
    edit(config)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))  # the order of cases matters (the first is the default)
    return str(path)


@pytest.mark.parametrize("name, edit", [
    ("../../escape", lambda c: c["models"].update({"../../escape": {"build": "tiny-olmoe"}})),
    ("x; touch PWNED", lambda c: c["models"].update({"x; touch PWNED": {"build": "tiny-olmoe"}})),
    (".hidden", lambda c: c["models"].update({".hidden": {"build": "tiny-olmoe"}})),
    ("-rf", lambda c: c["models"].update({"-rf": {"build": "tiny-olmoe"}})),
    ("a/../../b", lambda c: c["cases"].update({"a/../../b": {"model": "tiny-olmoe", "slots": 2, "k": 2}})),
    ("$(touch PWNED)", lambda c: c["datasets"].update({"$(touch PWNED)": {}})),
], ids=["path_traversal_in_model_name", "shell_metacharacters_in_model_name", "leading_dot", "leading_dash",
        "path_traversal_in_case_name", "command_substitution_in_dataset_name"])
def test_unsafe_names_are_refused_before_any_job(name, edit, tmp_path):
    """Names that become paths are checked by the schema's pattern (and again by `check_config`) before any job."""
    work = tmp_path / "work"
    work.mkdir()
    proc = _snakemake("-n", "--cores", "1", "--configfile", _config(tmp_path, edit), "--directory", str(work))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"{name!r} does not match" in out, out[-2000:]
    assert not list(work.iterdir()) or [p.name for p in work.iterdir()] == [".snakemake"]
    assert not (work / "PWNED").exists() and not (ROOT / "PWNED").exists()


@pytest.mark.slow
def test_shell_metacharacters_and_spaces_in_paths_reach_the_cli_as_one_argument(tiny_dirs, tmp_path):
    """A checkpoint and a prompt file at paths with spaces, `;`, `$(...)` and quotes: the dry run's shell commands
    carry each path as one argument, and a real job on them runs (and runs nothing else)."""
    hostile = tmp_path / "models; touch PWNED" / "it's $(touch PWNED2) here"
    shutil.copytree(tiny_dirs["mixtral"], hostile)
    prompts = tmp_path / "prompts `touch PWNED3`.jsonl"
    prompts.write_text(  # two inputs of more than the config's 16 prompt tokens (shorter ones are passed over)
        '{"prompt": "def add(a, b):\\n    \\"\\"\\"Return the sum of a and b, two numbers the caller gives.\\"\\"\\"\\n'
        '    return a + b"}\n'
        '{"prompt": "import os\\nimport sys\\n\\ndef main(argv):\\n    for name in sorted(os.listdir(argv[1])):\\n'
        '        print(name)"}\n')

    def edit(c):
        c["models"] = {"mine": {"path": str(hostile), "drafts": [{"method": "rtn", "bits": 4, "group_size": 32}]}}
        c["datasets"] = {"mine": {"path": str(prompts)}}
        c["fidelity"]["dataset"] = str(prompts)
        c["cases"] = {"small": {"model": "mine", "slots": 2, "k": 2}}
        c["experiments"] = {"main": {"systems": ["on-demand", "specter"]}}

    work = tmp_path / "work dir"
    work.mkdir()
    config = _config(tmp_path, edit)
    proc = _snakemake("-n", "-p", "--cores", "1", "--configfile", config, "--directory", str(work))
    assert proc.returncode == 0, proc.stderr[-3000:]
    commands = [line.removeprefix("Shell command: ") for line in proc.stdout.splitlines()
                if line.startswith("Shell command: python -m specter")]
    assert commands, proc.stdout[-2000:]
    for command in commands:
        argv = shlex.split(command)
        if "--model" in argv:
            assert argv[argv.index("--model") + 1] == str(hostile), command
        if "--dataset" in argv and "run" in argv:
            assert argv[argv.index("--dataset") + 1] == str(prompts), command
    proc = _snakemake("--cores", "1", "--configfile", config, "--directory", str(work),
                      "results/runs/small/mine/specter.jsonl")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (work / "results/runs/small/mine/specter.jsonl").is_file()
    for root in (tmp_path, work, ROOT, hostile.parent):
        assert not [p for p in root.iterdir() if p.name.startswith("PWNED")], root


def _repository_copy(dest: Path) -> Path:
    """The repository's tracked and untracked-but-not-ignored files, copied to `dest`."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.mark.slow
def test_workflow_end_to_end_on_the_test_config(tmp_path):
    """One baseline alone as a target, then every experiment, then nothing to do, then the report (CI's end-to-end);
    from a copy of the repository at a path with a space, into a working directory with one too."""
    import pandas as pd

    repo = _repository_copy(tmp_path / "a repo copy")
    tmp_path = tmp_path / "work dir"
    tmp_path.mkdir()
    args = ["-s", str(repo / "Snakefile"), "--directory", str(tmp_path), "--configfile",
            str(repo / ".test" / "config.yaml"), "--cores", "2"]
    single = "results/runs/small/code/mixtral-offloading.jsonl"
    proc = _snakemake(*args, single)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / single).is_file() and not (tmp_path / "results" / "tables").exists()

    proc = _snakemake(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = yaml.safe_load((ROOT / ".test" / "config.yaml").read_text())
    experiments = list(config["experiments"])
    assert set(experiments) == set(REGISTRY), "the .test config leaves an experiment out"
    for name in experiments:
        table = pd.read_csv(tmp_path / "results" / "tables" / f"{name}.csv")
        assert len(table) > 0, name
        png = (tmp_path / "results" / "figures" / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n", name
        page = (tmp_path / "results" / "tables" / f"{name}.html").read_text()
        assert page.count("<tr>") == len(table) + 1, name  # the header and every row
    main = pd.read_csv(tmp_path / "results" / "tables" / "main.csv")
    assert set(main["system"]) == {"resident", "on-demand", "naive", "hf-offload", "mixtral-offloading", "moe-infinity",
                                   "fiddler", "ktransformers", "llama-cpp-cpu-moe", "sp-moe", "specmoeoff", "specter",
                                   "sp-moe (K auto)",
                                   "specter (K auto)"}  # the speculative systems at the governor's K too
    assert (main["tpot_ms"] >= main["lower_bound_tpot_ms"]).all() and main["simulated"].all()
    assert set(main["memory"]) == {"same slots", "same memory"}  # both of the paper's comparisons
    ablation = pd.read_csv(tmp_path / "results" / "tables" / "ablation.csv").sort_values("arm_index")
    assert list(dict.fromkeys(ablation["arm"])) == list(config["experiments"]["ablation"]["arms"])  # in order
    sensitivity = pd.read_csv(tmp_path / "results" / "tables" / "sensitivity.csv")
    assert set(sensitivity["temperature"]) == {0.0, 1.0} and set(sensitivity["dataset"]) == set(config["datasets"])
    measured = pd.read_csv(tmp_path / "results" / "tables" / "sim_vs_measured.csv")  # live on the CPU, beside twins
    assert measured["measured_on"].str.startswith("measured on cpu").all() and not measured["simulated"].any()
    assert set(measured["simulated_on"]) == {"measured-cpu"}
    recorded = measured["system"] == "mixtral-offloading"  # its twin decodes the recorded trace (its gate guesses)
    assert measured.loc[recorded, "tokens_as_recorded"].notna().all() and recorded.any()
    assert measured.loc[~recorded, "tokens_as_recorded"].isna().all()  # the others' twins: their live decodes
    priced = main[main["cost_as"] == "mixtral-8x7b"]
    assert len(priced) and (priced["tpot_ms"] > 10).all()  # Mixtral-8x7B's shapes: the paper's regime
    logs = [p for p in (tmp_path / "results" / "logs").rglob("*.log") if not p.name.endswith(".gptqmodel.log")]
    for path in logs:  # plain progress lines in Snakemake's logs (GPTQModel's own output has logs of its own)
        assert "\r" not in path.read_text(), path
    quantize_logs = [p.read_text() for p in logs if p.parent.parent.name == "quantize" and p.name.startswith("gptq-")]
    assert quantize_logs and all("GPTQ: quantizing, layer by layer" in text for text in quantize_logs)
    for path in (tmp_path / "results" / "runs").rglob("*.jsonl"):  # the runs replayed the recorded numerics
        assert all(json.loads(line)["extra"]["live_forwards"] == 0 for line in path.read_text().splitlines()), path

    summary = (tmp_path / "results" / "summary.md").read_text()  # the file the README's numbers are quoted from
    from specter.models.integrity import model_hash
    from specter.report.summary import fmt_ms

    for model in ("tiny-olmoe", "tiny-mixtral"):
        assert f"| {model} |  |  | `{model_hash(tmp_path / 'results' / 'models' / model)}` |" in summary
    for name in experiments:
        digest = hashlib.sha256((tmp_path / "results" / "tables" / f"{name}.csv").read_bytes()).hexdigest()
        assert f"| {name}.csv | {len(pd.read_csv(tmp_path / 'results' / 'tables' / f'{name}.csv'))} | `{digest}` |" \
            in summary
    for section in ("## main", "## ablation", "## k_sweep", "## calibration"):
        assert section in summary
    specter = main[(main["system"] == "specter") & (main["memory"] == "same slots")].iloc[0]
    row = f"| specter | {int(specter['slots_per_layer'])} | {int(specter['k'])} | {fmt_ms(specter['tpot_ms'])} |"
    assert row in summary
    again = subprocess.run([sys.executable, "-m", "specter", "summary", "results"], cwd=tmp_path, capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(repo)})
    assert again.returncode == 0 and again.stdout == summary  # no clock in it: the same tree, the same bytes

    proc = _snakemake(*args, "-n")
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr

    proc = _snakemake(*args, "--report", str(tmp_path / "report.html"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = (tmp_path / "report.html").read_text()
    assert "simulated" in html and "Belady" in html  # the captions made it in
    embedded = {base64.b64decode(m) for m in re.findall(r"data:text/html[^,\"]*;base64,([A-Za-z0-9+/=]+)", html)}
    for name in experiments:  # every experiment's table page is in the report, byte for byte
        assert (tmp_path / "results" / "tables" / f"{name}.html").read_bytes() in embedded, name


def _edited(edit, base=".test/config.yaml") -> dict:
    config = yaml.safe_load((ROOT / base).read_text())
    edit(config)
    return config


@pytest.mark.parametrize("edit, key, message", [
    (lambda c: c["models"].update({"tiny\n": {"build": "tiny-olmoe"}}), "models", "'tiny\\n' is not a safe name"),
    (lambda c: c["datasets"].update({"code\n": {}}), "datasets", "is not a safe name"),
    (lambda c: c["fidelity"].update(dataset="../../etc/passwd"), "fidelity.dataset", "climbs out with '..'"),
    (lambda c: c["fidelity"].update(dataset="/etc/passwd"), "fidelity.dataset", "is not a prompt file"),
    (lambda c: c["fidelity"].update(dataset="nowhere.jsonl"), "fidelity.dataset", "does not exist"),
    (lambda c: c["datasets"].update(mine={"path": "../prompts.jsonl"}), "datasets.mine.path", "climbs out"),
    (lambda c: c["datasets"].update(mine={"path": "a\nb.jsonl"}), "datasets.mine.path", "is not a path"),
    (lambda c: c["models"].update(mine={"path": "../../models/x"}), "models.mine.path", "climbs out"),
    (lambda c: c["hardware"].update(main="../../etc/hw.yaml"), "hardware", "climbs out"),
    (lambda c: c["experiments"]["oracle"].update(options={"noise": ["abc"]}), "experiments.oracle.options.noise",
     "'abc' is not a float"),
    (lambda c: c["experiments"]["oracle"].update(options={"noise": [float("nan")]}),
     "experiments.oracle.options.noise", "must be finite"),
    (lambda c: c["experiments"]["oracle"].update(options={"depth": [2]}), "experiments.oracle.options.depth",
     "no listed system"),
    (lambda c: c["protocol"].update(max_new_tokens=100_000), "protocol.max_new_tokens", "max_position_embeddings"),
    (lambda c: c["protocol"].update(max_new_tokens=10**9), "protocol.max_new_tokens", "from 2 to 1048576"),
    (lambda c: c["protocol"].update(seed=-1), "protocol.seed", "whole number from 0"),
    (lambda c: c["protocol"].update(repeats=10**6), "protocol.repeats", "maximum of 100"),
    (lambda c: c["experiments"]["prefix_sweep"]["axes"].update(prefix_tokens=[8, 600]), "protocol.max_new_tokens",
     "a prompt of 600 tokens"),
    (lambda c: c["fidelity"].update(new_tokens=1000), "fidelity.new_tokens", "max_position_embeddings"),
    (lambda c: c["fidelity"].update(stride=10**9), "fidelity.stride", "from 1 to 1048576"),
    (lambda c: c["calibration"].update(seq_len=2048), "calibration.seq_len", "max_position_embeddings"),
    (lambda c: c["calibration"].update(num_sequences=10**9), "calibration.num_sequences", "from 1 to 100000"),
    (lambda c: c["cases"]["small"].update(k=5000), "cases.small.k", "from 1 to 1024"),
    (lambda c: c["experiments"]["k_sweep"]["axes"].update(k=[2, 4096]), "experiments.k_sweep.axes.k", "1024"),
    (lambda c: c["experiments"]["sensitivity"]["axes"].update(temperature=[0, float("nan")]),
     "experiments.sensitivity.axes.temperature", "finite number"),
    (lambda c: c["experiments"]["budget"]["axes"].update(resident_fraction=[float("nan")]),
     "experiments.budget.axes.resident_fraction", "finite number"),
    (lambda c: c["experiments"].update(budget={"systems": ["specter"], "axes": {"device_memory_gb": [float("inf")]}}),
     "experiments.budget.axes.device_memory_gb", "finite number"),
    (lambda c: c["experiments"]["sim_vs_measured"].update(cases=["mixtral"]), "experiments.sim_vs_measured.cases",
     "decodes the model itself live"),
    (lambda c: c["experiments"]["sim_vs_measured"].update(systems=["mixtral-offloading"], options={"depth": [0, 1]}),
     "experiments.sim_vs_measured.options.depth", "the live engine cannot run 'mixtral-offloading' (depth=1"),
    (lambda c: c["experiments"]["sim_vs_measured"].update(axes={"expert_bits": ["q4_k_m"]}),
     "experiments.sim_vs_measured.axes.expert_bits", "decode live, which takes 16 there"),
    (lambda c: c["experiments"]["hit_rate"]["axes"].update(resident_per_layer=[1, 99]),
     "experiments.hit_rate.axes.resident_per_layer", "99 must be between 1 and"),
    (lambda c: c["datasets"].update(humaneval={"path": "prompts.jsonl"}), "datasets.humaneval",
     "is a prompt set the suite ships, and this one is a file"),
    (lambda c: c["experiments"]["k_sweep"]["axes"].update(k=[2, 2, "auto"]), "experiments.k_sweep.axes.k",
     "has non-unique elements"),
    (lambda c: c["experiments"]["k_sweep"].update(systems=["specter", "specter"]), "experiments.k_sweep.systems",
     "has non-unique elements"),
    (lambda c: c["experiments"]["oracle"].update(options={"noise": [0.0, 0, 0.5]}), "experiments.oracle.options.noise",
     "0.0 and 0 are one value"),
    (lambda c: c["experiments"]["k_sweep"].update(systems=["specter", "on-demand"]), "experiments.k_sweep.systems",
     "'on-demand' drafts no window"),
    (lambda c: c["experiments"]["hit_rate"].update(systems=["on-demand", "ktransformers"]),
     "experiments.hit_rate.systems", "compares runs of on-demand and specter, not of 'ktransformers'"),
    (lambda c: c["experiments"]["main"].update(systems=["ktransformers"], options={"cuda-graph": [True, 1]}),
     "experiments.main.options.cuda-graph", "True and 1 are one setting of ktransformers"),
    (lambda c: c["experiments"]["hardware"]["axes"].update(
        hardware=["t4-pcie3", str(ROOT / "specter/presets/hardware/t4-pcie3.yaml")]),
     "experiments.hardware.axes.hardware", "are one profile (the same numbers)"),
    (lambda c: c["experiments"]["dispatch"]["axes"].update(dispatch_us=[10, "profile"]),
     "experiments.dispatch.axes.dispatch_us", "10 and profile are one time on a100-40gb-pcie4"),
], ids=["model_name_trailing_newline", "dataset_name_trailing_newline", "fidelity_dataset_climbs_out",
        "fidelity_dataset_not_a_prompt_file", "fidelity_dataset_missing", "dataset_path_climbs_out",
        "dataset_path_two_lines", "model_path_climbs_out", "hardware_path_climbs_out", "option_not_a_number",
        "option_nan", "option_no_system_has", "max_new_tokens_beyond_positions", "max_new_tokens_beyond_the_flag",
        "seed_negative", "repeats_huge", "prefix_axis_beyond_positions", "fidelity_new_tokens_beyond_positions",
        "fidelity_stride_huge", "calibration_beyond_positions", "calibration_sequences_huge", "case_k_huge",
        "k_axis_huge", "temperature_nan", "resident_fraction_nan", "device_memory_inf", "live_in_a_priced_case",
        "live_system_it_cannot_run", "live_expert_bits_it_cannot_run",
        "slots_axis_past_the_experts", "a_file_under_a_shipped_sets_name",
        "axis_value_twice", "system_twice", "option_value_spelled_twice", "non_speculative_in_a_k_sweep",
        "system_a_table_does_not_compare",
        "option_boolean_as_a_number",
        "preset_by_name_and_by_file",
        "dispatch_time_of_the_profile_and_profile"])
def test_every_config_value_is_checked_naming_its_key(edit, key, message):
    """What the schema lets through (a name ending in a newline, NaN, infinity, numbers past the flag they become or
    the model's positions, a path that climbs out, a non-number option) is refused with the config, naming the key."""
    from specter.config_document import check_schema
    from specter.workflow_checks import ConfigError, check_config

    config = _edited(edit)
    with pytest.raises(ConfigError) as err:
        check_schema(config, ROOT / "workflow" / "schemas" / "config.schema.yaml")
        check_config(config)
    text = str(err.value)
    assert "\n" not in text and key in text and message in text, text


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["fidelity"].update(strides=3), "config fidelity: Additional properties are not allowed ('strides'"),
    (lambda c: c["protocol"].update(max_new_tokens=100_000), "config protocol.max_new_tokens:"),
], ids=["schema", "check"])
def test_a_config_error_is_one_line_and_exit_2_before_snakemake_plans(edit, message, tmp_path):
    """Snakemake's own validation error ran to many lines with exit 1; the workflow's is one line, exit 2."""
    work = tmp_path / "work"
    work.mkdir()
    proc = _snakemake("-n", "--cores", "1", "--configfile", _config(tmp_path, edit), "--directory", str(work))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"specter: error: {message}"), \
        proc.stdout[-2000:] + proc.stderr[-3000:]


_PROBE = '''"""A test's baseline: on-demand under another name, in a file of its own."""

from specter.systems.reference import OnDemand


class Probe(OnDemand):
    """On-demand loading, added as a new baseline is: one file in baselines/."""

    name = "probe-baseline"
'''


def test_a_new_baseline_is_one_file_seen_by_the_cli_the_workflow_the_tables_and_the_figures(tiny_dirs, rtn_drafts,
                                                                                             tmp_path):
    """A file dropped into `baselines/` of a copy of the repository, and nothing else changed: `specter systems` lists
    it, the workflow's config check takes it, a sweep runs it, `main`'s table holds its row and its figure gives it a
    colour of its own, placed before Specter's rows."""
    repo = _repository_copy(tmp_path / "repo")
    (repo / "baselines" / "probe_baseline.py").write_text(_PROBE)
    env = {**os.environ, "PYTHONPATH": str(repo)}

    def specter(*args):
        proc = subprocess.run([sys.executable, "-m", "specter", *args], cwd=repo, env=env, capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    assert "probe-baseline" in specter("systems")
    config = yaml.safe_load((repo / ".test" / "config.yaml").read_text())
    config["experiments"]["main"]["systems"].append("probe-baseline")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(["snakemake", "-n", "--cores", "1", "--configfile", str(tmp_path / "config.yaml")],
                          cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]

    records = tmp_path / "main.jsonl"
    specter("sweep", "--systems", "probe-baseline,specter", "--model", tiny_dirs["mixtral"], "--draft",
            rtn_drafts["mixtral"], "--dataset", "code", "--hardware", "t4-pcie3", "--num-prompts", "1",
            "--prefix-tokens", "8", "--max-new-tokens", "4", "--k", "2", "--resident-per-layer", "2", "--out",
            str(records))
    specter("aggregate", "main", str(records), "--out", str(tmp_path / "main.csv"), "--figure",
            str(tmp_path / "main.png"))
    table = (tmp_path / "main.csv").read_text()
    assert "probe-baseline" in table and (tmp_path / "main.png").read_bytes()[:4] == b"\x89PNG"
    code = ("from specter.report.plotting import _SPARE, palette; p = palette(['specter', 'probe-baseline', "
            "'on-demand']); print(list(p), p['probe-baseline'] in _SPARE and len(set(p.values())) == 3)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True)
    assert proc.stdout.strip() == "['on-demand', 'probe-baseline', 'specter'] True", proc.stderr[-2000:]


def test_routing_locality_runs_without_the_routing_experiment():
    """`routing_locality` reads routing statistics (a kind of source), not the `routing` experiment's records, so a
    config without `routing` is accepted, and its cases are its own."""
    from specter.experiments import cases_of, records_experiment
    from specter.workflow_checks import check_config

    config = _edited(lambda c: c["experiments"].pop("routing", None))
    assert "routing_locality" in config["experiments"] and records_experiment("routing_locality") == "routing_locality"
    check_config(config)
    assert cases_of(config, "routing_locality") == list(config["cases"])[:1]
