"""The GPTQ (v1 checkpoint) storage format for one quantized linear, read and written in plain torch.

For a linear of `in` inputs and `out` outputs at `bits` bits with groups of `g` inputs:
- `qweight` int32 [in * bits / 32, out]: codes along the input axis as one little-endian bit stream per output column;
- `qzeros` int32 [in / g, out * bits / 32]: zero points minus one (the v1 quirk) as a bit stream along the output axis;
- `scales` float16 [in / g, out];
- `g_idx` int32 [in]: the group of each input.
w[o, i] = scales[g_idx[i], o] * (q[i, o] - (qzeros[g_idx[i], o] + 1)). The bit stream layout covers 2, 3, 4 and 8 bits
(3-bit codes straddle int32 words, as GPTQ packs them). GPTQModel writes this format; our round-to-nearest drafts use it
too, so one reader serves both methods.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_BITS = (2, 3, 4, 8)


@dataclass(frozen=True)
class PackedLinear:
    qweight: torch.Tensor  # int32 [in * bits / 32, out]
    qzeros: torch.Tensor  # int32 [in / g, out * bits / 32]
    scales: torch.Tensor  # float16 [in / g, out]
    g_idx: torch.Tensor  # int32 [in]
    bits: int

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"qweight": self.qweight, "qzeros": self.qzeros, "scales": self.scales, "g_idx": self.g_idx}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


def packed_bytes(in_features: int, out_features: int, bits: int, group_size: int) -> int:
    """Bytes of one linear in the v1 format: int32 codes and zeros at `bits`, float16 scales, int32 group index."""
    groups = -(-in_features // group_size)
    return (in_features * out_features * bits // 8 + groups * out_features * bits // 8 + groups * out_features * 2
            + in_features * 4)


def _pack_stream(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes int64 [n, cols] with values < 2**bits -> int32 [n * bits / 32, cols], a little-endian bit stream per
    column."""
    n, cols = codes.shape
    if (n * bits) % 32:
        raise ValueError(f"{n} codes of {bits} bits do not fill whole 32-bit words")
    shifts = torch.arange(bits, dtype=torch.int64)
    bit_matrix = (codes[:, None, :] >> shifts[None, :, None]) & 1  # [n, bits, cols]
    stream = bit_matrix.reshape(n * bits // 32, 32, cols)  # [words, 32, cols]
    weights = (1 << torch.arange(32, dtype=torch.int64))[None, :, None]
    words = (stream * weights).sum(dim=1)  # [words, cols], unsigned 32-bit values
    return (words - ((words >> 31) << 32)).to(torch.int32)  # reinterpret as signed int32


def _unpack_stream(words: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """int32 [n * bits / 32, cols] -> int64 codes [n, cols]."""
    if 32 % bits == 0:  # whole codes per word (2, 4, 8 bits): code k of word j is its bits [k * bits, (k + 1) * bits)
        shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)
        codes = (words[:, None, :] >> shifts[None, :, None]) & ((1 << bits) - 1)  # [words, 32 / bits, cols]
        return codes.reshape(n, -1).to(torch.int64)
    w = words.to(torch.int64) & 0xFFFFFFFF
    bit_matrix = (w[:, None, :] >> torch.arange(32, dtype=torch.int64, device=w.device)[None, :, None]) & 1
    bit_matrix = bit_matrix.reshape(n, bits, -1)  # [words, 32, cols] as [n, bits, cols]
    return (bit_matrix << torch.arange(bits, dtype=torch.int64, device=w.device)[None, :, None]).sum(dim=1)


def pack(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int, bits: int) -> PackedLinear:
    """codes int [out, in], zeros int [out, in / g] (true zero points), scales [out, in / g] -> the v1 format."""
    out_features, in_features = codes.shape
    qweight = _pack_stream(codes.T.to(torch.int64), bits)  # stream along the input axis
    # zeros are packed along the output axis: the stream runs over out, one column per group
    qzeros = _pack_stream(((zeros.to(torch.int64) - 1) & ((1 << bits) - 1)), bits).T.contiguous()  # [in/g, out*b/32]
    g_idx = (torch.arange(in_features) // group_size).to(torch.int32)
    return PackedLinear(qweight, qzeros, scales.T.contiguous().to(torch.float16), g_idx, bits)


def unpack(p: PackedLinear) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The v1 format -> (codes [out, in], zeros [out, groups] as true zero points, scales [out, groups] float32)."""
    in_features = p.g_idx.numel()
    codes = _unpack_stream(p.qweight, p.bits, in_features).T  # [out, in]
    out_features = codes.shape[0]
    zeros = (_unpack_stream(p.qzeros.T.contiguous(), p.bits, out_features) + 1)  # [out, groups]
    return codes, zeros, p.scales.T.float()


def dequantize(p: PackedLinear, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight [out, in] the quantized linear computes with."""
    codes, zeros, scales = unpack(p)
    g = p.g_idx.long()
    return (scales[:, g] * (codes - zeros[:, g]).float()).to(dtype)


def dequantize_peak_bytes(p: PackedLinear, dtype: torch.dtype = torch.float32) -> int:
    """The most bytes `dequantize(p, dtype)`'s tensors hold at once: what a linear that dequantizes its codes on every
    call allocates beside its packed codes (about 29 bytes a weight at 4 bits). Measured, not estimated: `dequantize`
    runs on the meta device (sizes, no data) under a dispatch mode that counts each new storage until it is freed."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Held(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live = self.peak = 0
            self.storages: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                storage = t.untyped_storage() if isinstance(t, torch.Tensor) else None
                if storage is None or storage._cdata in self.storages or not storage.nbytes():
                    continue  # a view of a storage already counted
                key, n = storage._cdata, storage.nbytes()
                self.storages.add(key)
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._freed, key, n)
            return out

        def _freed(self, key: int, n: int) -> None:
            self.live -= n
            self.storages.discard(key)

    on_meta = PackedLinear(**{name: t.to("meta") for name, t in p.tensors().items()}, bits=p.bits)
    held = Held()
    with held:
        dequantize(on_meta, dtype)
    return held.peak
