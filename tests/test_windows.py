"""Draft windows computed in batches: the same greedy draft as one row at a time, up to float noise; a run's
windows computed before it schedules (`ForwardService.walk`), so scheduling runs no forward; the same requests, the
same bits."""

from __future__ import annotations

import pytest

from conftest import EQUALITY_ARCHS, spec
from specter.numerics.forward import ForwardService, WindowPath
from specter.numerics.passes import _crop, _forward
from specter.runs import run
from specter.session import Session

TOKENS = 20


def _service(session: Session, model: str, draft: str) -> ForwardService:
    _, _, service = session.numerics(model, draft, (), "float32")
    return service


def _prompts(session: Session, model: str, n: int = 3) -> list[list[int]]:
    return session.calibration_prompts(model, "code", n, 12)


def _one_row(service: ForwardService, trace, t: int, k: int):
    """The window as the draft computes it one row at a time: K one-token forwards after the target's cropped KV,
    then the target's pass over the K + 1 tokens."""
    cache = _crop(trace._cache, t - 1)
    token, tokens, routes = trace.seq[t - 1], [], []
    for _ in range(k):
        logits, r, cache = _forward(service.draft, [token], cache)
        token = int(logits[-1].argmax())
        tokens.append(token)
        routes.append(r[0])
    logits, verify_routes, _ = _forward(service.target, [trace.seq[t - 1], *tokens], _crop(trace._cache, t - 1))
    return tokens, routes, logits.argmax(-1).tolist(), verify_routes


@pytest.mark.parametrize("arch", EQUALITY_ARCHS)
def test_batched_windows_are_the_one_row_draft(arch, tiny_dirs, rtn_drafts):
    session = Session()
    service = _service(session, tiny_dirs[arch], rtn_drafts[arch])
    traces = [service.trace(p, TOKENS) for p in _prompts(session, tiny_dirs[arch])]
    # rows of two traces at different rebase points and K (the batch left-pads them and drops the shorter K's rows)
    requests = [(traces[0], 13, 6), (traces[1], 20, 3), (traces[2], 16, 6), (traces[0], 25, 1)]
    windows = service.windows(requests)
    same = total = 0
    for (trace, t, k), w in zip(requests, windows):
        tokens, routes, argmax, verify_routes = _one_row(service, trace, t, k)
        assert (w.start, w.kmax) == (t, k)
        assert w.draft_tokens == tokens and w.verify_argmax == argmax, (arch, t, k)
        pairs = list(zip(w.draft_routes, routes)) + list(zip(w.verify_routes, verify_routes))
        same += sum(a == b for a, b in pairs)
        total += len(pairs)
    assert same / total >= 0.9, f"{arch}: {same} of {total} tokens routed alike"  # a near-tie may flip a route


def test_the_same_requests_give_the_same_bits(tiny_dirs, rtn_drafts):
    def windows():
        session = Session()
        service = _service(session, tiny_dirs["mixtral"], rtn_drafts["mixtral"])
        traces = [service.trace(p, TOKENS) for p in _prompts(session, tiny_dirs["mixtral"])]
        paths = [WindowPath(trace, TOKENS, lambda committed: 4) for trace in traces]
        service.walk(paths)
        return [sorted((key, vars(w)) for key, w in trace.windows.items()) for trace in traces]

    assert windows() == windows()


def test_a_window_extended_in_a_batch_keeps_serving_smaller_k(tiny_dirs, rtn_drafts):
    session = Session()
    service = _service(session, tiny_dirs["qwen2_moe"], rtn_drafts["qwen2_moe"])
    trace = service.trace(_prompts(session, tiny_dirs["qwen2_moe"], 1)[0], TOKENS)
    small = service.window(trace, 14, 2)
    large = service.window(trace, 14, 5)  # recomputed at the larger K, memoized in its place
    assert large.kmax == 5 and service.window(trace, 14, 2) is large
    assert large.draft_tokens[:2] == small.draft_tokens


def _run(tiny_dirs, rtn_drafts, system, out, session, **over):
    settings = dict(system=system, model=tiny_dirs["olmoe"], draft=rtn_drafts["olmoe"], dataset="code",
                    hardware="a100-40gb-pcie4", out=str(out), num_prompts=3, prefix_tokens=12, max_new_tokens=TOKENS,
                    resident_per_layer=2)
    return run(spec(**{**settings, **over}), session, progress=False)


@pytest.mark.parametrize(("system", "k"), [("specter", "4"), ("specmoeoff", None), ("specter", "online"),
                                           ("specter", "profile"), ("specter", "auto")])
def test_a_walked_run_schedules_without_a_forward(system, k, tiny_dirs, rtn_drafts, tmp_path, monkeypatch):
    """Every window a run visits was computed before its first prompt was scheduled: scheduling itself (and every
    governor's scheduling of its calibration prompts) runs no model forward."""
    import importlib

    execute = importlib.import_module("specter.runs.execute")  # the module (the package exports a function of its name)
    session = Session()
    scheduled = []
    original = execute.schedule

    def counting(system_, engine, work, service, *args, **kwargs):
        before = service.forward_calls
        out = original(system_, engine, work, service, *args, **kwargs)
        scheduled.append(service.forward_calls - before)
        return out

    monkeypatch.setattr(execute, "schedule", counting)
    import specter.speculation.governor as governor

    profiled = []
    choose = governor.choose_k_profile

    def counting_profile(run_with_k, tokens):
        service = session.service(tiny_dirs["olmoe"])

        def counted(k):
            before = service.forward_calls
            out = run_with_k(k)
            profiled.append(service.forward_calls - before)
            return out

        return choose(counted, tokens)

    monkeypatch.setattr(governor, "choose_k_profile", counting_profile)
    records = _run(tiny_dirs, rtn_drafts, system, tmp_path / "r.jsonl", session, **({"k": k} if k else {}))
    assert scheduled == [0, 0, 0]
    assert all(n == 0 for n in profiled) and (k != "profile" or len(profiled) > 1)
    assert records[0].extra["live_forwards"] > 0 and all(r.extra["live_forwards"] == 0 for r in records[1:])
    replay = _run(tiny_dirs, rtn_drafts, system, tmp_path / "again.jsonl", session, **({"k": k} if k else {}))
    assert all(r.extra["live_forwards"] == 0 for r in replay)
    assert [r.output_token_ids for r in replay] == [r.output_token_ids for r in records]
