"""Specter (arXiv 2511.14102): speculative decoding with a quantized self-draft whose routing drives expert prefetch.

Each cycle: the draft (the target with INT4 experts, resident) proposes K tokens; its routing over the window, counted
per (layer, expert), plans which experts the verification will need, and the planner copies them in on the H2D stream
while the draft is still drafting. The target then verifies K+1 tokens in one pass, hot-first (resident and prefetched
experts compute at once, the rest stream in on demand); greedy acceptance commits the accepted proposals and the
target's own next token. Prefetched experts are protected from eviction until the verification ends.
"""

from __future__ import annotations

from collections import Counter

from specter.spec.lookahead import Planner, PlannerState
from specter.spec.sampling import SamplingSession
from specter.systems import PredictionCounts, PromptContext, PromptResult, System


class Specter(System):
    name = "specter"
    speculative = True
    options = {"serialize-demand": (bool, False, "ablation: a demand copy waits for the compute issued before it "
                                                 "(no hot-first overlap)")}
    serialize_demand = False  # the option's value; subclasses with their own options keep this default

    def forecast(self, ctx: PromptContext, window, k: int) -> list[dict[int, tuple[int, ...]]]:
        """The routes the prefetch plan counts, one per draft step: the draft's own (what Specter knows)."""
        return window.draft_routes[:k]

    def planner(self, ctx: PromptContext, k: int, state: PlannerState):
        """This window's prefetch planner (the lookahead analyzer's top-M plans, by `--prefetch` policy)."""
        return Planner(ctx.config.prefetch, k, ctx.executor, ctx.cache.slots_per_layer, state)

    def window_size(self, ctx: PromptContext) -> int | None:
        return ctx.config.k

    def run(self, ctx: PromptContext) -> PromptResult:
        result = self.prefill(ctx)
        trace, cfg, engine, ex = ctx.trace, ctx.config, ctx.engine, ctx.executor
        k = self.window_size(ctx)
        if k is None or k < 1:
            raise ValueError("Specter needs a window K >= 1")
        result.k = k
        ex.serialize_demand = self.serialize_demand
        state = PlannerState()
        prompt_len = len(trace.prompt)
        t = prompt_len + 1  # committed tokens
        cycle = 0
        session = None
        if cfg.temperature > 0:  # live rejection sampling; the first token equals the trace's (same seed, same draw)
            session = SamplingSession(ctx.service.target, ctx.service.draft, trace.prompt, cfg.temperature, cfg.seed)
            result.decode_routes = []
        while len(result.tokens) < cfg.max_new_tokens:
            cycle += 1
            if session is None:
                window = ctx.service.window(trace, t, k, own_kv=self.separate_draft)
                accepted = window.accepted(k)
                new_tokens = window.draft_tokens[:accepted] + [window.verify_argmax[accepted]]
            else:
                window, accepted, new_tokens = session.cycle(k)
                result.decode_routes += window.verify_routes[: accepted + 1]
            planner = self.planner(ctx, k, state)
            counts = {layer: Counter() for layer in ctx.work.moe_layers}
            forecast = self.forecast(ctx, window, k)
            previous = engine.now()
            for i in range(1, k + 1):  # draft step i reads the token at position t - 2 + i
                end = ex.draft_step(window.draft_routes[i - 1], context=t - 2 + i, expert_bytes=cfg.draft_expert_bytes,
                                    tag=f"c{cycle}.draft{i}")
                engine.synchronize(end)  # the host reads the proposal
                for layer in counts:
                    counts[layer].update(forecast[i - 1][layer])
                now = engine.event_time(end)
                planner.after_step(i, counts, now - previous)
                previous = now
            planner.before_verify(counts)
            verify = window.verify_routes[: k + 1]
            end = ex.target_pass(verify, context=t - 1, tag=f"c{cycle}.verify")
            engine.synchronize(end)
            done = engine.event_time(end)
            new_tokens = new_tokens[: cfg.max_new_tokens - len(result.tokens)]
            expected = trace.tokens[len(result.tokens) : len(result.tokens) + len(new_tokens)]
            if session is None and new_tokens != expected:
                raise RuntimeError(
                    f"verification at position {t} disagreed with the target's incremental greedy decode "
                    f"({new_tokens} vs {expected}): a near-tie flipped under float noise; run the model in float32"
                )
            result.tokens += new_tokens
            result.commit_times += [done] * len(new_tokens)
            result.proposed += k
            result.checked += accepted + 1 if accepted < k else k
            result.accepted += accepted
            result.accepted_lengths[accepted] += 1
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
                result.window_hits += len(used & set(planner.plan.get(layer, [])))
            result.window_layers += len(ctx.work.moe_layers)
            ctx.cache.unprotect_all()
            t += accepted + 1
        return result


class SpecterOracle(Specter):
    """Specter planning from the target's own recorded routes instead of the draft's (the `oracle` experiment).

    Draft step i's forecast is the route the target takes at verification input i - 1 (the same token), with a share
    `noise` of its expert identities replaced by other experts drawn uniformly (seeded by the run's seed and the window's
    start), which bounds what a better predictor could buy: noise 0 is a perfect one."""

    name = "specter-oracle"
    options = {**Specter.options, "noise": (float, 0.0, "share of the target's expert identities replaced at random")}

    def __init__(self, **options) -> None:
        super().__init__(**options)
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"noise={self.noise} must be between 0 and 1")

    def forecast(self, ctx: PromptContext, window, k: int) -> list[dict[int, tuple[int, ...]]]:
        import random

        rng = random.Random(ctx.config.seed * 1_000_003 + window.start)
        experts = range(ctx.work.experts_per_layer)
        out = []
        for routes in window.verify_routes[:k]:
            noisy = {}
            for layer, chosen in routes.items():
                kept = [e for e in chosen if rng.random() >= self.noise]
                pool = [e for e in experts if e not in chosen]
                replaced = rng.sample(pool, min(len(pool), len(chosen) - len(kept)))
                noisy[layer] = tuple(sorted(kept + replaced))
            out.append(noisy)
        return out
