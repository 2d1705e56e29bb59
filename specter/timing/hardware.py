"""Hardware profiles: the numbers the cost model turns work into time, loaded from YAML presets or measured profiles.

A profile is a YAML file with three sections (device, link, host) plus `sources`, a map from each field to where its
number comes from. Presets ship inside the package (`specter/presets/hardware/`, read with `importlib.resources`, so a
wheel install has them too); `specter profile-bandwidth` writes the same format from
measurement. `--hardware` takes a preset name or a path to such a file. Units are in the key names: GB/s are 1e9 bytes
per second, TFLOP/s 1e12 FLOP per second, us microseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from specter.errors import SpecterError
from specter.timing.profile_yaml import AliasRefused, ProfileLoader


def _preset_dir():
    """The presets shipped with the package (a Traversable: a directory on disk, or inside a zip)."""
    from importlib.resources import files

    return files("specter.presets").joinpath("hardware")

#: the largest profile file read: a profile is a few hundred bytes (a measured one a few KB); a 50 MB one took 75 s
MAX_PROFILE_BYTES = 1 << 20
#: the most measured bandwidth points (a transfer's bandwidth is interpolated over them; `profile-bandwidth` writes 24)
MAX_POINTS = 1024
# Physical bounds, generous: orders of magnitude beyond any device, link or host built, so that only a typo or a
# forged file reaches them (1e300 TFLOP/s became inf in the records).
MAX_TFLOPS = 1e6  # TFLOP/s: an exaflop per device
MAX_GBPS = 1e6  # GB/s: a petabyte per second
MAX_US = 1e6  # microseconds: a second per launch, sync or transfer start
MAX_GB = 1e6  # GB: a petabyte of device memory
MAX_TRANSFER_BYTES = 1 << 50  # a pebibyte in one transfer
# section -> {field: (minimum, maximum)}; every field is required, a finite number within its bounds.
_FIELDS: dict[str, dict[str, tuple[float, float]]] = {
    "device": {
        "peak_tflops": (1e-9, MAX_TFLOPS),
        "memory_bandwidth_gbps": (1e-9, MAX_GBPS),
        "launch_overhead_us": (0.0, MAX_US),
        "host_sync_us": (0.0, MAX_US),
        "memory_gb": (1e-9, MAX_GB),
    },
    "link": {
        "h2d_pinned_gbps": (1e-9, MAX_GBPS),
        "h2d_pageable_gbps": (1e-9, MAX_GBPS),
        "latency_us": (0.0, MAX_US),
    },
    "host": {
        "peak_tflops": (1e-9, MAX_TFLOPS),
        "memory_bandwidth_gbps": (1e-9, MAX_GBPS),
        "launch_overhead_us": (0.0, MAX_US),
        "dispatch_us": (0.0, MAX_US),
        "policy_us": (0.0, MAX_US),
    },
}


@dataclass(frozen=True)
class BandwidthPoint:
    """A measured host-to-device bandwidth at one transfer size."""

    size_bytes: int
    pinned_gbps: float
    pageable_gbps: float


@dataclass(frozen=True)
class HardwareProfile:
    """A device, its host link and its host CPU, in SI units (seconds, bytes, FLOP)."""

    name: str
    description: str
    device_name: str
    device_peak_flops: float  # FLOP/s, dense FP16/BF16 tensor math
    device_memory_bandwidth: float  # bytes/s
    device_launch_overhead: float  # s per kernel
    host_sync: float  # s per point where the host reads a device result (routing, tokens, acceptance)
    device_memory_bytes: int
    link_name: str
    h2d_pinned_bandwidth: float  # bytes/s, large transfers
    h2d_pageable_bandwidth: float  # bytes/s, large transfers
    h2d_latency: float  # s per transfer
    host_name: str
    host_peak_flops: float  # FLOP/s
    host_memory_bandwidth: float  # bytes/s
    host_launch_overhead: float  # s per host op (thread hand-off)
    host_dispatch: float = 0.0  # s of the host thread per kernel it dispatches to the device (the framework's work)
    host_policy: float = 0.0  # s of the host thread per target MoE layer: the runtime choosing copies, its cache
    device_synchronous: bool = False  # the device is the host itself (the CPU as device): a launch returns when done
    h2d_by_size: tuple[BandwidthPoint, ...] = ()  # measured points, ascending size; empty for datasheet presets
    measured: bool = False  # True when written by `specter profile-bandwidth`
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def h2d_bandwidth(self, size_bytes: int, pinned: bool = True) -> float:
        """Bandwidth (bytes/s) of one transfer of `size_bytes`: log-size interpolation of the measured points if any,
        else the large-transfer figure."""
        if not self.h2d_by_size:
            return self.h2d_pinned_bandwidth if pinned else self.h2d_pageable_bandwidth
        pts = self.h2d_by_size
        values = [(p.size_bytes, (p.pinned_gbps if pinned else p.pageable_gbps) * 1e9) for p in pts]
        if size_bytes <= values[0][0]:
            return values[0][1]
        if size_bytes >= values[-1][0]:
            return values[-1][1]
        for (s0, b0), (s1, b1) in zip(values, values[1:]):
            if s0 <= size_bytes <= s1:
                t = (math.log(size_bytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
                return b0 + t * (b1 - b0)
        raise AssertionError("unreachable: sizes are ascending")

    def to_yaml_dict(self) -> dict:
        """The YAML form `load_profile` reads back."""
        out = {
            "name": self.name,
            "description": self.description,
            "measured": self.measured,
            "device": {
                "name": self.device_name,
                "peak_tflops": self.device_peak_flops / 1e12,
                "memory_bandwidth_gbps": self.device_memory_bandwidth / 1e9,
                "launch_overhead_us": self.device_launch_overhead * 1e6,
                "host_sync_us": round(self.host_sync * 1e6, 9),  # us, exactly as read
                "memory_gb": self.device_memory_bytes / 1e9,
                "synchronous": self.device_synchronous,
            },
            "link": {
                "name": self.link_name,
                "h2d_pinned_gbps": self.h2d_pinned_bandwidth / 1e9,
                "h2d_pageable_gbps": self.h2d_pageable_bandwidth / 1e9,
                "latency_us": self.h2d_latency * 1e6,
            },
            "host": {
                "name": self.host_name,
                "peak_tflops": self.host_peak_flops / 1e12,
                "memory_bandwidth_gbps": self.host_memory_bandwidth / 1e9,
                "launch_overhead_us": self.host_launch_overhead * 1e6,
                "dispatch_us": round(self.host_dispatch * 1e6, 9),
                "policy_us": round(self.host_policy * 1e6, 9),
            },
            "sources": dict(self.sources),
        }
        if self.h2d_by_size:
            out["link"]["h2d_by_size"] = [
                {"bytes": p.size_bytes, "pinned_gbps": p.pinned_gbps, "pageable_gbps": p.pageable_gbps}
                for p in self.h2d_by_size
            ]
        return out


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in _preset_dir().iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A preset by name (`specter/presets/hardware/NAME.yaml`) or a profile YAML file by path. A preset's name is the
    preset, whatever the working directory holds: a file of that name is read as `./NAME`."""
    path = Path(name_or_path)
    if str(name_or_path) in preset_names() or not (path.suffix in (".yaml", ".yml") or path.exists()):
        preset = _preset_dir().joinpath(f"{name_or_path}.yaml")
        if str(name_or_path) not in preset_names():
            raise SpecterError(
                f"unknown hardware preset {str(name_or_path)!r}; known presets: {', '.join(preset_names())}; "
                "or pass the path of a profile YAML (e.g. from `specter profile-bandwidth`)"
            )
        return _parse_profile(preset.read_bytes(), f"preset {name_or_path}")
    if not path.is_file():
        raise SpecterError(f"hardware profile file {str(path)!r} " + (
            "is not a file" if path.exists() else "does not exist") + "; pass a profile YAML or a preset's name")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_PROFILE_BYTES + 1)
    except OSError as err:
        raise SpecterError(f"hardware profile {str(path)!r} cannot be read ({err.strerror}); fix its permissions") \
            from None
    profile = _parse_profile(data, str(path))
    like = next((n for n in preset_names() if n.lower() == profile.name.strip().lower()), None)
    if like is not None and profile.name != like:
        raise SpecterError(f"hardware profile {str(path)!r} names itself {profile.name!r}, which reads as the preset "
                           f"{like!r}; give it a name of its own (e.g. name: {like}-measured)")
    if profile.name in preset_names():
        preset = load_profile(profile.name)
        if profile_digest(profile.to_yaml_dict()) != profile_digest(preset.to_yaml_dict()):
            raise SpecterError(f"hardware profile {str(path)!r} names itself {profile.name!r}, a preset's name, with "
                               "other numbers: its records would pass for the preset's and be averaged with them; "
                               f"give it its own name (e.g. name: {profile.name}-measured)")
    return profile


def profile_digest(data: dict) -> str:
    """sha256 of a profile as `HardwareProfile.to_yaml_dict` gives it (a record's `config.hardware_profile`), less its
    description and sources: which hardware a record was priced on, where two profiles may share a name."""
    import hashlib
    import json

    numbers = {k: v for k, v in data.items() if k not in ("description", "sources")}
    return hashlib.sha256(json.dumps(numbers, sort_keys=True, default=str).encode()).hexdigest()


def _parse_profile(data: bytes, origin: str) -> HardwareProfile:
    if len(data) > MAX_PROFILE_BYTES:
        raise SpecterError(f"hardware profile {origin} is larger than {MAX_PROFILE_BYTES} bytes (MAX_PROFILE_BYTES); "
                           "a profile is a few hundred bytes: pass the right file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecterError(f"hardware profile {origin} is not UTF-8 text (byte {err.start}); pass a profile YAML") \
            from None
    try:
        data = yaml.load(text, Loader=ProfileLoader)  # noqa: S506 (a SafeLoader, without aliases)
    except AliasRefused as err:
        mark = err.problem_mark
        raise SpecterError(f"hardware profile {origin} uses a YAML anchor or alias (& or *) at line {mark.line + 1}, "
                           f"column {mark.column + 1}; a profile needs none: write the values out") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecterError(f"hardware profile {origin} is not valid YAML{where}: "
                           f"{getattr(err, 'problem', None) or type(err).__name__}; fix the file") from None
    except RecursionError:
        raise SpecterError(f"hardware profile {origin} nests too deeply to be a profile; pass a profile YAML") \
            from None
    return profile_from_dict(data, origin=origin)


def _number(value: object, where: str, low: float, high: float, origin: str) -> float:
    """`value` as a float, if it is a finite number within [low, high] (else an error naming `where`)."""
    try:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(float(value))
    except OverflowError:  # an integer too large for a float
        ok = False
    if not ok:
        raise SpecterError(f"hardware profile {origin}: {where} must be a finite number, got {value!r:.80}")
    if not low <= value <= high:
        bound = f"positive (at least {low:g})" if low > 0 else "non-negative"
        raise SpecterError(f"hardware profile {origin}: {where} must be {bound} and at most {high:g}, got "
                           f"{value!r:.80}")
    return float(value) + 0.0  # -0.0 as 0.0: a profile and its record say 0


_MISSING_HINTS = {
    "device.host_sync_us": " (microseconds per point where the host reads a device result; the presets assume 15, "
                           "`specter profile-bandwidth` measures it)",
    "host.dispatch_us": " (microseconds of the host thread per kernel it dispatches, the framework's work per op; the "
                        "presets assume 10, `specter profile-bandwidth` measures it: run it again, or add the field)",
    "host.policy_us": " (microseconds of the host thread per target MoE layer, the runtime choosing copies and "
                      "updating its cache; `specter profile-bandwidth` measures it: run it again, or add the field)",
}


#: the keys a profile may hold besides the numbers of `_FIELDS` (anything else is a typo the profile would run without)
_TOP_KEYS = ("name", "description", "measured", "device", "link", "host", "sources")
_SECTION_KEYS = {"device": ("name", "synchronous"), "link": ("name", "h2d_by_size"), "host": ("name",)}


def _known_keys(block: dict, known, where: str, origin: str) -> None:
    unknown = sorted(str(k) for k in block if k not in known)
    if unknown:
        raise SpecterError(f"hardware profile {origin}: unknown key {where}{unknown[0]!s:.60} (a typo runs as if the "
                           f"field were absent); keys there: {', '.join(sorted(map(str, known)))}")


def profile_from_dict(data: object, origin: str = "<dict>") -> HardwareProfile:
    """Validate a profile mapping; every missing, non-numeric or out-of-range field is one error naming it."""
    if not isinstance(data, dict):
        raise SpecterError(f"hardware profile {origin} must be a mapping with device, link and host sections")
    values: dict[str, dict[str, float]] = {}
    _known_keys(data, _TOP_KEYS, "", origin)
    for section, fields_ in _FIELDS.items():
        block = data.get(section)
        if not isinstance(block, dict):
            raise SpecterError(f"hardware profile {origin}: missing section {section!r} (needs {', '.join(fields_)})")
        _known_keys(block, {*fields_, *_SECTION_KEYS[section]}, f"{section}.", origin)
        values[section] = {}
        for key, (low, high) in fields_.items():
            where = f"{section}.{key}"
            if key not in block:
                hint = _MISSING_HINTS.get(where, "")
                raise SpecterError(f"hardware profile {origin}: missing field {where}{hint}")
            values[section][key] = _number(block[key], where, low, high, origin)
    points = []
    by_size = data["link"].get("h2d_by_size") or []
    if not isinstance(by_size, list) or len(by_size) > MAX_POINTS:
        raise SpecterError(f"hardware profile {origin}: link.h2d_by_size must be a list of at most {MAX_POINTS} "
                           f"{{bytes, pinned_gbps, pageable_gbps}} points, got {by_size!r:.80}")
    for i, row in enumerate(by_size):
        where = f"link.h2d_by_size[{i}]"
        if not isinstance(row, dict) or set(row) != {"bytes", "pinned_gbps", "pageable_gbps"}:
            raise SpecterError(f"hardware profile {origin}: {where} needs bytes, pinned_gbps and pageable_gbps, and "
                               f"nothing else; got {sorted(map(str, row)) if isinstance(row, dict) else row!r:.80}")
        size = _number(row["bytes"], f"{where}.bytes", 1, MAX_TRANSFER_BYTES, origin)
        if size != int(size):
            raise SpecterError(f"hardware profile {origin}: {where}.bytes must be a whole number of bytes, got "
                               f"{row['bytes']!r:.40}")
        points.append(BandwidthPoint(int(size), _number(row["pinned_gbps"], f"{where}.pinned_gbps", 1e-9, MAX_GBPS,
                                                        origin),
                                     _number(row["pageable_gbps"], f"{where}.pageable_gbps", 1e-9, MAX_GBPS, origin)))
    points.sort(key=lambda p: p.size_bytes)
    twice = next((a.size_bytes for a, b in zip(points, points[1:]) if a.size_bytes == b.size_bytes), None)
    if twice is not None:
        raise SpecterError(f"hardware profile {origin}: link.h2d_by_size gives {twice} bytes twice (a copy of that "
                           "size would be priced by whichever comes first); keep one point a size")
    if points:  # copies are priced from the points; the link's two figures are their largest size's, as measured
        largest = points[-1]
        for key, value in (("h2d_pinned_gbps", largest.pinned_gbps), ("h2d_pageable_gbps", largest.pageable_gbps)):
            if not math.isclose(values["link"][key], value, rel_tol=1e-3):
                raise SpecterError(
                    f"hardware profile {origin}: link.{key} is {values['link'][key]:g}, and its largest measured "
                    f"point (link.h2d_by_size, {points[-1].size_bytes} bytes) says {value:g}; copies are priced from "
                    f"the points, so edit the points (or remove h2d_by_size to price every copy at link.{key})")
    sources = data.get("sources") or {}
    if not isinstance(sources, dict):
        raise SpecterError(f"hardware profile {origin}: sources must map fields to where their numbers come from, got "
                           f"{sources!r:.80}")
    d, link, host = values["device"], values["link"], values["host"]
    for where, value in (("description", data.get("description", "")), *(
            (f"{part}.name", data[part].get("name", "")) for part in ("device", "link", "host"))):
        if not isinstance(value, str):
            raise SpecterError(f"hardware profile {origin}: {where} must be text, got {value!r:.60}; quote it or "
                               "write it on one line")
    empty = next((str(k) for k, v in sources.items() if not (isinstance(v, str) and v.strip())), None)
    if empty is not None:
        raise SpecterError(f"hardware profile {origin}: sources.{empty:.60} must say where its number comes from, "
                           f"got {sources[empty]!r:.60}; give the source as text, or leave the entry out")
    measured = data.get("measured", False)
    if not isinstance(measured, bool):
        raise SpecterError(f"hardware profile {origin}: measured must be true or false, got {measured!r:.40}")
    name = data.get("name")
    if name is not None and not (isinstance(name, str) and name.isascii() and name.isprintable() and name.strip()
                                 and not any(c in name for c in "|`")):
        raise SpecterError(f"hardware profile {origin}: name {name!r:.60} is not a name of printable ASCII letters, "
                           "digits and signs (tables and reports print it; a lookalike of a preset's would pass for "
                           "it); give it a plain name")
    synchronous = data["device"].get("synchronous", False)
    if not isinstance(synchronous, bool):
        raise SpecterError(f"hardware profile {origin}: device.synchronous must be true (the device is the host "
                           f"itself, as the CPU) or false, got {synchronous!r:.80}")
    return HardwareProfile(
        name=str(data.get("name") or Path(origin).stem),
        description=str(data.get("description", "")),
        device_name=str(data["device"].get("name", "")),
        device_peak_flops=d["peak_tflops"] * 1e12,
        device_memory_bandwidth=d["memory_bandwidth_gbps"] * 1e9,
        device_launch_overhead=d["launch_overhead_us"] * 1e-6,
        host_sync=d["host_sync_us"] * 1e-6,
        device_memory_bytes=int(d["memory_gb"] * 1e9),
        link_name=str(data["link"].get("name", "")),
        h2d_pinned_bandwidth=link["h2d_pinned_gbps"] * 1e9,
        h2d_pageable_bandwidth=link["h2d_pageable_gbps"] * 1e9,
        h2d_latency=link["latency_us"] * 1e-6,
        host_name=str(data["host"].get("name", "")),
        host_peak_flops=host["peak_tflops"] * 1e12,
        host_memory_bandwidth=host["memory_bandwidth_gbps"] * 1e9,
        host_launch_overhead=host["launch_overhead_us"] * 1e-6,
        host_dispatch=host["dispatch_us"] * 1e-6,
        host_policy=host["policy_us"] * 1e-6,
        device_synchronous=synchronous,
        h2d_by_size=tuple(points),
        measured=measured,
        sources={str(k): str(v) for k, v in sources.items()},
    )


def profile_summary(profile: HardwareProfile) -> str:
    return (f"{profile.name}: link {profile.h2d_pinned_bandwidth / 1e9:.2f} GB/s pinned, "
            f"{profile.h2d_pageable_bandwidth / 1e9:.2f} GB/s pageable, latency {profile.h2d_latency * 1e6:.1f} us; "
            f"device {profile.device_peak_flops / 1e12:.3f} TFLOP/s, {profile.device_memory_bandwidth / 1e9:.1f} GB/s; "
            f"host dispatch {profile.host_dispatch * 1e6:.1f} us an op, policy {profile.host_policy * 1e6:.1f} us a "
            "MoE layer")
