"""SimEngine: the numerics run at once on the CPU; time comes from the cost model on a deterministic event clock.

Two kinds of clock, as on a GPU with its host:
- **The host thread.** Launching an op costs it the profile's dispatch time for every kernel the op stands for
  (`host.dispatch_us`: the framework's work per op, the same for every system); a host read of a device result waits
  for the device and then costs `host_sync`; the runtime's own work at each target MoE layer (`policy`: choosing
  copies, updating the cache) costs `host.policy_us`. The host runs ahead of the device until it must read something.
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
from specter.timing.engine import HOST, POLICY, STREAMS, SYNC, Engine, Event, Op, Span, Stall, check_stream
from specter.timing.hardware import HardwareProfile


class SimEngine(Engine):
    kind = "sim"

    def __init__(self, profile: HardwareProfile) -> None:
        super().__init__()
        self.profile = profile
        self.cost = CostModel(profile)
        self._ready = {s: 0.0 for s in STREAMS}  # when each stream's last op ends
        self._host = 0.0  # the host thread's time

    @property
    def device(self) -> str:
        return "cpu"

    def launch(self, stream: str, op: Op) -> Any:
        check_stream(stream)
        launches = max(1, op.launches)
        issued = self._host
        self._host += launches * self.profile.host_dispatch  # the host dispatches every kernel of the op
        seconds = self.cost.seconds(op, stream)
        if self.profile.device_synchronous:  # the device is this thread: it dispatches each kernel, then runs it
            start = max(self._ready[stream], issued)
            end = self._host = start + launches * self.profile.host_dispatch + seconds
        else:
            start = max(self._ready[stream], issued + self.profile.host_dispatch)  # once its first kernel is launched
            end = max(start + seconds, self._host + seconds / launches)  # its last kernel runs after its launch
        self._ready[stream] = end
        self.timeline.spans.append(Span(stream, op.label, start, end, op.bytes_copied))
        return op.fn() if op.fn is not None else None

    def policy(self, label: str) -> None:
        """The runtime's own work at one target MoE layer: the profile's `host.policy_us` of host time."""
        if self.profile.host_policy > 0:
            self.timeline.spans.append(Span(POLICY, label, self._host, self._host + self.profile.host_policy))
            self._host += self.profile.host_policy

    def record(self, stream: str) -> Event:
        check_stream(stream)
        return Event(stream, time=self._ready[stream])

    def wait(self, stream: str, event: Event) -> None:
        check_stream(stream)
        idle_until = max(self._ready[stream], self._host)
        if event.time > idle_until and event.stream != stream:
            self.timeline.stalls.append(Stall(stream, event.stream, event.time - idle_until))
        self._ready[stream] = max(self._ready[stream], event.time)
        if stream == HOST and event.stream != HOST:  # the host worker reads a device result
            self.timeline.spans.append(Span(SYNC, "host-worker", self._ready[stream],
                                            self._ready[stream] + self.profile.host_sync))
            self._ready[stream] += self.profile.host_sync

    def synchronize(self, event: Event | None = None) -> float:
        target = max(self._ready.values()) if event is None else event.time
        start = max(self._host, target)
        self._host = start + self.profile.host_sync
        self.timeline.spans.append(Span(SYNC, "host", start, self._host))
        return self._host

    def now(self) -> float:
        return self._host
