"""Reference systems: `resident` (every expert on the device: the upper bound) and `on-demand` (the target alone,
copying each missing expert when its router asks for it, LRU slots, no speculation)."""

from __future__ import annotations

from specter.eviction import OPTION as REPLACEMENT
from specter.systems.base import PromptContext, PromptResult, System
from specter.systems.decode import decode_one_by_one


class OnDemand(System):
    """The target alone: each missing expert is copied when its router asks for it, into LRU slots (or the
    `replacement` option's policy); no speculation."""

    name = "on-demand"
    order, colour = 20, "#937860"
    options = REPLACEMENT

    def run(self, ctx: PromptContext) -> PromptResult:
        return decode_one_by_one(ctx, self.prefill(ctx))


class Resident(System):
    """Every expert on the device, nothing crosses the link: the upper bound."""

    name = "resident"
    order, colour = 10, "#4c72b0"

    @staticmethod
    def fixed_slots(work) -> int:
        return work.experts_per_layer

    def run(self, ctx: PromptContext) -> PromptResult:
        # every expert already on the device: no copies at all
        ctx.executor.place({layer: list(range(ctx.work.experts_per_layer)) for layer in ctx.work.moe_layers})
        return decode_one_by_one(ctx, self.prefill(ctx))
