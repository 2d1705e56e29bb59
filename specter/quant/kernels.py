"""The live draft's fused INT4 kernel on the CPU: PyTorch's `aten._weight_int4pack_mm_for_cpu`, as GPTQModel's
`TorchFusedLinear` (its fused torch kernel for the CPU) runs it.

The draft's GPTQ codes are repacked once into the kernel's layout (`_convert_weight_to_int4pack_for_cpu`), each
group's scale stored beside a zero offset of 0 (GPTQ's symmetric zero point, 8, is the kernel's own), and activations
cross in bfloat16, the kernel's vectorized path (GPTQModel casts float32 inputs the same way and the output back; at
float32 the same kernel takes a scalar path some 60 times slower on this suite's shapes). The weights it computes with
are the draft's, exactly; its products are rounded to bfloat16, so a draft computed this way may propose other tokens
than the dense draft at a near-tie (the target's verification keeps the output the target's either way).

The kernel is called from PyTorch itself rather than through GPTQModel's module: importing GPTQModel patches
transformers' MoE classes process-wide (which is why `specter.quant.gptq_worker` runs it in a child process).
`tests/test_kernels.py` holds this module's outputs equal to `TorchFusedLinear`'s, bit for bit, in such a process.
"""

from __future__ import annotations

import torch

from specter.quant.packing import PackedLinear

#: group sizes the CPU kernel takes
FUSED_GROUPS = (32, 64, 128, 256)
SYMMETRIC_ZEROS = 0x77777777  # a v1 qzeros word of 4-bit zero points 8 (stored minus one, eight to a word)
FUSED_KERNEL = ("fused INT4: aten._weight_int4pack_mm_for_cpu (GPTQModel's TorchFusedLinear on the CPU), bfloat16 "
                "activations")
PACKED_KERNEL = "the draft's codes dequantized on every call (the simulator's draft weights, bit for bit)"


def fused_unsupported(p: PackedLinear, device: torch.device) -> str | None:
    """Why the fused kernel cannot compute the packed linear `p` on `device`, or None."""
    if device.type != "cpu":
        return f"no fused INT4 kernel is wired on {device.type}"
    if p.bits != 4:
        return f"{p.bits}-bit codes (the kernel takes 4)"
    in_features, groups = p.g_idx.numel(), p.scales.shape[0]
    size = in_features // groups
    if size * groups != in_features or size not in FUSED_GROUPS:
        return (f"groups of {in_features / groups:g} inputs (the kernel takes "
                f"{', '.join(map(str, FUSED_GROUPS))})")
    if not torch.equal(p.g_idx.long(), torch.arange(in_features) // size):
        return "groups in another order than the inputs' (act-order)"
    if not bool((p.qzeros == SYMMETRIC_ZEROS).all()):
        return "zero points other than GPTQ's symmetric 8"
    return None


class FusedInt4Linear(torch.nn.Module):
    """A draft linear on the CPU's fused INT4 kernel (see the module docstring); `packed_bytes` is its stored size."""

    def __init__(self, p: PackedLinear, bias: torch.Tensor | None, packed_bytes: int,
                 workspace: dict | None = None) -> None:
        """`workspace`: buffers for the codes on their way into the kernel's layout, kept by shape across the linears
        one caller converts (a new transient of four bytes a weight for each linear leaves the host's allocator with
        holes it does not return: about one such transient a linear stayed resident, 164 MB over a 151 MB model's
        96 linears)."""
        super().__init__()
        reason = fused_unsupported(p, p.qweight.device)
        if reason is not None:
            raise ValueError(f"the fused INT4 kernel cannot compute this linear: {reason}")
        self.in_features, self.out_features = p.g_idx.numel(), p.qweight.shape[1]
        self.group_size = self.in_features // p.scales.shape[0]
        workspace = {} if workspace is None else workspace
        shape = (self.in_features, self.out_features)
        if shape not in workspace:
            workspace[shape] = (torch.empty(shape[0] // 8, 8, shape[1], dtype=torch.int32),
                                torch.empty(shape[1], shape[0], dtype=torch.int32))
        codes, transposed = workspace[shape]  # [in / 8, 8, out] then [out, in], int32
        torch.bitwise_right_shift(p.qweight.unsqueeze(1), torch.arange(0, 32, 4, dtype=torch.int32).view(1, -1, 1),
                                  out=codes)
        codes.bitwise_and_(15)
        transposed.copy_(codes.view(shape).T)
        self.register_buffer("weight_int4", torch.ops.aten._convert_weight_to_int4pack_for_cpu(transposed, 1))
        scales = p.scales.to(torch.bfloat16)  # [groups, out]
        self.register_buffer("scales_and_zeros", torch.stack([scales, torch.zeros_like(scales)], -1))  # [g, out, 2]
        self.register_buffer("bias", bias)
        self.packed_bytes = packed_bytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.weight_int4, self.group_size,
                                                        self.scales_and_zeros)
        if self.bias is not None:
            y.add_(self.bias)  # before the cast back, as GPTQModel adds it
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def with_fused_kernels(experts: torch.nn.Module, device: torch.device,
                       workspace: dict | None = None) -> tuple[torch.nn.Module, str]:
    """A draft layer's quantized experts (`QuantizedExperts` of `PackedQuantLinear`s) with every linear the fused kernel
    computes on `device` replaced by a `FusedInt4Linear` (the others shared with `experts`, which is left as it is),
    and which kernel each runs on, in words. `workspace`: see `FusedInt4Linear` (one for every layer a caller
    converts)."""
    from specter.quant.draft import PackedQuantLinear, QuantizedExpert, QuantizedExperts

    kept: dict[str, int] = {}
    fused, modules = 0, []
    workspace = {} if workspace is None else workspace
    for e in range(len(experts)):
        projections = {}
        for name, linear in experts[e].named_children():
            reason = fused_unsupported(linear._packed(), device) if isinstance(linear, PackedQuantLinear) else \
                "it holds dense weights"
            if reason is None:
                projections[name] = FusedInt4Linear(linear._packed(), linear.bias, linear.packed_bytes, workspace)
                fused += 1
            else:
                projections[name] = linear
                kept[reason] = kept.get(reason, 0) + 1
        modules.append(QuantizedExpert(**projections))
    out = QuantizedExperts(modules, experts.activation, experts.interleaved)
    if not kept:
        return out, FUSED_KERNEL
    rest = "; ".join(f"{n} for {reason}" for reason, n in kept.items())
    return out, (f"{FUSED_KERNEL} for {fused} of {fused + sum(kept.values())} linears; " if fused else "") + \
        f"{PACKED_KERNEL}: {rest}"
