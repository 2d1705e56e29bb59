"""A run's checks before any weight loads: its spec's data (`RunSpec.check_numbers`, `check_names`, `check_files`)
and what needs the registry, a hardware profile or the model's config. `resolve` is the one place a run's settings
are checked, once a spec: `execute`, `sweep` and `compare` call it for every spec before anything runs, and keep what
it found (`Resolved`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from specter.errors import SpecterError
from specter.runspec import RunSpec, check_positions

if TYPE_CHECKING:
    from specter.systems import System
    from specter.timing.hardware import HardwareProfile


def with_dtype(spec: RunSpec) -> RunSpec:
    """`spec` with its numerics' dtype resolved where it gives none: the checkpoint's own (config.json's `dtype`, or
    `torch_dtype`) for a live run, which measures the model as its users run it (Mixtral in bfloat16 fits where in
    float32 it does not); float32 for a simulation, whose recorded numerics every committed result used."""
    if spec.dtype is not None:
        return spec
    from specter.models.loading import read_model_config
    from specter.runspec import DTYPES

    dtype = "float32"
    if spec.engine == "live":
        config = read_model_config(spec.model)
        own = config.get("dtype") or config.get("torch_dtype")
        dtype = own if own in DTYPES else "float32"
    return replace(spec, dtype=dtype)


@dataclass(frozen=True)
class Resolved:
    """A run's specification once checked, with what its checks found: the spec with its dtype resolved
    (`with_dtype`), its system (options applied) and its hardware profile (at `--dispatch-us` where given)."""

    spec: RunSpec
    system: System
    profile: HardwareProfile


def resolve(spec: RunSpec, structures: dict | None = None) -> Resolved:
    """Every check of `spec` that needs no model weights, made once; what they found (`Resolved`), which `prepare`
    takes without checking again.

    `structures` (a session's) keeps the structures that `--cost-as` compares, by the architecture's config and the
    model's: both come from meta-device models (about 0.25 s a spec)."""
    from specter.models.loading import read_model_config
    from specter.systems import get_system
    from specter.timing import load_profile

    spec = with_dtype(spec)
    spec.check_numbers()
    system = get_system(spec.system, dict(spec.system_options))
    spec.check_names()
    if spec.engine == "live":
        _check_live(spec, system)
    profile = load_profile(spec.hardware)
    if spec.dispatch_us is not None:
        profile = replace(profile, host_dispatch=spec.dispatch_us * 1e-6)
    check_positions(read_model_config(spec.model), {"--prefix-tokens": spec.prefix_tokens,
                                                    "--max-new-tokens": spec.max_new_tokens,
                                                    "a window of": spec.k.longest})
    if spec.cost_as is not None:
        _check_cost_as(spec, {} if structures is None else structures)
    if system.speculative and spec.draft is None:
        raise SpecterError(f"system {spec.system!r} speculates: pass --draft DIR (make one with "
                           "`specter quantize`)")
    if system.speculative and system.takes_window:
        spec.k.check(spec.system)
    spec.check_files()
    return Resolved(spec, system, profile)


def _check_live(spec: RunSpec, system) -> None:
    """What the live engine cannot run, refused before anything loads."""
    if spec.live_device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SpecterError("--device cuda: torch sees no CUDA device on this machine; use --device cpu (the CPU "
                               "as device) or run on a machine with a GPU")
    if spec.pricing == "upstream":
        raise SpecterError("--pricing upstream prices each system as its upstream code runs; the live engine runs "
                           "the suite's own code, so its twin is priced counted (the default) or fused: drop "
                           "--pricing upstream, or use --engine sim")
    if spec.expert_bits != 16:
        raise SpecterError(f"--expert-bits {spec.expert_bits} prices quantized experts; the live engine copies and "
                           "computes this model's own experts, so use --engine sim (or drop --expert-bits)")
    if spec.temperature > 0:
        raise SpecterError(f"--engine live decodes greedily; --temperature {spec.temperature} samples: use "
                           "--engine sim or --temperature 0")
    reason = system.cannot_run_live()
    if reason:
        raise SpecterError(f"--engine live cannot run {spec.system}: {reason}; use --engine sim")


def _check_cost_as(spec: RunSpec, structures: dict) -> None:
    """`--cost-as` names an architecture that routes as the model does (experts per layer, top-k), on the simulator."""
    from specter.models.architectures import check_structure, load_architecture
    from specter.models.loading import describe_model

    if spec.engine == "live":
        raise SpecterError(f"--cost-as {spec.cost_as} prices ops at another model's shapes; --engine {spec.engine} "
                           "runs this model's own kernels, so use --engine sim (or drop --cost-as)")
    arch = load_architecture(spec.cost_as)
    config = Path(spec.model) / "config.json"
    key = (json.dumps(arch.config, sort_keys=True), str(spec.model), config.read_text() if config.is_file() else None)
    if key not in structures:
        arch_moe = arch.meta_model().moe_layers[0]
        proxy = describe_model(spec.model)
        structures[key] = (arch_moe.num_experts, arch_moe.top_k, proxy.experts_per_layer, proxy.top_k)
    check_structure(arch, *structures[key], Path(spec.model).name)
