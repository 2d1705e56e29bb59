"""The live draft's fused INT4 kernels (`specter.quant.kernels`): on the CPU, GPTQModel's `TorchFusedLinear` computes
the same outputs from the same draft, bit for bit (in a child process: importing GPTQModel patches transformers); the
products equal the dequantized weights' to bfloat16's rounding; the GPU kernel's packing holds the same codes (its
kernel itself runs in the `gpu` tests); what a kernel cannot compute is said, not guessed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from specter.quant.kernels import FusedInt4Linear, fused_unsupported
from specter.quant.packing import dequantize, pack
from specter.quant.quantize import rtn_quantize

SHAPES = [(256, 128, 32), (192, 256, 64), (128, 256, 128)]  # [out, in], group


def _packed(out_f, in_f, group, seed=0):
    torch.manual_seed(seed)
    return rtn_quantize(torch.randn(out_f, in_f) * 0.05, 4, group)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_fused_kernel_computes_the_drafts_weights_to_bfloat16s_rounding(shape):
    p = _packed(*shape)
    kernel = FusedInt4Linear(p, None, p.nbytes())
    x = torch.randn(5, shape[1])
    with torch.no_grad():
        got = kernel(x)
    want = x.to(torch.bfloat16).float() @ dequantize(p, torch.float32).T
    assert got.dtype == torch.float32 and got.shape == (5, shape[0])
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def test_what_the_fused_kernel_cannot_compute_is_said():
    cpu = torch.device("cpu")
    assert fused_unsupported(_packed(64, 128, 32), cpu) is None
    assert "no fused INT4 kernel is wired on meta" in fused_unsupported(_packed(64, 128, 32), torch.device("meta"))
    assert "3-bit codes" in fused_unsupported(rtn_quantize(torch.randn(64, 128), 3, 32), cpu)
    assert "groups of 16 inputs" in fused_unsupported(_packed(64, 128, 16), cpu)
    codes = torch.randint(0, 16, (64, 128))
    asymmetric = pack(codes, torch.full((64, 4), 3), torch.rand(64, 4) + 0.1, 32, 4)
    assert "zero points other than GPTQ's symmetric 8" in fused_unsupported(asymmetric, cpu)
    with pytest.raises(ValueError, match="3-bit codes"):
        FusedInt4Linear(rtn_quantize(torch.randn(64, 128), 3, 32), None, 0)


GPTQMODEL = textwrap.dedent("""
    import json, os, sys
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    import torch
    from gptqmodel.nn_modules.qlinear.torch_fused import TorchFusedLinear
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module

    parts = torch.load(sys.argv[1])
    outs = []
    for p, x in zip(parts["packed"], parts["inputs"]):
        in_f, out_f = p["g_idx"].numel(), p["scales"].shape[1]
        m = TorchFusedLinear(bits=4, group_size=in_f // p["scales"].shape[0], sym=True, desc_act=False,
                             in_features=in_f, out_features=out_f, bias=False)
        for name in ("qweight", "qzeros", "scales", "g_idx"):
            getattr(m, name).copy_(p[name])
        convert_gptq_v1_to_v2_format_module(m, bits=4, pack_dtype=torch.int32)
        m.post_init()
        m.eval()
        with torch.no_grad():
            outs.append(m(x))
    torch.save(outs, sys.argv[2])
    print(json.dumps({"ran": len(outs)}))
""")


def test_gptqmodels_torch_fused_linear_computes_the_same_outputs(tmp_path):
    """GPTQModel's own CPU kernel module, fed the draft's v1 tensors as GPTQModel converts them, gives the outputs
    this module gives, bit for bit, on float32 inputs."""
    packed = [_packed(*shape, seed=i) for i, shape in enumerate(SHAPES)]
    inputs = [torch.randn(3, shape[1]) for shape in SHAPES]
    torch.save({"packed": [p.tensors() for p in packed], "inputs": inputs}, tmp_path / "in.pt")
    out = subprocess.run([sys.executable, "-c", GPTQMODEL, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"ran": len(SHAPES)}
    theirs = torch.load(tmp_path / "out.pt")
    for p, x, y in zip(packed, inputs, theirs):
        with torch.no_grad():
            assert torch.equal(FusedInt4Linear(p, None, p.nbytes())(x), y)


@pytest.mark.parametrize(("bits", "kernel"), [(4, "fused INT4"), (3, "dequantized on every call")])
def test_a_live_draft_runs_on_the_kernel_its_records_name_and_the_target_keeps_its_tokens(bits, kernel, tiny_dirs,
                                                                                       tmp_path):
    """`--live-draft-kernel fused` (the default): a 4-bit draft's experts run on the fused kernel, a 3-bit draft's on
    its codes dequantized per call, and the record says which and why; the live tokens are the target's own either
    way, and the simulator's draft keeps its modules."""
    from conftest import spec
    from specter.quant.draft import PackedQuantLinear
    from specter.quant.quantize import quantize_draft
    from specter.runs import live
    from specter.runs.execute import execute, prepare
    from specter.session import Session

    quantize_draft(tiny_dirs["mixtral"], tmp_path / "draft", method="rtn", bits=bits, group_size=32)
    request = dict(system="specter", model=tiny_dirs["mixtral"], draft=str(tmp_path / "draft"), dataset="code",
                   hardware="a100-40gb-pcie4", out=str(tmp_path / "x.jsonl"), num_prompts=1, prefix_tokens=16,
                   max_new_tokens=8, resident_per_layer=2, k=3, warmup_prompts=0, engine="live")
    session = Session()
    records = execute(spec(**request), session, progress=False)
    device = records[0].config["device"]
    assert kernel in device["draft_kernel"] and (bits == 4 or "3-bit codes" in device["draft_kernel"])
    simulated = execute(spec(**{**request, "engine": "sim"}), Session(), progress=False)
    assert records[0].output_token_ids == simulated[0].output_token_ids  # the target's own tokens
    p = prepare(spec(**request), session)
    assert all(isinstance(m, PackedQuantLinear) for m in p.draft.moe.moe_layers[0].experts[0].children())
    runtime = live.runtime(p, session)
    inner = runtime.draft_model.get_submodule(
        "model.layers.0.mlp.experts").inner[0].gate_proj  # the live draft's own module
    assert type(inner).__name__ == ("FusedInt4Linear" if bits == 4 else "PackedQuantLinear")


def test_the_gpu_kernels_nibbles_hold_the_codes_the_cpu_kernel_computes_with():
    """The GPU's tinygemm layout starts from the codes two to a byte, the even input in the high nibble; unpacked, they
    are the codes the CPU's kernel reads, so on the CPU they compute its outputs bit for bit, with the same scales."""
    from specter.quant.kernels import codes_of_nibbles, nibbles

    assert nibbles(torch.tensor([[1, 2, 15, 0]], dtype=torch.int32)).tolist() == [[0x12, 0xF0]]
    for shape in SHAPES:
        p = _packed(*shape)
        gpu = FusedInt4Linear(p, None, p.nbytes(), device=torch.device("cuda"))
        cpu = FusedInt4Linear(p, None, p.nbytes())
        assert gpu.weight_int4.dtype == torch.uint8 and gpu.weight_int4.shape == (shape[0], shape[1] // 2)
        assert torch.equal(gpu.scales_and_zeros, cpu.scales_and_zeros)
        x = torch.randn(4, shape[1])
        codes = codes_of_nibbles(gpu.weight_int4)
        with torch.no_grad():
            again = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.to(torch.bfloat16), torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1), shape[2],
                gpu.scales_and_zeros).float()
            assert torch.equal(again, cpu(x))


def test_a_gpu_draft_runs_on_the_fused_kernel_or_is_refused_never_dequantized_per_call():
    """On a GPU every draft linear runs on the fused kernel (converted there once, after the move; never computed
    before), and a draft it cannot compute is refused in one line naming the flag that asks for per-call
    dequantization."""
    from specter.errors import SpecterError
    from specter.quant.draft import PackedQuantLinear, QuantizedExpert, QuantizedExperts
    from specter.quant.kernels import FUSED_KERNELS, with_fused_kernels

    cuda = torch.device("cuda")

    def experts(group):
        linears = {n: PackedQuantLinear(_packed(64, 128, group, seed=i), None, torch.float32, 0)
                   for i, n in enumerate(("gate_proj", "up_proj", "down_proj"))}
        return QuantizedExperts([QuantizedExpert(**linears)], torch.nn.functional.silu, False)

    fused, kernel = with_fused_kernels(experts(32), cuda)
    assert kernel == FUSED_KERNELS["cuda"]
    linears = list(fused[0].children())
    assert len(linears) == 3 and all(isinstance(m, FusedInt4Linear) and m.kernel == "cuda" for m in linears)
    with pytest.raises(RuntimeError, match="before its codes were converted"):
        linears[0](torch.randn(1, 128))
    with pytest.raises(RuntimeError, match="readied on cpu"):
        linears[0].ready()
    with pytest.raises(SpecterError, match="3 of the draft's 3 .*groups of 16 inputs.*--live-draft-kernel packed"):
        with_fused_kernels(experts(16), cuda)
    _, on_cpu = with_fused_kernels(experts(16), torch.device("cpu"))  # the CPU keeps per-call dequantization, said
    assert "dequantized on every call" in on_cpu and "3 for groups of 16 inputs" in on_cpu


@pytest.mark.gpu
def test_the_gpu_kernel_computes_the_drafts_weights_to_bfloat16s_rounding():
    cuda = torch.device("cuda")
    for shape in SHAPES:
        p = _packed(*shape)
        m = FusedInt4Linear(p, None, p.nbytes(), device=cuda)
        m.weight_int4, m.scales_and_zeros = m.weight_int4.to(cuda), m.scales_and_zeros.to(cuda)
        m.ready()
        x = torch.randn(5, shape[1])
        with torch.no_grad():
            got = m(x.to(cuda)).cpu()
        want = x.to(torch.bfloat16).float() @ dequantize(p, torch.float32).T
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
