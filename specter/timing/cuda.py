"""CudaEngine: the Engine interface on real CUDA streams and events; time is measured, not modelled.

COMPUTE and H2D are `torch.cuda.Stream`s; each op is bracketed by timing events, resolved into the timeline when the run
finishes. HOST ops run on the calling thread (the device keeps executing what was already queued, so host and device
work overlap as they do in Fiddler) and are timed with `time.perf_counter`. Copies are real: an op's `fn` does
`dst.copy_(src, non_blocking=True)` from pinned host memory. Origin: both clocks are read right after a device
synchronize, so device and host times share one axis to within the synchronize's latency.

The live engine on a GPU (`between_ops=True`) runs the model's own modules between the executor's ops, on the compute
stream (`compute_scope`): an op without a function stands for such work, so its span runs from the previous op's end on
its stream to its launch, as on the wall clock (`specter.timing.wall`).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from specter.timing.engine import COMPUTE, H2D, HOST, SYNC, Engine, Event, Op, Span, Stall, check_stream


def make_streams(device: torch.device) -> dict[str, Any]:
    """A compute and a copy stream on `device`, for every engine of one runtime (`LiveRuntime.streams`): PyTorch's
    caching allocator keeps a stream's freed blocks for that stream, so a warm-up on the same streams warms the timed
    runs that follow, and no run allocates anew inside its timed region."""
    return {COMPUTE: torch.cuda.Stream(device), H2D: torch.cuda.Stream(device)}


class CudaEngine(Engine):
    kind = "cuda"

    def __init__(self, device: str = "cuda", between_ops: bool = False, streams: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._between_ops = between_ops
        self._last_end: dict[str, Any] = {}  # each device stream's last op's end event (`between_ops`)
        if not torch.cuda.is_available():
            raise RuntimeError("CudaEngine needs CUDA; use --engine sim on a machine without a GPU")
        self._device = torch.device(device)
        self._streams = streams if streams is not None else make_streams(self._device)
        self._pending_spans: list[tuple[str, str, Any, Any, float]] = []
        self._pending_stalls: list[tuple[str, str, Any, Any]] = []
        self._set_origin()

    def _set_origin(self) -> None:
        torch.cuda.synchronize(self._device)
        self._origin = self._new_event()
        self._origin.record(torch.cuda.current_stream(self._device))
        torch.cuda.synchronize(self._device)
        self._wall_origin = time.perf_counter()

    def start(self) -> None:
        if self._pending_spans or self.timeline.spans:
            raise RuntimeError("Engine.start() after ops were launched")
        self._set_origin()
        self._last_end.clear()

    def compute_scope(self):
        return torch.cuda.stream(self._streams[COMPUTE])

    @property
    def device(self) -> str:
        return str(self._device)

    def _new_event(self):
        return torch.cuda.Event(enable_timing=True)

    def launch(self, stream: str, op: Op) -> Any:
        check_stream(stream)
        if stream == HOST:
            start = self.now()
            out = op.fn() if op.fn is not None else None
            self.timeline.spans.append(Span(HOST, op.label, start, self.now(), op.bytes_copied))
            return out
        s = self._streams[stream]
        end = self._new_event()
        if op.fn is None and self._between_ops:  # work the caller put on the stream since its last op
            begin = self._last_end.get(stream, self._origin)
            end.record(s)
            out = None
        else:
            begin = self._new_event()
            with torch.cuda.stream(s):
                begin.record(s)
                out = op.fn() if op.fn is not None else None
                end.record(s)
        self._last_end[stream] = end
        self._pending_spans.append((stream, op.label, begin, end, op.bytes_copied))
        return out

    def record(self, stream: str) -> Event:
        check_stream(stream)
        if stream == HOST:
            return Event(HOST, time=self.now())
        ev = self._new_event()
        ev.record(self._streams[stream])
        return Event(stream, handle=ev)

    def wait(self, stream: str, event: Event) -> None:
        check_stream(stream)
        if stream == HOST:
            self.synchronize(event)
            return
        if event.handle is None:  # a host event: host work is synchronous, so it is already complete
            return
        before = self._new_event()
        before.record(self._streams[stream])
        self._streams[stream].wait_event(event.handle)
        if event.stream != stream:
            self._pending_stalls.append((stream, event.stream, before, event.handle))

    def synchronize(self, event: Event | None = None) -> float:
        start = self.now()
        if event is None:
            torch.cuda.synchronize(self._device)
        elif event.handle is not None:
            event.handle.synchronize()
        end = self.now()
        self.timeline.spans.append(Span(SYNC, "host", start, end))
        return end

    def now(self) -> float:
        return time.perf_counter() - self._wall_origin

    def event_time(self, event: Event) -> float:
        if event.handle is None:
            return event.time
        event.handle.synchronize()
        return self._origin.elapsed_time(event.handle) / 1e3

    def landed(self, event: Event) -> float | None:
        if event.handle is None:
            return event.time
        if not event.handle.query():  # cudaEventQuery: never blocks the host
            return None
        return self._origin.elapsed_time(event.handle) / 1e3

    def finish(self):
        torch.cuda.synchronize(self._device)
        for stream, label, begin, end, nbytes in self._pending_spans:
            t0 = self._origin.elapsed_time(begin) / 1e3
            t1 = self._origin.elapsed_time(end) / 1e3
            self.timeline.spans.append(Span(stream, label, t0, t1, nbytes))
        for stream, waited_on, before, handle in self._pending_stalls:
            gap = (self._origin.elapsed_time(handle) - self._origin.elapsed_time(before)) / 1e3
            if gap > 0:
                self.timeline.stalls.append(Stall(stream, waited_on, gap))
        self._pending_spans.clear()
        self._pending_stalls.clear()
        self.timeline.spans.sort(key=lambda s: s.start)
        return self.timeline
