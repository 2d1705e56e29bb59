"""The cost model: how long an op takes on a hardware profile.

- device or host compute = launches x launch overhead + max(FLOPs / peak, bytes read / memory bandwidth) (a roofline);
- host-to-device copy = latency + bytes / bandwidth(size, pinned or pageable).

A run with quantized target experts (`--expert-bits`, Mixtral-Offloading's HQQ experts) copies and reads each routed
expert at its stored size (`hqq_expert_bytes`); its numerics stay the proxy's (its records say so).

Every simulated op's device time comes from these two lines and the profile's numbers (the host's dispatch, reads and
policy work are the engine's: `specter.timing.sim`); nothing here knows which system asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specter.timing.engine import COMPUTE, H2D, HOST, Op
from specter.timing.hardware import HardwareProfile


@dataclass(frozen=True)
class CostModel:
    profile: HardwareProfile
    # copy_seconds by (bytes, pinned): a run copies a few sizes millions of times, each an interpolation of the curve
    _copies: dict = field(default_factory=dict, init=False, repr=False, compare=False)

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
        seconds = self._copies.get((nbytes, pinned))
        if seconds is None:
            seconds = self._copies[nbytes, pinned] = (self.profile.h2d_latency
                                                      + nbytes / self.profile.h2d_bandwidth(int(nbytes), pinned))
        return seconds

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

    def dispatched(self, ops, stream: str = COMPUTE) -> float:
        """Seconds of `ops` run one after another on `stream` with nothing else between them, the host dispatching
        each kernel (`host.dispatch_us`): each op takes the longer of its own time and its kernels' dispatch, or, on a
        device that is the host itself, both one after the other (as `SimEngine` places them)."""
        p = self.profile
        total = 0.0
        for op in ops:
            own, host = self.seconds(op, stream), max(1, op.launches) * p.host_dispatch
            total += own + host if p.device_synchronous else max(own, host)
        return total


def linear_flops(tokens: int, in_features: int, out_features: int) -> float:
    """FLOPs of `tokens` rows through an [out, in] matrix: one multiply and one add per weight per token."""
    return 2.0 * tokens * in_features * out_features


#: HQQ as Mixtral-Offloading configures its experts (`src/build_model.py`, `get_default_ffn_quant_config`, and the demo
#: notebook's `ffn_config`): weights in groups of 16 along the output axis, their scales and zeros quantized too
#: (`quant_scale=True, quant_zero=True`, HQQ's `hqq_base_quant_config` at mobiusml/hqq@37502be, the commit its
#: requirements pin): scales to 8 bits in groups of 128 with an FP16 scale and zero per group, zeros to 8 bits with one
#: FP16 scale and zero per tensor. Upstream ships only the 2-bit configuration; 3 and 4 bits take the same groups here.
HQQ_GROUP_SIZE = 16
HQQ_META_GROUP = 128
HQQ_BITS = (2, 3, 4)


def hqq_linear_bytes(out_features: int, in_features: int, bits: int, group_size: int = HQQ_GROUP_SIZE) -> int:
    """Bytes of one [out, in] linear as Mixtral-Offloading stores an HQQ expert's projection (the tensors its
    `MixtralExpertWrapper` packs into one storage: W_q, scale_q, zero_q and their FP16 meta-scales and zeros; no bias).
    W_q is repacked to the weight's shape (`HQQLinearTritonSavable.repack`) with HQQ's packing: 2 bits, four codes a
    byte along the rows (`2bit_u8`); 3 bits, ten codes an int32 (`3bit_32`, rows padded to a multiple of 10); 4 bits,
    two a byte (`4bit_u8`)."""
    if bits not in HQQ_BITS:
        raise ValueError(f"HQQ experts have 2, 3 or 4 bits, got {bits}")
    n = out_features * in_features
    if bits == 2:
        weight = -(-out_features // 4) * in_features
    elif bits == 3:
        weight = -(-out_features // 10) * in_features * 4
    else:
        weight = -(-out_features // 2) * in_features
    groups = -(-n // group_size)  # one scale and one zero per group
    meta_groups = -(-groups // HQQ_META_GROUP)
    scale = groups + 2 * 2 * meta_groups  # 8-bit codes, FP16 scale and zero per group of 128
    zero = groups + 2 * 2  # 8-bit codes, one FP16 scale and zero
    return weight + scale + zero


def hqq_expert_bytes(shapes: tuple[tuple[int, int], ...], bits: int, group_size: int = HQQ_GROUP_SIZE) -> int:
    """One routed expert's stored bytes at `bits` (its projections' (out, in) shapes, `ModelWork.expert_shapes`)."""
    return sum(hqq_linear_bytes(out_f, in_f, bits, group_size) for out_f, in_f in shapes)


#: GGUF types a llama.cpp-format expert is stored in, by the name `--expert-bits` takes
GGUF_FORMATS = ("q4_k_m",)


def _gguf_linear_bytes(out_features: int, in_features: int, kind: str) -> int:
    """Bytes of one [out, in] linear stored as GGML type `kind` ("Q4_K", "Q6_K"), from the block sizes `gguf` states
    (`GGML_QUANT_SIZES`). A row whose length is no multiple of the type's block takes llama.cpp's fallback
    (`src/llama-quant.cpp`: Q4_K to Q5_0, Q6_K to Q8_0, blocks of 32; F16 where even that does not divide)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    kind = GGMLQuantizationType[kind]
    for candidate in (kind, {"Q4_K": GGMLQuantizationType.Q5_0, "Q6_K": GGMLQuantizationType.Q8_0}[kind.name],
                      GGMLQuantizationType.F16):
        weights, size = GGML_QUANT_SIZES[candidate]
        if in_features % weights == 0:
            return out_features * (in_features // weights) * size
    raise AssertionError("unreachable: F16's block is one weight")


def uses_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's `use_more_bits` (`src/llama-quant.cpp`): the first and last eighth of the layers, and every third
    layer between, take a larger type in a _M mix (integer division, as the C code)."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def gguf_expert_bytes(shapes: tuple[tuple[int, int], ...], moe_layers: tuple[int, ...], layers: int,
                      kind: str = "q4_k_m") -> int:
    """One routed expert's stored bytes as GGUF Q4_K_M stores it, over the MoE layers' mean: gate and up at Q4_K, down
    at Q6_K in the layers `uses_more_bits` names (`src/llama-quant.cpp`, ffn_down, whose test also matches the
    experts' `ffn_down_exps`) and Q4_K elsewhere. A token reads one expert's mean bytes per routed expert and layer,
    summed over every layer exactly; one layer's own expert is off by the Q6_K share."""
    if kind not in GGUF_FORMATS:
        raise ValueError(f"GGUF experts are stored as one of {', '.join(GGUF_FORMATS)}, got {kind!r}")
    *ins, down = shapes  # gate and up, then down
    base = sum(_gguf_linear_bytes(o, i, "Q4_K") for o, i in ins)
    per_layer = [base + _gguf_linear_bytes(*down, "Q6_K" if uses_more_bits(layer, layers) else "Q4_K")
                 for layer in moe_layers]
    return round(sum(per_layer) / len(per_layer))
