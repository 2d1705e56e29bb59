"""A run record's sums and counts held to each other (`arithmetic_problem`, one of `record_checks`' checks): what
a record that is whole in every field alone can still contradict."""

from __future__ import annotations

import math


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def placement_problem(record: dict, extra: dict, config: dict) -> str | None:
    """A run of a system placing whole layers' experts (`extra.host_layers`: KTransformers, llama.cpp's CPU experts)
    held to its placement: its host layers distinct, ascending and within its MoE layers; the device's experts those
    of the other layers (`config.memory.placed_slot_bytes`); nothing copied in or back but activations, which cross
    where a layer's experts are on the host; no hit where no expert is on the device."""
    from specter.system_names import host_layers_rule

    host, rule = extra.get("host_layers"), host_layers_rule(str(record.get("system")))
    if host is None and rule is None:
        return None
    if rule is None:
        return f"extra.host_layers is {host!r:.80}, and {record.get('system')} places no whole layer on the host"
    memory = config.get("memory") if isinstance(config.get("memory"), dict) else {}
    layers, placed = memory.get("moe_layers"), memory.get("placed_slot_bytes")
    if not _layer_list(host) or (isinstance(layers, int) and len(host) > layers):
        return f"extra.host_layers is {host!r:.80}, not distinct MoE layers in order, as many as the model has at most"
    problem = _rule_problem(record, extra, config, host, rule)
    if problem:
        return problem
    each = (config.get("expert_storage") or {}).get("expert_bytes") if isinstance(config.get("expert_storage"),
                                                                                   dict) else None
    if all(isinstance(v, int) for v in (layers, placed, each, record.get("experts_per_layer"))) and \
            placed != (layers - len(host)) * record["experts_per_layer"] * each:
        return (f"config.memory.placed_slot_bytes is {placed}, and the {layers - len(host)} MoE layers not on the "
                f"host hold {(layers - len(host)) * record['experts_per_layer'] * each} bytes of experts")
    for name, value in (("h2d_bytes_demand", record.get("h2d_bytes_demand")),
                        ("h2d_bytes_prefetch", record.get("h2d_bytes_prefetch")),
                        ("extra.d2h_bytes_writeback", extra.get("d2h_bytes_writeback")),
                        ("extra.h2d_bytes_prefill", extra.get("h2d_bytes_prefill"))):
        if value:
            return f"{name} is {value!r}, and a run that places whole layers' experts copies no expert"
    if ((extra.get("link_bytes_activations") or 0) > 0) != (len(host) > 0):
        return (f"extra.link_bytes_activations is {extra.get('link_bytes_activations')!r}, and {len(host)} layers' "
                "experts are on the host (activations cross exactly where some are)")
    if isinstance(layers, int) and len(host) == layers and record.get("demand_hits"):
        return f"demand_hits is {record['demand_hits']!r}, and every MoE layer's experts are on the host"
    return None


def split_problem(record: dict, extra: dict, config: dict) -> str | None:
    """A whole-layer placement's (`extra.host_layers`) hits and misses as it counts them: every lookup in a layer on the
    device a hit, every one in a layer on the host a miss; a decode pass reads one token, top-k experts in each layer;
    the prefill's are the layers' distinct experts over the prompt (at least top-k, at most the experts or the
    prompt's lookups)."""
    routing, counts, host = config.get("routing"), extra.get("counts"), extra.get("host_layers")
    layers, top_k = (routing.get(k) for k in ("moe_layers", "top_k")) if isinstance(routing, dict) else (None, None)
    experts, prompt = record.get("experts_per_layer"), len(record.get("prompt_token_ids") or [])
    if not (isinstance(host, list) and isinstance(counts, dict)
            and all(isinstance(v, int) for v in (layers, top_k, experts))):
        return None  # a system placing no whole layer, or one the lookups' own check refuses
    passes, device, host = counts.get("decode_passes"), layers - len(host), len(host)
    for name, want, where, does in (("decode_token_hits", device, "on the device", "hit"),
                                    ("decode_token_misses", host, "on the host", "miss"),
                                    ("decode_hits", device, "on the device", "hit"),
                                    ("decode_misses", host, "on the host", "miss")):
        if counts.get(name) != passes * want * top_k:
            return (f"extra.counts.{name} is {counts.get(name)!r}, and {passes} decode passes through {want} of "
                    f"{layers} MoE layers {where} {does} {passes * want * top_k} times (a device layer's lookups hit, "
                    "a host layer's miss)")
    most = min(experts, prompt * top_k)
    for name, part, want, where in (("demand_hits", "decode_hits", device, "on the device"),
                                    ("demand_misses", "decode_misses", host, "on the host")):
        first = (record.get(name) or 0) - (counts.get(part) or 0)
        if not want * top_k <= first <= want * most:
            return (f"{name} less extra.counts.{part} is {first}, and a prefill of {prompt} tokens through {want} "
                    f"MoE layers {where} counts {want * top_k} to {want * most} there")
    return None


def _layer_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value) \
        and value == sorted(set(value))


def _rule_problem(record: dict, extra: dict, config: dict, host: list, rule: str) -> str | None:
    """The host layers as the system places them (`System.host_layers_rule`) among the model's MoE layers
    (`extra.moe_layers`): every one, or the leading ones, as many as its `n-cpu-moe` keeps there (-1: the fewest that
    leave the others' experts within the budget's slots); the activations crossing the link those layers' and the
    tokens' (`extra.activation_bytes`, a token's bytes and a token's at each host layer) over every token the
    target's passes read, the prompt's and each decode step's."""
    moe, system = extra.get("moe_layers"), record.get("system")
    layers = (config.get("memory") or {}).get("moe_layers") if isinstance(config.get("memory"), dict) else None
    if not _layer_list(moe) or not moe or (isinstance(layers, int) and len(moe) != layers):
        return f"extra.moe_layers is {moe!r:.80}, not the model's MoE layers in order (a run of {system} says them)"
    if rule == "every" and host != moe:
        return f"extra.host_layers is {host!r:.80}, and {system} keeps every MoE layer's experts on the host ({moe})"
    if rule == "leading":
        if host != moe[: len(host)]:
            return f"extra.host_layers is {host!r:.80}, and {system} keeps the leading MoE layers' experts there"
        n, slots = (config.get("system_settings") or {}).get("n-cpu-moe"), record.get("slots_per_layer")
        experts = record.get("experts_per_layer")
        if isinstance(n, int) and n >= 0:
            want = [layer for layer in moe if layer < n]
        elif isinstance(n, int) and all(isinstance(v, int) for v in (slots, experts)):
            want = moe[: next(j for j in range(len(moe) + 1) if (len(moe) - j) * experts <= slots * len(moe))]
        else:
            return f"config.system_settings.n-cpu-moe is {n!r}, not a number of blocks"
        if host != want:
            return f"extra.host_layers is {host!r:.80}, and n-cpu-moe={n} keeps MoE layers {want} on the host"
    each, link = extra.get("activation_bytes"), extra.get("link_bytes_activations")
    if not (isinstance(each, dict) and all(isinstance(each.get(k), int) and not isinstance(each.get(k), bool)
                                           and each[k] >= 0 for k in ("token", "token_host_layer"))):
        return f"extra.activation_bytes is {each!r:.80}, not a token's bytes and a token's at each host layer"
    tokens = len(record.get("prompt_token_ids") or []) + max(len(record.get("output_token_ids") or []) - 1, 0)
    want = tokens * (each["token"] + len(host) * each["token_host_layer"])
    if link != want:
        return (f"extra.link_bytes_activations is {link!r}, and {tokens} tokens through {len(host)} host layers "
                f"cross {want} bytes (extra.activation_bytes)")
    return None


def lookups_problem(record: dict, counts: dict, config: dict) -> str | None:
    """A record's expert lookups held to its routing (`config.routing`: its MoE layers L, the experts each token
    routes to in each, top-k) and its decode passes (`extra.counts.decode_passes`: one per output token after the
    first, or one per verified window, each reading the window's drafts and the token before them): the decode's
    per-token lookups are its tokens x L x top-k (or none, where a system counts none); a pass's distinct experts in
    a layer at least top-k and at most the experts of the layer or its tokens' lookups; the prefill's the same over
    the prompt (every pass's, `demand_*`, less the decode's)."""
    routing, passes = config.get("routing"), counts.get("decode_passes")
    layers, top_k = (routing.get(k) for k in ("moe_layers", "top_k")) if isinstance(routing, dict) else (None, None)
    experts = record.get("experts_per_layer")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (layers, top_k, experts)) or \
            top_k > experts:
        return f"config.routing is {routing!r:.80}, not MoE layers and the experts a token routes to in each"
    outputs, proposed = len(record.get("output_token_ids") or []), counts.get("proposed", 0)
    if not isinstance(passes, int) or isinstance(passes, bool) or not (
            passes == outputs - 1 if record.get("k") is None else min(outputs - 1, 1) <= passes <= outputs - 1):
        return (f"extra.counts.decode_passes is {passes!r:.20}, and {outputs} output tokens take "
                + ("one pass each after the first" if record.get("k") is None else "a pass per window, at most one "
                   "a token after the first"))
    windows = sum((record.get("accepted_length_histogram") or {}).values())
    if record.get("k") is not None and windows and windows != passes:
        return (f"accepted_length_histogram counts {windows} windows, and extra.counts.decode_passes is {passes}: "
                "a window's verification is one decode pass")
    tokens = passes + proposed
    token_lookups = counts.get("decode_token_hits", 0) + counts.get("decode_token_misses", 0)
    if token_lookups not in (0, tokens * layers * top_k):
        return (f"extra.counts.decode_token_hits + decode_token_misses is {token_lookups}, and {tokens} tokens through "
                f"{layers} MoE layers at top-{top_k} look up {tokens * layers * top_k} experts")
    decode = counts.get("decode_hits", 0) + counts.get("decode_misses", 0)
    least, most = passes * layers * top_k, min(passes * layers * experts, tokens * layers * top_k)
    if not least <= decode <= most:
        return (f"extra.counts.decode_hits + decode_misses is {decode}, and {passes} decode passes of {tokens} tokens "
                f"through {layers} MoE layers of {experts} experts at top-{top_k} need {least} to {most}")
    if record.get("k") is None and token_lookups and any(counts.get(f"decode_{n}") != counts.get(f"decode_token_{n}")
                                                          for n in ("hits", "misses")):
        return (f"extra.counts.decode_hits/misses are {counts.get('decode_hits')}/{counts.get('decode_misses')}, and "
                f"decode_token_hits/misses {counts.get('decode_token_hits')}/{counts.get('decode_token_misses')}: "
                "one token a pass looks up each expert once")
    prompt = len(record.get("prompt_token_ids") or [])
    prefill = (record.get("demand_hits") or 0) + (record.get("demand_misses") or 0) - decode
    least, most = layers * top_k, layers * min(experts, prompt * top_k)
    if not least <= prefill <= most:
        return (f"demand_hits + demand_misses is {prefill + decode}, and the decode's {decode} and a prefill of "
                f"{prompt} tokens through {layers} MoE layers of {experts} experts at top-{top_k} need "
                f"{least + decode} to {most + decode}")
    return None


def traffic_problem(record: dict, extra: dict, config: dict) -> str | None:
    """A record's stall and prefetch held to what its engine and system can book: the wall clock on the CPU as device
    books no stall (its work runs as it is launched), nor does a simulated run of a system whose device waits only
    on copies its host already waited for (`System.stall_free`) or of one that copies nothing and computes on no host;
    a system whose prefetches stay protected to the window's verification (`System.prefetch_in_window`) prefetches at
    most the experts its windows placed (`extra.counts.window_placed`), and one of a few plans a window
    (`System.window_plans`) at most those plans' slots in every MoE layer of every window."""
    from specter.system_names import host_compute_names, prefetch_in_window_names, stall_free_names, window_plans

    stall, system, engine = record.get("stall_ms"), record.get("system"), record.get("engine")
    device = config.get("device") if isinstance(config.get("device"), dict) else {}
    copied = [record.get("h2d_bytes_demand"), record.get("h2d_bytes_prefetch"), extra.get("h2d_bytes_prefill"),
              extra.get("d2h_bytes_writeback"), extra.get("link_bytes_activations")]
    why = ("the wall clock on the CPU as device books none (its work runs as it is launched)"
           if engine == "live" and device.get("kind") == "cpu" else
           f"{system}'s device waits only for copies its host has waited for" if engine == "sim" and
           system in stall_free_names() else
           "a simulated run that copies nothing and computes on no host waits on nothing" if engine == "sim" and
           system not in host_compute_names() and not any(copied) else None)
    if why and stall:
        return f"stall_ms is {stall!r}, and {why}"
    each = (config.get("expert_storage") or {}).get("expert_bytes") if isinstance(config.get("expert_storage"),
                                                                                 dict) else None
    placed, fetched = (extra.get("counts") or {}).get("window_placed"), record.get("h2d_bytes_prefetch")
    if system in prefetch_in_window_names() and all(isinstance(v, int) for v in (each, placed, fetched)) and \
            fetched > placed * each:
        return (f"h2d_bytes_prefetch is {fetched}, and {system}'s prefetches are among the {placed} experts its "
                f"windows placed (extra.counts.window_placed), {placed * each} bytes (config.expert_storage)")
    plans, passes = window_plans(str(system)), (extra.get("counts") or {}).get("decode_passes")
    layers = (config.get("routing") or {}).get("moe_layers") if isinstance(config.get("routing"), dict) else None
    slots = record.get("slots_per_layer")
    if plans is not None and all(isinstance(v, int) for v in (each, fetched, passes, layers, slots)) and \
            fetched > plans * passes * layers * slots * each:
        return (f"h2d_bytes_prefetch is {fetched}, and {passes} windows of at most {plans} plans of {slots} slots in "
                f"each of {layers} MoE layers prefetch at most {plans * passes * layers * slots * each} bytes")
    return None


def budget_problem(record: dict, config: dict, memory: dict) -> str | None:
    """A record's memory plan held to the budget its run was given (`config`'s one budget flag): its kind, its bytes
    (`--device-memory-gb`), its slots (`--resident-per-layer`, `--resident-fraction` of the experts), and for a budget
    in bytes the most slots a layer whose rows fit beside the resident part (`offload.memory.plan_memory`)."""
    from specter.runspec.parts import Budget

    kind, given = memory.get("budget_kind"), [k for k, name in Budget.KINDS.items() if config.get(name) is not None]
    if given != [kind]:
        return (f"config.memory.budget_kind is {kind!r:.20}, and its run was given "
                f"{', '.join(Budget.FLAGS[k] for k in given) or 'no budget'}")
    value, slots, experts = config[Budget.KINDS[kind]], record.get("slots_per_layer"), record.get("experts_per_layer")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        return f"config.{Budget.KINDS[kind]} is {value!r:.20}, not a budget (a positive finite number)"
    budget, resident, rows = memory.get("budget_bytes"), memory.get("resident_bytes"), memory.get("expert_slot_bytes")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (slots, experts, resident, rows)) or slots < 1:
        return None  # the plan's own checks name these
    if kind in ("slots", "fraction"):
        want = int(value) if kind == "slots" else max(1, round(value * experts))
        if budget is not None or slots != want:
            return (f"slots_per_layer is {slots} (budget_bytes {budget!r}), and {Budget.FLAGS[kind]} {value!r:.20} "
                    f"of {experts} experts gives {want} slots")
        return None
    if kind == "gb" and budget != int(value * 1e9):
        return f"config.memory.budget_bytes is {budget!r:.20}, and --device-memory-gb {value!r:.20} is that x 1e9"
    fit = min(experts, (budget - resident) // (rows // slots)) if isinstance(budget, int) and rows else None
    if slots != fit:
        return (f"slots_per_layer is {slots}, and a budget of {budget!r:.20} bytes beside the resident {resident} "
                f"holds {fit!r} slots a layer of {rows // slots} bytes")
    return None


def arithmetic_problem(record: dict, extra: dict, config: dict) -> str | None:
    """Where a record's sums and counts contradict each other: its time's parts and its TPOT, its twin's parts and
    the twin's TPOT, draft time on a run that drafts none, its lower bound and the bound it names, its memory plan's
    parts and their total, its window figures on a run without a window, its demand hits and misses against the
    decode's counts, misses without the bytes they copy, a negative byte count."""
    from specter.system_names import host_compute_names, whole_layer_copier_names

    tokens, tpot = len(record.get("output_token_ids") or []), record.get("tpot_ms")
    for name, time in (("breakdown_ms", tpot), ("simulated_breakdown_ms", extra.get("simulated_tpot_ms"))):
        parts = extra.get(name)
        if isinstance(parts, dict) and record.get("k") is None and parts.get("draft"):
            return f"extra.{name}.draft is {parts['draft']!r}, and {record.get('system')} drafts no window (k is null)"
        if isinstance(parts, dict) and isinstance(time, (int, float)) and tokens > 1 and not _close(
                sum(parts.values()), time * (tokens - 1)):
            return (f"extra.{name}'s parts sum to {sum(parts.values()):g} ms, and its TPOT {time:g} ms over "
                    f"{tokens - 1} tokens is {time * (tokens - 1):g} ms")
        host = parts.get("host compute") if isinstance(parts, dict) else None
        if host and (record.get("system") not in host_compute_names() or extra.get("host_layers") == []):
            return (f"extra.{name}['host compute'] is {host!r}, and this run of {record.get('system')} computes no "
                    "expert on the host")
    kind, bound = extra.get("lower_bound_kind"), record.get("lower_bound_tpot_ms")
    if bound is not None and kind not in ("per-pass", "per-token"):
        return f"extra.lower_bound_kind is {kind!r}, and a lower bound is per-pass or per-token"
    if bound is not None and kind != ("per-token" if record.get("k") is None else "per-pass"):
        return (f"extra.lower_bound_kind is {kind!r}, and a run's bound is per-pass where it drafts windows, per-token "
                "where it does not (timing/bounds.py)")
    for name in ("lower_bound_per_pass_ms", "lower_bound_per_token_ms"):
        value = extra.get(name)
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and 0 <= value < math.inf):
            return f"extra.{name} is {value!r}, not a time of at least 0 ms"
    named = extra.get({"per-pass": "lower_bound_per_pass_ms", "per-token": "lower_bound_per_token_ms"}.get(kind, ""))
    if bound is not None and named is None:
        return f"lower_bound_tpot_ms is {bound!r}, and extra holds no {kind} bound for it"
    if isinstance(named, (int, float)) and isinstance(bound, (int, float)) and not _close(named, bound):
        return f"lower_bound_tpot_ms is {bound:g}, and its {kind} bound (extra) is {named:g}"
    for name in ("h2d_bytes_prefill", "link_bytes_activations", "d2h_bytes_writeback"):
        value = extra.get(name)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return f"extra.{name} is {value!r}, not a whole number of bytes of at least 0"
    memory = config.get("memory")
    if isinstance(memory, dict) and all(isinstance(memory.get(k), int) for k in (
            "resident_bytes", "non_expert_bytes", "draft_bytes", "kv_bytes", "workspace_bytes", "expert_slot_bytes")):
        parts = sum(memory[k] for k in ("non_expert_bytes", "draft_bytes", "kv_bytes", "workspace_bytes"))
        if memory["resident_bytes"] != parts:
            return f"config.memory.resident_bytes is {memory['resident_bytes']}, and its parts sum to {parts}"
        storage = config.get("expert_storage") if isinstance(config.get("expert_storage"), dict) else {}
        layers, each, slots = memory.get("moe_layers"), storage.get("expert_bytes"), memory.get("slots_per_layer")
        held = slots * layers * each if all(isinstance(v, int) for v in (layers, each, slots)) else None
        if held is not None and memory["expert_slot_bytes"] != held:
            return (f"config.memory.expert_slot_bytes is {memory['expert_slot_bytes']}, and its {slots} slots in each "
                    f"of {layers} MoE layers hold {held} bytes of experts of {each} "
                    "(config.expert_storage)")
        problem = budget_problem(record, config, memory)
        if problem:
            return problem
        placed = memory.get("placed_slot_bytes")
        if placed is not None and not (isinstance(placed, int) and 0 <= placed <= memory["expert_slot_bytes"]
                                       and (not isinstance(each, int) or each <= 0 or placed % each == 0)):
            return (f"config.memory.placed_slot_bytes is {placed!r}, not whole experts within its "
                    f"{memory['expert_slot_bytes']} bytes of slots")
        device = memory.get("device_bytes")
        if isinstance(device, int) and memory.get("fits_device") is not (
                memory["resident_bytes"] + memory["expert_slot_bytes"] <= device):
            return (f"config.memory.fits_device is {memory.get('fits_device')!r}, and its resident part and slots "
                    f"({memory['resident_bytes'] + memory['expert_slot_bytes']} bytes) against the device's {device} "
                    "give the other")
    profile = config.get("hardware_profile") if isinstance(config.get("hardware_profile"), dict) else {}
    given, ops = config.get("pricing"), config.get("priced_ops")
    pricing = given or ("counted" if record.get("engine") == "live" else "fused")
    if isinstance(ops, dict) and "pricing" in ops and ops["pricing"] != pricing:
        return f"config.pricing is {given!r} ({pricing}), and its priced ops are {ops['pricing']!r}"
    dispatch = (profile.get("host") or {}).get("dispatch_us") if isinstance(profile.get("host"), dict) else None
    if config.get("dispatch_us") is not None and dispatch is not None and config["dispatch_us"] != dispatch:
        return f"config.dispatch_us is {config['dispatch_us']!r}, and its profile's dispatch is {dispatch!r} us"
    device = (profile.get("device") or {}).get("memory_gb") if isinstance(profile.get("device"), dict) else None
    if isinstance(memory, dict) and isinstance(device, (int, float)) and memory.get("device_bytes") is not None and \
            memory["device_bytes"] != int(device * 1e9):
        return f"config.memory.device_bytes is {memory['device_bytes']!r}, and its profile's device holds {device} GB"
    if isinstance(config.get("max_new_tokens"), int) and tokens != config["max_new_tokens"]:
        return f"{tokens} output tokens, and its run commits config.max_new_tokens = {config['max_new_tokens']}"
    if record.get("k") is None:
        given = [name for name in ("acceptance_rate", "window_utilization", "window_recall", "window_working_set")
                 if record.get(name) is not None]
        if given:
            return f"{given[0]} is {record[given[0]]!r} in a run that drafts no window (k is null)"
    counts = extra.get("counts") or {}
    for field, part in (("demand_hits", "decode_hits"), ("demand_misses", "decode_misses")):
        value, decode = record.get(field), counts.get(part)
        if isinstance(value, int) and isinstance(decode, int) and value < decode:
            return f"{field} is {value}, fewer than the decode's own (extra.counts.{part} = {decode})"
    problem = (lookups_problem(record, counts, config) or split_problem(record, extra, config)
               or traffic_problem(record, extra, config))
    if problem:
        return problem
    misses, copied = record.get("demand_misses"), record.get("h2d_bytes_demand")
    each = (config.get("expert_storage") or {}).get("expert_bytes") if isinstance(config.get("expert_storage"),
                                                                                 dict) else None
    if (isinstance(misses, int) and isinstance(copied, int) and record.get("system") not in host_compute_names()
            and record.get("engine") == "sim"):
        if misses > 0 and copied == 0:
            return f"demand_misses is {misses} with no bytes copied on demand, and each miss copies its expert"
        exact = record.get("system") not in whole_layer_copier_names()  # a miss copies its expert, and only it
        if isinstance(each, int) and each > 0 and (copied < misses * each or copied % each or (
                exact and copied != misses * each)):
            return (f"h2d_bytes_demand is {copied}, and its {misses} demand misses copy "
                    + (f"whole experts of {each} bytes" if copied % each else
                       f"{'' if exact else 'at least '}{misses * each} bytes") + " (config.expert_storage)")
        prefill = (record.get("extra") or {}).get("h2d_bytes_prefill")
        for name, value in (("h2d_bytes_prefetch", record.get("h2d_bytes_prefetch")),
                            ("extra.h2d_bytes_prefill", prefill),
                            ("extra.d2h_bytes_writeback", (record.get("extra") or {}).get("d2h_bytes_writeback"))):
            if isinstance(each, int) and each > 0 and isinstance(value, int) and value % each:
                return (f"{name} is {value}, and a prefetch, a prefill or a write-back copies whole experts of "
                        f"{each} bytes")
        if isinstance(prefill, int) and isinstance(record.get("h2d_bytes_prefetch"), int) and \
                prefill > copied + record["h2d_bytes_prefetch"]:
            return f"extra.h2d_bytes_prefill is {prefill}, more than the run's demand and prefetch bytes together"
        first = misses - counts.get("decode_misses", 0)  # the prefill's: no window has drafted, nothing prefetched
        if exact and isinstance(each, int) and isinstance(prefill, int) and prefill != first * each:
            return (f"extra.h2d_bytes_prefill is {prefill}, and the prefill's {first} demand misses (demand_misses "
                    f"less extra.counts.decode_misses) copy {first * each} bytes")
    return None
