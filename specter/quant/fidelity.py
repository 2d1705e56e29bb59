"""`specter fidelity`: how well a draft predicts its target, on held-out prompts.

For each prompt the target first generates greedily (its committed sequence). Then, on that same sequence:
- expert choices: per (position, MoE layer), the draft's top-k experts against the target's, both models reading the
  committed prefix (teacher forcing). As the paper counts them (v1 §2.5, Fig 6): `hard` (the same experts in the same
  rank order), `soft` (the same set in another order) and `mismatch` (another set); hard + soft is the share of equal
  sets. The set overlap is kept beside: `exact` (equal sets: hard + soft), `partial` (overlapping, not equal) and
  `none` (disjoint);
- top-1 agreement: the draft's next-token argmax equals the target's;
- acceptance: from every `stride`-th position the draft speculates 16 tokens greedily on the committed prefix; the
  accepted length for K is the number of leading tokens equal to the committed ones, capped at K. Reported for K in
  1..16 as the mean accepted length, the acceptance rate (accepted proposals over proposals checked, a proposal being
  checked when all before it were accepted: `specter.metrics.acceptance_rate`, as in run records) and the window
  utilization (accepted / K: `specter.metrics.window_utilization`).
The draft recomputes the prefix's KV with its own experts here; Specter's runtime reuses the target's KV instead, so
these acceptance figures are for a slightly weaker draft than the runtime's.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specter.io import atomic_write, atomic_write_text
from specter.metrics import acceptance_rate, window_utilization
from specter.models.adapter import MoEModel
from specter.progress import steps

MAX_K = 16


@dataclass(frozen=True)
class FidelitySummary:
    prompts: int
    positions: int  # (prompt, position) pairs compared for expert sets and top-1
    expert_hard: float  # share of (position, layer) with the same experts in the same rank order
    expert_soft: float  # the same set in another order
    expert_mismatch: float  # another set
    expert_exact: float  # equal sets (hard + soft)
    expert_partial: float  # overlapping sets, not equal
    expert_none: float  # disjoint sets
    top1_agreement: float
    acceptance: list[dict]  # [{k, mean_accepted, acceptance_rate, window_utilization, windows}]


def _routes(moe: MoEModel, ids: torch.Tensor) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """({layer: indices [T, k]}, argmax [T]) of one teacher-forced forward over `ids` [1, T]."""
    with moe.record_routing() as log, torch.no_grad():
        logits = moe.model(ids).logits[0]  # [T, V]
    return {layer: calls[-1] for layer, calls in log.items()}, logits.argmax(-1)


def relations(target: list[int], draft: list[int]) -> tuple[str, str, int]:
    """(order relation: hard | soft | mismatch, set relation: exact | partial | none, overlap) of a draft's ranked
    top-k experts against the target's (each as its router returned them, best first)."""
    t_set, d_set = set(target), set(draft)
    overlap = len(t_set & d_set)
    if t_set != d_set:
        return "mismatch", "partial" if overlap else "none", overlap
    return ("hard" if list(target) == list(draft) else "soft"), "exact", overlap


def expert_agreement(target: dict[int, torch.Tensor], draft: dict[int, torch.Tensor],
                     positions: range, prompt_index: int = 0, top1: list[bool] | None = None) -> list[dict]:
    """One row per (position, layer) of `positions`: the target's and the draft's ranked experts (routes as
    {layer: indices [T, k]}) and their relations (`relations`)."""
    rows = []
    for i, pos in enumerate(positions):
        for layer in target:
            t, d = target[layer][pos].tolist(), draft[layer][pos].tolist()
            order, overlap_relation, overlap = relations(t, d)
            rows.append(dict(prompt_index=prompt_index, position=pos, layer=layer,
                             target_experts=" ".join(map(str, t)), draft_experts=" ".join(map(str, d)),
                             match=order, overlap=overlap, relation=overlap_relation,
                             top1_agree=int(top1[i]) if top1 is not None else None))
    return rows


def agreement_shares(rows: list[dict]) -> dict[str, float]:
    """The shares of `expert_agreement` rows in each relation: expert_hard, _soft, _mismatch, _exact, _partial,
    _none."""
    total = len(rows)
    if not total:
        raise ValueError("no (position, layer) pairs to compare")
    out = {f"expert_{m}": sum(r["match"] == m for r in rows) / total for m in ("hard", "soft", "mismatch")}
    out.update({f"expert_{m}": sum(r["relation"] == m for r in rows) / total for m in ("exact", "partial", "none")})
    return out


def fidelity(target: MoEModel, draft: MoEModel, prompts: list[list[int]], new_tokens: int = 64, stride: int = 4,
             progress: bool = True) -> tuple[FidelitySummary, list[dict]]:
    """Compare `draft` to `target` on `prompts` (token id lists); returns the summary and tidy rows."""
    rows: list[dict] = []
    top1_hits = top1_total = 0
    accepted_by_window: list[int] = []
    for p_idx, prompt in enumerate(steps(prompts, "fidelity", unit="prompt") if progress else prompts):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            seq = target.model.generate(ids, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens,
                                        pad_token_id=target.config.pad_token_id)
        t_routes, t_next = _routes(target, seq)
        d_routes, d_next = _routes(draft, seq)
        start = len(prompt) - 1  # positions whose next token was generated
        positions = range(start, seq.shape[1] - 1)
        agree = [bool(d_next[pos] == t_next[pos]) for pos in positions]
        top1_hits += sum(agree)
        top1_total += len(agree)
        rows += expert_agreement(t_routes, d_routes, positions, p_idx, agree)
        committed = seq[0].tolist()
        for pos in range(len(prompt), len(committed) - 1, stride):
            horizon = min(MAX_K, len(committed) - pos)
            with torch.no_grad():
                spec = draft.model.generate(torch.tensor([committed[:pos]]), max_new_tokens=horizon,
                                            min_new_tokens=horizon, do_sample=False,
                                            pad_token_id=target.config.pad_token_id)[0, pos:].tolist()
            accepted = 0
            while accepted < horizon and spec[accepted] == committed[pos + accepted]:
                accepted += 1
            accepted_by_window.append((accepted, horizon))
    acceptance = []
    for k in range(1, MAX_K + 1):
        # a window of K proposes only as far as the text goes (its horizon): a window cut short by the end of the text
        # proposed fewer, and none of those it never proposed was rejected
        proposed = [min(k, horizon) for _, horizon in accepted_by_window]
        capped = [min(a, n) for (a, _), n in zip(accepted_by_window, proposed)]
        accepted, checked = sum(capped), sum(min(a + 1, n) for a, n in zip(capped, proposed))
        acceptance.append(dict(
            k=k, mean_accepted=accepted / len(capped) if capped else 0.0,
            acceptance_rate=acceptance_rate(accepted, checked) if checked else 0.0,
            window_utilization=window_utilization(accepted, sum(proposed)) if capped else 0.0, windows=len(capped)))
    summary = FidelitySummary(
        prompts=len(prompts),
        positions=top1_total,
        **agreement_shares(rows),
        top1_agreement=top1_hits / top1_total,
        acceptance=acceptance,
    )
    return summary, rows


def write_fidelity(summary: FidelitySummary, rows: list[dict], out_csv: str | Path, meta: dict) -> Path:
    """Write the tidy CSV at `out_csv` and the JSON summary beside it (same name, .json); returns the JSON path."""
    out_csv = Path(out_csv)
    atomic_write(out_csv, lambda f: _write_rows(f, rows))
    json_path = out_csv.with_suffix(".json")
    atomic_write_text(json_path, json.dumps({**meta, **asdict(summary)}, indent=2) + "\n")
    return json_path


def _write_rows(f, rows: list[dict]) -> None:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
