"""Sampling (temperature > 0): the target's own sampling, and speculative rejection sampling that keeps its
distribution.

Rejection sampling (Leviathan et al. 2023; Chen et al. 2023): proposal d_i drawn from the draft's q_i is accepted with
probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection the token is drawn from norm(max(0, p_i - q_i)); when
all K are accepted a bonus token is drawn from p_{K+1}. The committed tokens are then distributed exactly as the
target's own samples. Sampling runs are live (no memo): each seed is its own sequence.
"""

from __future__ import annotations

import torch

from specter.models.adapter import MoEModel
from specter.numerics.forward import DraftWindow, TokenRoutes, _crop, _forward


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
