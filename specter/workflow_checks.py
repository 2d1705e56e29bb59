"""What the workflow checks in its config before any job runs, beyond the schema: names that become paths, files that
must exist, and settings that only make sense together (systems, builds, presets, prompt sets, architectures, cases,
group sizes against the models' widths). Each problem is one error naming the key, the value and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path

#: names that become path components: letters, digits, `._-`, no leading dot or dash, no `..`
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ConfigError(ValueError):
    """A config value the workflow refuses; the message names the key and the fix."""


def check_name(key: str, name: str) -> None:
    if not isinstance(name, str) or not NAME.match(name) or ".." in name:
        raise ConfigError(f"config {key}: {name!r} is not a safe name (letters, digits, '.', '_' and '-', starting "
                          "with a letter or digit, no '..'); rename it")


def _model_widths(name: str, spec: dict) -> tuple[int, int, int, int]:
    """(hidden size, expert width, routed experts, top-k) of a configured model, before it is built."""
    if "path" in spec:
        import json

        from specter.models.adapter import ARCHITECTURES

        cfg = json.loads((Path(spec["path"]) / "config.json").read_text())
        arch = ARCHITECTURES[cfg["model_type"]]
        experts = next(cfg[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if k in cfg)
        return cfg["hidden_size"], cfg[arch.intermediate_key], experts, cfg["num_experts_per_tok"]
    build = spec["build"]
    from specter.models.proxies import PROXIES

    if build in PROXIES:
        experts, top_k, shared, _ = PROXIES[build]
        return 576, (1536 - shared) // experts, experts, top_k  # SmolLM2-135M: hidden 576, FFN 1536
    from specter.models.tiny import tiny_config

    cfg = tiny_config(build.removeprefix("tiny-"))
    experts = next(getattr(cfg, k) for k in ("num_local_experts", "num_experts", "n_routed_experts")
                   if getattr(cfg, k, None))
    width = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    return cfg.hidden_size, width, experts, cfg.num_experts_per_tok


def _check_models(config: dict) -> dict[str, tuple[int, int, int, int]]:
    from specter.models.builders import builders

    known = builders()
    widths = {}
    for name, spec in config["models"].items():
        check_name("models", name)
        if "path" in spec and not (Path(spec["path"]) / "config.json").is_file():
            raise ConfigError(f"config models.{name}.path: {spec['path']!r} holds no checkpoint (no config.json); "
                              "fix the path")
        if "build" in spec and spec["build"] not in known:
            raise ConfigError(f"config models.{name}.build: {spec['build']!r} is not buildable; buildable: "
                              f"{', '.join(known)}")
        widths[name] = _model_widths(name, spec)
        for d in spec.get("drafts") or config["drafts"]:
            hidden, width = widths[name][:2]
            if hidden % d["group_size"] or width % d["group_size"]:
                raise ConfigError(f"config drafts of {name}: group_size {d['group_size']} does not divide the expert "
                                  f"input widths {hidden} and {width}; choose a divisor of both")
    return widths


def _check_cases(config: dict, widths: dict) -> None:
    from specter.errors import SpecterError
    from specter.models.architectures import check_structure, load_architecture

    for name, case in config["cases"].items():
        check_name("cases", name)
        if case["model"] not in config["models"]:
            raise ConfigError(f"config cases.{name}.model: {case['model']!r} is not a configured model; models: "
                              f"{', '.join(config['models'])}")
        _, _, experts, top_k = widths[case["model"]]
        if not 1 <= case["slots"] <= experts:
            raise ConfigError(f"config cases.{name}.slots: {case['slots']} must be between 1 and {experts} (the "
                              f"experts per layer of {case['model']})")
        if case.get("cost_as"):
            try:
                arch = load_architecture(case["cost_as"])
                moe = arch.meta_model().moe_layers[0]
                check_structure(arch, moe.num_experts, moe.top_k, experts, top_k, case["model"])
            except SpecterError as err:
                raise ConfigError(f"config cases.{name}.cost_as: {err}") from None


def _same_memory_slots(entry: dict, case: dict) -> list[int]:
    """The slot counts whose Specter memory an experiment's `same_memory` budgets give every system in a case."""
    axes = entry.get("axes") or {}
    slots = [case["slots"]] if "same_memory" in (axes.get("memory") or []) else []
    return slots + [int(n) for n in axes.get("same_memory_as") or []]


def _check_same_memory(config: dict) -> None:
    """A same-memory budget past the case's device is refused here, before any job (a run would refuse it only once
    its job runs). Checked where the bytes are known before anything is built: cases priced at an architecture's
    shapes (`cost_as`), with the first draft of the case's model."""
    from specter.experiments import EXPERIMENTS
    from specter.models.architectures import load_architecture
    from specter.offload.memory import slot_row_bytes, specter_resident_bytes
    from specter.speculation.governor import PROFILE_KS
    from specter.timing import load_profile

    works: dict[str, object] = {}
    protocol = config["protocol"]
    for name, entry in config["experiments"].items():
        if name not in EXPERIMENTS or not entry.get("systems"):
            continue
        cases = entry.get("cases") or (list(config["cases"]) if EXPERIMENTS[name].all_cases
                                       else list(config["cases"])[:1])
        axes = entry.get("axes") or {}
        for case_name in cases:
            case = config["cases"][case_name]
            slots = _same_memory_slots(entry, case)
            if not slots or not case.get("cost_as"):
                continue
            if case["cost_as"] not in works:
                works[case["cost_as"]] = load_architecture(case["cost_as"]).work()
            work = works[case["cost_as"]]
            model = config["models"][case["model"]]
            draft = (model.get("drafts") or config["drafts"])[0]
            ks = axes.get("k") or [case["k"]]
            window = max(int(k) if str(k).isdigit() else max(PROFILE_KS) for k in ks)
            prefix = max(axes.get("prefix_tokens") or [protocol["prefix_tokens"]])
            resident = specter_resident_bytes(work, work.quantized_expert_bytes(draft["bits"], draft["group_size"]),
                                              prefix + protocol["max_new_tokens"] + window)
            hardware = case.get("hardware") or config["hardware"]["main"]
            device = load_profile(hardware).device_memory_bytes
            for n in slots:
                need = resident + n * slot_row_bytes(work)
                if need > device:
                    raise ConfigError(
                        f"config experiments.{name} in case {case_name}: the same-memory budget at {n} slots per layer "
                        f"is Specter's memory there, {need / 1e9:.2f} GB ({case['cost_as']} shapes, its INT4 draft, KV "
                        f"for K = {window}), more than {hardware}'s {device / 1e9:g} GB; use fewer slots, or a case "
                        "on a device with more memory")


def _check_arms(name: str, entry: dict, systems: dict) -> None:
    """An experiment's arms, as `specter sweep` would refuse them, before any job runs."""
    from specter.errors import SpecterError
    from specter.runspec import Arm

    listed = [systems[s] for s in entry.get("systems") or [] if s in systems]
    for arm, settings in (entry.get("arms") or {}).items():
        where = f"config experiments.{name}.arms.{arm}"
        if ":" in arm or "=" in arm or not arm.strip():
            raise ConfigError(f"{where}: an arm's name cannot be empty or hold ':' or '='; rename it")
        items = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in (settings or {}).items()]
        try:
            Arm.parse(f"{arm}:{','.join(items)}").check(listed)
        except SpecterError as err:
            raise ConfigError(f"{where}: {err}") from None


def check_config(config: dict) -> None:
    """Every check the schema cannot make; raises ConfigError naming the first problem."""
    from specter.errors import SpecterError
    from specter.experiments import EXPERIMENTS, records_experiment
    from specter.systems import registry
    from specter.timing import load_profile

    widths = _check_models(config)
    for name, spec in config["datasets"].items():
        check_name("datasets", name)
        if "path" in spec and not Path(spec["path"]).is_file():
            raise ConfigError(f"config datasets.{name}.path: {spec['path']!r} does not exist; fix the path")
    _check_cases(config, widths)
    systems = registry()
    for name, entry in config["experiments"].items():
        if name not in EXPERIMENTS:
            raise ConfigError(f"config experiments.{name}: no such experiment; experiments: {', '.join(EXPERIMENTS)}")
        source = records_experiment(name)
        if source != name and source not in config["experiments"]:
            raise ConfigError(f"config experiments.{name} reads the records of {source}: configure {source} too")
        if EXPERIMENTS[source].source == "sweep" and not config["experiments"][source].get("systems"):
            raise ConfigError(f"config experiments.{source}: give its systems")
        for system in entry.get("systems") or []:
            if system not in systems:
                raise ConfigError(f"config experiments.{name}.systems: unknown system {system!r}; known: "
                                  f"{', '.join(sorted(systems))}")
        _check_arms(name, entry, systems)
        for case in entry.get("cases") or []:
            if case not in config["cases"]:
                raise ConfigError(f"config experiments.{name}.cases: {case!r} is not a configured case; cases: "
                                  f"{', '.join(config['cases'])}")
        cases = [config["cases"][c].get("hardware") for c in config["cases"]]
        for profile in [config["hardware"]["main"], *filter(None, cases), *((entry.get("axes") or {}).get("hardware")
                                                                             or [])]:
            try:
                load_profile(profile)
            except SpecterError as err:
                raise ConfigError(f"config hardware: {err}") from None
    _check_same_memory(config)
