"""The device side of a run: expert slots, resident weights, and the kernels behind the executor's ops.

With the simulated engine an op carries its costs only. A `DeviceRuntime` gives each op the device work it stands for,
so that the CUDA engine measures real kernels and real copies:

- a copy of expert e into slot s of layer l: `slots[l][s].copy_(store[l][e], non_blocking=True)` from the pinned
  `ExpertStore`, on the copy stream; a slot is a row of one `[slots, numel]` FP16 buffer per MoE layer, allocated once;
- a write-back of slot s (Mixtral-Offloading's swap): the slot's row copied, non-blocking, into a pinned host row kept
  for it (the store itself is never written: its rows are the experts' weights);
- a routed expert on m tokens: the expert's FFN (`expert_ffn`, the class's own activation) on the weights in its slot
  or staging buffer;
- the attention block of a layer over n tokens after c cached ones: one GEMM of n tokens by each 2-D non-routed weight
  of the layer (projections, router, shared experts, a dense MLP), in FP16 on the device, and scaled-dot-product
  attention of n queries over c positions of the layer's KV buffer;
- the LM head: n tokens by the [V, H] head;
- a draft expert on m tokens: its GPTQ-packed codes unpacked and scaled on the device in plain torch, then multiplied
  (no fused INT4 kernel: the paper's kernels are faster, so measured draft steps are an upper estimate); 3-bit codes,
  which straddle 32-bit words, are kept unpacked as one byte each;
- a host expert (Fiddler): the expert on the CPU with the target's own weights, its activations copied down and back
  through a pinned buffer.

Which tokens commit comes from the forward service (the recorded numerics, as in every run); the device runs the same
work at the same shapes on a fixed, seeded input, which is what a kernel's time depends on. Everything is allocated up
front, or (staging rows beyond the default) on first use, which the CUDA runner's untimed warm-up run covers.
`check=True` makes every expert kernel assert that the buffer it reads holds the expert it was asked for (tests run this
on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from specter.errors import SpecterError
from specter.models.adapter import MoEModel
from specter.models.experts import expert_ffn, module_ffn
from specter.offload.memory import STAGING_BUFFERS
from specter.offload.store import WEIGHT_DTYPE, ExpertStore
from specter.offload.work import ModelWork
from specter.quant.packing import PackedLinear, unpack

DRAFT_KERNEL = ("torch unpack-and-matmul of the GPTQ-packed codes, one expert after another (no fused INT4 kernel: "
                "measured draft steps are an upper estimate of the paper's)")


class PackedLinearKernel(torch.nn.Module):
    """A GPTQ-packed linear on the device: codes unpacked, zero-shifted and scaled per call, then one matmul."""

    def __init__(self, p: PackedLinear, bias: torch.Tensor | None, device: torch.device) -> None:
        super().__init__()
        codes, zeros, scales = unpack(p)  # [out, in], [out, groups], [out, groups]
        self.bits = p.bits
        self.per_word = 32 // p.bits if 32 % p.bits == 0 else 0
        if self.per_word:  # the stored int32 words, unpacked on every call
            self.qweight = p.qweight.to(device)
            self.shifts = torch.arange(0, 32, p.bits, dtype=torch.int32, device=device).view(1, -1, 1)
        else:  # 3-bit codes straddle words: kept as one byte each
            self.codes = codes.T.contiguous().to(torch.uint8).to(device)
        self.g_idx = p.g_idx.long().to(device)
        self.zeros = zeros.T.contiguous().to(WEIGHT_DTYPE).to(device)  # [groups, out]
        self.scales = scales.T.contiguous().to(WEIGHT_DTYPE).to(device)
        self.bias = None if bias is None else bias.to(device=device, dtype=WEIGHT_DTYPE)

    @staticmethod
    def device_bytes(out_features: int, in_features: int, bits: int, group_size: int, biased: bool) -> int:
        """What one such kernel holds on the device: the int32 words (or a byte a code at 3 bits), the int64 group
        index, zeros and scales at WEIGHT_DTYPE, the bias."""
        item = torch.empty(0, dtype=WEIGHT_DTYPE).element_size()
        groups = -(-in_features // group_size)
        codes = in_features * out_features * bits // 8 if 32 % bits == 0 else in_features * out_features
        return codes + in_features * 8 + 2 * groups * out_features * item + (out_features * item if biased else 0)

    def weight_t(self) -> torch.Tensor:
        """The dequantized weight, transposed: [in, out]."""
        if self.per_word:
            words = self.qweight.unsqueeze(1)  # [words, 1, out]
            codes = ((words >> self.shifts) & ((1 << self.bits) - 1)).reshape(-1, words.shape[-1])
        else:
            codes = self.codes
        return (codes.to(WEIGHT_DTYPE) - self.zeros[self.g_idx]) * self.scales[self.g_idx]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight_t()
        return y if self.bias is None else y + self.bias


class _DraftExpert(torch.nn.Module):
    def __init__(self, projections: dict[str, PackedLinearKernel]) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (projections[n] for n in ("gate_proj", "up_proj", "down_proj"))


class ExpertSlots:
    """Expert slots per MoE layer, staging buffers and the copies into and out of them: the part of a device runtime
    that every engine with real buffers shares (`DeviceRuntime` here, `specter.offload.live.LiveRuntime`). A slot is a
    row of one `[slots, numel]` buffer per MoE layer at the store's dtype, allocated once. `check=True` makes every
    expert kernel assert that the buffer it reads holds the expert it was asked for."""

    def __init__(self, work: ModelWork, store: ExpertStore, slots_per_layer: int, device: str,
                 check: bool = False) -> None:
        self.device = torch.device(device)
        self.work, self.store, self.check = work, store, check
        dev, dt, numel = self.device, store.dtype, store.layout.numel
        self.slots = {layer: torch.zeros(slots_per_layer, numel, dtype=dt, device=dev) for layer in work.moe_layers}
        self.slot_holds: dict[tuple[int, int], int] = {}  # (layer, slot) -> expert, kept for `check`
        self.staging = torch.zeros(STAGING_BUFFERS, numel, dtype=dt, device=dev)
        self.staging_holds: dict[int, tuple[int, int]] = {}
        self.host_back = torch.zeros(numel, dtype=dt, pin_memory=self.device.type == "cuda")  # where write-backs land

    def _holds(self, layer: int, index: int, expert: int, when: str = "") -> None:
        if self.check and self.slot_holds.get((layer, index)) != expert:
            raise AssertionError(f"L{layer} slot {index} holds expert {self.slot_holds.get((layer, index))}, "
                                 f"not {expert}{when}")

    def _staged(self, index: int, layer: int, expert: int) -> None:
        if self.check and self.staging_holds.get(index) != (layer, expert):
            raise AssertionError(f"staging {index} holds {self.staging_holds.get(index)}, not L{layer} e{expert}")

    def copy_to_slot(self, layer: int, expert: int, index: int) -> Callable[[], None]:
        def fn() -> None:
            self.slots[layer][index].copy_(self.store.row(layer, expert), non_blocking=True)
            self.slot_holds[layer, index] = expert
        return fn

    def copy_to_host(self, layer: int, expert: int, index: int) -> Callable[[], None]:
        """Copy slot `index` of `layer` (holding `expert`) back to the host."""
        def fn() -> None:
            self._holds(layer, index, expert, " at its write-back")
            self.host_back.copy_(self.slots[layer][index], non_blocking=True)
        return fn

    def staging_rows(self, count: int) -> None:
        """At least `count` staging buffers (a system that streams a whole layer through needs one per expert)."""
        if count > self.staging.shape[0]:
            self.staging = torch.zeros(count, self.store.layout.numel, dtype=self.store.dtype, device=self.device)

    def copy_to_staging(self, layer: int, expert: int, index: int) -> Callable[[], None]:
        def fn() -> None:
            self.staging[index].copy_(self.store.row(layer, expert), non_blocking=True)
            self.staging_holds[index] = (layer, expert)
        return fn

    def place(self, layer: int, expert: int, index: int) -> None:
        """Put `expert` in slot `index` before the run starts (resident and statically placed experts)."""
        self.slots[layer][index].copy_(self.store.row(layer, expert))
        self.slot_holds[layer, index] = expert


def require_device_memory(device: torch.device, parts: dict[str, int]) -> None:
    """Refuse, before anything is allocated, a run whose device buffers (`parts`: {what: bytes}) exceed the device's
    free memory (`torch.cuda.mem_get_info`), in one line that names each part; nothing is checked off CUDA."""
    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    need = sum(parts.values())
    if need > free:
        def size(n: float) -> str:
            return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"

        listed = ", ".join(f"{what} {size(n)}" for what, n in sorted(parts.items(), key=lambda p: -p[1]))
        raise SpecterError(f"the run needs {size(need)} on {device} ({listed}), and {size(free)} of its "
                           f"{size(total)} are free; lower --resident-per-layer or the prompt and output lengths, or "
                           "free the device")


class DeviceRuntime(ExpertSlots):
    """Device buffers and kernels for one run: `slots_per_layer` expert slots per MoE layer, passes of at most
    `max_tokens` tokens over at most `max_context` positions."""

    def __init__(self, target: MoEModel, work: ModelWork, store: ExpertStore, slots_per_layer: int, device: str,
                 max_tokens: int, max_context: int, draft=None, seed: int = 0, check: bool = False) -> None:
        require_device_memory(torch.device(device), self.device_bytes(
            target, work, store, slots_per_layer, max_tokens, max_context, draft))
        super().__init__(work, store, slots_per_layer, device, check)
        dev, dt = self.device, WEIGHT_DTYPE
        self.layer_weights: dict[int, list[torch.Tensor]] = {}
        width = work.hidden
        for i, layer in enumerate(target.decoder_layers):
            routed = {id(p) for p in layer.mlp.experts.parameters()} if hasattr(layer.mlp, "experts") else set()
            self.layer_weights[i] = [p.detach().to(device=dev, dtype=dt) for p in layer.parameters()
                                     if p.ndim == 2 and id(p) not in routed]
            width = max([width] + [w.shape[1] for w in self.layer_weights[i]])
        self.head = target.model.lm_head.weight.detach().to(device=dev, dtype=dt)
        gen = torch.Generator().manual_seed(seed)
        self.x = (torch.randn(max_tokens, width, generator=gen) * 0.02).to(device=dev, dtype=dt)
        self.q = (torch.randn(1, work.heads, max_tokens, work.qk_dim, generator=gen) * 0.02).to(device=dev, dtype=dt)
        self.kv = {i: ((torch.randn(1, work.kv_heads, max_context, work.qk_dim, generator=gen) * 0.02).to(dev, dt),
                       (torch.randn(1, work.kv_heads, max_context, work.v_dim, generator=gen) * 0.02).to(dev, dt))
                   for i in work.layers}
        self.draft_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None  # a draft's own KV, on first copy
        self.max_tokens, self.max_context = max_tokens, max_context
        pin = self.device.type == "cuda"
        self.host_act = torch.zeros(max_tokens, work.hidden, dtype=dt, pin_memory=pin)
        self.act_in = torch.zeros(max_tokens, work.hidden, dtype=dt, device=dev)
        self.draft_experts: dict[tuple[int, int], _DraftExpert] = {}
        if draft is not None:
            from specter.quant.draft import read_packed

            for key, projs in read_packed(target, draft.path, draft.meta).items():
                kernels = {n: PackedLinearKernel(p, b, dev) for n, (p, b) in projs.items()}
                self.draft_experts[key] = _DraftExpert(kernels)
        self._moe = {m.layer_index: m for m in target.moe_layers}

    @staticmethod
    def device_bytes(target: MoEModel, work: ModelWork, store: ExpertStore, slots_per_layer: int, max_tokens: int,
                     max_context: int, draft=None) -> dict[str, int]:
        """What the runtime allocates on the device, by part (bytes), before it allocates any of it."""
        item = torch.empty(0, dtype=WEIGHT_DTYPE).element_size()
        expert = store.layout.numel * torch.empty(0, dtype=store.dtype).element_size()
        weights = 0
        for layer in target.decoder_layers:
            routed = {id(p) for p in layer.mlp.experts.parameters()} if hasattr(layer.mlp, "experts") else set()
            weights += sum(p.numel() for p in layer.parameters() if p.ndim == 2 and id(p) not in routed) * item
        parts = {"expert slots": len(work.moe_layers) * slots_per_layer * expert,
                 "staging buffers": STAGING_BUFFERS * expert,
                 "non-expert weights": weights + target.model.lm_head.weight.numel() * item,
                 "KV cache": len(work.layers) * work.kv_heads * max_context * (work.qk_dim + work.v_dim) * item}
        if draft is not None:
            biased = target.moe_layers[0].spec.gpt_oss_layout
            per_expert = sum(PackedLinearKernel.device_bytes(out_f, in_f, draft.meta.bits, draft.meta.group_size,
                                                             biased) for out_f, in_f in work.expert_shapes)
            parts["draft experts"] = len(work.moe_layers) * work.experts_per_layer * per_expert
        return parts

    def _tokens(self, n: int, what: str) -> None:
        if n > self.max_tokens:
            raise ValueError(f"{what}: {n} tokens in one pass, but the runtime was sized for {self.max_tokens}")

    # copies ------------------------------------------------------------------------------------------------------
    def copy_kv(self, start: int, tokens: int) -> Callable[[], None]:
        """Copy the target's KV of `tokens` positions from `start` into the draft's own cache (allocated here, when
        the first copy is scheduled, outside any timed op)."""
        if start + tokens > self.max_context:
            raise ValueError(f"KV positions {start}..{start + tokens - 1} exceed the runtime's {self.max_context}")
        if self.draft_kv is None:
            self.draft_kv = {i: (torch.empty_like(k), torch.empty_like(v)) for i, (k, v) in self.kv.items()}

        def fn() -> None:
            for i, (k, v) in self.kv.items():
                own_k, own_v = self.draft_kv[i]
                own_k[:, :, start : start + tokens].copy_(k[:, :, start : start + tokens])
                own_v[:, :, start : start + tokens].copy_(v[:, :, start : start + tokens])
        return fn

    # compute -----------------------------------------------------------------------------------------------------
    def expert_in_slot(self, layer: int, expert: int, index: int, tokens: int) -> Callable[[], torch.Tensor]:
        def fn() -> torch.Tensor:
            self._holds(layer, index, expert)
            return self._expert(self.slots[layer][index], tokens)
        return fn

    def expert_in_staging(self, layer: int, expert: int, index: int, tokens: int) -> Callable[[], torch.Tensor]:
        def fn() -> torch.Tensor:
            self._staged(index, layer, expert)
            return self._expert(self.staging[index], tokens)
        return fn

    def _expert(self, row: torch.Tensor, tokens: int) -> torch.Tensor:
        self._tokens(tokens, "expert")
        return expert_ffn(self.x[:tokens, : self.work.hidden], self.store.layout.views(row))

    def draft_layer(self, layer: int, tokens: list[tuple[int, int]]) -> Callable[[], None]:
        """A draft step's routed experts of one layer, (expert, tokens) each, run back to back under one op (the
        fused kernel's work; see DRAFT_KERNEL)."""
        kernels = [self.draft_expert(layer, e, m) for e, m in tokens]

        def fn() -> None:
            for kernel in kernels:
                kernel()
        return fn

    def attention(self, layer: int, tokens: int, context: int) -> Callable[[], torch.Tensor]:
        def fn() -> torch.Tensor:
            self._tokens(tokens, "attention")
            if context > self.max_context:
                raise ValueError(f"context {context} exceeds the runtime's {self.max_context} positions")
            for w in self.layer_weights[layer]:
                self.x[:tokens, : w.shape[1]] @ w.T
            k, v = self.kv[layer]
            return F.scaled_dot_product_attention(self.q[:, :, :tokens], k[:, :, :context], v[:, :, :context],
                                                  enable_gqa=self.work.heads != self.work.kv_heads)
        return fn

    def lm_head(self, tokens: int) -> Callable[[], torch.Tensor]:
        def fn() -> torch.Tensor:
            self._tokens(tokens, "head")
            return self.x[:tokens, : self.work.hidden] @ self.head.T
        return fn

    def draft_expert(self, layer: int, expert: int, tokens: int) -> Callable[[], torch.Tensor]:
        mod, moe = self.draft_experts[layer, expert], self._moe[layer]

        def fn() -> torch.Tensor:
            self._tokens(tokens, "draft expert")
            return module_ffn(self.x[:tokens, : self.work.hidden], mod, moe.activation,
                              interleaved=moe.spec.gpt_oss_layout)
        return fn

    # host experts (Fiddler) -------------------------------------------------------------------------------------
    def activations_to_host(self, tokens: int) -> Callable[[], None]:
        return lambda: self.host_act[:tokens].copy_(self.x[:tokens, : self.work.hidden], non_blocking=True)

    def host_expert(self, layer: int, expert: int, tokens: int) -> Callable[[], None]:
        weights = self._moe[layer].expert_weights(expert)

        def fn() -> None:
            x = self.host_act[:tokens].to(weights.gate.dtype)
            self.host_act[:tokens].copy_(expert_ffn(x, weights))
        return fn

    def activations_to_device(self, tokens: int) -> Callable[[], None]:
        return lambda: self.act_in[:tokens].copy_(self.host_act[:tokens], non_blocking=True)
