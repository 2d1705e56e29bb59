"""A model's forward passes and what they record: one sequence's pass with its routes (`_forward`), a left-padded
batch of rows each reading its own copy of a committed KV (`_prefix_batch`, `_forward_rows`), and the records they
make: a prompt's greedy trace (`PromptTrace`) and one draft window (`DraftWindow`). The forward service
(`specter.numerics.forward`) and the sampled decodes (`specter.numerics.sampling`) are built on them."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specter.models.adapter import MoEModel

TokenRoutes = dict[int, tuple[int, ...]]  # one token's routed experts: {decoder layer: sorted expert ids}


def new_cache(moe: MoEModel):
    """An empty KV cache that can be rolled back: sliding-window layers (GPT-OSS) keep their past states for `crop`."""
    from transformers import DynamicCache

    cache = DynamicCache(config=moe.config)
    for layer in cache.layers:
        if hasattr(layer, "activate_past_recording"):
            layer.activate_past_recording()
    return cache


class TraceRecorder:
    """Extra numerics a system needs from each of the target's decode steps, declared by the system and computed by
    the service while it decodes. `record(moe)` is a context manager around one forward that yields a log;
    `values(moe, log)` turns the log into one JSON-ready value per token of that forward."""

    name: str = ""

    def record(self, moe: MoEModel):
        return contextlib.nullcontext({})

    def values(self, moe: MoEModel, log) -> list:
        raise NotImplementedError

    def remap(self, values: list, layer_map) -> list:
        """The values re-keyed by another architecture's layers (`LayerMap`), for runs priced at its shapes."""
        raise NotImplementedError(f"recorder {self.name!r} cannot be mapped to another architecture's layers")


def _forward(moe: MoEModel, ids: list[int], cache, recorders: tuple[TraceRecorder, ...] = (), extras=None):
    """One forward of `ids` after `cache` (None: a fresh one): (logits [T, V], routes of each token, updated cache).
    Each recorder's values for these tokens are appended to `extras[recorder.name]`."""
    cache = new_cache(moe) if cache is None else cache
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(moe.record_routing())
        logs = [stack.enter_context(r.record(moe)) for r in recorders]
        with torch.no_grad():
            out = moe.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    per_layer = {layer: calls[-1].tolist() for layer, calls in log.items()}  # {layer: [T][k]}
    routes = [{layer: tuple(sorted(r[j])) for layer, r in per_layer.items()} for j in range(len(ids))]
    for recorder, rec_log in zip(recorders, logs):
        extras.setdefault(recorder.name, []).extend(recorder.values(moe, rec_log))
    return out.logits[0].float(), routes, out.cache


def greedy_prefill(moe: MoEModel, prompt: list[int]) -> tuple[int, list[TokenRoutes]]:
    """The first greedy token after `prompt` and the routes of its tokens: one forward that no service counts (a
    memo's spot check against the model it replays on)."""
    logits, routes, _ = _forward(moe, list(prompt), None)
    return int(logits[-1].argmax()), routes


def disagreement_cause(trace: PromptTrace) -> str:
    """What a disagreement between two computations of one trace means, for its error message: for a trace read from
    a memo (whose lines were checked against this model, `specter.numerics.memo`), its recording; for one computed
    here, a near-tie that float noise flipped."""
    if trace.origin is not None:
        return (f" (the trace comes from --memo {trace.origin!r}, whose records passed their checks: a near-tie "
                "that flipped between two computations when it was recorded, or content rewritten with its digest "
                "recomputed); record the memo again with `specter sweep --memo-out`, in float32")
    return (": a near-tie flipped under float noise between two computations (in float32 the numerics are pinned "
            "deterministic, so there it is a bug: report it with the command that showed it)")


def _crop(cache, length: int):
    """A copy of `cache` holding its first `length` positions."""
    dup = copy.deepcopy(cache)
    excess = dup.get_seq_length() - length
    if excess > 0:
        dup.crop(-excess)
    return dup


def _prefix_batch(sources: list[tuple[object, int]]):
    """A batch KV cache of each row's first `length` positions of its `(cache, length)` source (a one-row cache over
    its trace's committed sequence), left-padded to the longest: (cache, mask [B, Lmax] of real positions).

    Every layer becomes a plain full-history layer: each source holds its whole history (`new_cache` records the past
    of sliding-window layers), and left padding shifts a row's cached and new positions alike, so a sliding window's
    distances stay each row's own."""
    from transformers import DynamicCache

    lmax = max(length for _, length in sources)
    mask = torch.zeros(len(sources), lmax, dtype=torch.bool)
    for b, (_, length) in enumerate(sources):
        mask[b, lmax - length :] = True
    layers = []
    for i in range(len(sources[0][0].layers)):
        keys, values = [], []
        for cache, length in sources:
            layer = cache.layers[i]
            if layer.keys.shape[-2] != layer.get_seq_length() or length > layer.keys.shape[-2]:
                raise RuntimeError(f"cache layer {i} holds {layer.keys.shape[-2]} of {layer.get_seq_length()} "
                                   f"positions, {length} needed: a window reads every committed position")
            pad = (0, 0, lmax - length, 0)
            keys.append(torch.nn.functional.pad(layer.keys[:, :, :length], pad))
            values.append(torch.nn.functional.pad(layer.values[:, :, :length], pad))
        layers.append((torch.cat(keys), torch.cat(values)))
    return DynamicCache(ddp_cache_data=layers), mask


def _forward_rows(moe: MoEModel, ids: torch.Tensor, cache, mask: torch.Tensor, positions: torch.Tensor):
    """One forward of a batch of rows `ids` [B, T] after the batch `cache` whose real positions are `mask`
    [B, L] (left padding), the tokens at `positions` [B, T]: (logits [B, T, V], routes [B][T], updated cache, the
    mask grown by the new tokens)."""
    rows, length = ids.shape
    mask = torch.cat([mask, torch.ones(rows, length, dtype=torch.bool)], dim=1)
    with moe.record_routing() as log, torch.no_grad():
        out = moe.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
    per_layer = {}
    for layer, calls in log.items():
        chosen = calls[-1]
        if chosen.shape[0] != rows * length:
            raise RuntimeError(f"layer {layer}'s router saw {chosen.shape[0]} tokens for a batch of {rows} x {length}")
        per_layer[layer] = chosen.reshape(rows, length, -1).tolist()
    routes = [[{layer: tuple(sorted(r[b][j])) for layer, r in per_layer.items()} for j in range(length)]
              for b in range(rows)]
    return out.logits.float(), routes, out.cache, mask


@dataclass
class DraftWindow:
    start: int  # t: committed tokens before the window
    draft_tokens: list[int]  # d_1..d_kmax
    draft_routes: list[TokenRoutes]  # per draft step (its input token)
    verify_argmax: list[int]  # target argmax after each of the kmax + 1 verified inputs
    verify_routes: list[TokenRoutes]  # per verified input

    @property
    def kmax(self) -> int:
        return len(self.draft_tokens)

    def accepted(self, k: int) -> int:
        """Greedy acceptance of the first k proposals: leading proposals equal to the target's argmax."""
        a = 0
        while a < k and self.draft_tokens[a] == self.verify_argmax[a]:
            a += 1
        return a


@dataclass
class PromptTrace:
    """The target's greedy decode of one prompt, and the speculative windows asked for so far."""

    prompt: list[int]
    tokens: list[int]  # generated tokens (the target's greedy output)
    prefill_routes: list[TokenRoutes]  # routes of the prompt tokens
    step_routes: list[TokenRoutes]  # routes of decode step j (input seq[P + j - 1]), j = 1 .. N - 1
    extras: dict[str, list] = field(default_factory=dict)  # a recorder's values per decode step, by recorder name
    windows: dict[tuple[str, int], DraftWindow] = field(default_factory=dict)  # by (draft, rebase point)
    calibration: bool = False  # a prompt of the calibration split (a governor's or a warm-up's), not an evaluation one
    origin: str | None = None  # the memo the trace was read from (None: computed in this process); never saved
    _cache: object = None  # target KV over seq[:-1]; never saved (memos rebuild it when a window needs it)
    _draft_caches: dict = field(default_factory=dict)  # a draft's own KV over seq[:-1] (separate-KV drafts)
    _derived: dict = field(default_factory=dict)  # what systems derive from the trace alone; never saved

    @property
    def seq(self) -> list[int]:
        return self.prompt + self.tokens

    def derive(self, key, compute: Callable[[PromptTrace], object]):
        """`compute(self)`, cached on the trace under `key` (a system's own derivation, e.g. activation counts)."""
        if key not in self._derived:
            self._derived[key] = compute(self)
        return self._derived[key]
