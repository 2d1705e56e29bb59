"""The live draft's fused INT4 kernels: PyTorch's own int4 weight-only matmuls, which read the packed codes.

- On the CPU, `aten._weight_int4pack_mm_for_cpu`, as GPTQModel's `TorchFusedLinear` (its fused torch kernel for the
  CPU) runs it; the codes are repacked once into its layout (`_convert_weight_to_int4pack_for_cpu`, from int32 codes).
- On a CUDA GPU, `aten._weight_int4pack_mm`, PyTorch's tinygemm kernel (torchao's int4 weight-only layout runs the
  same op); the codes are packed two to a byte, the even input in the high nibble (PyTorch's own tests of the op pack
  them so, `test/test_linalg.py`), and converted once on the device (`_convert_weight_to_int4pack`) when the runtime
  has moved them there (`FusedInt4Linear.ready`). It is chosen over GPTQModel's Marlin and Triton kernels because it
  ships with PyTorch: GPTQModel ships as source, its CUDA kernels build with its extension, and importing it patches
  transformers' MoE classes process-wide. Like Marlin it needs compute capability 8.0 or newer.

Both take each group's scale beside a zero offset as bfloat16 pairs, w = (q - 8) * scale + zero: GPTQ's symmetric
zero point, 8, is the kernels' own, so every zero offset is 0 and the weights are the draft's codes times its scales
rounded to bfloat16. Activations cross in bfloat16, the kernels' input type (GPTQModel casts float32 inputs the same way
and the output back; at float32 the CPU kernel takes a scalar path some 60 times slower on this suite's shapes). Its
products are rounded to bfloat16, so a draft computed this way may propose other tokens than the dense draft at a
near-tie (the target's verification keeps the output the target's either way). On a GPU a linear neither kernel can
compute is refused rather than dequantized on every call, unless the run asks for that (`--live-draft-kernel packed`).

The kernel is called from PyTorch itself rather than through GPTQModel's module: importing GPTQModel patches
transformers' MoE classes process-wide (which is why `specter.quant.gptq_worker` runs it in a child process).
`tests/test_kernels.py` holds this module's outputs equal to `TorchFusedLinear`'s, bit for bit, in such a process.
"""

from __future__ import annotations

import torch

from specter.errors import SpecterError
from specter.quant.packing import PackedLinear

#: group sizes the kernels take
FUSED_GROUPS = (32, 64, 128, 256)
SYMMETRIC_ZEROS = 0x77777777  # a v1 qzeros word of 4-bit zero points 8 (stored minus one, eight to a word)
FUSED_KERNELS = {
    "cpu": ("fused INT4: aten._weight_int4pack_mm_for_cpu (GPTQModel's TorchFusedLinear on the CPU), bfloat16 "
            "activations"),
    "cuda": "fused INT4: aten._weight_int4pack_mm (PyTorch's tinygemm kernel), bfloat16 activations"}
PACKED_KERNEL = "the draft's codes dequantized on every call (the simulator's draft weights, bit for bit)"
CUDA_CAPABILITY = (8, 0)  # the tinygemm kernel's tensor-core instructions


def inner_k_tiles(in_features: int) -> int:
    """The tinygemm layout's tiles along the input axis: 2, 4 or 8 of 16 inputs each, the most that divide it (a
    group of 32 to 256 inputs dividing it, 2 always do)."""
    return next(t for t in (8, 4, 2) if in_features % (16 * t) == 0)


def fused_unsupported(p: PackedLinear, device: torch.device) -> str | None:
    """Why the fused kernel cannot compute the packed linear `p` on `device`, or None."""
    if device.type not in FUSED_KERNELS:
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
    # the GPU kernel's other shapes (outputs a multiple of 8, inputs of 32) hold for every 4-bit linear of the v1
    # format with such groups: its zero points fill whole words along the outputs
    if device.type == "cuda" and torch.cuda.is_available():
        capability = torch.cuda.get_device_capability(device)
        if capability < CUDA_CAPABILITY:
            return (f"compute capability {capability[0]}.{capability[1]} (the GPU kernel takes "
                    f"{CUDA_CAPABILITY[0]}.{CUDA_CAPABILITY[1]} or newer)")
    return None


def nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes int32 [out, in] -> uint8 [out, in / 2], two to a byte, the even input in the high nibble: the
    layout the GPU kernel's conversion takes."""
    return (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)


def codes_of_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """`nibbles`' inverse: uint8 [out, in / 2] -> int32 codes [out, in]."""
    wide = packed.to(torch.int32)
    return torch.stack([wide >> 4, wide & 15], -1).reshape(packed.shape[0], -1)


class FusedInt4Linear(torch.nn.Module):
    """A draft linear on a fused INT4 kernel (see the module docstring); `packed_bytes` is its stored size."""

    def __init__(self, p: PackedLinear, bias: torch.Tensor | None, packed_bytes: int,
                 workspace: dict | None = None, device: torch.device | None = None) -> None:
        """`device`: where the linear will compute (the CPU's kernel or a GPU's; default: where `p` lies). The codes
        are read where `p` lies; for a GPU they are kept as `nibbles` until the runtime has moved the module there and
        calls `ready`. `workspace`: buffers for the codes on their way into the kernel's layout, kept by shape across
        the linears one caller converts (a new transient of four bytes a weight for each linear leaves the host's
        allocator with holes it does not return: about one such transient a linear stayed resident, 164 MB over a
        151 MB model's 96 linears)."""
        super().__init__()
        device = p.qweight.device if device is None else torch.device(device)
        reason = fused_unsupported(p, device)
        if reason is not None:
            raise ValueError(f"the fused INT4 kernel cannot compute this linear: {reason}")
        self.kernel = device.type
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
        if self.kernel == "cpu":
            self.register_buffer("weight_int4", torch.ops.aten._convert_weight_to_int4pack_for_cpu(transposed, 1))
        else:  # the GPU's layout is made on the GPU (`ready`); the nibbles hold as many bytes
            self.register_buffer("weight_int4", nibbles(transposed))
        self.converted = self.kernel == "cpu"
        scales = p.scales.to(torch.bfloat16)  # [groups, out]
        self.register_buffer("scales_and_zeros", torch.stack([scales, torch.zeros_like(scales)], -1))  # [g, out, 2]
        self.register_buffer("bias", bias)
        self.packed_bytes = packed_bytes

    def ready(self) -> None:
        """Convert the nibbles into the GPU kernel's layout where they now lie (once, after the runtime has moved the
        module to its GPU; nothing to do on the CPU)."""
        if not self.converted:
            if self.weight_int4.device.type != "cuda":
                raise RuntimeError(f"a GPU's INT4 linear readied on {self.weight_int4.device}; please report this")
            self.weight_int4 = torch.ops.aten._convert_weight_to_int4pack(self.weight_int4,
                                                                          inner_k_tiles(self.in_features))
            self.converted = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if self.kernel == "cpu":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.weight_int4, self.group_size,
                                                            self.scales_and_zeros)
        elif self.converted:
            y = torch.ops.aten._weight_int4pack_mm(rows, self.weight_int4, self.group_size, self.scales_and_zeros)
        else:
            raise RuntimeError("a GPU's INT4 linear computed before its codes were converted on the GPU; please "
                               "report this")
        if self.bias is not None:
            y.add_(self.bias)  # before the cast back, as GPTQModel adds it
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def with_fused_kernels(experts: torch.nn.Module, device: torch.device,
                       workspace: dict | None = None) -> tuple[torch.nn.Module, str]:
    """A draft layer's quantized experts (`QuantizedExperts` of `PackedQuantLinear`s) with every linear the fused kernel
    computes on `device` replaced by a `FusedInt4Linear` (the others shared with `experts`, which is left as it is),
    and which kernel each runs on, in words. On the CPU a linear the kernel cannot compute keeps its module (its codes
    dequantized on every call, as the record says); on a GPU it is refused in one line. `workspace`: see
    `FusedInt4Linear` (one for every layer a caller converts)."""
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
                projections[name] = FusedInt4Linear(linear._packed(), linear.bias, linear.packed_bytes, workspace,
                                                    device)
                fused += 1
            else:
                projections[name] = linear
                kept[reason] = kept.get(reason, 0) + 1
        modules.append(QuantizedExpert(**projections))
    rest = "; ".join(f"{n} for {reason}" for reason, n in kept.items())
    if kept and device.type == "cuda":
        raise SpecterError(f"{sum(kept.values())} of the draft's {fused + sum(kept.values())} expert linears in a "
                           f"layer cannot run on the GPU's fused INT4 kernel ({rest}); pass --live-draft-kernel packed "
                           "to dequantize their codes on every call instead (slower), or quantize a draft the kernel "
                           "takes (--bits 4, --group-size 32 to 256)")
    out = QuantizedExperts(modules, experts.activation, experts.interleaved)
    kernel = FUSED_KERNELS.get(device.type, "")
    if not kept:
        return out, kernel
    return out, (f"{kernel} for {fused} of {fused + sum(kept.values())} linears; " if fused else "") + \
        f"{PACKED_KERNEL}: {rest}"
