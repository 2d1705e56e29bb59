"""What a pass of the executor (`specter.offload.executor`) shares with the systems around it: the hooks through
which a system acts inside a pass (`PassHooks`), the forecast a prefetch is chosen from (`Forecast`), and what the
pass counts (`HitMiss`, `TransferStats`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from specter.timing.engine import Event


@dataclass
class HitMiss:
    """Hits and misses, in total and per MoE layer: of the distinct experts a layer of a pass needs (`hits`,
    `misses`), and of its (token, expert) routings (`token_hits`, `token_misses`: an expert that k tokens of the pass
    route to counts k times)."""

    hits: int = 0
    misses: int = 0
    per_layer_hits: Counter = field(default_factory=Counter)
    per_layer_misses: Counter = field(default_factory=Counter)
    token_hits: int = 0
    token_misses: int = 0

    def counts(self) -> tuple[int, int, int, int]:
        return self.hits, self.misses, self.token_hits, self.token_misses

    def hit(self, layer: int, n: int = 1) -> None:
        self.hits += n
        self.per_layer_hits[layer] += n

    def miss(self, layer: int, n: int = 1) -> None:
        self.misses += n
        self.per_layer_misses[layer] += n


@dataclass
class TransferStats:
    demand: HitMiss = field(default_factory=HitMiss)  # the experts a target pass needed: on the device, or not
    h2d_bytes_demand: int = 0
    h2d_bytes_prefetch: int = 0
    link_bytes_activations: int = 0  # activations moved instead of weights (experts computed on the host)
    prefetches: int = 0
    # per target pass, in order (the first is the prompt's prefill): its demand (hits, misses, token hits, token misses)
    target_passes: list[tuple[int, int, int, int]] = field(default_factory=list)
    d2h_bytes_writeback: int = 0  # evicted experts copied back to the host (Mixtral-Offloading's swap)
    h2d_bytes_prefill: int | None = None  # host-to-device bytes by the end of the first target pass (the prefill)


@dataclass(frozen=True)
class Forecast:
    """The compute whose result the host reads to choose copies: its end event and its op's label."""

    event: Event
    source: str


class PassHooks:
    """Where a system acts inside a pass; every method is a no-op unless a system overrides it."""

    def before_step(self, step: int) -> None:
        """Before decode step `step` (1-based) of a one-token-at-a-time loop is scheduled."""

    def on_route(self, layer: int, routes: list[tuple[int, ...]]) -> None:
        """The host knows target layer `layer`'s routing of the pass's tokens (its experts are not yet scheduled)."""

    def after_layer(self, layer: int, routes: list[tuple[int, ...]]) -> None:
        """Target layer `layer`'s experts are scheduled (its demand copies queued); the host may look ahead."""

    def on_draft_layer(self, layer: int, experts: tuple[int, ...]) -> None:
        """A draft step has routed MoE layer `layer` to `experts` (the executor's `routed` is that router's compute:
        the host holds the routing only once it has finished)."""
