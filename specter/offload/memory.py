"""The device memory plan of a run: the resident part first, the rest becomes expert slots per MoE layer.

Resident, in this order (the paper's count): the target's non-expert weights (FP16), the draft's quantized experts
(systems that keep a draft), the KV cache for the longest sequence (twice for a draft with its own KV), and a workspace
of `STAGING_BUFFERS` expert-sized buffers for experts that stream through without a slot. What remains becomes expert
slots. A budget is one of:
- `--device-memory-gb X`: X GB of device memory for everything above;
- `--same-memory-as S`: the device memory Specter needs with S slots per layer (its self-draft's experts charged, KV
  for its window), given to every system: a system without a draft turns the draft's share into more slots, one with
  its own draft and KV into fewer (the paper's "same memory" comparison, MO-SM);
- `--resident-per-layer N`: N slots per layer for every system whatever else it keeps (the paper's "same cache",
  MO-SC), or `--resident-fraction F`: that share of each layer's experts (rounded, at least one).
A GB budget that cannot hold the resident part plus one slot per layer, or exceeds the device's memory, is refused,
naming both numbers; every plan records whether it fits the device.
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

from specter.errors import BudgetError, SpecterError
from specter.offload.work import ModelWork

STAGING_BUFFERS = 4  # as Mixtral-Offloading's shared device buffers


@dataclass(frozen=True)
class MemoryPlan:
    slots_per_layer: int
    resident_bytes: int
    non_expert_bytes: int
    draft_bytes: int
    kv_bytes: int
    workspace_bytes: int
    expert_slot_bytes: int  # slots_per_layer x MoE layers x expert bytes
    budget_bytes: int | None  # None when the budget was given as slots
    budget_kind: str = "slots"
    device_bytes: int | None = None  # the hardware profile's device memory
    fits_device: bool | None = None  # the resident part and the slots fit in it
    moe_layers: int | None = None  # the MoE layers the slots are kept in (expert_slot_bytes' factor)
    #: the experts a system placing whole layers keeps on the device (its layers' own slots, `System.layer_slots`),
    #: within `expert_slot_bytes`; None: it fills every slot
    placed_slot_bytes: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def specter_resident_bytes(work: ModelWork, draft_expert_bytes: int, positions: int) -> int:
    """What Specter keeps on the device besides its expert slots: the target's non-expert weights, its self-draft's
    quantized experts (`draft_expert_bytes` each), KV for `positions`, the workspace (the reference of a
    `--same-memory-as` budget)."""
    return (work.non_expert_bytes() + draft_expert_bytes * len(work.moe_layers) * work.experts_per_layer
            + work.kv_bytes(positions) + STAGING_BUFFERS * work.expert_bytes)


def slot_row_bytes(work: ModelWork) -> int:
    """One expert slot in every MoE layer."""
    return len(work.moe_layers) * work.expert_bytes


#: the budget kinds: GB of device memory, Specter's memory at N slots, N slots, a share of each layer's experts
BUDGET_KINDS = ("gb", "same_memory", "slots", "fraction")


def plan_memory(work: ModelWork, max_tokens: int, draft_bytes: int, budget_kind: str, budget_value: float,
                kv_copies: int = 1, device_bytes: int | None = None, reference_bytes: int | None = None) -> MemoryPlan:
    """The resident part (weights, draft, KV for `max_tokens` positions, workspace) and the slots a budget leaves: of
    `budget_kind` (one of BUDGET_KINDS; the caller checked its value), `budget_value` GB, slots or share.
    `reference_bytes`: Specter's resident part, for a `same_memory` budget."""
    if budget_kind not in BUDGET_KINDS:
        raise SpecterError(f"budget kind {budget_kind!r} is not one of {', '.join(BUDGET_KINDS)}")
    kv = kv_copies * work.kv_bytes(max_tokens)  # a draft with its own KV doubles it
    workspace = STAGING_BUFFERS * work.expert_bytes
    resident = work.non_expert_bytes() + draft_bytes + kv + workspace
    per_slot_row = slot_row_bytes(work)
    plan = dict(resident_bytes=resident, non_expert_bytes=work.non_expert_bytes(), draft_bytes=draft_bytes,
                kv_bytes=kv, workspace_bytes=workspace, budget_kind=budget_kind, device_bytes=device_bytes,
                moe_layers=len(work.moe_layers))
    if budget_kind in ("gb", "same_memory"):
        if budget_kind == "gb":
            flag = f"--device-memory-gb {budget_value}"
            if budget_value * 1e9 > (device_bytes if device_bytes is not None else sys.float_info.max):
                raise SpecterError(f"{flag} is more than the device's "
                                   f"{'memory' if device_bytes is None else f'{device_bytes / 1e9:g} GB'}; give a "
                                   "smaller budget or a profile with more device memory")
            budget_bytes = int(budget_value * 1e9)  # finite: the check above keeps an infinity from int()
        else:
            if not 1 <= budget_value <= work.experts_per_layer:  # Specter's memory at slots it could not have
                raise SpecterError(f"--same-memory-as {budget_value:g} must be between 1 and {work.experts_per_layer} "
                                   "(the experts per layer: Specter's slots at that memory)")
            budget_bytes = reference_bytes + int(budget_value) * per_slot_row
            flag = f"--same-memory-as {int(budget_value)} (Specter's memory at {int(budget_value)} slots per layer)"
        if device_bytes is not None and budget_bytes > device_bytes:
            raise SpecterError(f"{flag} is {budget_bytes / 1e9:.9g} GB, more than the device's {device_bytes / 1e9:g} "
                               "GB; give a smaller budget or a profile with more device memory")
        slots = min(work.experts_per_layer, (budget_bytes - resident) // per_slot_row) if budget_bytes > resident else 0
        if slots < 1:
            raise BudgetError(
                f"{flag} ({budget_bytes} bytes) cannot hold the resident part ({resident} bytes: weights "
                f"{work.non_expert_bytes()}, draft {draft_bytes}, KV {kv}, workspace {workspace}) plus one expert slot "
                f"per layer ({per_slot_row} bytes); give at least {(resident + per_slot_row) / 1e9:.9g} GB"
            )
    else:
        budget_bytes = None
        if budget_kind == "fraction":
            slots = max(1, round(budget_value * work.experts_per_layer))
        else:
            slots = int(budget_value)
            if not 1 <= slots <= work.experts_per_layer:
                raise SpecterError(f"--resident-per-layer {slots} must be between 1 and {work.experts_per_layer} "
                                   "(the experts per layer)")
    fits = None if device_bytes is None else resident + slots * per_slot_row <= device_bytes
    if fits is False:  # a slot budget is taken as given: the run goes on, its record says `fits_device: false`
        from specter.progress import log

        log.warning("the memory plan (%d slots a layer: %.2f GB) does not fit the device's %.2f GB; the run goes on "
                    "as if it did, and its records say fits_device: false", slots,
                    (resident + slots * per_slot_row) / 1e9, device_bytes / 1e9)
    return MemoryPlan(slots_per_layer=slots, expert_slot_bytes=slots * per_slot_row, budget_bytes=budget_bytes,
                      fits_device=fits, **plan)


@dataclass(frozen=True)
class Fit:
    """Whether a model runs on a device, for one kind of system: the slots per MoE layer its memory plan leaves when
    the whole device is the budget (0: the resident part and one slot per layer do not fit), and the resident part."""

    system: str  # "on-demand" (no draft: every byte not resident is slots) or "specter" (its INT4 draft resident)
    slots_per_layer: int
    experts_per_layer: int
    resident_bytes: int
    device_bytes: int


def device_fits(work: ModelWork, device_bytes: int, positions: int, draft_expert_bytes: int) -> list[Fit]:
    """`plan_memory` with the device's whole memory as the budget (`--device-memory-gb` at the device's size), for a
    system without a draft and for Specter with its draft's experts (`draft_expert_bytes` each) resident, over KV for
    `positions` positions."""
    fits = []
    for system, draft in (("on-demand", 0),
                          ("specter", draft_expert_bytes * len(work.moe_layers) * work.experts_per_layer)):
        try:
            plan = plan_memory(work, positions, draft, "gb", device_bytes / 1e9, device_bytes=device_bytes)
            slots, resident = plan.slots_per_layer, plan.resident_bytes
        except BudgetError:
            slots = 0
            resident = (work.non_expert_bytes() + draft + work.kv_bytes(positions)
                        + STAGING_BUFFERS * work.expert_bytes)
        fits.append(Fit(system, slots, work.experts_per_layer, resident, device_bytes))
    return fits
