"""Time: the Engine interface (streams, events, ops), the simulated, CUDA and wall-clock engines, cost model, profiles,
bounds."""

from specter.timing.cost import CostModel
from specter.timing.engine import COMPUTE, H2D, HOST, Engine, Event, Op, Timeline
from specter.timing.hardware import HardwareProfile, load_profile, preset_names
from specter.timing.sim import SimEngine

__all__ = [
    "COMPUTE",
    "H2D",
    "HOST",
    "CostModel",
    "Engine",
    "Event",
    "HardwareProfile",
    "Op",
    "SimEngine",
    "Timeline",
    "load_profile",
    "make_engine",
    "preset_names",
]


def make_engine(kind: str, profile: HardwareProfile, device: str = "cpu", streams: dict | None = None) -> Engine:
    """The engine named `kind` ("sim" or "live"); the profile drives the simulator and labels the live engine's runs.
    The live engine's `device`: the wall clock on the CPU as device, CUDA's streams and events on a GPU (`streams`:
    the runtime's own pair, made once, `timing.cuda.make_streams`)."""
    if kind == "sim":
        return SimEngine(profile)
    if kind == "live" and device == "cuda":
        from specter.timing.cuda import CudaEngine

        return CudaEngine(between_ops=True, streams=streams)
    if kind == "live":
        from specter.timing.wall import WallEngine

        return WallEngine(device)
    from specter.errors import SpecterError

    raise SpecterError(f"unknown engine {kind!r}; engines: sim, live")
