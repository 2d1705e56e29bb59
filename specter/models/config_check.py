"""A checkpoint's `config.json` checked before any tensor is made: every number finite, every size a whole number in
range, top-k at most the expert count.

transformers builds whatever a config says: a negative `hidden_size` fails deep in torch with a traceback, a top-k
above the expert count fails only at the first forward, and a NaN `rms_norm_eps` builds a model that decodes token 0
forever. `check_config` refuses each of them with one line naming the key, the value and the file. It reads the config
as a dict (torch-free), so `inspect`, `run`, `quantize` and `--cost-as` check a config the same way.
"""

from __future__ import annotations

import math

from specter.errors import SpecterError

#: The largest size any key may take: torch's index and embedding kernels take 32-bit sizes in places, and the largest
#: published MoE configs stay far below it (vocabularies of 256k, contexts of 10M positions).
MAX_SIZE = 2**31 - 1

# Whole numbers >= 1 where present (None allowed where a class treats it as "absent": `_NULLABLE`).
_POSITIVE = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "num_experts",
             "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok", "kv_lora_rank",
             "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_group", "topk_group",
             "decoder_sparse_step")
_NULLABLE = ("q_lora_rank", "sliding_window", "head_dim")
# Whole numbers >= 0 where present (Qwen2-MoE writes sliding_window 0 when it uses none).
_NON_NEGATIVE = ("shared_expert_intermediate_size", "n_shared_experts", "first_k_dense_replace", "sliding_window")
# Finite numbers > 0 where present (at the top level or in rope_parameters / rope_scaling).
_POSITIVE_REAL = ("rms_norm_eps", "layer_norm_eps", "rope_theta", "routed_scaling_factor", "swiglu_limit", "factor")
_BELOW_ONE = ("rms_norm_eps", "layer_norm_eps")  # a normalization's epsilon of 1 or more drowns the signal
_DEEPSEEK_V2_TOPK = ("greedy", "group_limited_greedy")  # the routing methods transformers' DeepSeek-V2 implements
#: The most decoder layers and routed experts a config may declare: far above any published MoE (94 layers in
#: Qwen3-235B-A22B, 512 experts in Qwen3-Next), and few enough that the modules a layer count makes, even on the meta
#: device, fit in memory (a billion layers took every gigabyte of a 24 GiB machine to describe)
MAX_LAYERS, MAX_EXPERTS = 1024, 4096
#: The largest magnitude of any number: a model computing in float32 (or bfloat16, with float32's range) holds no
#: larger value (swiglu_limit 1e300 overflowed when made a tensor).
MAX_MAGNITUDE = 3.4e38
# The keys by which configs declare their routed experts (the first present one counts).
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def check_config(config: dict, origin: str, fix: str = "fix or re-download the checkpoint") -> None:
    """Refuse a config whose numbers cannot make a working model; `origin` names the file, `fix` the remedy."""

    def bad(key: str, value, want: str) -> SpecterError:
        return SpecterError(f"{origin}: {key} is {value!r}, it must be {want}; {fix}")

    _check_finite(config, "", bad)
    for key in _POSITIVE + _NON_NEGATIVE:
        if key not in config or (config[key] is None and key in _NULLABLE):
            continue
        value, low = config[key], 1 if key in _POSITIVE else 0
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_SIZE:
            raise bad(key, value, f"a whole number from {low} to {MAX_SIZE}")
    for section in (config, config.get("rope_parameters"), config.get("rope_scaling")):
        if not isinstance(section, dict):
            continue
        prefix = "" if section is config else ("rope_parameters." if section is config.get("rope_parameters")
                                                 else "rope_scaling.")
        for key in _POSITIVE_REAL:
            value = section.get(key)
            if value is None:
                continue
            high = 1 if key in _BELOW_ONE else math.inf
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < high:
                raise bad(prefix + key, value, "a finite number above 0" + (" and below 1" if high == 1 else ""))
    experts_key = next((k for k in EXPERT_KEYS if config.get(k) is not None), None)
    for key, most in (("num_hidden_layers", MAX_LAYERS), (experts_key, MAX_EXPERTS)):
        if key is not None and isinstance(config.get(key), int) and config[key] > most:
            raise bad(key, config[key], f"at most {most} (no published model comes near)")
    top_k = config.get("num_experts_per_tok")
    if experts_key is not None and top_k is not None and top_k > config[experts_key]:
        raise bad("num_experts_per_tok", top_k, f"at most the {config[experts_key]} routed experts ({experts_key})")
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads is not None and kv_heads is not None and heads % kv_heads:
        raise bad("num_key_value_heads", kv_heads, f"a divisor of num_attention_heads ({heads})")
    groups, topk_groups = config.get("n_group"), config.get("topk_group")
    if groups is not None and topk_groups is not None and topk_groups > groups:
        raise bad("topk_group", topk_groups, f"at most n_group ({groups})")
    if groups is not None and experts_key is not None and config[experts_key] % groups:
        raise bad("n_group", groups, f"a divisor of the {config[experts_key]} routed experts ({experts_key})")
    if config.get("sliding_window") == 0 and config.get("use_sliding_window", True):
        raise bad("sliding_window", 0, "null or a whole number of positions >= 1 (0 only with use_sliding_window "
                  "false)")
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and "sliding_attention" in layer_types and config.get("sliding_window") is None:
        raise bad("sliding_window", None, "a whole number of positions >= 1 (layer_types has sliding_attention "
                  "layers)")
    if str(config.get("model_type")).startswith("deepseek_v"):  # multi-head latent attention
        rope, head_dim = config.get("qk_rope_head_dim"), config.get("head_dim")
        if rope is not None and "head_dim" in config and head_dim != rope:
            raise bad("head_dim", head_dim, f"qk_rope_head_dim ({rope}) in a DeepSeek config")
        if heads is not None and kv_heads is not None and kv_heads != heads:
            raise bad("num_key_value_heads", kv_heads, f"num_attention_heads ({heads}) in a DeepSeek config")
    method = config.get("topk_method", "greedy")
    if config.get("model_type") == "deepseek_v2" and method not in _DEEPSEEK_V2_TOPK:
        raise bad("topk_method", method, f"one of {', '.join(_DEEPSEEK_V2_TOPK)}")
    vocab, pad = config.get("vocab_size"), config.get("pad_token_id")
    if vocab is not None and pad is not None and (isinstance(pad, bool) or not isinstance(pad, int)
                                                  or not -vocab <= pad < vocab):
        raise bad("pad_token_id", pad, f"null or a token id below vocab_size ({vocab})")


def _check_finite(value, where: str, bad) -> None:
    """Every number anywhere in the config is finite and within float32's range (JSON as Python reads it allows NaN
    and Infinity)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not abs(value) <= MAX_MAGNITUDE:
        raise bad(where or "the config", value, f"a finite number of magnitude at most {MAX_MAGNITUDE:g}")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}" if where else str(key), bad)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_finite(item, f"{where}[{i}]", bad)
