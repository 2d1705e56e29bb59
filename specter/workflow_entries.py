"""What the workflow checks in each experiment's config entry before any job runs (`specter.workflow_checks` calls
these): its system options, arms and governors as `specter sweep` would take them, and, for runs that decode live,
systems and settings the live engine runs. Each problem is one ConfigError naming the key, the value and the fix.
"""

from __future__ import annotations

from specter.config_document import ConfigError


def check_options(name: str, entry: dict, systems: dict) -> None:
    """An experiment's system options: each one some listed system has, each value one that system takes."""
    from specter.errors import SpecterError
    from specter.runspec.flags import same_value
    from specter.systems import get_system

    listed = [s for s in entry.get("systems") or [] if s in systems]
    for option, values in (entry.get("options") or {}).items():
        where = f"config experiments.{name}.options.{option}"
        having = [s for s in listed if option in systems[s].options]
        if not having:
            raise ConfigError(f"{where}: no listed system ({', '.join(listed)}) has option {option!r}; see "
                              "`specter systems`")
        if (twice := same_value(values)) is not None:
            raise ConfigError(f"{where}: {twice[0]!r} and {twice[1]!r} are one value; give each value once")
        for system in having:
            parsed: dict[str, object] = {}
            for value in values:
                text = str(value).lower() if isinstance(value, bool) else str(value)
                try:
                    setting = repr(get_system(system, {option: text}).settings()[option])
                except SpecterError as err:
                    raise ConfigError(f"{where}: {err}") from None
                if setting in parsed:  # `specter sweep` would refuse it: one setting of the system, run twice
                    raise ConfigError(f"{where}: {parsed[setting]!r} and {value!r} are one setting of {system}; give "
                                      "each value once")
                parsed[setting] = value


def check_arms(name: str, entry: dict, systems: dict) -> None:
    """An experiment's arms, as `specter sweep` would refuse them, before any job runs."""
    from specter.errors import SpecterError
    from specter.runspec import Arm

    listed = [systems[s] for s in entry.get("systems") or [] if s in systems]
    for arm, settings in (entry.get("arms") or {}).items():
        where = f"config experiments.{name}.arms.{arm}"
        if ":" in arm or "=" in arm or not arm.strip() or not arm.isprintable():
            raise ConfigError(f"config experiments.{name}.arms.{arm!r}: an arm's name cannot be empty or hold ':', '=' "
                              "or a control character (a newline, a tab); rename it")
        items = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in (settings or {}).items()]
        try:
            Arm.parse(f"{arm}:{','.join(items)}").check(listed)
        except SpecterError as err:
            raise ConfigError(f"{where}: {err}") from None


def check_governors(name: str, entry: dict, systems: dict) -> None:
    """`governors` adds K settings beside the case's: not with a `k` axis (which lists its K itself), and only where
    some listed system takes a window."""
    if not entry.get("governors"):
        return
    where = f"config experiments.{name}.governors"
    if "k" in (entry.get("axes") or {}):
        raise ConfigError(f"{where}: the experiment also has a k axis; list the governors among its k values instead")
    listed = [systems[s] for s in entry.get("systems") or [] if s in systems]
    if not any(s.speculative and s.takes_window for s in listed):
        raise ConfigError(f"{where}: none of its systems ({', '.join(entry.get('systems') or [])}) drafts a window "
                          "for a governor to choose; add a speculative system (specter) or remove governors")


def check_measured(name: str, entry: dict, config: dict) -> None:
    """An experiment that decodes live runs in cases at the model's own shapes, with systems the live engine runs."""
    from specter.experiments import cases_of

    for case in cases_of(config, name):
        if config["cases"][case].get("cost_as"):
            raise ConfigError(f"config experiments.{name}.cases: {case!r} prices the model at "
                              f"{config['cases'][case]['cost_as']}'s shapes, and {name} decodes the model itself "
                              "live; list a case without cost_as in its cases")
    check_live_systems(name, entry)
    check_live_settings(name, entry)


#: run settings the live engine refuses (`specter.runs.checks`), and the values it takes
LIVE_ONLY = {"expert_bits": (16,), "pricing": ("fused", "counted")}


def check_live_settings(name: str, entry: dict) -> None:
    """The axes and arms of an experiment whose runs decode live at values the live engine takes: FP experts, greedy
    decoding, a twin priced counted or fused (else the workflow would fail at that job, after the builds)."""
    axes = entry.get("axes") or {}
    given = [(f"axes.{key}", value) for key, values in axes.items() for value in values]
    given += [(f"arms.{arm}.{key}", value) for arm, settings in (entry.get("arms") or {}).items()
              for key, value in (settings or {}).items()]
    for where, value in given:
        key = where.rsplit(".", 1)[-1]
        if (key in LIVE_ONLY and value not in LIVE_ONLY[key]) or (key == "temperature" and value != 0):
            takes = "0 (greedy)" if key == "temperature" else ", ".join(map(str, LIVE_ONLY[key]))
            raise ConfigError(f"config experiments.{name}.{where}: {value!r}, and {name}'s runs decode live, which "
                              f"takes {takes} there; leave it out of this experiment")


def check_live_systems(name: str, entry: dict) -> None:
    """Every system of an experiment whose runs decode live, at each of its options' and arms' settings, one the live
    engine runs (else the workflow would fail at that job, after the builds)."""
    from specter.systems import get_system

    def text(value) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    options = entry.get("options") or {}
    arms = [(arm, settings or {}) for arm, settings in (entry.get("arms") or {}).items()]
    for system in entry.get("systems") or []:
        known = get_system(system).options
        settings = [("systems", {})] + [
            (f"options.{option}", {option: text(value)})
            for option, values in options.items() if option in known for value in values] + [
            (f"arms.{arm}", {key: text(value) for key, value in chosen.items() if key in known})
            for arm, chosen in arms]
        for where, setting in settings:
            reason = get_system(system, setting).cannot_run_live()
            if reason:
                raise ConfigError(f"config experiments.{name}.{where}: the live engine cannot run {system!r} "
                                  f"({reason}); leave it out")


def check_profiles(name: str, entry: dict, config: dict) -> None:
    """Each profile an experiment's runs take named once: a preset given by its name and by its file, or a dispatch
    time of the `dispatch_us` axis equal to `profile` on a profile the experiment runs on, is one run twice (`specter
    sweep` refuses it, after the builds)."""
    from specter.experiments import cases_of
    from specter.timing import load_profile
    from specter.timing.hardware import profile_digest

    axes = entry.get("axes") or {}
    seen: dict[str, str] = {}
    for value in axes.get("hardware") or []:
        digest = profile_digest(load_profile(value).to_yaml_dict())
        if digest in seen:
            raise ConfigError(f"config experiments.{name}.axes.hardware: {seen[digest]!r} and {value!r} are one "
                              "profile (the same numbers), so one run twice; give it once")
        seen[digest] = value
    times = [t for t in axes.get("dispatch_us") or [] if t != "profile"]
    if not times or "profile" not in (axes.get("dispatch_us") or []):
        return
    cases = [config["cases"][c].get("hardware") or config["hardware"]["main"] for c in cases_of(config, name)]
    arms = [(settings or {}).get("hardware") for settings in (entry.get("arms") or {}).values()]
    hardware = list(axes.get("hardware") or []) or [h for arm in arms or [None] for h in ([arm] if arm else cases)]
    for profile in dict.fromkeys(hardware):
        us = load_profile(profile).to_yaml_dict()["host"]["dispatch_us"]
        if any(float(t) == us for t in times):
            raise ConfigError(f"config experiments.{name}.axes.dispatch_us: {us:g} and profile are one time on "
                              f"{profile} (its host.dispatch_us), so one run twice; give it once")
