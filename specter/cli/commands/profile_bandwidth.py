"""`specter profile-bandwidth`: measure this machine and write a hardware profile YAML."""

from __future__ import annotations

import argparse

from specter.cli.arguments import _count, _out, _threads, set_threads
from specter.errors import SpecterError

NAME = "profile-bandwidth"
HELP = "measure this machine and write a hardware profile YAML"
EXAMPLE = "specter profile-bandwidth --out /tmp/bandwidth --max-bytes 268435456"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="DIR", type=_out(directory=True),
                   help="directory for bandwidth.csv and profile.yaml")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="default: cuda if available")
    p.add_argument("--max-bytes", type=_count(4096, 1 << 36), default=1 << 30,
                   help="largest transfer size (default 1 GiB)")
    p.add_argument("--repeats", type=_count(10, 100_000), default=10,
                   help="timed repeats per size, median taken (>= 10)")
    p.add_argument("--name", default=None, help="profile name (default: measured-<device>)")
    p.add_argument("--dispatch-model", default=None, metavar="DIR",
                   help="time the host's dispatch per kernel on two decoder layers of this checkpoint's class and "
                        "widths (its config alone; default: the default proxy's), the model a live run decodes")
    _threads(p)


def main(args: argparse.Namespace) -> int:
    from specter.offload.policy import policy_seconds
    from specter.timing.hardware import load_profile, preset_names, profile_summary
    from specter.timing.profiler import default_sizes, profile_bandwidth

    set_threads(args)  # the CPU's figures (its matmul, its copies) are those of the threads the runs will use
    name = args.name
    if name is not None and not (name.isascii() and name.isprintable() and name.strip() and not set(name) & set("|`")):
        raise SpecterError(f"--name {name!r:.60} is not a name of printable ASCII letters, digits and signs (tables "
                           "and reports print it); give a plain name")
    like = next((n for n in preset_names() if name is not None and n.lower() == name.strip().lower()), None)
    if like is not None:  # checked before minutes of measuring, not by the profile's reader after them
        raise SpecterError(f"--name {name!r} is the preset {like!r}'s name, and a measured profile has its own: its "
                           f"records would pass for the preset's; give another (e.g. --name {like}-measured)")
    if args.dispatch_model is not None:
        from specter.models.loading import read_model_config

        read_model_config(args.dispatch_model)  # a checkpoint's config, or one line saying what is wrong
    csv_path, yaml_path = profile_bandwidth(
        args.out, device=args.device, sizes=default_sizes(args.max_bytes), repeats=args.repeats, name=args.name,
        policy=lambda repeats, warmup: policy_seconds(repeats, warmup), dispatch_model=args.dispatch_model,
    )
    print(profile_summary(load_profile(yaml_path)))
    print(f"wrote {csv_path} and {yaml_path} (pass it as --hardware {yaml_path})")
    return 0
