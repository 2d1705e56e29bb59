"""The cost model: how long an op takes on a hardware profile.

- device or host compute = launches x launch overhead + max(FLOPs / peak, bytes read / memory bandwidth) (a roofline);
- host-to-device copy = latency + bytes / bandwidth(size, pinned or pageable).

Every simulated time in the suite comes from these two lines and the profile's numbers; nothing here knows which system
asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from specter.timing.engine import COMPUTE, H2D, HOST, Op
from specter.timing.hardware import HardwareProfile


@dataclass(frozen=True)
class CostModel:
    profile: HardwareProfile

    def compute_seconds(self, flops: float, bytes_read: float, launches: int = 1) -> float:
        p = self.profile
        return launches * p.device_launch_overhead + max(flops / p.device_peak_flops,
                                                         bytes_read / p.device_memory_bandwidth)

    def host_seconds(self, flops: float, bytes_read: float, launches: int = 1) -> float:
        p = self.profile
        return launches * p.host_launch_overhead + max(flops / p.host_peak_flops, bytes_read / p.host_memory_bandwidth)

    def copy_seconds(self, nbytes: float, pinned: bool = True) -> float:
        if nbytes <= 0:
            return 0.0
        return self.profile.h2d_latency + nbytes / self.profile.h2d_bandwidth(int(nbytes), pinned)

    def seconds(self, op: Op, stream: str = COMPUTE) -> float:
        """How long `op` takes on `stream` (the device's compute stream unless said otherwise)."""
        if stream == COMPUTE:
            return self.compute_seconds(op.flops, op.bytes_read, op.launches)
        if stream == H2D:
            return self.copy_seconds(op.bytes_copied, op.pinned)
        if stream == HOST:
            return self.host_seconds(op.flops, op.bytes_read, op.launches)
        raise ValueError(f"unknown stream {stream!r}")

    def total(self, ops, stream: str = COMPUTE) -> float:
        """Seconds of `ops` run one after another on `stream`."""
        return sum(self.seconds(op, stream) for op in ops)


def linear_flops(tokens: int, in_features: int, out_features: int) -> float:
    """FLOPs of `tokens` rows through an [out, in] matrix: one multiply and one add per weight per token."""
    return 2.0 * tokens * in_features * out_features
