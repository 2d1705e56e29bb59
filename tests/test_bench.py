"""Speed of the suite itself (pytest-benchmark; goals are read from the figures, never asserted as timings).

Run with `python -m pytest tests/test_bench.py --benchmark-enable`: a live Specter run of 128 new tokens on a tiny model
(the numerics computed), the same prompts replayed by a second system (scheduling only), and the scheduler's own time
per committed token. With benchmarks disabled (the default) each runs once as a plain test. On the default model, as
the workflow builds it: `SPECTER_BENCH_MODEL=results/models/smollm2-moe
SPECTER_BENCH_DRAFT=results/drafts/smollm2-moe/gptq-int4-g64 python -m pytest tests/test_bench.py --benchmark-enable`.
"""

from __future__ import annotations

import os

import pytest
import torch

from conftest import spec
from specter.quant.quantize import quantize_draft
from specter.runs import run
from specter.session import Session

NEW_TOKENS = 128


@pytest.fixture(scope="module")
def setup(tiny_dirs, tmp_path_factory):
    model, draft = os.environ.get("SPECTER_BENCH_MODEL"), os.environ.get("SPECTER_BENCH_DRAFT")
    if bool(model) != bool(draft):
        raise pytest.UsageError("set both SPECTER_BENCH_MODEL and SPECTER_BENCH_DRAFT, or neither (a tiny model)")
    if not model:
        model, draft = tiny_dirs["mixtral"], tmp_path_factory.mktemp("bench") / "draft"
        quantize_draft(model, draft, method="rtn", bits=4, group_size=32)
    torch.set_num_threads(2)

    def request(system, out):
        return spec(system=system, model=model, draft=str(draft), dataset="code", hardware="a100-40gb-pcie4",
                    out=str(out), max_new_tokens=NEW_TOKENS, resident_per_layer=2, k=8)

    return request


def test_bench_live_specter_run(benchmark, setup, tmp_path):
    def live():
        return run(setup("specter", tmp_path / "live.jsonl"), Session(), progress=False)

    records = benchmark.pedantic(live, rounds=3, iterations=1)
    assert len(records) == 5 and all(len(r.output_token_ids) == NEW_TOKENS for r in records)


def test_bench_replayed_second_system(benchmark, setup, tmp_path):
    session = Session()
    run(setup("specter", tmp_path / "warm.jsonl"), session, progress=False)  # the numerics, once
    service = session.service(setup("specter", "").model)
    calls = service.forward_calls
    records = benchmark.pedantic(lambda: run(setup("on-demand", tmp_path / "replay.jsonl"), session, progress=False),
                                 rounds=5, iterations=1)
    assert service.forward_calls == calls  # nothing recomputed: replay is scheduling only
    benchmark.extra_info["committed_tokens"] = sum(len(r.output_token_ids) for r in records)


def test_bench_scheduler_per_token(benchmark, setup, tmp_path):
    session = Session()
    run(setup("specter", tmp_path / "warm.jsonl"), session, progress=False)
    records = benchmark.pedantic(lambda: run(setup("specter", tmp_path / "again.jsonl"), session, progress=False),
                                 rounds=5, iterations=1)
    tokens = sum(len(r.output_token_ids) for r in records)
    benchmark.extra_info["committed_tokens"] = tokens
    if benchmark.stats:  # with --benchmark-enable: the scheduler's time per committed token
        benchmark.extra_info["scheduler_ms_per_token"] = benchmark.stats.stats.median * 1e3 / tokens


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-row"])
def test_bench_draft_windows_per_committed_token(benchmark, setup, batched):
    """Recording the draft windows of a K = 8 run over 5 prompts: every prompt's windows one batch per draft step
    (`ForwardService.walk` over all paths, as runs record them) against one row at a time (each path walked alone).
    The figure to read is `windows_ms_per_token`: the recording's time per committed token."""
    from specter.numerics.forward import WindowPath

    request = setup("specter", "")
    session = Session()
    prompts = session.calibration_prompts(request.model, "code", 5, 16)
    _, _, service = session.numerics(request.model, request.draft, (), "float32")
    traces = [service.trace(p, NEW_TOKENS) for p in prompts]

    def record():
        for trace in traces:
            trace.windows.clear()
        paths = [WindowPath(trace, NEW_TOKENS, lambda committed: 8) for trace in traces]
        if batched:
            service.walk(paths)
        else:
            for path in paths:
                service.walk([path])
        return paths

    paths = benchmark.pedantic(record, rounds=3, iterations=1)
    assert all(p.done for p in paths)
    tokens = len(traces) * NEW_TOKENS
    benchmark.extra_info["committed_tokens"] = tokens
    if benchmark.stats:
        benchmark.extra_info["windows_ms_per_token"] = benchmark.stats.stats.median * 1e3 / tokens


def test_bench_live_on_demand_all_resident_beside_the_stock_decode(benchmark, setup, tmp_path):
    """The runtime's own host work: live on-demand with every expert resident (nothing to copy: what it adds is the
    executor's and the offloaded modules' work) against the stock transformers model's greedy decode of the same
    prompt, tokens, dtype and one thread. The benchmark times the live decode; `extra_info` carries the stock
    decode's median over as many rounds, measured right after, and the ratio (the goal: at most 1.15)."""
    import statistics
    import time

    from specter.runs import live as on_live
    from specter.runs.execute import prepare
    from specter.systems import schedule

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        request = setup("on-demand", tmp_path / "x.jsonl")
        session = Session()
        experts = session.numerics(request.model, None, (), "float32")[0].moe_layers[0].num_experts
        p = prepare(spec(**{**request.as_dict(), "resident_per_layer": experts, "engine": "live", "repeats": 1,
                            "num_prompts": 1, "dtype": "float32"}), session)
        p.device = on_live.runtime(p, session)
        prompt = p.prompts[0]
        on_live.live_run(p, prompt, p.config, schedule)  # warm-up
        live = benchmark.pedantic(lambda: on_live.live_run(p, prompt, p.config, schedule)[0], rounds=5, iterations=1)
        ids = torch.tensor([prompt])
        pad = p.target.config.pad_token_id or 0
        with torch.no_grad():
            p.target.model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=pad,
                                    eos_token_id=None)  # warm-up
            stock = []
            for _ in range(5):
                start = time.perf_counter()
                out = p.target.model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=pad,
                                               eos_token_id=None)
                stock.append(time.perf_counter() - start)
        assert out[0, len(prompt):].tolist() == live.tokens  # the same decode, so the times compare
        if benchmark.stats is not None:
            benchmark.extra_info["stock_decode_median_s"] = statistics.median(stock)
            benchmark.extra_info["live_over_stock"] = benchmark.stats.stats.median / statistics.median(stock)
    finally:
        torch.set_num_threads(threads)
