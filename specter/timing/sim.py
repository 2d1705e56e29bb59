"""SimEngine: the numerics run at once on the CPU; time comes from the cost model on a deterministic event clock.

Two kinds of clock, as on a GPU with its host:
- **The host thread.** Launching an op costs it the profile's dispatch time for every kernel the op stands for
  (`host.dispatch_us`: the framework's work per op, the same for every system that dispatches eagerly; a system whose
  upstream runtime is compiled pays the launch call alone, one that replays a captured graph nothing per kernel:
  `runtime_dispatch`); a host read of a device result waits for the device and then costs `host_sync`; the runtime's own
  work at each target MoE layer (`policy`: choosing copies, updating the cache) costs `host.policy_us`. The host runs
  ahead of the device until it must read something.
- **Each stream.** An op starts no earlier than its stream's last op ends and its first kernel is launched, and ends no
  earlier than its own time after that, nor before its last kernel could run after its launch. A chain of tiny kernels
  thus comes out launch-bound (its time grows with dispatch), one large kernel device-bound, and a copy overlaps the
  host work launched after it.

On a profile whose device is the host itself (`device.synchronous`: the CPU as device, measured by `specter
profile-bandwidth`) every launch returns only when its op has run, as on the wall clock: nothing overlaps.

`wait` moves a stream's clock to the event's time and books the gap as a stall; `synchronize` moves the host's time to
the event's and then past `host_sync` (a span on the `sync` timeline; the runtime's own work is on the `policy`
timeline, the dispatch an op's launch costs is not kept apart); a host worker waiting on a device event (`wait(HOST,
...)`) pays `host_sync` too. Nothing reads the wall clock, so the same schedule gives the same times on any machine.
"""

from __future__ import annotations

from typing import Any

from specter.timing.cost import CostModel
from specter.timing.engine import COMPUTE, HOST, POLICY, STREAMS, SYNC, Engine, Event, Op, Span, Stall, check_stream
from specter.timing.hardware import HardwareProfile


class SimEngine(Engine):
    kind = "sim"

    def __init__(self, profile: HardwareProfile) -> None:
        super().__init__()
        self.profile = profile
        self.cost = CostModel(profile)
        self._ready = {s: 0.0 for s in STREAMS}  # when each stream's last op ends
        self._host = 0.0  # the host thread's time
        # the profile's figures every launch reads, looked up once (a sweep launches millions of ops)
        self._dispatch = profile.host_dispatch
        self._synchronous = profile.device_synchronous
        self._spans = self.timeline.spans
        self._graphs = self._in_graph = False  # graph dispatch (`runtime_dispatch`), and a graph launched since a wait

    @property
    def device(self) -> str:
        return "cpu"

    def launch(self, stream: str, op: Op) -> Any:
        if stream not in STREAMS:
            check_stream(stream)
        launches = op.launches if op.launches > 1 else 1
        if self._graphs and not self._in_graph and stream == COMPUTE:  # the host launches the next captured graph
            self._host += self.profile.device_launch_overhead
            self._in_graph = True
        issued = self._host
        dispatch = self._dispatch
        host = self._host = issued + launches * dispatch  # the host dispatches every kernel of the op
        seconds = self.cost.seconds(op, stream)
        ready = self._ready[stream]
        if self._synchronous:  # the device is this thread: it dispatches each kernel, then runs it
            start = issued if issued > ready else ready
            end = self._host = start + launches * dispatch + seconds
        else:
            first = issued + dispatch  # once its first kernel is launched
            start = first if first > ready else ready
            end, last = start + seconds, host + seconds / launches  # its last kernel runs after its launch
            if last > end:
                end = last
        self._ready[stream] = end
        self._spans.append(Span(stream, op.label, start, end, op.bytes_copied))
        return op.fn() if op.fn is not None else None

    def runtime_dispatch(self, mode: str) -> None:
        super().runtime_dispatch(mode)
        p = self.profile
        self._dispatch = {"eager": p.host_dispatch, "native": p.device_launch_overhead, "graph": 0.0}[mode]
        self._graphs = mode == "graph"

    def policy(self, label: str) -> None:
        """The runtime's own work at one target MoE layer: the profile's `host.policy_us` of host time."""
        if self.profile.host_policy > 0:
            self._spans.append(Span(POLICY, label, self._host, self._host + self.profile.host_policy))
            self._host += self.profile.host_policy

    def record(self, stream: str) -> Event:
        if stream not in STREAMS:
            check_stream(stream)
        return Event(stream, time=self._ready[stream])

    def wait(self, stream: str, event: Event) -> None:
        if stream not in STREAMS:
            check_stream(stream)
        ready, host, time = self._ready[stream], self._host, event.time
        idle_until = host if host > ready else ready
        if time > idle_until and event.stream != stream:
            self.timeline.stalls.append(Stall(stream, event.stream, time - idle_until))
        if time > ready:
            ready = self._ready[stream] = time
        if stream == HOST and event.stream != HOST:  # the host worker reads a device result
            self._spans.append(Span(SYNC, "host-worker", ready, ready + self.profile.host_sync))
            self._ready[stream] = ready + self.profile.host_sync

    def synchronize(self, event: Event | None = None) -> float:
        target = max(self._ready.values()) if event is None else event.time
        start = max(self._host, target)
        self._host = start + self.profile.host_sync
        self._in_graph = False
        self._spans.append(Span(SYNC, "host", start, self._host))
        return self._host

    def join(self, event: Event) -> float:
        if event.time > self._host:
            self._host = event.time
        return self._host

    def now(self) -> float:
        return self._host
