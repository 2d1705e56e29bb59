"""The host ExpertStore: every routed expert of the target in host memory, one flat FP16 row per expert.

Offloaded experts live here and cross the link from here. Each MoE layer is one `[experts, numel]` tensor whose row e is
expert e's tensors (gate, up, down, then the biases where the class has them) laid end to end, so a copy to the device
is one contiguous transfer, as in the artifact and in Mixtral-Offloading. On a CUDA machine the store is pinned
(page-locked) where it lies, with `cudaHostRegister`, which is what lets a copy run asynchronously on the copy stream at
full link bandwidth: nothing is copied, and nothing is rounded up (`Tensor.pin_memory` copies into PyTorch's pinned
allocator, which rounds each block up to a power of two).
`ExpertLayout` turns any such row, in the store or in a device slot, back into `ExpertWeights` views without copying.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch

from specter.errors import SpecterError
from specter.models.adapter import MoEModel
from specter.models.experts import Activation, ExpertWeights
from specter.models.streaming import fused_views, point_at_rows

WEIGHT_DTYPE = torch.float16  # the paper's targets run in FP16/BF16 (offload/work.py costs them at 2 bytes)
HOST_MEMORY_ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered


CUDART_UNLOADING = 4  # cudaErrorCudartUnloading: the process is ending, and CUDA has let go of everything


def _cudart():
    return torch.cuda.cudart()


def clear_cuda_error() -> None:
    """Reset the CUDA runtime's last error after a runtime call that failed and was handled. PyTorch checks
    `cudaGetLastError` after every kernel launch, so an error left set (a refused `cudaHostRegister`) would be raised
    by the next, unrelated kernel. PyTorch binds no `cudaGetLastError`: it is called in the runtime library PyTorch
    has loaded (found by name, never loaded anew)."""
    import ctypes
    import os

    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"):
        try:
            library = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        library.cudaGetLastError()
        return


def pin_in_place(t: torch.Tensor) -> int:
    """Page-lock the host memory of the contiguous tensor `t` where it lies (`cudaHostRegister`, default flags);
    returns its address for `unpin`. One SpecterError where CUDA refuses: too much locked memory, or memory page-locked
    already (a store pins its rows once, and a session keeps one store a model and dtype: other code registered it)."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("pin_in_place takes a contiguous host tensor")
    address, nbytes = t.data_ptr(), t.numel() * t.element_size()
    err = int(_cudart().cudaHostRegister(address, nbytes, 0))
    if err:
        clear_cuda_error()
        if err == HOST_MEMORY_ALREADY_REGISTERED:
            raise SpecterError(f"cudaHostRegister of {nbytes / 1e9:.2f} GB of experts: that memory is page-locked "
                               "already (CUDA error 712), by code other than this store; run the suite in a process "
                               "of its own, with one session a model")
        raise SpecterError(f"cudaHostRegister of {nbytes / 1e9:.2f} GB of experts failed (CUDA error {err}); the host "
                           "cannot page-lock that much memory: raise the locked-memory limit (ulimit -l) or run with "
                           "fewer experts on the host")
    return address


def unpin(addresses: list[int]) -> None:
    """Unregister what `pin_in_place` registered. An unregistration CUDA refuses is said in one warning (the memory
    stays page-locked until the process ends); none is said while the process ends (CUDA has let go of everything
    then)."""
    from specter.progress import log

    failed = []
    for address in addresses:
        err = int(_cudart().cudaHostUnregister(address))
        if err:
            clear_cuda_error()
            if err != CUDART_UNLOADING:
                failed.append(f"{address:#x} (CUDA error {err})")
    if failed:
        log.warning("warning: cudaHostUnregister refused %d of the expert store's layers (%s); that memory stays "
                    "page-locked until the process ends", len(failed), failed[0])


@dataclass(frozen=True)
class ExpertLayout:
    """Where each of an expert's tensors sits in its flat row: {name: (offset, shape)}."""

    parts: tuple[tuple[str, int, tuple[int, ...]], ...]
    numel: int
    activation: Activation

    @classmethod
    def of(cls, weights: ExpertWeights) -> ExpertLayout:
        parts, offset = [], 0
        for name, t in weights.tensors().items():
            parts.append((name, offset, tuple(t.shape)))
            offset += t.numel()
        return cls(tuple(parts), offset, weights.activation)

    def flatten(self, weights: ExpertWeights, dtype: torch.dtype = WEIGHT_DTYPE) -> torch.Tensor:
        tensors = weights.tensors()
        return torch.cat([tensors[name].detach().reshape(-1).to(dtype) for name, _, _ in self.parts])

    def views(self, row: torch.Tensor) -> ExpertWeights:
        """The expert whose flat row is `row`, as views into it."""
        tensors = {name: row[offset : offset + math.prod(shape)].view(shape) for name, offset, shape in self.parts}
        return ExpertWeights(activation=self.activation, **tensors)


class ExpertStore:
    """The target's routed experts on the host, at `dtype` (`WEIGHT_DTYPE` unless given; the live engine keeps the
    model's own, so that its slots compute what the model computes); `pin` page-locks them in place (needs CUDA).

    `share`: once a layer's rows are built, the model's own fused expert parameters become views into them (one host
    copy of every expert instead of two; the old parameters are freed layer by layer, so building the store costs
    one layer's experts beyond the model). A layer whose storage the rows cannot view (GPT-OSS's interleaved
    gate_up, per-expert modules, another dtype) keeps its own copy; `shared_layers` names the
    layers that share. Where the loader has laid a layer's experts out as such rows already
    (`specter.models.streaming`), the store adopts them as they are, and nothing is copied."""

    def __init__(self, target: MoEModel, pin: bool = False, dtype: torch.dtype = WEIGHT_DTYPE,
                 share: bool = False) -> None:
        first = target.moe_layers[0]
        self.layout = ExpertLayout.of(first.expert_weights(0))
        self.layers: dict[int, torch.Tensor] = {}
        self.shared_layers: list[int] = []
        for layer in target.moe_layers:
            rows = self._rows_of(layer, dtype) if share else None
            if rows is not None:  # the loader laid the layer out as rows already (`specter.models.streaming`)
                self.layers[layer.layer_index] = rows
                self.shared_layers.append(layer.layer_index)
                continue
            rows = torch.empty(layer.num_experts, self.layout.numel, dtype=dtype)
            for e in range(layer.num_experts):
                rows[e] = self.layout.flatten(layer.expert_weights(e), dtype)
            self.layers[layer.layer_index] = rows
            if share and self._share(layer, rows):
                self.shared_layers.append(layer.layer_index)
        self.pinned = False
        self.dtype = dtype
        self.expert_bytes = self.layout.numel * torch.finfo(dtype).bits // 8
        if pin:
            self.pin()

    def pin(self) -> None:
        """Page-lock every layer's rows where they lie (`cudaHostRegister`; needs CUDA), once; they are unregistered
        when the store goes."""
        if self.pinned:
            return
        registered = []
        try:
            for rows in self.layers.values():
                registered.append(pin_in_place(rows))
        except BaseException:
            unpin(registered)  # a store is pinned whole or not at all
            raise
        self._unpin = weakref.finalize(self, unpin, registered)
        self.pinned = True

    def _rows_of(self, layer, dtype: torch.dtype) -> torch.Tensor | None:
        """The layer's experts as rows [E, numel] in this store's layout, where its fused gate_up_proj and down_proj
        are already views into one such tensor (no copy); None otherwise."""
        parts = {name: offset for name, offset, _ in self.layout.parts}
        ex = layer.experts
        if not layer.fused or layer.spec.gpt_oss_layout or set(parts) != {"gate", "up", "down"}:
            return None
        gate_up, down = ex.gate_up_proj, ex.down_proj
        storage = gate_up.untyped_storage()
        numel, n = self.layout.numel, layer.num_experts
        start = gate_up.storage_offset() - parts["gate"]
        if (gate_up.dtype != dtype or down.dtype != dtype or down.untyped_storage().data_ptr() != storage.data_ptr()
                or start != 0 or storage.nbytes() != n * numel * gate_up.element_size()
                or gate_up.stride() != (numel, *gate_up.stride()[1:]) or down.stride()[0] != numel
                or down.storage_offset() != parts["down"] or parts["up"] != parts["gate"] + gate_up[0].numel() // 2
                or not gate_up[0].is_contiguous() or not down[0].is_contiguous()):
            return None
        return torch.empty(0, dtype=dtype).set_(storage, 0, (n, numel), (numel, 1))

    def _share(self, layer, rows: torch.Tensor) -> bool:
        """Point `layer`'s fused gate_up_proj [E, 2I, H] and down_proj [E, H, I] at their parts of `rows` (row e lays
        gate, up and down end to end, so expert e's gate_up and down are each one contiguous span of it)."""
        ex = layer.experts
        parts = {name: offset for name, offset, _ in self.layout.parts}
        if not layer.fused or layer.spec.gpt_oss_layout or set(parts) != {"gate", "up", "down"}:
            return False
        gate_up, down = ex.gate_up_proj, ex.down_proj
        if (gate_up.dtype != rows.dtype or down.dtype != rows.dtype or not gate_up.is_contiguous()
                or not down.is_contiguous() or parts["up"] != parts["gate"] + gate_up[0].numel() // 2):
            return False
        if parts["gate"] != 0 or parts["down"] != gate_up[0].numel():
            return False
        for name, view in fused_views(rows, tuple(gate_up.shape), tuple(down.shape)).items():
            if not torch.equal(view, getattr(ex, name)):
                raise RuntimeError(f"L{layer.layer_index}: the store's rows do not hold {name} where its layout "
                                   "says; please report this")
        point_at_rows(layer, rows)
        return True

    def row(self, layer: int, expert: int) -> torch.Tensor:
        return self.layers[layer][expert]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.layers.values())
