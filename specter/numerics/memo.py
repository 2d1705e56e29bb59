"""Recorded numerics on disk: a `ForwardService`'s traces and windows, saved once and replayed by later processes.

The workflow runs every system as its own `specter run` process; `specter sweep --memo-out` computes the numerics those
runs need (the target's greedy decode of each prompt, the warm-up traces, and each draft's windows along the rebase
points each K visits) and saves them here, and `specter run --memo FILE` starts from them, so a run pays only for
scheduling. A memo is tied to its target by the model hash (config and weights) and keyed per draft by the draft's
content hash; anything a run needs that the memo lacks is computed live, and the record says how many forwards that took
(`extra.live_forwards`), so a replay that was not one shows.

Format (`specter-memo-2`): gzip-compressed JSON lines, nothing that can run code. The first line is the header
(format, the target's model hash and shape, the number of traces, a digest of the memo's content keyed by the model
hash) and is checked before anything else is read; each further line is one trace with its windows. Memos of the first
format (serialized Python objects, which could run code when read) are refused: record them again.

Before anything is replayed, every line is checked against the model it replays on (`check_trace_line`): token ids in
the vocabulary, each token's routes keyed by exactly the model's MoE layers with top-k distinct expert ids of that
layer, window lengths that fit (K proposals, K + 1 verified inputs) and rebase points inside the trace. Then the
digest, and one forward of the first trace's prompt (`spot_check`). What that binding proves and what it does not:
- the digest (HMAC-SHA256 over the header and every line, keyed by the model hash the memo was recorded on) is refused
  when any byte of a line was edited, or when the memo was recorded on another model and its header's hash changed to
  this one's (the key differs). It is tamper evidence, not a signature: the key is the model hash, which the header
  names, so whoever recomputes the digest with this code passes it;
- the spot check (the model's first greedy token after the first trace's prompt, and the routes of every prompt
  token, against the memo's) refuses a memo whose content comes from another model, digest recomputed or not, with
  near certainty, since two models seldom route a prompt alike. It checks one prompt's prefill, not the decode steps
  or windows of any trace: those are held by the digest alone.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specter.errors import SpecterError
from specter.io import atomic_write, not_a_file

if TYPE_CHECKING:  # reading a memo's routes for statistics (`memo_routes`) needs no torch
    from specter.numerics.forward import ForwardService, PromptTrace

FORMAT = "specter-memo-2"
_FIRST_FORMAT = b"\x80"  # the first byte of the first format's files (a protocol-5 object stream)


#: what a draft's sidecar says of how long its writing took and where its source lay, not of what the draft is: the
#: same quantization of the same model, run again or elsewhere, gives the same key
DRAFT_RUN_FIELDS = ("seconds", "source_model")


def draft_key(draft_dir: str | Path) -> str:
    """A draft's identity for memoized windows: a hash of its expert tensors and its sidecar (method, bits, group,
    calibration, numerics, versions and the source model's hash), without `DRAFT_RUN_FIELDS`."""
    from specter.io import files_sha256

    meta = json.loads((Path(draft_dir) / "meta.json").read_text())
    for name in DRAFT_RUN_FIELDS:
        meta.pop(name, None)
    h = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    h.update(files_sha256([Path(draft_dir) / "experts.safetensors"]).encode())
    return f"draft:{h.hexdigest()[:16]}"


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


def _digest(model_hash: str, header: dict, lines) -> str:
    """HMAC-SHA256, keyed by the model hash, over the header (without its digest) and each trace line's bytes."""
    mac = hmac.new(model_hash.encode(), digestmod=hashlib.sha256)
    mac.update(json.dumps({k: v for k, v in header.items() if k != "digest"}, sort_keys=True).encode())
    for line in lines:
        mac.update(line.encode())
    return mac.hexdigest()


def save_memo(service: ForwardService, path: str | Path, model_hash: str) -> int:
    """Write the traces this process's runs asked for (`ForwardService.used`, with all their windows) atomically;
    returns the number of traces. A trace a memo it started from held but no run asked for is left out: a prompt
    set's recording that starts from another set's keeps the calibration traces they share, not the other set's
    prompts (statistics over a memo's evaluation traces, `memo_routes`, read one prompt set)."""
    traces = [(key, trace) for key, trace in service.traces.items() if key in service.used]
    shape = MemoShape.of(service.target)
    header = {"format": FORMAT, "model_hash": model_hash, "dtype": _dtype(service), "traces": len(traces),
              "shape": {"layers": shape.layers, "vocab": shape.vocab}}  # what statistics read without the model
    lines = [json.dumps(_trace_out(key, trace)) + "\n" for key, trace in traces]
    header["digest"] = _digest(model_hash, header, lines)

    def write(f) -> None:
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as z:  # mtime 0: the same memo gives the same bytes
            z.write((json.dumps(header) + "\n").encode())
            for line in lines:
                z.write(line.encode())

    atomic_write(path, write, binary=True)
    return len(traces)


def _dtype(service: ForwardService) -> str:
    """The precision the service's target computes in (`float32`, `bfloat16`, ...)."""
    return str(next(service.target.model.parameters()).dtype).removeprefix("torch.")


def _lines(path: Path, model_hash: str, dtype: str, shape: MemoShape):
    """The memo's trace lines, parsed, after its header was checked (a memo without a dtype was recorded in float32),
    each checked against the model's `shape`; the digest is checked once the last line is read, so nothing is
    replayed before the whole memo passed, and a header that says what no run wrote (its precision) is named only
    once the digest vouches for it."""
    with path.open("rb") as raw:
        if raw.read(1) == _FIRST_FORMAT:
            raise SpecterError(f"--memo {str(path)!r} is a memo of the first format (serialized Python objects, "
                               "which could run code when read); the suite no longer reads it: record it again with "
                               "`specter sweep --memo-out`")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = _bounded_lines(f, f"--memo {str(path)!r}")
        header = json.loads(next(lines, ""))
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise SpecterError(f"--memo {str(path)!r} is not a {FORMAT} file; record it again with "
                               "`specter sweep --memo-out`")
        if header.get("model_hash") != model_hash:
            raise SpecterError(f"--memo {str(path)!r} was recorded on another model (hash "
                               f"{str(header.get('model_hash'))[:12]}, this one {model_hash[:12]}); record it again "
                               "on this model")
        if not isinstance(header.get("digest"), str):
            raise SpecterError(f"--memo {str(path)!r} carries no digest (it was recorded before memos were bound to "
                               "their model's content); record it again with `specter sweep --memo-out`")
        raw, parsed = [], []
        for i, text in enumerate(lines):
            raw.append(text)
            parsed.append(check_trace_line(json.loads(text), shape, f"--memo {str(path)!r}: trace {i + 1}"))
        if len(parsed) != header.get("traces"):
            raise SpecterError(f"--memo {str(path)!r} holds {len(parsed)} traces, its header says "
                               f"{header.get('traces')!r}: truncated or edited; record it again with "
                               "`specter sweep --memo-out`")
        if not hmac.compare_digest(_digest(model_hash, header, raw), header["digest"]):
            raise SpecterError(f"--memo {str(path)!r}: its content does not match its digest for this model (edited, "
                               "or recorded on another model with its header's hash changed); record it again with "
                               "`specter sweep --memo-out`")
        if header.get("dtype", "float32") != dtype:
            raise SpecterError(f"--memo {str(path)!r} was recorded in {header.get('dtype', 'float32')}, and this run "
                               f"computes in {dtype}; record it again with this --dtype, or run with "
                               f"--dtype {header.get('dtype', 'float32')}")
    return parsed


#: what a memo may hold once decompressed, a line and in all: the default configuration's largest memo is under
#: 7 MB and its longest line under 1 MB; a gzip bomb (a 1 MB file of a gigabyte of spaces took 2.5 GB of memory to
#: parse) is refused before it is held
MAX_LINE_CHARS = 64 * 2**20
MAX_CHARS = 2**30


def _bounded_lines(f, what: str):
    """The lines of the open text stream `f`, refused in one line once one or all of them pass the limits above."""
    total = 0
    while True:
        line = f.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        total += len(line)
        if len(line) > MAX_LINE_CHARS or total > MAX_CHARS:
            over = f"a line over {MAX_LINE_CHARS // 2**20} MiB" if len(line) > MAX_LINE_CHARS else \
                f"over {MAX_CHARS // 2**30} GiB"
            raise SpecterError(f"{what} decompresses to {over}, beyond any memo the suite writes (a forged or "
                               "damaged file); record it again with `specter sweep --memo-out`")
        yield line


def memo_routes(path: str | Path) -> list[list[dict[int, tuple[int, ...]]]]:
    """The routes of each evaluation trace's tokens (prompt, then decode steps), as `read_memo_routes` reads them."""
    return read_memo_routes(path)[0]


def read_memo_routes(path: str | Path) -> tuple[list[list[dict[int, tuple[int, ...]]]], MemoShape, str]:
    """`memo_routes`, the shape of the model the memo was recorded on (its MoE layers' experts and top-k, its
    vocabulary) and that model's hash, from the memo alone: no model is loaded. Every line is checked against that
    shape, and the whole against its digest under that hash (an edit the digest was not made again for)."""
    path = Path(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = _bounded_lines(f, repr(str(path)))
            header = json.loads(next(lines, ""))
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise ValueError(f"not a {FORMAT} file")
            if not (isinstance(header.get("shape"), dict) and isinstance(header.get("digest"), str)
                    and isinstance(header.get("model_hash"), str)):
                raise SpecterError(f"{str(path)!r} carries no shape of its model (recorded before memos did); "
                                   "record it again with `specter sweep --memo-out`")
            shape = MemoShape({str(k): tuple(v) for k, v in header["shape"]["layers"].items()},
                              int(header["shape"]["vocab"]))
            out, raw = [], []
            for i, text in enumerate(lines):
                raw.append(text)
                trace = check_trace_line(json.loads(text), shape, f"{str(path)!r}: trace {i + 1}")
                if not trace.get("calibration"):
                    out.append(_routes_in(trace["prefill_routes"]) + _routes_in(trace["step_routes"]))
    except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise SpecterError(f"{str(path)!r} is not a memo from `specter sweep --memo-out` or is damaged "
                           f"({type(err).__name__}: {err}); record it again") from None
    if not hmac.compare_digest(_digest(header["model_hash"], header, raw), header["digest"]):
        raise SpecterError(f"{str(path)!r}: its content does not match its digest (edited); record it again with "
                           "`specter sweep --memo-out`")
    return out, shape, header["model_hash"]


def load_memo(service: ForwardService, path: str | Path, model_hash: str) -> int:
    """Add a memo's traces and windows to the service (what it already holds wins); returns the traces added."""
    path = Path(path)
    if (said := not_a_file(path)) is not None:
        raise SpecterError(f"--memo {str(path)!r} {said}; record it with `specter sweep --memo-out`")
    try:
        traces = [_trace_in(line) for line in _lines(path, model_hash, _dtype(service), MemoShape.of(service.target))]
    except (OSError, EOFError, ValueError, KeyError, TypeError, IndexError) as err:  # gzip, JSON or layout
        raise SpecterError(f"--memo {str(path)!r} is not a memo from `specter sweep --memo-out` or is damaged "
                           f"({type(err).__name__}: {err}); record it again") from None
    spot_check(service, traces, path)
    added = 0
    for key, trace in traces:
        trace.origin = str(path)
        mine = service.traces.get(key)
        if mine is None:
            service.traces[key] = trace
            added += 1
        else:
            for wkey, window in trace.windows.items():
                if wkey not in mine.windows or mine.windows[wkey].kmax < window.kmax:
                    mine.windows[wkey] = window
    return added


# Checks of a memo's content against the model it replays on --------------------------------------------------------
@dataclass(frozen=True)
class MemoShape:
    """What a memo's lines must fit: the model's MoE layers as the memo keys them, each with its expert count and
    top-k, and the vocabulary."""

    layers: dict  # str(decoder layer) -> (experts, top_k)
    vocab: int

    @classmethod
    def of(cls, moe) -> MemoShape:
        """The shape of a loaded model (`MoEModel`)."""
        layers = {str(m.layer_index): (m.num_experts, m.top_k) for m in moe.moe_layers}
        return cls(layers, int(moe.model.get_output_embeddings().weight.shape[0]))


def _bad(where: str, field: str, value, want: str) -> SpecterError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return SpecterError(f"{where}: {field} is {shown}, {want}; the memo is damaged, edited or of another model: record "
                        "it again with `specter sweep --memo-out`")


def _check_tokens(tokens, shape: MemoShape, where: str, field: str, length: int | None = None) -> None:
    """A list of token ids of the vocabulary (of `length` where given, else at least one)."""
    if not isinstance(tokens, list) or (len(tokens) != length if length is not None else not tokens):
        want = f"a list of {length} token ids" if length is not None else "a non-empty list of token ids"
        raise _bad(where, field, tokens, f"it must be {want}")
    for i, token in enumerate(tokens):
        if type(token) is not int or not 0 <= token < shape.vocab:
            raise _bad(where, f"{field}[{i}]", token, f"a token id must be a whole number from 0 to {shape.vocab - 1}")


def _check_routes(routes, shape: MemoShape, where: str, field: str, length: int) -> None:
    """`length` tokens' routes: each keyed by exactly the model's MoE layers, with top-k distinct expert ids of the
    layer in ascending order (as the recording writes them)."""
    if not isinstance(routes, list) or len(routes) != length:
        raise _bad(where, field, routes if not isinstance(routes, list) else f"{len(routes)} tokens' routes",
                   f"it must be {length} tokens' routes")
    layers = shape.layers
    for i, token in enumerate(routes):
        if not isinstance(token, dict) or token.keys() != layers.keys():
            keys = sorted(token) if isinstance(token, dict) else token
            raise _bad(where, f"{field}[{i}]", keys, f"a token's routes must be keyed by the model's MoE layers "
                       f"{', '.join(layers)}")
        for layer, experts in token.items():
            count, top_k = layers[layer]
            if not isinstance(experts, list) or len(experts) != top_k:
                raise _bad(where, f"{field}[{i}][{layer}]", experts, f"layer {layer} routes each token to "
                           f"exactly {top_k} experts")
            previous = -1
            for e in experts:
                if type(e) is not int or not 0 <= e < count:
                    raise _bad(where, f"{field}[{i}][{layer}]", experts, f"an expert id must be a whole number from 0 "
                               f"to {count - 1} (layer {layer}'s experts)")
                if e <= previous:
                    raise _bad(where, f"{field}[{i}][{layer}]", experts, "expert ids must be distinct and ascending, "
                               "as a recording writes them")
                previous = e


def check_window(window, shape: MemoShape, where: str, prompt_len: int, seq_len: int) -> None:
    """One draft window of a trace of `prompt_len` prompt and `seq_len` committed tokens: a draft key, a rebase point
    t inside the trace's decode (P < t <= P + N), K >= 1 proposals with their routes, K + 1 verified inputs' argmax
    and routes."""
    if not isinstance(window, dict):
        raise _bad(where, "the window", window, "it must be a JSON object")
    for name in ("draft", "t", "draft_tokens", "draft_routes", "verify_argmax", "verify_routes"):
        if name not in window:
            raise _bad(where, "the window", sorted(window), f"it lacks {name!r}")
    if not isinstance(window["draft"], str) or not window["draft"]:
        raise _bad(where, "draft", window["draft"], "it must name the draft (its content key)")
    t = window["t"]
    if type(t) is not int or not prompt_len < t <= seq_len:
        raise _bad(where, "t", t, f"a rebase point must be a whole number from {prompt_len + 1} to {seq_len} (inside "
                   "the trace's decode)")
    where = f"{where} (t={t})"
    proposals = window["draft_tokens"]
    _check_tokens(proposals, shape, where, "draft_tokens")
    k = len(proposals)
    _check_routes(window["draft_routes"], shape, where, "draft_routes", k)
    _check_tokens(window["verify_argmax"], shape, where, "verify_argmax", k + 1)
    _check_routes(window["verify_routes"], shape, where, "verify_routes", k + 1)


def check_trace_line(line, shape: MemoShape, where: str) -> dict:
    """One parsed trace line of a memo, checked against the model's `shape` before anything is replayed; returns it.
    A greedy trace is keyed [prompt, N], a sampled one [prompt, N, temperature, seed]; N tokens were committed, the
    prompt's P tokens and the N - 1 decode steps have routes, and every window lies inside the trace."""
    if not isinstance(line, dict):
        raise _bad(where, "the line", line, "it must be a JSON object")
    for name in ("key", "prompt", "tokens", "prefill_routes", "step_routes", "extras", "windows"):
        if name not in line:
            raise _bad(where, "the line", sorted(line), f"it lacks {name!r}")
    prompt, tokens = line["prompt"], line["tokens"]
    _check_tokens(prompt, shape, where, "prompt")
    _check_tokens(tokens, shape, where, "tokens")
    key = line["key"]
    if not isinstance(key, list) or len(key) not in (2, 4) or key[0] != prompt or key[1] != len(tokens):
        raise _bad(where, "key", key, f"it must be [the prompt, {len(tokens)} tokens] (or with a temperature and a "
                   "seed)")
    _check_routes(line["prefill_routes"], shape, where, "prefill_routes", len(prompt))
    _check_routes(line["step_routes"], shape, where, "step_routes", len(tokens) - 1)
    if not isinstance(line["extras"], dict) or not all(isinstance(v, list) for v in line["extras"].values()):
        raise _bad(where, "extras", line["extras"], "it must map each recorder to a list of values")
    if not isinstance(line.get("calibration", False), bool):
        raise _bad(where, "calibration", line["calibration"], "it must be true or false")
    windows = line["windows"]
    if not isinstance(windows, list):
        raise _bad(where, "windows", windows, "it must be a list")
    seen = set()
    for i, window in enumerate(windows):
        check_window(window, shape, f"{where}, windows[{i}]", len(prompt), len(prompt) + len(tokens))
        if (window["draft"], window["t"]) in seen:
            raise _bad(f"{where}, windows[{i}]", "t", window["t"], f"a second window of draft {window['draft']!r} "
                       "at this rebase point")
        seen.add((window["draft"], window["t"]))
    return line


def spot_check(service: ForwardService, traces: list, path: Path) -> None:
    """One forward of the first trace's prompt on the model the memo replays on: its first greedy token (greedy traces)
    and the routes of every prompt token must be the memo's. Cheap (one prefill per memo load, counted by no service,
    so a replay's `live_forwards` stays 0); see the module docstring for what it proves and what it does not."""
    if not traces:
        return
    from specter.numerics.passes import greedy_prefill

    key, trace = traces[0]
    token, routes = greedy_prefill(service.target, trace.prompt)
    greedy = len(key) == 2
    if routes != trace.prefill_routes or (greedy and token != trace.tokens[0]):
        what = "routes of its prompt" if routes != trace.prefill_routes else f"first token ({trace.tokens[0]}, the " \
            f"model's {token})"
        raise SpecterError(f"--memo {str(path)!r}: this model does not reproduce its first trace (the {what}): it was "
                           "recorded on another model (its header edited) or with other numerics; record it again "
                           "on this model with `specter sweep --memo-out`")
