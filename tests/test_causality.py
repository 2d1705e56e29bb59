"""Causality: no prefetch copy starts before the compute whose routing chose it has finished and the host has read it.

Every system of the registry runs (with its defaults, and with each option that is off by default turned on, which is
how a prefetch that is an option gets covered), so a newly registered system is held to it too. For every copy on
the link labelled a prefetch, the executor's `prefetch_log` must name the forecast it was chosen from; that forecast's
compute must be on the timeline and have finished by the forecast's event; and the copy must start no earlier than
that event plus the profile's host synchronization (the host's read of the routing).
"""

from __future__ import annotations

import pytest
import torch

from specter.models import load_moe_model
from specter.numerics.forward import ForwardService
from specter.offload.work import ModelWork
from specter.quant.draft import load_draft
from specter.quant.quantize import quantize_draft
from specter.runs import schedule
from specter.systems import DecodeConfig, registry
from specter.timing import SimEngine, load_profile
from specter.timing.cost import CostModel
from specter.timing.engine import COMPUTE, H2D

ARCH = "mixtral"  # 8 experts, top-2: with 2 slots a layer, prefetches have room to matter
NEW, K, SLOTS = 24, 4, 2


@pytest.fixture(scope="module")
def setup(tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("causality")
    quantize_draft(tiny_dirs[ARCH], root / ARCH, method="rtn", bits=4, group_size=32)
    target = load_moe_model(tiny_dirs[ARCH], dtype=torch.float32)
    draft = load_draft(target, root / ARCH)
    service = ForwardService(target)
    service.draft, service.draft_key = draft.moe, ARCH
    service.require(r for cls in registry().values() for r in cls.trace_recorders)
    vocab = target.config.vocab_size
    trace = service.trace([(7 * i + 3) % vocab for i in range(12)], NEW)
    warm = [service.trace([(5 * i + 1) % vocab for i in range(12)], NEW)]
    return target, draft, service, trace, warm


def _variants():
    """(system name, options): each system's defaults, and each of its options that is off by default turned on."""
    out = []
    for name, cls in sorted(registry().items()):
        out.append((name, {}))
        for key, (kind, default, *_rest) in cls.options.items():
            if kind is bool and default is False:
                out.append((name, {key: "true"}))
            elif kind is int and default == 0:
                out.append((name, {key: "1"}))
    return out


def _schedule(setup, name, options):
    target, draft, service, trace, warm = setup
    work = ModelWork.of(target)
    profile = load_profile("a100-40gb-pcie4")
    system = registry()[name](**options)
    slots = system.fixed_slots(work) if system.fixed_slots else SLOTS
    cfg = DecodeConfig(NEW, slots, K, "adaptive", draft.quantized_bytes_per_expert)
    result, timeline = schedule(system, SimEngine(profile), work, service, trace, cfg, CostModel(profile),
                                lambda: warm)
    return result, timeline, profile


def _check(result, timeline, profile, what: str) -> int:
    """Assert causality for every prefetch copy of one run; returns how many were checked."""
    log = dict(result.executor.prefetch_log)
    copies = [s for s in timeline.spans if s.stream == H2D and ".prefetch." in s.label]
    compute = {}
    for s in timeline.spans:
        if s.stream == COMPUTE:
            compute.setdefault(s.label, []).append(s)
    for copy in copies:
        assert copy.label in log, f"{what}: prefetch copy {copy.label} was issued outside Executor.prefetch"
        forecast = log[copy.label]
        ready = forecast.event.time
        sources = [s for s in compute.get(forecast.source, []) if s.end <= ready]
        assert sources, f"{what}: {copy.label}'s forecast {forecast.source} finished by {ready} is not on the timeline"
        assert copy.start >= ready + profile.host_sync - 1e-12, (
            f"{what}: {copy.label} starts at {copy.start}, before its forecast {forecast.source} ended ({ready}) "
            f"and the host read it ({profile.host_sync} s)")
    return len(copies)


def test_no_prefetch_copy_starts_before_its_forecast(setup):
    prefetching = set()
    for name, options in _variants():
        result, timeline, profile = _schedule(setup, name, options)
        if _check(result, timeline, profile, f"{name} {options}"):
            prefetching.add(name)
    # the systems whose mechanism is a prefetch did prefetch here, so the check above was not vacuous for them
    assert {"specter", "sp-moe", "specmoeoff", "mixtral-offloading", "moe-infinity"} <= prefetching, prefetching


def test_sp_moe_prefetches_a_layer_once_the_draft_routed_it(setup):
    """SP-MoE's prefetch of layer l in a draft step reads that step's layer-l router: its copy starts after that
    router's block has finished and the host has read it (not when the block's kernels were launched)."""
    result, timeline, profile = _schedule(setup, "sp-moe", {"cutoff": "100"})
    assert _check(result, timeline, profile, "sp-moe") > 0
    for label, forecast in result.executor.prefetch_log:
        layer = label.split(".")[0]  # "L{layer}"
        assert ".draft" in forecast.source and forecast.source.endswith(f".{layer}.attn"), (label, forecast.source)
