"""Prompt sets by name, loaded offline, cut to the artifact's protocol: the first N non-empty inputs, P tokens each.

Shipped today: `code` (held-out CPython standard-library files, disjoint from the calibration split). The other shipped
sets and local dataset files are the default-model issue's work.
"""

from __future__ import annotations

from specter.data.corpus import corpus_texts
from specter.errors import SpecterError

DATASETS = ("code",)


def load_prompts(name: str, tokenizer, num_prompts: int = 5, prefix_tokens: int = 16) -> list[list[int]]:
    """Token ids of the first `num_prompts` non-empty inputs of set `name`, each cut to `prefix_tokens` tokens."""
    if name not in DATASETS:
        raise SpecterError(f"unknown dataset {name!r}; shipped datasets: {', '.join(DATASETS)}")
    if num_prompts < 1 or prefix_tokens < 1:
        raise SpecterError(f"need at least one prompt of at least one token, got {num_prompts} x {prefix_tokens}")
    prompts = []
    for text in corpus_texts("code", "held_out"):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:prefix_tokens]
        if len(ids) == prefix_tokens:
            prompts.append(ids)
        if len(prompts) == num_prompts:
            return prompts
    raise SpecterError(f"dataset {name!r} has only {len(prompts)} inputs of {prefix_tokens} tokens")
