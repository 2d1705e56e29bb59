"""SimEngine: the numerics run at once on the CPU; time comes from the cost model on a deterministic event clock.

Each stream has a clock: the time its last op ends. An op starts at the latest of its stream's clock and the host
thread's time (an op cannot start before the host launched it), and lasts what the cost model says. `wait` moves a
stream's clock to the event's time and books the gap as a stall; `synchronize` moves the host's time to the event's
and then past the profile's `host_sync` (reading a device result costs the host that long: a span on the `sync`
timeline); a host worker waiting on a device event (`wait(HOST, ...)`) pays it too. Nothing reads the wall clock, so
the same schedule gives the same times on any machine.
"""

from __future__ import annotations

from typing import Any

from specter.timing.cost import CostModel
from specter.timing.engine import HOST, STREAMS, SYNC, Engine, Event, Op, Span, Stall, check_stream
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
        start = max(self._ready[stream], self._host)
        end = start + self.cost.seconds(op, stream)
        self._ready[stream] = end
        self.timeline.spans.append(Span(stream, op.label, start, end, op.bytes_copied))
        return op.fn() if op.fn is not None else None

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
