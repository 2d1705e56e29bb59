"""Recorded numerics on disk: a `ForwardService`'s traces and windows, saved once and replayed by later processes.

The workflow runs every system as its own `specter run` process; `specter sweep --memo-out` computes the numerics those
runs need (the target's greedy decode of each prompt, the warm-up traces, and each draft's windows along the rebase
points each K visits) and saves them here, and `specter run --memo FILE` starts from them, so a run pays only for
scheduling. A memo is tied to its target by the model hash (config and weights) and keyed per draft by the draft's
content hash; anything a run needs that the memo lacks is computed live, and the record says how many forwards that took
(`extra.live_forwards`), so a replay that was not one shows.

Format (`specter-memo-2`): gzip-compressed JSON lines, nothing that can run code. The first line is the header
(format, the target's model hash, the number of traces) and is checked before anything else is read; each further line
is one trace with its windows. Memos of the first format (serialized Python objects, which could run code when read)
are refused: record them again.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import TYPE_CHECKING

from specter.errors import SpecterError
from specter.io import atomic_write

if TYPE_CHECKING:  # reading a memo's routes for statistics (`memo_routes`) needs no torch
    from specter.numerics.forward import ForwardService, PromptTrace

FORMAT = "specter-memo-2"
_FIRST_FORMAT = b"\x80"  # the first byte of the first format's files (a protocol-5 object stream)


def draft_key(draft_dir: str | Path) -> str:
    """A draft's identity for memoized windows: a hash of its sidecar and expert tensors."""
    from specter.quant.meta import files_sha256

    return f"draft:{files_sha256([Path(draft_dir) / 'meta.json', Path(draft_dir) / 'experts.safetensors'])[:16]}"


def _routes_out(routes: list[dict]) -> list[dict]:
    return [{str(layer): list(experts) for layer, experts in r.items()} for r in routes]


def _routes_in(routes: list[dict]) -> list[dict]:
    return [{int(layer): tuple(experts) for layer, experts in r.items()} for r in routes]


def _trace_out(key: tuple, trace: PromptTrace) -> dict:
    windows = [{"draft": draft, "t": t, "draft_tokens": w.draft_tokens, "draft_routes": _routes_out(w.draft_routes),
                "verify_argmax": w.verify_argmax, "verify_routes": _routes_out(w.verify_routes)}
               for (draft, t), w in trace.windows.items()]
    line = {"key": [list(key[0]), *key[1:]], "prompt": trace.prompt, "tokens": trace.tokens,
            "prefill_routes": _routes_out(trace.prefill_routes), "step_routes": _routes_out(trace.step_routes),
            "extras": trace.extras, "windows": windows}
    if trace.calibration:
        line["calibration"] = True
    return line


def _trace_in(line: dict) -> tuple[tuple, PromptTrace]:
    from specter.numerics.forward import DraftWindow, PromptTrace

    key = (tuple(line["key"][0]), *line["key"][1:])
    trace = PromptTrace(list(line["prompt"]), list(line["tokens"]), _routes_in(line["prefill_routes"]),
                        _routes_in(line["step_routes"]), dict(line["extras"]),
                        calibration=bool(line.get("calibration")))
    for w in line["windows"]:
        trace.windows[(w["draft"], int(w["t"]))] = DraftWindow(
            int(w["t"]), list(w["draft_tokens"]), _routes_in(w["draft_routes"]), list(w["verify_argmax"]),
            _routes_in(w["verify_routes"]))
    return key, trace


def save_memo(service: ForwardService, path: str | Path, model_hash: str) -> int:
    """Write the traces this process's runs asked for (`ForwardService.used`, with all their windows) atomically;
    returns the number of traces. A trace a memo it started from held but no run asked for is left out: a prompt
    set's recording that starts from another set's keeps the calibration traces they share, not the other set's
    prompts (statistics over a memo's evaluation traces, `memo_routes`, read one prompt set)."""
    traces = [(key, trace) for key, trace in service.traces.items() if key in service.used]
    header = {"format": FORMAT, "model_hash": model_hash, "dtype": _dtype(service), "traces": len(traces)}

    def write(f) -> None:
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as z:  # mtime 0: the same memo gives the same bytes
            z.write((json.dumps(header) + "\n").encode())
            for key, trace in traces:
                z.write((json.dumps(_trace_out(key, trace)) + "\n").encode())

    atomic_write(path, write, binary=True)
    return len(traces)


def _dtype(service: ForwardService) -> str:
    """The precision the service's target computes in (`float32`, `bfloat16`, ...)."""
    return str(next(service.target.model.parameters()).dtype).removeprefix("torch.")


def _lines(path: Path, model_hash: str, dtype: str):
    """The memo's trace lines, after its header was checked (a memo without a dtype was recorded in float32)."""
    with path.open("rb") as raw:
        if raw.read(1) == _FIRST_FORMAT:
            raise SpecterError(f"--memo {str(path)!r} is a memo of the first format (serialized Python objects, "
                               "which could run code when read); the suite no longer reads it: record it again with "
                               "`specter sweep --memo-out`")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        header = json.loads(f.readline())
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise SpecterError(f"--memo {str(path)!r} is not a {FORMAT} file; record it again with "
                               "`specter sweep --memo-out`")
        if header.get("model_hash") != model_hash:
            raise SpecterError(f"--memo {str(path)!r} was recorded on another model (hash "
                               f"{str(header.get('model_hash'))[:12]}, this one {model_hash[:12]}); record it again "
                               "on this model")
        if header.get("dtype", "float32") != dtype:
            raise SpecterError(f"--memo {str(path)!r} was recorded in {header.get('dtype', 'float32')}, and this run "
                               f"computes in {dtype}; record it again with this --dtype, or run with "
                               f"--dtype {header.get('dtype', 'float32')}")
        for line in f:
            yield json.loads(line)


def memo_routes(path: str | Path) -> list[list[dict[int, tuple[int, ...]]]]:
    """The target's routes of every token each evaluation trace of a memo processed (its prompt, then each decode
    step; calibration and warm-up traces left out: memos written before traces were marked count them too), read
    for statistics only: no model is loaded and nothing is replayed, so the model hash is not checked."""
    path = Path(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            header = json.loads(f.readline())
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise ValueError(f"not a {FORMAT} file")
            out = []
            for line in f:
                trace = json.loads(line)
                if not trace.get("calibration"):
                    out.append(_routes_in(trace["prefill_routes"]) + _routes_in(trace["step_routes"]))
    except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise SpecterError(f"{str(path)!r} is not a memo from `specter sweep --memo-out` or is damaged "
                           f"({type(err).__name__}: {err}); record it again") from None
    return out


def load_memo(service: ForwardService, path: str | Path, model_hash: str) -> int:
    """Add a memo's traces and windows to the service (what it already holds wins); returns the traces added."""
    path = Path(path)
    if not path.is_file():
        raise SpecterError(f"--memo {str(path)!r} does not exist; record it with `specter sweep --memo-out`")
    try:
        traces = [_trace_in(line) for line in _lines(path, model_hash, _dtype(service))]
    except (OSError, EOFError, ValueError, KeyError, TypeError, IndexError) as err:  # gzip, JSON or layout
        raise SpecterError(f"--memo {str(path)!r} is not a memo from `specter sweep --memo-out` or is damaged "
                           f"({type(err).__name__}: {err}); record it again") from None
    added = 0
    for key, trace in traces:
        mine = service.traces.get(key)
        if mine is None:
            service.traces[key] = trace
            added += 1
        else:
            for wkey, window in trace.windows.items():
                if wkey not in mine.windows or mine.windows[wkey].kmax < window.kmax:
                    mine.windows[wkey] = window
    return added
