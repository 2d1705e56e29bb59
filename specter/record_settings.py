"""A run record's system settings held to its system (`settings_problem`, one of `record_checks`' checks): the
options its system's source declares, read without importing the systems (`system_names.option_kinds`), and the
options as given, which the tables label rows by."""

from __future__ import annotations

#: what a setting of each option type is in a record's JSON
_SETTING_TYPES = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}


def settings_problem(record: dict, config: dict) -> str | None:
    """Where `config.system_settings` is not its system's: each of the system's options once (as the system's source
    declares them, `system_names.option_kinds`), none other, each value of its option's type."""
    from specter.system_names import option_kinds

    system, settings = record.get("system"), config.get("system_settings")
    kinds = option_kinds(system) if isinstance(system, str) else None
    if kinds is None or settings is None:
        return None
    if not isinstance(settings, dict) or set(settings) != set(kinds):
        return (f"config.system_settings is {settings!r:.80}, and {system}'s options are "
                f"{', '.join(sorted(kinds)) or 'none'}")
    for option, (kind, _default) in kinds.items():
        value = settings[option]
        if not isinstance(value, _SETTING_TYPES[kind]) or (kind != "bool" and isinstance(value, bool)):
            return (f"config.system_settings.{option} is {value!r:.40}, and {system}'s {option} is "
                    f"{'an' if kind == 'int' else 'a'} {kind}")
    return _options_problem(config.get("system_options"), settings, kinds)


def _options_problem(given, settings: dict, kinds: dict[str, tuple]) -> str | None:
    """Where `config.system_options` (the options as given, which the tables label rows by) is not what the run's
    settings were read from: each a (name, text) pair of the system's options, each name once, its text the setting,
    and every setting not given its option's default."""
    from specter.runspec.parts import parse_option

    if given is None:
        return None
    pairs = given if isinstance(given, list) else None
    if pairs is None or not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
                                for p in pairs) or len({p[0] for p in pairs}) != len(pairs):
        return f"config.system_options is {given!r:.80}, not options given once each as name and text"
    for name, text in pairs:
        if name not in kinds:
            return f"config.system_options gives {name}, which is not an option of the run's settings"
        try:
            value = parse_option(name, {"bool": bool, "int": int, "float": float, "str": str}[kinds[name][0]], text)
        except ValueError:
            value = None
        if value is None or value != settings[name] or isinstance(value, bool) != isinstance(settings[name], bool):
            return (f"config.system_options gives {name}={text!r:.40}, and its run's setting "
                    f"(config.system_settings.{name}) is {settings[name]!r:.40}")
    for name, (_kind, default) in kinds.items():
        if name not in {p[0] for p in pairs} and settings[name] != default:
            return (f"config.system_settings.{name} is {settings[name]!r:.40}, and config.system_options does not "
                    f"give it (its default is {default!r:.40})")
    return None
