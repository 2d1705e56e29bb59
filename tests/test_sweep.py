"""Sweeps, recorded numerics on disk (memos), the oracle and ablation variants, and budgets as shares."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import spec
from specter.errors import SpecterError
from specter.quant.quantize import quantize_draft
from specter.runs import execute, grid, sweep
from specter.session import Session

ARCH = "olmoe"  # 16 experts, top-4: room for budgets and noise


@pytest.fixture(scope="module")
def draft(tiny_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep_draft") / ARCH
    quantize_draft(tiny_dirs[ARCH], out, method="rtn", bits=4, group_size=32)
    return str(out)


def _req(tiny_dirs, draft, **over):
    base = dict(system="specter", model=tiny_dirs[ARCH], draft=draft, dataset="code", hardware="a100-40gb-pcie4",
                out="", num_prompts=2, prefix_tokens=16, max_new_tokens=20, resident_fraction=0.25, k=4,
)
    base.update(over)
    return spec(**base)


def _strip(records):
    return [{k: v for k, v in r.as_dict().items() if k not in ("wall_s", "config", "extra")} for r in records]


def test_grid_drops_settings_a_system_ignores(tiny_dirs, draft):
    base = _req(tiny_dirs, draft)
    runs = grid(base, {"system": ["on-demand", "specter", "specter-oracle"], "k": [2, 4],
                       "prefetch": ["adaptive", "none"]}, {"noise": ["0", "0.5"]})
    on_demand = [r for r in runs if r.system == "on-demand"]
    assert len(on_demand) == 1 and on_demand[0].k.value is None  # K and prefetch do not change a non-speculative run
    assert len([r for r in runs if r.system == "specter"]) == 4 and all(
        r.system_options == () for r in runs if r.system == "specter")  # noise is not specter's option
    assert len([r for r in runs if r.system == "specter-oracle"]) == 8
    with pytest.raises(SpecterError, match="no swept system has option 'depth'"):
        grid(base, {"system": ["specter"]}, {"depth": ["1"]})
    with pytest.raises(SpecterError, match="cannot sweep 'seed'"):
        grid(base, {"seed": [1, 2]})


def test_memo_replays_in_a_new_process_state_and_equals_live(tiny_dirs, draft, tmp_path):
    live = execute(_req(tiny_dirs, draft), progress=False)
    assert any(r.extra["live_forwards"] for r in live)
    memo = tmp_path / "memo.json.gz"
    sweep([_req(tiny_dirs, draft, hardware="t4-pcie3", resident_fraction=0.5)], out=None, memo_out=memo,
          progress=False)
    # a new session, as a new process: nothing in memory but the memo file
    replay = execute(_req(tiny_dirs, draft, memo=(str(memo),)), Session(), progress=False)
    assert all(r.extra["live_forwards"] == 0 for r in replay)
    assert _strip(replay) == _strip(live)


def test_memo_of_another_model_is_refused(tiny_dirs, draft, tmp_path):
    memo = tmp_path / "memo.json.gz"
    sweep([_req(tiny_dirs, draft, system="on-demand", k=None)], out=None, memo_out=memo, progress=False)
    other = tiny_dirs["mixtral"]
    proc = subprocess.run([sys.executable, "-m", "specter", "run", "--system", "on-demand", "--model", other,
                           "--dataset", "code", "--num-prompts", "1", "--max-new-tokens", "4", "--hardware",
                           "a100-40gb-pcie4", "--resident-per-layer", "1", "--memo", str(memo), "--out",
                           str(tmp_path / "x.jsonl")], capture_output=True, text=True)
    assert proc.returncode == 2 and "recorded on another model" in proc.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_resident_fraction_rounds_to_slots(tiny_dirs, draft):
    (r, *_) = execute(_req(tiny_dirs, draft, system="on-demand", k=None, resident_fraction=0.3, num_prompts=1),
                      progress=False)
    assert r.slots_per_layer == round(0.3 * 16)
    with pytest.raises(SpecterError, match="--resident-fraction 1.5 must be in"):
        execute(_req(tiny_dirs, draft, resident_fraction=1.5), progress=False)


def test_oracle_forecast_is_exact_at_noise_zero_and_misses_at_noise_one(tiny_dirs, draft):
    session = Session()
    exact = execute(_req(tiny_dirs, draft, system="specter-oracle", system_options=(("noise", "0"),)), session,
                    progress=False)
    wrong = execute(_req(tiny_dirs, draft, system="specter-oracle", system_options=(("noise", "1"),)), session,
                    progress=False)
    for r in exact:
        assert all(p["precision"] == 1.0 and p["recall"] == 1.0 for p in r.expert_prediction)
    for r in wrong:
        assert all(p["recall"] == 0.0 for p in r.expert_prediction)
    assert [r.output_token_ids for r in exact] == [r.output_token_ids for r in wrong]  # lossless either way


def test_serialized_demand_copies_never_beat_overlapped_ones(tiny_dirs, draft, free_host):
    session = Session()
    full = execute(_req(tiny_dirs, draft, prefetch="none", hardware=free_host), session, progress=False)
    serial = execute(_req(tiny_dirs, draft, prefetch="none", hardware=free_host,
                          system_options=(("serialize-demand", "true"),)), session, progress=False)
    assert all(s.tpot_ms >= f.tpot_ms for s, f in zip(serial, full))
    assert any(s.tpot_ms > f.tpot_ms for s, f in zip(serial, full))
    for r in full:
        assert 4 <= r.window_working_set <= 16  # at least top-k, at most every expert of a layer


def test_sweep_cli_writes_one_jsonl_and_checks_every_run_first(tiny_dirs, draft, tmp_path):
    out = tmp_path / "sweep.jsonl"
    base = [sys.executable, "-m", "specter", "sweep", "--model", tiny_dirs[ARCH], "--draft", draft, "--dataset",
            "code", "--num-prompts", "1", "--max-new-tokens", "8", "--hardware", "a100-40gb-pcie4,t4-pcie3",
            "--resident-fraction", "0.25,0.5", "--k", "2,4"]
    proc = subprocess.run(base + ["--systems", "on-demand,specter", "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4 + 8  # on-demand: 2 hardware x 2 budgets; specter: x 2 K
    bad = tmp_path / "bad.jsonl"
    proc = subprocess.run(base + ["--systems", "specter,nonesuch", "--out", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown system 'nonesuch'" in proc.stderr and not bad.exists()


def test_routing_entropy_reads_the_evaluation_prompts_routes_from_a_memo(tiny_dirs, draft, tmp_path):
    """The paper's Fig 5 table from a recording: every evaluation token's routes (prompt and decode steps), none of
    the calibration prompts a governor or a warm-up decoded; each layer's uses sum to tokens x top-k; the entropy is
    between 0 and log2(experts)."""
    import math

    from specter.models.loading import load_moe_model
    from specter.report.tables import routing_entropy_table

    memo = tmp_path / "memo" / "tiny" / "code-p16-k4.json.gz"
    sweep([_req(tiny_dirs, draft, system="moe-infinity", k=None), _req(tiny_dirs, draft, k="auto")], out=None,
          memo_out=memo, progress=False)
    table = routing_entropy_table([memo])
    moe = load_moe_model(tiny_dirs[ARCH])
    top_k, experts = moe.moe_layers[0].top_k, moe.moe_layers[0].num_experts
    assert set(table["model"]) == {"tiny"} and set(table["dataset"]) == {"code"}
    assert set(table["tokens"]) == {2 * (16 + 20 - 1)}  # 2 prompts of 16 tokens, 19 decode steps: no calibration one
    per_layer = table.groupby("layer")
    assert (per_layer["uses"].sum() == 2 * (16 + 20 - 1) * top_k).all()
    assert len(table) == len(moe.moe_layers) * experts
    assert table["entropy_bits"].between(0, math.log2(experts) + 1e-9).all()
    assert per_layer["use_share"].sum().sub(1).abs().max() < 1e-9


def test_a_recording_that_starts_from_another_sets_keeps_its_own_prompts(tiny_dirs, draft, tmp_path):
    """The workflow records a second prompt set starting from the first set's memo (their warm-up traces are the
    same): the second memo holds the calibration traces it used and its own prompts, not the first set's, so its
    routing statistics read one prompt set; a replay from it computes nothing."""
    from specter.numerics.memo import memo_routes

    first, second = tmp_path / "code.json.gz", tmp_path / "prose.json.gz"
    sweep([_req(tiny_dirs, draft, system="moe-infinity", k=None)], out=None, memo_out=first, progress=False)
    session = Session()
    sweep([_req(tiny_dirs, draft, system="moe-infinity", k=None, dataset="prose", memo=(str(first),))], out=None,
          memo_out=second, session=session, progress=False)
    service = next(iter(session._targets.values()))[1]
    assert service.forward_calls == 2 * 20  # the two prose prompts' decodes; the warm-up traces were read
    assert len(memo_routes(first)) == len(memo_routes(second)) == 2  # evaluation traces: each set's two prompts
    assert memo_routes(first) != memo_routes(second)
    replay = execute(_req(tiny_dirs, draft, system="moe-infinity", k=None, dataset="prose", memo=(str(second),)),
                     Session(), progress=False)
    assert all(r.extra["live_forwards"] == 0 for r in replay)


def test_copied_kv_keeps_the_tokens_and_pays_a_second_kv_and_a_copy_a_cycle(tiny_dirs, draft):
    session = Session()
    shared = execute(_req(tiny_dirs, draft, device_memory_gb=None, resident_fraction=0.25), session, progress=False)
    copied = execute(_req(tiny_dirs, draft, system_options=(("draft-kv", "copied"),)), session, progress=False)
    assert [r.output_token_ids for r in copied] == [r.output_token_ids for r in shared]  # the copy equals the KV read
    assert all(c.tpot_ms > s.tpot_ms for c, s in zip(copied, shared))  # every cycle pays its copy
    for c, s in zip(copied, shared):
        assert c.config["memory"]["kv_bytes"] == 2 * s.config["memory"]["kv_bytes"]
        assert c.extra["breakdown_ms"]["draft"] > s.extra["breakdown_ms"]["draft"]  # the copies are the draft's
    with pytest.raises(SpecterError, match="option draft-kv='own' is not one of shared, copied"):
        execute(_req(tiny_dirs, draft, system_options=(("draft-kv", "own"),)), session, progress=False)


def test_arms_run_in_order_at_every_point_and_name_their_records(tiny_dirs, draft, tmp_path):
    from specter.runspec import Arm

    arms = [Arm.parse(t) for t in ("full", "no prefetch:prefetch=none",
                                   "+ copied KV:prefetch=none,draft-kv=copied")]
    assert arms[2].settings == (("prefetch", "none"),) and arms[2].options == (("draft-kv", "copied"),)
    assert [Arm.parse(a.flag()) for a in arms] == arms
    specs = grid(_req(tiny_dirs, draft), {"system": ["on-demand", "specter"], "k": [2, 4]}, arms=arms)
    specter = [(s.k.value, s.arm, s.prefetch, s.system_options) for s in specs if s.system == "specter"]
    assert specter == [(k, a.name, p, o) for k in (2, 4) for a, p, o in (
        (arms[0], "adaptive", ()), (arms[1], "none", ()), (arms[2], "none", (("draft-kv", "copied"),)))]
    # on-demand has neither K, prefetch nor draft-kv: each arm is the same run under its own name
    assert [s.arm for s in specs if s.system == "on-demand"] == ["full", "no prefetch", "+ copied KV"]
    records = sweep([s for s in specs if s.system == "specter" and s.k.value == 2], tmp_path / "a.jsonl",
                    progress=False)
    assert [r.config["arm"] for r in records] == [a.name for a in arms for _ in range(2)]
    assert Arm.parse("u:draft-kernel=unfused").settings == (("draft_kernel", "unfused"),)  # either spelling
    for bad, message in (("no name:", None), (":prefetch=none", "has no name"), ("prefetch=none", "has no name"),
                         ("x:prefetch=never", "prefetch='never' is not one of"),
                         ("x:k=4", "an arm cannot set k"), ("x:prefetch", "must look like SETTING=VALUE"),
                         ("x:prefetch=none,prefetch=late", "sets prefetch twice")):
        if message is None:
            assert Arm.parse(bad).name == "no name"
            continue
        with pytest.raises(SpecterError, match=message):
            Arm.parse(bad)
    with pytest.raises(SpecterError, match="two arms have the same name"):
        grid(_req(tiny_dirs, draft), {}, arms=[arms[0], arms[0]])
    with pytest.raises(SpecterError, match="arm 'no prefetch' sets prefetch, which the sweep also varies"):
        grid(_req(tiny_dirs, draft), {"prefetch": ["adaptive", "late"]}, arms=arms[:2])
    with pytest.raises(SpecterError,
                       match="no listed system has option 'depth'; their options: bandwidth-estimate, draft-kv"):
        grid(_req(tiny_dirs, draft), {}, arms=[Arm.parse("d:depth=2")])
    with pytest.raises(SpecterError, match=r"--arm 'x:draft-kv=own': option draft-kv='own' is not one of"):
        grid(_req(tiny_dirs, draft), {}, arms=[Arm.parse("x:draft-kv=own")])


def test_sampled_runs_sweep_beside_greedy(tiny_dirs, draft):
    specs = grid(_req(tiny_dirs, draft, num_prompts=1, max_new_tokens=12),
                 {"system": ["on-demand", "specter"], "temperature": [0.0, 1.0]})
    records = sweep(specs, None, progress=False)
    by = {(r.system, r.config["temperature"]): r for r in records}
    assert set(by) == {(s, t) for s in ("on-demand", "specter") for t in (0.0, 1.0)}
    assert by["specter", 0.0].output_token_ids == by["on-demand", 0.0].output_token_ids  # greedy: lossless
    assert by["specter", 1.0].extra["live_forwards"] > 0 and by["specter", 0.0].acceptance_rate is not None
    assert all(len(r.output_token_ids) == 12 for r in records)


def test_simulated_repeats_run_once_and_say_so(tiny_dirs, draft):
    session = Session()
    once = execute(_req(tiny_dirs, draft, num_prompts=1, repeats=1), session, progress=False)
    thrice = execute(_req(tiny_dirs, draft, num_prompts=1, repeats=3), session, progress=False)
    assert len(thrice) == 1 and _strip(thrice) == _strip(once)
    assert once[0].extra["repeats"] == {"asked": 1, "timed": 1}
    assert thrice[0].extra["repeats"]["timed"] == 1 and "deterministic" in thrice[0].extra["repeats"]["collapsed"]
    assert thrice[0].config["repeats"] == 3
    unsaid = execute(_req(tiny_dirs, draft, num_prompts=1), session, progress=False)  # 3 asked unless told
    assert unsaid[0].extra["repeats"] == thrice[0].extra["repeats"] and len(unsaid) == 1
    with pytest.raises(SpecterError, match="--repeats must be a whole number from 1 to 100, got 0"):
        execute(_req(tiny_dirs, draft, repeats=0), session, progress=False)


def test_a_draft_written_again_or_elsewhere_keeps_its_key_and_a_changed_one_does_not(tmp_path):
    """Memoized windows are keyed by the draft: the same quantization written again (another time, another source
    path) keeps the key, so a second cold reproduce writes the same memos; other tensors or settings change it."""
    from specter.numerics.memo import draft_key

    meta = {"method": "gptq", "bits": 4, "group_size": 64, "source_hash": "ab" * 32, "seconds": 134.7,
            "source_model": "/one/results/models/m"}

    def write(name, tensors=b"experts", **over):
        d = tmp_path / name
        d.mkdir()
        (d / "meta.json").write_text(json.dumps({**meta, **over}, indent=2))
        (d / "experts.safetensors").write_bytes(tensors)
        return d

    first = draft_key(write("first"))
    assert draft_key(write("again", seconds=115.6, source_model="/two/results/models/m")) == first
    assert draft_key(write("bits", bits=3)) != first
    assert draft_key(write("tensors", tensors=b"other experts")) != first


def test_every_sweepable_flag_is_an_axis_a_sweep_keeps():
    """A flag marked sweepable that `SWEEP_AXES` left out would be dropped from a sweep without a word (its runs at
    the default): every one is an axis."""
    from specter.runspec import SWEEP_AXES, _flag_fields

    assert {f.name for f in _flag_fields() if f.metadata["sweep"]} <= set(SWEEP_AXES)


def test_a_sweep_over_pricings_and_dispatch_keeps_each_apart_in_its_tables(tiny_dirs, draft, tmp_path):
    """`--pricing` and `--dispatch-us` are axes: every run is priced as its point says, the record carries the
    pricing and the profile as run, and a table keeps each pricing and dispatch time in rows of its own."""
    from specter.cli.parser import build_parser
    from specter.report.tables import experiment_table
    from specter.runspec.flags import sweep_from_args

    out = tmp_path / "runs.jsonl"
    args = build_parser().parse_args(["sweep", "--model", tiny_dirs[ARCH], "--draft", draft, "--dataset", "code",
                                      "--hardware", "a100-40gb-pcie4", "--resident-per-layer", "2", "--systems",
                                      "on-demand", "--pricing", "fused,upstream", "--dispatch-us", "profile,20",
                                      "--num-prompts", "1", "--max-new-tokens", "4", "--out", str(out)])
    base, axes, options = sweep_from_args(args, ["on-demand"])
    specs = grid(base, axes, options)
    assert [(s.dispatch_us, s.resolved_pricing) for s in specs] == [
        (None, "fused"), (None, "upstream"), (20.0, "fused"), (20.0, "upstream")]
    records = [r.as_dict() for s in specs for r in execute(s, progress=False)]
    assert [r["config"]["priced_ops"]["pricing"] for r in records] == ["fused", "upstream"] * 2
    assert [r["config"]["hardware_profile"]["host"]["dispatch_us"] for r in records] == [10, 10, 20, 20]
    table = experiment_table("budget", records)
    assert sorted(zip(table["pricing"], table["dispatch_us"])) == [("fused", 10), ("fused", 20), ("upstream", 10),
                                                                   ("upstream", 20)]
    slower = table.set_index(["pricing", "dispatch_us"])["tpot_ms"]
    assert slower[("fused", 20)] > slower[("fused", 10)]
    assert slower[("upstream", 20)] > slower[("upstream", 10)]


def test_the_dispatch_experiment_draws_tpot_against_the_host_time_per_kernel(tiny_dirs, draft, tmp_path,
                                                                             monkeypatch):
    """The `dispatch` experiment's table keeps a row per dispatch time and comparison, and its figure puts the
    dispatch times themselves on the x axis (not as a share), the same-memory runs dashed."""
    import matplotlib.axes

    from specter import experiments
    from specter.cli.parser import build_parser
    from specter.report.figures import _plot_lines, plot
    from specter.report.tables import experiment_table
    from specter.runspec.flags import sweep_from_args

    args = build_parser().parse_args(["sweep", "--model", tiny_dirs[ARCH], "--draft", draft, "--dataset", "code",
                                      "--hardware", "a100-40gb-pcie4", "--resident-per-layer", "2",
                                      "--same-memory-as", "2", "--systems", "on-demand", "--pricing", "upstream",
                                      "--dispatch-us", "5,20", "--num-prompts", "1", "--max-new-tokens", "4",
                                      "--out", str(tmp_path / "runs.jsonl")])
    base, axes, options = sweep_from_args(args, ["on-demand"])
    records = [r.as_dict() for s in grid(base, axes, options) for r in execute(s, progress=False)]
    table = experiment_table("dispatch", records)
    assert sorted(zip(table["memory"], table["dispatch_us"])) == [("same memory", 5), ("same memory", 20),
                                                                  ("same slots", 5), ("same slots", 20)]
    drawn, original = [], matplotlib.axes.Axes.plot

    def spy(ax, x, y, *rest, **kwargs):
        drawn.append((list(x), kwargs.get("linestyle"), kwargs.get("label")))
        return original(ax, x, y, *rest, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    _plot_lines(experiments.get("dispatch").figure, table, tmp_path / "dispatch.png", "simulated")
    monkeypatch.undo()
    # any other figure of these runs draws a panel per dispatch time (its x is not the dispatch time)
    from specter.report.plotting import panel_grid

    budget = experiment_table("budget", records)
    assert [title.endswith(f"{us} us a dispatched kernel") for _, _, title in panel_grid(budget)[1]
            for us in ("5", "20") if title.endswith(f"{us} us a dispatched kernel")] == [True, True]
    plot("budget", budget, tmp_path / "budget.png")
    assert sorted(drawn) == [([5, 20], "-", "on-demand, same slots"), ([5, 20], "--", "on-demand, same memory")]
    assert (tmp_path / "dispatch.png").stat().st_size > 0
