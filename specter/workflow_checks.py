"""What the workflow checks in its config before any job runs, once the document itself is checked
(`specter.config_document`: keys given twice, the schema, every number's bounds): what the schema cannot say
(`check_config`): names that become paths, matched whole; every path-like value; the sequences the config makes
within the models' positions; settings that only make sense together (systems, builds, presets, prompt sets,
architectures, cases, system options, group sizes against the models' widths). Each problem is one ConfigError naming
the key, the value and the fix; the workflow prints it as one line and exits 2, before Snakemake plans anything
(workflow/rules/common.smk).
"""

from __future__ import annotations

import re
from pathlib import Path

from specter.config_document import ConfigError, check_numbers
from specter.workflow_entries import (
    check_arms,
    check_governors,
    check_live_settings,
    check_live_systems,
    check_measured,
    check_options,
    check_profiles,
)

#: names that become path components: letters, digits, `._-`, no leading dot or dash, no `..` (matched whole: `$`
#: alone would let a name end in a newline)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: SmolLM2-135M's positions, the built smollm2-moe models' (its GGUF's llama.context_length)
SMOLLM2_POSITIONS = 8192


def check_name(key: str, name: str) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
        raise ConfigError(f"config {key}: {name!r} is not a safe name (letters, digits, '.', '_' and '-', starting "
                          "with a letter or digit, no '..'); rename it")


def _check_path(key: str, value: str) -> None:
    """A path from the config: text on one line, without `..` (a path that climbs out of where the workflow runs
    reads files nobody meant it to)."""
    if not isinstance(value, str) or not value.strip() or any(c in value for c in "\0\n\r"):
        raise ConfigError(f"config {key}: {value!r} is not a path; give a file's path on one line")
    if ".." in Path(value).parts:
        raise ConfigError(f"config {key}: {value!r} climbs out with '..'; give the path without it (absolute, or "
                          "below the directory the workflow runs in)")


def _check_prompt_file(key: str, value: str, num_prompts: int, field: str | None = None) -> None:
    """A prompt set given as a file: a safe path to an existing file of a format the suite reads, with its text field
    and at least `num_prompts` distinct non-empty texts (each must also hold the prompt's tokens, distinct from the
    others', which the first run checks: counting them needs the model's tokenizer)."""
    from specter.data.prompts import READERS, read_texts
    from specter.errors import SpecterError

    _check_path(key, value)
    path = Path(value)
    if not path.is_file():
        raise ConfigError(f"config {key}: {value!r} does not exist (or is not a file); fix the path")
    if path.suffix.lower() not in READERS:
        raise ConfigError(f"config {key}: {value!r} is not a prompt file ({', '.join(READERS)}); give one of those")
    try:
        texts = read_texts(path, field)
    except SpecterError as err:
        raise ConfigError(f"config {key}: {err}") from None
    _enough_prompts(key, value, len(set(texts)), num_prompts)


def _enough_prompts(key: str, name: str, held: int, num_prompts: int) -> None:
    if held < num_prompts:
        fix = f"give num_prompts {held} or fewer, or a set with more prompts" if held else "add prompts to it"
        raise ConfigError(f"config {key}: {name!r} holds {held} distinct non-empty prompts, and num_prompts asks for "
                          f"{num_prompts}; {fix}")


def _model_widths(name: str, spec: dict) -> tuple[int, int, int, int, int | None]:
    """(hidden size, expert width, routed experts, top-k, positions) of a configured model, before it is built."""
    if "path" in spec:
        import json

        from specter.models.adapter import ARCHITECTURES

        cfg = json.loads((Path(spec["path"]) / "config.json").read_text())
        arch = ARCHITECTURES[cfg["model_type"]]
        experts = next(cfg[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if k in cfg)
        return (cfg["hidden_size"], cfg[arch.intermediate_key], experts, cfg["num_experts_per_tok"],
                cfg.get("max_position_embeddings"))
    build = spec["build"]
    from specter.models.proxies import PROXIES

    if build in PROXIES:
        experts, top_k, shared, _ = PROXIES[build]
        return 576, (1536 - shared) // experts, experts, top_k, SMOLLM2_POSITIONS  # SmolLM2-135M: hidden 576, FFN 1536
    from specter.models.tiny import tiny_config

    cfg = tiny_config(build.removeprefix("tiny-"))
    experts = next(getattr(cfg, k) for k in ("num_local_experts", "num_experts", "n_routed_experts")
                   if getattr(cfg, k, None))
    width = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    return cfg.hidden_size, width, experts, cfg.num_experts_per_tok, cfg.max_position_embeddings


def _check_models(config: dict) -> dict[str, tuple[int, int, int, int, int | None]]:
    from specter.models.builders import builders

    known = builders()
    widths = {}
    for name, spec in config["models"].items():
        check_name("models", name)
        if "path" in spec:
            _check_path(f"models.{name}.path", spec["path"])
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
        _, _, experts, top_k, _ = widths[case["model"]]
        if not 1 <= case["slots"] <= experts:
            raise ConfigError(f"config cases.{name}.slots: {case['slots']} must be between 1 and {experts} (the "
                              f"experts per layer of {case['model']})")
        for key in ("cost_as", "hardware"):
            if case.get(key) and ("/" in case[key] or Path(case[key]).suffix):
                _check_path(f"cases.{name}.{key}", case[key])
        if case.get("cost_as"):
            try:
                arch = load_architecture(case["cost_as"])
                moe = arch.meta_model().moe_layers[0]
                check_structure(arch, moe.num_experts, moe.top_k, experts, top_k, case["model"])
            except SpecterError as err:
                raise ConfigError(f"config cases.{name}.cost_as: {err}") from None
    from specter.experiments import cases_of

    for name, entry in config["experiments"].items():  # a slots axis past a case's experts fails its sweep's job
        for slots in (entry.get("axes") or {}).get("resident_per_layer") or []:
            for case in cases_of(config, name):
                experts = widths[config["cases"][case]["model"]][2]
                if not (isinstance(slots, int) and 1 <= slots <= experts):
                    raise ConfigError(f"config experiments.{name}.axes.resident_per_layer: {slots!r} must be between "
                                      f"1 and {experts} (the experts per layer of case {case}'s model); drop it")


def _same_memory_slots(entry: dict, case: dict) -> list[int]:
    """The slot counts whose Specter memory an experiment's `same_memory` budgets give every system in a case."""
    axes = entry.get("axes") or {}
    slots = [case["slots"]] if "same_memory" in (axes.get("memory") or []) else []
    return slots + [int(n) for n in axes.get("same_memory_as") or []]


def _check_same_memory(config: dict) -> None:
    """A same-memory budget past the case's device is refused here, before any job (a run would refuse it only once
    its job runs). Checked where the bytes are known before anything is built: cases priced at an architecture's
    shapes (`cost_as`), with the first draft of the case's model."""
    from specter.experiments import EXPERIMENTS, cases_of
    from specter.models.architectures import load_architecture
    from specter.offload.memory import slot_row_bytes, specter_resident_bytes
    from specter.offload.work import ModelWork
    from specter.runspec import Window
    from specter.timing import load_profile

    works: dict[str, object] = {}
    protocol = config["protocol"]
    for name, entry in config["experiments"].items():
        if name not in EXPERIMENTS or not entry.get("systems"):
            continue
        cases = cases_of(config, name)
        axes = entry.get("axes") or {}
        for case_name in cases:
            case = config["cases"][case_name]
            slots = _same_memory_slots(entry, case)
            if not slots or not case.get("cost_as"):
                continue
            if case["cost_as"] not in works:
                works[case["cost_as"]] = ModelWork.of(load_architecture(case["cost_as"]).meta_model())
            work = works[case["cost_as"]]
            model = config["models"][case["model"]]
            draft = (model.get("drafts") or config["drafts"])[0]
            ks = axes.get("k") or [case["k"]]
            window = max(Window.parse(k).longest for k in ks)
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


def _check_positions(config: dict, widths: dict) -> None:
    """The longest sequence each job makes fits its model's positions (`max_position_embeddings`), as the command
    would check once its job runs: a fidelity report's prompt and new tokens; a GPTQ draft's calibration sequences;
    and in each case the longest prompt, the new tokens and the largest window of the experiments run there."""
    from specter.experiments import cases_of
    from specter.runspec import Window

    protocol, fidelity, calibration = config["protocol"], config["fidelity"], config["calibration"]
    for model, (*_, positions) in widths.items():
        if not isinstance(positions, int):
            continue
        need = fidelity["prefix_tokens"] + fidelity["new_tokens"]
        if need > positions:
            raise ConfigError(f"config fidelity.new_tokens: fidelity.prefix_tokens {fidelity['prefix_tokens']} + "
                              f"fidelity.new_tokens {fidelity['new_tokens']} is {need} positions, more than model "
                              f"{model}'s {positions} (max_position_embeddings); lower fidelity.new_tokens")
        gptq = any(d["method"] == "gptq" for d in config["models"][model].get("drafts") or config["drafts"])
        if gptq and calibration["seq_len"] > positions:
            raise ConfigError(f"config calibration.seq_len: {calibration['seq_len']} positions are more than model "
                              f"{model}'s {positions} (max_position_embeddings); lower calibration.seq_len")
    for case_name, case in config["cases"].items():
        positions = widths[case["model"]][4]
        if not isinstance(positions, int):
            continue
        windows, prefixes = [case["k"]], [protocol["prefix_tokens"]]
        for name, entry in config["experiments"].items():
            if case_name in cases_of(config, name):
                axes = entry.get("axes") or {}
                windows += [Window.parse(k).longest for k in axes.get("k") or []]
                prefixes += axes.get("prefix_tokens") or []
        need = max(prefixes) + protocol["max_new_tokens"] + max(windows)
        if need > positions:
            raise ConfigError(
                f"config protocol.max_new_tokens: a prompt of {max(prefixes)} tokens (protocol.prefix_tokens or an "
                f"experiment's prefix_tokens) + protocol.max_new_tokens {protocol['max_new_tokens']} + a window of "
                f"{max(windows)} (the case's k or an experiment's) is {need} positions in case {case_name}, more than "
                f"model {case['model']}'s {positions} (max_position_embeddings); lower protocol.max_new_tokens, the "
                "prefix_tokens or the window")


def check_config(config: dict) -> None:
    """Every check the schema cannot make; raises ConfigError naming the first problem."""
    from specter.data.prompts import DATASETS, SHIPPED_SIZES
    from specter.errors import SpecterError
    from specter.experiments import EXPERIMENTS, cases_of, records_experiment
    from specter.systems import registry
    from specter.timing import load_profile

    check_numbers(config)
    widths = _check_models(config)
    for name, spec in config["datasets"].items():
        check_name("datasets", name)
        if "path" in spec and name in DATASETS:
            raise ConfigError(f"config datasets.{name}: {name!r} is a prompt set the suite ships, and this one is a "
                              "file: runs and the fidelity report would each read another; give the file its own name")
        if "path" in spec:
            _check_prompt_file(f"datasets.{name}.path", spec["path"], config["protocol"]["num_prompts"],
                               spec.get("field"))
        elif name in SHIPPED_SIZES:
            _enough_prompts(f"datasets.{name}", name, SHIPPED_SIZES[name], config["protocol"]["num_prompts"])
        elif name not in DATASETS:
            raise ConfigError(f"config datasets.{name}: not a prompt set the suite ships ({', '.join(DATASETS)}); "
                              "name one of them, or give this one a path: {path: FILE.jsonl}")
    for name, case in config["cases"].items():  # before any check reads a case's model
        if case["model"] not in config["models"]:
            raise ConfigError(f"config cases.{name}.model: {case['model']!r} is not a configured model; models: "
                              f"{', '.join(config['models'])}")
    dataset = config["fidelity"]["dataset"]
    if dataset not in DATASETS:  # a shipped set, else a file
        if "/" not in str(dataset) and not Path(str(dataset)).suffix:
            raise ConfigError(f"config fidelity.dataset: {dataset!r} is not a prompt set the suite ships "
                              f"({', '.join(DATASETS)}) and not a file's path; name one of them, or a FILE.jsonl")
        _check_prompt_file("fidelity.dataset", dataset, config["fidelity"]["num_prompts"])
    elif dataset in SHIPPED_SIZES:
        _enough_prompts("fidelity.dataset", dataset, SHIPPED_SIZES[dataset], config["fidelity"]["num_prompts"])
    _check_positions(config, widths)
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
            if EXPERIMENTS[name].table.speculative and not systems[system].speculative:
                raise ConfigError(f"config experiments.{name}.systems: {system!r} drafts no window, and {name}'s "
                                  "table compares draft windows; list speculative systems only")
            if EXPERIMENTS[name].table.systems and system not in EXPERIMENTS[name].table.systems:
                raise ConfigError(f"config experiments.{name}.systems: {name}'s table compares runs of "
                                  f"{' and '.join(EXPERIMENTS[name].table.systems)}, not of {system!r}; list those")
        check_options(name, entry, systems)
        check_arms(name, entry, systems)
        check_governors(name, entry, systems)
        for case in entry.get("cases") or []:
            if case not in config["cases"]:
                raise ConfigError(f"config experiments.{name}.cases: {case!r} is not a configured case; cases: "
                                  f"{', '.join(config['cases'])}")
        if EXPERIMENTS[name].measured:
            check_measured(name, entry, config)
        elif (EXPERIMENTS[name].source == "sweep" and config["hardware"].get("engine") == "live"
              and "hardware" not in (entry.get("axes") or {})
              and any(not config["cases"][case].get("cost_as") for case in cases_of(config, name))):
            check_live_systems(name, entry)  # its runs decode live where a case is at the model's own shapes
            check_live_settings(name, entry)
        axes = (entry.get("axes") or {}).get("hardware") or []
        named = [("hardware.main", config["hardware"]["main"]),
                 *((f"cases.{c}.hardware", config["cases"][c]["hardware"]) for c in config["cases"]
                   if config["cases"][c].get("hardware")),
                 *((f"experiments.{name}.axes.hardware[{i}]", profile) for i, profile in enumerate(axes))]
        for key, profile in named:
            if "/" in profile or Path(profile).suffix:  # a file, not a preset's name
                _check_path(key, profile)
            try:
                load_profile(profile)
            except SpecterError as err:
                raise ConfigError(f"config {key}: {err}") from None
        check_profiles(name, entry, config)
    _check_same_memory(config)
