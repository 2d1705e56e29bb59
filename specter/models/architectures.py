"""Real architectures as data: the published shapes a run can be priced at (`--cost-as`), with their sources.

The suite ships the configurations of the paper's models in `specter/presets/architectures/NAME.json`: the published
`config.json` fields that set a shape, the source they were copied from, and the published parameter total. Any
local `config.json` of a supported class works wherever a name does. The model is instantiated on the meta device by
the stock transformers class (no weights exist or are read), so its shapes are the class's own: attention (DeepSeek's
MLA included), dense first layers, shared experts, routers, the LM head.

A run priced at an architecture takes its numerics (tokens, routes, draft windows) from its own model, the proxy, and
its costs from the architecture's shapes; each of the architecture's MoE layers reads the routes of a proxy layer
through `LayerMap`. The proxy must have the architecture's routing structure: as many routed experts per layer and the
same top-k.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from specter.errors import SpecterError
from specter.io import not_a_file

_KEEP_OUT = ("torch_dtype", "dtype", "architectures", "transformers_version", "auto_map", "quantization_config")


def _preset_dir():
    from importlib.resources import files

    return files("specter.presets").joinpath("architectures")


def architecture_names() -> list[str]:
    return sorted(p.name.removesuffix(".json") for p in _preset_dir().iterdir() if p.name.endswith(".json"))


@dataclass(frozen=True)
class Architecture:
    name: str
    title: str
    source: str
    config: dict = field(compare=False)
    published_parameters: float | None = None
    published_parameters_source: str = ""

    def meta_model(self):
        """The stock transformers model of these shapes on the meta device, wrapped in the adapter."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from specter.models.adapter import ARCHITECTURES, MoEModel

        cfg = {k: v for k, v in self.config.items() if k not in _KEEP_OUT}
        model_type = cfg.pop("model_type", None)
        if model_type not in ARCHITECTURES:
            raise SpecterError(f"architecture {self.name!r}: model_type {model_type!r} is not a supported MoE class; "
                               f"supported: {', '.join(sorted(ARCHITECTURES))}")
        try:
            config = AutoConfig.for_model(model_type, **cfg)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
        except (TypeError, ValueError, KeyError) as err:
            raise SpecterError(f"architecture {self.name!r}: its config does not build a {model_type} model "
                               f"({err}); fix {self.source}") from None
        return MoEModel(model)

    def parameters(self) -> int:
        return sum(p.numel() for p in self.meta_model().model.parameters())

    def tiny_model(self, seed: int = 0, dtype=None):
        """The stock transformers model of this architecture's class and structure (its layers, dense first layers
        among them, experts per layer, top-k, shared experts, attention kind, biases) at tiny widths, with seeded
        weights on the CPU at `dtype` (default bfloat16: the 2-byte weights a priced run's work assumes, whose norms
        and softmax cast to float32 and back), wrapped in the adapter: what counting the kernels of its decode step
        needs (`specter.numerics.opcount`), since a kernel count depends on the class, the structure and the dtype, not
        on the widths."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from specter.models.adapter import MoEModel

        cfg = {k: v for k, v in self.config.items() if k not in _KEEP_OUT}
        model_type = cfg.pop("model_type")
        heads, kv_heads = cfg.get("num_attention_heads", 1), cfg.get("num_key_value_heads")
        tiny_heads = 4
        cfg.update(num_attention_heads=tiny_heads, hidden_size=16 * tiny_heads, vocab_size=256,
                   max_position_embeddings=64)
        if kv_heads:
            cfg["num_key_value_heads"] = max(1, tiny_heads * kv_heads // heads)
        for key, tiny in (("head_dim", 16), ("intermediate_size", 32), ("moe_intermediate_size", 16),
                          ("shared_expert_intermediate_size", 32), ("kv_lora_rank", 16), ("q_lora_rank", 16),
                          ("qk_nope_head_dim", 8), ("qk_rope_head_dim", 8), ("v_head_dim", 8)):
            if cfg.get(key):
                cfg[key] = tiny
        cfg.pop("rope_scaling", None)
        torch.manual_seed(seed)
        config = AutoConfig.for_model(model_type, **cfg)
        config._experts_implementation = "eager"  # as the suite loads every checkpoint (`models/loading.py`)
        model = AutoModelForCausalLM.from_config(config).eval().to(torch.bfloat16 if dtype is None else dtype)
        return MoEModel(model)


#: the config keys that make a checkpoint's shapes (where a shipped architecture's config has them)
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "moe_intermediate_size", "num_local_experts", "n_routed_experts", "num_experts",
              "num_experts_per_tok", "first_k_dense_replace", "vocab_size")


def published_architecture(model_config: dict) -> str | None:
    """The shipped architecture whose published shapes a checkpoint's config has (every shape key the architecture's
    config gives, equal), or None: a real checkpoint of a published model, told apart from a proxy of its class."""
    for name in architecture_names():
        published = load_architecture(name).config
        keys = [k for k in SHAPE_KEYS if k in published]
        if keys and all(model_config.get(k) == published[k] for k in keys):
            return name
    return None


def load_architecture(name_or_path: str | Path) -> Architecture:
    """A shipped architecture by name, or a local `config.json` (a Hugging Face checkpoint's, or a file of the
    shipped form with `config` inside)."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.is_file():
        if (why := not_a_file(path)) is not None:
            raise SpecterError(f"--cost-as {str(path)!r} {why}; give a config.json or one of "
                               f"{', '.join(architecture_names())}")
        text, origin = path.read_text(), str(path)
        default_name = path.parent.name if path.name == "config.json" else path.stem
    elif str(name_or_path) in architecture_names():
        text, origin = _preset_dir().joinpath(f"{name_or_path}.json").read_text(), f"preset {name_or_path}"
        default_name = str(name_or_path)
    else:
        raise SpecterError(f"unknown architecture {str(name_or_path)!r}; shipped: {', '.join(architecture_names())}, "
                           "or the path of a config.json")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecterError(f"architecture {origin} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise SpecterError(f"architecture {origin} must be a JSON object (a config.json)")
    if "config" in data and not isinstance(data["config"], dict):
        raise SpecterError(f"architecture {origin}: its config must be a JSON object (a config.json)")
    from specter.models.config_check import check_config

    check_config(data.get("config", data), f"architecture {origin}", fix=f"fix {origin}")
    if "config" in data:  # the shipped form
        return Architecture(str(data.get("name") or default_name), str(data.get("title") or default_name),
                            str(data.get("source") or origin), dict(data["config"]),
                            data.get("published_parameters"), str(data.get("published_parameters_source", "")))
    return Architecture(default_name, default_name, origin, data)


@dataclass(frozen=True)
class LayerMap:
    """Which proxy MoE layer each of the architecture's MoE layers takes its routes from: proportionally, MoE layer i
    of A reads proxy MoE layer floor(i * P / A) of P, so the first and last layers correspond and, where A > P, some
    proxy layers serve two neighbouring layers."""

    arch_layers: tuple[int, ...]  # the architecture's MoE decoder layers, in order
    proxy_layers: tuple[int, ...]

    @classmethod
    def between(cls, arch_layers, proxy_layers) -> LayerMap:
        return cls(tuple(arch_layers), tuple(proxy_layers))

    def source(self, position: int) -> int:
        """The proxy layer of the architecture's MoE layer at `position` (0-based among its MoE layers)."""
        return self.proxy_layers[position * len(self.proxy_layers) // len(self.arch_layers)]

    @cached_property
    def pairs(self) -> dict[int, int]:
        """{architecture MoE layer: its proxy layer} (computed once: every token's routes are re-keyed through it)."""
        return {layer: self.source(i) for i, layer in enumerate(self.arch_layers)}

    def routes(self, routes: dict[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
        """One token's routes, re-keyed by the architecture's layers."""
        return {layer: routes[proxy] for layer, proxy in self.pairs.items()}

    def as_dict(self) -> dict:
        return {"rule": "architecture MoE layer i of A reads proxy MoE layer floor(i * P / A)",
                "layers": {str(a): p for a, p in self.pairs.items()}}


def check_structure(arch: Architecture, arch_experts: int, arch_top_k: int, proxy_experts: int, proxy_top_k: int,
                    proxy_name: str) -> None:
    """A proxy stands in for an architecture only with its routing structure: experts per layer and top-k."""
    a, p = (arch_experts, arch_top_k), (proxy_experts, proxy_top_k)
    if a != p:
        raise SpecterError(f"--cost-as {arch.name} routes top-{a[1]} of {a[0]} experts per layer, but the model "
                           f"{proxy_name} routes top-{p[1]} of {p[0]}: give a proxy with the same routing structure "
                           f"(e.g. `specter build-model smollm2-moe-{a[0]}x{a[1]}`)")
