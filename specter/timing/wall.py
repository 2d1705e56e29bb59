"""WallEngine: the Engine interface on a device without streams (the CPU as device); time is the wall clock.

Every op runs when it is launched, on the calling thread, and its span is what `time.perf_counter` saw around it. A
device with one thread of execution has no overlap to model: a copy and a kernel never run at once, an event is complete
when it is recorded, and `wait` and `synchronize` return at once (no stall is ever booked). The live engine runs on it
on the CPU: the model's own modules compute between the ops (embeddings, attention, norms, routers, shared experts,
the head, the draft's experts), and the executor launches an op without a function for each such part once the model
has done it. Such an op's span runs from the end of the previous op to its launch, so the timeline holds all of the
work and its breakdown parts mean what they mean in the simulator.
"""

from __future__ import annotations

import time
from typing import Any

from specter.timing.engine import SYNC, Engine, Event, Op, Span, check_stream


class WallEngine(Engine):
    kind = "live"

    def __init__(self, device: str = "cpu") -> None:
        super().__init__()
        self._device = device
        self._origin = time.perf_counter()
        self._last_end = 0.0  # when the last op's span ended

    @property
    def device(self) -> str:
        return self._device

    def start(self) -> None:
        super().start()
        self._origin = time.perf_counter()
        self._last_end = 0.0

    def launch(self, stream: str, op: Op) -> Any:
        check_stream(stream)
        start = self._last_end if op.fn is None else self.now()  # without a function: work done before the launch
        out = op.fn() if op.fn is not None else None
        self._last_end = self.now()
        self.timeline.spans.append(Span(stream, op.label, start, self._last_end, op.bytes_copied))
        return out

    def record(self, stream: str) -> Event:
        check_stream(stream)
        return Event(stream, time=self.now())

    def wait(self, stream: str, event: Event) -> None:
        check_stream(stream)  # the event's work is done: it ran when it was launched

    def synchronize(self, event: Event | None = None) -> float:
        now = self.now()
        self.timeline.spans.append(Span(SYNC, "host", now, now))
        return now

    def now(self) -> float:
        return time.perf_counter() - self._origin
