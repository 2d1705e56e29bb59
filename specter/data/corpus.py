"""Offline calibration text, kept disjoint from the held-out text that evaluation prompts come from.

`code`: the CPython standard library's own sources (on disk wherever Python is), minus tests and site-packages. Each
file lands on one side of a fixed split by a hash of its relative path: about one file in eight is held out for
evaluation, the rest is calibration. The split depends only on file names, so it is the same on every machine with the
same Python version (recorded with every draft).
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from pathlib import Path

from specter.errors import SpecterError

CORPORA = ("code",)
HELD_OUT_SHARE = 8  # one file in HELD_OUT_SHARE is held out


def _stdlib_files() -> list[tuple[str, Path]]:
    """(path relative to the stdlib root, path) of every source file, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("site-packages/", "dist-packages/")) or "/test" in f"/{rel}" or "idlelib" in rel:
            continue
        files.append((rel, path))
    return files


def _held_out(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % HELD_OUT_SHARE == 0


@functools.lru_cache(maxsize=4)
def corpus_texts(name: str, split: str) -> tuple[str, ...]:
    """Texts of corpus `name`, `split` "calibration" or "held_out", in a fixed order."""
    if name not in CORPORA:
        raise SpecterError(f"unknown corpus {name!r}; corpora: {', '.join(CORPORA)}")
    if split not in ("calibration", "held_out"):
        raise SpecterError(f"unknown split {split!r}; splits: calibration, held_out")
    want_held_out = split == "held_out"
    texts = []
    for rel, path in _stdlib_files():
        if _held_out(rel) == want_held_out:
            text = path.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                texts.append(text)
    return tuple(texts)


def calibration_token_ids(tokenizer, corpus: str, num_sequences: int, seq_len: int) -> list[list[int]]:
    """`num_sequences` windows of `seq_len` tokens from the calibration split: the texts are tokenized in order and
    concatenated, and windows are taken at an even stride across the whole stream so that they cover many files."""
    if num_sequences < 1 or seq_len < 2:
        raise SpecterError(f"need at least 1 calibration sequence of at least 2 tokens, got {num_sequences} x {seq_len}")
    stream: list[int] = []
    needed = num_sequences * seq_len * 4  # tokenize only as much as a spread-out sample needs
    for text in corpus_texts(corpus, "calibration"):
        stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(stream) >= needed:
            break
    if len(stream) < num_sequences * seq_len:
        raise SpecterError(
            f"corpus {corpus!r} has {len(stream)} calibration tokens, fewer than {num_sequences} x {seq_len}; "
            "ask for fewer or shorter sequences"
        )
    stride = (len(stream) - seq_len) // max(1, num_sequences - 1) if num_sequences > 1 else 0
    return [stream[i * stride : i * stride + seq_len] for i in range(num_sequences)]
