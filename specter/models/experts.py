"""One expert's weights, however the checkpoint stores them, and the pure function that computes it.

The offloading runtime moves `ExpertWeights` between host and device and calls `expert_ffn` on whatever copy is
resident, so the expert's arithmetic is defined here once for every architecture:

- SwiGLU-style experts (Mixtral, Qwen, PhiMoE, OLMoE, DeepSeek): down(act(gate x) * up x).
- GPT-OSS experts: gate and up clamped at `limit`, glu = gate * sigmoid(alpha * gate), out = down((up + 1) * glu), with
  biases on every projection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Activation:
    """How an expert combines its gate and up projections.

    kind "glu": act(gate) * up with `act` the config's `hidden_act` (silu for every stock class).
    kind "gpt_oss": GPT-OSS's clamped, alpha-scaled GLU.
    """

    kind: str
    act_fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    alpha: float = 0.0
    limit: float = 0.0

    def __call__(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if self.kind == "glu":
            return self.act_fn(gate) * up
        if self.kind == "gpt_oss":
            gate = gate.clamp(min=None, max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
            return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
        raise ValueError(f"unknown activation kind {self.kind!r}")


@dataclass(frozen=True)
class ExpertWeights:
    """One routed expert in the canonical [out, in] layout of `F.linear`.

    Tensors may be views into a fused parameter (no copy); `contiguous()` makes owned copies for transfer.
    """

    gate: torch.Tensor  # [I, H]
    up: torch.Tensor  # [I, H]
    down: torch.Tensor  # [H, I]
    activation: Activation
    gate_bias: torch.Tensor | None = None  # [I]
    up_bias: torch.Tensor | None = None  # [I]
    down_bias: torch.Tensor | None = None  # [H]

    def tensors(self) -> dict[str, torch.Tensor]:
        """The weight tensors by name (biases only where present)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                out[f.name] = value
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def to(self, device=None, dtype=None, non_blocking: bool = False) -> ExpertWeights:
        moved = {k: v.to(device=device, dtype=dtype, non_blocking=non_blocking) for k, v in self.tensors().items()}
        return ExpertWeights(activation=self.activation, **moved)

    def contiguous(self) -> ExpertWeights:
        return ExpertWeights(activation=self.activation, **{k: v.contiguous() for k, v in self.tensors().items()})


def expert_ffn(x: torch.Tensor, w: ExpertWeights) -> torch.Tensor:
    """One expert on tokens `x` [T, H] -> [T, H]."""
    gate = F.linear(x, w.gate, w.gate_bias)  # [T, I]
    up = F.linear(x, w.up, w.up_bias)  # [T, I]
    return F.linear(w.activation(gate, up), w.down, w.down_bias)  # [T, H]


def module_ffn(x: torch.Tensor, expert: torch.nn.Module, activation: Activation,
               interleaved: bool = False) -> torch.Tensor:
    """One expert stored as three linear modules (defused or GPTQ-quantized): the modules' own kernels do the matmuls.

    `interleaved`: GPT-OSS's defuser splits the interleaved gate_up projection into halves (not into gate and up), so
    `gate_proj` and `up_proj` are the two halves of [g0, u0, g1, u1, ...]; re-join them and de-interleave.
    """
    gate, up = expert.gate_proj(x), expert.up_proj(x)  # [T, I] each
    if interleaved:
        gate_up = torch.cat([gate, up], dim=-1)  # [T, 2I]
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    return expert.down_proj(activation(gate, up))


def expert_param_count(hidden: int, intermediate: int, biased: bool) -> int:
    """Parameters of one expert: three [I, H] matrices, plus biases 2I + H where the class has them."""
    return 3 * hidden * intermediate + ((2 * intermediate + hidden) if biased else 0)
