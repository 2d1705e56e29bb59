"""`specter fidelity`: how well a draft predicts its target, on held-out prompts.

For each prompt the target first generates greedily (its committed sequence). Then, on that same sequence:
- expert sets: per (position, MoE layer), the draft's top-k expert set against the target's, as exact (equal sets),
  partial (overlapping, not equal) or none; both models read the committed prefix (teacher forcing);
- top-1 agreement: the draft's next-token argmax equals the target's;
- acceptance: from every `stride`-th position the draft speculates 16 tokens greedily on the committed prefix; the
  accepted length for K is the number of leading tokens equal to the committed ones, capped at K. Reported for K in
  1..16 as mean accepted length and acceptance rate (accepted / K).
The draft recomputes the prefix's KV with its own experts here; Specter's runtime reuses the target's KV instead, so
these acceptance figures are for a slightly weaker draft than the runtime's.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specter.io import atomic_write, atomic_write_text
from specter.models.adapter import MoEModel

MAX_K = 16


@dataclass(frozen=True)
class FidelitySummary:
    prompts: int
    positions: int  # (prompt, position) pairs compared for expert sets and top-1
    expert_exact: float  # share of (position, layer) with equal sets
    expert_partial: float
    expert_none: float
    top1_agreement: float
    acceptance: list[dict]  # [{k, mean_accepted, acceptance_rate, windows}]


def _routes(moe: MoEModel, ids: torch.Tensor) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """({layer: indices [T, k]}, argmax [T]) of one teacher-forced forward over `ids` [1, T]."""
    with moe.record_routing() as log, torch.no_grad():
        logits = moe.model(ids).logits[0]  # [T, V]
    return {layer: calls[-1] for layer, calls in log.items()}, logits.argmax(-1)


def fidelity(target: MoEModel, draft: MoEModel, prompts: list[list[int]], new_tokens: int = 64, stride: int = 4,
             progress: bool = True) -> tuple[FidelitySummary, list[dict]]:
    """Compare `draft` to `target` on `prompts` (token id lists); returns the summary and tidy rows."""
    rows: list[dict] = []
    counts = {"exact": 0, "partial": 0, "none": 0}
    top1_hits = top1_total = 0
    accepted_by_window: list[int] = []
    for p_idx, prompt in enumerate(tqdm(prompts, desc="fidelity", disable=not progress)):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            seq = target.model.generate(ids, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens,
                                        pad_token_id=target.config.pad_token_id)
        t_routes, t_next = _routes(target, seq)
        d_routes, d_next = _routes(draft, seq)
        start = len(prompt) - 1  # positions whose next token was generated
        for pos in range(start, seq.shape[1] - 1):
            agree = bool(d_next[pos] == t_next[pos])
            top1_hits += agree
            top1_total += 1
            for layer in t_routes:
                t_set = set(t_routes[layer][pos].tolist())
                d_set = set(d_routes[layer][pos].tolist())
                overlap = len(t_set & d_set)
                relation = "exact" if t_set == d_set else ("partial" if overlap else "none")
                counts[relation] += 1
                rows.append(dict(prompt_index=p_idx, position=pos, layer=layer,
                                 target_experts=" ".join(map(str, sorted(t_set))),
                                 draft_experts=" ".join(map(str, sorted(d_set))), overlap=overlap, relation=relation,
                                 top1_agree=int(agree)))
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
            accepted_by_window.append(accepted)
    total = sum(counts.values())
    acceptance = []
    for k in range(1, MAX_K + 1):
        capped = [min(a, k) for a in accepted_by_window]
        mean = sum(capped) / len(capped) if capped else 0.0
        acceptance.append(dict(k=k, mean_accepted=mean, acceptance_rate=mean / k, windows=len(capped)))
    summary = FidelitySummary(
        prompts=len(prompts),
        positions=top1_total,
        expert_exact=counts["exact"] / total,
        expert_partial=counts["partial"] / total,
        expert_none=counts["none"] / total,
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
