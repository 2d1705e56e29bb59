"""One `specter run`: validate the request, load model, draft and prompts, schedule every prompt, write the records.

Everything that can be checked is checked before any model is loaded, and the JSONL is written to a temporary file and
renamed at the end, so a bad request or a failure leaves no partial output. Numerics go through a `ForwardService`
shared by every run in the process (keyed by model and draft), so a second system on the same prompts only schedules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from specter.errors import SpecterError
from specter.metrics import RunRecord, lower_bound_tpot_seconds, speculative_fields, tpot_seconds
from specter.offload.device import DRAFT_KERNEL
from specter.offload.memory import check_one_budget, plan_memory
from specter.offload.work import ModelWork
from specter.spec.forward import ForwardService
from specter.spec.lookahead import POLICIES
from specter.systems import DecodeConfig, PromptContext, get_system
from specter.timing import load_profile, make_engine
from specter.timing.cost import CostModel

GOVERNORS = ("auto", "profile")
ENGINES = ("sim", "cuda")


@dataclass(frozen=True)
class RunRequest:
    system: str
    model: str
    dataset: str
    hardware: str
    out: str
    draft: str | None = None
    field: str | None = None
    num_prompts: int = 5
    prefix_tokens: int = 16
    max_new_tokens: int = 128
    device_memory_gb: float | None = None
    resident_per_layer: int | None = None
    resident_fraction: float | None = None  # of each layer's experts, rounded, at least one slot
    k: int | str | None = None  # an integer, or "auto" / "profile" for the governor
    prefetch: str = "adaptive"
    temperature: float = 0.0
    seed: int = 42
    engine: str = "sim"
    system_options: tuple[tuple[str, str], ...] = ()
    warmup_prompts: int = 8  # calibration-split prompts for systems that learn from history (MoE-Infinity, Fiddler)
    memo: tuple[str, ...] = ()  # recorded numerics to start from (`specter sweep --memo-out`)
    progress: bool = True


_SERVICES: dict[str, tuple[object, dict, ForwardService]] = {}  # by target: (target, {draft dir: draft}, service)
_MEMOS: set[tuple[str, str]] = set()  # (target, memo file) pairs already loaded


def _service(model_dir: str, draft_dir: str | None, memos: tuple[str, ...] = ()):
    """(target, draft, ForwardService) for this model, loaded once per process; the service memoizes the target's
    numerics for every system and each draft's windows separately (keyed by the draft's content), starting from
    the recorded `memos`."""
    from specter.models.loading import load_moe_model
    from specter.quant.draft import load_draft
    from specter.spec.memo import draft_key, load_memo

    key = str(Path(model_dir).resolve())
    if key not in _SERVICES:
        target = load_moe_model(model_dir, dtype=torch.float32)
        _SERVICES[key] = (target, {}, ForwardService(target))
    target, drafts, service = _SERVICES[key]
    for memo in memos:
        if (key, str(Path(memo).resolve())) not in _MEMOS:
            load_memo(service, memo, target_hash(model_dir))
            _MEMOS.add((key, str(Path(memo).resolve())))
    draft = None
    if draft_dir is not None:
        path = str(Path(draft_dir).resolve())
        if path not in drafts:
            drafts[path] = (load_draft(target, draft_dir, target_hash=target_hash(model_dir)), draft_key(draft_dir))
        draft, content_key = drafts[path]
        service.draft, service.draft_key = draft.moe, content_key
    return target, draft, service


_HASHES: dict[str, str] = {}


def target_hash(model_dir: str) -> str:
    """The model hash (config and weights) of a checkpoint, computed once per process."""
    from specter.quant.meta import model_hash

    key = str(Path(model_dir).resolve())
    if key not in _HASHES:
        _HASHES[key] = model_hash(model_dir)
    return _HASHES[key]


def validate(req: RunRequest):
    """Every check that needs no model weights; returns (system, hardware profile)."""
    from specter.models.loading import read_model_config

    system = get_system(req.system, dict(req.system_options))
    if req.engine not in ENGINES:
        raise SpecterError(f"--engine {req.engine} is not an engine; engines: {', '.join(ENGINES)}")
    if req.engine == "cuda":
        if not torch.cuda.is_available():
            raise SpecterError("--engine cuda needs a CUDA device, and torch sees none; use --engine sim (simulated "
                               "time from the --hardware profile)")
        if req.temperature > 0:
            raise SpecterError(f"--engine cuda times greedy runs (their numerics are recorded before the timed run); "
                               f"--temperature {req.temperature} samples live: use --engine sim or --temperature 0")
    profile = load_profile(req.hardware)
    read_model_config(req.model)
    if system.speculative:
        if req.draft is None:
            raise SpecterError(f"system {req.system!r} speculates: pass --draft DIR (make one with `specter quantize`)")
        if isinstance(req.k, str) and req.k not in GOVERNORS:
            raise SpecterError(f"--k must be an integer >= 1 or one of {', '.join(GOVERNORS)}, got {req.k!r}")
        if req.k is None or (isinstance(req.k, int) and req.k < 1):
            raise SpecterError(f"--k must be at least 1 for {req.system!r}, got {req.k}")
    if req.prefetch not in POLICIES:
        raise SpecterError(f"--prefetch {req.prefetch!r} is not a policy; policies: {', '.join(POLICIES)}")
    if req.temperature < 0:
        raise SpecterError(f"--temperature must be >= 0 (0 = greedy), got {req.temperature}")
    if req.max_new_tokens < 2:
        raise SpecterError(f"--max-new-tokens must be at least 2 (TPOT needs two tokens), got {req.max_new_tokens}")
    check_one_budget(req.device_memory_gb, req.resident_per_layer, req.resident_fraction)
    for memo in req.memo:
        if not Path(memo).is_file():
            raise SpecterError(f"--memo {memo!r} does not exist; record it with `specter sweep --memo-out`")
    out = Path(req.out)
    if req.out and out.exists() and out.is_dir():
        raise SpecterError(f"--out {req.out} is a directory; give a file name ending in .jsonl")
    return system, profile


def _git_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(req: RunRequest) -> list[RunRecord]:
    """Run `req` and write its records; returns them."""
    records = execute(req)
    write_records(records, req.out)
    return records


def execute(req: RunRequest) -> list[RunRecord]:
    """Run `req`; returns its records (one per prompt) without writing them."""
    from transformers import AutoTokenizer

    from specter.data.prompts import load_prompts
    from specter.quant.meta import versions

    system, profile = validate(req)
    tokenizer = AutoTokenizer.from_pretrained(req.model, local_files_only=True)
    prompts = load_prompts(req.dataset, tokenizer, req.num_prompts, req.prefix_tokens, field=req.field)
    target, draft, service = _service(req.model, req.draft if system.speculative else None, req.memo)
    work = ModelWork.of(target)
    draft_bytes = draft.quantized_bytes_per_expert if draft else 0
    draft_resident = draft_bytes * len(work.moe_layers) * work.experts_per_layer
    if system.separate_draft:  # its own copy of every non-expert weight
        draft_resident += work.non_expert_bytes()
    if system.fixed_slots is not None:
        slots = system.fixed_slots(work)
        memory = None
    else:
        from specter.spec.governor import PROFILE_KS

        window = req.k if isinstance(req.k, int) else (max(PROFILE_KS) if req.k else 0)  # speculative KV positions
        memory = plan_memory(work, req.prefix_tokens + req.max_new_tokens + window,
                             draft_resident, req.device_memory_gb, req.resident_per_layer,
                             kv_copies=2 if system.separate_draft else 1, resident_fraction=req.resident_fraction)
        slots = memory.slots_per_layer
    cost = CostModel(profile)
    governor = None
    k = req.k if system.speculative else None
    if isinstance(k, str):
        governor = _govern(k, tokenizer, req, service, work, cost, slots, draft_bytes, profile)
        k = governor.k
    config = DecodeConfig(req.max_new_tokens, slots, k, req.prefetch, draft_bytes, req.temperature, req.seed)
    warm: list = []

    def warmup():
        """Traces of warm-up prompts from the calibration split (never the evaluation prompts), computed once."""
        if not warm:
            from specter.data.corpus import calibration_token_ids

            for p in calibration_token_ids(tokenizer, "code", req.warmup_prompts, req.prefix_tokens):
                warm.append(service.trace(p, req.max_new_tokens))
        return warm

    resolved = {**asdict(req), "system_settings": system.settings(), "slots_per_layer": slots, "memory": memory.as_dict() if memory else None,
                "hardware_profile": profile.to_yaml_dict(), "initial_cache": "empty"}
    resolved.pop("progress")
    common = dict(system=req.system, model=req.model, dataset=req.dataset, engine=req.engine, hardware=profile.name,
                  simulated=req.engine == "sim", slots_per_layer=slots, experts_per_layer=work.experts_per_layer,
                  config=resolved, versions=versions(), git_commit=_git_commit())
    device = _device_runtime(req, system, target, draft, work, slots, prompts, k) if req.engine == "cuda" else None
    if device is not None:
        common.update(hardware=torch.cuda.get_device_name(device.device), config={
            **resolved, "device": {"name": torch.cuda.get_device_name(device.device), "store_pinned": device.store.pinned,
                                   "draft_kernel": DRAFT_KERNEL if draft else None}})
    records = []
    for index, prompt in enumerate(tqdm(prompts, desc=f"{req.system}", disable=not req.progress)):
        wall = time.perf_counter()
        forwards = service.forward_calls
        if req.temperature > 0:
            trace = service.sampled_trace(prompt, req.max_new_tokens, req.temperature, req.seed + index)
            config = replace(config, seed=req.seed + index)
        else:
            trace = service.trace(prompt, req.max_new_tokens)
        result, timeline = schedule(system, make_engine("sim", profile), work, service, trace, config, cost, warmup)
        measured = {}
        if device is not None:  # the simulated run above recorded every numeric; now time the same schedule for real
            simulated_tpot = tpot_seconds(result.commit_times)
            if index == 0:  # warm-up: kernels, allocator, lazily sized buffers
                schedule(system, make_engine("cuda", profile), work, service, trace, config, cost, warmup, device)
            before, tokens = service.forward_calls, result.tokens
            result, timeline = schedule(system, make_engine("cuda", profile), work, service, trace, config, cost,
                                        warmup, device)
            if service.forward_calls != before or result.tokens != tokens:
                raise RuntimeError(f"{req.system} prompt {index}: the timed CUDA run computed numerics or committed "
                                   "other tokens than its recorded run; please report this")
            measured = {"simulated_tpot_ms": simulated_tpot * 1e3, "simulated_on": profile.name}
        decode_routes = result.decode_routes if result.decode_routes is not None else trace.step_routes
        lb = lower_bound_tpot_seconds(result, decode_routes[: req.max_new_tokens - 1], slots, work, cost,
                                      host_compute=system.host_compute)
        tpot = tpot_seconds(result.commit_times)
        if tpot < lb:
            if req.engine == "sim":  # the simulator executes at least the work the bound counts
                raise RuntimeError(f"{req.system} prompt {index}: simulated TPOT {tpot} s below its lower bound {lb} s; "
                                   "the bound or the schedule is wrong, please report this")
            print(f"warning: {req.system} prompt {index}: measured TPOT {tpot * 1e3:.4f} ms is below the lower bound "
                  f"{lb * 1e3:.4f} ms of profile {profile.name!r}, which is slower than this device; measure one "
                  "with `specter profile-bandwidth` and pass its profile.yaml as --hardware", file=sys.stderr)
        records.append(RunRecord(
            prompt_index=index, prompt_token_ids=prompt, output_token_ids=result.tokens,
            ttft_ms=result.commit_times[0] * 1e3, tpot_ms=tpot * 1e3,
            lower_bound_tpot_ms=lb * 1e3, k=result.k,
            demand_hits=result.stats.demand_hits, demand_misses=result.stats.demand_misses,
            h2d_bytes_prefetch=result.stats.h2d_bytes_prefetch, h2d_bytes_demand=result.stats.h2d_bytes_demand,
            stall_ms=timeline.stall_seconds() * 1e3, wall_s=time.perf_counter() - wall, seed=config.seed,
            **speculative_fields(result), **common,
            extra={**({"governor": asdict(governor)} if governor else {}),
                   "link_bytes_activations": result.stats.link_bytes_activations,
                   "live_forwards": service.forward_calls - forwards, **measured},
        ))
    return records


def schedule(system, engine, work, service, trace, config, cost, warmup=None, device=None):
    """One prompt's run of `system` on `engine` (with `device`'s kernels behind the ops, if given); returns
    (PromptResult, Timeline)."""
    ctx = PromptContext.fresh(engine, work, service, trace, config, cost, warmup, device)
    result = system.run(ctx)
    return result, engine.finish()


_STORES: dict[int, object] = {}  # host expert stores, by target, pinned once per process
CUDA_DEVICE = "cuda"  # where `--engine cuda` puts its buffers (tests point it at the CPU)


def _device_runtime(req, system, target, draft, work, slots, prompts, k):
    """The CUDA run's device buffers and kernels, sized for its longest pass and context."""
    from specter.offload.device import DeviceRuntime
    from specter.offload.store import ExpertStore

    if id(target) not in _STORES:
        _STORES[id(target)] = ExpertStore(target, pin=torch.device(CUDA_DEVICE).type == "cuda")
    window = max(k or 0, getattr(system, "k", 0) or 0)
    max_tokens = max([window + 1] + [len(p) for p in prompts])
    return DeviceRuntime(target, work, _STORES[id(target)], slots, CUDA_DEVICE, max_tokens=max_tokens,
                         max_context=max(len(p) for p in prompts) + req.max_new_tokens + window + 1,
                         draft=draft, seed=req.seed)


def _govern(kind, tokenizer, req, service, work, cost, slots, draft_bytes, profile):
    """Choose K on a profiling prompt from the calibration split (never an evaluation prompt)."""
    from specter.data.corpus import calibration_token_ids
    from specter.spec.governor import PROFILE_KS, choose_k_auto, choose_k_profile
    from specter.specter import Specter

    prompt = calibration_token_ids(tokenizer, "code", 1, req.prefix_tokens)[0]
    trace = service.trace(prompt, max(64, req.max_new_tokens, 2 * max(PROFILE_KS) + 2))
    if kind == "auto":
        return choose_k_auto(service, trace, work, cost, slots, draft_bytes)

    def tpot_with(k: int) -> float:
        cfg = DecodeConfig(len(trace.tokens), slots, k, req.prefetch, draft_bytes)
        engine = make_engine("sim", profile)
        result = Specter().run(PromptContext.fresh(engine, work, service, trace, cfg, cost))
        return tpot_seconds(result.commit_times)

    return choose_k_profile(tpot_with)


def compare(req: RunRequest, systems: list[str], out_dir: str | Path) -> list[dict]:
    """Run each of `systems` with the same request (one JSONL each under `out_dir`); returns one summary row per
    system: medians over prompts of TPOT and its lower bound, and totals of demand misses and link bytes."""
    import statistics

    from specter.errors import SpecterError

    for name in systems:  # every name is checked before anything runs
        validate(replace(req, system=name, out=str(Path(out_dir) / f"{name}.jsonl")))
    if len(set(systems)) != len(systems):
        raise SpecterError(f"--systems lists a system twice: {systems}")
    rows = []
    for name in systems:
        records = run(replace(req, system=name, out=str(Path(out_dir) / f"{name}.jsonl")))
        rows.append(dict(
            system=name, k=records[0].k, slots_per_layer=records[0].slots_per_layer,
            tpot_ms=statistics.median(r.tpot_ms for r in records),
            lower_bound_tpot_ms=statistics.median(r.lower_bound_tpot_ms for r in records),
            demand_misses=sum(r.demand_misses for r in records),
            h2d_bytes=sum(r.h2d_bytes_demand + r.h2d_bytes_prefetch for r in records),
            activation_bytes=sum(r.extra.get("link_bytes_activations", 0) for r in records),
            acceptance_rate=(statistics.median(r.acceptance_rate for r in records)
                             if records[0].acceptance_rate is not None else None),
        ))
    return rows


SWEEP_AXES = ("system", "k", "prefetch", "hardware", "prefix_tokens", "resident_fraction", "resident_per_layer",
              "device_memory_gb")


def grid(req: RunRequest, axes: dict[str, list], options: dict[str, list[str]] | None = None) -> list[RunRequest]:
    """Every combination of the values of `axes` (RunRequest fields) and of system options, as requests.

    Settings that cannot change a system's run are dropped for it, so no run repeats: K and the prefetch policy for
    systems that do not speculate, an option for systems that do not have it (an option no listed system has is an
    error)."""
    import itertools

    for name in axes:
        if name not in SWEEP_AXES:
            raise SpecterError(f"cannot sweep {name!r}; sweepable: {', '.join(SWEEP_AXES)}")
    options = options or {}
    names = list(axes)
    systems = {s: get_system(s) for s in axes.get("system", [req.system])}
    for opt in options:
        if not any(opt in sys.options for sys in systems.values()):
            raise SpecterError(f"no swept system has option {opt!r}; systems: {', '.join(systems)}")
    out: list[RunRequest] = []
    for values in itertools.product(*(axes[n] for n in names)):
        base = replace(req, **dict(zip(names, values)))
        system = systems[base.system]
        if not system.speculative:
            base = replace(base, k=None, prefetch=RunRequest.prefetch)
        own = [o for o in options if o in system.options]
        for opt_values in itertools.product(*(options[o] for o in own)):
            candidate = replace(base, system_options=tuple(sorted({**dict(req.system_options),
                                                                   **dict(zip(own, opt_values))}.items())))
            if candidate not in out:
                out.append(candidate)
    return out


def sweep(requests: list[RunRequest], out: str | Path | None, memo_out: str | Path | None = None) -> list[RunRecord]:
    """Run every request in one process (numerics shared), writing all records to one JSONL `out` (if given) and
    the numerics they used to `memo_out` (if given); every request is validated before anything runs."""
    from specter.spec.memo import save_memo

    for r in requests:
        validate(r)
    records: list[RunRecord] = []
    for i, r in enumerate(requests):
        if r.progress:
            print(f"[{i + 1}/{len(requests)}] {_describe(r)}", flush=True)
        records += execute(r)
    if memo_out is not None and requests:
        target, _, service = _service(requests[0].model, None)
        save_memo(service, memo_out, target_hash(requests[0].model))
    if out is not None:
        write_records(records, out)
    return records


def _describe(r: RunRequest) -> str:
    budget = (f"{r.resident_fraction:g} of experts" if r.resident_fraction is not None else
              f"{r.resident_per_layer} slots/layer" if r.resident_per_layer is not None else f"{r.device_memory_gb} GB")
    k = f" K={r.k}" if r.k is not None else ""
    opts = "".join(f" {a}={b}" for a, b in r.system_options)
    return f"{r.system}{k} {r.prefetch if r.k is not None else ''} {r.hardware} {budget} prefix {r.prefix_tokens}{opts}"


def write_records(records: list[RunRecord], out: str | Path) -> None:
    """Write JSONL atomically: a temporary file beside `out`, renamed over it."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    with tmp.open("w") as f:
        for r in records:
            f.write(json.dumps(r.as_dict()) + "\n")
    tmp.replace(out)
