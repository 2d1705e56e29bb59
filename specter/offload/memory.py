"""The device memory plan of a run: the resident part first, the rest becomes expert slots per MoE layer.

Resident: the target's non-expert weights, the draft's quantized experts (speculative systems), the KV cache for the
longest sequence, and a workspace of `STAGING_BUFFERS` expert-sized buffers for experts that stream through without a
slot. A budget is `--device-memory-gb X`, `--resident-per-layer N` or `--resident-fraction F` (that share of each
layer's experts, rounded, at least one); a budget that cannot hold the resident part plus
one slot per layer is refused, naming both numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specter.errors import SpecterError
from specter.offload.work import ModelWork
from specter.runspec import Budget

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

    def as_dict(self) -> dict:
        return asdict(self)


def plan_memory(work: ModelWork, max_tokens: int, draft_bytes: int, budget: Budget, kv_copies: int = 1) -> MemoryPlan:
    """The resident part (weights, draft, KV for `max_tokens` positions, workspace) and the slots `budget` leaves."""
    budget.check()
    kv = kv_copies * work.kv_bytes(max_tokens)  # a draft with its own KV doubles it
    workspace = STAGING_BUFFERS * work.expert_bytes
    resident = work.non_expert_bytes() + draft_bytes + kv + workspace
    per_slot_row = len(work.moe_layers) * work.expert_bytes  # one slot in every MoE layer
    if budget.kind == "gb":
        budget_bytes = int(budget.value * 1e9)
        slots = min(work.experts_per_layer, (budget_bytes - resident) // per_slot_row) if budget_bytes > resident else 0
        if slots < 1:
            raise SpecterError(
                f"--device-memory-gb {budget.value} ({budget_bytes} bytes) cannot hold the resident part "
                f"({resident} bytes: weights {work.non_expert_bytes()}, draft {draft_bytes}, KV {kv}, workspace "
                f"{workspace}) plus one expert slot per layer ({per_slot_row} bytes); give at least "
                f"{(resident + per_slot_row) / 1e9:.9g}"
            )
        return MemoryPlan(slots, resident, work.non_expert_bytes(), draft_bytes, kv, workspace, slots * per_slot_row,
                          budget_bytes)
    if budget.kind == "fraction":
        slots = max(1, round(budget.value * work.experts_per_layer))
    else:
        slots = int(budget.value)
        if not 1 <= slots <= work.experts_per_layer:
            raise SpecterError(f"--resident-per-layer {slots} must be between 1 and {work.experts_per_layer} "
                               "(the experts per layer)")
    return MemoryPlan(slots, resident, work.non_expert_bytes(), draft_bytes, kv, workspace, slots * per_slot_row, None)
