"""The forward service: every numerical result a run needs, computed once and memoized ("record once, replay many").

Positions: a prompt's committed sequence `seq` grows by decoding. At a rebase point with `t` committed tokens the target
has processed `seq[:t-1]` (its KV cache) and `seq[t-1]` is pending. A window of K starts there:
- the draft processes `seq[t-1]`, then its own proposals, reading the target's committed KV and writing only its
  speculative positions into a scratch copy (as the Specter artifact does); step i's input has routes `draft_routes[i-1]`
  and proposes `draft_tokens[i-1]`;
- the target verifies `[seq[t-1], d_1, ..., d_K]` in one pass: argmax `verify_argmax[j]` and routes `verify_routes[j]`
  for input j. Draft step i and verification input i-1 read the same token while the proposals are accepted, which is
  what makes the draft's routing a forecast of the target's.
Greedy windows are memoized per (prompt, t), extended to the largest K asked for; prefixes serve smaller K because
attention is causal. Routes are recorded by forward hooks on the routers, i.e. exactly what the model's own router chose.
"""

from __future__ import annotations

import copy
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


GUESS_DEPTH = 10  # Mixtral-Offloading tried 1, 2 and 10 layers ahead


def _forward(moe: MoEModel, ids: list[int], cache, guesses: list | None = None):
    """One forward of `ids` after `cache` (None: a fresh one): (logits [T, V], routes of each token, updated cache).
    With a `guesses` list, appends each token's speculative routes (`MoEModel.guess_routes`) to it."""
    cache = new_cache(moe) if cache is None else cache
    with moe.record_routing() as log, moe.record_router_inputs() as inputs, torch.no_grad():
        out = moe.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    per_layer = {layer: calls[-1].tolist() for layer, calls in log.items()}  # {layer: [T][k]}
    routes = [{layer: tuple(sorted(r[j])) for layer, r in per_layer.items()} for j in range(len(ids))]
    if guesses is not None:
        guesses.extend(moe.guess_routes({layer: calls[-1] for layer, calls in inputs.items()}, GUESS_DEPTH))
    return out.logits[0].float(), routes, out.cache


def _crop(cache, length: int):
    """A copy of `cache` holding its first `length` positions."""
    dup = copy.deepcopy(cache)
    excess = dup.get_seq_length() - length
    if excess > 0:
        dup.crop(-excess)
    return dup


@dataclass
class Window:
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
    step_guesses: list[dict] = field(default_factory=list)  # per decode step: {(layer, d): experts guessed}
    windows: dict[tuple[str, int], Window] = field(default_factory=dict)  # by (draft, rebase point)
    _cache: object = None  # target KV over seq[:-1]; dropped from pickles
    _draft_caches: dict = field(default_factory=dict)  # a draft's own KV over seq[:-1] (separate-KV drafts)

    @property
    def seq(self) -> list[int]:
        return self.prompt + self.tokens

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cache"] = None
        state["_draft_caches"] = {}
        state.pop("_derived", None)  # what systems derive from a trace (MoE-Infinity's counts), recomputed on demand
        return state


class ForwardService:
    """Memoized numerics of a target (and optionally its draft) over prompts; greedy decoding."""

    def __init__(self, target: MoEModel, draft: MoEModel | None = None, draft_key: str = "draft") -> None:
        self.target = target
        self.draft = draft
        self.draft_key = draft_key  # windows are memoized per draft: one service serves every draft of its target
        self.traces: dict[tuple[tuple[int, ...], int], PromptTrace] = {}
        self.forward_calls = 0  # model forwards actually run (a replayed run adds none)

    def trace(self, prompt: list[int], max_new_tokens: int) -> PromptTrace:
        """The target's greedy decode of `prompt`: tokens and routes at every committed position."""
        key = (tuple(prompt), max_new_tokens)
        if key in self.traces:
            return self.traces[key]
        logits, prefill_routes, cache = _forward(self.target, prompt, None)
        self.forward_calls += 1
        tokens = [int(logits[-1].argmax())]
        step_routes: list[TokenRoutes] = []
        guesses: list[dict] = []
        while len(tokens) < max_new_tokens:
            logits, routes, cache = _forward(self.target, [tokens[-1]], cache, guesses)
            self.forward_calls += 1
            step_routes.append(routes[0])
            tokens.append(int(logits[-1].argmax()))
        trace = PromptTrace(list(prompt), tokens, prefill_routes, step_routes, guesses, _cache=cache)
        self.traces[key] = trace
        return trace

    def sampled_trace(self, prompt: list[int], max_new_tokens: int, temperature: float, seed: int) -> PromptTrace:
        """The target's own sampled decode (live, not memoized across seeds): what non-speculative systems commit."""
        from specter.spec.sampling import SamplingSession

        key = (tuple(prompt), max_new_tokens, temperature, seed)
        if key in self.traces:
            return self.traces[key]
        session = SamplingSession(self.target, None, prompt, temperature, seed)
        guesses: list[dict] = []
        step_routes = [session.step(guesses) for _ in range(max_new_tokens - 1)]
        self.forward_calls += max_new_tokens
        trace = PromptTrace(list(prompt), session.seq[len(prompt) :], session.prefill_routes, step_routes, guesses)
        self.traces[key] = trace
        return trace

    def window(self, trace: PromptTrace, t: int, k: int, own_kv: bool = False) -> Window:
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
        window = Window(t, draft_tokens, draft_routes, logits.argmax(-1).tolist(), routes)
        trace.windows[key] = window
        return window
