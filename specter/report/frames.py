"""Run records as frames: `read_records` reads JSONL files, `records_frame` flattens records to one row per (run,
prompt, repeat) with the settings that tell runs apart and the metrics the tables aggregate (`METRICS`, averaged over
prompts; `COUNTS`, summed). The experiments' tables (`specter.report.tables`) and the calibration against published
figures (`specter.report.calibration`) are built on them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from specter.errors import SpecterError
from specter.runspec import Budget

#: the per-prompt metrics of a record the tables average over prompts
METRICS = ["tpot_ms", "lower_bound_tpot_ms", "ttft_ms", "acceptance_rate", "window_utilization", "window_recall",
           "window_working_set", "stall_ms", "hit_rate", "hit_rate_pass", "hit_rate_token", "prefetch_precision",
           "prefetch_recall"]
#: the per-prompt counts the tables sum
COUNTS = ["demand_misses", "h2d_bytes_demand", "h2d_bytes_prefetch", "live_forwards"]


def read_records(paths: list[str | Path]) -> list[dict]:
    from specter.records import read_jsonl, record_key

    records, seen, profiles, named = [], {}, {}, {}
    for path in paths:
        for number, record in enumerate(read_jsonl(path), 1):
            key = record_key(record)
            if key in seen:
                raise SpecterError(f"record {number} of {path} repeats record {seen[key][1]} of {seen[key][0]} "
                                   f"({record.get('system')}, prompt {record.get('prompt_index')}, the same run): "
                                   "a table would count that prompt twice; give each run's records once")
            seen[key] = (path, number)
            _same_hardware(record, path, number, profiles)
            _same_model_and_prompts(record, path, number, named)
            records.append(record)
    if not records:
        raise SpecterError(f"no records in {', '.join(map(str, paths))}; the runs wrote nothing")
    _whole_runs(records, seen)
    return records


def _whole_runs(records: list[dict], where: dict) -> None:
    """Refuse a run some of whose records are missing (a file cut at a line's end, a record deleted): every run
    records each of its `num_prompts` prompts, each as often as the others."""
    from collections import Counter

    from specter.records import record_key, run_key

    runs: dict[str, Counter] = {}
    first: dict[str, tuple] = {}
    for record in records:
        key = run_key(record)
        runs.setdefault(key, Counter())[record.get("prompt_index")] += 1
        first.setdefault(key, where[record_key(record)])
    for key, prompts in runs.items():
        wanted = (json.loads(key)[0] or {}).get("num_prompts")
        if isinstance(wanted, int) and (set(prompts) != set(range(wanted)) or len(set(prompts.values())) != 1):
            path, number = first[key]
            lacking = sorted(set(range(wanted)) - set(prompts))
            said = (f"lacks prompt(s) {lacking[:5]}" if lacking else
                    f"records its prompts {dict(sorted(prompts.items()))} times")
            twin = next((other for other in runs if other != key and first[other][0] == path
                         and json.loads(other)[1:] == json.loads(key)[1:]), None)
            if twin is not None:  # another run of the same file and system: records whose configs were made to differ
                differ = differing(json.loads(key)[0] or {}, json.loads(twin)[0] or {})
                raise SpecterError(f"record {number} and record {first[twin][1]} of {path} ({json.loads(key)[1]}) "
                                   f"differ in config {', '.join(differ[:3]) or 'values'}: one run's records share "
                                   "one config, so the file was edited; run it again")
            raise SpecterError(f"the run of record {number} of {path} ({json.loads(key)[1]}) has {wanted} prompts and "
                               f"{said}: a file cut short or edited; run it again")


def differing(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two configs."""
    out = []
    for name in sorted(set(a) | set(b), key=str):
        x, y = a.get(name), b.get(name)
        if isinstance(x, dict) and isinstance(y, dict):
            out += differing(x, y, f"{prefix}{name}.")
        elif x != y:
            out.append(f"{prefix}{name}")
    return out


def _same_model_and_prompts(record: dict, path, number: int, named: dict) -> None:
    """Refuse two records that name one model but hold other weights (`config.model_sha256`), or one prompt of one
    prompt set (its name, field and length, on one model) but other tokens: a table would average two models, or two
    prompts, as one."""
    config = record.get("config") or {}
    digest = config.get("model_sha256")
    first = named.setdefault(("model", record.get("model")), (digest, path, number))
    if first[0] != digest:
        raise SpecterError(f"record {number} of {path} and record {first[2]} of {first[1]} both name their model "
                           f"{record.get('model')!r}, but their weights differ (config.model_sha256 {str(digest)[:12]} "
                           f"and {str(first[0])[:12]}): a table would average two models as one row; give each model "
                           "directory its own name")
    memory = config.get("memory") if isinstance(config.get("memory"), dict) else {}
    if memory.get("non_expert_bytes") is not None:  # one model at one priced shape and precision: one size
        key = ("non-expert", digest, record.get("cost_as"), record.get("engine"), config.get("dtype"))
        first = named.setdefault(key, (memory["non_expert_bytes"], path, number))
        if first[0] != memory["non_expert_bytes"]:
            raise SpecterError(f"record {number} of {path} and record {first[2]} of {first[1]} price one model "
                               f"{record.get('model')!r} alike, and their memory plans give its weights besides the "
                               f"experts as {memory['non_expert_bytes']} and {first[0]} bytes: a plan edited, or of "
                               "another version; run it again")
    label = Path(str(record.get("dataset"))).stem  # what the tables call it
    first = named.setdefault(("label", label), (record.get("dataset"), path, number))
    if first[0] != record.get("dataset"):
        raise SpecterError(f"record {number} of {path} runs prompt set {record.get('dataset')!r} and record {first[2]} "
                           f"of {first[1]} runs {first[0]!r}: the tables call both {label!r} and would mix them; give "
                           "the prompt file a name of its own")
    tokens = record.get("prompt_token_ids")
    key = ("prompt", digest, record.get("dataset"), config.get("field"), record.get("prompt_index"),
           len(tokens) if isinstance(tokens, list) else None)
    first = named.setdefault(key, (tokens, path, number))
    if first[0] != tokens:
        raise SpecterError(f"record {number} of {path} and record {first[2]} of {first[1]} both give prompt "
                           f"{record.get('prompt_index')} of {record.get('dataset')!r}, as other tokens: two prompt "
                           "files of one name; give each prompt set its own file name")
    if isinstance(tokens, list):  # a run passes over an input whose tokens repeat an earlier one's (`load_prompts`)
        first = named.setdefault(("tokens", *key[1:4], tuple(tokens)), (record.get("prompt_index"), path, number))
        if first[0] != record.get("prompt_index"):
            raise SpecterError(f"record {number} of {path} gives prompt {record.get('prompt_index')} of "
                               f"{record.get('dataset')!r} as the tokens record {first[2]} of {first[1]} gives as "
                               f"prompt {first[0]}, and a run's prompts are distinct: a record relabelled as another "
                               "prompt, or of another version; run it again")
    out = record.get("output_token_ids")
    if record.get("engine") != "sim" or (config.get("temperature") or 0) != 0 or not isinstance(out, list):
        return
    # greedy decoding on one model's numerics commits the target's own tokens, whichever system and draft run it
    key = ("greedy", digest, config.get("dtype"), json.dumps(config.get("numerics"), sort_keys=True, default=str),
           json.dumps(tokens, default=str))
    first = named.setdefault(key, (out, path, number))
    if first[0][:len(out)] != out[:len(first[0])]:
        raise SpecterError(f"record {number} of {path} and record {first[2]} of {first[1]} decode prompt "
                           f"{record.get('prompt_index')} greedily on the same numerics into other tokens, and every "
                           "system commits the target's own: a record was edited or damaged; run it again")


def _same_hardware(record: dict, path, number: int, profiles: dict) -> None:
    """Refuse a record whose hardware has the name (and dispatch time) of an earlier record's but other numbers (a
    measured or edited profile under a preset's name): a table would average two machines as one row."""
    from specter.timing.hardware import profile_digest

    profile = (record.get("config") or {}).get("hardware_profile")
    if not isinstance(profile, dict):
        return
    digest = profile_digest(profile)
    key = (record.get("hardware"), (profile.get("host") or {}).get("dispatch_us"))
    first = profiles.setdefault(key, (digest, path, number))
    if first[0] != digest:
        raise SpecterError(f"record {number} of {path} and record {first[2]} of {first[1]} both name their hardware "
                           f"{record.get('hardware')!r}, with other numbers (profiles {digest[:12]} and "
                           f"{first[0][:12]}): a table would average two machines as one; give a measured or edited "
                           "profile its own name and run it again")


def records_frame(records: list[dict]) -> pd.DataFrame:
    """One row per record: its settings, its metrics, and its model's name (the checkpoint directory's name)."""
    rows = []
    for r in records:
        cfg = r["config"]
        options = dict(cfg.get("system_options") or [])
        rows.append(dict(
            **scope(r), system=r["system"], k=r["k"],
            link=((cfg.get("hardware_profile") or {}).get("link") or {}).get("name", ""),
            link_gbps=((cfg.get("hardware_profile") or {}).get("link") or {}).get("h2d_pinned_gbps"),
            budget_kind=next((kind for kind, name in Budget.KINDS.items() if cfg.get(name) is not None), ""),
            budget_value=next((cfg[name] for name in Budget.KINDS.values() if cfg.get(name) is not None), None),
            draft_kernel=cfg.get("draft_kernel", "fused"), expert_bits=cfg.get("expert_bits", 16),
            k_setting=str(cfg.get("k")) if cfg.get("k") is not None else "",
            prefetch=cfg.get("prefetch") if r["k"] is not None else "", slots_per_layer=r["slots_per_layer"],
            experts_per_layer=r["experts_per_layer"], resident_share=r["slots_per_layer"] / r["experts_per_layer"],
            prefix_tokens=cfg.get("prefix_tokens"), prompt_index=r["prompt_index"],
            serialize_demand=options.get("serialize-demand", "false"), noise=options.get("noise"),
            replacement=options.get("replacement", "lru"),
            draft_kv=options.get("draft-kv", "shared") if r["k"] is not None else "",
            temperature=float(cfg.get("temperature") or 0.0), arm=cfg.get("arm") or "",
            repeat=(r.get("extra") or {}).get("repeat", 0),
            **{m: r.get(m) for m in METRICS},
            demand_misses=r["demand_misses"], h2d_bytes_demand=r["h2d_bytes_demand"],
            h2d_bytes_prefetch=r["h2d_bytes_prefetch"], live_forwards=r.get("extra", {}).get("live_forwards", 0),
        ))
    return pd.DataFrame(rows)


def pricing(record: dict) -> str:
    """How a record's ops were priced, in a word (`specter.runspec.PRICINGS`): `fused` (the modelled runtime of fused
    kernels), `counted` (the kernels a model's own modules dispatch) or `upstream` (each system's as its code runs)."""
    priced = (record.get("config") or {}).get("priced_ops") or {}
    return priced.get("pricing") or ("counted" if str(priced.get("kernels_source", "")).startswith("counted")
                                     else "fused")


def scope(record: dict) -> dict:
    """What a record was run on and how it was priced (`specter.experiments.SCOPE`): its model's name (the checkpoint
    directory's), the architecture pricing it, its prompt set, its hardware profile, its pricing, the host's
    dispatch time per kernel it was priced at (us, from the profile as run) and whether it was simulated."""
    cfg = record.get("config") or {}
    return dict(model=Path(record["model"]).name, cost_as=record.get("cost_as") or "",
                dataset=Path(str(record["dataset"])).stem, hardware=record["hardware"], pricing=pricing(record),
                dispatch_us=((cfg.get("hardware_profile") or {}).get("host") or {}).get("dispatch_us"),
                simulated=record["simulated"])


def one_record_a_prompt(df: pd.DataFrame, records: list[dict] | None = None) -> None:
    """Refuse two records of one run's prompt and repeat in a table of statistics (they would count it twice): equal
    in every setting the frame holds, a run at the default K being the run at that K, wherever each was written. Two
    such records of runs that differ in a setting the frame has no column for (`_run`: each row's place in
    `records`) are refused as two runs in one row."""
    key = df.drop(columns=[c for c in (*METRICS, *COUNTS, "_run") if c in df]).astype(str)
    key["k_setting"] = [s if s else "" if pd.isna(k) else str(int(k)) for s, k in zip(key["k_setting"], df["k"])]
    twice = key.duplicated(keep=False)
    if twice.any():
        r = df[twice].iloc[0]
        if records is not None and "_run" in df:
            rows = pd.util.hash_pandas_object(key, index=False)  # equal where `duplicated` finds them equal
            same = df[rows == rows[twice].iloc[0]]
            _one_run(records, list(same["_run"]), ("out", "k", "k_source"))  # their K the same: the frame's
        raise SpecterError(f"two records of one run: {r['system']} on {r['model']} ({r['dataset']}, {r['hardware']}), "
                           f"prompt {r['prompt_index']}, at the same settings (one run written to two files, or run "
                           "twice): a table would count that prompt twice; give each run's records once")


def one_run_a_row(df: pd.DataFrame, keys: list[str], records: list[dict]) -> None:
    """Refuse a table row that would average two runs (its records differ in a setting the table has no column for:
    `--expert-bits`, a system option, a budget given two ways): its n would count each prompt twice. `_run` is each
    row's record, by its place in `records`."""
    for _, group in df.groupby(keys, dropna=False, sort=False):
        _one_run(records, list(group["_run"]))


def _one_run(records: list[dict], rows: list[int], alike: tuple[str, ...] = ("out",)) -> None:
    """Refuse the records at `rows` (one row of a table) where they are of two runs, naming what differs (where only
    the config keys `alike` do, one run written twice, which the caller says)."""
    from specter.records import run_key

    runs = {run_key(records[i]): i for i in rows}
    if len(runs) > 1:
        first, other = (records[i] for i in list(runs.values())[:2])
        one, two = first["config"] or {}, other["config"] or {}
        differ = differing(one, two)
        if set(differ) <= set(alike):  # one run written twice (two paths; K by default and given): its caller says
            return
        named = ("; their model is one checkpoint (config.model_sha256) named by two paths: give each run the same "
                 "path") if "model" in differ and one.get("model_sha256") == two.get("model_sha256") else ""
        raise SpecterError(f"one row of the table ({first['system']} on {first['model']}, {first['dataset']}) "
                           f"would average {len(runs)} runs that differ in config "
                           f"{', '.join(differ[:3]) or 'settings'}, which the table has no column for; aggregate "
                           f"them apart (one file each) or give the experiment that setting as an axis{named}")


#: the run settings a speedup's two runs share (besides the scope its table's rows share): the prompts, what each
#: decodes, the experts' storage and the cache at each prompt's start
PROTOCOL = ("num_prompts", "prefix_tokens", "max_new_tokens", "seed", "temperature", "field", "dtype", "expert_bits",
            "cache_start", "repeats")


def one_protocol(df: pd.DataFrame, keys: list[str], records: list[dict], name: str, of: str = "specter") -> None:
    """Refuse a table whose speedups (each row's TPOT over `of`'s with the same `keys`) would compare runs of two
    protocols (`PROTOCOL`), which the table has no column to show, or a run given the memory Specter holds at some
    slots (`--same-memory-as`) over a Specter run at others. `_run` is each row's record, by its place in `records`."""
    from specter.records import run_key

    for _, group in df.groupby(keys, dropna=False, sort=False):
        ours = {run_key(records[i]): records[i] for i in group.loc[group["system"] == of, "_run"]}  # rows' names
        first = next(iter(ours.values())) if len(ours) == 1 else None  # the one run a speedup is over, if any
        for i in group["_run"] if first is not None else ():
            for key in PROTOCOL:
                mine, theirs = (records[i].get("config") or {}).get(key), (first.get("config") or {}).get(key)
                if mine != theirs:
                    raise SpecterError(f"the {name} table would compare {records[i].get('system')} with "
                                       f"{first.get('system')} (a speedup of one over the other) across runs that "
                                       f"differ in config.{key} ({mine!r} and {theirs!r}); give every system's runs "
                                       "at one setting of it")
            memory = (records[i].get("config") or {}).get("same_memory_as")
            if memory is not None and memory != first.get("slots_per_layer") and records[i] is not first:
                raise SpecterError(f"the {name} table would compare {records[i].get('system')}, given the memory "
                                   f"{of} holds at {memory} slots a layer (--same-memory-as), with {of} at "
                                   f"{first.get('slots_per_layer')}; give it --same-memory-as "
                                   f"{first.get('slots_per_layer')}")
