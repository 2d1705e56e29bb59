"""Reference systems: `resident` (every expert on the device: the upper bound) and `on-demand` (the target alone,
copying each missing expert when its router asks for it, LRU slots, no speculation)."""

from __future__ import annotations

from specter.systems import PromptContext, PromptResult, System


def decode_one_by_one(ctx: PromptContext, result: PromptResult, before_step=None) -> PromptResult:
    """Decode the remaining tokens one target pass each, committing each when its logits are ready.
    `before_step(j)` runs before decode step j (1-based) is scheduled."""
    trace = ctx.trace
    prompt_len = len(trace.prompt)
    for j in range(1, ctx.config.max_new_tokens):
        if before_step is not None:
            before_step(j)
        # input seq[P + j - 1] after P + j - 1 cached tokens
        end = ctx.executor.target_pass([trace.step_routes[j - 1]], context=prompt_len + j - 1, tag=f"d{j}")
        ctx.engine.synchronize(end)  # the host reads the next token
        result.tokens.append(trace.tokens[j])
        result.commit_times.append(ctx.engine.event_time(end))
    return result


class OnDemand(System):
    name = "on-demand"

    def run(self, ctx: PromptContext) -> PromptResult:
        return decode_one_by_one(ctx, self.prefill(ctx))


class Resident(System):
    name = "resident"

    @staticmethod
    def fixed_slots(work) -> int:
        return work.experts_per_layer

    def run(self, ctx: PromptContext) -> PromptResult:
        # every expert already on the device: no copies at all
        ctx.executor.place({layer: list(range(ctx.work.experts_per_layer)) for layer in ctx.work.moe_layers})
        return decode_one_by_one(ctx, self.prefill(ctx))
