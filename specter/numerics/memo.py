"""Recorded numerics on disk: a `ForwardService`'s traces and windows, saved once and replayed by later processes.

The workflow runs every system as its own `specter run` process; `specter sweep --memo-out` computes the numerics those
runs need (the target's greedy decode of each prompt, the warm-up traces, and each draft's windows along the rebase
points each K visits) and saves them here, and `specter run --memo FILE` starts from them, so a run pays only for
scheduling. A memo is tied to its target by the model hash (config and weights) and keyed per draft by the draft's
content hash; anything a run needs that the memo lacks is computed live, and the record says how many forwards that took
(`extra.live_forwards`), so a replay that was not one shows.

Format: a pickle of {"format", "model_hash", "traces"}; memos are workflow intermediates written by this package, and
loading one runs pickle, so load only memos you made.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from specter.errors import SpecterError
from specter.io import atomic_write
from specter.numerics.forward import ForwardService

FORMAT = "specter-memo-1"


def draft_key(draft_dir: str | Path) -> str:
    """A draft's identity for memoized windows: a hash of its sidecar and expert tensors."""
    from specter.quant.meta import files_sha256

    return f"draft:{files_sha256([Path(draft_dir) / 'meta.json', Path(draft_dir) / 'experts.safetensors'])[:16]}"


def save_memo(service: ForwardService, path: str | Path, model_hash: str) -> int:
    """Write the service's traces (with their windows) atomically; returns the number of traces."""
    memo = {"format": FORMAT, "model_hash": model_hash, "traces": service.traces}
    atomic_write(path, lambda f: pickle.dump(memo, f, protocol=pickle.HIGHEST_PROTOCOL), binary=True)
    return len(service.traces)


def load_memo(service: ForwardService, path: str | Path, model_hash: str) -> int:
    """Add a memo's traces and windows to the service (what it already holds wins); returns the traces added."""
    path = Path(path)
    if not path.is_file():
        raise SpecterError(f"--memo {str(path)!r} does not exist; record it with `specter sweep --memo-out`")
    try:
        with path.open("rb") as f:
            memo = pickle.load(f)
    except (pickle.UnpicklingError, EOFError, AttributeError, ModuleNotFoundError) as err:
        raise SpecterError(f"--memo {str(path)!r} is not a memo from `specter sweep --memo-out` ({err}); "
                           "record it again") from None
    if not isinstance(memo, dict) or memo.get("format") != FORMAT:
        raise SpecterError(f"--memo {str(path)!r} is not a {FORMAT} file; record it again with "
                           "`specter sweep --memo-out`")
    if memo["model_hash"] != model_hash:
        raise SpecterError(f"--memo {str(path)!r} was recorded on another model (hash {memo['model_hash'][:12]}, "
                           f"this one {model_hash[:12]}); record it again on this model")
    added = 0
    for key, trace in memo["traces"].items():
        mine = service.traces.get(key)
        if mine is None:
            service.traces[key] = trace
            added += 1
        else:
            for wkey, window in trace.windows.items():
                if wkey not in mine.windows or mine.windows[wkey].kmax < window.kmax:
                    mine.windows[wkey] = window
    return added
