"""Loading a checkpoint with no second host copy of its experts: every tensor is read from the checkpoint's safetensors
files straight into the place the model keeps it.

`stream_moe_model` builds the stock transformers model with its parameters on the meta device (its buffers, such as
the rotary frequencies, are computed as usual: accelerate's `init_empty_weights(include_buffers=False)`), then reads
each tensor of the checkpoint with plain file reads into the tensor the model keeps. No file is memory-mapped, so no
page of the checkpoint counts toward the process's resident memory beside the tensors themselves.

- A non-expert tensor goes into a tensor of its own, under the name transformers' own conversion mapping gives its key
  (`get_model_conversion_mapping`; Mixtral's `block_sparse_moe` is the stock module's `mlp`).
- A routed expert's projection goes into its span of its layer's *expert rows*: one [experts, numel] tensor per MoE
  layer whose row e lays expert e's gate, up and down projections end to end (the layout of the host `ExpertStore`,
  `specter.offload.store`). The stock module's fused `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I] are strided
  views into those rows, so the model computes from them, and the store adopts them without a copy.

The host holds the checkpoint's bytes once, at the model's dtype, plus the one tensor being converted where the
checkpoint's dtype is another. A checkpoint whose experts are not stored one projection per expert in the layout the
stock conversion merges (GPT-OSS keeps them fused and quantized) raises `StreamingUnsupported` before anything is
allocated; the caller then loads it with `load_moe_model`. What `load_moe_model` refuses is refused here too, in the
same words: a config that cannot make a model, files that differ from the card, weights and config.json that
disagree (a parameter missing, a tensor with no place, another shape), NaN or infinite values.

The disk tier (`experts_on="disk"`, or `"auto"` where the checkpoint's bytes at the model's dtype exceed the memory
the system has available): each MoE layer's expert rows are a file (`layer-<i>.bin`) in a directory of the suite's
cache named by the checkpoint's hash and the dtype, memory-mapped, so the kernel pages experts in as copies read them
and can drop them again; only the non-expert tensors take anonymous memory. The first load builds the directory from
the checkpoint (atomically: a killed build leaves nothing that looks done) and checks it for NaN and infinities; a later
load checks them against the manifest the build wrote (`manifest.json`: each file's size, modification time and a
hash of sampled blocks, `tier_problem`), builds the directory again where they differ, and maps the files privately (a
write to the mapped rows never reaches the files). The build first checks that the cache is a directory it may write
in and that its file system has room for every layer file, and reserves each file's blocks before writing it, so a
full disk is one line and never a bus error. While mapped, the files are leased (`TierLeases`): another process that
opens one for writing or truncates it stops the run in one line, before it could read a page that is no longer there
(a bus error). A damaged row found while a live run decodes (NaN or overflowing logits,
`specter.offload.live`) ends the run in one line, before any record.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import init_empty_weights
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
from transformers.utils import logging as hf_logging

from specter.errors import SpecterError
from specter.models.adapter import MoEModel
from specter.models.disk_tier import (
    TierLeases,
    available_memory,
    building_dir,
    check_room,
    disk_tier_dir,
    rows_bytes,
    tier_identity,
    tier_problem,
    write_manifest,
)
from specter.models.integrity import check_card, first_nonfinite, model_hash, weight_files
from specter.models.loading import _check_loaded_all, check_shards, check_weight_dtypes, read_model_config, stored_twice
from specter.models.trees import experts_path
from specter.progress import log

SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                      "BOOL": torch.bool}
_MAX_HEADER = 100 * 2**20  # a safetensors header beyond this is a damaged file, not a model


class StreamingUnsupported(Exception):
    """The checkpoint stores its experts in a way the streaming loader does not read; load it with `load_moe_model`."""


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor of a checkpoint lies: its file, the byte span of its data, its dtype and shape."""

    file: Path
    start: int
    end: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def read_headers(path: Path) -> dict[str, TensorEntry]:
    """Every tensor of the checkpoint in `path`, from the headers of its weights files (`loading.weight_files`: the
    index's shards where it has one; no data read)."""
    files = weight_files(path)
    if not files:
        raise SpecterError(f"{str(path)!r} holds no *.safetensors weights; rebuild or re-download the checkpoint")
    entries: dict[str, TensorEntry] = {}
    for file in files:
        size = file.stat().st_size
        damaged = f"{file.name} is truncated or corrupt; rebuild or re-download the checkpoint"
        with open(file, "rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < length <= min(_MAX_HEADER, size - 8):
                raise SpecterError(f"cannot load the model in {str(path)!r}: {damaged}")
            try:
                header = json.loads(f.read(length))
            except (ValueError, RecursionError):
                raise SpecterError(f"cannot load the model in {str(path)!r}: {damaged}") from None
        base, spans = 8 + length, []
        for name, info in header.items() if isinstance(header, dict) else ():
            if name == "__metadata__":
                continue
            dtype = SAFETENSORS_DTYPES.get(info.get("dtype")) if isinstance(info, dict) else None
            if dtype is None:
                raise StreamingUnsupported(f"{file.name}: tensor {name} has dtype {info.get('dtype')!r}")
            try:
                start, end = (int(v) for v in info["data_offsets"])
                shape = tuple(int(v) for v in info["shape"])
            except (KeyError, TypeError, ValueError):
                raise SpecterError(f"cannot load the model in {str(path)!r}: {damaged}") from None
            if base + end > size or end - start != math.prod(shape) * torch.empty(0, dtype=dtype).element_size():
                raise SpecterError(f"cannot load the model in {str(path)!r}: {damaged}")
            if name in entries:
                raise stored_twice(path, name, entries[name].file.name, file.name)
            entries[name] = TensorEntry(file, base + start, base + end, dtype, shape)
            spans.append((start, end))
        # the tensors' bytes tile the data from its start to the file's end, none over another, as safetensors itself
        # requires (two tensors on the same bytes would load, each the other's values)
        ends = [0] + [end for _, end in sorted(spans)]
        if [start for start, _ in sorted(spans)] != ends[:-1] or ends[-1] != size - base:
            raise SpecterError(f"cannot load the model in {str(path)!r}: {damaged} (its tensors' byte ranges overlap "
                               "or leave gaps)")
    return entries


class _Reader:
    """Plain reads of checkpoint tensors into tensors the caller owns (no memory map)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handles: dict[Path, object] = {}

    def into(self, entry: TensorEntry, out: torch.Tensor) -> None:
        """Read `entry` into `out` (contiguous, the entry's element count), converting its dtype where they differ."""
        dst = out if out.dtype == entry.dtype else torch.empty(entry.shape, dtype=entry.dtype)
        f = self.handles.get(entry.file)
        if f is None:
            f = self.handles[entry.file] = open(entry.file, "rb")  # noqa: SIM115 - closed in close()
        f.seek(entry.start)
        want = entry.end - entry.start
        if want and f.readinto(dst.reshape(-1).view(torch.uint8).numpy()) != want:
            raise SpecterError(f"cannot load the model in {str(self.path)!r}: {entry.file.name} is truncated or "
                               "corrupt; rebuild or re-download the checkpoint")
        if dst is not out:
            out.copy_(dst.reshape(out.shape))

    def close(self) -> None:
        for f in self.handles.values():
            f.close()


def _expert_converters(converters: list[WeightConverter]) -> dict[str, tuple[str, int, re.Pattern]]:
    """{source pattern: (the fused parameter it goes into, which half of it, a regex that finds the expert index)} for
    the stock per-expert merges: `down_proj` from one projection, `gate_up_proj` from two concatenated."""
    out = {}
    for c in converters:
        ops = [type(op).__name__ for op in c.operations]
        targets = [t.rsplit(".", 1)[-1] for t in c.target_patterns]
        if len(targets) != 1 or targets[0] not in ("gate_up_proj", "down_proj"):
            continue
        halves = 2 if targets[0] == "gate_up_proj" else 1
        if ops != ["MergeModulelist", "Concatenate"][:halves] or len(c.source_patterns) != halves:
            raise StreamingUnsupported(f"experts merged by {ops} from {c.source_patterns}")
        for half, pattern in enumerate(c.source_patterns):
            regex = re.compile(re.escape(pattern).replace(r"\*", r"(\d+)") + "$")
            out[pattern] = (targets[0], half, regex)
    return out


def stream_moe_model(path: str | Path, dtype: torch.dtype, known_hash: str | None = None,
                     experts_on: str = "memory") -> MoEModel:
    """The checkpoint in `path` at `dtype`, every tensor read into its place (see the module docstring); `experts_on`:
    memory, disk (the disk tier) or auto (disk where the checkpoint exceeds the memory available)."""
    path = Path(path)
    read_model_config(path)
    check_card(path, known_hash)
    check_shards(path)
    entries = read_headers(path)
    check_weight_dtypes(path)
    item = torch.empty(0, dtype=dtype).element_size()
    need = sum(math.prod(e.shape) * item for e in entries.values())
    available = available_memory()
    disk = experts_on == "disk" or (experts_on == "auto" and available is not None and need > available)
    tier = disk_tier_dir(path, dtype, known_hash) if disk else None
    identity = tier_identity(known_hash or model_hash(path), dtype) if disk else None
    built = tier is not None and tier.is_dir()  # mapped once checked against its manifest; else built below
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, experts_implementation="eager")
    finally:
        hf_logging.set_verbosity(verbosity)
    moe = MoEModel(model)
    if any(m.spec.gpt_oss_layout or not m.fused for m in moe.moe_layers):
        raise StreamingUnsupported(f"{moe.model_type} experts are not the stock fused gate_up/down pair")
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    experts = _expert_converters(converters)
    layers = {experts_path(moe, m): m for m in moe.moe_layers}
    if built:
        problem = tier_problem(tier, {f"layer-{m.layer_index}.bin" for m in moe.moe_layers}, identity)
        if problem is not None:
            log.warning("the disk tier %s is damaged (%s); building it again from the checkpoint", tier, problem)
            built = False
    meta = model.state_dict()

    plan, unexpected, mismatched = [], [], []
    for key, entry in entries.items():
        name, pattern = rename_source_key(key, renamings, converters, model.base_model_prefix, meta)
        if pattern is None:
            if name not in meta:
                unexpected.append(key)
            elif tuple(meta[name].shape) != entry.shape:
                mismatched.append(key)
            else:
                plan.append((key, entry, name, None))
            continue
        if pattern not in experts:
            raise StreamingUnsupported(f"{key} goes into {name} by a conversion the loader does not read")
        param, half, regex = experts[pattern]
        module, _, leaf = name.rpartition(".")
        found = regex.search(key)
        if leaf != param or module not in layers or found is None:
            unexpected.append(key)
            continue
        plan.append((key, entry, name, (layers[module], int(found.group(1)), half)))

    filled: set[tuple] = set()
    assigned: set[str] = set()
    building = tier is not None and not built
    if building:
        check_room(tier, sum(rows_bytes(m, dtype) for m in moe.moe_layers))
    reader = _Reader(path)
    try:
        with contextlib.ExitStack() as stack:
            into = stack.enter_context(building_dir(tier)) if building else tier
            rows = {m.layer_index: _expert_rows(m, dtype, into, writable=building) for m in moe.moe_layers}
            for key, entry, name, expert in sorted(plan, key=lambda p: (str(p[1].file), p[1].start)):
                if expert is None:
                    _assign(model, name, meta[name], entry, reader)
                    assigned.add(name)
                    continue
                layer, e, half = expert
                span = _span(layer, name.rpartition(".")[2], e, half, rows[layer.layer_index])
                if span is None or tuple(span.shape) != entry.shape:
                    mismatched.append(key)
                    filled.add((layer.layer_index, name, e, half))  # refused as mismatched, not again as missing
                    continue
                if not built:
                    reader.into(entry, span)
                filled.add((layer.layer_index, name, e, half))
            if building:  # checked before the directory is published, then mapped from its final place, privately
                _check_rows_finite(path, rows, dtype)
                rows = span = None  # the writable maps released: a writer's map would keep the files from a lease
        if building:  # last, once the files are in place and their permissions set: a tier without it is rebuilt
            write_manifest(tier, identity)
        if tier is not None:  # leased before the sizes are checked and the files mapped (`TierLeases`)
            leases = TierLeases(tier, [tier / f"layer-{m.layer_index}.bin" for m in moe.moe_layers])
            rows = {m.layer_index: _expert_rows(m, dtype, tier, writable=False) for m in moe.moe_layers}
    finally:
        reader.close()
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    state, buffers = model.state_dict(), {n for n, _ in model.named_buffers()}
    missing = [n for n, t in state.items() if n not in assigned and not _is_expert(n, layers)
               and (t.is_meta or n in buffers)]  # a persistent buffer keeps its initial value unless read
    for m in moe.moe_layers:
        halves = {"gate_up_proj": 2, "down_proj": 1}
        for param, count in halves.items():
            name = f"{experts_path(moe, m)}.{param}"
            missing += [f"{name}[{e}]" for e in range(m.num_experts) for h in range(count)
                        if (m.layer_index, name, e, h) not in filled]
        point_at_rows(m, rows[m.layer_index])
    _check_loaded_all(path, {"missing_keys": missing, "unexpected_keys": unexpected, "mismatched_keys": mismatched})
    named = [*model.named_parameters(), *model.named_buffers()]
    bad = first_nonfinite([(n, t) for n, t in named if tier is None or not _is_expert(n, layers)])  # rows checked
    if bad is not None:
        raise SpecterError(f"the model in {str(path)!r}: tensor {bad} holds NaN or infinite values; {_damaged(dtype)}")
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(path), local_files_only=True)
    moe = MoEModel(model.eval())
    moe.path = path
    moe.loaded_by = "safetensors read into place (experts as rows" + (
        f", memory-mapped from the disk tier {tier}" + (f", unleased: {leases.unleased}" if leases.unleased else "")
        + ")" if tier is not None else ")")
    moe.experts_on_disk = tier
    moe.tier_leases = leases if tier is not None else None  # held as long as the model
    return moe


def _damaged(dtype: torch.dtype) -> str:
    return (f"its weights are damaged (or overflow {str(dtype).removeprefix('torch.')}); rebuild or re-download the "
            "checkpoint")


def _check_rows_finite(path: Path, rows: dict[int, torch.Tensor], dtype: torch.dtype) -> None:
    """The disk tier's rows, checked once as they are built (a later load maps them unchecked)."""
    bad = first_nonfinite((f"layer {layer}'s experts", r) for layer, r in rows.items())
    if bad is not None:
        raise SpecterError(f"the model in {str(path)!r}: {bad} hold NaN or infinite values; {_damaged(dtype)}")


def _is_expert(name: str, layers: dict) -> bool:
    module, _, leaf = name.rpartition(".")
    return module in layers and leaf in ("gate_up_proj", "down_proj")


def _expert_rows(layer, dtype: torch.dtype, tier: Path | None = None, writable: bool = False) -> torch.Tensor:
    """A layer's expert rows [E, 2IH + HI]: row e is expert e's gate [I, H], up [I, H] and down [H, I] end to end; in
    memory, or mapped from the file `layer-<i>.bin` in the disk tier's directory `tier` (`writable`: a new file, its
    writes reaching it; else the file as it is, mapped privately)."""
    gate_up, down = layer.experts.gate_up_proj, layer.experts.down_proj
    shape = (layer.num_experts, gate_up[0].numel() + down[0].numel())
    if tier is None:
        return torch.empty(shape, dtype=dtype)
    file = tier / f"layer-{layer.layer_index}.bin"
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if writable:  # every block reserved now: a full disk fails here, not as a bus error on a write through the map
        with open(file, "wb") as f:
            if nbytes:
                os.posix_fallocate(f.fileno(), 0, nbytes)
    elif not file.is_file() or file.stat().st_size != nbytes:
        raise SpecterError(f"the disk tier {tier} lacks {file.name} of {nbytes} bytes (a damaged cache); delete "
                           f"{tier} and load again to rebuild it")
    return torch.from_file(str(file), shared=writable, size=math.prod(shape), dtype=dtype).view(shape)


def _span(layer, param: str, e: int, half: int, rows: torch.Tensor) -> torch.Tensor | None:
    """The view of `rows` that expert e's part of `param` (a half of gate_up_proj, or down_proj) fills."""
    if not 0 <= e < layer.num_experts:
        return None
    gate_up, down = layer.experts.gate_up_proj, layer.experts.down_proj
    two_i, hidden = gate_up.shape[1:]
    if param == "gate_up_proj":
        size = two_i // 2 * hidden
        return rows[e, half * size : (half + 1) * size].view(two_i // 2, hidden)
    return rows[e, two_i * hidden :].view(*down.shape[1:])


def fused_views(rows: torch.Tensor, gate_up_shape: tuple[int, ...], down_shape: tuple[int, ...]
                ) -> dict[str, torch.Tensor]:
    """The stock fused `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I] as strided views into expert rows [E, numel]
    whose row e lays expert e's gate, up and down end to end (the host store's layout)."""
    base, split = rows.storage_offset(), math.prod(gate_up_shape[1:])
    return {"gate_up_proj": rows.as_strided(gate_up_shape, (rows.stride(0), gate_up_shape[2], 1), base),
            "down_proj": rows.as_strided(down_shape, (rows.stride(0), down_shape[2], 1), base + split)}


def point_at_rows(layer, rows: torch.Tensor) -> None:
    """The layer's fused gate_up_proj and down_proj become strided views into its expert rows (`fused_views`)."""
    ex = layer.experts
    for name, view in fused_views(rows, tuple(ex.gate_up_proj.shape), tuple(ex.down_proj.shape)).items():
        setattr(ex, name, torch.nn.Parameter(view, requires_grad=False))


def _assign(model: torch.nn.Module, name: str, like: torch.Tensor, entry: TensorEntry, reader: _Reader) -> None:
    """Read a non-expert tensor into a tensor of its own at the model's dtype for it, and put it in its place."""
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    tensor = torch.empty(like.shape, dtype=like.dtype)
    reader.into(entry, tensor)
    if leaf in module._parameters:
        module._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=module._parameters[leaf].requires_grad)
    else:
        module._buffers[leaf] = tensor
