"""The shared decode loops: one target pass per token (every non-speculative system), and draft-then-verify cycles
(every speculative system, which differ only in their planner, forecast and draft window).

A speculative cycle: the draft proposes K tokens, one draft step each (the host reads each proposal: a
synchronization); the system's planner sees the draft's routing after every step and may prefetch; the target then
verifies the K + 1 tokens in one pass, and the accepted proposals plus the target's own next token commit when the
verification's logits are ready. Greedy runs replay the memoized windows; sampling runs (temperature > 0) draw live.

On the live engine (`Executor.live`) the model itself runs through the executor: each pass is given its input tokens,
and its tokens and routes are what that pass computed. The prompt's trace then starts empty and the loops fill it as
they commit (the prefill's routes, each step's routes and tokens), so a hook reads the same fields either way; a
window is filled step by step as the draft proposes, and the verification's argmax decides the acceptance.
"""

from __future__ import annotations

from collections import Counter

import torch

from specter.errors import SpecterError
from specter.numerics.forward import DraftWindow, disagreement_cause
from specter.offload.hooks import Forecast
from specter.speculation.lookahead import PlannerState
from specter.systems.base import PredictionCounts, PromptContext, PromptResult


def decode_one_by_one(ctx: PromptContext, result: PromptResult) -> PromptResult:
    """Decode the remaining tokens one target pass each, committing each when its logits are ready; every hook's
    `before_step(j)` runs before decode step j (1-based) is scheduled."""
    trace, ex = ctx.trace, ctx.executor
    prompt_len = len(trace.prompt)
    for j in range(1, ctx.config.max_new_tokens):
        for hook in ex.hooks:
            hook.before_step(j)
        # input seq[P + j - 1] after P + j - 1 cached tokens
        if ex.live:
            end = ex.target_pass(None, context=prompt_len + j - 1, tag=f"d{j}", inputs=[trace.tokens[j - 1]])
            trace.step_routes.append(ex.last_pass.routes[0])
            trace.tokens.append(ex.last_pass.argmax[0])
        else:
            end = ex.target_pass([trace.step_routes[j - 1]], context=prompt_len + j - 1, tag=f"d{j}")
        ctx.engine.synchronize(end)  # the host reads the next token
        result.tokens.append(trace.tokens[j])
        result.commit_times.append(ctx.engine.event_time(end))
    if ex.live:
        result.decode_routes = trace.step_routes
    return result


def decode_speculatively(system, ctx: PromptContext, result: PromptResult) -> PromptResult:
    """Draft-and-verify cycles after the prefill `result` until `max_new_tokens` have committed."""
    trace, cfg, engine, ex = ctx.trace, ctx.config, ctx.engine, ctx.executor
    fixed = system.window(cfg.k)
    if fixed is None or fixed < 1:
        raise ValueError(f"{system.name} needs a draft window K >= 1, got {fixed}")
    result.k = fixed
    state = PlannerState()
    t = len(trace.prompt) + 1  # committed tokens
    session = None
    if cfg.temperature > 0:  # live rejection sampling; the first token equals the trace's (same seed, same draw)
        session = ctx.service.sampling_session(trace.prompt, cfg.temperature, cfg.seed)
    if session is not None or ex.live:
        result.decode_routes = []
    cycle = 0
    while len(result.tokens) < cfg.max_new_tokens:
        cycle += 1
        k = ctx.online.next_k(len(result.tokens)) if ctx.online is not None else fixed
        result.ks.append(k)
        if ex.live:
            window = DraftWindow(t, [], [], [], [])
        elif session is None:
            window = ctx.service.window(trace, t, k, own_kv=system.separate_draft)
            accepted = window.accepted(k)
            new_tokens = window.draft_tokens[:accepted] + [window.verify_argmax[accepted]]
        else:
            window, accepted, new_tokens = session.cycle(k)
            result.decode_routes += window.verify_routes[: accepted + 1]
        planner = system.planner(ctx, k, state)
        counts = _draft(system, ctx, planner, window, t, k, f"c{cycle}")
        forecast = system.forecast(ctx, window, k)
        planner.before_verify(counts)
        if ex.live:
            end = ex.target_pass(None, context=t - 1, tag=f"c{cycle}.verify",
                                 inputs=[result.tokens[-1], *window.draft_tokens])
            window.verify_argmax, window.verify_routes = ex.last_pass.argmax, ex.last_pass.routes
            accepted = window.accepted(k)
            new_tokens = window.draft_tokens[:accepted] + [window.verify_argmax[accepted]]
            result.decode_routes += window.verify_routes[: accepted + 1]
            trace.windows[(ctx.service.window_key(system.separate_draft), t)] = window  # its twin's, as recorded
        else:
            end = ex.target_pass(window.verify_routes[: k + 1], context=t - 1, tag=f"c{cycle}.verify")
        verify = window.verify_routes[: k + 1]
        engine.synchronize(end)
        state.observe_demand(ex)
        _commit(ctx, result, new_tokens, accepted, k, t, engine.event_time(end), check=session is None and not ex.live)
        if ex.live:
            trace.tokens[:] = result.tokens
        system.after_verify(ctx, t - 1, accepted + 1, f"c{cycle}")
        if ctx.online is not None:
            ctx.online.observe(accepted, accepted + 1 if accepted < k else k)
        placed = {layer: set(experts) for layer, experts in ctx.cache.protected.items()}  # what prefetch put there
        _book_prediction(ctx, result, forecast, verify, placed, k)
        ctx.cache.unprotect_all()
        t += accepted + 1
    if ex.live:  # each committed token's decode routes, as a recorded trace holds them
        trace.step_routes[:] = result.decode_routes[: cfg.max_new_tokens - 1]
    if ctx.online is not None:  # the record's K: the median window chosen (every cycle's is in extra)
        result.k = sorted(result.ks)[len(result.ks) // 2]
    return result


def _draft(system, ctx: PromptContext, planner, window, t: int, k: int, tag: str) -> dict[int, Counter]:
    """K draft steps, the planner told after each of what the system forecasts from the steps so far; returns the
    window's forecast counts per (layer, expert). Live, each step runs the draft on the previous proposal (the first
    on the last committed token) and adds its proposal and routes to `window`; a draft with a KV cache of its own
    (`separate_draft`) reads, in its first step, the committed tokens its cache does not hold yet (after a window
    accepted whole, its last proposal's position, which it never wrote)."""
    engine, ex = ctx.engine, ctx.executor
    counts = {layer: Counter() for layer in ctx.work.moe_layers}
    forecast = None if ex.live else system.forecast(ctx, window, k)
    ex.hooks.append(planner)  # a planner may act after each draft layer (SP-MoE), never inside the verification
    previous = engine.now()
    for i in range(1, k + 1):  # draft step i reads the token at position t - 2 + i
        if ex.live:
            token = window.draft_tokens[-1] if window.draft_tokens else ctx.trace.tokens[-1]
            context, inputs = t - 2 + i, [token]
            if i == 1 and system.separate_draft:  # its own KV lacks the committed positions it did not draft
                held = ex.device.draft_held(t - 1)
                context, inputs = held, (ctx.trace.prompt + ctx.trace.tokens)[held:t]
            end = ex.draft_step(None, context=context, expert_bytes=ctx.config.draft_expert_bytes,
                                tag=f"{tag}.draft{i}", inputs=inputs)
            window.draft_tokens.append(ex.last_pass.argmax[-1])
            window.draft_routes.append(ex.last_pass.routes[-1])
            step = system.forecast(ctx, window, i)[i - 1]  # what the system forecasts from the steps so far
        else:
            end = ex.draft_step(window.draft_routes[i - 1], context=t - 2 + i,
                                expert_bytes=ctx.config.draft_expert_bytes, tag=f"{tag}.draft{i}")
            step = forecast[i - 1]
        engine.synchronize(end)  # the host reads the proposal
        ex.routed = Forecast(end, f"{tag}.draft{i}.head")  # the step's routing, every layer of it, is known now
        for layer in counts:
            counts[layer].update(step[layer])
        now = engine.event_time(end)
        planner.after_step(i, counts, now - previous)
        previous = now
    ex.hooks.remove(planner)
    return counts


def _below_float32(ctx: PromptContext) -> bool:
    """Whether the run's numerics compute at a precision below float32 (bfloat16, float16)."""
    target = getattr(ctx.service, "target", None)
    param = next(target.model.parameters(), None) if target is not None else None
    return param is not None and param.dtype in (torch.bfloat16, torch.float16)


def _commit(ctx: PromptContext, result: PromptResult, new_tokens: list[int], accepted: int, k: int, t: int,
            done: float, check: bool) -> None:
    """Commit a verified window's tokens at `done`, and count its proposals."""
    trace = ctx.trace
    new_tokens = new_tokens[: ctx.config.max_new_tokens - len(result.tokens)]
    expected = trace.tokens[len(result.tokens) : len(result.tokens) + len(new_tokens)]
    if check and new_tokens != expected:
        if trace.origin is None and _below_float32(ctx):  # a near-tie that the lower precision flipped: the device
            # computes the verification batched, the recorded decode one token at a time; the run keeps the
            # recorded tokens (so the recorded windows after it still apply) and the record says where
            result.near_ties.append({"position": t, "verified": list(new_tokens), "recorded": list(expected)})
            new_tokens = expected
        else:
            raise SpecterError(f"verification at position {t} disagreed with the target's incremental greedy decode "
                               f"({new_tokens} vs {expected})" + disagreement_cause(trace))
    result.tokens += new_tokens
    result.commit_times += [done] * len(new_tokens)
    result.proposed += k
    result.checked += accepted + 1 if accepted < k else k
    result.accepted += accepted
    result.accepted_lengths[accepted] += 1


def _book_prediction(ctx: PromptContext, result: PromptResult, forecast, verify, placed: dict, k: int) -> None:
    """Expert prediction per (layer, lookahead distance), and the window recall: of the experts the verification
    used, the share the window's prefetch had placed on the device (copied, or found resident and protected), the
    same for every system, whatever its planner meant to copy; and what it placed (the prefetch's precision's
    denominator)."""
    for d in range(1, k + 1):  # draft step d and verification input d - 1 read the same token
        for layer in ctx.work.moe_layers:
            predicted, actual = set(forecast[d - 1][layer]), set(verify[d - 1][layer])
            c = result.prediction.setdefault((layer, d), PredictionCounts())
            c.tp += len(predicted & actual)
            c.predicted += len(predicted)
            c.actual += len(actual)
    for layer in ctx.work.moe_layers:
        used = {e for r in verify for e in r[layer]}
        result.window_needed += len(used)
        result.window_hits += len(used & placed.get(layer, set()))
        result.window_placed += len(placed.get(layer, set()))
    result.window_layers += len(ctx.work.moe_layers)
