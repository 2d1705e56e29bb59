"""The calibration table (published figures beside the suite's), the peers' protocols it needs (quantized target
experts, arms that set a peer's machine and budget) and its reason column, on runs and on hand-made records."""

from __future__ import annotations

import pytest

from conftest import spec
from specter.errors import SpecterError
from specter.runs import execute, grid
from specter.runspec import Arm, Budget

ARCH = "mixtral"


def _spec(tiny_dirs, **settings):
    settings = {"system": "on-demand", **settings}
    return spec(model=tiny_dirs[ARCH], dataset="code", hardware="a100-40gb-pcie4", out="",
                num_prompts=1, prefix_tokens=8, max_new_tokens=6, resident_per_layer=1, **settings)


def test_quantized_target_experts_cross_the_link_at_their_hqq_bytes_with_the_same_tokens(tiny_dirs):
    from specter.offload.work import WEIGHT_BYTES
    from specter.timing.cost import hqq_expert_bytes

    fp16, = execute(_spec(tiny_dirs), progress=False)
    hqq, = execute(_spec(tiny_dirs, expert_bits=2), progress=False)
    storage = hqq.config["expert_storage"]
    assert fp16.config["expert_storage"] == {"bits": 16, "format": "fp16",
                                             "expert_bytes": fp16.h2d_bytes_demand // fp16.demand_misses}
    per_expert = hqq.h2d_bytes_demand // hqq.demand_misses
    params = fp16.h2d_bytes_demand // fp16.demand_misses // WEIGHT_BYTES
    assert storage["bits"] == 2 and storage["expert_bytes"] == per_expert < params  # under a byte a weight
    assert "numerics" in storage and "not those of quantized experts" in storage["numerics"]
    assert per_expert == hqq_expert_bytes(tuple(s for s in _shapes(tiny_dirs)), 2)
    assert hqq.output_token_ids == fp16.output_token_ids and hqq.demand_misses == fp16.demand_misses
    assert hqq.tpot_ms < fp16.tpot_ms


def _shapes(tiny_dirs):
    from specter.models.loading import load_moe_model
    from specter.offload.work import ModelWork

    return ModelWork.of(load_moe_model(tiny_dirs[ARCH])).expert_shapes


def test_expert_bits_are_checked_before_anything_loads(tiny_dirs):
    with pytest.raises(SpecterError, match="--expert-bits must be one of 16, 2, 3, 4"):
        _spec(tiny_dirs, expert_bits=8).validate()


def test_an_arm_sets_a_peer_s_machine_budget_and_expert_bits(tiny_dirs):
    arm = Arm.parse("mo-t4:hardware=t4-pcie3,resident-per-layer=2,expert_bits=2,depth=0")
    assert Arm.parse(arm.flag()) == arm
    specs = grid(_spec(tiny_dirs), {"system": ["on-demand", "mixtral-offloading"]}, arms=[arm, Arm.parse("main")])
    peer = [s for s in specs if s.arm == "mo-t4"]
    assert {s.hardware for s in peer} == {"t4-pcie3"} and {s.budget for s in peer} == {Budget("slots", 2)}
    assert {s.expert_bits for s in peer} == {2} and dict(peer[1].system_options) == {"depth": "0"}
    assert {(s.hardware, s.expert_bits) for s in specs if s.arm == "main"} == {("a100-40gb-pcie4", 16)}
    with pytest.raises(SpecterError, match="also varies"):
        grid(_spec(tiny_dirs, system="mixtral-offloading"), {"hardware": ["t4-pcie3", "a100-40gb-pcie4"]}, arms=[arm])
    with pytest.raises(SpecterError, match="twice"):
        Arm.parse("x:resident_per_layer=2,device_memory_gb=10")
