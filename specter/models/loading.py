"""Loading a local MoE checkpoint offline, with one clear error for every way a directory can be wrong.

`load_moe_model` loads weights; `describe_model` instantiates the model on the meta device (no weights read, so it works
on a 90 GB checkpoint in a second) to count layers, experts and bytes for `specter inspect`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import CONFIG_MAPPING, AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from specter.errors import SpecterError
from specter.io import KeyTwice, json_strict
from specter.models.adapter import ARCHITECTURES, MoEModel, supported_list
from specter.models.config_check import EXPERT_KEYS, check_config
from specter.models.integrity import check_card, check_finite, weight_files


def read_model_config(path: str | Path) -> dict:
    """The checkpoint's config.json as a dict, after checking that it is a supported MoE architecture whose numbers
    can make a model (`check_config`; a config without any expert key is dense)."""
    path = Path(path)
    if not path.is_dir():
        raise SpecterError(f"model directory {str(path)!r} does not exist; pass a directory written by save_pretrained")
    config_file = path / "config.json"
    if config_file.exists() and not config_file.is_file():
        raise SpecterError(f"{config_file} is not a regular file (a directory, a device or a pipe); restore the "
                           "checkpoint's config.json")
    if not config_file.is_file():
        raise SpecterError(
            f"{str(path)!r} holds no model (no config.json); pass a directory written by save_pretrained, "
            "e.g. the output of `specter build-model`"
        )
    try:
        config = json_strict(config_file.read_text())
    except KeyTwice as err:
        raise SpecterError(f"{config_file}: {err} (transformers would take the last); keep one and re-save the "
                           "checkpoint") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SpecterError(f"{config_file} is not valid JSON ({err}); re-save the checkpoint") from None
    except RecursionError:
        raise SpecterError(f"{config_file} nests too deeply to be a model's config; re-save the checkpoint") from None
    if not isinstance(config, dict):
        raise SpecterError(f"{config_file} is not a JSON object; re-save the checkpoint")
    model_type = config.get("model_type")
    if model_type in ARCHITECTURES:
        check_config(config, str(config_file))
        try:  # the class's own validation (field types, dtype names), before a tokenizer or model reads the config
            CONFIG_MAPPING[model_type].from_dict(dict(config))
        except Exception as err:  # noqa: BLE001 - whatever the config class refuses is the config's
            raise SpecterError(f"{config_file} is not a valid {model_type} config ({type(err).__name__}: "
                               f"{' '.join(str(err).split())[:300]}); fix or re-download the checkpoint") from None
        return config
    if model_type is None:
        raise SpecterError(f"{config_file} has no model_type; supported architectures: {supported_list()}")
    if model_type in CONFIG_MAPPING and not any(config.get(k) for k in EXPERT_KEYS):
        raise SpecterError(
            f"{str(path)!r} is a dense {model_type!r} model, not a mixture of experts; "
            f"supported MoE architectures: {supported_list()}"
        )
    raise SpecterError(f"unsupported architecture {model_type!r} in {config_file}; supported: {supported_list()}")


def load_moe_model(path: str | Path, dtype: torch.dtype | str = "auto", device: str = "cpu",
                   known_hash: str | None = None) -> MoEModel:
    """Load a checkpoint from a local directory (never the network) and wrap it in the adapter.

    Refused before any weight is read: a config that cannot make a model (`read_model_config`), files that differ
    from what the model card recorded (`check_card`; `known_hash`: the model hash where the caller has it); and once
    read, a NaN or infinite weight (`check_finite`). Experts run through the eager per-expert path: the batched paths
    are slow on CPU prefill, and the runtime replaces expert execution anyway.
    """
    read_model_config(path)
    check_card(path, known_hash)
    check_shards(Path(path))
    check_weight_dtypes(Path(path))
    hf_logging.disable_progress_bar()  # the loader's per-tensor bar says nothing about a local checkpoint
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its multi-line load report: a mismatch is refused below, in one line
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, local_files_only=True, experts_implementation="eager", output_loading_info=True
        )
    except Exception as err:  # noqa: BLE001 - any failure to read a checkpoint is the checkpoint's
        bad = _unreadable_weights(Path(path))
        what = f"{bad.name} is truncated or corrupt" if bad else "truncated or corrupt weights, or a config.json " \
            "that does not describe them?"
        raise SpecterError(f"cannot load the model in {str(path)!r}: {type(err).__name__}: {_first_line(err)} "
                           f"({what}); rebuild or re-download the checkpoint") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    _check_loaded_all(Path(path), info)
    precision = str(dtype).removeprefix("torch.")
    check_finite(model, f"the model in {str(path)!r}", f"its weights are damaged (or overflow {precision}); rebuild or "
                 "re-download the checkpoint")
    moe = MoEModel(model.to(device).eval())
    moe.path = Path(path)
    moe.loaded_by = "transformers from_pretrained"
    return moe


def load_tokenizer(model_dir: str | Path):
    """The checkpoint's own tokenizer (local files only), or one SpecterError naming the checkpoint and the fix where
    its files cannot make one (a damaged tokenizer.json or tokenizer_config.json, a missing vocabulary)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except BaseException as err:  # noqa: BLE001 - transformers and tokenizers raise many kinds for a damaged file
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise SpecterError(f"the tokenizer of the checkpoint in {str(model_dir)!r} cannot be read "
                           f"({type(err).__name__}: {first}); restore its tokenizer files (tokenizer.json, "
                           "tokenizer_config.json) from the checkpoint's source") from None


def check_shards(path: Path) -> None:
    """Refuse a checkpoint whose weights files cannot be chosen (`weight_files`), naming the file."""
    weight_files(path)


#: safetensors' dtypes that are not floating point
_INTEGER_DTYPES = {"I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32",
                   "U16": "uint16", "U8": "uint8", "BOOL": "bool"}


def integer_weight(name: str, dtype: str) -> bool:
    """Whether a checkpoint tensor is a plain weight (`....weight`) stored as integers or booleans (`dtype`: its
    safetensors dtype, such as I32): a loader would convert it to the model's float dtype without a word. Quantized
    blocks and scales (GPT-OSS's `_blocks`) are named otherwise."""
    return name.endswith(".weight") and dtype in _INTEGER_DTYPES


def stored_twice(path: Path, name: str, first: str, second: str) -> SpecterError:
    """The refusal of a checkpoint that stores tensor `name` in two of its files (loaders differ in which they read)."""
    return SpecterError(f"the model in {str(path)!r}: tensor {name} is stored in both {first} and {second} (a "
                        "stale shard, or a shard of another checkpoint): remove the stale shard or re-download the "
                        "checkpoint")


#: config.json's floating-point dtypes and how safetensors names each
_FLOAT_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64"}


def check_weight_dtypes(path: Path) -> None:
    """Refuse, naming the tensor, a checkpoint with a plain weight stored as integers (`integer_weight`) or a tensor
    stored in two of its files (loaders differ in which copy they read), or a config.json whose dtype none of its
    floating-point weights is stored in, from its safetensors headers alone (a header the loader cannot read is the
    loader's to report)."""
    held: dict[str, str] = {}
    floats: set[str] = set()  # the floating-point dtypes the weights are stored in
    files = weight_files(path)  # (an index that lists no file it could be is refused there)
    for file in files:
        try:
            with open(file, "rb") as f:
                length = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(length)) if 0 < length <= 100 * 2**20 else {}
        except (OSError, ValueError):
            continue
        except RecursionError:
            raise SpecterError(f"the model in {str(path)!r}: {file.name}'s header nests too deeply to be a "
                               "safetensors header: a damaged checkpoint; rebuild or re-download it") from None
        if not isinstance(header, dict):
            continue
        for name, info in sorted(header.items()):
            if name != "__metadata__" and held.setdefault(name, file.name) != file.name:
                raise stored_twice(path, name, held[name], file.name)
            dtype = info.get("dtype") if isinstance(info, dict) else None
            floats |= {dtype} if dtype in _FLOAT_DTYPES.values() else set()
            if isinstance(dtype, str) and integer_weight(name, dtype):
                raise SpecterError(f"the model in {str(path)!r}: tensor {name} is stored as {_INTEGER_DTYPES[dtype]}, "
                                   "and a weight is a floating-point tensor (it would be converted silently): a "
                                   "damaged or foreign checkpoint; rebuild or re-download it")
    said = read_model_config(path)
    said = said.get("dtype") or said.get("torch_dtype")
    if floats and said in _FLOAT_DTYPES and _FLOAT_DTYPES[said] not in floats:
        raise SpecterError(f"the model in {str(path)!r}: config.json says dtype {said}, and its weights are stored in "
                           f"{', '.join(sorted(floats))}: a config.json that does not describe its weights (every "
                           "byte count and a live run's dtype follow it); restore it from the checkpoint's source")
    index = path / "model.safetensors.index.json"
    if index.is_file() and held:  # where the index says each tensor is: a loader may look for it only there
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        wrong = next((name for name in sorted(held) if weight_map.get(name) != held[name]), None)
        if wrong is None:
            wrong = next((name for name in sorted(weight_map) if name not in held), None)
        if wrong is not None:
            raise SpecterError(f"the model in {str(path)!r}: {index.name} places tensor {wrong} in "
                               f"{weight_map.get(wrong, 'no file')}, and the shards hold it in "
                               f"{held.get(wrong, 'none of them')}: the index and its shards disagree; restore "
                               "them from the checkpoint's source")


def _check_loaded_all(path: Path, info: dict) -> None:
    """Refuse a checkpoint whose weights and config.json disagree: transformers fills a parameter missing from the
    weights with a random initialisation and drops an unexpected one, and the model then runs, exit 0, with wrong
    numbers (a config.json with one layer more ran its last layer on random weights)."""
    missing, unexpected = sorted(info.get("missing_keys") or ()), sorted(info.get("unexpected_keys") or ())
    mismatched = sorted(str(m[0]) if isinstance(m, (tuple, list)) else str(m)
                        for m in info.get("mismatched_keys") or ())
    if not (missing or unexpected or mismatched):
        return
    check_shards(path)  # a shard gone: say which, not that config.json was edited
    parts = [f"{len(keys)} parameter(s) {what} (first: {keys[0]})" for keys, what in
             ((missing, "missing from the weights"), (unexpected, "in the weights that the config has no place for"),
              (mismatched, "of another shape than the config's")) if keys]
    layers = {int(k.split(".")[2]) for k in (*missing, *unexpected) if k.startswith("model.layers.")
              and k.split(".")[2].isdigit()}
    hint = ""
    if layers:
        from safetensors import safe_open

        held = set()
        for file in weight_files(path):
            with safe_open(str(file), "pt") as f:
                held |= {int(k.split(".")[2]) for k in f.keys() if k.startswith("model.layers.")
                         and k.split(".")[2].isdigit()}
        config = json.loads((path / "config.json").read_text())
        if len(held) != config.get("num_hidden_layers"):
            hint = (f"; config.json says num_hidden_layers {config.get('num_hidden_layers')}, the weights hold "
                    f"{len(held)}")
    raise SpecterError(f"the weights in {str(path)!r} do not match its config.json: {'; '.join(parts)}{hint}; a "
                       "config.json edited after the build? rebuild or re-download the checkpoint")


def _unreadable_weights(path: Path) -> Path | None:
    """The first weights file of a checkpoint whose safetensors header or tensors cannot be read, if any."""
    from safetensors import safe_open

    for file in weight_files(path):
        try:
            with safe_open(str(file), "pt") as f:
                for key in f.keys():
                    f.get_slice(key)
        except Exception:  # noqa: BLE001 - any failure names the file
            return file
    return None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or ["(no message)"])[0]


@dataclass(frozen=True)
class ModelSummary:
    """What `specter inspect` prints: the shape of the offloading problem a checkpoint poses."""

    path: str
    model_type: str
    family: str
    dtype: str
    num_layers: int
    moe_layers: list[int]
    experts_per_layer: int
    top_k: int
    shared_experts: bool
    params_per_expert: int
    bytes_per_expert: int
    routed_expert_bytes: int
    non_expert_bytes: int

    def as_dict(self) -> dict:
        return asdict(self)


def describe_model(path: str | Path) -> ModelSummary:
    """Summarize a checkpoint from its config alone: the model is built on the meta device, no weights are read (the
    weight files' headers are, where there are any: a config that contradicts them is refused)."""
    read_model_config(path)
    if any(Path(path).glob("*.safetensors")):
        check_weight_dtypes(Path(path))
    config_file = Path(path) / "config.json"
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        dtype = getattr(config, "dtype", None) or torch.float32
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype {getattr(config, 'dtype', None)!r} is not a torch dtype")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except Exception as err:  # noqa: BLE001 - what check_config lets through and transformers refuses
        raise SpecterError(f"{config_file} does not build a model: {type(err).__name__}: {_first_line(err)}; fix or "
                           "re-download the checkpoint") from None
    moe = MoEModel(model)
    first = moe.moe_layers[0]
    return ModelSummary(
        path=str(path),
        model_type=moe.model_type,
        family=moe.spec.name,
        dtype=str(dtype).removeprefix("torch."),
        num_layers=moe.num_layers,
        moe_layers=[m.layer_index for m in moe.moe_layers],
        experts_per_layer=first.num_experts,
        top_k=first.top_k,
        shared_experts=first.shared is not None,
        params_per_expert=first.expert_params(),
        bytes_per_expert=first.expert_bytes(dtype),
        routed_expert_bytes=moe.routed_expert_bytes(),
        non_expert_bytes=moe.non_expert_bytes(),
    )
