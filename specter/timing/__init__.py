"""Time: the Engine interface (streams, events, ops), the simulated, CUDA and wall-clock engines, cost model, profiles,
bounds."""

from specter.registry import Registry
from specter.timing.cost import CostModel
from specter.timing.engine import COMPUTE, H2D, HOST, Engine, Event, Op, Timeline
from specter.timing.hardware import HardwareProfile, load_profile, preset_names
from specter.timing.sim import SimEngine

__all__ = [
    "COMPUTE",
    "ENGINES",
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


def _live(profile: HardwareProfile, device: str, streams: dict | None) -> Engine:
    """The live engine on `device`: the wall clock on the CPU as device, CUDA's streams and events on a GPU."""
    if device == "cuda":
        from specter.timing.cuda import CudaEngine

        return CudaEngine(between_ops=True, streams=streams)
    from specter.timing.wall import WallEngine

    return WallEngine(device)


#: the engines by name: (profile, device, streams) -> Engine
ENGINES = Registry("engine", {"sim": lambda profile, device, streams: SimEngine(profile), "live": _live})


def make_engine(kind: str, profile: HardwareProfile, device: str = "cpu", streams: dict | None = None) -> Engine:
    """The engine named `kind` (of `ENGINES`); the profile drives the simulator and labels the live engine's runs.
    The live engine's `device`: the wall clock on the CPU as device, CUDA's streams and events on a GPU (`streams`:
    the runtime's own pair, made once, `timing.cuda.make_streams`)."""
    return ENGINES[kind](profile, device, streams)
