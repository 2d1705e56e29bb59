"""The CUDA engine's part of a run: the device runtime sized for the run, and each prompt timed on it.

Per prompt the schedule runs once simulated (recording every numeric), once untimed on the device for the first prompt
(warm-up: kernels, allocator, lazily sized buffers), then timed; the timed run must compute no numerics and commit the
recorded tokens. Records then say measured, with the simulated TPOT beside.
"""

from __future__ import annotations

import torch

from specter import timing
from specter.metrics import tpot_seconds
from specter.offload.device import DRAFT_KERNEL
from specter.systems import schedule

CUDA_DEVICE = "cuda"  # where `--engine cuda` puts its buffers (tests point it at the CPU)


def runtime(p, session):
    """The run's device buffers and kernels, sized for its longest pass and context."""
    from specter.offload.device import DeviceRuntime

    store = session.expert_store(p.spec.model, p.target, pin=torch.device(CUDA_DEVICE).type == "cuda")
    window = p.config.k or 0
    max_tokens = max([window + 1] + [len(prompt) for prompt in p.prompts])
    return DeviceRuntime(p.target, p.work, store, p.slots, CUDA_DEVICE, max_tokens=max_tokens,
                         max_context=max(len(prompt) for prompt in p.prompts) + p.spec.max_new_tokens + window + 1,
                         draft=p.draft, seed=p.spec.seed)


def measured_fields(p) -> dict:
    """The run's shared record fields, as measured on this device."""
    name = torch.cuda.get_device_name(p.device.device)
    return {**p.common, "hardware": name, "config": {
        **p.common["config"], "device": {"name": name, "store_pinned": p.device.store.pinned,
                                         "draft_kernel": DRAFT_KERNEL if p.draft else None,
                                         "measured_on": f"measured on {name}: the model's kernels at its shapes on "
                                                        "a fixed input, the recorded tokens and routes"}}}


def timed(p, index: int, trace, config, simulated, warm_up: bool):
    """The prompt's schedule timed on the device from an empty cache (every prompt and repeat starts from the same
    state, as the artifact restores it): (result, timeline, the record's measured extras). `warm_up`: run it once
    untimed first (kernels, allocator, lazily sized buffers)."""
    if warm_up:
        schedule(p.system, timing.make_engine("cuda", p.profile), p.work, p.service, trace, config, p.cost, p.warmup,
                 p.device, p.online)
    before = p.service.forward_calls
    result, timeline = schedule(p.system, timing.make_engine("cuda", p.profile), p.work, p.service, trace, config,
                                p.cost, p.warmup, p.device, p.online)
    if p.service.forward_calls != before or result.tokens != simulated.tokens:
        raise RuntimeError(f"{p.spec.system} prompt {index}: the timed CUDA run computed numerics or committed other "
                           "tokens than its recorded run; please report this")
    measured = {"simulated_tpot_ms": tpot_seconds(simulated.commit_times) * 1e3, "simulated_on": p.profile.name}
    return result, timeline, measured
