"""The proxies the suite builds, by name, and the matched ones' settings (`specter.models.proxies` builds them and
describes them): a table of its own, so that what reads a proxy's card imports no builder."""

from __future__ import annotations

#: name -> (experts, top-k, shared neurons, the architecture it stands in for)
PROXIES: dict[str, tuple[int, int, int, str]] = {
    "smollm2-moe": (8, 2, 512, "mixtral-8x7b"),
    "smollm2-moe-16x2": (16, 2, 512, "phi-3.5-moe"),
    "smollm2-moe-64x6": (64, 6, 512, "deepseek-v2-lite"),
    "smollm2-moe-60x4": (60, 4, 576, "qwen1.5-moe-a2.7b"),
    "smollm2-moe-matched": (8, 2, 512, "mixtral-8x7b"),
    "smollm2-moe-64x6-matched": (64, 6, 512, "deepseek-v2-lite"),
}
#: matched proxy -> (the proxy it is, its `locality`, the one published statistic the setting was chosen from: a
#: selector of rows in `specter/presets/routing/published.yaml`, whose mean over texts it meets). Each setting was
#: found by bisection over builds, each measured on the card's held-out text (docs/regime.md gives the search).
MATCHED: dict[str, tuple[str, float, dict]] = {
    "smollm2-moe-matched": ("smollm2-moe", -0.55, {"source": "mixtral-table5",
                                             "statistic": "repeat_first_choice", "depth": "middle"}),
    "smollm2-moe-64x6-matched": ("smollm2-moe-64x6", 0.35, {"source": "specter-table3",
                                                  "statistic": "lru_hit_rate", "slots": 16}),
}
