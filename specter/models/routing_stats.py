"""How a model routes: the statistics that decide what offloading costs it, per MoE layer.

On held-out text, teacher-forced (each token's routing is the model's own router's choice on the true prefix):
- `load_balance_max_over_mean`: tokens of the busiest expert over the mean;
- `routing_entropy_bits`: the entropy of the layer's expert use (routed slots over experts), and the same as a share of
  the most it could be (log2 E: every expert equally used);
- `set_change_rate`: the share of consecutive token pairs whose expert sets differ;
- `token_to_token_reuse`: the share of a token's experts that the previous token also used;
- `lru_hit_rate`: with S slots per layer under LRU, cold at the start of each sequence, the share of the experts each
  token needs that are already resident (the paper's Table 3 measure: a step's required experts already on the device);
  `lfu_hit_rate` the same under LFU (`specter.eviction`);
- `repeat_first_choice`: the share of consecutive token pairs whose first-choice expert is the same, and
  `repeat_any_choice` the share whose expert sets share at least one expert (the Mixtral paper's Table 5 measures:
  "first choice" and, at top-2, "first or second choice"), each beside its value under uniform random routing
  (`random_routing`: 1/E and 1 - C(E-k, k)/C(E, k));
- `reuse_distance_mean`: for each use of an expert that the sequence used before in the layer, the distinct other
  experts used in between (LRU's stack distance: a cache of S slots hits exactly the uses at a distance below S,
  where a token needs one expert), averaged.
These stand beside the real models' published figures where the paper has them, which is how a reader can tell how far
a proxy's routing stands in for the real model's.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch

from specter.eviction import hit_rate


def lru_hit_rate(sequences: list[list[tuple[int, ...]]], slots: int) -> float:
    """Share of needed experts already resident, per-layer LRU of `slots` entries, cold at each sequence's start."""
    hits = needed = 0
    for seq in sequences:
        cache: OrderedDict[int, None] = OrderedDict()
        for experts in seq:
            for e in experts:
                needed += 1
                if e in cache:
                    hits += 1
                    cache.move_to_end(e)
                else:
                    cache[e] = None
                    if len(cache) > slots:
                        cache.popitem(last=False)
    return hits / needed if needed else 0.0


def reuse_distances(sequences: list[list[tuple[int, ...]]]) -> list[int]:
    """Each repeated use's stack distance: the distinct other experts used since the expert's previous use in its
    sequence (a token's own other experts counted as before it)."""
    out = []
    for seq in sequences:
        stack: list[int] = []  # least recently used first
        for experts in seq:
            for e in experts:
                if e in stack:
                    out.append(len(stack) - 1 - stack.index(e))
                    stack.remove(e)
                stack.append(e)
    return out


def repeat_rates(idx: torch.Tensor) -> tuple[float, float]:
    """(first choice kept, any expert kept) over consecutive token pairs of `idx` [S, T, k] (ranked choices)."""
    first = (idx[:, 1:, 0] == idx[:, :-1, 0]).double().mean()
    shared = (idx[:, 1:, :, None] == idx[:, :-1, None, :]).any(-1).any(-1).double().mean()
    return float(first), float(shared)


def slot_counts(experts: int) -> list[int]:
    """The slot counts the statistics report: a few small ones and the paper's Table 3 counts, below `experts`."""
    return sorted({s for s in (1, 2, 4, 6, 8, 16, 32) if s < experts})


def routing_statistics(moe, ids: torch.Tensor, batch: int = 8) -> dict:
    """Per-layer statistics of `moe`'s routing of `ids` [S, T] (see the module docstring)."""
    with moe.record_routing() as log, torch.no_grad():
        for i in range(0, len(ids), batch):
            moe.model(input_ids=ids[i : i + batch])
    experts = moe.moe_layers[0].num_experts
    top_k = moe.moe_layers[0].top_k
    out: dict[str, list] = {k: [] for k in ("layers", "load_balance_max_over_mean", "routing_entropy_bits",
                                            "routing_entropy_share", "set_change_rate", "token_to_token_reuse",
                                            "repeat_first_choice", "repeat_any_choice", "reuse_distance_mean")}
    lru: dict[int, list[float]] = {s: [] for s in slot_counts(experts)}
    lfu: dict[int, list[float]] = {s: [] for s in slot_counts(experts)}
    for layer, calls in log.items():
        idx = torch.cat(calls).reshape(len(ids), ids.shape[1], -1)  # [S, T, k]
        counts = torch.bincount(idx.flatten(), minlength=experts).double()
        p = counts / counts.sum()
        entropy = float(-(p[p > 0] * torch.log2(p[p > 0])).sum())
        sets = idx.sort(-1).values
        out["layers"].append(layer)
        out["load_balance_max_over_mean"].append(float(counts.max() / counts.mean()))
        out["routing_entropy_bits"].append(entropy)
        out["routing_entropy_share"].append(entropy / math.log2(experts))
        out["set_change_rate"].append(float((sets[:, 1:] != sets[:, :-1]).any(-1).double().mean()))
        out["token_to_token_reuse"].append(float((idx[:, 1:, :, None] == idx[:, :-1, None, :]).any(-1).double().mean()))
        first, shared = repeat_rates(idx)
        out["repeat_first_choice"].append(first)
        out["repeat_any_choice"].append(shared)
        sequences = [[tuple(t) for t in seq.tolist()] for seq in idx]
        distances = reuse_distances(sequences)
        out["reuse_distance_mean"].append(sum(distances) / len(distances) if distances else None)
        for s in lru:
            lru[s].append(lru_hit_rate(sequences, s))
            lfu[s].append(hit_rate(sequences, s, "lfu"))
    out["experts"], out["top_k"] = experts, top_k
    out["random_routing"] = {"repeat_first_choice": 1 / experts,
                             "repeat_any_choice": 1 - math.comb(experts - top_k, top_k) / math.comb(experts, top_k)}
    for name, rates in (("lru_hit_rate", lru), ("lfu_hit_rate", lfu)):
        out[name] = {str(s): values for s, values in rates.items()}
        out[f"{name}_mean"] = {str(s): sum(values) / len(values) for s, values in rates.items()}
    return out


#: the measures the locality table reads (a model card built before they were computed lacks some)
MEASURES = ("layers", "experts", "top_k", "repeat_first_choice", "repeat_any_choice", "reuse_distance_mean",
            "random_routing", "lru_hit_rate", "lfu_hit_rate", "lru_hit_rate_mean", "lfu_hit_rate_mean",
            "routing_entropy_share", "load_balance_max_over_mean")
#: held-out windows per corpus (prose and code) and their length in tokens, as a proxy's card measures them
WINDOWS, WINDOW_TOKENS = 4, 256


def model_routing(model_dir) -> dict:
    """A checkpoint's routing statistics: its model card's, where the card holds every one of `MEASURES` and the
    weights' hash its files still have (a proxy's, measured when it was built), else measured now on the same text,
    `WINDOWS` held-out windows each of prose and code (`specter.data.corpus`) in the checkpoint's own tokenizer,
    teacher-forced. Returns {"model", "stands_in_for", "measured_from", "routing"}."""
    import json
    from pathlib import Path

    from specter.errors import SpecterError
    from specter.models.integrity import CARD, check_card

    model_dir = Path(model_dir)
    card = {}
    if (model_dir / CARD).is_file():
        check_card(model_dir)
        card = json.loads((model_dir / CARD).read_text(encoding="utf-8"))
    routing = card.get("routing") if isinstance(card, dict) else None
    vouched = isinstance(card, dict) and card.get("weights_sha256") is not None  # `check_card` held the files to it
    if vouched and isinstance(routing, dict) and all(m in routing for m in MEASURES):
        stats = {"model": model_dir.name, "stands_in_for": str(card.get("stands_in_for") or ""),
                 "measured_from": "model card", "routing": routing}
        if (problem := _card_problem(model_dir, stats, card.get("name"))) is not None:
            raise SpecterError(f"{model_dir / CARD}: its routing statistics hold {problem}; build the model again")
        return stats
    from specter.models.dense import token_windows
    from specter.models.loading import load_moe_model, load_tokenizer

    moe = load_moe_model(model_dir)
    tok = load_tokenizer(model_dir)
    limit = getattr(moe.model.config, "max_position_embeddings", None) or WINDOW_TOKENS
    length = min(WINDOW_TOKENS, int(limit))
    ids = torch.cat([token_windows(tok, corpus, "held_out", WINDOWS, length) for corpus in ("prose", "code")])
    text = f"{len(ids)} held-out windows of {length} tokens (half prose, half code), teacher-forced"
    return {"model": model_dir.name, "stands_in_for": str(card.get("stands_in_for") or ""),
            "measured_from": "the checkpoint", "routing": {"text": text, **routing_statistics(moe, ids)}}


def _card_problem(model_dir, stats: dict, name) -> str | None:
    """What in a model card's routing statistics no routing gives, or the checkpoint contradicts (its experts, top-k
    and MoE layers), or a proxy's card names another model than the one it stands in for; or None."""
    from specter.models.loading import describe_model
    from specter.models.proxy_table import PROXIES

    try:
        problem = impossible(stats)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as err:
        return f"a measure of another type or shape than a build writes ({type(err).__name__})"
    if problem:
        return problem
    r, shape = stats["routing"], describe_model(model_dir)
    if (r["experts"], r["top_k"], len(r["layers"])) != (shape.experts_per_layer, shape.top_k, len(shape.moe_layers)):
        return (f"top-{r['top_k']} of {r['experts']} experts over {len(r['layers'])} layers, and the checkpoint routes "
                f"top-{shape.top_k} of {shape.experts_per_layer} over {len(shape.moe_layers)} MoE layers")
    if name in PROXIES and stats["stands_in_for"] != PROXIES[name][3]:  # a figure would set it beside another model
        return f"stands_in_for {stats['stands_in_for']!r}, and {name} stands in for {PROXIES[name][3]!r}"
    return None


def statistic_of(routing: dict, row: dict) -> float | None:
    """This model's value of a published row's statistic (`specter/presets/routing/published.yaml`): at the row's
    depth (first, middle as layer (n - 1) // 2 of n, last, or the mean over layers) or slot count; None where the
    statistics hold none (a slot count past the model's experts)."""
    if "slots" in row:
        return routing.get(f"{row['statistic']}_mean", {}).get(str(row["slots"]))
    values = routing[row["statistic"]]
    n = len(values)
    return sum(values) / n if row["depth"] == "mean" else values[{"first": 0, "middle": (n - 1) // 2,
                                                                    "last": n - 1}[row["depth"]]]


def locality_checks(routing: dict, stands_in_for: str, matched: dict | None = None) -> list[dict]:
    """A model's routing statistics beside each published figure of the model it stands in for: per (source,
    statistic, depth, slots) the published mean over the texts it was measured on, their range, and this model's
    value; `matched` names the one statistic a matched proxy's locality was set from, and every other is held out
    (without it, each is only compared)."""
    from specter.presets import routing_published

    sources, rows = routing_published()
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        if sources[row["source"]]["model"] == stands_in_for:
            key = (row["source"], row["statistic"], row["depth"], row.get("slots"))
            groups.setdefault(key, []).append(float(row["value"]))
    out = []
    for (source, statistic, depth, slots), values in groups.items():
        row = {"source": source, "statistic": statistic, "depth": depth, **({"slots": slots} if slots else {})}
        mine = statistic_of(routing, row)
        out.append({**row, "published_mean": sum(values) / len(values), "published_min": min(values),
                    "published_max": max(values), "texts": len(values), "model": mine,
                    "role": "compared" if not matched else "matched" if all(
                        matched.get(k) == row.get(k) for k in matched) else "held out"})
    return out


def _share(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1


def impossible(stats: dict) -> str | None:
    """What in a model's routing statistics (`{"model", "routing"}`, as `model_routing` returns them) no top-k router
    gives, or None (the measures as the module docstring defines them)."""
    r = stats["routing"]
    name = stats.get("model")
    if not isinstance(name, str) or not name or not name.isprintable() or "|" in name:
        return f"model is {name!r:.60}, not a name (printable, without '|', which tables print)"
    experts, k, n = r["experts"], r["top_k"], len(r["layers"])
    if not (type(experts) is int and type(k) is int and 1 <= k <= experts and n >= 1):
        return f"experts {experts!r:.20} and top_k {k!r:.20} over {n} layers"
    if not (all(type(v) is int and v >= 0 for v in r["layers"]) and r["layers"] == sorted(set(r["layers"]))):
        at = next((i for i, (a, b) in enumerate(zip(r["layers"], r["layers"][1:]), 1)
                   if not (type(a) is type(b) is int and 0 <= a < b)), 0)
        return f"layers that are not distinct layer numbers in order (entry {at} is {r['layers'][at]!r:.20})"
    if not isinstance(r.get("text", ""), str) or not r.get("text", "").isprintable():
        return "a text that is not one line of printable characters"
    random = {"repeat_first_choice": 1 / experts,
              "repeat_any_choice": 1 - math.comb(experts - k, k) / math.comb(experts, k)}
    if set(r["random_routing"]) != set(random) or not all(
            math.isclose(r["random_routing"][m], v, rel_tol=1e-9) for m, v in random.items()):
        return f"random_routing that is not uniform routing's over its {experts} experts, top-{k}"
    repeats = ("repeat_first_choice", "repeat_any_choice")
    for name in (*repeats, "routing_entropy_share", "load_balance_max_over_mean", "reuse_distance_mean"):
        if not isinstance(r[name], list) or len(r[name]) != n:
            return f"{name} holds {len(r[name]) if isinstance(r[name], list) else 'no list of'} values for {n} layers"
    if not all(_share(v) for name in (*repeats, "routing_entropy_share") for v in r[name]):
        return "a repeat rate or entropy share outside [0, 1]"
    if any(first > shared + 1e-12 for first, shared in zip(r["repeat_first_choice"], r["repeat_any_choice"])):
        return "a first-choice repeat rate above the any-expert one (a kept first choice is an expert in common)"
    # each token routes to k distinct experts: an expert's share of the routed slots is at most 1/k, so the busiest
    # expert's load over the mean is at most E/k, and the entropy at least that of the busiest share, log2(E / load)
    if not all(isinstance(v, (int, float)) and 1 - 1e-9 <= v <= experts / k + 1e-9
               for v in r["load_balance_max_over_mean"]):
        return f"a busiest expert's load over the mean outside 1 to {experts / k:g} (E / k: {experts} experts, top-{k})"
    if experts > 1 and any(share < math.log2(experts / load) / math.log2(experts) - 1e-9
                           for share, load in zip(r["routing_entropy_share"], r["load_balance_max_over_mean"])):
        return "a routing entropy below what its busiest expert's load allows (log2(E / load) over log2 E)"
    if not all(v is None or (isinstance(v, (int, float)) and 0 <= v <= experts - 1) for v in r["reuse_distance_mean"]):
        return f"a mean reuse distance outside 0 to {experts - 1}"
    for name in ("set_change_rate", "token_to_token_reuse"):  # not in the table, but a share where given
        if name in r and not (isinstance(r[name], list) and len(r[name]) == n and all(map(_share, r[name]))):
            return f"{name} is not a share in [0, 1] for each of {n} layers"
    if "token_to_token_reuse" in r and any(  # a pair sharing an expert reuses at least 1 of the token's k
            not (anyone / k - 1e-9 <= reuse <= anyone + 1e-9)
            for reuse, anyone in zip(r["token_to_token_reuse"], r["repeat_any_choice"])):
        return (f"token_to_token_reuse outside repeat_any_choice / {k} to repeat_any_choice (a token sharing an expert "
                "with the one before reuses at least one of its k)")
    if "routing_entropy_bits" in r:  # the share is the bits over log2 E, each at most log2 E
        bits = r["routing_entropy_bits"]
        if not (isinstance(bits, list) and len(bits) == n and all(
                isinstance(b, (int, float)) and math.isclose(s * math.log2(experts), b, rel_tol=1e-9, abs_tol=1e-12)
                for b, s in zip(bits, r["routing_entropy_share"]))):
            return (f"routing_entropy_share is not routing_entropy_bits over log2 of its {experts} experts (each "
                    "layer's bits at most that)")
    for name in ("lru_hit_rate", "lfu_hit_rate"):
        per_layer, means = r[name], r[f"{name}_mean"]
        if set(per_layer) != set(means) or not all(str(s).isdigit() and 1 <= int(s) < experts for s in per_layer):
            return f"{name} at slot counts {sorted(per_layer)[:8]} (each from 1 to {experts - 1}, per layer and mean)"
        for slots, values in per_layer.items():
            if len(values) != n or not all(_share(v) for v in values):
                return f"{name} at {slots} slots is not a share in [0, 1] for each of {n} layers"
            if int(slots) < k and any(v > int(slots) / k + 1e-9 for v in values):  # a token's k cannot all be held
                return f"{name} at {slots} slots above {int(slots)}/{k} (a token needs {k} experts, {slots} held)"
            if not math.isclose(means[slots], sum(values) / n, rel_tol=1e-9, abs_tol=1e-12):
                return f"{name}_mean at {slots} slots is {means[slots]!r}, not its layers' mean {sum(values) / n!r}"
    # LRU and LFU (counts over the whole sequence, ties to the least recent) are stack algorithms: the experts a
    # cache of S slots holds are among those one of S + 1 holds, so more slots never hit less
    for name, policy in (("lru_hit_rate", "LRU"), ("lfu_hit_rate", "LFU")):
        ordered = sorted(r[name], key=int)
        for a, b in zip(ordered, ordered[1:]):
            if any(y < x - 1e-12 for x, y in zip(r[name][a], r[name][b])):
                return f"an {policy} hit rate that falls from {a} to {b} slots (more {policy} slots never hit less)"
    return None
