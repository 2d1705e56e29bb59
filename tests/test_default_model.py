"""The embedded default model's builder (on a reduced slice) and the shipped prompt sets."""

from __future__ import annotations

import json

import pytest
import torch

from specter.data.prompts import SHIPPED_SIZES, load_prompts, read_texts, shipped_texts
from specter.errors import SpecterError

SMALL = dict(layers=2, calibration_sequences=4, seq_len=64, distill_steps=2, distill_batch=2, eval_tokens=256,
             kmeans_iters=3)


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    """A 2-layer slice converted, distilled a little, saved as a stock Qwen2-MoE checkpoint."""
    from specter.models.moefy import MoefyConfig, convert, distill, to_stock

    cfg = MoefyConfig(**SMALL)
    hybrid, tok, dense, moe_config, calib, loads = convert(cfg, progress=False)
    distill(hybrid, dense, calib, cfg, progress=False)
    out = tmp_path_factory.mktemp("smoe")
    to_stock(hybrid, moe_config).save_pretrained(out)
    tok.save_pretrained(out)
    return hybrid, tok, out, cfg


def test_stock_reload_gives_the_builders_logits(reduced):
    from transformers import AutoModelForCausalLM

    hybrid, tok, out, _ = reduced
    reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.float32).eval()
    assert type(reloaded).__name__ == "Qwen2MoeForCausalLM"
    ids = tok("Now is the winter of our discontent made glorious summer", return_tensors="pt").input_ids
    with torch.no_grad():
        a, b = hybrid(input_ids=ids).logits, reloaded(input_ids=ids).logits
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_reduced_model_goes_through_the_adapter(reduced):
    from specter.models import load_moe_model

    _, _, out, cfg = reduced
    moe = load_moe_model(out, dtype=torch.float32)
    assert [m.layer_index for m in moe.moe_layers] == [0, 1]
    layer = moe.moe_layers[0]
    assert layer.num_experts == cfg.experts and layer.top_k == cfg.top_k and layer.shared is not None
    x = torch.randn(5, moe.config.hidden_size, generator=torch.Generator().manual_seed(0))
    out_block = layer.block(x[None])[0]
    assert (layer.compose(x) - out_block).abs().max() < 1e-5


def test_conversion_is_deterministic_and_the_cached_gguf_changes_nothing(monkeypatch):
    """Two conversions give the same tensors, bit for bit: one reading the GGUF itself (no cache), one reading the
    session's cache of the converted GGUF (written by whichever test loaded it first, or by this one)."""
    from specter.models.dense import dense_cache_dir, load_dense, smollm2_dir
    from specter.models.moefy import MoefyConfig, convert

    cfg = MoefyConfig(**{**SMALL, "layers": 1, "distill_steps": 0})
    load_dense()  # fills the cache if no test has yet
    assert (dense_cache_dir(smollm2_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf") / "model.safetensors").is_file()
    cached = convert(cfg, progress=False)
    monkeypatch.setenv("SPECTER_CACHE_DIR", "")  # no cache: from the GGUF
    fresh = convert(cfg, progress=False)
    first, second = cached[0].state_dict(), fresh[0].state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert cached[3].to_dict() == fresh[3].to_dict()  # the MoE config the checkpoint is saved with
    text = "def parse(text: str) -> int:\n    return len(text)  # Now is the winter of our discontent"
    assert cached[1](text).input_ids == fresh[1](text).input_ids


@pytest.mark.parametrize("name", sorted(SHIPPED_SIZES))
def test_shipped_sets_have_their_stated_size(name):
    assert len(shipped_texts(name)) == SHIPPED_SIZES[name]


@pytest.mark.parametrize("name", ["humaneval", "mtbench", "prose", "code"])
def test_shipped_sets_load_offline_as_prompts(name, reduced):
    _, tok, _, _ = reduced
    prompts = load_prompts(name, tok, num_prompts=5, prefix_tokens=16)
    assert len(prompts) == 5 and all(len(p) == 16 for p in prompts)


def test_prose_and_code_prompts_are_disjoint_from_calibration():
    from specter.data.corpus import corpus_texts

    for corpus in ("prose", "code"):
        calibration = set(corpus_texts(corpus, "calibration"))
        assert not calibration & set(corpus_texts(corpus, "held_out"))


def test_local_file_errors(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(SpecterError, match="is empty"):
        read_texts(empty)
    rows = tmp_path / "r.jsonl"
    rows.write_text(json.dumps({"question": "a?"}) + "\n")
    with pytest.raises(SpecterError, match="has no field 'prompt'.*columns: \\['question'\\]"):
        read_texts(rows, "prompt")
    odd = tmp_path / "r.txt"
    odd.write_text("hello")
    with pytest.raises(SpecterError, match="unknown format '.txt'"):
        read_texts(odd)
    broken = tmp_path / "b.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(SpecterError, match="cannot read"):
        read_texts(broken)


@pytest.mark.parametrize("column, conventional", [("question", True), ("Pre-Revision Question", True), ("body", False)])
def test_paper_column_conventions(tmp_path, column, conventional):
    import pandas as pd

    path = tmp_path / "d.csv"
    pd.DataFrame({column: ["What is a mixture of experts?", "Why offload?"]}).to_csv(path, index=False)
    if conventional:
        assert read_texts(path) == ["What is a mixture of experts?", "Why offload?"]
    else:
        with pytest.raises(SpecterError, match="pass --field"):
            read_texts(path)
