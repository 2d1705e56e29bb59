"""The runtime: lossless greedy outputs, rejection sampling's distribution, determinism, bounds, replay, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import EQUALITY_ARCHS, spec
from specter.models import load_moe_model
from specter.numerics.sampling import SamplingSession, probabilities, rejection_sample
from specter.runs import run
from specter.session import Session

SYSTEMS = ("resident", "on-demand", "specter")


def _request(tiny_dirs, rtn_drafts, arch, system, out, **over):
    base = dict(system=system, model=tiny_dirs[arch], draft=rtn_drafts[arch], dataset="code",
                hardware="a100-40gb-pcie4",
                out=str(out), num_prompts=5, prefix_tokens=16, max_new_tokens=24, resident_per_layer=2, k=4,
)
    base.update(over)
    return spec(**base)


@pytest.mark.parametrize("arch", EQUALITY_ARCHS)
def test_greedy_outputs_equal_transformers_generate(arch, tiny_dirs, rtn_drafts, tmp_path):
    target = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
    outputs = {}
    for system in SYSTEMS:
        records = run(_request(tiny_dirs, rtn_drafts, arch, system, tmp_path / f"{system}.jsonl"), progress=False)
        outputs[system] = [r.output_token_ids for r in records]
        for r in records:
            assert r.tpot_ms >= r.lower_bound_tpot_ms > 0, (system, r.tpot_ms, r.lower_bound_tpot_ms)
            assert r.simulated and r.hardware == "a100-40gb-pcie4"
    prompts = [r.prompt_token_ids for r in records]
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            # runs commit exactly max_new_tokens (no stop at end-of-sequence, as the artifact's protocol)
            ref = target.model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                                        pad_token_id=target.config.pad_token_id)[0, len(prompt):].tolist()
        for system in SYSTEMS:
            assert outputs[system][i] == ref, f"{arch} {system} prompt {i}"


def test_identical_simulated_runs_write_identical_records(tiny_dirs, rtn_drafts, tmp_path):
    a = run(_request(tiny_dirs, rtn_drafts, "olmoe", "specter", tmp_path / "a.jsonl"), Session(), progress=False)
    b = run(_request(tiny_dirs, rtn_drafts, "olmoe", "specter", tmp_path / "b.jsonl"), Session(), progress=False)
    strip = lambda r: {k: v for k, v in r.as_dict().items() if k not in ("wall_s", "config")}  # noqa: E731
    assert [strip(r) for r in a] == [strip(r) for r in b]
    assert [r.config | {"out": None} for r in a] == [r.config | {"out": None} for r in b]


def test_replayed_records_equal_live_ones(tiny_dirs, rtn_drafts, tmp_path):
    live = run(_request(tiny_dirs, rtn_drafts, "olmoe", "specter", tmp_path / "live.jsonl", k=3), Session(),
               progress=False)
    session = Session()
    # another budget and hardware: different schedules, the same numerics, so this run fills the memo for the replay
    run(_request(tiny_dirs, rtn_drafts, "olmoe", "specter", tmp_path / "warm.jsonl", k=3, resident_per_layer=5,
                 hardware="t4-pcie3"), session, progress=False)
    service = session.service(tiny_dirs["olmoe"])
    calls = service.forward_calls
    replay = run(_request(tiny_dirs, rtn_drafts, "olmoe", "specter", tmp_path / "replay.jsonl", k=3), session,
                 progress=False)
    assert all(r.extra["live_forwards"] == 0 for r in replay) and any(r.extra["live_forwards"] for r in live)
    strip = lambda r: {k: v for k, v in r.as_dict().items() if k not in ("wall_s", "config", "extra")}  # noqa: E731
    assert [strip(r) for r in replay] == [strip(r) for r in live]
    assert service.forward_calls == calls, "replay ran the model again"


def test_specter_records_speculation_metrics(tiny_dirs, rtn_drafts, tmp_path):
    (r, *_) = run(_request(tiny_dirs, rtn_drafts, "mixtral", "specter", tmp_path / "s.jsonl", k=4), progress=False)
    assert 0 <= r.acceptance_rate <= 1 and 0 <= r.window_utilization <= r.acceptance_rate
    assert sum(r.accepted_length_histogram.values()) >= 1
    distances = {p["distance"] for p in r.expert_prediction}
    assert distances == {1, 2, 3, 4}
    assert 0 <= r.window_recall <= 1
    assert r.h2d_bytes_prefetch > 0


def test_rejection_sampling_keeps_the_target_distribution():
    """Unit level: the committed token after one proposal is distributed as p, whatever q is (chi-square)."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.05, 0.4, 0.1, 0.25, 0.2], [0.2] * 5], dtype=torch.float64)
    q = torch.tensor([[0.3, 0.1, 0.3, 0.1, 0.2]], dtype=torch.float64)
    n = 20000
    counts = torch.zeros(5)
    for _ in range(n):
        d = int(torch.multinomial(q[0].float(), 1, generator=g))
        accepted, token = rejection_sample(p, q, [d], g)
        counts[d if accepted else token] += 1
    assert _chi2_p(counts, p[0] * n) > 0.01


def _chi2_p(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """p-value of Pearson's chi-square, cells with expected count < 5 merged into one."""
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]]) if small.any() else observed
    exp = torch.cat([expected[~small], expected[small].sum()[None]]) if small.any() else expected
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_speculative_sampling_matches_target_sampling_on_a_model(tiny_dirs, rtn_drafts):
    """End to end on a tiny model: the second generated token, over many seeds, follows the target's own marginal."""
    from specter.quant.draft import load_draft

    target = load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32)
    draft = load_draft(target, rtn_drafts["mixtral"])
    prompt, temperature = [104, 101, 108, 108, 111], 1.0
    with torch.no_grad():
        p1 = probabilities(target.model(torch.tensor([prompt])).logits[0, -1], temperature)  # [V]
        vocab = p1.numel()
        batch = torch.tensor([prompt + [x] for x in range(vocab)])
        p2 = probabilities(target.model(batch).logits[:, -1], temperature)  # [V, V]: p(y | prompt, x)
    marginal = (p1[:, None] * p2).sum(0)
    n = 1500
    counts = torch.zeros(vocab)
    for seed in range(n):
        session = SamplingSession(target, draft.moe, prompt, temperature, seed)
        _, _, committed = session.cycle(2)
        counts[committed[0]] += 1
    assert _chi2_p(counts, marginal.float() * n) > 0.01


@pytest.mark.parametrize("arch", EQUALITY_ARCHS)
def test_sampled_decodes_computed_together_commit_what_each_computes_alone(arch, tiny_dirs, rtn_drafts):
    """Prompts of different lengths, the target alone and speculative sessions of two K: in lockstep batches each
    prompt draws what it draws alone (its own generator, in the same order; only the logits' last bits differ), and
    the sessions' KV grows by exactly the accepted inputs, as one row's does (sliding-window layers included)."""
    from specter.numerics.forward import ForwardService
    from specter.numerics.sampling import cycle_together, decode_together
    from specter.quant.draft import load_draft

    target = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
    draft = load_draft(target, rtn_drafts[arch])
    service = ForwardService(target, draft.moe)
    prompts = [[104, 101, 108, 108, 111], [40, 41, 42, 43, 44, 45, 46, 47, 48], [7, 8, 9]]
    decodes = [(p, 9 + i, 1.0, 30 + i) for i, p in enumerate(prompts)]
    together = decode_together(service, decodes)
    for (prompt, tokens, temperature, seed), trace in zip(decodes, together):
        alone = ForwardService(target).sampled_trace(prompt, tokens, temperature, seed)
        assert (trace.tokens, trace.step_routes, trace.prefill_routes) == \
            (alone.tokens, alone.step_routes, alone.prefill_routes)
    requests = [(p, 12, 0.8, 50 + i, 2 + i % 2) for i, p in enumerate(prompts)]
    for (prompt, tokens, temperature, seed, k), cycles in zip(requests, cycle_together(service, requests)):
        session = SamplingSession(target, draft.moe, prompt, temperature, seed)
        committed = 1
        for kk, window, accepted, new in cycles:
            assert kk == k
            alone, alone_accepted, alone_new = session.cycle(k)
            assert (accepted, new, window.draft_tokens, window.verify_argmax, window.verify_routes) == \
                (alone_accepted, alone_new, alone.draft_tokens, alone.verify_argmax, alone.verify_routes)
            committed += len(new)
        assert committed >= tokens


def _cli_run(tiny_dirs, rtn_drafts, tmp_path, *extra, system="specter", arch="mixtral", draft=None):
    out = tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "specter", "run", "--system", system, "--model", tiny_dirs[arch], "--dataset", "code",
            "--hardware", "a100-40gb-pcie4", "--resident-per-layer", "2", "--max-new-tokens", "8", "--out", str(out),
            "--draft", draft or rtn_drafts[arch], *extra]
    return subprocess.run(args, capture_output=True, text=True), out


@pytest.mark.parametrize(
    "case, extra, message",
    [
        ("unknown system", ["--system", "warp-drive", "--k", "4"], "--system: invalid choice: 'warp-drive'"),
        ("K < 1", ["--k", "0"], "--k must be at least 1"),
        ("empty prompt file", ["--k", "4", "--dataset", "{empty}"], "is empty"),
        ("missing field", ["--k", "4", "--dataset", "{jsonl}", "--field", "query"], "has no field 'query'"),
        ("draft of another model", ["--k", "4", "--draft", "{olmoe_draft}"], "was made from"),
        ("budget too small", ["--k", "4", "--device-memory-gb", "0.000001"], "cannot hold the resident part"),
    ],
)
def test_bad_run_input_is_one_line_exit_2_and_no_output(case, extra, message, tiny_dirs, rtn_drafts, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text(json.dumps({"question": "What is 2 + 2?"}) + "\n")
    extra = [e.format(empty=empty, jsonl=jsonl, olmoe_draft=rtn_drafts["olmoe"]) for e in extra]
    if "--system" in extra:
        i = extra.index("--system")
        system, extra = extra[i + 1], extra[:i] + extra[i + 2:]
    else:
        system = "specter"
    if "--device-memory-gb" in extra:  # replaces the slot budget
        proc, out = _cli_run(tiny_dirs, rtn_drafts, tmp_path, *extra, system=system)
        args = proc.args
        k = args.index("--resident-per-layer")
        proc = subprocess.run(args[:k] + args[k + 2:], capture_output=True, text=True)
    else:
        proc, out = _cli_run(tiny_dirs, rtn_drafts, tmp_path, *extra, system=system)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("specter: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    assert not out.exists() and not list(tmp_path.glob(".out.jsonl.tmp*"))


def test_local_jsonl_dataset_runs(tiny_dirs, rtn_drafts, tmp_path):
    data = tmp_path / "gsm.jsonl"
    data.write_text("".join(json.dumps({"question": q}) + "\n" for q in ["Tom has 3 apples.", "", "A train leaves."]))
    proc, out = _cli_run(tiny_dirs, rtn_drafts, tmp_path, "--k", "3", "--dataset", str(data), "--num-prompts", "2",
                         "--prefix-tokens", "3", system="on-demand")
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all(len(r["prompt_token_ids"]) == 3 for r in records)  # the empty question skipped
    proc, _ = _cli_run(tiny_dirs, rtn_drafts, tmp_path, "--k", "3", "--dataset", str(data), "--num-prompts", "2",
                       "--prefix-tokens", "64", system="on-demand")  # every input shorter: none of 64 tokens
    assert proc.returncode == 2 and "has no input of at least 64 tokens (2 shorter ones passed over)" in proc.stderr


def test_an_input_repeating_an_earlier_ones_prompt_tokens_is_passed_over(tmp_path):
    """A run's prompts are distinct: an input whose first --prefix-tokens tokens are an earlier one's is passed over
    (a run would measure one prompt twice, and its tables count it as two), and a set left too small says so."""
    from specter.data.prompts import load_prompts
    from specter.errors import SpecterError
    from specter.models.tiny import byte_tokenizer

    tok = byte_tokenizer()
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"question": q}) + "\n" for q in ["def f(x): 1", "def f(x): 2", "def g()"]))
    assert load_prompts(str(data), tok, num_prompts=2, prefix_tokens=7) == [
        tok("def f(x", add_special_tokens=False)["input_ids"], tok("def g()", add_special_tokens=False)["input_ids"]]
    with pytest.raises(SpecterError, match=r"has 2 distinct inputs of at least 7 tokens \(1 repeating an earlier "
                                           r"one's first 7 passed over\)"):
        load_prompts(str(data), tok, num_prompts=3, prefix_tokens=7)


def test_the_memory_plan_reserves_kv_for_the_window_each_system_runs(tiny_dirs, rtn_drafts, tmp_path):
    """One source of truth for K: the run's --k for Specter, SpecMoEOff's own k option for it, none for a system
    that does not speculate, whatever --k the run was given."""
    from specter.offload.work import ModelWork

    session = Session()
    kv_per_position = ModelWork.of(session.numerics(tiny_dirs["olmoe"])[0]).kv_bytes(1)
    positions = {}
    for system in ("on-demand", "specter", "specmoeoff"):
        (r, *_) = run(_request(tiny_dirs, rtn_drafts, "olmoe", system, tmp_path / f"{system}.jsonl", k=6,
                               num_prompts=1, max_new_tokens=8), session, progress=False)
        copies = 2 if system == "specmoeoff" else 1  # its draft keeps its own KV
        positions[system] = r.config["memory"]["kv_bytes"] // (copies * kv_per_position)
    assert positions == {"on-demand": 16 + 8, "specter": 16 + 8 + 6, "specmoeoff": 16 + 8 + 3}


def test_bfloat16_numerics_commit_fp32s_tokens_up_to_a_near_tie(tiny_dirs, rtn_drafts, tmp_path):
    """The same tiny model in bfloat16 and float32 on the CPU. Within each precision Specter stays lossless (its
    verification checks every committed token against that precision's own greedy decode). Across them the tokens
    agree up to the first position where float32's top two logits are closer than bfloat16 resolves (8 bits of
    mantissa: about 0.4% of the logit), and may differ after it: that near-tie is where they legitimately part."""
    records = {dtype: run(_request(tiny_dirs, rtn_drafts, "mixtral", "specter", tmp_path / f"{dtype}.jsonl",
                                   num_prompts=3, dtype=dtype), Session(), progress=False)
               for dtype in ("float32", "bfloat16")}
    for dtype, rs in records.items():
        assert all(r.config["dtype"] == dtype and r.config["numerics"]["device"] == "cpu" for r in rs)  # and where
    target = load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32)
    parted = 0
    for a, b in zip(records["float32"], records["bfloat16"]):
        assert a.prompt_token_ids == b.prompt_token_ids
        first = next((j for j, (x, y) in enumerate(zip(a.output_token_ids, b.output_token_ids)) if x != y), None)
        if first is None:
            continue
        parted += 1
        ids = torch.tensor([a.prompt_token_ids + a.output_token_ids[:first]])
        with torch.no_grad():
            logits = target.model(ids).logits[0, -1]
        mine, theirs = a.output_token_ids[first], b.output_token_ids[first]
        assert int(logits.argmax()) == mine
        margin = float(logits[mine] - logits[theirs])
        assert 0 <= margin < 0.01 * float(logits[mine].abs()), (first, margin, float(logits[mine]))
    print(f"bfloat16 parted from float32 in {parted} of {len(records['float32'])} prompts, each at a near-tie")


def test_a_memo_of_another_precision_is_refused(tiny_dirs, rtn_drafts, tmp_path):
    from specter.errors import SpecterError
    from specter.runs import sweep

    memo = tmp_path / "fp32.json.gz"
    sweep([_request(tiny_dirs, rtn_drafts, "olmoe", "on-demand", "", num_prompts=1, max_new_tokens=4)], None, memo,
          Session(), progress=False)
    with pytest.raises(SpecterError, match=r"recorded in float32, and this run computes in bfloat16; record it again"):
        run(_request(tiny_dirs, rtn_drafts, "olmoe", "on-demand", tmp_path / "b.jsonl", num_prompts=1,
                     max_new_tokens=4, dtype="bfloat16", memo=(str(memo),)), Session(), progress=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_verification_that_flips_a_near_tie_is_recorded_below_float32_and_refused_at_it(dtype):
    """At bfloat16 a verification (one batched pass) may pick another token than the incremental decode it replays:
    the run records where and commits the recorded tokens; at float32 the same disagreement is a bug and stops it."""
    from types import SimpleNamespace

    from specter.errors import SpecterError
    from specter.numerics.forward import PromptTrace
    from specter.systems.base import PromptResult
    from specter.systems.decode import _commit

    trace = PromptTrace([1, 2, 3], [7, 8, 9, 10], [], [])
    ctx = SimpleNamespace(trace=trace, config=SimpleNamespace(max_new_tokens=4),
                          service=SimpleNamespace(target=SimpleNamespace(model=torch.nn.Linear(2, 2).to(dtype))))
    result = PromptResult(tokens=[7], commit_times=[0.0], stats=None, executor=None)
    if dtype == torch.float32:
        with pytest.raises(SpecterError, match=r"disagreed with the target's incremental greedy decode \(\[8, 5\]"):
            _commit(ctx, result, [8, 5], 1, 2, 5, 1.0, check=True)
        return
    _commit(ctx, result, [8, 5], 1, 2, 5, 1.0, check=True)
    assert result.tokens == [7, 8, 9] and result.commit_times == [0.0, 1.0, 1.0]
    assert result.near_ties == [{"position": 5, "verified": [8, 5], "recorded": [8, 9]}]
    assert result.accepted == 1 and result.accepted_lengths[1] == 1  # the device's acceptance stands
