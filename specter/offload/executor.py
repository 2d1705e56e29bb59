"""The MoE layer executor: the target's routed experts for one pass, hot-first, on the engine's streams.

Per MoE layer of a pass: the attention block (and router) runs and, unless every expert is resident, the host reads the
routing (a synchronization: copies cannot be decided before it; a live layer with every expert resident computes grouped
and reads it after the pass, `specter.offload.grouped`); the runtime's own host work follows (`Engine.policy`: choosing
copies, updating the cache; none where `host_policy` is off); then every resident expert the pass needs computes at once
(waiting only for a prefetch still landing), while each missing expert is copied on the H2D stream (demand) and computes
as its copy lands. A missing expert takes a slot (evicting the least recently used unprotected expert that this pass
does not need, after that expert's last compute); if every slot is taken by experts the pass needs or by protected
prefetches, it streams through one of a ring of staging buffers without entering the cache (a copy into a staging buffer
waits for the last compute that read it). Prefetches (`prefetch`) go through the same slots.

Causality: every routing the host is given comes with the event of the compute that produced it (`Forecast`: the
router's attention block of a target layer, the router of a draft layer, the end of a draft step), kept as `routed`
while hooks and planners act on it. A prefetch (`prefetch`) is chosen from the routing known so far, so its copies wait
on `routed` plus the host's read of it (`host_holds`: a host worker waiting on a device event pays the profile's host
synchronization); `prefetch_log` keeps every prefetch copy's label beside its forecast, which a test holds against the
timeline for every system that prefetches.

A copy can also run in the compute stream's order (`copy_in_compute_order`: after the compute issued before it, and
before the compute issued after it), as accelerate's and Mixtral-Offloading's copies on the current stream do; a
write-back (`write_back`: an evicted expert copied device to host, as Mixtral-Offloading's swap does) crosses the same
link and is priced by the same copy cost.

Systems act inside a pass through `PassHooks` (`specter.offload.hooks`: declared methods, no-ops by default, beside the
forecasts and the transfer statistics a pass keeps) that they add to `hooks`: `on_route` once the host knows a target
layer's routing, `after_layer` once its experts are scheduled (a prefetch for later layers issued there queues behind
this layer's demand copies, as it would on one copy stream), `on_draft_layer` after each MoE layer of a draft step,
`before_step` before each decode step of a one-token-at-a-time loop.

Ops carry costs; with a `LiveRuntime` (the live engine's runs) each op also carries the device work it stands for: the
copy into the expert's slot or staging buffer, the expert computed from that buffer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specter.offload import grouped
from specter.offload.cache import ExpertCache
from specter.offload.hooks import Forecast, PassHooks, TransferStats
from specter.offload.memory import STAGING_BUFFERS
from specter.offload.work import ModelWork
from specter.timing.bounds import PassWork
from specter.timing.cost import CostModel
from specter.timing.engine import COMPUTE, H2D, HOST, Engine, Event, Op

if TYPE_CHECKING:
    from specter.offload.live import LiveRuntime


def tokens_of(routes: list[tuple[int, ...]]) -> dict[int, int]:
    """How many of `routes` route to each expert, in the order experts first appear (as `collections.Counter` counts,
    in a plain dict: a simulated sweep counts a few experts millions of times)."""
    counts: dict[int, int] = {}
    for r in routes:
        for e in r:
            counts[e] = counts.get(e, 0) + 1
    return counts

class Executor:
    def __init__(self, engine: Engine, work: ModelWork, cache: ExpertCache, stats: TransferStats,
                 device: LiveRuntime | None = None, cost: CostModel | None = None) -> None:
        self.engine = engine
        self.work = work
        self.cache = cache
        self.stats = stats
        self.device = device  # the device work behind the ops, or None (costs only)
        self.cost = cost  # the profile's cost model, for executors that decide by it (Fiddler)
        self.staging_last_use: list[Event | None] = [None] * STAGING_BUFFERS
        self._next_staging = 0
        # A runtime whose cache can miss reads each layer's routing on the host to decide what to copy: the host waits
        # for the router (a synchronization per MoE layer). With every expert resident, routing stays on the device.
        self.host_reads_routes = cache.slots_per_layer < work.experts_per_layer
        self.passes: list[PassWork] = []  # every target pass, at roofline (the lower bound's compute side)
        self._acc: list[Op] | None = None
        self.hooks: list[PassHooks] = []  # the systems' hooks inside passes (see PassHooks)
        self.serialize_demand = False  # ablation: each demand copy waits for the compute issued before it
        self.fused_draft = True  # the draft's routed experts of one layer and step as one fused kernel (see draft_pass)
        # When a list, each demand copy adds (host time at issue, event before the copy, event after it): the timings
        # a planner's bandwidth estimate reads (see PlannerState.observe_demand); None: not timed.
        self.timed_demand: list[tuple[float, Event, Event]] | None = None
        self.routed: Forecast | None = None  # the latest routing given to the host (see the module's docstring)
        self.prefetch_log: list[tuple[str, Forecast]] = []  # (prefetch copy's label, the forecast it was chosen from)
        self.last_pass = None  # the live engine's last pass: its argmax per input and its routes (`LivePass`)
        self.host_policy = True  # the runtime's own host work at each target MoE layer (`Engine.policy`)

    def _compute(self, op: Op) -> None:
        if self._acc is not None:
            self._acc.append(op)
        self.engine.launch(COMPUTE, op)

    def _with(self, op: Op, device_work: str, *args) -> Op:
        """`op` carrying the device runtime's `device_work(*args)` kernel as its function, when a runtime backs the
        run (the kernel is bound now, with the arguments of this moment)."""
        if self.device is not None:
            op.fn = getattr(self.device, device_work)(*args)
        return op

    def place(self, placement: dict[int, list[int]]) -> None:
        """Put experts in their layers' slots before the prompt starts, replacing what those layers held, least
        recently used first (no copies are scheduled or counted); the engine's time starts after the placement."""
        for layer, experts in placement.items():
            self.cache.clear(layer)
            for e in self.cache.fill(layer, experts):
                if self.device is not None:
                    self.device.place(layer, e, self.cache.slot(layer, e).index)
        self.engine.start()

    def use_staging(self, count: int) -> None:
        """A ring of `count` staging buffers instead of the default."""
        self.staging_last_use, self._next_staging = [None] * count, 0
        if self.device is not None:
            self.device.staging_rows(count)

    def _copy_into_slot(self, layer: int, expert: int, keep: set[int], label: str, timed: bool = False) -> Event:
        """Copy `expert` into a slot of `layer` (after the evicted expert's last use); returns the copy's event."""
        evicted = self.cache.insert(layer, expert, keep)
        if evicted is not None and evicted.last_use is not None:
            self.engine.wait(H2D, evicted.last_use)
        slot = self.cache.slot(layer, expert)
        before = self._before_timed_copy(timed)
        self.engine.launch(H2D, self._with(self.work.copy_op(label), "copy_to_slot", layer, expert, slot.index))
        slot.ready = self.engine.record(H2D)
        self._after_timed_copy(before, slot.ready)
        return slot.ready

    def _copy_to_staging(self, layer: int, expert: int, label: str, timed: bool = False) -> tuple[Event, int]:
        """Copy `expert` into the next staging buffer (after that buffer's last reader); returns (event, buffer)."""
        i = self._next_staging
        self._next_staging = (i + 1) % len(self.staging_last_use)
        if self.staging_last_use[i] is not None:
            self.engine.wait(H2D, self.staging_last_use[i])
        before = self._before_timed_copy(timed)
        self.engine.launch(H2D, self._with(self.work.copy_op(label), "copy_to_staging", layer, expert, i))
        ready = self.engine.record(H2D)
        self._after_timed_copy(before, ready)
        return ready, i

    def _before_timed_copy(self, timed: bool) -> tuple[float, Event] | None:
        """(host time, an event after the copy stream's waits) before a copy that `timed_demand` times, else None."""
        if not timed or self.timed_demand is None:
            return None
        return self.engine.now(), self.engine.record(H2D)

    def _after_timed_copy(self, before: tuple[float, Event] | None, ready: Event) -> None:
        if before is not None:
            self.timed_demand.append((*before, ready))

    def host_holds(self, forecast: Forecast) -> Event:
        """The event by which a host worker has read `forecast`'s result: after its compute, plus the host's read of it
        (the profile's host synchronization; on CUDA the host waits for it)."""
        self.engine.wait(HOST, forecast.event)
        return self.engine.record(HOST)

    def copy_in_compute_order(self, op: Op) -> Event:
        """Launch a copy in the compute stream's order: after the compute issued so far, the compute issued next
        after it (a copy on the current stream, as accelerate's and Mixtral-Offloading's are); returns its event."""
        self.engine.wait(H2D, self.engine.record(COMPUTE))
        self.engine.launch(H2D, op)
        done = self.engine.record(H2D)
        self.engine.wait(COMPUTE, done)
        return done

    def write_back(self, layer: int, expert: int, slot: int, label: str) -> Op:
        """The op copying `expert` of `layer` from device slot `slot` back into host memory (over the same link, at the
        expert's bytes), for the caller to launch; counted in `d2h_bytes_writeback`."""
        self.stats.d2h_bytes_writeback += self.work.expert_bytes
        return self._with(self.work.copy_op(label), "copy_to_host", layer, expert, slot)

    def _expert(self, layer: int, expert: int, tokens: int, label: str, staging: int | None = None) -> None:
        """Compute `expert` on `tokens` tokens from its slot (or from staging buffer `staging`) and book the read."""
        if staging is None:
            slot = self.cache.slot(layer, expert)
            self._compute(self._with(self.work.expert_op(tokens, label),
                                     "expert_in_slot", layer, expert, slot.index, tokens))
            slot.last_use = self.engine.record(COMPUTE)
        else:
            self._compute(self._with(self.work.expert_op(tokens, label),
                                     "expert_in_staging", layer, expert, staging, tokens))
            self.staging_last_use[staging] = self.engine.record(COMPUTE)

    def _attention(self, layer: int, tokens: int, context: int, label: str) -> Op:
        return self._with(self.work.attention_op(layer, tokens, context, label),
                          "attention", layer, tokens, context)

    def _head(self, tokens: int, label: str) -> Op:
        return self._with(self.work.head_op(tokens, label), "lm_head", tokens)

    def copy_kv(self, start: int, tokens: int, tag: str) -> Event:
        """Copy the target's KV of positions `start` .. `start + tokens - 1` into the draft's own cache (a draft that
        keeps its own KV), on the compute stream after the pass that wrote it; returns the copy's event."""
        self._compute(self._with(self.work.kv_copy_op(tokens, f"{tag}.draft-kv-copy"), "copy_kv", start, tokens))
        return self.engine.record(COMPUTE)

    def prefetch(self, layer: int, experts: list[int], keep: set[int] = frozenset()) -> int:
        """Copy those of `experts` that are not resident and fit (protected until `unprotect_all`), never evicting an
        expert in `keep`; returns how many. They are chosen from the routing known so far (`routed`), so they start no
        earlier than the host has read it."""
        if self.routed is None:
            raise RuntimeError("a prefetch before any routing was known: nothing could have forecast it")
        issued, forecast, after = 0, self.routed, None
        for e in experts:
            if (layer, e) in self.cache:
                self.cache.protect(layer, {e})
                continue
            if not self.cache.has_room(layer, keep):
                break
            if after is None:
                after = self.host_holds(forecast)
                self.engine.wait(H2D, after)
            label = f"L{layer}.prefetch.e{e}.n{len(self.prefetch_log)}"
            self.prefetch_log.append((label, forecast))
            self._copy_into_slot(layer, e, keep, label)
            self.cache.protect(layer, {e})
            self.stats.h2d_bytes_prefetch += self.work.expert_bytes
            self.stats.prefetches += 1
            issued += 1
        return issued

    def layer(self, layer: int, routes, context: int, tag: str, tokens: int | None = None) -> list:
        """One decoder layer of a target pass over len(routes) tokens (routes empty for a dense layer); returns the
        routes. Live, `routes` is a call that reads the router's choices (`tokens` of them), made once the host has
        waited for the router: the layer's one synchronization, where the timeline shows it."""
        n = max(1, len(routes) if tokens is None else tokens)
        self._compute(self._attention(layer, n, context, f"{tag}.L{layer}.attn"))
        if layer not in self.work.moe_layers:
            return routes
        self.routed = Forecast(self.engine.record(COMPUTE), f"{tag}.L{layer}.attn")  # the router ran in that block
        reads = self.work.kernels.host_reads  # an upstream system's declared reads, else the routing's where read
        reads = int(self.host_reads_routes) if reads is None else reads
        for _ in range(max(reads, 1) if callable(routes) else reads):  # live: the host reads them, so it waits
            self.engine.synchronize(self.routed.event)
        if callable(routes):
            routes = routes()
        if self.host_policy:  # the runtime's own work: choosing copies, updating the cache
            self.engine.policy(f"{tag}.L{layer}.policy")
        for hook in self.hooks:
            hook.on_route(layer, routes)
        self.run_experts(layer, routes, tag)
        for hook in self.hooks:
            hook.after_layer(layer, routes)
        return routes

    def run_experts(self, layer: int, routes: list[tuple[int, ...]], tag: str) -> None:
        """The routed experts of one layer: resident first, then the missing ones on demand."""
        tokens_per_expert = tokens_of(routes)
        needed = set(tokens_per_expert)
        resident = [e for e in self.cache.resident(layer) if e in needed]  # hot-first, in cache order
        missing = sorted(needed - set(resident))
        for e in resident:
            slot = self.cache.slot(layer, e)
            if slot.ready is not None:
                self.engine.wait(COMPUTE, slot.ready)
            self._expert(layer, e, tokens_per_expert[e], f"{tag}.L{layer}.e{e}")
            self.cache.touch(layer, e)
        self.stats.demand.hit(layer, len(resident))
        self.stats.demand.token_hits += sum(tokens_per_expert[e] for e in resident)
        self.stats.demand.token_misses += sum(tokens_per_expert[e] for e in missing)
        for e in missing:
            self.stats.demand.miss(layer)
            self.stats.h2d_bytes_demand += self.work.expert_bytes
            label = f"{tag}.L{layer}.demand.e{e}"
            if self.serialize_demand:
                self.engine.wait(H2D, self.engine.record(COMPUTE))
            staging = None
            if self.cache.has_room(layer, keep=needed):
                ready = self._copy_into_slot(layer, e, needed, label, timed=True)
            else:  # every slot holds an expert this pass needs or a protected prefetch: stream through a buffer
                ready, staging = self._copy_to_staging(layer, e, label, timed=True)
            self.engine.wait(COMPUTE, ready)
            self._expert(layer, e, tokens_per_expert[e], f"{tag}.L{layer}.e{e}", staging)
            if staging is None:
                self.cache.touch(layer, e)

    @property
    def live(self) -> bool:
        """Whether the model itself runs through this executor (the live engine's `LiveRuntime`): each pass's routes
        and logits are then the live model's, read as the pass runs (`last_pass`)."""
        return self.device is not None and getattr(self.device, "live", False)

    def target_pass(self, routes: list[dict[int, tuple[int, ...]]] | None, context: int, tag: str,
                    inputs: list[int] | None = None) -> Event:
        """A full target pass over len(routes) tokens after `context` cached tokens; returns its end event (logits).
        On the live engine the pass runs the model on `inputs` (token ids) and `routes` is None: the routes are the
        live router's, and they and the pass's argmax are in `last_pass` once it returns."""
        self._acc = []
        self.cache.new_pass(context)
        before = self.stats.demand.counts()
        if self.live:
            routes = self._live_forward(inputs, context, tag, draft=False)
        else:
            for layer in self.work.layers:
                per_token = [r[layer] for r in routes] if layer in self.work.moe_layers else []
                self.layer(layer, per_token, context + len(routes), tag)
        n = len(routes)
        self._compute(self._head(n, f"{tag}.head"))
        ops, self._acc = self._acc, None
        used = tuple((layer, frozenset(e for r in routes for e in r[layer])) for layer in self.work.moe_layers)
        self.passes.append(PassWork(n, sum(o.flops for o in ops), sum(o.bytes_read for o in ops),
                                    sum(o.launches for o in ops), used))
        self.stats.target_passes.append(tuple(a - b for a, b in zip(self.stats.demand.counts(), before)))
        if self.stats.h2d_bytes_prefill is None:  # the prompt's prefill: its copies are no decode's
            self.stats.h2d_bytes_prefill = self.stats.h2d_bytes_demand + self.stats.h2d_bytes_prefetch
        return self.engine.record(COMPUTE)

    def _live_forward(self, inputs: list[int] | None, context: int, tag: str, draft: bool,
                      ops: list[Op] | None = None, expert_bytes: int = 0) -> list[dict[int, tuple[int, ...]]]:
        """The live model's pass over `inputs` after `context` cached positions, each decoder layer scheduled as the
        model reaches it: a target MoE layer once its router has run (its experts then compute from the slots), a
        draft MoE layer once its resident experts have; returns the live routes per input."""
        if not inputs:
            raise ValueError(f"{tag}: a live pass needs its input tokens")
        n = len(inputs)
        routes: list[dict[int, tuple[int, ...]]] = [{} for _ in inputs]
        layers = iter(self.work.layers)
        deferred = []  # (layer, its routing's read) of the layers computed grouped (`specter.offload.grouped`)

        def reach(moe_layer: int | None, per_token) -> list[tuple[int, ...]]:
            for layer in layers:  # the dense layers before this MoE layer, then the layer itself
                if layer != moe_layer:
                    self._dense_layer(layer, n, context, tag, draft, ops)
                    continue
                if draft:
                    self._draft_layer(layer, per_token, n, context, tag, ops, expert_bytes)
                elif type(self) is Executor and grouped.ready(self, layer):  # every expert resident: no read first
                    grouped.schedule(self, layer, n, context, tag)
                    deferred.append((layer, per_token))
                    return None
                else:
                    per_token = self.layer(layer, per_token, context + n, tag, tokens=n)
                for j, experts in enumerate(per_token):
                    routes[j][layer] = experts
                return per_token
            return []

        with self.engine.compute_scope():  # the model's own modules run where the compute stream's ops run
            self.last_pass = self.device.forward(inputs, context, reach, draft=draft)
        reach(None, [])  # the dense layers after the last MoE layer
        for layer, read in deferred:  # behind the pass's argmax read: no wait of their own
            for j, experts in enumerate(grouped.account(self, layer, read(after_pass=True), tag)):
                routes[j][layer] = experts
        self.last_pass.routes = routes
        return routes

    def _dense_layer(self, layer: int, n: int, context: int, tag: str, draft: bool, ops: list[Op] | None) -> None:
        """A dense decoder layer of a pass over `n` tokens: its attention block (a draft's ops go to `ops`)."""
        if draft:
            ops.append(self._attention(layer, n, context + n, f"{tag}.L{layer}.attn"))
            self.engine.launch(COMPUTE, ops[-1])
        else:
            self.layer(layer, [], context + n, tag)

    def draft_step(self, routes: dict[int, tuple[int, ...]] | None, context: int, expert_bytes: int, tag: str,
                   inputs: list[int] | None = None) -> Event:
        """One draft step (one token): the target's shared attention blocks and the draft's resident quantized
        experts (live: the draft runs on `inputs`, one token, and `routes` is None)."""
        return self.draft_pass(None if routes is None else [routes], context, expert_bytes, tag, inputs)

    def draft_pass(self, routes: list[dict[int, tuple[int, ...]]] | None, context: int, expert_bytes: int, tag: str,
                   inputs: list[int] | None = None) -> Event:
        """A draft pass over len(routes) tokens after `context` cached tokens (its experts are all resident). With
        `fused_draft` each MoE layer's routed experts run as one fused INT4 MoE kernel (one launch, the quantized bytes
        and FLOPs of the experts it runs), as the paper's draft does; else one kernel group per expert. Live: the
        draft runs on `inputs`, and its routes and argmax are in `last_pass`."""
        ops: list[Op] = []
        if self.live:
            routes = self._live_forward(inputs, context, tag, draft=True, ops=ops, expert_bytes=expert_bytes)
        else:
            for layer in self.work.layers:
                if layer in self.work.moe_layers:
                    self._draft_layer(layer, [r[layer] for r in routes], len(routes), context, tag, ops, expert_bytes)
                else:
                    self._dense_layer(layer, len(routes), context, tag, True, ops)
        n = len(routes)
        ops.append(self._head(n, f"{tag}.head"))
        self.engine.launch(COMPUTE, ops[-1])
        self.passes.append(PassWork(n, sum(o.flops for o in ops), sum(o.bytes_read for o in ops),
                                    sum(o.launches for o in ops), draft=True))
        return self.engine.record(COMPUTE)

    def _draft_layer(self, layer: int, per_token: list[tuple[int, ...]], n: int, context: int, tag: str,
                     ops: list[Op], expert_bytes: int) -> None:
        """One MoE layer of a draft pass: its attention block, then its routed experts (hooks told on one-token
        steps)."""
        ops.append(self._attention(layer, n, context + n, f"{tag}.L{layer}.attn"))
        self.engine.launch(COMPUTE, ops[-1])
        if n == 1 and self.hooks:  # the draft layer's router has run once its block has
            routed = Forecast(self.engine.record(COMPUTE), ops[-1].label)
        tokens = sorted(tokens_of(per_token).items())
        if self.fused_draft:
            ops.append(self.work.fused_experts_op([m for _, m in tokens], f"{tag}.L{layer}.qmoe", expert_bytes))
            self.engine.launch(COMPUTE, self._with(ops[-1], "draft_layer", layer, tokens))
        for e, m in tokens if not self.fused_draft else ():
            ops.append(self.work.expert_op(m, f"{tag}.L{layer}.q{e}", stored_bytes=expert_bytes))
            self.engine.launch(COMPUTE, self._with(ops[-1], "draft_expert", layer, e, m))
        if n == 1 and self.hooks:
            self.routed = routed
            for hook in self.hooks:
                hook.on_draft_layer(layer, per_token[0])
