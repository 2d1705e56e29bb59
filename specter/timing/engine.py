"""The Engine interface: work scheduled on streams with events, as on CUDA, and turned into time by an engine.

Systems describe what they do as `Op`s launched on named streams:

- `COMPUTE`: the device's compute stream (kernels: attention, experts, the LM head).
- `H2D`: the host-to-device copy stream (expert weights crossing the link).
- `HOST`: a host worker (experts computed on the CPU, as Fiddler does).

An op carries its cost inputs (FLOPs, bytes read from memory, bytes copied over the link) and a function that does the
numerics. Ordering follows CUDA: ops on one stream run in launch order; `wait(stream, event)` makes later ops on that
stream start after the work recorded by the event; `synchronize(event)` blocks the host thread, so ops launched after it
start no earlier. `SimEngine` places each op on a deterministic clock from a cost model; the live engine measures:
`WallEngine` by the wall clock on the CPU as device, `CudaEngine` on real CUDA streams with events. No system branches
on which engine it has.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

COMPUTE = "compute"
H2D = "h2d"
HOST = "host"
STREAMS = (COMPUTE, H2D, HOST)
SYNC = "sync"  # not a stream: the timeline's record of the host reading device results (its cost in the simulator)
POLICY = "policy"  # not a stream: the runtime's own host work at a MoE layer (`Engine.policy`)


@dataclass(slots=True)
class Op:
    """One unit of scheduled work. Exactly one of the cost groups applies, by the stream it runs on:

    compute/host: `flops` and `bytes_read`; h2d: `bytes_copied` (with `pinned`).
    """

    label: str
    fn: Callable[[], Any] | None = None
    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_copied: float = 0.0
    pinned: bool = True
    launches: int = 1  # kernels this op stands for (each pays the launch overhead)


@dataclass
class Event:
    """A point in one stream's work. `time` (seconds since the engine's origin) is known once the engine resolves it."""

    stream: str
    time: float | None = None
    handle: Any = None  # the engine's native event (torch.cuda.Event on CUDA)


class Span(NamedTuple):
    """One op on the timeline (seconds since the engine's origin). A named tuple: a simulated decode appends one per
    op, millions a sweep, and a tuple is built in a third of a frozen dataclass's time."""

    stream: str
    label: str
    start: float
    end: float
    bytes_copied: float = 0.0


@dataclass
class Stall:
    """Time a stream sat idle waiting on another stream's event (compute waiting on a copy, say)."""

    stream: str
    waited_on: str
    seconds: float


@dataclass
class Timeline:
    spans: list[Span] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)

    def stall_seconds(self, stream: str = COMPUTE, waited_on: str | None = None) -> float:
        return sum(s.seconds for s in self.stalls
                   if s.stream == stream and (waited_on is None or s.waited_on == waited_on))

    def busy_seconds(self, stream: str) -> float:
        return sum(s.end - s.start for s in self.spans if s.stream == stream)


#: how a runtime hands its kernels to the device, as the simulator prices the host's time per kernel: `eager` (a
#: framework's work per op: the profile's host.dispatch_us), `native` (a compiled runtime launching each kernel itself:
#: the launch call alone, the profile's device.launch_overhead_us), `graph` (kernels replayed from a captured graph:
#: nothing per kernel, and one native launch for the graph each time the host goes on after waiting for the device: a
#: graph per decode step, or per stretch of device work between two of the host's waits)
DISPATCH_MODES = ("eager", "native", "graph")


class Engine(abc.ABC):
    """Streams, events and ops; subclasses decide what time is."""

    #: what the engine is, in a word ("sim", "live" on the wall clock, "cuda"); never branched on by a system.
    kind: str = ""

    def __init__(self) -> None:
        self.timeline = Timeline()

    @property
    @abc.abstractmethod
    def device(self) -> str:
        """The torch device the numerics run on ("cpu" for the simulator)."""

    @abc.abstractmethod
    def launch(self, stream: str, op: Op) -> Any:
        """Enqueue `op` on `stream`; returns what `op.fn` returned (on CUDA, tensors still being computed)."""

    @abc.abstractmethod
    def record(self, stream: str) -> Event:
        """An event that completes when the work launched so far on `stream` completes."""

    @abc.abstractmethod
    def wait(self, stream: str, event: Event) -> None:
        """Later ops on `stream` start after `event`."""

    @abc.abstractmethod
    def synchronize(self, event: Event | None = None) -> float:
        """Block the host until `event` (or all work) completes; returns the time then, seconds since origin."""

    @abc.abstractmethod
    def now(self) -> float:
        """The host thread's current time, seconds since origin."""

    def policy(self, label: str) -> None:
        """The host thread does the runtime's own work at one target MoE layer (reading its routing, choosing copies,
        updating the cache): a simulator prices it; an engine that measures has spent it on the clock it reads."""
        return None

    def join(self, event: Event) -> float:
        """The host thread goes on once `event` has, reading no device result: work the host thread ran itself (an
        op on the host stream that the thread computes, as a compiled runtime's CPU backend does). An engine that
        runs host work when it is launched has already waited; returns the host's time."""
        return self.now()

    def runtime_dispatch(self, mode: str) -> None:
        """How the running system's runtime hands kernels to the device (`DISPATCH_MODES`): a simulator prices its
        host's time per kernel by it; an engine that measures has spent that time on the clock it reads."""
        if mode not in DISPATCH_MODES:
            raise ValueError(f"unknown dispatch {mode!r}; one of {', '.join(DISPATCH_MODES)}")

    def compute_scope(self):
        """A context in which work the caller launches itself (the live model's own modules, between the executor's
        ops) goes where the compute stream's ops go: on CUDA the compute stream, elsewhere nothing to set."""
        return contextlib.nullcontext()

    def start(self) -> None:
        """Time zero of the run is now (after untimed set-up such as placing resident experts); nothing may have been
        launched yet."""
        if self.timeline.spans:
            raise RuntimeError("Engine.start() after ops were launched")

    def event_time(self, event: Event) -> float:
        """When `event` completed, seconds since origin (on CUDA this waits for it)."""
        return event.time

    def landed(self, event: Event) -> float | None:
        """When `event` completed, if it has by the host's `now()`; None while it is pending. Never waits: a host that
        asks whether a copy has landed goes on with its work either way."""
        done = self.event_time(event)
        return done if done <= self.now() else None

    def finish(self) -> Timeline:
        """Wait for all work and return the complete timeline."""
        self.synchronize()
        return self.timeline


def check_stream(stream: str) -> None:
    if stream not in STREAMS:
        raise ValueError(f"unknown stream {stream!r}; streams: {', '.join(STREAMS)}")
