"""What no run writes: a record's impossible values, and its fields that contradict each other or its own config.

`record_problem` is every strict read's check (`records.read_jsonl`, and through it `specter aggregate`): a time
negative, non-finite or over a day, a count below zero, a share outside [0, 1], a window or histogram its tokens and
settings cannot give, names, engine, slots, hardware hash, hit rate and commit times that disagree with the record's
own config, profile and counts. Each rule holds on every record a reproduce writes.
"""

from __future__ import annotations

import math

from specter.errors import SpecterError
from specter.runspec.parts import GOVERNORS

#: a record's times: finite, never negative, and under a day (no decode takes a day a token)
_TIMES = ("ttft_ms", "tpot_ms", "lower_bound_tpot_ms", "stall_ms")
MAX_TIME_MS = 86_400_000.0
#: its counts: never negative
_COUNTS = ("demand_hits", "demand_misses", "h2d_bytes_prefetch", "h2d_bytes_demand", "prompt_index")
#: its shares: in [0, 1] where given
_SHARES = ("acceptance_rate", "window_utilization", "hit_rate", "hit_rate_pass", "hit_rate_token", "window_recall",
           "prefetch_precision", "prefetch_recall")


def record_problem(record: dict) -> str | None:
    """What in a run record (its fields' types already checked) no run can produce, or None: a time that is negative,
    NaN or infinite, a negative count, a share outside [0, 1], a TPOT of 0 over several tokens, more slots than
    experts."""
    try:
        return _record_problem(record)
    except OverflowError:  # an integer no float holds, or an infinity taken as a count
        return "a number too large for its field (an integer no float holds, or an infinite count)"


#: the record's fields that are shares of its `extra.counts`: (field, part, whole), None where the whole is 0
_SHARES_OF_COUNTS = (("hit_rate_pass", "decode_hits", ("decode_hits", "decode_misses")),
                     ("hit_rate_token", "decode_token_hits", ("decode_token_hits", "decode_token_misses")),
                     ("prefetch_precision", "window_hits", ("window_placed",)),
                     ("window_recall", "window_hits", ("window_needed",)),
                     ("prefetch_recall", "window_hits", ("window_needed",)),
                     ("window_working_set", "window_needed", ("window_layers",)))


def _counts_problem(record: dict, counts: dict) -> str | None:
    """Where a record's rates are not the shares its counts give (each counted once a run; a rate is null where its
    whole is 0, and a speculative share null where nothing was proposed)."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"extra.counts.{name} is {value!r:.40}, and a count is a whole number, never negative"
    lacks = sorted({key for _, part, whole in _SHARES_OF_COUNTS for key in (part, *whole)} - set(counts))
    if lacks:
        return f"extra.counts lacks {', '.join(lacks)}, which every run of this version counts"
    for rate, part, whole in _SHARES_OF_COUNTS:
        total = sum(counts[w] for w in whole)
        proposed = counts.get("proposed", 0) > 0 or not rate.startswith(("prefetch", "window"))
        want = counts[part] / total if total and proposed else None
        value = record.get(rate)
        if (value is None) != (want is None) or (want is not None and not (
                isinstance(value, (int, float)) and math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-12))):
            return f"{rate} is {value!r}, and extra.counts give {want!r} ({part} over {' + '.join(whole)})"
    return None


def _config_problem(record: dict, config: dict) -> str | None:
    """Where a record's run settings are none a run takes: a temperature that is negative or not finite, a prefix or
    output length, repeat count or seed that is not a whole number in its range, more tokens than it asked for."""
    temperature = config.get("temperature")
    if temperature is not None and not (isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
                                        and math.isfinite(temperature) and temperature >= 0):
        return f"config.temperature is {temperature!r}, and a temperature is finite and never negative"
    from specter.runspec import MIN_TEMPERATURE

    if temperature and temperature < MIN_TEMPERATURE:
        return f"config.temperature is {temperature!r}, and a run samples at 0 or from {MIN_TEMPERATURE:g}"
    for name, least in (("prefix_tokens", 0), ("max_new_tokens", 1), ("repeats", 1), ("num_prompts", 1)):
        value = config.get(name)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
            return f"config.{name} is {value!r}, and it is a whole number, at least {least}"
    tokens, most = record.get("output_token_ids"), config.get("max_new_tokens")
    if isinstance(tokens, list) and isinstance(most, int) and len(tokens) > most:
        return f"output_token_ids holds {len(tokens)} tokens, and its run asked for at most {most}"
    prompt, length = record.get("prompt_token_ids"), config.get("prefix_tokens")
    if isinstance(prompt, list) and isinstance(length, int) and length > 0 and len(prompt) != length:
        return f"prompt_token_ids holds {len(prompt)} tokens, and its run's prompts are {length} long"
    return None


def _record_problem(record: dict) -> str | None:
    from specter.runspec import MAX_WINDOW

    for name in ("output_token_ids", "prompt_token_ids"):
        ids = record.get(name)
        if ids is not None and not (isinstance(ids, list)
                                    and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            return f"{name} holds something other than whole numbers"
    for name in _TIMES:
        value = record.get(name)
        if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_TIME_MS):
            return f"{name} is {value!r}, and a time is finite, never negative and under a day (ms)"
    wall = record.get("wall_s")
    if wall is not None and not (math.isfinite(wall) and wall >= 0):
        return f"wall_s is {wall!r}, and a time is finite and never negative"
    tokens = record.get("output_token_ids")
    if not tokens:
        return "output_token_ids is empty, and every run commits at least one token"
    if any(t < 0 for t in [*tokens, *(record.get("prompt_token_ids") or [])]):
        return "a token id is negative"
    prompts = (record.get("config") or {}).get("num_prompts")
    if isinstance(prompts, int) and not 0 <= record.get("prompt_index", 0) < prompts:
        return f"prompt_index is {record.get('prompt_index')!r} in a run of {prompts} prompts"
    bound = record.get("lower_bound_tpot_ms")
    if len(tokens) > 1 and bound is not None and bound <= 0:
        return f"lower_bound_tpot_ms is {bound!r} over {len(tokens)} tokens (every token reads weights)"
    experts = record.get("experts_per_layer")
    if isinstance(experts, int) and experts < 1:
        return f"experts_per_layer is {experts}, and a MoE layer has at least one expert"
    k = record.get("k")
    if k is not None and not 1 <= k <= MAX_WINDOW:
        return f"k is {k!r}, and a window is 1 to {MAX_WINDOW} tokens"
    from specter.system_names import speculative_names, system_names

    system = record.get("system")
    if isinstance(system, str) and system in system_names() and (k is None) == (system in speculative_names()):
        why = "drafts a window, and so has a K" if k is None else "drafts no window (k is its draft window)"
        return f"k is {k!r} for {system}, which {why}"
    histogram = record.get("accepted_length_histogram") or {}
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in histogram.values()):
        return "accepted_length_histogram holds a count that is not a whole number of at least 0"
    if k is None and histogram:
        return "accepted_length_histogram is not empty in a run that drafts no window (k is null)"
    if k is not None and len(tokens) > 1 and not histogram:
        return "accepted_length_histogram is empty in a speculative run of several tokens"
    problem = _window_problem(record, k, histogram, len(tokens))
    if problem:
        return problem
    working = record.get("window_working_set")
    if working is not None and isinstance(experts, int) and not 0 <= working <= experts:
        return f"window_working_set is {working!r} with {experts} experts a layer"
    tpot, bound = record.get("tpot_ms"), record.get("lower_bound_tpot_ms")
    if record.get("simulated") is True and tpot and bound and tpot < bound * (1 - 1e-9):
        return f"tpot_ms is {tpot!r}, under its own lower bound {bound!r} (a simulated run never is)"
    profile = (record.get("config") or {}).get("hardware_profile")
    if not isinstance(profile, dict):
        return "config.hardware_profile is missing (every record carries the profile it ran on)"
    from specter.timing.hardware import profile_from_dict

    problem = _config_problem(record, record.get("config") or {})
    if problem is not None:
        return problem

    try:  # its numbers as a profile file's are checked (a record of a version before its digest has only these)
        profile_from_dict(profile, "config.hardware_profile")
    except SpecterError as err:
        return " ".join(str(err).split())[:200]
    if record.get("simulated") is True and record.get("hardware") != profile.get("name"):
        return (f"hardware is {record.get('hardware')!r}, and the profile it was simulated on is named "
                f"{profile.get('name')!r}")
    given = (record.get("config") or {}).get("hardware")
    from specter.timing import preset_names

    if isinstance(given, str) and given in preset_names() and given != profile.get("name"):
        return (f"config.hardware is the preset {given!r}, and the profile its run was given is named "
                f"{profile.get('name')!r} (a preset's profile carries its name)")
    for name in _COUNTS:
        if record.get(name) is not None and (record[name] < 0 or not math.isfinite(float(record[name]))):
            return f"{name} is {record[name]!r}, and a count is never negative"
    if (record.get("h2d_bytes_demand") or 0) > 0 and not record.get("demand_misses"):
        return f"h2d_bytes_demand is {record['h2d_bytes_demand']!r} with no demand miss to copy"
    for name in _SHARES:
        value = record.get(name)
        if value is not None and not (0 <= value <= 1):
            return f"{name} is {value!r}, outside [0, 1]"
    if len(record.get("output_token_ids") or []) > 1 and record.get("tpot_ms") == 0:
        return f"tpot_ms is 0 over {len(record['output_token_ids'])} tokens"
    slots, experts = record.get("slots_per_layer"), record.get("experts_per_layer")
    if isinstance(slots, int) and isinstance(experts, int) and not 0 <= slots <= experts:
        return f"slots_per_layer is {slots} with {experts} experts a layer"
    return _consistency_problem(record)


def _consistency_problem(record: dict) -> str | None:
    """Where a record's fields contradict each other or its own config (each holds on every record a reproduce
    writes): its run's names, engine and slots against its config, its hardware's hash against its profile, its hit
    rate against its hits and misses, its TPOT and TTFT against its commit times, its repeat and forwards counts."""
    from specter.timing.hardware import profile_digest

    config = record.get("config") or {}
    for name in ("system", "hardware", "dataset", "model", "cost_as"):
        value = record.get(name)
        if isinstance(value, str) and (not value.isprintable() or "|" in value):
            return f"{name} is {value!r:.60}, which no run names (tables and reports print it)"
    from specter.system_names import system_names

    if isinstance(record.get("system"), str) and record["system"] not in system_names():
        known = ", ".join(sorted(system_names()))
        return f"system is {record['system']!r:.60}, which the suite does not have ({known})"
    for name in ("system", "model", "dataset", "engine"):
        if name in config and record.get(name) != config[name]:
            return f"{name} is {record.get(name)!r}, and its run's config.{name} is {config[name]!r}"
    from specter.record_settings import settings_problem

    problem = settings_problem(record, config)
    if problem:
        return problem
    priced = config.get("cost") if "cost" in config else record.get("cost_as")
    priced = priced.get("architecture") if isinstance(priced, dict) else priced
    if record.get("cost_as") != priced:
        return f"cost_as is {record.get('cost_as')!r}, and its run's config.cost prices it at {priced!r}"
    missing = [key for key in ("system", "model", "dataset", "engine", "cost", "seed", "hardware_sha256",
                               "model_sha256", "system_options", "system_settings", "expert_bits", "routing")
               if key not in config]
    if missing:  # what the checks here hold a record to: dropping one must not skip them
        return f"config lacks {', '.join(missing)}, which every run of this version writes"
    from specter.runspec import EXPERT_BITS

    bits, storage = config["expert_bits"], config.get("expert_storage")
    if isinstance(bits, bool) or bits not in EXPERT_BITS or (isinstance(storage, dict) and storage.get("bits") != bits):
        stored = f", and its experts are stored at {storage.get('bits')!r}" if isinstance(storage, dict) else ""
        return (f"config.expert_bits is {bits!r:.20}{stored} (config.expert_storage); a run's experts are stored at "
                f"one of {', '.join(map(str, EXPERT_BITS))}")
    for name in ("hardware_sha256", "model_sha256"):
        digest = config[name]
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            return f"config.{name} is {digest!r:.70}, not a sha256"
    temperature = config.get("temperature") or 0
    seed = config["seed"] + (record.get("prompt_index", 0) if temperature > 0 else 0) if isinstance(
        config["seed"], int) else None
    if record.get("seed") != seed:
        return (f"seed is {record.get('seed')!r}, and its run's config.seed {config['seed']!r} gives "
                f"{seed!r} for prompt {record.get('prompt_index')!r}")
    if record.get("engine") not in ("sim", "live"):
        return f"engine is {record.get('engine')!r}, and a run's engine is sim or live"
    if record.get("simulated") is not (record.get("engine") == "sim"):
        return f"simulated is {record.get('simulated')!r} on engine {record.get('engine')!r}"
    memory = config.get("memory")
    if isinstance(memory, dict) and "slots_per_layer" in memory and memory["slots_per_layer"] != record.get(
            "slots_per_layer"):
        return (f"slots_per_layer is {record.get('slots_per_layer')!r}, and its run's memory plan gives "
                f"{memory['slots_per_layer']!r}")
    if "slots_per_layer" in config and record.get("slots_per_layer") != config["slots_per_layer"]:
        return (f"slots_per_layer is {record.get('slots_per_layer')!r}, and its run's config.slots_per_layer is "
                f"{config['slots_per_layer']!r}")
    digest = config.get("hardware_sha256")
    if digest is not None:
        try:
            ours = profile_digest(config["hardware_profile"])
        except (TypeError, ValueError, AttributeError, KeyError):
            return "config.hardware_profile is not a profile"
        if digest != ours:
            return "config.hardware_sha256 is not the hash of config.hardware_profile (the profile was edited)"
    hits, misses, rate = record.get("demand_hits"), record.get("demand_misses"), record.get("hit_rate")
    if None not in (hits, misses, rate) and hits + misses > 0 and not math.isclose(rate, hits / (hits + misses),
                                                                                   rel_tol=1e-9, abs_tol=1e-12):
        return f"hit_rate is {rate!r}, and its hits and misses give {hits / (hits + misses)!r}"
    extra = record.get("extra") or {}
    if not isinstance(extra, dict):
        return "extra is not an object"
    missing = [key for key, kind in (("commit_ms", list), ("counts", dict)) if not isinstance(extra.get(key), kind)]
    if missing:  # what the checks below hold a record to: dropping it must not skip them
        return f"extra lacks {', '.join(missing)} (or holds another type), which every run of this version writes"
    problem = _counts_problem(record, extra["counts"])
    if problem is not None:
        return problem
    commits, tokens = extra.get("commit_ms"), len(record.get("output_token_ids") or [])
    if commits is not None:
        if not (isinstance(commits, list) and len(commits) == tokens
                and all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in commits)):
            return f"extra.commit_ms is not one finite time for each of the {tokens} tokens"
        if any(b < a for a, b in zip(commits, commits[1:])):
            return "extra.commit_ms goes back in time"
        if not math.isclose(record.get("ttft_ms"), commits[0], rel_tol=1e-9, abs_tol=1e-9):
            return f"ttft_ms is {record.get('ttft_ms')!r}, and its first commit is at {commits[0]!r} ms"
        stall = record.get("stall_ms")
        if commits and isinstance(stall, (int, float)) and stall > commits[-1] * (1 + 1e-9) + 1e-9:
            return f"stall_ms is {stall!r}, longer than the whole run ({commits[-1]!r} ms to its last commit)"
        if tokens > 1 and not math.isclose(record.get("tpot_ms"), (commits[-1] - commits[0]) / (tokens - 1),
                                           rel_tol=1e-9, abs_tol=1e-9):
            given = (commits[-1] - commits[0]) / (tokens - 1)
            return f"tpot_ms is {record.get('tpot_ms')!r}, and its commit times give {given!r}"
    shares = (int, float)  # JSON's numbers (exact types: a bool is no number here)
    for entry in record.get("expert_prediction") or []:  # a record holds thousands: plain checks, no generators
        get = entry.get if type(entry) is dict else {}.get
        precision, recall = get("precision"), get("recall")
        if (type(get("layer")) is not int or type(get("distance")) is not int or type(precision) not in shares
                or type(recall) not in shares or not 0 <= precision <= 1 or not 0 <= recall <= 1):
            return f"expert_prediction holds {str(entry)[:80]}, not a layer, a distance and two shares in [0, 1]"
    problem = _prediction_problem(record, record.get("expert_prediction") or [])
    if problem:
        return problem
    for name in ("breakdown_ms", "simulated_breakdown_ms"):
        parts = extra.get(name)
        if parts is not None and not (isinstance(parts, dict) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= MAX_TIME_MS
                for v in parts.values())):
            return f"extra.{name} is not a time, finite and never negative, for each part"
    memory = config.get("memory")
    if memory is not None and not (isinstance(memory, dict) and all(
            v is None or isinstance(v, bool) or isinstance(v, str) or (isinstance(v, int) and v >= 0)
            for v in memory.values())):
        return "config.memory holds a byte count or slot count that is not a whole number of at least 0"
    problem = _window_counts_problem(record, extra.get("counts"))
    if problem:
        return problem
    for name in ("repeat", "live_forwards"):
        value = extra.get(name)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return f"extra.{name} is {value!r}, not a whole number of at least 0"
    timed = (extra.get("repeats") or {}).get("timed") if isinstance(extra.get("repeats"), dict) else None
    if isinstance(extra.get("repeat"), int) and isinstance(timed, int) and not extra["repeat"] < timed:
        return f"extra.repeat is {extra['repeat']}, and its run timed {timed} repeats (0 to {timed - 1})"
    from specter.record_sums import arithmetic_problem, placement_problem

    return placement_problem(record, extra, config) or arithmetic_problem(record, extra, config)


def _prediction_problem(record: dict, prediction: list[dict]) -> str | None:
    """Expert prediction as a run writes it: each (MoE layer, lookahead distance) once, every MoE layer of its routing
    at the same distances 1 .. D (each window covers every layer, and the longest window of the prompt sets D), D the
    run's K where it is fixed (every window drafts K)."""
    if not prediction:
        return None
    pairs = [(entry["layer"], entry["distance"]) for entry in prediction]
    if len(set(pairs)) != len(pairs):
        return "expert_prediction gives one (layer, distance) twice"
    layers = {layer for layer, _ in pairs}
    longest = max(distance for _, distance in pairs)
    if min(layer for layer, _ in pairs) < 0 or len(pairs) != len(layers) * longest or min(d for _, d in pairs) < 1:
        return (f"expert_prediction holds layers {sorted(layers)[:8]} at distances other than 1 to {longest} each (a "
                "run predicts every layer at every distance of its longest window)")
    fixed = str((record.get("config") or {}).get("k")) not in GOVERNORS
    if fixed and isinstance(record.get("k"), int) and longest != record["k"]:
        return f"expert_prediction reaches distance {longest}, and every window of the run drafts K = {record['k']}"
    routing = (record.get("config") or {}).get("routing")
    moe = routing.get("moe_layers") if isinstance(routing, dict) else None
    if isinstance(moe, int) and len(layers) != moe:
        return f"expert_prediction holds {len(layers)} layers, and the run's routing has {moe} MoE layers"
    return None


def _window_problem(record: dict, k, histogram: dict, tokens: int) -> str | None:
    """Where a record's K and its accepted-length histogram contradict its settings or its tokens. A window of `a`
    accepted draft tokens commits a + 1 tokens, and every token after the prefill's first comes from a window: the
    windows commit at least the tokens after the first, and overshoot them by less than their longest window."""
    config = record.get("config") or {}
    settings = config.get("system_settings") or {}
    fixed = settings["k"] if "k" in settings else config.get("k")
    if k is not None and isinstance(fixed, int) and not isinstance(fixed, bool) and k != fixed:
        where = "config.system_settings.k" if "k" in settings else "config.k"
        return f"k is {k!r}, and the run's window is {where} = {fixed!r}"
    if not histogram:
        return None
    try:
        lengths = {int(a): count for a, count in histogram.items()}
    except ValueError:
        return f"accepted_length_histogram has a key that is not a whole number: {sorted(histogram)!r}"
    longest = max(lengths)
    if min(lengths) < 0 or (isinstance(fixed, int) and k is not None and longest > k):
        return f"accepted_length_histogram holds an accepted length outside 0..K (lengths {sorted(lengths)}, k {k})"
    committed = sum((a + 1) * count for a, count in lengths.items())
    if not 0 <= committed - (tokens - 1) <= longest:
        return (f"accepted_length_histogram's windows commit {committed} tokens, and the run's {tokens} tokens "
                f"need {tokens - 1} from windows (at most {longest} more, the last window's overshoot)")
    return None


def _window_counts_problem(record: dict, counts) -> str | None:
    """Where a speculative record's shares contradict its window counts (`extra.counts`: proposed, checked and
    accepted draft tokens) or its accepted-length histogram: the acceptance rate is accepted over checked, the window
    utilization accepted over proposed, and the histogram's accepted lengths sum to the accepted tokens."""
    if not isinstance(counts, dict) or record.get("acceptance_rate") is None:
        return None
    try:
        accepted, checked, proposed = (int(counts[k]) for k in ("accepted", "checked", "proposed"))
    except (KeyError, TypeError, ValueError):
        return "extra.counts lacks whole proposed, checked and accepted counts"
    if not 0 <= accepted <= checked <= proposed:
        return f"extra.counts has {accepted} accepted of {checked} checked of {proposed} proposed"
    for name, value in (("acceptance_rate", accepted / checked if checked else None),
                        ("window_utilization", accepted / proposed if proposed else None)):
        if value is not None and not math.isclose(record.get(name) or 0.0, value, rel_tol=1e-9, abs_tol=1e-12):
            return f"{name} is {record.get(name)!r}, and its window counts give {value!r}"
    histogram = record.get("accepted_length_histogram") or {}
    if histogram and sum(int(a) * n for a, n in histogram.items()) != accepted:
        return f"accepted_length_histogram's windows accept other than the {accepted} accepted tokens its counts hold"
    return None
