"""The host's time per dispatched op, measured: an eager decoder layer at batch 1 over the kernels it dispatches.

The simulator charges the host `host.dispatch_us` for every kernel an op stands for (`specter.timing.sim`). On a GPU at
batch 1 that is what bounds a decode of small kernels: the framework's Python, its dispatcher and the launch call, per
op. `KernelCounter` counts the kernels a piece of eager PyTorch dispatches (views and reads of a device value into
Python launch none; the reads are counted apart, as host reads); `dispatch_seconds` times one decode step of a small
stock MoE model (transformers' own modules, the code the live engine runs), takes out its weights' reads at the
profile's memory bandwidth, and divides by its kernels: what remains is each op's fixed cost on the host.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: aten ops that launch no kernel: they make a new view of the same memory, or read a value into Python
NO_KERNEL = frozenset({"aten._unsafe_view.default", "aten._local_scalar_dense.default", "aten.lift_fresh.default"})
#: the aten op behind `.item()` and `.tolist()`: the host reading a device value (a synchronization on a GPU)
HOST_READ = "aten._local_scalar_dense.default"
PREFIX_TOKENS = 2  # a decode step measured or counted comes after this many cached positions


class KernelCounter(TorchDispatchMode):
    """Counts each dispatched kernel, and each host read, into the part `part()` names when it runs."""

    def __init__(self, part: Callable[[], str] = lambda: "all") -> None:
        super().__init__()
        self.part = part
        self.kernels: dict[str, int] = {}
        self.syncs: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name, part = str(func), self.part()
        if name == HOST_READ:
            self.syncs[part] = self.syncs.get(part, 0) + 1
        elif not (func.is_view or name in NO_KERNEL):
            self.kernels[part] = self.kernels.get(part, 0) + 1
        return func(*args, **(kwargs or {}))


def decoder_moe(device: str = "cpu", model_dir: str | None = None):
    """A stock transformers MoE model of two decoder layers, seeded, its experts run eagerly as the suite loads every
    checkpoint: by default at the default proxy's shapes (SmolLM2-135M's attention, hidden 576, 9 heads, 3 KV heads;
    8 routed experts of 128, top 2, beside a gated shared expert of 512: Qwen2-MoE, the default proxy's class) with a
    vocabulary of 256; with `model_dir`, the checkpoint's own class and widths (its config, cut to its first two
    decoder layers and a vocabulary of 256; no weights read). On a GPU its arithmetic is negligible beside its
    dispatch; on the CPU as device an op's fixed cost depends on its size (threads start only above a grain size), so
    the layers are a real model's size and the step's reads at the profile's memory bandwidth are taken out."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2MoeConfig

    if model_dir is None:
        config = Qwen2MoeConfig(vocab_size=256, hidden_size=576, intermediate_size=1536, moe_intermediate_size=128,
                                shared_expert_intermediate_size=512, num_hidden_layers=2, num_attention_heads=9,
                                num_key_value_heads=3, num_experts=8, num_experts_per_tok=2,
                                max_position_embeddings=64)
    else:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        config.num_hidden_layers, config.vocab_size = 2, 256
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):  # ids past the cut vocabulary
            if isinstance(getattr(config, name, None), int) and getattr(config, name) >= config.vocab_size:
                setattr(config, name, None)
        if isinstance(getattr(config, "layer_types", None), list):
            config.layer_types = config.layer_types[:2]
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval().to(device)


def _experts(config) -> tuple[int, int]:
    """(routed experts per layer, experts per token) of a MoE config, by whichever names its class gives them."""
    total = next(getattr(config, n) for n in ("num_experts", "num_local_experts", "n_routed_experts")
                 if getattr(config, n, None))
    return total, config.num_experts_per_tok


def step_bytes(model) -> int:
    """Bytes of weights one decode step reads: every parameter but the embedding table (one row of it is read), the
    routed experts at the share of them a token reaches."""
    total, per_token = _experts(model.config)
    share = per_token / total
    total = 0.0
    for name, p in model.named_parameters():
        if "embed_tokens" in name:
            continue
        routed = ".experts." in f"{name}." and "shared_expert" not in name
        total += p.numel() * p.element_size() * (share if routed else 1.0)
    return int(total)


def dispatch_seconds(device: str = "cpu", repeats: int = 10, warmup: int = 3,
                     memory_bandwidth: float | None = None, model_dir: str | None = None) -> tuple[float, int, int]:
    """(host seconds per dispatched kernel, kernels a step, host reads a step): the median over `repeats` of one
    greedy decode step of `decoder_moe` (of `model_dir`'s class and widths, where given; after `PREFIX_TOKENS`
    positions, the step's own cache each time), less its weights' reads at `memory_bandwidth` (bytes/s; None: nothing
    taken out), over the kernels it dispatches (counted once, outside the timed steps)."""
    from transformers import DynamicCache

    model = decoder_moe(device, model_dir)
    prefix = torch.arange(1, PREFIX_TOKENS + 1, device=device)[None]
    step = torch.tensor([[PREFIX_TOKENS + 1]], device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def one_step(counter: KernelCounter | None = None) -> float:
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            model(input_ids=prefix, cache=cache, use_cache=True)
            sync()
            t0 = time.perf_counter()
            if counter is None:
                model(input_ids=step, cache=cache, use_cache=True)
            else:
                with counter:
                    model(input_ids=step, cache=cache, use_cache=True)
            sync()
            return time.perf_counter() - t0

    counter = KernelCounter()
    one_step(counter)
    kernels, reads = sum(counter.kernels.values()), sum(counter.syncs.values())
    for _ in range(warmup):
        one_step()
    seconds = statistics.median(one_step() for _ in range(repeats))
    if memory_bandwidth:
        seconds = max(0.0, seconds - step_bytes(model) / memory_bandwidth)
    return seconds / kernels, kernels, reads
