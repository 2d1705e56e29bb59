"""The governors: a finite horizon, windows that do not overlap, and the online variant's bounds."""

from __future__ import annotations

import pytest

from conftest import spec
from specter.offload.work import ModelWork
from specter.quant.quantize import quantize_draft
from specter.runs import run
from specter.runspec import PROFILE_KS
from specter.speculation.governor import OnlineGovernor, _finite_tpot, calibration_windows, candidates_for


def test_the_finite_horizon_charges_whole_cycles():
    # 63 tokens to commit after the first: K = 32 committing 31 a cycle needs 3 cycles, K = 16 committing 16 needs 4
    assert _finite_tpot(1.0, 31, 64) == pytest.approx(3 / 63)
    assert _finite_tpot(0.6, 16, 64) == pytest.approx(4 * 0.6 / 63)
    assert candidates_for(64) == PROFILE_KS and candidates_for(10) == (2, 4, 6, 8) and candidates_for(3) == (2,)


def test_online_governor_stays_within_bounds_and_the_horizon():
    gov = OnlineGovernor({k: 0.1 + 0.01 * k for k in PROFILE_KS}, alpha=0.99, tokens=40)
    assert gov.next_k(0) == 32  # high acceptance: the longest window per its cost
    assert gov.next_k(35) <= 5  # 5 tokens left: no window beyond them
    gov.observe(0, 1)
    gov.observe(0, 1)
    assert gov.alpha == pytest.approx(0.99 * 0.75**2)  # keep_per_token 0.75: each check a whole window
    assert gov.next_k(0) < 32  # acceptance fell: shorter windows pay


def test_online_governor_weighs_each_verification_by_the_proposals_it_checked():
    """Calibrated at K = 16, a whole window moves the estimate by the paper's 0.25; an early rejection (1 accepted of
    2 checked) moves it by 1 - 0.75^(2/16), about 3.5%, instead of a quarter of the way to 0.5."""
    from specter.speculation.governor import GovernorChoice

    choice = GovernorChoice(16, "auto", [{"k": k, "cycle_s": 0.1 + 0.01 * k} for k in PROFILE_KS], alpha=0.96)
    calibrated = OnlineGovernor.calibrated(choice, 64)
    gov = calibrated.fresh()
    gov.observe(16, 16)
    assert gov.alpha == pytest.approx(0.75 * 0.96 + 0.25 * 1.0)
    early = calibrated.fresh()
    early.observe(1, 2)
    keep = 0.75 ** (2 / 16)
    assert early.alpha == pytest.approx(keep * 0.96 + (1 - keep) * 0.5)
    assert 0.94 < early.alpha < 0.96


@pytest.mark.parametrize("fused", [True, False])
def test_the_amortization_model_prices_a_draft_step_as_the_executor_runs_it(fused):
    """The governor's T_draft per step is the simulated executor's draft step, fused or not (it had priced every
    run's draft unfused: three launches per expert, at 442 KB experts nearly the whole step): the same launches and
    bytes, and the same time but for one position of attention."""
    from specter import timing
    from specter.models.architectures import load_architecture
    from specter.offload.cache import ExpertCache
    from specter.offload.executor import Executor, TransferStats
    from specter.timing.cost import CostModel
    from specter.timing.hardware import load_profile

    work = ModelWork.of(load_architecture("phi-3.5-moe").meta_model())
    profile = load_profile("a100-40gb-pcie4")
    cost, draft_bytes, context = CostModel(profile), work.quantized_expert_bytes(4, 128), 40
    executor = Executor(timing.make_engine("sim", profile), work, ExpertCache(work.moe_layers, 2), TransferStats())
    executor.fused_draft = fused
    end = executor.draft_step({layer: (0, 1) for layer in work.moe_layers}, context, draft_bytes, "d")
    ops = work.draft_step_ops(context, 2, draft_bytes, fused)
    ran = executor.passes[-1]
    assert sum(o.launches for o in ops) == ran.launches and sum(o.bytes_read for o in ops) == pytest.approx(
        ran.bytes_read, rel=1e-3)
    assert cost.total(ops) == pytest.approx(end.time, rel=0.01)  # the sim engine's compute stream, from 0
    fused_ops, unfused_ops = work.draft_step_ops(context, 2, draft_bytes), work.draft_step_ops(context, 2,
                                                                                                draft_bytes, False)
    assert cost.total(fused_ops) < cost.total(unfused_ops)


@pytest.fixture(scope="module")
def setup(tiny_dirs, tmp_path_factory):
    draft = tmp_path_factory.mktemp("gov") / "draft"
    quantize_draft(tiny_dirs["mixtral"], draft, method="rtn", bits=4, group_size=32)
    return tiny_dirs["mixtral"], str(draft)


def test_calibration_windows_do_not_overlap(setup):
    from specter.session import Session

    model, draft = setup
    service = Session().numerics(model, draft)[2]
    traces = [service.trace([104 + i, 101, 108, 108, 111], 40) for i in range(2)]
    windows = calibration_windows(service, traces, 16)
    assert len(windows) == 4
    starts = [w.start for w in windows]
    assert starts[1] - starts[0] == 17 and starts[3] - starts[2] == 17  # the next starts after the last proposal


@pytest.mark.parametrize("governor", ["auto", "profile", "online"])
def test_every_governor_records_its_choice(setup, tmp_path, governor):
    model, draft = setup
    (r, *_) = run(spec(system="specter", model=model, draft=draft, dataset="code", hardware="a100-40gb-pcie4",
                       out=str(tmp_path / "g.jsonl"), num_prompts=1, max_new_tokens=24, resident_per_layer=2,
                       k=governor), progress=False)
    choice = r.extra["governor"]
    assert choice["method"] == ("auto" if governor == "online" else governor)
    assert [row["k"] for row in choice["table"]] == list(candidates_for(24))
    if governor == "online":
        assert r.extra["k_per_cycle"] and all(k in PROFILE_KS for k in r.extra["k_per_cycle"])
    else:
        assert r.k == choice["k"]


def test_the_profiler_shares_the_amortization_models_calibration_decodes_and_first_windows(setup, tmp_path):
    """The profiler's prompts are the first of the amortization model's, and it runs its largest K first: after an
    `auto` run in the same session it decodes no calibration prompt again, and every K's first window is one already
    memoized (sharing them roughly halves the profile runs' time on the default model)."""
    from specter.runs.execute import prepare
    from specter.session import Session

    model, draft = setup

    def settings(k):
        return spec(system="specter", model=model, draft=draft, dataset="code", hardware="a100-40gb-pcie4",
                    out=str(tmp_path / "g.jsonl"), num_prompts=1, max_new_tokens=12, resident_per_layer=2, k=k)

    alone = Session()
    prepare(settings("profile"), alone)
    on_its_own = alone.numerics(model, draft)[2].forward_calls
    shared = Session()
    prepare(settings("auto"), shared)
    service = shared.numerics(model, draft)[2]
    before, traces = service.forward_calls, set(service.traces)
    prepare(settings("profile"), shared)
    assert set(service.traces) == traces  # its calibration prompts were decoded by the amortization model's
    decodes = 3 * 12  # what its 3 calibration decodes of 12 tokens cost on their own
    assert on_its_own - (service.forward_calls - before) > decodes  # and more: the first windows


def test_the_profiler_runs_its_largest_k_first_and_picks_the_lowest_tpot():
    """Largest K first, so that every smaller K's first window is a prefix of one already memoized; the choice is the
    lowest TPOT, ties to the smaller K."""
    from specter.speculation.governor import choose_k_profile

    order = []
    tpot = {2: 3.0, 4: 1.0, 8: 1.0, 16: 2.0, 32: 5.0}

    def run_with_k(k):
        order.append(k)
        return tpot.get(k, 9.0)

    choice = choose_k_profile(run_with_k, tokens=64)
    assert order == sorted(candidates_for(64), reverse=True) and len(order) > 1
    assert choice.k == 4 and [row["k"] for row in choice.table] == sorted(order)


def test_a_checkpoint_with_a_published_models_shapes_gets_the_artifacts_k_without_cost_as(tmp_path, tiny_dirs):
    """A run without --k on a real checkpoint (its config has a shipped architecture's shapes) takes the artifact's K
    for that model, as a run priced at those shapes does; a proxy of the same class keeps the suite's default."""
    import json

    from conftest import spec
    from specter.models.architectures import load_architecture
    from specter.runs.execute import _k_setting
    from specter.systems import get_system

    phi = tmp_path / "phi-3.5-moe-instruct"
    phi.mkdir()
    (phi / "config.json").write_text(json.dumps(load_architecture("phi-3.5-moe").config))
    request = dict(system="specter", dataset="code", hardware="a100-40gb-pcie4", out=str(tmp_path / "x.jsonl"),
                   resident_per_layer=2)
    k, why = _k_setting(spec(model=str(phi), **request), get_system("specter"))
    assert k.fixed == 16 and "the artifact's K for phi-3.5-moe" in why
    k, why = _k_setting(spec(model=tiny_dirs["phimoe"], **request), get_system("specter"))
    assert k.fixed == 8 and "the suite's default K" in why
    k, why = _k_setting(spec(model=tiny_dirs["phimoe"], cost_as="phi-3.5-moe", **request), get_system("specter"))
    assert k.fixed == 16
