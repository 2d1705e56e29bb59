"""Sampling (temperature > 0): the target's own sampling, and speculative rejection sampling that keeps its
distribution.

Rejection sampling (Leviathan et al. 2023; Chen et al. 2023): proposal d_i drawn from the draft's q_i is accepted with
probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection the token is drawn from norm(max(0, p_i - q_i)); when
all K are accepted a bonus token is drawn from p_{K+1}. The committed tokens are then distributed exactly as the
target's own samples. Sampling runs are live (no memo): each seed is its own sequence.

A run's sampled decodes are computed before it schedules, every prompt of every run together, as the greedy windows
are (`specter.numerics.forward`): the target's own sampled decodes step in lockstep, one batched forward per token
(`decode_together`), and the speculative sessions of a fixed K draft and verify in lockstep, one batched forward per
draft step and one per verification (`cycle_together`), each row reading its own left-padded copy of its session's
KV. Each prompt keeps its own generator and draws in the same order as alone, so only the logits' last bits depend on
the batch. The run then replays its sessions' cycles (`PreparedSession`); a session nothing prepared is computed
alone, one row at a time (`SamplingSession.cycle`).
"""

from __future__ import annotations

import torch

from specter.models.adapter import MoEModel
from specter.numerics.passes import (
    DraftWindow,
    PromptTrace,
    TokenRoutes,
    _crop,
    _forward,
    _forward_rows,
    _prefix_batch,
)


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.double() / temperature, dim=-1)


def sample(p: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(p.float(), 1, generator=generator))


def rejection_sample(p: torch.Tensor, q: torch.Tensor, proposals: list[int],
                     generator: torch.Generator) -> tuple[int, int]:
    """p [K+1, V] target, q [K, V] draft probabilities, `proposals` d_1..d_K drawn from q.
    Returns (accepted count a, the token committed after them)."""
    for i, d in enumerate(proposals):
        ratio = float(p[i, d] / q[i, d]) if q[i, d] > 0 else 1.0
        if float(torch.rand((), generator=generator, dtype=torch.float64)) < min(1.0, ratio):
            continue
        residual = torch.clamp(p[i] - q[i], min=0)
        total = residual.sum()
        return i, sample(residual / total if total > 0 else p[i], generator)
    return len(proposals), sample(p[len(proposals)], generator)


class SamplingSession:
    """One sampled decode of a prompt, shared by the target and draft: the committed tokens and the target's KV.
    `owner`: the forward service whose `forward_calls` counts every forward the session runs (a record's
    `extra.live_forwards`), or None."""

    def __init__(self, target: MoEModel, draft: MoEModel | None, prompt: list[int], temperature: float,
                 seed: int, owner=None) -> None:
        self.target, self.draft, self.temperature, self.owner = target, draft, temperature, owner
        self.generator = torch.Generator().manual_seed(seed)
        logits, self.prefill_routes, self.cache = self._forward(target, prompt, None)
        self.seq = list(prompt) + [sample(probabilities(logits[-1], temperature), self.generator)]
        self.prompt_len = len(prompt)

    def _forward(self, model: MoEModel, tokens: list[int], cache, *recording):
        if self.owner is not None:
            self.owner.forward_calls += 1
        return _forward(model, tokens, cache, *recording)

    def step(self, recorders=(), extras: dict | None = None) -> TokenRoutes:
        """The target alone: one token sampled from p; returns the routes of the token it read (and appends the
        recorders' values to `extras`)."""
        logits, routes, self.cache = self._forward(self.target, [self.seq[-1]], self.cache, recorders, extras)
        self.seq.append(sample(probabilities(logits[-1], self.temperature), self.generator))
        return routes[0]

    def cycle(self, k: int) -> tuple[DraftWindow, int, list[int]]:
        """One speculative window of k sampled proposals, verified by rejection sampling.
        Returns (the window's numerics, accepted count, committed tokens)."""
        t = len(self.seq)
        pending = self.seq[-1]
        draft_cache = _crop(self.cache, t - 1)
        tokens, q, draft_routes, token = [], [], [], pending
        for _ in range(k):
            logits, routes, draft_cache = self._forward(self.draft, [token], draft_cache)
            draft_routes.append(routes[0])
            q.append(probabilities(logits[-1], self.temperature))
            token = sample(q[-1], self.generator)
            tokens.append(token)
        logits, verify_routes, cache = self._forward(self.target, [pending, *tokens], _crop(self.cache, t - 1))
        p = probabilities(logits, self.temperature)
        accepted, last = rejection_sample(p, torch.stack(q), tokens, self.generator)
        committed = tokens[:accepted] + [last]
        excess = cache.get_seq_length() - (t + accepted)  # keep the target's KV of the accepted inputs only
        if excess > 0:
            cache.crop(-excess)
        self.cache = cache
        self.seq += committed
        window = DraftWindow(t, tokens, draft_routes, logits.argmax(-1).tolist(), verify_routes)
        return window, accepted, committed


def _append(cache, batch_cache, row: int, start: int, count: int) -> None:
    """Append positions [start, start + count) of row `row` of a batch KV cache to a one-row cache (its layers keep
    their whole history: `new_cache` records the past of sliding-window layers, and nothing here crops them)."""
    for layer, batch_layer in zip(cache.layers, batch_cache.layers):
        layer.update(batch_layer.keys[row : row + 1, :, start : start + count],
                     batch_layer.values[row : row + 1, :, start : start + count])


def decode_together(service, requests: list[tuple[list[int], int, float, int]]) -> list[PromptTrace]:
    """The target's own sampled decodes of `requests` (prompt, max_new_tokens, temperature, seed), in lockstep: each
    prompt's prefill alone (its first token drawn as `SamplingSession` draws it), then one batched forward per token
    over every decode still running. Returns the traces, in the order asked (no recorder values: callers with
    recorders decode one prompt at a time)."""
    sessions = [SamplingSession(service.target, None, prompt, temperature, seed, owner=service)
                for prompt, _, temperature, seed in requests]
    order = sorted(range(len(requests)), key=lambda i: -requests[i][1])  # longest first: the finished ones drop off
    rows = [sessions[i] for i in order]
    steps = [requests[i][1] - 1 for i in order]
    routes: list[list[TokenRoutes]] = [[] for _ in rows]
    cache, mask = _prefix_batch([(s.cache, s.prompt_len) for s in rows])
    positions = torch.tensor([[s.prompt_len] for s in rows])
    for j in range(steps[0] if rows else 0):
        active = sum(1 for n in steps if n > j)
        if active < mask.shape[0]:
            cache.batch_select_indices(torch.arange(active))
            mask, positions = mask[:active], positions[:active]
        ids = torch.tensor([[s.seq[-1]] for s in rows[:active]])
        service.forward_calls += 1
        logits, step_routes, cache, mask = _forward_rows(service.target, ids, cache, mask, positions)
        positions = positions + 1
        for b, s in enumerate(rows[:active]):
            routes[b].append(step_routes[b][0])
            s.seq.append(sample(probabilities(logits[b, -1], s.temperature), s.generator))
    traces: list[PromptTrace | None] = [None] * len(requests)
    for b, i in enumerate(order):
        s = rows[b]
        traces[i] = PromptTrace(list(requests[i][0]), s.seq[s.prompt_len :], s.prefill_routes, routes[b], {})
    return traces


def cycle_together(service, requests: list[tuple[list[int], int, float, int, int]]) -> list[list[tuple]]:
    """The speculative sampled decodes of `requests` (prompt, max_new_tokens, temperature, seed, K), in lockstep:
    each round, every session still short of its tokens drafts K proposals (one batched forward per draft step, the
    rows of larger K first) and the target verifies each K's rows in one batched forward; each row then draws its
    rejection sampling as `SamplingSession.cycle` does. Returns each request's cycles, (K, window, accepted, committed
    tokens) each, in the order asked."""
    sessions = [SamplingSession(service.target, service.draft, prompt, temperature, seed, owner=service)
                for prompt, _, temperature, seed, _ in requests]
    cycles: list[list[tuple]] = [[] for _ in requests]
    committed = [1] * len(requests)  # the prefill's token
    while True:
        live = [i for i in range(len(requests)) if committed[i] < requests[i][1]]
        if not live:
            return cycles
        live.sort(key=lambda i: -requests[i][4])  # stable: the callers' order within one K
        ks = [requests[i][4] for i in live]
        rows = [sessions[i] for i in live]
        starts = [len(s.seq) for s in rows]  # t: committed tokens
        cache, mask = _prefix_batch([(s.cache, t - 1) for s, t in zip(rows, starts)])
        tokens = torch.tensor([[s.seq[-1]] for s in rows])
        positions = torch.tensor([[t - 1] for t in starts])
        drafted: list[list[int]] = [[] for _ in rows]
        draft_routes: list[list[TokenRoutes]] = [[] for _ in rows]
        q: list[list[torch.Tensor]] = [[] for _ in rows]
        for step in range(ks[0]):
            active = sum(1 for k in ks if k > step)
            if active < tokens.shape[0]:
                cache.batch_select_indices(torch.arange(active))
                tokens, positions, mask = tokens[:active], positions[:active], mask[:active]
            service.forward_calls += 1
            logits, routes, cache, mask = _forward_rows(service.draft, tokens, cache, mask, positions)
            positions = positions + 1
            drawn = []
            for b in range(active):
                q[b].append(probabilities(logits[b, -1], rows[b].temperature))
                drawn.append(sample(q[b][-1], rows[b].generator))
                drafted[b].append(drawn[-1])
                draft_routes[b].append(routes[b][0])
            tokens = torch.tensor([[d] for d in drawn])
        start = 0
        while start < len(rows):  # the verifications, one batch per K
            k = ks[start]
            group = range(start, start + sum(1 for kk in ks[start:] if kk == k))
            cache, mask = _prefix_batch([(rows[b].cache, starts[b] - 1) for b in group])
            ids = torch.tensor([[rows[b].seq[-1], *drafted[b]] for b in group])
            positions = torch.tensor([[starts[b] - 1 + j for j in range(k + 1)] for b in group])
            service.forward_calls += 1
            logits, routes, cache, _ = _forward_rows(service.target, ids, cache, mask, positions)
            width = mask.shape[1]  # the batch's cached positions: row b's verified inputs follow them
            for r, b in enumerate(group):
                s = rows[b]
                p = probabilities(logits[r], s.temperature)
                accepted, last = rejection_sample(p, torch.stack(q[b]), drafted[b], s.generator)
                new = drafted[b][:accepted] + [last]
                _append(s.cache, cache, r, width, accepted + 1)  # the target's KV of the accepted inputs only
                window = DraftWindow(starts[b], drafted[b], draft_routes[b], logits[r].argmax(-1).tolist(), routes[r])
                s.seq += new
                i = live[b]
                cycles[i].append((k, window, accepted, new))
                committed[i] += len(new)
            start = group.stop


class PreparedSession:
    """A sampling session whose cycles were computed beforehand (`cycle_together`), at one fixed K each: the first
    cycle's K chooses which (a K nothing prepared is computed alone, by `live()`), and every later cycle must be asked
    for at the same K."""

    def __init__(self, prepared: list[list[tuple]], live) -> None:
        self.prepared, self.live = prepared, live
        self.cycles: list[tuple] | None = None
        self.session = None
        self.next = 0

    def cycle(self, k: int) -> tuple[DraftWindow, int, list[int]]:
        if self.session is not None:
            return self.session.cycle(k)
        if self.cycles is None:
            self.cycles = next((c for c in self.prepared if c and c[0][0] == k), None)
            if self.cycles is None:
                self.session = self.live()
                return self.session.cycle(k)
        if self.next >= len(self.cycles) or self.cycles[self.next][0] != k:
            have = f"K = {self.cycles[self.next][0]}" if self.next < len(self.cycles) else "no cycle"
            raise RuntimeError(f"sampled cycle {self.next + 1} was prepared with {have}, and is asked for at K = {k}")
        _, window, accepted, committed = self.cycles[self.next]
        self.next += 1
        return window, accepted, committed
