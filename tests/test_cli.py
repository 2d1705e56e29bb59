"""The CLI skeleton: version, supported models, inspect, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from transformers import LlamaConfig

from specter import __version__
from specter.cli import main
from specter.models.adapter import ARCHITECTURES


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_models_lists_every_supported_architecture(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for model_type in ARCHITECTURES:
        assert model_type in out


def test_inspect_tiny_mixtral_counts_experts_and_bytes(tiny_dirs, capsys):
    assert main(["inspect", tiny_dirs["mixtral"], "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    # tiny Mixtral: 2 layers x 8 experts, hidden 64, expert width 32, fp32 (see specter/models/tiny.py)
    assert s["experts_per_layer"] == 8 and s["top_k"] == 2 and s["moe_layers"] == [0, 1]
    assert s["params_per_expert"] == 3 * 64 * 32
    assert s["bytes_per_expert"] == 3 * 64 * 32 * 4
    assert s["routed_expert_bytes"] == 2 * 8 * 3 * 64 * 32 * 4

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dirs["mixtral"])
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(b.numel() * b.element_size() for b in model.buffers())
    assert s["routed_expert_bytes"] + s["non_expert_bytes"] == total


def test_inspect_human_readable(tiny_dirs, capsys):
    assert main(["inspect", tiny_dirs["deepseek_v3"]]) == 0
    out = capsys.readouterr().out
    assert "16 routed, top-4, plus shared" in out
    assert "3 (2 MoE: 1-2)" in out


def _bad_dirs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    dense = tmp_path / "dense"
    LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(dense)
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "not_a_real_arch", "num_experts": 8}))
    return {
        "no model": (empty, "holds no model"),
        "missing": (tmp_path / "nope", "does not exist"),
        "dense": (dense, "not a mixture of experts"),
        "unknown": (unknown, "unsupported architecture 'not_a_real_arch'"),
    }


@pytest.mark.parametrize("case", ["no model", "missing", "dense", "unknown"])
def test_bad_model_dir_is_one_line_and_exit_2(case, tmp_path):
    path, message = _bad_dirs(tmp_path)[case]
    proc = subprocess.run([sys.executable, "-m", "specter", "inspect", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("specter: error:")]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    if case in ("dense", "unknown"):
        assert "supported" in lines[0] and "mixtral" in lines[0]


def test_systems_lists_every_registered_system_with_its_options(capsys):
    from specter.cli import main
    from specter.systems import registry

    assert main(["systems"]) == 0
    out = capsys.readouterr().out
    for name, cls in registry().items():
        assert f"\n{name}: " in f"\n{out}", name
        for option in cls.options:
            assert f"--system-option {option}=" in out, (name, option)
    assert "resident: Every expert on the device" in out and "[speculative, own draft and KV]" in out


def _subcommands():
    from specter.cli.parser import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    return sub.choices


def test_every_subcommand_help_ends_with_an_example_that_parses(capsys):
    """The example each --help shows is a command line the parser accepts (a renamed flag fails this)."""
    import shlex

    from specter.cli.parser import EXAMPLES, build_parser

    commands = _subcommands()
    assert set(EXAMPLES) == set(commands)
    for name, p in commands.items():
        text = p.format_help()
        assert "\nexample:\n  specter " + name in text, name
        for line in EXAMPLES[name].split("\n"):
            args = build_parser().parse_args(shlex.split(line)[1:])
            assert args.command == name, line


def test_system_choices_come_from_the_registry_and_bad_names_are_named(capsys):
    from specter.cli.parser import build_parser
    from specter.systems import registry

    text = _subcommands()["run"].format_help()
    flat = " ".join(text.split())
    assert "one of " + ", ".join(sorted(registry())) in flat
    for argv, bad in ((["run", "--system", "specterr"], "specterr"),
                      (["compare", "--systems", "on-demand,nope"], "'nope'"),
                      (["sweep", "--systems", "naive, fidler"], "'fidler'")):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert bad in err and "specter-oracle" in err, err  # the bad value and the names to choose from


def test_threads_default_to_the_cores_available():
    import os

    from specter.cli.parser import build_parser

    args = build_parser().parse_args(["build-model", "tiny-mixtral", "--out", "/tmp/specter-threads-check"])
    assert args.threads == len(os.sched_getaffinity(0))


def test_help_needs_no_torch():
    """`specter --help` and the torch-free commands start without importing torch (the system names load lazily)."""
    code = ("import sys; from specter.cli.parser import build_parser; build_parser().format_help(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_tables_figures_and_pages_need_no_torch():
    """`specter aggregate` and `plot` (16 jobs of every workflow run) read records, memos' routes and tables without
    importing torch or transformers: seconds saved per job."""
    code = ("import sys; import specter.report.tables, specter.report.figures, specter.report.html, "
            "specter.records, specter.report.summary; from specter.numerics.memo import memo_routes; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_an_interrupt_wrapped_by_a_library_still_exits_130(capsys, monkeypatch):
    """transformers' lazy import turns a Ctrl-C during an import into a RuntimeError caused by it: still exit 130."""
    from specter import cli

    def wrapped(_args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as err:
            raise RuntimeError("Failed to import transformers.models") from err

    args = cli.build_parser().parse_args(["systems"])
    args.func = wrapped
    monkeypatch.setattr(cli, "build_parser", lambda: type("P", (), {"parse_args": lambda self, argv: args})())
    assert cli.main(["systems"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_the_numerics_pin_holds_torch_mkl_and_onednn_to_avx2():
    """oneDNN picks its instruction set from the CPU, whatever torch's capability: on an AMX CPU bfloat16 attention
    under the AVX2 pin alone raised (pack_vnni2), so the pin caps it too; native numerics leave all of it alone."""
    from specter import determinism

    env = {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}
    determinism.pin_environment(env)
    assert env == {**env, "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    native = {determinism.NATIVE: "1", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}
    determinism.pin_environment(native)
    # deterministic algorithms stay on under native numerics, and on CUDA they need cuBLAS's workspace fixed
    assert native == {determinism.NATIVE: "1", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX",
                      "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    own = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    determinism.pin_environment(own)
    assert own["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # a user's own setting stands
    assert determinism.settings()["onednn_max_cpu_isa"] == os.environ.get("ONEDNN_MAX_CPU_ISA")
    if os.environ.get(determinism.NATIVE) != "1":  # the test session is pinned as the CLI is (conftest)
        assert determinism.settings()["onednn_max_cpu_isa"] == "AVX2"


@pytest.mark.parametrize("dont_write, cache", [("1", "cache"), ("1", ""), ("", "cache")])
def test_bytecode_is_kept_in_the_suite_cache_only_where_the_environment_forbids_it_beside_the_sources(
        tmp_path, dont_write, cache):
    """Under PYTHONDONTWRITEBYTECODE every process compiled torch and transformers from source again (about 11 s of a
    21 s replay); the CLI then keeps the bytecode in the suite's cache, never beside the sources, and does nothing with
    no cache or where Python may write it as usual."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "probe_module.py").write_text("VALUE = 1\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": dont_write,
           "SPECTER_CACHE_DIR": str(tmp_path / "cache") if cache else "",
           "PYTHONPATH": os.pathsep.join([str(src), os.getcwd()])}
    env.pop("PYTHONPYCACHEPREFIX", None)
    code = ("import sys; from specter.bytecode import cache_bytecode; cache_bytecode(); import probe_module; "
            "print(sys.pycache_prefix, sys.dont_write_bytecode)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    kept = list((tmp_path / "cache").rglob("probe_module*.pyc"))
    beside = list(src.rglob("*.pyc"))
    if dont_write and cache:
        assert out.split() == [str(tmp_path / "cache" / "pycache"), "False"] and len(kept) == 1 and not beside
    elif dont_write:
        assert out.split() == ["None", "True"] and not kept and not beside
    else:
        assert out.split() == ["None", "False"] and not kept and len(beside) == 1


def test_a_reader_that_goes_away_stops_a_listing_quietly():
    """`specter systems | head -1`: the closed pipe ends the command with SIGPIPE's status and no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "specter", "systems"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # before the listing is written (the command takes a second to start)
    stderr = proc.stderr.read().decode()
    assert proc.wait() == 141 and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_in_the_first_instants_exits_with_one_line_and_leaves_nothing(sig, code, tmp_path):
    """From the suite's first instruction on, a Ctrl-C (or SIGTERM) while torch, numpy and transformers import exits
    130 (143) with one line, each its own: an interrupt raised inside torch's import of numpy left numpy half-imported
    (a RecursionError on `np.dtypes`, 4 of 16 early interrupts) or aborted in C++. The delays start after the
    interpreter's own start (about 40 ms here), which precedes any code of the suite."""
    import signal
    import time

    signum = getattr(signal, sig)
    delays = (0.15, 0.25, 0.35, 0.45, 0.55, 0.65) if sig == "SIGINT" else (0.2, 0.4, 0.6)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    for trial in range(3 if sig == "SIGINT" else 1):
        for delay in delays:
            out = tmp_path / "model"
            proc = subprocess.Popen([sys.executable, "-m", "specter", "build-model", "tiny-mixtral", "--threads", "1",
                                     "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    env=env, cwd=tmp_path,
                                    # as from a terminal (a library loaded by pytest may leave SIGINT ignored)
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            time.sleep(delay)
            proc.send_signal(signum)
            _, err = proc.communicate(timeout=120)
            lines = [line for line in err.splitlines() if line.strip()]
            word = "interrupted" if sig == "SIGINT" else "terminated"
            assert proc.returncode == code and len(lines) == 1 and word in lines[0], (delay, err[-3000:])
            assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["tmp"], (delay, trial)
            left = [p.name for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor_")]
            assert not left, (delay, trial, left)  # (torch makes its compile cache there once it starts)


def test_a_signal_during_an_import_removes_the_open_temporaries_and_exits_at_once(tmp_path):
    """An import is never interrupted by an exception (libraries catch it and go on half-initialized): the process
    removes the temporaries it has open and exits 130 at once, with the CLI's line."""
    import signal
    import time

    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(60)\n")
    code = ("import sys; from specter import interrupt, io; interrupt.install(); "
            "t = io.temporary(sys.argv[1], directory=True); d = t.__enter__(); (d / 'part').write_text('x'); "
            "print(d, flush=True); import slow_import")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    made = proc.stdout.readline().strip()
    assert made and os.path.isdir(made), proc.stderr.read()
    time.sleep(0.5)  # inside the import
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and err.strip() == "specter: interrupted; outputs are written whole or not at all, " \
        "so none is partial" and time.monotonic() - start < 10, err
    assert not os.path.exists(made) and [p.name for p in tmp_path.iterdir() if p.name != "__pycache__"] == [
        "slow_import.py"]


def test_a_runs_summary_line_counts_prompts_and_timed_repeats_apart(tiny_dirs, tmp_path, capsys):
    """`specter run`'s last line says how many prompts it averaged over, and how many timed repeats of each where a
    live run timed several (the records are prompts x repeats)."""
    common = ["run", "--system", "on-demand", "--model", tiny_dirs["mixtral"], "--dataset", "code", "--hardware",
              "a100-40gb-pcie4", "--prefix-tokens", "8", "--max-new-tokens", "4", "--resident-per-layer", "2"]
    assert main([*common, "--num-prompts", "1", "--engine", "live", "--repeats", "2",
                 "--out", str(tmp_path / "live.jsonl")]) == 0
    assert "over 1 prompt x 2 timed repeats," in capsys.readouterr().out
    assert main([*common, "--num-prompts", "2", "--out", str(tmp_path / "sim.jsonl")]) == 0
    assert "over 2 prompts, 2/8 experts" in capsys.readouterr().out


def test_each_command_is_one_module_of_its_flags_and_its_main():
    """`specter.cli.commands` holds one module per command, each listed once in `COMMANDS` (the help's order) with its
    name, help, example, flags and main; the parser has exactly those commands."""
    import pkgutil

    from specter.cli import commands
    from specter.cli.parser import build_parser

    found = {m.name for m in pkgutil.iter_modules(commands.__path__)}
    assert found == set(commands.COMMANDS) and len(commands.COMMANDS) == len(found)
    names = []
    for module in commands.modules():
        assert all(hasattr(module, a) for a in ("NAME", "HELP", "EXAMPLE", "add_arguments", "main")), module.__name__
        assert module.__name__.rsplit(".", 1)[1] in (module.NAME.replace("-", "_"), "inspect_model"), module.NAME
        names.append(module.NAME)
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    assert list(sub.choices) == names
