"""The workflow's config as a document, checked before what its values mean (`specter.workflow_checks`): no key given
twice in a file (`check_unique_keys`), the JSON schema (`check_schema`), and every number finite and within the bounds
of the flag it becomes (`check_numbers`). Each problem is one ConfigError naming the key, the value and the fix.
"""

from __future__ import annotations

import math
from pathlib import Path


class ConfigError(ValueError):
    """A config value the workflow refuses; the message names the key and the fix."""


def check_unique_keys(paths) -> None:
    """Refuse a config file that gives one key twice in a mapping (YAML keeps the last silently): the key, its file and
    both lines. Snakemake has read the files already; this reads them again, as text, before any check of values."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: the keys it merges may be given again
                continue
            key = loader.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise ConfigError(f"config {key!r} is given twice in one mapping of {path} (lines {seen[key]} and "
                                  f"{key_node.start_mark.line + 1}); YAML would keep the last silently: keep one")
            seen[key] = key_node.start_mark.line + 1
        return loader.construct_mapping(node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)

    def refuse(node, text):
        raise ConfigError(f"config value {text!r} in {path} (line {node.start_mark.line + 1}) is a number YAML 1.1 "
                          "reads in another base or with separators; write it as a plain decimal")

    from specter.io import plain_numbers

    plain_numbers(Loader, refuse)
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # Snakemake read it; its own error stands where it could not
        try:
            yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError:
            continue


def check_schema(config: dict, schema_file: str | Path) -> None:
    """The config against the workflow's JSON schema; the most relevant problem as one ConfigError naming its key."""
    import jsonschema
    import yaml

    schema = yaml.safe_load(Path(schema_file).read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "(the top level)"
        message = " ".join(error.message.split())
        raise ConfigError(f"config {where}: {message[:400]}; fix it (workflow/schemas/config.schema.yaml describes "
                          "every key)")


def _whole(key: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"config {key}: {value!r} must be a whole number from {low} to {high}; fix it")


def _real(key: str, value, low: float, high: float, above_low: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    ok = ok and math.isfinite(float(value)) and (low < value if above_low else low <= value) and value <= high
    if not ok:
        bound = f"above {low:g} and at most {high:g}" if above_low else f"from {low:g} to {high:g}"
        raise ConfigError(f"config {key}: {value!r} must be a finite number {bound}; fix it")


def check_numbers(config: dict) -> None:
    """Every number of the config finite and within the bounds of the flag it becomes (the schema gives lower bounds
    only, and lets NaN and infinity through)."""
    from specter.runspec import LIMITS, MAX_WINDOW
    from specter.timing.hardware import MAX_GB

    wide = (1, 1 << 20)  # the CLI's bound of a count of tokens or inputs
    whole = {
        **{f"protocol.{name}": LIMITS[name] for name in ("num_prompts", "prefix_tokens", "max_new_tokens", "seed",
                                                          "repeats")},
        "fidelity.num_prompts": LIMITS["num_prompts"], "fidelity.prefix_tokens": LIMITS["prefix_tokens"],
        "fidelity.new_tokens": LIMITS["max_new_tokens"], "fidelity.stride": wide,
        "calibration.num_sequences": LIMITS["num_prompts"], "calibration.seq_len": (2, wide[1]),
    }
    for key, (low, high) in whole.items():
        section, name = key.split(".")
        if name in config[section]:
            _whole(key, config[section][name], low, high)
    drafts = [("drafts", d) for d in config["drafts"]] + [(f"models.{m}.drafts", d) for m, spec in
                                                          config["models"].items() for d in spec.get("drafts") or []]
    for where, draft in drafts:
        _whole(f"{where} group_size", draft["group_size"], *wide)
    for name, case in config["cases"].items():
        _whole(f"cases.{name}.k", case["k"], 1, MAX_WINDOW)
        _whole(f"cases.{name}.slots", case["slots"], *wide)
    for name, entry in config["experiments"].items():
        axes = entry.get("axes") or {}
        where = f"experiments.{name}.axes"
        for k in axes.get("k") or []:
            if not isinstance(k, str):
                _whole(f"{where}.k", k, 1, MAX_WINDOW)
        for axis, (low, high) in {"prefix_tokens": LIMITS["prefix_tokens"], "resident_per_layer": wide,
                                  "same_memory_as": wide}.items():
            for value in axes.get(axis) or []:
                _whole(f"{where}.{axis}", value, low, high)
        for value in axes.get("resident_fraction") or []:
            _real(f"{where}.resident_fraction", value, 0, 1, above_low=True)
        for value in axes.get("device_memory_gb") or []:
            _real(f"{where}.device_memory_gb", value, 0, MAX_GB, above_low=True)
        for value in axes.get("temperature") or []:
            _real(f"{where}.temperature", value, 0, 100)
