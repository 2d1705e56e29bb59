"""Many runs in one process, sharing the session's numerics: a grid of specs (`grid`, `sweep`) and several systems
side by side (`compare`). Every spec is resolved (checked) once, before anything runs."""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import replace
from pathlib import Path

from specter.errors import BudgetError, SpecterError
from specter.metrics import RunRecord
from specter.progress import log, phase
from specter.records import write_records
from specter.runs.checks import resolve
from specter.runs.execute import execute, prepare, schedule_prompts, walk_windows
from specter.runspec import SWEEP_AXES, Arm, RunSpec, Window
from specter.session import Session
from specter.systems import get_system


def grid(base: RunSpec, axes: dict[str, list], options: dict[str, list[str]] | None = None,
         arms: list[Arm] | None = None) -> list[RunSpec]:
    """Every combination of the values of `axes` (RunSpec fields) and of system options, as specs, each run in every
    arm of `arms` (named settings on top of the point, in their order; none: the point as it is).

    Settings that cannot change a system's run are dropped for it, so no run repeats within an arm: K and the prefetch
    policy for systems that do not speculate, a governor for one whose K is its own option (SpecMoEOff: it runs at
    the fixed K once), an option for systems that do not have it (an option no listed system has is an error, and so
    is a setting both swept over several values and set by an arm; an arm's setting replaces the one value the sweep
    gives it). A system that no setting of an arm changes
    still runs in it, under the arm's name, so every arm's rows compare the same systems."""
    for name in axes:
        if name not in SWEEP_AXES:
            raise SpecterError(f"cannot sweep {name!r}; sweepable: {', '.join(SWEEP_AXES)}")
    options = options or {}
    arms = list(arms or ()) or [Arm()]
    names = list(axes)
    systems = {s: get_system(s) for s in axes.get("system", [base.system])}
    for opt in options:
        if not any(opt in system.options for system in systems.values()):
            raise SpecterError(f"no swept system has option {opt!r}; systems: {', '.join(systems)}")
    for arm in arms:
        arm.check(systems.values())
    seen = [arm.name for arm in arms]
    if len(set(seen)) < len(seen):
        raise SpecterError(f"two arms have the same name ({', '.join(seen)}); give each arm its own name")
    for arm in arms:
        # an arm may replace a setting the sweep gives one value (the main hardware, the main budget), never one it
        # varies
        both = [key for key, _ in (*arm.settings, *arm.options) if len(axes.get(key, ())) > 1 or key in options]
        if both:
            raise SpecterError(f"arm {arm.name!r} sets {both[0]}, which the sweep also varies (its flag or "
                               "--system-option); set it in one place")
    fixed_k = next((k for k in map(Window.parse, axes.get("k", ())) if k.governor is None), base.k)
    out: list[RunSpec] = []
    for values in itertools.product(*(axes[n] for n in names)):
        point = replace(base, **dict(zip(names, values)))
        system = systems[point.system]
        own = [o for o in options if o in system.options]
        for arm in arms:
            spec = replace(point, arm=arm.name, **dict(arm.settings))
            if not system.speculative:
                spec = replace(spec, k=Window(), prefetch=RunSpec.prefetch, draft_kernel=RunSpec.draft_kernel)
            elif spec.k.governor and not system.takes_window:  # its K is its own option (SpecMoEOff's): no
                spec = replace(spec, k=fixed_k)  # governor chooses it, and the run is the fixed-K one
            fixed = {**dict(base.system_options), **{o: v for o, v in arm.options if o in system.options}}
            for opt_values in itertools.product(*(options[o] for o in own)):
                merged = {**fixed, **dict(zip(own, opt_values))}
                candidate = replace(spec, system_options=tuple(sorted(merged.items())))
                if candidate not in out:
                    out.append(candidate)
    return out


def sweep(specs: list[RunSpec], out: str | Path | None, memo_out: str | Path | None = None,
          session: Session | None = None, progress: bool = True) -> list[RunRecord]:
    """Run every spec in one session (numerics shared), writing all records to one JSONL `out` (if given) and the
    numerics they used to `memo_out` (if given); every spec is validated before anything runs."""
    from specter.numerics.memo import save_memo

    session = session or Session()
    resolved = [resolve(spec, session.structures) for spec in specs]
    _one_run_a_profile(resolved)
    recorders = []  # every system's extra numerics, computed with each trace's first decode
    for r in resolved:
        recorders += [each for each in r.system.trace_recorders if each not in recorders]
    prepared = []
    for i, r in enumerate(resolved):
        if progress:
            log.info("preparing run %d/%d: %s", i + 1, len(resolved), r.spec.describe())
        try:
            prepared.append(prepare(r, session, tuple(recorders)))
        except BudgetError as err:  # this system cannot run in this budget: no record, and the log says why
            log.warning("skipped: %s does not fit %s: %s", r.spec.system, r.spec.budget.describe(), err)
    with phase(f"the draft windows of {len(prepared)} runs, in batches"):
        walk_windows(prepared)  # every run's windows together: larger batches than run by run
    records: list[RunRecord] = []
    for i, p in enumerate(prepared):
        if progress:
            log.info("run %d/%d: %s", i + 1, len(prepared), p.spec.describe())
        records += schedule_prompts(p, session, progress)
    if memo_out is not None and resolved:
        first = resolved[0].spec
        with phase(f"saving the numerics to {memo_out}"):
            save_memo(session.service(first.model, first.dtype), memo_out, session.model_hash(first.model))
    if out is not None:
        write_records(records, out)
    return records


def _one_run_a_profile(resolved: list) -> None:
    """Two specs alike but for the text naming their profile or their system's options, naming one profile (a preset
    by its name and by its file; a dispatch time and `profile` where the profile's is that time) and one setting of
    the system (`cuda-graph=1` and `cuda-graph=true`), would run twice and write one run's records twice: refused
    before anything runs."""
    from specter.timing.hardware import profile_digest

    seen: dict = {}
    for r in resolved:
        key = (replace(r.spec, hardware="", dispatch_us=None, system_options=()),
               profile_digest(r.profile.to_yaml_dict()), json.dumps(r.system.settings(), sort_keys=True, default=str))
        said = (r.spec.hardware, "profile" if r.spec.dispatch_us is None else f"{r.spec.dispatch_us:g}",
                ",".join(f"{a}={b}" for a, b in r.spec.system_options) or "the defaults")
        if key in seen and seen[key] != said:
            flag, (a, b) = next((f, (x, y)) for f, x, y in zip(("--hardware", "--dispatch-us", "--system-option"),
                                                                 seen[key], said) if x != y)
            what = "one setting of " + r.spec.system if flag == "--system-option" else \
                f"one profile ({r.profile.name}, the same numbers)"
            raise SpecterError(f"{flag} {a} and {b} are {what}, so one run twice; give it once")
        seen.setdefault(key, said)


def compare(base: RunSpec, systems: list[str], out_dir: str | Path, session: Session | None = None,
            progress: bool = True) -> list[dict]:
    """Run each of `systems` with the same settings (one JSONL each under `out_dir`); returns one summary row per
    system: means over prompts of TPOT and its lower bound (as the tables give them), and totals of demand misses and
    link bytes."""
    if len(set(systems)) != len(systems):
        raise SpecterError(f"--systems lists a system twice: {systems}")
    session = session or Session()
    resolved = [resolve(replace(base, system=name, out=str(Path(out_dir) / f"{name}.jsonl")), session.structures)
                for name in systems]  # every name is checked before anything runs
    rows = []
    for r in resolved:
        records = execute(r, session, progress)
        write_records(records, r.spec.out)
        rows.append(summary(r.spec.system, records))
    return rows


def summary(name: str, records: list[RunRecord]) -> dict:
    """One row of a run's prompts: means of TPOT, its bound and acceptance (as the tables give them); totals of misses
    and link bytes."""
    return dict(
        system=name, k=records[0].k, slots_per_layer=records[0].slots_per_layer,
        tpot_ms=statistics.fmean(r.tpot_ms for r in records),
        lower_bound_tpot_ms=statistics.fmean(r.lower_bound_tpot_ms for r in records),
        demand_misses=sum(r.demand_misses for r in records),
        h2d_bytes=sum(r.h2d_bytes_demand + r.h2d_bytes_prefetch for r in records),
        activation_bytes=sum(r.extra.get("link_bytes_activations", 0) for r in records),
        acceptance_rate=(statistics.fmean(r.acceptance_rate for r in records)
                         if records[0].acceptance_rate is not None else None),
        simulated=records[0].simulated, hardware=records[0].hardware,
    )
