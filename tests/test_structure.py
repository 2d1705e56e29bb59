"""The house's own rules: one place for each kind of change, no hidden process state, small functions, and a package
that carries its own data."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specter import experiments
from specter.cli import main
from specter.experiments import Experiment, Figure, Table

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ["specter/runs", "specter/systems", "specter/numerics", "specter/offload", "specter/timing",
           "specter/speculation", "specter/session.py", "specter/runspec", "specter/metrics.py", "specter/io.py",
           "baselines"]
MUTATORS = {"append", "add", "update", "setdefault", "clear", "pop", "extend", "insert", "remove", "discard"}


def _files(paths):
    for p in paths:
        path = ROOT / p
        yield from (sorted(path.rglob("*.py")) if path.is_dir() else [path])


def test_the_import_rules_of_the_house_hold():
    """The contracts in pyproject.toml ([tool.importlinter]): the layers of DESIGN.md, no import of a baseline from
    the suite, no torch in the report, no import circle in specter/."""
    proc = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                           "lint_imports_command()"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and "0 broken" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_the_contracts_hold_every_rule_with_no_exception():
    """The rules of DESIGN.md, as contracts: the spec, the experiments' descriptions and the numerics' pins below every
    layer that uses them; the report above the runs; no circle anywhere in specter/; no import ignored."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert not [c["name"] for c in contracts if c.get("ignore_imports")], "a contract ignores imports"
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    floor = {name.strip(): i for i, layer in enumerate(layers) for name in re.split(r"[:|]", layer)}
    assert floor["specter.report"] < floor["specter.runs"] < floor["specter.systems"] < floor["specter.offload"]
    assert floor["specter.models"] < floor["specter.experiments"] < floor["specter.runspec"] < floor["specter.errors"]
    assert floor["specter.determinism"] == floor["specter.errors"]
    assert any(c["type"] == "acyclic_siblings" and c["ancestors"] == ["specter"] and "depth" not in c
               for c in contracts), "no contract holds specter/ free of import circles"
    plain = [c for c in contracts if c["type"] == "forbidden" and c["forbidden_modules"] == ["specter.runspec"]]
    assert plain and {"specter.offload", "specter.models"} <= set(plain[0]["source_modules"]), \
        "no contract holds the offload and model layers to plain values"


def test_no_module_level_mutable_state_in_the_runtime():
    """No module-level container is changed after import (the old process-wide caches keyed by model)."""
    found = []
    for path in _files(RUNTIME):
        tree = ast.parse(path.read_text())
        containers = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                      for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                      if isinstance(t, ast.Name) and isinstance(node.value, (ast.Dict, ast.List, ast.Set, ast.Call))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found.append(f"{path.name}: global {', '.join(node.names)}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in containers):
                found.append(f"{path.name}:{node.lineno}: {node.func.value.id}.{node.func.attr}")
            if (isinstance(node, (ast.Assign, ast.AugAssign)) and any(
                    isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in containers
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
                found.append(f"{path.name}:{node.lineno}: item assignment to a module-level container")
    assert not found, found


def test_run_functions_are_short():
    long = [f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in _files(["specter/runs", "specter/runspec", "specter/session.py"])
            for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
            and node.end_lineno - node.lineno + 1 > 60]
    assert not long, long


def test_a_made_up_experiment_needs_only_a_registry_entry_and_config(tiny_dirs, tmp_path, monkeypatch):
    """A new experiment, defined here as one registry entry and one config entry, runs through the same code the
    workflow uses: its config entry becomes `specter sweep` arguments, its records a table and a figure."""
    from specter.quant.quantize import quantize_draft

    made_up = Experiment("made_up", "sweep", Table(keys=("system", "k", "prefetch", "slots_per_layer")),
                         Figure("grouped_bars", "Draft and oracle forecasts per policy", x="prefetch",
                                xlabel="prefetch policy"),
                         "TPOT of Specter and of its oracle under two prefetch policies.")
    monkeypatch.setitem(experiments.EXPERIMENTS, "made_up", made_up)
    entry = {"systems": ["specter", "specter-oracle"], "axes": {"prefetch": ["adaptive", "none"]},
             "options": {"noise": [0.0]}}
    main_settings = dict(k=3, hardware="a100-40gb-pcie4", prefix_tokens=12, slots=4, engine="sim")
    flags = experiments.sweep_flags(entry, main_settings)
    assert flags[:2] == ["--systems", "specter,specter-oracle"] and "--prefetch" in flags
    draft = tmp_path / "draft"
    quantize_draft(tiny_dirs["olmoe"], draft, method="rtn", bits=4, group_size=32)
    records = tmp_path / "made_up.jsonl"
    assert main(["sweep", "--model", tiny_dirs["olmoe"], "--draft", str(draft), "--dataset", "code",
                 "--num-prompts", "2", "--max-new-tokens", "10", *flags, "--out", str(records)]) == 0
    table, figure = tmp_path / "made_up.csv", tmp_path / "made_up.png"
    assert main(["aggregate", "made_up", str(records), "--out", str(table), "--figure", str(figure)]) == 0
    rows = pd.read_csv(table)
    expected = [(s, p) for s in ("specter", "specter-oracle") for p in ("adaptive", "none")]
    assert sorted(zip(rows["system"], rows["prefetch"])) == expected
    assert (rows["n"] == 2).all()
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_registered_experiment_has_a_known_table_and_figure_kind_and_its_caption_file():
    from specter.report.figures import KINDS
    from specter.report.tables import FROM_FILES, FROM_RECORDS

    for e in experiments.EXPERIMENTS.values():
        assert e.figure.kind in KINDS, e.name
        assert e.table.kind in {*FROM_RECORDS, *FROM_FILES}, e.name
        assert e.caption.strip(), e.name
        assert e.source in experiments.SOURCES or e.source in experiments.EXPERIMENTS, e.name
    assert {p.stem for p in experiments.CAPTIONS.glob("*.rst")} == set(experiments.EXPERIMENTS)


#: the commands a new user's first session runs, in a fresh venv with the suite installed as a wheel
WHEEL_SMOKE = (
    ["hardware"],
    ["systems"],
    ["build-model", "tiny-mixtral", "--out", "model"],
    ["quantize", "--model", "model", "--method", "gptq", "--group-size", "32", "--calibration-sequences", "4",
     "--calibration-length", "32", "--out", "draft"],
    ["run", "--system", "specter", "--model", "model", "--draft", "draft", "--dataset", "code", "--hardware",
     "a100-40gb-pcie4", "--resident-per-layer", "2", "--num-prompts", "1", "--max-new-tokens", "8", "--out",
     "specter.jsonl"],
)


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.slow
def test_a_wheel_install_runs_a_first_session(tmp_path):
    """`pip install .` (not editable) into a fresh venv, then, outside the checkout: `specter hardware` (every preset,
    read from inside the installed package), `specter systems`, a tiny build, a GPTQ quantize and a run. The venv sees
    this environment's packages (the dependencies and the README's data line), not the checkout: its site-packages
    lists this environment's (`--system-site-packages` would give the base interpreter's, which lack them where the
    tests run in a venv), as plain paths, so this environment's editable install of the suite is not activated. With
    `-s`, prints each command's output (the closing note quotes it)."""
    import site

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    (Path(purelib) / "this-environment.pth").write_text("".join(f"{p}\n" for p in ours))
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(ROOT)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    work = tmp_path / "work"
    work.mkdir()
    where = subprocess.run([str(python), "-c", "import specter; print(specter.__file__)"], cwd=work,
                           capture_output=True, text=True, env=env)
    assert str(venv) in where.stdout, where.stdout + where.stderr  # the installed copy, not this checkout
    outputs, errors = {}, {}
    for argv in WHEEL_SMOKE:
        proc = subprocess.run([str(venv / "bin" / "specter"), *argv], cwd=work, capture_output=True, text=True,
                              env=env)
        print(f"$ specter {' '.join(argv)}\n{proc.stderr}{proc.stdout}", end="")
        assert proc.returncode == 0, f"specter {' '.join(argv)}: {proc.stderr[-3000:]}"
        outputs[argv[0]], errors[argv[0]] = proc.stdout, proc.stderr
    names = sorted(p.stem for p in (ROOT / "specter" / "presets" / "hardware").glob("*.yaml"))
    assert len(names) >= 6 and all(f"{name}:" in outputs["hardware"] for name in names), outputs["hardware"]
    assert "specter: " in outputs["systems"] and "on-demand: " in outputs["systems"]
    assert "wrote gptq INT4 draft" in outputs["quantize"]
    numerics = json.loads((work / "draft" / "meta.json").read_text())["numerics"]  # where GPTQ calibrated, and how
    assert numerics["calibration_device"] == ("cuda" if torch_cuda() else "cpu")
    # auto: float32 on the CPU (bfloat16 there runs on oneDNN's AVX2 path), GPTQModel's choice on CUDA
    assert numerics["calibration_dtype"] in (("bfloat16", "float16") if torch_cuda() else ("float32",))
    # not a terminal: plain progress lines, GPTQModel's own output in the log beside the draft
    assert "\r" not in errors["quantize"] and "GPTQ: quantizing, layer by layer" in errors["quantize"]
    assert re.search(r"GPTQ layers: 2 layers done in [0-9.]+ s", errors["quantize"]), errors["quantize"]
    assert len(errors["quantize"]) < 4000 and (work / "draft.gptqmodel.log").stat().st_size > len(errors["quantize"])
    record = json.loads((work / "specter.jsonl").read_text().splitlines()[0])
    assert record["system"] == "specter" and record["simulated"] and record["tpot_ms"] > 0


def test_calibration_figure_draws_rows_with_and_without_a_suite_figure(tmp_path):
    """A published figure whose configuration did not run has no suite figure (NaN once the CSV is read back)."""
    import pandas as pd

    from specter.report.figures import plot

    table = pd.DataFrame([dict(paper="specter-v1", id="a", where="Fig 13", page=None, architecture="phi-3.5-moe",
                               hardware="a100-40gb-pcie4", system="specter", configuration="", metric="tpot_ms",
                               published=163.1, suite=150.0, suite_over_published=0.92, in_band=True, reason="",
                               prompts=5, proxy="p", simulated=True, note="", source="v1"),
                          dict(paper="moe-infinity", id="b", where="README", page=None, architecture="mixtral-8x7b",
                               hardware="rtx-a5000-pcie4", system="hf-offload", configuration="",
                               metric="s_per_token", published=6.6, suite=float("nan"),
                               suite_over_published=float("nan"), in_band=None, reason="not run", prompts=0,
                               proxy="", simulated=None, note="", source="README")])
    plot("calibration", table, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_the_system_names_read_from_source_are_the_registrys():
    """A table's reader checks its systems against `system_names` (no import of torch), a row's K against
    `speculative_names`, a record's settings against `option_kinds`, its host layers against `host_layers_rule` and
    its copies against `host_compute_names` and `whole_layer_copier_names`; they must find exactly what the registry
    imports."""
    import re
    import subprocess
    import sys

    from specter.system_names import (
        DEFAULT_ORDER,
        host_compute_names,
        host_layers_rule,
        option_kinds,
        prefetch_in_window_names,
        speculative_names,
        stall_free_names,
        system_colours,
        system_names,
        system_order,
        whole_layer_copier_names,
        window_plans,
    )
    from specter.systems import registry
    from specter.systems.base import System

    assert system_names() == set(registry())
    assert speculative_names() == {name for name, cls in registry().items() if cls.speculative}
    assert host_compute_names() == {name for name, cls in registry().items() if cls.host_compute}
    assert whole_layer_copier_names() == {name for name, cls in registry().items() if cls.copies_whole_layers}
    assert stall_free_names() == {name for name, cls in registry().items() if cls.stall_free}
    assert prefetch_in_window_names() == {name for name, cls in registry().items() if cls.prefetch_in_window}
    for name, cls in registry().items():  # a record's settings are held to these
        assert option_kinds(name) == {key: (spec[0].__name__, spec[1]) for key, spec in cls.options.items()}, name
        assert host_layers_rule(name) == cls.host_layers_rule, name
        assert window_plans(name) == cls.window_plans, name
    assert system_order() == tuple(sorted(registry(), key=lambda name: (registry()[name].order, name)))
    assert system_colours() == {name: cls.colour for name, cls in registry().items() if cls.colour}
    assert System.order == DEFAULT_ORDER
    colours = list(system_colours().values())
    assert len(set(colours)) == len(colours) and all(re.fullmatch("#[0-9a-f]{6}", c) for c in colours)
    code = "import sys; from specter.system_names import system_names; system_names(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_every_system_that_reads_warm_up_prompts_says_it_learns_from_history():
    """A live run decodes warm-up prompts on its device only for systems that declare `learns_from_history`; one that
    read `ctx.warmup` without it would decode them on the CPU (a whole model's decode, before its first GPU token)."""
    import inspect

    from specter.systems import registry

    for name, cls in registry().items():
        reads = "ctx.warmup" in inspect.getsource(inspect.getmodule(cls))
        assert reads == cls.learns_from_history, name


def test_no_source_file_passes_400_lines():
    """DESIGN.md's limit: a file has one responsibility and stays within 400 lines."""
    long = {str(path.relative_to(ROOT)): n for path in [*ROOT.glob("specter/**/*.py"), *ROOT.glob("baselines/*.py")]
            if (n := len(path.read_text("utf-8").splitlines())) > 400}
    assert not long, long


def test_every_registry_names_its_choices_on_an_unknown_name():
    """Systems, engines, experiments, table kinds, figure kinds and derived labels are each one `Registry`: an unknown
    name is one error naming the kind and every choice; the engines a run may name are those the timing layer makes."""
    from specter import experiments, runspec, timing
    from specter.registry import Registry, UnknownName
    from specter.report import figures, tables
    from specter.systems import SYSTEMS

    for registry, kind in ((SYSTEMS, "system"), (timing.ENGINES, "engine"), (experiments.EXPERIMENTS, "experiment"),
                           (tables.FROM_RECORDS, "table kind"), (tables.FROM_FILES, "table kind"),
                           (figures.KINDS, "figure kind"), (tables.DERIVES, "derive")):
        assert isinstance(registry, Registry) and registry.kind == kind
        with pytest.raises(UnknownName, match=f"unknown {kind} 'nonesuch'; {kind}s: {re.escape(', '.join(registry))}"):
            registry["nonesuch"]
    assert runspec.ENGINES == tuple(timing.ENGINES)
    assert {e.table.kind for e in experiments.EXPERIMENTS.values()} <= {*tables.FROM_RECORDS, *tables.FROM_FILES}
    assert {e.figure.kind for e in experiments.EXPERIMENTS.values()} <= set(figures.KINDS)
    assert not set(tables.FROM_RECORDS) & set(tables.FROM_FILES)
