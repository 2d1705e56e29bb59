"""The adapter recomposes every supported class's MoE block exactly from routing plus per-expert compute."""

from __future__ import annotations

import pytest
import torch

from conftest import ARCHS
from specter.errors import SpecterError
from specter.models import load_moe_model
from specter.models.adapter import ARCHITECTURES, arch_spec
from specter.models.tiny import build_tiny_model

TOL = 1e-5


def _hidden(moe, n_tokens=13, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_tokens, moe.config.hidden_size, generator=g)  # [T, H]


def _block_out(layer, x):
    out = layer.block(x[None])  # the model's own block on [1, T, H]
    out = out[0] if isinstance(out, tuple) else out  # GPT-OSS returns (hidden, router scores)
    return out.reshape(x.shape)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_supported_class_has_a_tiny_model(arch):
    assert arch in ARCHITECTURES


@pytest.mark.parametrize("arch", ARCHS)
def test_recomposed_block_equals_model_block(arch, tiny_dirs):
    moe = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
    assert moe.moe_layers, "no MoE layers found"
    for layer in moe.moe_layers:
        x = _hidden(moe, seed=layer.layer_index)
        diff = (layer.compose(x) - _block_out(layer, x)).abs().max().item()
        assert diff <= TOL, f"{arch} layer {layer.layer_index}: max abs diff {diff}"


@pytest.mark.parametrize("arch", ARCHS)
def test_routing_matches_router_hook(arch, tiny_dirs):
    """The adapter's routing is what the router returns inside the model's forward (hooked), not a recomputation."""
    moe = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
    ids = torch.tensor([[3, 17, 42, 99, 7, 250]])
    with moe.record_routing() as log:
        moe.model(ids)
    for layer in moe.moe_layers:
        (recorded,) = log[layer.layer_index]
        assert recorded.shape == (ids.shape[1], layer.top_k)
        assert int(recorded.max()) < layer.num_experts


@pytest.mark.parametrize("arch", ARCHS)
def test_per_expert_storage_recomposes_too(arch):
    """GPTQModel quantizes per-expert linears (its defuser splits fused experts); the adapter reads that layout too."""
    defuser = pytest.importorskip("defuser")
    fused = build_tiny_model(arch, seed=3)
    split = build_tiny_model(arch, seed=3)
    assert defuser.convert_model(split)
    from specter.models import MoEModel

    a, b = MoEModel(fused), MoEModel(split)
    for la, lb in zip(a.moe_layers, b.moe_layers):
        assert la.fused and not lb.fused
        x = _hidden(a, seed=la.layer_index)
        for e in (0, la.num_experts - 1):
            wa, wb = la.expert_weights(e), lb.expert_weights(e)
            for name, t in wa.tensors().items():
                assert torch.equal(t, wb.tensors()[name]), f"{arch} expert {e} {name}"
            torch.testing.assert_close(lb.expert_forward(e, x), la.expert_forward(e, x), atol=TOL, rtol=0)
        diff = (lb.compose(x) - _block_out(la, x)).abs().max().item()
        assert diff <= TOL


@pytest.mark.parametrize("arch", ARCHS)
def test_expert_bytes_match_parameter_counts(arch):
    model = build_tiny_model(arch)
    from specter.models import MoEModel

    moe = MoEModel(model)
    routed = sum(p.numel() for layer in moe.moe_layers for p in layer.experts.parameters())
    per_expert = moe.moe_layers[0].expert_params()
    assert routed == per_expert * sum(layer.num_experts for layer in moe.moe_layers)
    assert moe.routed_expert_bytes() == routed * 4
    total = sum(p.numel() * 4 for p in model.parameters()) + sum(b.numel() * b.element_size() for b in model.buffers())
    assert moe.routed_expert_bytes() + moe.non_expert_bytes() == total
    assert moe.moe_layers[0].expert_bytes(torch.float16) == per_expert * 2


def test_dense_first_layer_is_not_moe():
    from specter.models import MoEModel

    moe = MoEModel(build_tiny_model("deepseek_v3"))
    assert [m.layer_index for m in moe.moe_layers] == [1, 2]


def test_unknown_architecture_names_supported_list():
    with pytest.raises(SpecterError, match="supported: deepseek_v2, deepseek_v3"):
        arch_spec("switch_transformers")


@pytest.mark.parametrize("arch", ARCHS)
def test_defused_projections_match_defuser(arch):
    """Our reading of fused experts in GPTQModel's per-expert convention equals what its defuser produces."""
    defuser = pytest.importorskip("defuser")
    from specter.models import MoEModel

    a = MoEModel(build_tiny_model(arch, seed=5))
    split = build_tiny_model(arch, seed=5)
    assert defuser.convert_model(split)
    b = MoEModel(split)
    for la, lb in zip(a.moe_layers, b.moe_layers):
        for e in (0, la.num_experts - 1):
            pa, pb = la.defused_projections(e), lb.defused_projections(e)
            for proj in pa:
                assert torch.equal(pa[proj][0], pb[proj][0]), (arch, e, proj)
                assert (pa[proj][1] is None) == (pb[proj][1] is None)
                if pa[proj][1] is not None:
                    assert torch.equal(pa[proj][1], pb[proj][1])
