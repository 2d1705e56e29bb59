"""The draft model: the target itself with its routed experts replaced by quantized ones, everything else shared.

`load_draft` builds a second module tree over the target: every module on the path from the root to each MoE block's
`experts` is shallow-copied (so the target keeps its own experts), the `experts` are replaced by `QuantizedExperts`, and
every other module is the target's own object. Attention, routers, norms, embeddings and shared experts are therefore
the target's tensors, not copies (tests check `data_ptr`). The quantized experts compute with weights dequantized from
the stored codes once at load, so the draft's numerics are exactly those of the quantized weights. With `packed` (the
live engine's draft) each linear keeps its stored codes and dequantizes them on every call, as GPTQModel's torch
kernel does: no dense copy of the draft is held, and the values it computes with are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from specter.errors import SpecterError
from specter.models.adapter import MoEModel
from specter.models.experts import Activation, module_ffn
from specter.models.integrity import first_nonfinite, model_hash
from specter.models.trees import experts_path, with_replaced
from specter.quant.meta import DraftMeta
from specter.quant.packing import PackedLinear, dequantize
from specter.quant.quantize import PROJECTIONS


class DequantizedLinear(torch.nn.Module):
    """A linear whose weight [out, in] was dequantized from a draft; `packed_bytes` is its stored size."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed_bytes: int) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        self.packed_bytes = packed_bytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)


class PackedQuantLinear(torch.nn.Module):
    """A draft linear that keeps its GPTQ codes and dequantizes them on every call (the weight it computes with is
    `dequantize`'s, bit for bit the `DequantizedLinear`'s); `packed_bytes` is its stored size."""

    def __init__(self, packed: PackedLinear, bias: torch.Tensor | None, dtype: torch.dtype, packed_bytes: int) -> None:
        super().__init__()
        for name, tensor in packed.tensors().items():
            self.register_buffer(name, tensor)
        self.register_buffer("bias", bias)
        self.bits, self.dtype = packed.bits, dtype
        self.packed_bytes = packed_bytes

    def _packed(self) -> PackedLinear:
        return PackedLinear(self.qweight, self.qzeros, self.scales, self.g_idx, self.bits)

    def dequantize_weight(self) -> torch.Tensor:
        """The weight [in, out], as GPTQModel's quantized linears return it."""
        return dequantize(self._packed(), self.dtype).T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, dequantize(self._packed(), self.dtype), self.bias)


class QuantizedExpert(torch.nn.Module):
    def __init__(self, gate_proj, up_proj, down_proj) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj


class QuantizedExperts(torch.nn.Module):
    """Drop-in for a stock experts module: forward(hidden [T, H], top_k_index [T, k], top_k_weights [T, k])."""

    def __init__(self, experts: list[QuantizedExpert], activation: Activation, interleaved: bool) -> None:
        super().__init__()
        for e, mod in enumerate(experts):
            self.add_module(str(e), mod)
        self.num_experts = len(experts)
        self.activation = activation
        self.interleaved = interleaved

    def __getitem__(self, e: int) -> QuantizedExpert:
        return getattr(self, str(int(e)))

    def __len__(self) -> int:
        return self.num_experts

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                routes: list[list[int]] | None = None):
        """The routed experts' weighted sum; `routes` (`top_k_index` as the host has read it already): each expert's
        tokens are gathered by indices built on the host, so that on a GPU the host never waits for the device here
        (else they come from the device's `unique` and `where`, a wait for each). Both give the same indices in the
        same order, so the same result."""
        out = torch.zeros_like(hidden_states)
        gathers = (_gathers(routes, hidden_states.device) if routes is not None else
                   ((e, *torch.where(top_k_index == e)) for e in top_k_index.unique().tolist()))
        for e, token_idx, slot in gathers:
            y = module_ffn(hidden_states[token_idx], getattr(self, str(e)), self.activation, self.interleaved)
            out.index_add_(0, token_idx, (y * top_k_weights[token_idx, slot, None]).to(out.dtype))
        return out


def _gathers(routes: list[list[int]], device: torch.device) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """(expert, its tokens, the slot each chose it in) for every routed expert in ascending order, tokens ascending:
    what `torch.where(top_k_index == expert)` gives, built on the host and copied to `device` in one transfer
    (from page-locked memory without waiting, on a GPU)."""
    pairs: dict[int, list[tuple[int, int]]] = {}
    for t, row in enumerate(routes):
        for j, e in enumerate(row):
            pairs.setdefault(e, []).append((t, j))
    order = sorted(pairs)
    flat = torch.tensor([p for e in order for p in pairs[e]], dtype=torch.long).reshape(-1, 2).T
    if device.type != "cpu":
        flat = flat.pin_memory().to(device, non_blocking=True)
    out, start = [], 0
    for e in order:
        n = len(pairs[e])
        out.append((e, flat[0, start:start + n], flat[1, start:start + n]))
        start += n
    return out


@dataclass
class Draft:
    """A loaded draft: its module tree (sharing the target's), the adapter over it, and its sidecar."""

    model: torch.nn.Module
    moe: MoEModel
    meta: DraftMeta
    path: Path | None = None  # the draft directory

    @property
    def quantized_bytes_per_expert(self) -> int:
        return self.meta.quantized_bytes_per_expert


def load_draft(target: MoEModel, draft_dir: str | Path, check_hash: bool = True,
               target_hash: str | None = None, packed: bool = False) -> Draft:
    """The draft in `draft_dir` over the loaded `target`; refused if it was made from another model.
    `target_hash`: the target's model hash where the caller has computed it already. `packed`: every linear keeps
    its codes and dequantizes on each call (`PackedQuantLinear`) instead of holding a dense weight."""
    meta = DraftMeta.read(draft_dir)
    if check_hash:
        if target.path is None:
            raise SpecterError("the target was not loaded from a directory, so the draft's source cannot be checked")
        actual = target_hash or model_hash(target.path)
        if actual != meta.source_hash:
            raise SpecterError(
                f"draft {str(draft_dir)!r} was made from {meta.source_model} (hash {meta.source_hash[:12]}), "
                f"not from {str(target.path)!r} (hash {actual[:12]}); quantize this model with `specter quantize`"
            )
    dtype = next(target.model.parameters()).dtype
    device = next(target.model.parameters()).device
    stored = read_packed(target, draft_dir, meta)
    replacements = {}
    for layer in target.moe_layers:
        experts = []
        for e in range(layer.num_experts):
            projs = {}
            for proj, (p, bias) in stored[layer.layer_index, e].items():
                stored_bytes = p.nbytes() + (0 if bias is None else bias.numel() * bias.element_size())
                bias = None if bias is None else bias.to(device=device, dtype=dtype)
                if packed:
                    projs[proj] = PackedQuantLinear(
                        PackedLinear(*(t.to(device) for t in p.tensors().values()), bits=p.bits), bias, dtype,
                        stored_bytes)
                else:
                    projs[proj] = DequantizedLinear(dequantize(p, dtype).to(device), bias, stored_bytes)
            experts.append(QuantizedExpert(**projs))
        replacements[experts_path(target, layer)] = QuantizedExperts(experts, layer.activation,
                                                                     interleaved=layer.spec.gpt_oss_layout)
    model = with_replaced(target.model, replacements)
    return Draft(model=model, moe=MoEModel(model), meta=meta, path=Path(draft_dir))


def read_packed(target: MoEModel, draft_dir: str | Path, meta: DraftMeta | None = None
                ) -> dict[tuple[int, int], dict[str, tuple[PackedLinear, torch.Tensor | None]]]:
    """The draft's stored experts as packed: {(layer, expert): {projection: (PackedLinear, bias or None)}}."""
    meta = meta or DraftMeta.read(draft_dir)
    path = Path(draft_dir) / "experts.safetensors"
    if path.exists() and not path.is_file():  # safetensors' own open of a pipe waits for a writer, deaf to signals
        raise SpecterError(f"draft {draft_dir}'s experts.safetensors is not a regular file (a pipe, a device or a "
                           "directory); quantize the draft again")
    tensors: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    except FileNotFoundError:
        raise SpecterError(f"draft {draft_dir} has no experts.safetensors; quantize the draft again") from None
    except Exception as exc:  # safetensors raises its own error types for truncated or corrupt files
        raise SpecterError(f"cannot read {path} ({type(exc).__name__}: {exc}); the file is damaged, "
                           "quantize the draft again") from None
    out = {}
    for layer in target.moe_layers:
        for e in range(layer.num_experts):
            projs = {}
            shapes = {n: w.shape for n, (w, _) in layer.defused_projections(e).items()}
            for proj in PROJECTIONS:
                key = f"layers.{layer.layer_index}.experts.{e}.{proj}"
                try:
                    parts = [tensors[f"{key}.{n}"] for n in ("qweight", "qzeros", "scales", "g_idx")]
                except KeyError:
                    raise SpecterError(f"draft {draft_dir} lacks {key}; quantize the draft again") from None
                _check_packed(draft_dir, key, parts, shapes[proj], meta)
                bad = first_nonfinite([("scales", parts[2]), ("bias", tensors.get(f"{key}.bias"))])
                if bad is not None:
                    raise SpecterError(f"draft {draft_dir}: {key}.{bad} holds NaN or infinite values; the draft is "
                                       "damaged, quantize it again")
                projs[proj] = (PackedLinear(*parts, bits=meta.bits), tensors.get(f"{key}.bias"))
            out[layer.layer_index, e] = projs
    meta.check_experts(draft_dir)  # after the checks that name what is wrong: then, whether it is this draft's
    return out


def _check_packed(draft_dir, key: str, parts: list[torch.Tensor], weight_shape, meta: DraftMeta) -> None:
    """The stored codes of one linear have the shapes its target weight [out, in], the bits and the group imply."""
    out_f, in_f = weight_shape
    groups = -(-in_f // meta.group_size)
    want = {"qweight": (in_f * meta.bits // 32, out_f), "qzeros": (groups, out_f * meta.bits // 32),
            "scales": (groups, out_f), "g_idx": (in_f,)}
    for name, tensor in zip(("qweight", "qzeros", "scales", "g_idx"), parts):
        if tuple(tensor.shape) != want[name]:
            raise SpecterError(
                f"draft {draft_dir}: {key}.{name} has shape {tuple(tensor.shape)}, but the target's [{out_f}, {in_f}] "
                f"weight at {meta.bits} bits, group {meta.group_size} needs {want[name]}; the draft was made for "
                "another model or with other settings, quantize it again")
