"""The `fidelity` table: one row per (draft, K) from `specter fidelity`'s JSON summaries, each checked to hold what the
table reads."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from specter.errors import SpecterError
from specter.io import not_a_file


def fidelity_table(paths: list[str | Path]) -> pd.DataFrame:
    """One row per (draft, K) from `specter fidelity` JSON summaries: the paper's hard / soft / mismatch shares of the
    draft's ranked experts against the target's, the set overlap beside (exact = hard + soft, partial, none), top-1
    agreement, and per K the mean accepted length, acceptance rate (accepted / checked) and window utilization
    (accepted / K)."""
    rows = []
    for path in paths:
        s = _fidelity_summary(Path(path))
        for a in s["acceptance"]:
            rows.append(dict(model=Path(s["model"]).name, dataset=s["dataset"], method=s["method"], bits=s["bits"],
                             group_size=s["group_size"], expert_hard=s["expert_hard"], expert_soft=s["expert_soft"],
                             expert_mismatch=s["expert_mismatch"], expert_exact=s["expert_exact"],
                             expert_partial=s["expert_partial"], expert_none=s["expert_none"],
                             top1_agreement=s["top1_agreement"], k=a["k"], mean_accepted=a["mean_accepted"],
                             acceptance_rate=a["acceptance_rate"], window_utilization=a["window_utilization"],
                             windows=a["windows"]))
    return pd.DataFrame(rows)


_FIDELITY_KEYS = ("model", "dataset", "method", "bits", "group_size", "expert_hard", "expert_soft", "expert_mismatch",
                  "expert_exact", "expert_partial", "expert_none", "top1_agreement", "acceptance")
_ACCEPTANCE_KEYS = ("k", "mean_accepted", "acceptance_rate", "window_utilization", "windows")


def _fidelity_summary(path: Path) -> dict:
    """A `specter fidelity` JSON summary, checked to have what the table reads."""
    if (why := not_a_file(path)) is not None:
        raise SpecterError(f"fidelity summary {str(path)!r} {why}; run `specter fidelity` (it writes the "
                           ".json beside its --out CSV)")
    try:
        s = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecterError(f"{path} is not a JSON fidelity summary ({err}); run `specter fidelity` again") from None
    missing = [k for k in _FIDELITY_KEYS if not isinstance(s, dict) or k not in s]
    if not missing and not (isinstance(s["acceptance"], list) and all(
            isinstance(a, dict) and set(_ACCEPTANCE_KEYS) <= set(a) for a in s["acceptance"])):
        missing = [f"acceptance (a list of {{{', '.join(_ACCEPTANCE_KEYS)}}})"]
    if missing:
        raise SpecterError(f"{path} is not a fidelity summary (it lacks {', '.join(missing)}); give the .json "
                           "`specter fidelity` writes")
    return s
