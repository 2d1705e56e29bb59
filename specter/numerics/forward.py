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
attention is causal. Windows are computed in batches, as a GPU computes a batch: a run walks its prompts' rebase
points before it schedules (`walk`), and each round's windows draft together, one batched forward per draft step and
one per verification length, each row reading its own left-padded copy of the target's committed KV. A row of a batch
is not bitwise the same row computed alone (the matrix kernels block by the batch's rows), so a window's last bits
depend on the batch it was computed in; the batch is a function of the runs asked for, so the same runs, code,
packages, threads and machine give the same bits. The committed tokens are always the trace's: the target's own
one-token greedy decode. Routes are recorded by forward hooks on the routers, i.e. exactly what the model's own router
chose.

Systems that need more of the target's decode than tokens and routes declare a `TraceRecorder`
(`System.trace_recorders`,
e.g. Mixtral-Offloading's gate guesses); the service computes a recorder's values only once some system in the process
has required it (`require`), and a trace recorded without them gets them by decoding again (counted as forwards).
What systems derive from a trace alone (MoE-Infinity's activation matrices) is cached on the trace (`derive`) and never
saved with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specter.errors import SpecterError
from specter.models.adapter import MoEModel
from specter.numerics.passes import (
    DraftWindow,
    PromptTrace,
    TokenRoutes,
    TraceRecorder,
    _forward,
    _forward_rows,
    _prefix_batch,
    disagreement_cause,
)


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
        self.prepared_sampling: dict[tuple, list] = {}  # (draft, prompt, T, seed) -> [(tokens, K, cycles)]

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
        """A sampled decode of `prompt` by the target with the current draft (rejection sampling): the cycles
        `prepare_sampling` computed for it, else live, one row at a time."""
        from specter.numerics.sampling import PreparedSession, SamplingSession

        def live():
            return SamplingSession(self.target, self.draft, prompt, temperature, seed, owner=self)

        prepared = self.prepared_sampling.get((self.draft_key, tuple(prompt), temperature, seed))
        if prepared is None:
            return live()
        return PreparedSession([c for _, _, c in sorted(prepared, key=lambda p: -p[0])], live)  # the longest first

    def prepare_sampling(self, requests: list[tuple[list[int], int, float, int, int]]) -> None:
        """Compute the speculative sampled decodes of `requests` (prompt, max_new_tokens, temperature, seed, fixed K)
        not yet prepared, all together (`specter.numerics.sampling.cycle_together`), for `sampling_session`."""
        from specter.numerics.sampling import cycle_together

        if self.draft is None:
            raise ValueError("this forward service has no draft; speculative systems need --draft")
        missing, seen = [], set()
        for prompt, tokens, temperature, seed, k in requests:
            key = (self.draft_key, tuple(prompt), temperature, seed)
            done = {(n, kk) for n, kk, _ in self.prepared_sampling.get(key, [])}
            if (tokens, k) in done or (key, tokens, k) in seen:
                continue
            seen.add((key, tokens, k))
            missing.append((list(prompt), tokens, temperature, seed, k))
        for request, cycles in zip(missing, cycle_together(self, missing) if missing else []):
            prompt, tokens, temperature, seed, k = request
            self.prepared_sampling.setdefault((self.draft_key, tuple(prompt), temperature, seed), []).append(
                (tokens, k, cycles))

    def sampled_traces(self, requests: list[tuple[list[int], int, float, int]]) -> None:
        """Compute the target's own sampled decodes of `requests` (prompt, max_new_tokens, temperature, seed) not yet
        computed, all together (`specter.numerics.sampling.decode_together`), for `sampled_trace`. With recorders
        to compute, each is decoded alone (their values are per one-row forward)."""
        from specter.numerics.sampling import decode_together

        keys = list(dict.fromkeys((tuple(p), n, t, s) for p, n, t, s in requests))
        missing = [key for key in keys if key not in self.traces]
        if self.recorders:
            for prompt, tokens, temperature, seed in missing:
                self.sampled_trace(list(prompt), tokens, temperature, seed)
            return
        for key, trace in zip(missing, decode_together(self, [(list(k[0]), *k[1:]) for k in missing])
                              if missing else []):
            self.traces[key] = trace

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

    def recorded_window(self, prompt: list[int], max_new_tokens: int, t: int,
                        k: int) -> tuple[PromptTrace, DraftWindow] | None:
        """The recorded greedy decode of `prompt` and its memoized window of at least k proposals at rebase point t,
        or None where either is not memoized; never computes (a live run reads it inside its timed region)."""
        trace = self.traces.get((tuple(prompt), max_new_tokens))
        window = None if trace is None else trace.windows.get((self.draft_key, t))
        return None if window is None or window.kmax < k else (trace, window)

    def window(self, trace: PromptTrace, t: int, k: int, own_kv: bool = False) -> DraftWindow:
        """The speculative window of at least k proposals at rebase point t (memoized, extended on demand; a batch of
        one where `walk` or `windows` did not compute it beforehand).

        `own_kv`: the draft keeps its own KV of the committed prefix (a draft with separate weights and cache, as
        SpecMoEOff's) instead of reading the target's."""
        return self.windows([(trace, t, k)], own_kv)[0]

    def window_key(self, own_kv: bool = False) -> str:
        """What a trace's windows are memoized under (`PromptTrace.windows[(key, t)]`): the draft, and whether it
        keeps a KV of its own."""
        return self.draft_key + (":own-kv" if own_kv else "")

    def windows(self, requests: list[tuple[PromptTrace, int, int]], own_kv: bool = False) -> list[DraftWindow]:
        """The windows of `requests` (trace, rebase point t, at least k proposals), those not memoized computed
        together: one batch per draft step and one per verification length (`_compute`)."""
        key = self.window_key(own_kv)
        missing: dict[tuple[int, int], list] = {}
        for trace, t, k in requests:
            cached = trace.windows.get((key, t))
            if cached is None or cached.kmax < k:
                row = missing.setdefault((id(trace), t), [trace, t, k])
                row[2] = max(row[2], k)
        if missing:
            self._compute([tuple(row) for row in missing.values()], own_kv, key)
        return [trace.windows[(key, t)] for trace, t, _ in requests]

    def walk(self, paths: list[WindowPath], own_kv: bool = False) -> None:
        """Compute every window the greedy runs of `paths` will visit, in rounds: each round advances every path
        through the windows already memoized, then computes the windows the paths stopped at in one batch
        (`windows`). A path's rebase points are those `decode_speculatively` visits, so the runs afterwards find
        every window memoized."""
        pending = [p for p in paths if not p.done]
        while pending:
            key = self.window_key(own_kv)
            need = []
            for path in pending:
                while not path.done:
                    k = path.next_k()
                    window = path.trace.windows.get((key, path.t))
                    if window is None or window.kmax < k:
                        need.append((path.trace, path.t, k))
                        break
                    path.advance(window.accepted(k), k)
            pending = [p for p in pending if not p.done]
            if need:
                self.windows(need, own_kv)

    def _compute(self, rows: list[tuple[PromptTrace, int, int]], own_kv: bool, key: str) -> None:
        """The windows of `rows` (trace, t, k), memoized under `key`. Rows are ordered by K (largest first), so the
        rows still drafting at step i are the batch's first ones; the target then verifies each K's rows together.
        The batch's composition is a function of the rows asked for, so the same runs give the same bits."""
        if self.draft is None:
            raise ValueError("this forward service has no draft; speculative systems need --draft")
        rows = sorted(rows, key=lambda r: -r[2])  # stable: the callers' order within one K
        for trace, _, _ in rows:
            if trace._cache is None:  # read back from disk: rebuild the target's cache over the committed sequence
                _, _, trace._cache = _forward(self.target, trace.seq[:-1], None)
                self.forward_calls += 1
            if own_kv and self.draft_key not in trace._draft_caches:
                _, _, trace._draft_caches[self.draft_key] = _forward(self.draft, trace.seq[:-1], None)
                self.forward_calls += 1
        kv = [(trace._draft_caches[self.draft_key] if own_kv else trace._cache, t - 1) for trace, t, _ in rows]
        cache, mask = _prefix_batch(kv)
        tokens = torch.tensor([[trace.seq[t - 1]] for trace, t, _ in rows])
        positions = torch.tensor([[t - 1] for _, t, _ in rows])
        drafted: list[list[int]] = [[] for _ in rows]
        draft_routes: list[list[TokenRoutes]] = [[] for _ in rows]
        for i in range(rows[0][2]):
            active = sum(1 for _, _, k in rows if k > i)
            if active < tokens.shape[0]:  # the rows of smaller K are done: keep the first `active`
                cache.batch_select_indices(torch.arange(active))
                tokens, positions, mask = tokens[:active], positions[:active], mask[:active]
            logits, routes, cache, mask = _forward_rows(self.draft, tokens, cache, mask, positions)
            self.forward_calls += 1
            tokens = logits[:, -1].argmax(-1, keepdim=True)
            positions = positions + 1
            for b in range(active):
                drafted[b].append(int(tokens[b, 0]))
                draft_routes[b].append(routes[b][0])
        start = 0
        while start < len(rows):  # the verifications, one batch per K
            k = rows[start][2]
            end = start + sum(1 for _, _, kk in rows[start:] if kk == k)
            group = range(start, end)
            cache, mask = _prefix_batch([(rows[b][0]._cache, rows[b][1] - 1) for b in group])
            ids = torch.tensor([[rows[b][0].seq[rows[b][1] - 1], *drafted[b]] for b in group])
            positions = torch.tensor([[rows[b][1] - 1 + j for j in range(k + 1)] for b in group])
            logits, routes, _, _ = _forward_rows(self.target, ids, cache, mask, positions)
            self.forward_calls += 1
            argmax = logits.argmax(-1).tolist()
            for i, b in enumerate(group):
                trace, t, _ = rows[b]
                trace.windows[(key, t)] = DraftWindow(t, drafted[b], draft_routes[b], argmax[i], routes[i])
            start = end


class LiveNumerics:
    """The numerics one live decode computed, served to its simulated twin in place of the forward service's: the
    prompt's trace is the live run's (its tokens, the prefill's and every step's routes) and each window is the one the
    live draft proposed and the live target verified (`decode.py` keeps them on the trace as a recorded trace keeps
    its own). Nothing is decoded again: a twin that asks for a window the live run did not visit is a bug, and says
    so. Anything else (the draft's key) comes from the run's forward service; a live run's warm-up prompts were
    decoded live too (`specter.runs.live.warm_up_traces`)."""

    def __init__(self, service: ForwardService, trace: PromptTrace) -> None:
        self.service, self.live = service, trace

    def __getattr__(self, name: str):
        return getattr(self.service, name)

    def trace(self, prompt: list[int], max_new_tokens: int, calibration: bool = False) -> PromptTrace:
        if list(prompt) == self.live.prompt and not calibration:
            return self.live
        return self.service.trace(prompt, max_new_tokens, calibration)

    def window(self, trace: PromptTrace, t: int, k: int, own_kv: bool = False) -> DraftWindow:
        return self.windows([(trace, t, k)], own_kv)[0]

    def windows(self, requests: list[tuple[PromptTrace, int, int]], own_kv: bool = False) -> list[DraftWindow]:
        key = self.service.window_key(own_kv)
        out = []
        for trace, t, k in requests:
            window = trace.windows.get((key, t)) if trace is self.live else None
            if window is None or window.kmax < k:
                raise RuntimeError(f"the twin of a live run asked for a window of {k} at position {t} that the live "
                                   "run did not draft; please report this")
            out.append(window)
        return out


@dataclass
class WindowPath:
    """The rebase points a greedy speculative run visits over one trace, as `decode_speculatively` visits them: the
    first after the prefill's token, then each verification commits its accepted proposals and the target's own
    token. `choose(committed)` gives each cycle's K; `observe(accepted, checked)`, if given, learns from it (the
    online governor)."""

    trace: PromptTrace
    tokens: int  # the run's max_new_tokens
    choose: Callable[[int], int]
    observe: Callable[[int, int], None] | None = None
    t: int = 0
    committed: int = 1

    def __post_init__(self) -> None:
        self.t = self.t or len(self.trace.prompt) + 1
        self._k: int | None = None

    @property
    def done(self) -> bool:
        return self.committed >= self.tokens

    def next_k(self) -> int:
        if self._k is None:
            self._k = self.choose(self.committed)
        return self._k

    def advance(self, accepted: int, k: int) -> None:
        self.committed += accepted + 1
        self.t += accepted + 1
        if self.observe is not None:
            self.observe(accepted, accepted + 1 if accepted < k else k)
        self._k = None
