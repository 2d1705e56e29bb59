"""Seeded, randomly initialised tiny checkpoints of every supported MoE class, for tests.

Each model has a few layers and 8-16 experts, small enough to build, save and run in well under a second, and is saved
with `save_pretrained` so that it goes through the same loading path as a real checkpoint. The shapes exercise what the
adapter must handle: shared experts (Qwen2-MoE, DeepSeek), a leading dense layer (DeepSeek), group-limited routing
(DeepSeek-V2 and V3), a correction bias (V3), sparsemixer (PhiMoE), and GPT-OSS's transposed, interleaved, biased
experts.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedTokenizerFast

# Common to every tiny model: [vocab 260 = 256 bytes + 4 specials, hidden 64, 4 heads of 16, 2 KV heads].
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 256..259
_COMMON = dict(
    vocab_size=256 + len(SPECIALS),
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    pad_token_id=256,
    bos_token_id=257,
    eos_token_id=258,
)

# DeepSeek-V2 and V3 share their shapes: a dense first layer, a shared expert, group-limited routing, MLA.
_DEEPSEEK = dict(num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=16,
                 n_shared_experts=1, num_experts_per_tok=4, first_k_dense_replace=1, n_group=4, topk_group=2,
                 kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                 num_key_value_heads=4)

# Per model_type: the keyword arguments of its stock config class.
TINY_CONFIGS: dict[str, dict] = {
    "mixtral": dict(num_hidden_layers=2, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2),
    "qwen2_moe": dict(num_hidden_layers=2, intermediate_size=96, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                      qkv_bias=False),
    "qwen3_moe": dict(num_hidden_layers=2, head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_experts=16,
                      num_experts_per_tok=4, norm_topk_prob=True),
    "phimoe": dict(num_hidden_layers=2, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2),
    "olmoe": dict(num_hidden_layers=2, intermediate_size=32, num_experts=16, num_experts_per_tok=4),
    "deepseek_v2": dict(_DEEPSEEK, topk_method="group_limited_greedy", routed_scaling_factor=1.0),
    "deepseek_v3": dict(_DEEPSEEK, routed_scaling_factor=2.5),
    "gpt_oss": dict(
        num_hidden_layers=2,
        head_dim=16,
        intermediate_size=32,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
    ),
}


_DTYPES = ("float32", "bfloat16", "float16")  # what `--set dtype=` takes


def tiny_config(model_type: str, shapes: dict[str, int] | None = None) -> PretrainedConfig:
    """The stock config of a tiny `model_type` model (eager attention and experts, so CPU runs are exact and fast),
    with `shapes` (whole-number fields of the config, such as hidden_size) in place of the tiny ones."""
    if model_type not in TINY_CONFIGS:
        raise KeyError(f"no tiny config for {model_type!r}; known: {', '.join(sorted(TINY_CONFIGS))}")
    kwargs = {**_COMMON, **TINY_CONFIGS[model_type], **(shapes or {})}
    config = AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    return config


def shape_settings(model_type: str, overrides: dict[str, str]) -> tuple[dict[str, int], torch.dtype]:
    """`build-model tiny-<model_type> --set KEY=VALUE`'s settings as (the config's shapes, the dtype its weights are
    made and saved in): any whole-number field of the stock config (hidden_size, intermediate_size,
    num_hidden_layers, num_attention_heads, ...), and `dtype` (float32, bfloat16 or float16). One SpecterError names
    a key or value it cannot take."""
    from specter.errors import SpecterError

    numeric = sorted(key for key, value in tiny_config(model_type).to_dict().items()
                     if isinstance(value, int) and not isinstance(value, bool) and not key.endswith("token_id"))
    shapes, dtype = {}, torch.float32
    for key, text in overrides.items():
        if key == "dtype":
            if text not in _DTYPES:
                raise SpecterError(f"--set dtype={text!r}: give one of {', '.join(_DTYPES)}")
            dtype = getattr(torch, text)
            continue
        if key not in numeric:
            raise SpecterError(f"--set {key}: not a setting of tiny-{model_type}; settings: dtype, "
                               f"{', '.join(numeric)}")
        try:
            value = int(text)
        except ValueError:
            raise SpecterError(f"--set {key}={text!r}: not a whole number") from None
        if not 1 <= value <= 1 << 20:
            raise SpecterError(f"--set {key}={value}: give a whole number from 1 to {1 << 20}")
        shapes[key] = value
    merged = {**_COMMON, **TINY_CONFIGS[model_type], **shapes}
    from specter.models.config_check import check_config

    check_config(merged, "--set", "give a smaller setting")  # a depth or expert count no model has, among others
    if merged.get("head_dim") is None and merged["hidden_size"] % merged["num_attention_heads"]:
        raise SpecterError(f"--set: hidden_size {merged['hidden_size']} is not a multiple of num_attention_heads "
                           f"{merged['num_attention_heads']}; set both so that it is")
    if merged["num_attention_heads"] % merged["num_key_value_heads"]:
        raise SpecterError(f"--set: num_attention_heads {merged['num_attention_heads']} is not a multiple of "
                           f"num_key_value_heads {merged['num_key_value_heads']}; set both so that it is")
    return shapes, dtype


def build_tiny_model(model_type: str, seed: int = 0, dtype: torch.dtype = torch.float32,
                     shapes: dict[str, int] | None = None) -> torch.nn.Module:
    """A randomly initialised tiny model (at `shapes`, where given); the same seed gives the same weights."""
    config = tiny_config(model_type, shapes)
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        _randomize_biases(model, seed)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.eval()


def _randomize_biases(model: torch.nn.Module, seed: int) -> None:
    """Give zero-initialised routing biases small random values so that tests exercise them (DeepSeek-V3, GPT-OSS)."""
    generator = torch.Generator().manual_seed(seed + 1)
    for name, tensor in model.state_dict().items():
        if name.endswith("e_score_correction_bias") or name.endswith("router.bias") or "proj_bias" in name:
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.05)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer whose ids 0-255 are the bytes themselves (no merges), so any text encodes; specials
    follow."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    vocab.update({tok: 256 + i for i, tok in enumerate(SPECIALS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what the ByteLevel pre-tokenizer emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def save_tiny_model(model_type: str, out_dir: str | Path, seed: int = 0, overrides: dict[str, str] | None = None
                    ) -> Path:
    """Build a tiny model (`overrides`: `shape_settings`) and save it, with its byte tokenizer, to `out_dir`; returns
    the directory."""
    from specter.models.integrity import check_finite

    out = Path(out_dir)
    shapes, dtype = shape_settings(model_type, overrides or {})
    model = build_tiny_model(model_type, seed=seed, dtype=dtype, shapes=shapes)
    check_finite(model, f"tiny-{model_type}", "report this with the seed")  # a random init is finite: a guard
    model.save_pretrained(out)
    byte_tokenizer().save_pretrained(out)
    return out


def fit_tiny_model(model: torch.nn.Module, token_ids: list[int], steps: int = 300, batch: int = 16, seq_len: int = 64,
                   lr: float = 3e-3, seed: int = 0) -> list[float]:
    """Train a tiny model on a token stream (next-token loss) so that its routing and predictions carry signal; returns
    the loss curve. Used where a random model would make a comparison meaningless (GPTQ vs RTN, acceptance rates)."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.tensor(token_ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=generator)
        x = torch.stack([data[s : s + seq_len] for s in starts])  # [B, T]
        loss = model(input_ids=x, labels=x).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses
