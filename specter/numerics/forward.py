"""The forward service: every numerical result a run needs, computed once and memoized ("record once, replay many").

Positions: a prompt's committed sequence `seq` grows by decoding. At a rebase point with `t` committed tokens the target
has processed `seq[:t-1]` (its KV cache) and `seq[t-1]` is pending. A window of K starts there:
- the draft processes `seq[t-1]`, then its own proposals, reading the target's committed KV and writing only its
  speculative positions into a scratch copy (as the Specter artifact does); step i's input has routes
  `draft_routes[i-1]` and proposes `draft_tokens[i-1]`;
- the target verifies `[seq[t-1], d_1, ..., d_K]` in one pass: argmax `verify_argmax[j]` and routes `verify_routes[j]`
  for input j. Draft step i and verification input i-1 read the same token while the proposals are accepted, which is
  what makes the draft's routing a forecast of the target's.
Greedy windows are memoized per (prompt, t), extended to the largest K asked for; prefixes serve smaller K because
attention is causal. Routes are recorded by forward hooks on the routers, i.e. exactly what the model's own router
chose.

Systems that need more of the target's decode than tokens and routes declare a `TraceRecorder`
(`System.trace_recorders`,
e.g. Mixtral-Offloading's gate guesses); the service computes a recorder's values only once some system in the process
has required it (`require`), and a trace recorded without them gets them by decoding again (counted as forwards).
What systems derive from a trace alone (MoE-Infinity's activation matrices) is cached on the trace (`derive`) and never
saved with it.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specter.errors import SpecterError
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
    return ": a near-tie flipped under float noise between two computations; run the model in float32"


def _crop(cache, length: int):
    """A copy of `cache` holding its first `length` positions."""
    dup = copy.deepcopy(cache)
    excess = dup.get_seq_length() - length
    if excess > 0:
        dup.crop(-excess)
    return dup


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


class ForwardService:
    """Memoized numerics of a target (and optionally its draft) over prompts; greedy decoding."""

    def __init__(self, target: MoEModel, draft: MoEModel | None = None, draft_key: str = "draft") -> None:
        self.target = target
        self.draft = draft
        self.draft_key = draft_key  # windows are memoized per draft: one service serves every draft of its target
        self.traces: dict[tuple, PromptTrace] = {}
        self.forward_calls = 0  # model forwards actually run (a replayed run adds none)
        self.recorders: dict[str, TraceRecorder] = {}  # what some system of this process needs from each decode step
        self.used: set[tuple] = set()  # the traces some run of this process asked for (what a memo it writes keeps)

    def require(self, recorders) -> None:
        """Compute these recorders' values in every trace from now on (and for cached traces when next asked)."""
        for r in recorders:
            self.recorders.setdefault(r.name, r)

    def trace(self, prompt: list[int], max_new_tokens: int, calibration: bool = False) -> PromptTrace:
        """The target's greedy decode of `prompt`: tokens and routes at every committed position, and the values of
        every required recorder. `calibration`: the prompt is a calibration one (the memo says so, and statistics
        over the evaluation prompts leave it out)."""
        key = (tuple(prompt), max_new_tokens)
        self.used.add(key)
        trace = self.traces.get(key)
        missing = tuple(r for name, r in self.recorders.items() if trace is None or name not in trace.extras)
        if trace is not None and not missing:
            return trace
        fresh = self._decode(prompt, max_new_tokens, missing)
        if trace is None:
            fresh.calibration = calibration
            self.traces[key] = fresh
            return fresh
        if fresh.tokens != trace.tokens or fresh.step_routes != trace.step_routes:
            raise SpecterError(f"decoding prompt {prompt[:8]}... again for {', '.join(r.name for r in missing)} gave "
                               "other tokens or routes than the recorded trace" + disagreement_cause(trace))
        trace.extras.update(fresh.extras)
        return trace

    def _decode(self, prompt: list[int], max_new_tokens: int, recorders: tuple[TraceRecorder, ...]) -> PromptTrace:
        logits, prefill_routes, cache = _forward(self.target, prompt, None)
        self.forward_calls += 1
        tokens = [int(logits[-1].argmax())]
        step_routes: list[TokenRoutes] = []
        extras: dict[str, list] = {r.name: [] for r in recorders}
        while len(tokens) < max_new_tokens:
            logits, routes, cache = _forward(self.target, [tokens[-1]], cache, recorders, extras)
            self.forward_calls += 1
            step_routes.append(routes[0])
            tokens.append(int(logits[-1].argmax()))
        return PromptTrace(list(prompt), tokens, prefill_routes, step_routes, extras, _cache=cache)

    def sampling_session(self, prompt: list[int], temperature: float, seed: int):
        """A live sampled decode of `prompt` by the target with the current draft (rejection sampling)."""
        from specter.numerics.sampling import SamplingSession

        return SamplingSession(self.target, self.draft, prompt, temperature, seed, owner=self)

    def sampled_trace(self, prompt: list[int], max_new_tokens: int, temperature: float, seed: int) -> PromptTrace:
        """The target's own sampled decode (live, not memoized across seeds): what non-speculative systems commit."""
        from specter.numerics.sampling import SamplingSession

        key = (tuple(prompt), max_new_tokens, temperature, seed)
        self.used.add(key)
        if key in self.traces:
            return self.traces[key]
        session = SamplingSession(self.target, None, prompt, temperature, seed, owner=self)
        recorders = tuple(self.recorders.values())
        extras: dict[str, list] = {r.name: [] for r in recorders}
        step_routes = [session.step(recorders, extras) for _ in range(max_new_tokens - 1)]
        trace = PromptTrace(list(prompt), session.seq[len(prompt) :], session.prefill_routes, step_routes, extras)
        self.traces[key] = trace
        return trace

    def window(self, trace: PromptTrace, t: int, k: int, own_kv: bool = False) -> DraftWindow:
        """The speculative window of at least k proposals at rebase point t (memoized, extended on demand).

        `own_kv`: the draft keeps its own KV of the committed prefix (a draft with separate weights and cache, as
        SpecMoEOff's) instead of reading the target's."""
        key = (self.draft_key + (":own-kv" if own_kv else ""), t)
        cached = trace.windows.get(key)
        if cached is not None and cached.kmax >= k:
            return cached
        if self.draft is None:
            raise ValueError("this forward service has no draft; speculative systems need --draft")
        if trace._cache is None:  # a trace read back from disk: rebuild the target's cache over the committed sequence
            _, _, trace._cache = _forward(self.target, trace.seq[:-1], None)
            self.forward_calls += 1
        seq = trace.seq
        pending = seq[t - 1]
        if own_kv:
            if self.draft_key not in trace._draft_caches:
                _, _, trace._draft_caches[self.draft_key] = _forward(self.draft, trace.seq[:-1], None)
                self.forward_calls += 1
            draft_cache = _crop(trace._draft_caches[self.draft_key], t - 1)
        else:
            draft_cache = _crop(trace._cache, t - 1)
        draft_tokens, draft_routes = [], []
        token = pending
        for _ in range(k):
            logits, routes, draft_cache = _forward(self.draft, [token], draft_cache)
            self.forward_calls += 1
            draft_routes.append(routes[0])
            token = int(logits[-1].argmax())
            draft_tokens.append(token)
        logits, routes, _ = _forward(self.target, [pending, *draft_tokens], _crop(trace._cache, t - 1))
        self.forward_calls += 1
        window = DraftWindow(t, draft_tokens, draft_routes, logits.argmax(-1).tolist(), routes)
        trace.windows[key] = window
        return window
