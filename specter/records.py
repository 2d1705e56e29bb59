"""A run's records: the fields every record of the run shares, one record per prompt, and the JSONL they go to.

A record's `config` is the run's `RunSpec` serialized (`RunSpec.as_dict`), with what the run resolved from it: the
system's settings, the slots and memory plan, the hardware profile's numbers, and the cache's initial state.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import MISSING, asdict, fields
from pathlib import Path

from specter.errors import SpecterError
from specter.io import KeyTwice, atomic_write, json_strict, not_a_file
from specter.metrics import (
    RunRecord,
    acceptance_rate,
    breakdown,
    decode_demand,
    hit_rate,
    share,
    tpot_seconds,
    window_utilization,
)
from specter.record_checks import record_problem


def git_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[1]  # the checkout: specter/records.py is one level down
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_fields(spec, system, profile, work, slots: int, memory, priced_at: dict | None = None,
               k_source: str | None = None, numerics_device: str = "cpu", expert_storage: dict | None = None,
               model_sha256: str = "") -> dict:
    """The fields every record of a run shares (`priced_at`: the architecture a `--cost-as` run is priced at;
    `k_source`: where a speculative run's K came from; `numerics_device`: where the target's forwards ran, beside
    their dtype in `config.dtype`; `expert_storage`: how the target's routed experts are stored and priced;
    `model_sha256`: the checkpoint's hash, so that two models of one name are never one table row)."""
    from specter import determinism
    from specter.quant.meta import versions
    from specter.timing.hardware import profile_digest

    resolved = {**spec.as_dict(), "system_settings": system.settings(), "slots_per_layer": slots,
                "memory": memory.as_dict() if memory else None, "hardware_profile": profile.to_yaml_dict(),
                "hardware_sha256": profile_digest(profile.to_yaml_dict()), "model_sha256": model_sha256,
                "initial_cache": spec.cache_start, "numerics": {**determinism.settings(), "device": numerics_device},
                "cost": priced_at, "priced_ops": work.pricing(),
                "k_source": k_source, "expert_storage": expert_storage,
                "routing": {"moe_layers": len(work.moe_layers), "top_k": work.top_k}}
    return dict(system=spec.system, model=spec.model, dataset=spec.dataset, engine=spec.engine, hardware=profile.name,
                simulated=spec.engine == "sim", slots_per_layer=slots, experts_per_layer=work.experts_per_layer,
                cost_as=priced_at["architecture"] if priced_at else None, config=resolved, versions=versions(),
                git_commit=git_commit())


def speculative_fields(result) -> dict:
    """Acceptance rate, window utilization, accepted-length histogram, expert prediction and window recall of a
    speculative run's prompt (None and empty for a run that proposed nothing)."""
    if not result.proposed:
        return dict(acceptance_rate=None, window_utilization=None, accepted_length_histogram={}, expert_prediction=[],
                    window_recall=None, window_working_set=None)
    prediction = [dict(layer=layer, distance=d, precision=share(c.tp, c.predicted), recall=share(c.tp, c.actual))
                  for (layer, d), c in sorted(result.prediction.items())]
    return dict(
        acceptance_rate=acceptance_rate(result.accepted, result.checked),
        window_utilization=window_utilization(result.accepted, result.proposed),
        accepted_length_histogram={str(a): n for a, n in sorted(result.accepted_lengths.items())},
        expert_prediction=prediction,
        window_recall=share(result.window_hits, result.window_needed),
        window_working_set=share(result.window_needed, result.window_layers),
    )


def record_of(prepared, index: int, prompt: list[int], result, timeline, lower_bound, seed: int,
              wall_s: float, live_forwards: int, measured: dict) -> RunRecord:
    """One prompt's record."""
    stats = result.stats
    governor = prepared.governor
    hits, misses, token_hits, token_misses = decode_demand(stats.target_passes)
    return RunRecord(
        prompt_index=index, prompt_token_ids=prompt, output_token_ids=result.tokens,
        ttft_ms=result.commit_times[0] * 1e3, tpot_ms=tpot_seconds(result.commit_times) * 1e3,
        lower_bound_tpot_ms=lower_bound.seconds * 1e3, k=result.k,
        demand_hits=stats.demand.hits, demand_misses=stats.demand.misses,
        hit_rate=hit_rate(stats.demand.hits, stats.demand.misses), hit_rate_pass=hit_rate(hits, misses),
        hit_rate_token=hit_rate(token_hits, token_misses),
        prefetch_precision=share(result.window_hits, result.window_placed),
        prefetch_recall=share(result.window_hits, result.window_needed) if result.proposed else None,
        h2d_bytes_prefetch=stats.h2d_bytes_prefetch, h2d_bytes_demand=stats.h2d_bytes_demand,
        stall_ms=timeline.stall_seconds() * 1e3, wall_s=wall_s, seed=seed,
        **speculative_fields(result), **prepared.common,
        extra={**({"governor": asdict(governor)} if governor else {}),
               **({"k_per_cycle": result.ks} if prepared.online is not None else {}),
               **({"near_ties": result.near_ties} if result.near_ties else {}), **result.extra,
               "lower_bound_kind": lower_bound.kind, "lower_bound_per_pass_ms": lower_bound.per_pass * 1e3,
               "lower_bound_per_token_ms": lower_bound.per_token * 1e3,
               "link_bytes_activations": stats.link_bytes_activations,
               "d2h_bytes_writeback": stats.d2h_bytes_writeback, "h2d_bytes_prefill": stats.h2d_bytes_prefill,
               "live_forwards": live_forwards,
               "commit_ms": [t * 1e3 for t in result.commit_times],
               "counts": {"proposed": result.proposed, "checked": result.checked, "accepted": result.accepted,
                          "window_hits": result.window_hits, "window_needed": result.window_needed,
                          "window_layers": result.window_layers, "window_placed": result.window_placed,
                          "decode_hits": hits, "decode_misses": misses, "decode_token_hits": token_hits,
                          "decode_token_misses": token_misses, "decode_passes": len(stats.target_passes) - 1},
               "breakdown_ms": {part: seconds * 1e3 for part, seconds in breakdown(
                   timeline.spans, result.commit_times[0], result.commit_times[-1]).items()}, **measured},
    )


def write_records(records: list[RunRecord], out: str | Path) -> None:
    """Write JSONL atomically: a temporary file beside `out`, renamed over it."""
    atomic_write(out, lambda f: f.writelines(json.dumps(r.as_dict()) + "\n" for r in records))


#: the fields a record must have to be read back (those without a default in RunRecord)
REQUIRED_FIELDS = tuple(f.name for f in fields(RunRecord) if f.default is MISSING and f.default_factory is MISSING)
_JSON_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "dict": (dict,), "list": (list,),
               "None": (type(None),)}


def _type_ok(value, annotation: str) -> bool:
    """Whether a JSON value fits a RunRecord annotation such as `float | None` or `list[int]` (outer types only)."""
    allowed = tuple(t for part in annotation.split("|") for t in _JSON_TYPES[part.strip().split("[")[0]])
    if isinstance(value, bool) and bool not in allowed:
        return False
    return isinstance(value, allowed)


_ANNOTATIONS = {f.name: str(f.type) for f in fields(RunRecord)}


def read_jsonl(path: str | Path, strict: bool = True) -> list[dict]:
    """The records of a JSONL file `write_records` wrote, each checked to be a JSON object with (if `strict`) a
    record's fields of the right types; anything else is one SpecterError naming the file, the line and what is
    wrong. `strict=False` reads records of older versions too (for `specter diff`)."""
    path = Path(path)
    if (said := not_a_file(path)) is not None:
        raise SpecterError(f"records file {str(path)!r} {said}; run the workflow rule that writes it")
    out = []
    try:
        raw = path.read_bytes().splitlines()
    except OSError as err:
        raise SpecterError(f"cannot read records file {path} ({err}); run the rule that writes it again") from None
    for number, data in enumerate(raw, 1):
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecterError(f"{path}:{number} is not UTF-8 text; the file is damaged, delete it and run the rule "
                               "that writes it again") from None
        if not line.strip():
            continue
        try:
            record = json_strict(line)
        except KeyTwice as err:
            raise SpecterError(f"{path}:{number}: {err}, which no run writes; the file is damaged or was edited, "
                               "delete it and run the rule that writes it again") from None
        except json.JSONDecodeError as err:
            raise SpecterError(f"{path}:{number} is not JSON ({err.msg}); the file is damaged, delete it and run the "
                               "rule that writes it again") from None
        except (RecursionError, ValueError) as err:  # nested past the parser's depth; an integer of 4,300+ digits
            raise SpecterError(f"{path}:{number} is no record this suite writes ({type(err).__name__}); the file is "
                               "damaged, delete it and run the rule that writes it again") from None
        if not isinstance(record, dict):
            raise SpecterError(f"{path}:{number} is not a run record (it is not a JSON object); give files "
                               "`specter run` or `specter sweep` wrote")
        missing = [name for name in REQUIRED_FIELDS if name not in record] if strict else []
        if missing:
            shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
            raise SpecterError(f"{path}:{number} is not a run record of this version (it lacks {shown}); give "
                               "files this version's `specter run` or `specter sweep` wrote, or run the rule again")
        stray = next((name for name in record if strict and name not in _ANNOTATIONS), None)
        if stray is not None:
            raise SpecterError(f"{path}:{number}: field {str(stray)[:60]!r}, which no run of this version writes; the "
                               "file is damaged or was edited, run the rule that writes it again")
        wrong = next((name for name, value in record.items()
                      if strict and name in _ANNOTATIONS and not _type_ok(value, _ANNOTATIONS[name])), None)
        if wrong is not None:
            raise SpecterError(f"{path}:{number}: field {wrong!r} is {record[wrong]!r}, not {_ANNOTATIONS[wrong]}; "
                               "the file is damaged or was edited, run the rule that writes it again")
        problem = record_problem(record) if strict else None
        if problem is not None:
            raise SpecterError(f"{path}:{number}: {problem}; no run of this version writes that: the file is "
                               "damaged, edited or of another version, run the rule that writes it again")
        if strict and out and record.get("versions") != out[0].get("versions"):
            raise SpecterError(f"{path}:{number}: versions {record.get('versions')!r}, and the file's first record's "
                               f"{out[0].get('versions')!r}: one run file is written by one run of one version; the "
                               "file was joined or edited, run the rule that writes it again")
        out.append(record)
    return out


def value_problem(record: dict) -> str | None:
    """What no run of this version writes in `record` (a field of another type, or a value `record_problem`
    refuses), or None; a record of an older version (one lacking a field this version writes) is not judged."""
    if any(name not in record for name in REQUIRED_FIELDS):
        return None
    wrong = next((name for name, value in record.items()
                  if name in _ANNOTATIONS and not _type_ok(value, _ANNOTATIONS[name])), None)
    if wrong is not None:
        return f"field {wrong!r} is {str(record[wrong])[:60]!r}, not {_ANNOTATIONS[wrong]}"
    return record_problem(record)


def run_key(record: dict) -> str:
    """What the records of one run share (`record_key` without the prompt and the repeat)."""
    return json.dumps([record.get("config"), record.get("system"), record.get("model"), record.get("dataset"),
                       record.get("engine"), record.get("hardware")], sort_keys=True, default=str)


def record_key(record: dict) -> str:
    """What tells one record apart from every other of a suite's runs: its run's whole configuration (its output path
    among it), its system, model, prompt set, prompt and repeat."""
    return json.dumps([record.get("config"), record.get("system"), record.get("model"), record.get("dataset"),
                       record.get("prompt_index"), (record.get("extra") or {}).get("repeat", 0),
                       record.get("engine"), record.get("hardware")], sort_keys=True, default=str)
