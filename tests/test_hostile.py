"""Hostile and careless input: every bad value, corrupt file and unwritable path is one `specter: error:` line with
exit 2, no traceback, and no output left or touched.

Table-driven: each case is named after the flaw it guards against (issue 17's list). The corrupt files are made from
real outputs of the suite (a tiny model, its draft, a run's records and table, a hardware preset) by truncating them,
flipping bytes or editing one field. Every case runs `specter.cli.main` in-process against a fresh copy of those files,
with a sentinel at its output path, and checks afterwards that the sentinel is unchanged and nothing else appeared.
"""

from __future__ import annotations

import gc
import gzip
import json
import math
import os
import re
import shutil
import textwrap
from functools import partial
from pathlib import Path

import pytest
import yaml

from specter.cli import main
from specter.quant.quantize import quantize_draft

SENTINEL = "an earlier output that a failed command must not touch\n"


@pytest.fixture(scope="module")
def real(tiny_dirs, tmp_path_factory):
    """Real outputs to corrupt: the tiny Mixtral, its RTN draft, one run's records, the main table, a preset."""
    root = tmp_path_factory.mktemp("real")
    draft = root / "draft"
    quantize_draft(tiny_dirs["mixtral"], draft, method="rtn", bits=4, group_size=32)
    other = root / "other-draft"
    quantize_draft(tiny_dirs["olmoe"], other, method="rtn", bits=4, group_size=32)
    from specter.models.tiny import save_tiny_model

    same_shapes = root / "same-shapes-draft"  # a draft of another tiny Mixtral: experts of the same shapes
    quantize_draft(save_tiny_model("mixtral", root / "other-mixtral", seed=1), same_shapes, method="rtn", bits=4,
                   group_size=32)
    records = root / "records.jsonl"
    assert main(["run", "--system", "specter", "--model", tiny_dirs["mixtral"], "--draft", str(draft),
                 "--dataset", "code", "--hardware", "t4-pcie3",
                 "--num-prompts", "1", "--prefix-tokens", "8", "--max-new-tokens", "6", "--k", "2",
                 "--resident-per-layer", "2", "--out", str(records)]) == 0
    table = root / "main.csv"
    assert main(["aggregate", "main", str(records), "--out", str(table)]) == 0
    preset = yaml.safe_load((Path(__file__).parents[1] / "specter/presets/hardware/t4-pcie3.yaml").read_text())
    return dict(model=tiny_dirs["mixtral"], draft=draft, other_draft=other, records=records, table=table,
                preset=preset, other_same_shapes=same_shapes)


def _flip(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i:i + 16] = bytes(b ^ 0xFF for b in data[i:i + 16])
    path.write_bytes(bytes(data))


def _truncate(path: Path, share: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * share)])


def _config_of(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _profile(w: Path, real, edit) -> str:
    data = json.loads(json.dumps(real["preset"]))
    edit(data)
    path = w / "hw.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _damaged_copy(w: Path, real, damage, key: str) -> str:
    """A copy of the real output `key` (a directory or a file) under `w`, damaged by `damage`."""
    src = Path(real[key])
    out = w / ("in.jsonl" if key == "records" else key)
    (shutil.copytree if src.is_dir() else shutil.copy)(src, out)
    damage(out)
    return str(out)


_model_copy = partial(_damaged_copy, key="model")
_draft_copy = partial(_damaged_copy, key="draft")
_records_copy = partial(_damaged_copy, key="records")


def _write(w: Path, name: str, content: str | bytes) -> str:
    path = w / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def _table_file(w: Path, name: str, content: str) -> str:
    """A table file as the suite writes one: its text, and its checksum beside it."""
    import hashlib

    path = Path(_write(w, name, content))
    Path(f"{path}.sha256").write_text(f"{hashlib.sha256(content.encode()).hexdigest()}  {name}\n")
    return str(path)


def _mkdir(path: Path) -> str:
    path.mkdir()
    return str(path)


def _foreign(w: Path) -> str:
    """A directory of someone else's files, which an --out must never replace."""
    path = w / "documents"
    path.mkdir()
    (path / "thesis.tex").write_text("years of work\n")
    return str(path)


def _record_field(field, value):
    def damage(path: Path) -> None:
        lines = path.read_text().splitlines()
        record = json.loads(lines[0])
        record[field] = value
        path.write_text(json.dumps(record) + "\n")
    return damage


def _edit_prediction(path: Path, edit) -> None:
    """The first record's `expert_prediction` changed in place by `edit`."""
    lines = path.read_text().splitlines()
    record = json.loads(lines[0])
    edit(record["expert_prediction"])
    path.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")


def _second_record(**changes):
    """A damage: the file's first record, then a copy of it for the same prompt with `changes`."""
    def damage(path: Path) -> None:
        record = json.loads(path.read_text().splitlines()[0])
        path.write_text(json.dumps(record) + "\n" + json.dumps({**record, **changes}) + "\n")
    return damage


def _two_prompts_other_configs(path: Path) -> None:
    """A damage: the first record as prompt 0 of a 2-prompt run, then as its prompt 1 with another numerics config."""
    record = json.loads(path.read_text().splitlines()[0])
    record["config"]["num_prompts"] = 2
    other = json.loads(json.dumps({**record, "prompt_index": 1}))
    other["prompt_token_ids"] = other["prompt_token_ids"][::-1]  # a run's prompts are distinct
    other["config"]["numerics"] = {**other["config"]["numerics"], "threads": 7}
    path.write_text(json.dumps(record) + "\n" + json.dumps(other) + "\n")


def _one_prompt_relabelled(path: Path) -> None:
    """A damage: the first record as prompt 0 of a 2-prompt run, then the same record relabelled as its prompt 1 (a
    table would count one prompt twice)."""
    record = json.loads(path.read_text().splitlines()[0])
    record["config"]["num_prompts"] = 2
    path.write_text(json.dumps(record) + "\n" + json.dumps({**record, "prompt_index": 1}) + "\n")


def _table_copy(w: Path, real, damage, checksum: bool = True) -> str:
    """A copy of the real main table (with its checksum file, or without it), damaged by `damage`."""
    out = w / "main.csv"
    shutil.copy(real["table"], out)
    if checksum:
        shutil.copy(str(real["table"]) + ".sha256", str(out) + ".sha256")
    damage(out)
    return str(out)


def _table_cell(column: str, value: str):
    def damage(path: Path) -> None:
        lines = path.read_text().splitlines()
        header = lines[0].split(",")
        cells = lines[1].split(",")
        cells[header.index(column)] = value
        path.write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    return damage


#: a main table row's cells that only a run drafting a window fills, emptied
_NO_WINDOW = dict(k="", acceptance_rate="", window_utilization="", window_recall="", window_working_set="")


def _table_value(path: Path, column: str) -> str:
    """The first row's `column` of the table at `path`."""
    lines = path.read_text().splitlines()
    return lines[1].split(",")[lines[0].split(",").index(column)]


def _second_row(**cells):
    """A damage: the table's first row again below it, with `cells` changed."""
    def damage(path: Path) -> None:
        import csv
        import io

        rows = list(csv.reader(io.StringIO(path.read_text())))
        rows.append([cells.get(column, value) for column, value in zip(rows[0], rows[1])])
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        path.write_text(out.getvalue())
    return damage


def _column_twice(path: Path) -> None:
    """The table with a second tpot_ms column (pandas would read it as tpot_ms.1)."""
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0] + ",tpot_ms", *(line + ",1.0" for line in lines[1:])]) + "\n")


def _readme(table: str) -> list[str]:
    return ["summary", "--readme", "--from", table, "--out", "{out}.md"]


def _first_record(real) -> dict:
    return json.loads(Path(real["records"]).read_text().splitlines()[0])


def _aggregate(damage):
    """A case's command: `specter aggregate main` over a copy of the real records damaged by `damage`."""
    return lambda w, r: ["aggregate", "main", _records_copy(w, r, damage), "--out", "{out}.csv"]


def _readme_cell(column: str, value: str):
    """A case's command: the README table from a copy of the real main table with its first row's `column` set to
    `value`, its checksum written for the new bytes."""
    return lambda w, r: _readme(_resealed(_table_copy(w, r, _table_cell(column, value), checksum=False)))


def _resealed(table: str) -> str:
    """`table` with a checksum beside it for the bytes it now holds (an edit that a checksum cannot tell)."""
    import hashlib

    Path(f"{table}.sha256").write_text(f"{hashlib.sha256(Path(table).read_bytes()).hexdigest()}  main.csv\n")
    return table


def _committed_with(w: Path, name: str, row: int | str, **cells) -> str:
    """The committed table `name` (docs/results) with row `row`'s `cells` changed (a row's index, or the first row of
    the system it names), its checksum written for the new bytes."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO((Path(__file__).parents[1] / "docs/results" / name).read_text())))
    if isinstance(row, str):
        row = next(i for i, cells_ in enumerate(rows[1:]) if cells_[rows[0].index("system")] == row)
    for column, value in cells.items():
        rows[row + 1][rows[0].index(column)] = value
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return _table_file(w, name, out.getvalue())


def _plot_committed(experiment: str, row: int | str, **cells):
    """A case's command: `specter plot EXPERIMENT` of its committed table (docs/results) with row `row`'s `cells`
    changed."""
    return lambda w, r: ["plot", experiment, "--table", _committed_with(w, f"{experiment}.csv", row, **cells), "--out",
                         "{out}.png"]


def _claims_with(w: Path, row: int, **cells) -> str:
    return _committed_with(w, "claims.csv", row, **cells)


def _beside(table: str, name: str, content: str) -> str:
    """`table`, with a file `name` of `content` beside it."""
    (Path(table).parent / name).write_text(content)
    return table


def _profile_number(section: str, field: str, value):
    """A damage: every record's profile with `section.field` set to `value`, its digest dropped (as a record of a
    version before the digest carries none)."""
    def damage(path: Path) -> None:
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for record in records:
            record["config"]["hardware_profile"][section][field] = value
            record["config"].pop("hardware_sha256", None)
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return damage


def _results_with(w: Path, real, name: str, content: str) -> str:
    """A results directory holding the real main table and `name` with `content`."""
    tables = w / "results" / "tables"
    tables.mkdir(parents=True)
    shutil.copy(real["table"], tables / "main.csv")
    shutil.copy(str(real["table"]) + ".sha256", tables / "main.csv.sha256")
    _table_file(tables, name, content)
    return str(w / "results")


_EXPERT = "model.layers.0.block_sparse_moe.experts.1.w1.weight"


def _shard_gone(d: Path) -> None:
    """The checkpoint as two shards, the second gone: its index lists it, one expert's tensor moved there."""
    _weights(lambda t: t.pop(_EXPERT))(d)
    from safetensors import safe_open

    with safe_open(str(d / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    weight_map = {**dict.fromkeys(names, "model.safetensors"), _EXPERT: "model-00002-of-00002.safetensors"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _other_machine(path: Path, rehash: bool = True) -> None:
    """Every record as if run on another machine under the same hardware name (a profile of other numbers, and its
    hash; `rehash` False: the profile edited under the hash it was run with)."""
    from specter.timing.hardware import profile_digest

    out = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        record["config"]["hardware_profile"]["device"]["memory_gb"] = 80.0
        record["config"]["memory"]["device_bytes"] = 80_000_000_000  # its memory plan made on that device
        if rehash:
            record["config"]["hardware_sha256"] = profile_digest(record["config"]["hardware_profile"])
        out.append(json.dumps(record))
    path.write_text("\n".join(out) + "\n")


def _both(*damages):
    """A damage: each of `damages` in turn."""
    def damage(path: Path) -> None:
        for each in damages:
            each(path)
    return damage


def _key_twice(field, value):
    """A damage: the first record's line with `field` given again at its end, as `value` (JSON keeps the last)."""
    def damage(path: Path) -> None:
        line = path.read_text().splitlines()[0]
        path.write_text(line[:-1] + f", {json.dumps(field)}: {json.dumps(value)}}}\n")
    return damage


def _config_key_twice(d: Path) -> None:
    """config.json with num_experts_per_tok given twice (transformers keeps the last)."""
    text = (d / "config.json").read_text().rstrip()
    (d / "config.json").write_text(text[:-1] + ', "num_experts_per_tok": 1}\n')


def _extra_edit(edit):
    """A damage: the first record's `extra` changed by `edit(extra)`."""
    def damage(path: Path) -> None:
        record = json.loads(path.read_text().splitlines()[0])
        edit(record["extra"])
        path.write_text(json.dumps(record) + "\n")
    return damage


def _config_field(field, value):
    """A damage: the first record's `config.<field>` set to `value` (None: removed)."""
    def damage(path: Path) -> None:
        record = json.loads(path.read_text().splitlines()[0])
        if value is None:
            record["config"].pop(field, None)
        else:
            record["config"][field] = value
        path.write_text(json.dumps(record) + "\n")
    return damage


def _stale_beside(d: Path) -> None:
    """The checkpoint as one listed shard, and beside it a file its index does not list."""
    (d / "model.safetensors").rename(d / "model-00001-of-00001.safetensors")
    from safetensors import safe_open

    with safe_open(str(d / "model-00001-of-00001.safetensors"), "pt") as f:
        names = list(f.keys())
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": dict.fromkeys(names, "model-00001-of-00001.safetensors")}))
    shutil.copy(d / "model-00001-of-00001.safetensors", d / "model.safetensors")


def _recorded_memo(real) -> Path:
    """A memo of `_run`'s numerics on the real model, recorded once beside the real outputs."""
    memo = Path(real["records"]).parent / "memo.json.gz"
    if not memo.is_file():
        assert main(["sweep", "--systems", "specter", "--model", real["model"], "--draft", str(real["draft"]),
                     "--dataset", "code", "--hardware", "t4-pcie3", "--num-prompts", "1", "--prefix-tokens", "8",
                     "--max-new-tokens", "4", "--k", "2", "--resident-per-layer", "2", "--memo-out", str(memo)]) == 0
    return memo


def _foreign_memo(real) -> Path:
    """A memo recorded on another tiny Mixtral of the same shapes (seed 1), recorded once beside the real outputs."""
    from specter.models.tiny import save_tiny_model

    root = Path(real["records"]).parent
    memo = root / "foreign-memo.json.gz"
    if not memo.is_file():
        other = save_tiny_model("mixtral", root / "foreign-model", seed=1)
        assert main(["sweep", "--systems", "on-demand", "--model", str(other), "--dataset", "code", "--hardware",
                     "t4-pcie3", "--num-prompts", "1", "--prefix-tokens", "8", "--max-new-tokens", "4",
                     "--resident-per-layer", "2", "--memo-out", str(memo)]) == 0
    return memo


def _forged_memo(w: Path, real, edit, redigest: bool = False, foreign: bool = False) -> str:
    """A copy of a recorded memo whose header and traces `edit(header, traces)` changed; `redigest`: its digest
    computed again for its (edited) header's model hash, as a forger using the suite's own code would."""
    lines = gzip.decompress((_foreign_memo(real) if foreign else _recorded_memo(real)).read_bytes()).splitlines()
    header, traces = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    edit(header, traces)
    out = [json.dumps(t) + "\n" for t in traces]
    if redigest:
        from specter.numerics.memo import _digest

        header["digest"] = _digest(header["model_hash"], header, out)
    return _write(w, "memo.json.gz", gzip.compress((json.dumps(header) + "\n" + "".join(out)).encode()))


def _route(field: str, token: int, layer: str, experts):
    """An edit of one token's routes at one layer of the first trace (`field` may be `windows.0.draft_routes`)."""
    def edit(_header, traces) -> None:
        place = traces[0]
        for part in field.split("."):
            place = place[int(part)] if part.isdigit() else place[part]
        place[token][layer] = experts
    return edit


def _trace_edit(change):
    return lambda _header, traces: change(traces[0])


def _own_hash(real):
    def edit(header, _traces) -> None:
        from specter.models.integrity import model_hash

        header["model_hash"] = model_hash(real["model"])
    return edit


def _replay(w, r, memo_edit, system="specter", **forge) -> list[str]:
    return _run(r, "--memo", _forged_memo(w, r, memo_edit, **forge), system=system)


def _tensor_twice(d: Path) -> None:
    """The checkpoint as two shards that both hold one expert's tensor, with other values in the second (which the
    index names for it)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    os.replace(d / "model.safetensors", d / "model-00001-of-00002.safetensors")
    with safe_open(str(d / "model-00001-of-00002.safetensors"), "pt") as f:
        names, other = list(f.keys()), f.get_tensor(_EXPERT) + 1
    save_file({_EXPERT: other}, str(d / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {**dict.fromkeys(names, "model-00001-of-00002.safetensors"),
                  _EXPERT: "model-00002-of-00002.safetensors"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _index_of(d: Path, misplace: bool) -> None:
    """The checkpoint as two shards (one expert's tensor in the second) with an index that disagrees with them: it
    places that tensor in the first shard (`misplace`), or does not list it."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    os.replace(d / "model.safetensors", d / "model-00001-of-00002.safetensors")
    with safe_open(str(d / "model-00001-of-00002.safetensors"), "pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    moved = tensors.pop(_EXPERT)
    save_file(tensors, str(d / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file({_EXPERT: moved}, str(d / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {**dict.fromkeys(tensors, "model-00001-of-00002.safetensors"),
                  "lm_head.weight" if not misplace else _EXPERT: "model-00002-of-00002.safetensors"}
    if misplace:
        weight_map[_EXPERT] = "model-00001-of-00002.safetensors"
        weight_map["model.norm.weight"] = "model-00002-of-00002.safetensors"  # both files listed
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _overlapping(d: Path) -> None:
    """model.safetensors with its lm_head's bytes declared on the embedding's (the file's size unchanged)."""
    import struct

    data = (d / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header["lm_head.weight"]["data_offsets"] = header["model.embed_tokens.weight"]["data_offsets"]
    header.pop("__metadata__", None)  # room for the longer offsets
    raw = json.dumps(header, separators=(",", ":")).encode()
    assert len(raw) <= n
    raw += b" " * (n - len(raw))  # the same header length: the data stays where it was
    (d / "model.safetensors").write_bytes(data[:8] + raw + data[8 + n:])


def _weights(edit):
    """A damage that rewrites model.safetensors with `edit(tensors)` applied (a readable file of other values)."""
    def damage(d: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(d / "model.safetensors"))
        edit(tensors)
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return damage


def _weight_set(name: str, value: float):
    """A damage that sets one element of tensor `name` to `value`."""
    return _weights(lambda tensors: tensors[name].view(-1).__setitem__(3, value))


def _fill_tensor_bytes(d: Path) -> None:
    """Every byte of every tensor 0xFF (NaN in float32), the safetensors header intact."""
    path = d / "model.safetensors"
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start:] = b"\xff" * (len(data) - start)
    path.write_bytes(bytes(data))


def _carded_then_edited(real):
    """A model card recording the real model's hash (the copy's files hash alike), then one byte of a tensor edited."""
    def damage(d: Path) -> None:
        from specter.models.integrity import model_hash

        (d / "model_card.json").write_text(json.dumps({"name": "tiny", "weights_sha256": model_hash(real["model"])}))
        path = d / "model.safetensors"
        data = bytearray(path.read_bytes())
        data[8 + int.from_bytes(data[:8], "little") + 100] ^= 0x01  # a low mantissa bit of one weight
        path.write_bytes(bytes(data))
    return damage


def _architecture(w: Path, **changes) -> str:
    """A --cost-as config.json: the shipped Mixtral-8x7B's, with `changes`."""
    shipped = Path(__file__).parents[1] / "specter/presets/architectures/mixtral-8x7b.json"
    config = {**json.loads(shipped.read_text())["config"], **changes}
    return _write(w, "arch.json", json.dumps(config))


def _draft_scales(edit):
    def damage(d: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(d / "experts.safetensors"))
        for key in tensors:
            if key.endswith(".scales"):
                edit(tensors[key])
                break
        save_file(tensors, str(d / "experts.safetensors"))
    return damage


def _build(*settings: str) -> list[str]:
    return ["build-model", "smollm2-moe", *(a for s in settings for a in ("--set", s)), "--out", "{out}"]


def _run(real, *extra, out="{out}.jsonl", model=None, draft=None, system="specter"):
    """A valid `specter run` of the tiny Mixtral, with `extra` flags appended (later flags win)."""
    return ["run", "--system", system, "--model", model or real["model"], "--draft", draft or str(real["draft"]),
            "--dataset", "code", "--hardware", "t4-pcie3",
            "--num-prompts", "1", "--prefix-tokens", "8", "--max-new-tokens", "4", "--k", "2",
            "--resident-per-layer", "2", "--out", out, *extra]


def _live(real, model: str) -> list[str]:
    """A valid live `specter run` of on-demand on `model` (its weights read by the streaming loader)."""
    return _run(real, "--engine", "live", model=model, system="on-demand")


def _without(argv: list[str], flag: str) -> list[str]:
    """`argv` without `flag` and its value."""
    i = argv.index(flag)
    return argv[:i] + argv[i + 2:]


def _sweep(real, *extra):
    return ["sweep", "--systems", "specter", "--model", real["model"], "--draft", str(real["draft"]),
            "--dataset", "code", "--hardware", "t4-pcie3",
            "--num-prompts", "1", "--prefix-tokens", "8", "--max-new-tokens", "4", "--resident-per-layer", "2",
            "--out", "{out}.jsonl", *extra]


# 400 bytes of YAML whose description expands to 9^7 strings (about 30 MB) wherever it is written out
_ALIAS_BOMB = "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 6)) + \
    f"description: [{', '.join(['*l5'] * 9)}]\n"


# (case id, argv builder (work dir, real outputs) -> argv, what the error line must say)
CASES = [
    # --- silently wrong numbers: NaN, inf, 0, negative and huge values of every numeric option ---
    ("temperature_nan", lambda w, r: _run(r, "--temperature", "nan"), "--temperature"),
    ("temperature_inf", lambda w, r: _run(r, "--temperature", "inf"), "--temperature"),
    ("temperature_negative", lambda w, r: _run(r, "--temperature", "-1"), "--temperature"),
    ("k_zero", lambda w, r: _run(r, "--k", "0"), "--k"),
    ("k_negative", lambda w, r: _run(r, "--k", "-3"), "--k"),
    ("k_huge_unbounded_work", lambda w, r: _run(r, "--k", "100000"), "--k"),
    ("max_new_tokens_zero", lambda w, r: _run(r, "--max-new-tokens", "0"), "--max-new-tokens"),
    ("max_new_tokens_huge_unbounded_work", lambda w, r: _run(r, "--max-new-tokens", str(10**9)), "--max-new-tokens"),
    ("max_new_tokens_beyond_positions", lambda w, r: _run(r, "--max-new-tokens", "100000"), "position"),
    ("prefix_tokens_beyond_positions", lambda w, r: _run(r, "--prefix-tokens", "100000"), "position"),
    ("num_prompts_zero", lambda w, r: _run(r, "--num-prompts", "0"), "--num-prompts"),
    ("num_prompts_not_a_number", lambda w, r: _run(r, "--num-prompts", "five"), "five"),
    ("seed_negative", lambda w, r: _run(r, "--seed", "-1"), "--seed"),
    ("budget_nan", lambda w, r: _run(r, "--resident-fraction", "nan"), "--resident-fraction"),
    ("budget_inf", lambda w, r: _run(r, "--device-memory-gb", "inf"), "--device-memory-gb"),
    ("budget_negative", lambda w, r: _run(r, "--device-memory-gb", "-4"), "--device-memory-gb"),
    ("budget_fraction_above_one", lambda w, r: _run(r, "--resident-fraction", "1.5"), "--resident-fraction"),
    ("slots_beyond_experts", lambda w, r: _run(r, "--resident-per-layer", "999"), "999"),
    ("threads_zero", lambda w, r: _run(r, "--threads", "0"), "--threads"),
    ("warmup_prompts_negative", lambda w, r: _run(r, "--warmup-prompts", "-2"), "--warmup-prompts"),
    ("system_option_negative", lambda w, r: _run(r, "--system-option", "noise=-1", system="specter-oracle"),
     "noise"),
    ("system_option_nan", lambda w, r: _run(r, "--system-option", "noise=nan", system="specter-oracle"), "noise"),
    ("system_option_unknown", lambda w, r: _run(r, "--system-option", "bogus=1"), "bogus"),
    ("system_option_not_key_value", lambda w, r: _run(r, "--system-option", "noise"), "NAME=VALUE"),
    ("system_option_given_twice", lambda w, r: _run(r, "--system-option", "noise=0.1", "--system-option", "noise=0.2",
                                                    system="specter-oracle"), "noise is given twice"),
    ("group_size_zero", lambda w, r: ["quantize", "--model", r["model"], "--method", "rtn", "--group-size", "0",
                                      "--out", "{out}"], "--group-size"),
    ("fidelity_new_tokens_beyond_positions", lambda w, r: ["fidelity", "--model", r["model"], "--draft",
                                                            str(r["draft"]), "--new-tokens", "1000",
                                                            "--out", "{out}.csv"], "max_position_embeddings"),
    ("fidelity_new_tokens_huge_unbounded_work", lambda w, r: ["fidelity", "--model", r["model"], "--draft",
                                                               str(r["draft"]), "--new-tokens", str(10**6),
                                                               "--out", "{out}.csv"], "--new-tokens 1000000"),
    ("quantize_calibration_beyond_positions", lambda w, r: ["quantize", "--model", r["model"], "--group-size", "32",
                                                            "--calibration-length", "2048", "--out", "{out}"],
     "the model's 512 (max_position_embeddings)"),
    ("quantize_calibration_one_beyond_positions_keeps_an_earlier_log", lambda w, r: [
        "quantize", "--model", r["model"], "--group-size", "32", "--calibration-length", "513", "--gptq-log",
        "{out}.txt", "--out", "{out}"], "--calibration-length 513"),
    ("stride_zero", lambda w, r: ["fidelity", "--model", r["model"], "--draft", str(r["draft"]), "--stride", "0",
                                  "--out", "{out}.csv"], "--stride"),
    ("run_model_path_with_a_bar", lambda w, r: _run(r, model=str(Path(shutil.copytree(r["model"], w / "ti|ny")))),
     "tables and reports print it, and a | or a control"),
    ("plan_memory_group_size_dividing_no_width", lambda w, r: ["plan-memory", "mixtral-8x7b", "--group-size",
                                                               "1048576"], "--group-size 1048576 does not divide"),
    ("profile_named_as_a_preset", lambda w, r: ["profile-bandwidth", "--out", "{out}", "--name", "T4-PCIe3"],
     "--name 'T4-PCIe3' is the preset 't4-pcie3''s name"),
    ("profile_name_with_a_bar", lambda w, r: ["profile-bandwidth", "--out", "{out}", "--name", "my|gpu"],
     "--name 'my|gpu' is not a name of printable ASCII"),
    ("repeats_below_ten", lambda w, r: ["profile-bandwidth", "--out", "{out}", "--repeats", "3"], "--repeats"),
    ("empty_system_list", lambda w, r: [*_sweep(r)[:1], "--systems", ",", *_sweep(r)[3:]], "--systems"),
    ("unknown_system", lambda w, r: _run(r, system="bogus"), "bogus"),
    ("sweep_k_not_a_number", lambda w, r: _sweep(r, "--k", "2,x"), "x"),
    ("sweep_one_preset_by_its_name_and_its_file", lambda w, r: _sweep(
        r, "--hardware", f"t4-pcie3,{Path(__file__).parents[1] / 'specter/presets/hardware/t4-pcie3.yaml'}"),
     "are one profile (t4-pcie3, the same numbers)"),
    ("sweep_dispatch_of_the_profile_and_profile", lambda w, r: _sweep(
        r, "--hardware", "a100-40gb-pcie4", "--dispatch-us", "10,profile"),
     "--dispatch-us 10 and profile are one profile (a100-40gb-pcie4"),
    ("sweep_one_option_setting_written_two_ways", lambda w, r: _sweep(
        r, "--systems", "ktransformers", "--system-option", "cuda-graph=1,true"),
     "--system-option cuda-graph=1 and cuda-graph=true are one setting of ktransformers"),
    ("arm_without_a_name", lambda w, r: _sweep(r, "--arm", "prefetch=none"), "has no name"),
    ("arm_bad_option_value", lambda w, r: _sweep(r, "--arm", "x:draft-kv=bogus"), "draft-kv='bogus'"),
    ("unknown_cost_as", lambda w, r: _run(r, "--cost-as", "gpt-17"), "gpt-17"),
    ("unknown_command", lambda w, r: ["frobnicate"], "frobnicate"),
    ("bits_not_supported", lambda w, r: ["quantize", "--model", r["model"], "--bits", "5", "--out", "{out}"],
     "--bits"),
    ("build_unknown_name", lambda w, r: ["build-model", "llama-900b", "--out", "{out}"], "llama-900b"),
    ("build_set_unknown_key", lambda w, r: ["build-model", "smollm2-moe", "--set", "bogus=1", "--out", "{out}"],
     "bogus"),
    ("build_set_bad_value", lambda w, r: ["build-model", "smollm2-moe", "--set", "distill_steps=lots",
                                          "--out", "{out}"], "distill_steps"),
    ("build_tiny_set_unknown_key", lambda w, r: ["build-model", "tiny-mixtral", "--set", "hidden=64", "--out",
                                                 "{out}"], "--set hidden: not a setting of tiny-mixtral"),
    ("build_tiny_set_not_a_number", lambda w, r: ["build-model", "tiny-mixtral", "--set", "hidden_size=big",
                                                  "--out", "{out}"], "hidden_size='big': not a whole number"),
    ("build_tiny_set_a_million_layers", lambda w, r: ["build-model", "tiny-mixtral", "--set",
                                                      "num_hidden_layers=1000000", "--out", "{out}"],
     "num_hidden_layers is 1000000, it must be at most 1024"),
    ("build_tiny_set_zero", lambda w, r: ["build-model", "tiny-mixtral", "--set", "num_hidden_layers=0",
                                          "--out", "{out}"], "num_hidden_layers=0"),
    ("build_tiny_set_heads_not_dividing", lambda w, r: ["build-model", "tiny-mixtral", "--set", "hidden_size=66",
                                                        "--out", "{out}"], "not a multiple of num_attention_heads"),
    ("build_tiny_set_dtype_unknown", lambda w, r: ["build-model", "tiny-mixtral", "--set", "dtype=int8",
                                                   "--out", "{out}"], "--set dtype='int8'"),
    # --- hardware profiles: every field finite and in range, including the per-size bandwidth points ---
    ("hardware_boolean_yaml_1_1_only", lambda w, r: _run(r, "--hardware", _write(
        w, "yes.yaml", yaml.safe_dump(r["preset"]).replace("device:\n", "device:\n  synchronous: yes\n", 1))),
     "'yes' is a boolean only YAML 1.1 reads; write true or false"),
    ("hardware_description_a_list", lambda w, r: _run(r, "--hardware", _profile(
        w, r, lambda d: d.update(description=["a", "b"]))), "description must be text, got ['a', 'b']"),
    ("hardware_source_empty", lambda w, r: _run(r, "--hardware", _profile(
        w, r, lambda d: d["sources"].update({"device.memory_gb": " "}))),
     "sources.device.memory_gb must say where its number comes from"),
    ("hardware_bandwidth_point_nan", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d["link"].update(
        h2d_by_size=[{"bytes": 4096, "pinned_gbps": float("nan"), "pageable_gbps": 5.0}]))), "h2d_by_size"),
    ("hardware_bandwidth_point_not_a_list", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d[
        "link"].update(h2d_by_size="fast"))), "h2d_by_size"),
    ("hardware_bandwidth_point_huge_size", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d[
        "link"].update(h2d_by_size=[{"bytes": 1e400, "pinned_gbps": 5.0, "pageable_gbps": 5.0}]))), "h2d_by_size"),
    ("hardware_pinned_figure_other_than_its_points", lambda w, r: _run(r, "--hardware", _profile(
        w, r, lambda d: d["link"].update(h2d_by_size=[{"bytes": 4096, "pinned_gbps": 0.5, "pageable_gbps": 0.5}]))),
     "link.h2d_pinned_gbps is 12, and its largest measured point"),
    ("hardware_a_point_size_twice", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d["link"].update(
        h2d_by_size=[{"bytes": 4096, "pinned_gbps": 1.0, "pageable_gbps": 1.0},
                     {"bytes": 4096, "pinned_gbps": 12.0, "pageable_gbps": 7.47}]))), "gives 4096 bytes twice"),
    ("hardware_a_point_key_misspelt", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d["link"].update(
        h2d_by_size=[{"bytes": 4096, "pinned_gbps": 12.0, "pageable_gbps": 7.47, "pinned_gpbs": 1.0}]))),
     "and nothing else"),
    ("hardware_a_point_of_fractional_bytes", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d[
        "link"].update(h2d_by_size=[{"bytes": 1.9, "pinned_gbps": 12.0, "pageable_gbps": 7.47}]))),
     "a whole number of bytes"),
    ("hardware_measured_as_text", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d.update(
        measured="false", name="mine"))), "measured must be true or false"),
    ("hardware_a_lookalike_of_a_presets_name", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d.update(
        name="t4\u2011pcie3"))), "is not a name of printable ASCII"),
    ("hardware_link_bandwidth_zero", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d["link"].update(
        h2d_pinned_gbps=0))), "h2d_pinned_gbps"),
    ("hardware_device_tflops_inf", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d["device"].update(
        peak_tflops=float("inf")))), "peak_tflops"),
    ("hardware_latency_negative", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d["link"].update(
        latency_us=-1))), "latency_us"),
    ("hardware_missing_section", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d.pop("host"))),
     "host"),
    ("hardware_tflops_astronomical", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d["device"].update(
        peak_tflops=1e300))), "device.peak_tflops"),
    ("hardware_integer_too_large_for_a_float", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d[
        "host"].update(peak_tflops=10**400))), "host.peak_tflops"),
    ("hardware_memory_astronomical_overflowed", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d[
        "device"].update(memory_gb=1e300))), "device.memory_gb"),
    ("hardware_latency_astronomical", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d["link"].update(
        latency_us=1e12))), "link.latency_us"),
    ("hardware_bandwidth_astronomical", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d["host"].update(
        memory_bandwidth_gbps=1e40))), "host.memory_bandwidth_gbps"),
    ("hardware_bandwidth_point_astronomical_size", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d[
        "link"].update(h2d_by_size=[{"bytes": 1e300, "pinned_gbps": 5.0, "pageable_gbps": 5.0}]))),
     "h2d_by_size[0].bytes"),
    ("hardware_bandwidth_points_too_many", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d[
        "link"].update(h2d_by_size=[{"bytes": 4096 + i, "pinned_gbps": 5.0, "pageable_gbps": 5.0}
                                    for i in range(5000)]))), "h2d_by_size"),
    ("hardware_sources_not_a_mapping", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d.update(
        sources=["a", "b"]))), "sources"),
    ("hardware_key_twice", lambda w, r: _run(r, "--hardware", _write(w, "hw.yaml", yaml.safe_dump(
        {k: v for k, v in r["preset"].items() if k != "description"}).replace(
        "device:\n", "device:\n  memory_gb: 80\n", 1)), system="on-demand"), "appears twice"),
    ("hardware_alias_bomb", lambda w, r: _run(r, "--hardware", _write(w, "hw.yaml", _ALIAS_BOMB + yaml.safe_dump(
        {k: v for k, v in r["preset"].items() if k != "description"})), system="on-demand"), "alias"),
    ("hardware_file_too_large", lambda w, r: _run(r, "--hardware", _write(w, "hw.yaml", yaml.safe_dump(r["preset"])
                                                                           + "#" * (2 << 20))), "MAX_PROFILE_BYTES"),
    ("hardware_nested_too_deeply", lambda w, r: _run(r, "--hardware", _write(w, "hw.yaml", "[" * 100_000)),
     "hw.yaml"),
    ("hardware_not_text", lambda w, r: _run(r, "--hardware", _write(w, "hw.yaml", b"\xff\xfe\x00" * 100)), "UTF-8"),
    ("hardware_not_yaml", lambda w, r: _run(r, "--hardware", _write(w, "hw.yaml", "link: [unclosed\n")), "hw.yaml"),
    ("hardware_unknown_preset", lambda w, r: _run(r, "--hardware", "quantum-9000"), "quantum-9000"),
    # --- corrupt or truncated weights, drafts and memos ---
    ("weights_truncated", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: _truncate(
        d / "model.safetensors"))), "model.safetensors"),
    ("weights_bytes_flipped_in_header", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: _flip(
        d / "model.safetensors", 0.0))), "model"),
    ("config_not_json", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: _truncate(d / "config.json"))),
     "config.json"),
    ("config_empty", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: (d / "config.json").write_text(""))),
     "config.json"),
    ("model_missing", lambda w, r: _run(r, model=str(w / "nowhere")), "does not exist"),
    ("draft_experts_truncated", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: _truncate(
        d / "experts.safetensors"))), "experts.safetensors"),
    ("draft_experts_bytes_flipped", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: _flip(
        d / "experts.safetensors", 0.0))), "experts.safetensors"),
    ("draft_meta_bits_edited", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: _edit_json(
        d / "meta.json", bits=3))), "bits"),
    ("draft_meta_bytes_per_expert_edited", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: _edit_json(
        d / "meta.json", quantized_bytes_per_expert=1))), "quantized_bytes_per_expert is 1"),
    ("draft_meta_bytes_per_expert_edited_same_memory", lambda w, r: _without(_run(
        r, "--same-memory-as", "2", system="on-demand", draft=_draft_copy(w, r, lambda d: _edit_json(
            d / "meta.json", quantized_bytes_per_expert=1))), "--resident-per-layer"),
     "quantized_bytes_per_expert is 1"),
    ("draft_of_another_model_pricing_same_memory", lambda w, r: _without(_run(
        r, "--same-memory-as", "2", system="on-demand", draft=str(r["other_same_shapes"])), "--resident-per-layer"),
     "--same-memory-as prices Specter's memory with draft"),
    ("draft_meta_method_relabelled", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: _edit_json(
        d / "meta.json", method="gptq", calibration={"corpus": "x", "num_sequences": 1, "seq_len": 1}))),
     "method is 'gptq', and its experts were written as 'rtn'"),
    ("draft_meta_sym_flipped", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: _edit_json(
        d / "meta.json", sym=False))), "sym is False, and its experts were written as True"),
    ("draft_meta_key_twice", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: (d / "meta.json").write_text(
        (d / "meta.json").read_text().rstrip().rstrip("}") + ', "bits": 4}'))), "the key 'bits' is given twice"),
    ("draft_meta_bits_out_of_range", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: _edit_json(
        d / "meta.json", bits=99))), "bits"),
    ("draft_meta_group_size_zero", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: _edit_json(
        d / "meta.json", group_size=0))), "group_size"),
    ("draft_meta_seconds_nan", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: _edit_json(
        d / "meta.json", seconds=float("nan")))), "seconds nan"),
    ("draft_meta_threads_negative", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: _edit_json(
        d / "meta.json", numerics={"threads": -2}))), "threads >= 1"),
    ("draft_meta_rtn_claims_calibration", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: _edit_json(
        d / "meta.json", method="gptq"))), "calibration None"),
    ("draft_meta_sparse_gigabytes", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: os.truncate(
        d / "meta.json", 1 << 26))), "larger than"),
    ("draft_experts_of_another_draft", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: shutil.copyfile(
        r["other_same_shapes"] / "experts.safetensors", d / "experts.safetensors"))),
     "is not the file its meta.json was written with"),
    ("draft_meta_not_json", lambda w, r: _run(r, draft=_draft_copy(w, r, lambda d: _truncate(d / "meta.json"))),
     "meta.json"),
    ("draft_of_another_model", lambda w, r: _run(r, draft=str(r["other_draft"])), "draft"),
    ("draft_missing", lambda w, r: _run(r, draft=str(w / "nowhere")), "nowhere"),
    ("memo_in_the_old_pickle_format", lambda w, r: _run(r, "--memo", _write(w, "memo.json.gz", gzip.compress(
        b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94.")), system="on-demand"), "memo"),
    ("memo_not_gzip", lambda w, r: _run(r, "--memo", _write(w, "memo.json.gz", b"plain bytes"),
                                        system="on-demand"), "memo"),
    ("memo_wrong_version", lambda w, r: _run(r, "--memo", _write(w, "memo.json.gz", gzip.compress(
        b'{"format": "specter-memo-0"}\n')), system="on-demand"), "memo"),
    ("memo_missing", lambda w, r: _run(r, "--memo", str(w / "none.json.gz"), system="on-demand"), "none.json.gz"),
    # --- prompt files ---
    ("prompt_cell_not_text", lambda w, r: _run(r, "--dataset", _write(w, "p.jsonl", '{"prompt": {"a": 1}}\n')),
     "row 1"),
    ("prompt_cells_all_missing", lambda w, r: _run(r, "--dataset", _write(w, "p.jsonl", '{"prompt": null}\n')),
     "non-empty"),
    ("prompt_cells_all_empty", lambda w, r: _run(r, "--dataset", _write(w, "p.csv", 'prompt,x\n"",1\n" ",2\n')),
     "non-empty"),
    ("prompt_file_empty", lambda w, r: _run(r, "--dataset", _write(w, "p.csv", "")), "empty"),
    ("prompt_file_no_text_field", lambda w, r: _run(r, "--dataset", _write(w, "p.csv", "a,b\n1,2\n")), "--field"),
    ("prompt_file_unknown_field", lambda w, r: _run(r, "--dataset", _write(w, "p.csv", "prompt\nhi\n"),
                                                    "--field", "nope"), "nope"),
    ("prompt_file_malformed_json", lambda w, r: _run(r, "--dataset", _write(w, "p.jsonl", '{"prompt": \n')),
     "p.jsonl"),
    ("prompt_file_unknown_format", lambda w, r: _run(r, "--dataset", _write(w, "p.xml", "<p/>")), ".xml"),
    # --- malformed input to aggregate and plot ---
    ("aggregate_records_missing", lambda w, r: ["aggregate", "main", str(w / "none.jsonl"), "--out", "{out}.csv"],
     "none.jsonl"),
    ("aggregate_records_truncated", _aggregate(lambda p: _truncate(
        p, 0.3)), "in.jsonl:1"),
    ("aggregate_records_bytes_flipped", _aggregate(lambda p: _flip(
        p, 0.01)), "in.jsonl:1"),
    ("aggregate_records_not_objects", lambda w, r: ["aggregate", "main", _write(w, "in.jsonl", "[1, 2]\n"),
                                                    "--out", "{out}.csv"], "not a JSON object"),
    ("aggregate_records_field_missing", lambda w, r: ["aggregate", "main", _write(w, "in.jsonl", '{"a": 1}\n'),
                                                      "--out", "{out}.csv"], "lacks"),
    ("aggregate_records_field_wrong_type", _aggregate(_record_field("tpot_ms", "fast")), "tpot_ms"),
    ("aggregate_records_empty", lambda w, r: ["aggregate", "main", _write(w, "in.jsonl", "\n"),
                                              "--out", "{out}.csv"], "no records"),
    ("aggregate_fidelity_not_a_summary", lambda w, r: ["aggregate", "fidelity", _write(w, "f.json", "{}"),
                                                       "--out", "{out}.csv"], "fidelity summary"),
    ("aggregate_fidelity_not_json", lambda w, r: ["aggregate", "fidelity", _write(w, "f.json", "{"),
                                                  "--out", "{out}.csv"], "f.json"),
    # --- profiles and checkpoints that would run silently as something else ---
    ("hardware_unknown_key", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d["device"].update(
        memroy_gb=80))), "unknown key device.memroy_gb"),
    ("hardware_unknown_section", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d.update(
        links={}))), "unknown key links"),
    ("hardware_a_presets_name_with_other_numbers", lambda w, r: _run(r, "--hardware", _profile(
        w, r, lambda d: d["device"].update(memory_gb=80))), "a preset's name, with other numbers"),
    ("weights_an_expert_stored_as_int32", lambda w, r: _run(r, model=_model_copy(w, r, _weights(lambda t: t.update(
        {_EXPERT: t[_EXPERT].to(__import__("torch").int32)}))), system="on-demand"), "stored as int32"),
    ("weights_a_tensor_in_two_shards", lambda w, r: _run(r, model=_model_copy(w, r, _tensor_twice),
                                                         system="on-demand"), "is stored in both"),
    ("live_weights_a_tensor_in_two_shards", lambda w, r: _live(r, _model_copy(w, r, _tensor_twice)),
     "is stored in both"),
    ("weights_the_index_misplaces_a_tensor", lambda w, r: _run(r, model=_model_copy(
        w, r, lambda d: _index_of(d, misplace=True)), system="on-demand"), "the index and its shards disagree"),
    ("live_weights_the_index_omits_a_tensor", lambda w, r: _live(r, _model_copy(
        w, r, lambda d: _index_of(d, misplace=False))), "the index and its shards disagree"),
    ("run_dataset_fewer_prompts_than_asked", lambda w, r: _run(r, "--dataset", _write(
        w, "p.jsonl", '{"prompt": "def f(x): return x"}\n{"prompt": "def g(y): return y"}\n'), "--num-prompts", "5"),
     "has 2 distinct inputs of at least 8 tokens"),
    ("live_weights_two_tensors_on_the_same_bytes", lambda w, r: _live(r, _model_copy(w, r, _overlapping)),
     "byte ranges overlap or leave gaps"),
    ("sweep_arm_name_with_a_line_separator", lambda w, r: _sweep(r, "--arm", "full", "--arm",
                                                                  "no\u2028prefetch:prefetch=none"),
     "holds a control character"),
    ("live_weights_an_expert_stored_as_int32", lambda w, r: _live(r, _model_copy(w, r, _weights(lambda t: t.update(
        {_EXPERT: t[_EXPERT].to(__import__("torch").int32)})))), "stored as int32"),
    ("weights_a_stale_file_beside_the_shards", lambda w, r: _run(r, model=_model_copy(w, r, _stale_beside),
                                                                 system="on-demand"), "does not list"),
    ("live_weights_a_stale_file_beside_the_shards", lambda w, r: _live(r, _model_copy(w, r, _stale_beside)),
     "does not list"),
    ("tokenizer_not_json", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: (
        d / "tokenizer.json").write_text("{garbage")), system="on-demand"), "the tokenizer of the checkpoint"),
    ("weights_index_nested_too_deeply", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: (
        d / "model.safetensors.index.json").write_text("[" * 100_000)), system="on-demand"),
     "is not an index of its weights"),
    ("weights_a_link_to_a_device", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: (
        (d / "model.safetensors").unlink(), (d / "model.safetensors").symlink_to("/dev/zero"))),
        system="on-demand"), "is not a regular file"),
    ("live_weights_a_link_to_a_device", lambda w, r: _live(r, _model_copy(w, r, lambda d: (
        (d / "model.safetensors").unlink(), (d / "model.safetensors").symlink_to("/dev/zero")))),
     "is not a regular file"),
    ("weights_index_garbage", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: (
        d / "model.safetensors.index.json").write_text('{"weight_map": 7}')), system="on-demand"),
     "is not an index of its weights"),
    ("live_weights_index_garbage", lambda w, r: _live(r, _model_copy(w, r, lambda d: (
        d / "model.safetensors.index.json").write_text("[]"))), "is not an index of its weights"),
    ("hardware_a_presets_name_in_other_case", lambda w, r: _run(r, "--hardware", _profile(
        w, r, lambda d: d.update(name=" T4-PCIE3 "))), "reads as the preset 't4-pcie3'"),
    ("weights_a_shard_missing", lambda w, r: _run(r, model=_model_copy(w, r, _shard_gone), system="on-demand"),
     "lacks model-00002-of-00002.safetensors"),
    ("live_weights_a_shard_missing", lambda w, r: _live(r, _model_copy(w, r, _shard_gone)),
     "lacks model-00002-of-00002.safetensors"),
    # --- records no run writes: the same record twice, a second one for a prompt, impossible values ---
    ("aggregate_the_same_records_twice", lambda w, r: ["aggregate", "main", str(r["records"]), str(r["records"]),
                                                       "--out", "{out}.csv"], "repeats record 1"),
    ("aggregate_a_copy_of_the_records_beside_them", lambda w, r: ["aggregate", "main", str(r["records"]),
                                                                  _records_copy(w, r, lambda p: None),
                                                                  "--out", "{out}.csv"], "repeats record 1"),
    ("aggregate_a_second_record_for_a_prompt", _aggregate(_second_record(
        wall_s=1.0)), "repeats record 1"),
    ("aggregate_the_run_written_to_two_paths", lambda w, r: ["aggregate", "main", str(r["records"]), _records_copy(
        w, r, _config_field("out", "elsewhere.jsonl")), "--out", "{out}.csv"], "two records of one run"),
    ("aggregate_the_run_at_its_default_k_and_at_that_k", lambda w, r: ["aggregate", "main", str(r["records"]),
                                                                       _records_copy(w, r, _both(
        _config_field("k", None), _config_field("k_source", "the default"))), "--out", "{out}.csv"],
     "two records of one run"),
    ("aggregate_two_models_of_one_name", lambda w, r: ["aggregate", "main", str(r["records"]), _records_copy(
        w, r, _both(_config_field("model_sha256", "0" * 64), _config_field("seed", 43), _record_field("seed", 43))),
        "--out", "{out}.csv"], "both name their model"),
    ("aggregate_two_prompt_files_of_one_name", lambda w, r: ["aggregate", "main", str(r["records"]), _records_copy(
        w, r, _both(_record_field("prompt_token_ids", [*_first_record(r)["prompt_token_ids"][:-1], 7]),
                    _config_field("seed", 43), _record_field("seed", 43))), "--out", "{out}.csv"],
     "as other tokens: two prompt files of one name"),
    ("aggregate_two_greedy_runs_of_other_tokens", lambda w, r: ["aggregate", "main", str(r["records"]),
                                                                _records_copy(w, r, _both(
        _record_field("output_token_ids", [*_first_record(r)["output_token_ids"][:-1], 3]),
        _config_field("seed", 43), _record_field("seed", 43))), "--out", "{out}.csv"],
     "greedily on the same numerics into other tokens"),
    ("aggregate_a_prompt_file_named_as_a_shipped_set", lambda w, r: ["aggregate", "main", str(r["records"]),
                                                                     _records_copy(w, r, _both(
        _record_field("dataset", "/x/code.jsonl"), _config_field("dataset", "/x/code.jsonl"))), "--out",
                                                                     "{out}.csv"], "the tables call both 'code'"),
    ("aggregate_records_without_the_models_hash", _aggregate(_config_field("model_sha256", None)),
     "config lacks model_sha256"),
    ("aggregate_records_parts_of_time_not_its_tpot", _aggregate(_extra_edit(
        lambda e: e["breakdown_ms"].update(draft=e["breakdown_ms"]["draft"] * 3 + 1))), "extra.breakdown_ms's parts"),
    ("aggregate_records_resident_bytes_not_their_parts", lambda w, r: _aggregate(_config_field("memory", {
        **_first_record(r)["config"]["memory"], "resident_bytes": 10**15, "fits_device": False}))(w, r),
     "config.memory.resident_bytes is 1000000000000000"),
    ("aggregate_records_fits_device_flipped", lambda w, r: _aggregate(_config_field("memory", {
        **_first_record(r)["config"]["memory"], "fits_device": False}))(w, r), "config.memory.fits_device is False"),
    ("aggregate_records_bound_not_the_one_it_names", _aggregate(_extra_edit(lambda e: e.update(
        lower_bound_per_pass_ms=e["lower_bound_per_pass_ms"] * 2, lower_bound_per_token_ms=e[
            "lower_bound_per_token_ms"] * 2))), "and its per-"),
    ("aggregate_records_pricing_not_its_priced_ops", _aggregate(_config_field("pricing", "upstream")),
     "config.pricing is 'upstream' (upstream), and its priced ops are 'fused'"),
    ("aggregate_records_dispatch_not_its_profiles", _aggregate(_config_field("dispatch_us", 5.0)),
     "config.dispatch_us is 5.0, and its profile's dispatch is"),
    ("aggregate_config_names_another_preset", _aggregate(_config_field("hardware", "rtx4090-pcie4")),
     "config.hardware is the preset 'rtx4090-pcie4'"),
    ("aggregate_one_prompt_relabelled_as_another", _aggregate(_one_prompt_relabelled), "a run's prompts are distinct"),
    ("aggregate_records_of_one_run_with_two_configs", _aggregate(_two_prompts_other_configs),
     "differ in config numerics.threads: one run's records share one config"),
    ("aggregate_records_expert_slots_not_slots_times_layers", lambda w, r: _aggregate(_config_field("memory", {
        **_first_record(r)["config"]["memory"],
        "expert_slot_bytes": 2 * _first_record(r)["config"]["memory"]["expert_slot_bytes"]}))(w, r),
     "slots in each of 2 MoE layers hold"),
    ("aggregate_records_placed_experts_not_whole", lambda w, r: _aggregate(_config_field("memory", {
        **_first_record(r)["config"]["memory"], "placed_slot_bytes": 7}))(w, r),
     "config.memory.placed_slot_bytes is 7, not whole experts"),
    ("aggregate_records_device_bytes_not_its_profiles", lambda w, r: _aggregate(_config_field("memory", {
        **_first_record(r)["config"]["memory"], "device_bytes": 80_000_000_000}))(w, r),
     "config.memory.device_bytes is 80000000000"),
    ("aggregate_records_fewer_tokens_than_its_run_commits", _aggregate(_config_field("max_new_tokens", 20)),
     "output tokens, and its run commits config.max_new_tokens = 20"),
    ("aggregate_records_prefill_bytes_negative", _aggregate(_extra_edit(lambda e: e.update(h2d_bytes_prefill=-5))),
     "extra.h2d_bytes_prefill is -5"),
    ("aggregate_records_writeback_not_whole_experts",
     _aggregate(_extra_edit(lambda e: e.update(d2h_bytes_writeback=7))),
     "extra.d2h_bytes_writeback is 7, and a prefetch, a prefill or a write-back copies whole experts"),
    ("aggregate_records_without_their_options", _aggregate(_config_field("system_options", None)),
     "config lacks system_options, which every run of this version writes"),
    ("aggregate_records_expert_bits_not_their_storage", _aggregate(_config_field("expert_bits", "q4_k_m")),
     "config.expert_bits is 'q4_k_m', and its experts are stored at 16"),
    ("aggregate_records_expert_bits_no_run_takes", _aggregate(_config_field("expert_bits", 5)),
     "config.expert_bits is 5"),
    ("aggregate_records_of_two_versions_in_one_file", _aggregate(_second_record(versions={"torch": "0.0"})),
     "one run file is written by one run of one version"),
    ("aggregate_records_lower_bound_kind_unknown", _aggregate(_extra_edit(lambda e: e.update(lower_bound_kind="x"))),
     "extra.lower_bound_kind is 'x', and a lower bound is per-pass or per-token"),
    ("aggregate_records_lower_bound_kind_of_another_run", _aggregate(_extra_edit(lambda e: e.update(
        lower_bound_kind="per-token"))), "a run's bound is per-pass where it drafts windows"),
    ("aggregate_records_lower_bound_kind_missing", _aggregate(_extra_edit(lambda e: e.pop("lower_bound_kind"))),
     "extra.lower_bound_kind is None"),
    ("aggregate_records_other_bound_negative", _aggregate(_extra_edit(lambda e: e.update(lower_bound_per_token_ms=-1))),
     "extra.lower_bound_per_token_ms is -1, not a time of at least 0 ms"),
    ("aggregate_records_fewer_misses_than_the_decodes", _aggregate(_both(
        _record_field("demand_misses", 1), _record_field("demand_hits", 0), _record_field("hit_rate", 0.0))),
     "fewer than the decode's own"),
    ("aggregate_records_demand_bytes_one_off", lambda w, r: _aggregate(_record_field(
        "h2d_bytes_demand", _first_record(r)["h2d_bytes_demand"] + 1))(w, r), "demand misses copy"),
    ("aggregate_records_misses_without_bytes", _aggregate(_record_field("h2d_bytes_demand", 0)),
     "with no bytes copied on demand"),
    ("aggregate_two_profiles_of_one_name", lambda w, r: ["aggregate", "main", str(r["records"]), _records_copy(
        w, r, _other_machine), "--out", "{out}.csv"], "both name their hardware 't4-pcie3', with other numbers"),
    ("aggregate_tpot_negative", _aggregate(_record_field("tpot_ms", -5.0)), "tpot_ms is -5.0"),
    ("aggregate_tpot_nan", _aggregate(_record_field("tpot_ms", float("nan"))), "tpot_ms is nan"),
    ("aggregate_ttft_infinite", _aggregate(_record_field("ttft_ms", float("inf"))), "ttft_ms is inf"),
    ("aggregate_tpot_zero_over_tokens", _aggregate(_record_field("tpot_ms", 0.0)), "tpot_ms is 0"),
    ("aggregate_hit_rate_above_one", _aggregate(_record_field("hit_rate", 1.5)), "hit_rate is 1.5"),
    ("aggregate_misses_negative", _aggregate(_record_field("demand_misses", -1)), "demand_misses is -1"),
    ("aggregate_more_slots_than_experts", _aggregate(_record_field("slots_per_layer", 99)), "slots_per_layer is 99"),
    ("aggregate_tpot_beyond_a_day", _aggregate(_record_field("tpot_ms", 1e300)), "tpot_ms is 1e+300"),
    ("aggregate_tpot_under_its_lower_bound", _aggregate(_record_field("tpot_ms", 1e-9)), "under its own lower bound"),
    ("aggregate_k_negative", _aggregate(_record_field("k", -2)), "k is -2"),
    ("aggregate_no_tokens", _aggregate(_record_field("output_token_ids", [])), "output_token_ids is empty"),
    ("aggregate_histogram_negative", _aggregate(_record_field("accepted_length_histogram", {"1": -3})),
     "accepted_length_histogram"),
    ("aggregate_working_set_beyond_experts", _aggregate(_record_field("window_working_set", 50.0)),
     "window_working_set is 50.0"),
    ("aggregate_lower_bound_zero", _aggregate(_record_field("lower_bound_tpot_ms", 0.0)), "lower_bound_tpot_ms is 0.0"),
    ("aggregate_token_id_negative", _aggregate(_record_field("output_token_ids", [-5, 74, 74])),
     "a token id is negative"),
    ("aggregate_prompt_beyond_the_run", _aggregate(_record_field("prompt_index", 7)),
     "prompt_index is 7 in a run of 1 prompts"),
    ("aggregate_speculative_without_windows", _aggregate(_record_field("accepted_length_histogram", {})),
     "accepted_length_histogram is empty"),
    ("aggregate_hardware_other_than_its_profile", _aggregate(_record_field("hardware", "a100-40gb-pcie4")),
     "hardware is 'a100-40gb-pcie4', and the profile it was simulated on is named 't4-pcie3'"),
    ("aggregate_k_other_than_its_setting", _aggregate(_record_field("k", 5)),
     "k is 5, and the run's window is config.k = 2"),
    ("aggregate_histogram_longer_than_k", _aggregate(_record_field("accepted_length_histogram", {"9": 1})),
     "an accepted length outside 0..K"),
    ("aggregate_histogram_not_the_tokens", _aggregate(_record_field("accepted_length_histogram", {"2": 40})),
     "windows commit 120 tokens"),
    ("aggregate_histogram_key_not_a_number", _aggregate(_record_field("accepted_length_histogram", {"two": 3})),
     "a key that is not a whole number"),
    ("aggregate_system_other_than_its_config", _aggregate(_record_field("system", "sp-moe")),
     "system is 'sp-moe', and its run's config.system is 'specter'"),
    ("aggregate_simulated_flag_off_on_a_simulation", _aggregate(_record_field("simulated", False)),
     "simulated is False on engine 'sim'"),
    ("aggregate_slots_other_than_its_config", _aggregate(_record_field("slots_per_layer", 3)), "slots_per_layer is 3"),
    ("aggregate_hit_rate_against_its_counts", _aggregate(_record_field("hit_rate", 0.99)),
     "and its hits and misses give"),
    ("aggregate_tpot_against_its_commits", lambda w, r: _aggregate(_record_field("tpot_ms", 0.2 + _first_record(r)[
        "lower_bound_tpot_ms"]))(w, r), "and its commit times give"),
    ("aggregate_token_ids_not_numbers", _aggregate(_record_field("output_token_ids", ["a", "b"])),
     "output_token_ids holds something other than whole numbers"),
    ("aggregate_profile_edited_under_its_hash", _aggregate(lambda path: _other_machine(path, rehash=False)),
     "config.hardware_sha256 is not the hash"),
    ("aggregate_a_run_cut_short", _aggregate(_config_field("num_prompts", 2)), "has 2 prompts and lacks prompt(s) [1]"),
    ("aggregate_a_field_of_another_shape", _aggregate(_config_field("system_options", ["abc"])),
     "config.system_options is ['abc'], not options given once each as name and text"),
    ("aggregate_prediction_share_above_one", lambda w, r: ["aggregate", "main", _records_copy(
        w, r, _record_field("expert_prediction", [{"layer": 0, "distance": 1, "precision": 5.0, "recall": 1.0}])),
        "--out", "{out}.csv"], "expert_prediction holds"),
    ("aggregate_a_field_no_run_writes", _aggregate(_record_field("tpot_ms_adjusted", 1.0)),
     "field 'tpot_ms_adjusted', which no run of this version writes"),
    ("aggregate_prefetch_bytes_not_whole_experts", _aggregate(_record_field("h2d_bytes_prefetch", 5000)),
     "h2d_bytes_prefetch is 5000"),
    ("aggregate_prediction_past_k", _aggregate(lambda path: _edit_prediction(path, lambda p: p.append(
        dict(p[-1], distance=30)))), "expert_prediction"),
    ("aggregate_prediction_distance_zero", _aggregate(lambda path: _edit_prediction(path, lambda p: p.append(
        dict(p[0], distance=0)))), "expert_prediction"),
    ("aggregate_prediction_stray_layer", _aggregate(lambda path: _edit_prediction(path, lambda p: p.append(
        dict(p[0], layer=7)))), "expert_prediction holds layers"),
    ("aggregate_prediction_pair_twice", _aggregate(lambda path: _edit_prediction(path, lambda p: p.append(
        dict(p[0], precision=0.0)))), "gives one (layer, distance) twice"),
    ("aggregate_system_with_a_bar", lambda w, r: ["aggregate", "main", _records_copy(
        w, r, lambda path: (_record_field("system", "spec|ter")(path), _config_field("system", "spec|ter")(path))),
        "--out", "{out}.csv"], "which no run names"),
    ("aggregate_acceptance_against_its_window_counts", _aggregate(_record_field("acceptance_rate", 0.123)),
     "acceptance_rate is 0.123, and its window counts give"),
    ("aggregate_utilization_against_its_window_counts", _aggregate(_record_field("window_utilization", 0.123)),
     "window_utilization is 0.123, and its window counts give"),
    ("aggregate_profile_missing", _aggregate(_config_field("hardware_profile", None)),
     "config.hardware_profile is missing"),
    # --- a damaged table read by the summary: cut short, lines repeated, impossible values, empty ---
    ("summary_table_cut_short", lambda w, r: _readme(_table_copy(w, r, lambda p: _truncate(p, 0.7))),
     "differ from main.csv.sha256"),
    ("summary_table_cut_short_without_its_checksum", lambda w, r: _readme(_table_copy(
        w, r, lambda p: _truncate(p, 0.7), checksum=False)), "fields and the header"),
    ("summary_table_a_line_twice", lambda w, r: _readme(_table_copy(w, r, lambda p: p.write_text(
        p.read_text() + p.read_text().splitlines()[1] + "\n"), checksum=False)), "repeats line 2"),
    ("summary_table_tpot_negative", lambda w, r: _readme(_table_copy(w, r, _table_cell("tpot_ms", "-1.34"),
                                                                     checksum=False)), "tpot_ms is -1.34"),
    ("summary_table_tpot_nan", lambda w, r: _readme(_table_copy(w, r, _table_cell("tpot_ms", "nan"),
                                                                checksum=False)), "tpot_ms is nan"),
    ("summary_table_empty", lambda w, r: _readme(_table_copy(w, r, lambda p: p.write_text(""), checksum=False)),
     "is empty"),
    ("summary_table_tpot_with_an_underscore", lambda w, r: _readme(_table_copy(w, r, _table_cell("tpot_ms", "5_439"),
                                                                              checksum=False)), "not a number"),
    ("summary_table_its_checksum_damaged", lambda w, r: _readme(_table_copy(w, r, lambda p: Path(
        f"{p}.sha256").write_bytes(b"\x00\xff garbage"))), "is not a sha256sum line"),
    ("summary_table_a_column_twice", lambda w, r: _readme(_table_copy(w, r, _column_twice, checksum=False)),
     "names the column 'tpot_ms' twice"),
    ("summary_table_tpot_not_a_number", lambda w, r: _readme(_table_copy(w, r, _table_cell("tpot_ms", "abc"),
                                                                         checksum=False)), "tpot_ms is 'abc'"),
    ("summary_table_header_again_midway", lambda w, r: _readme(_table_copy(w, r, lambda p: p.write_text(
        p.read_text() + p.read_text().splitlines()[0] + "\n"), checksum=False)), "tpot_ms is 'tpot_ms'"),
    ("summary_table_nul_bytes", lambda w, r: _readme(_table_copy(w, r, lambda p: p.write_bytes(
        p.read_bytes().replace(b"same", b"sa\x00me")), checksum=False)), "NUL bytes"),
    ("summary_table_tpot_beyond_a_day", lambda w, r: _readme(_table_copy(w, r, _table_cell("tpot_ms", "1e300"),
                                                                         checksum=False)), "under a day"),
    ("summary_table_hit_rate_above_one", lambda w, r: _readme(_table_copy(w, r, _table_cell("hit_rate", "7.5"),
                                                                          checksum=False)), "a share is in [0, 1]"),
    ("summary_table_slots_negative", lambda w, r: _readme(_table_copy(w, r, _table_cell("slots_per_layer", "-3"),
                                                                      checksum=False)), "never negative"),
    ("summary_table_slots_infinite", lambda w, r: _readme(_table_copy(w, r, _table_cell("slots_per_layer", "inf"),
                                                                      checksum=False)), "slots_per_layer is 'inf'"),
    ("summary_table_n_zero", lambda w, r: _readme(_table_copy(w, r, _table_cell("n", "0"), checksum=False)),
     "a whole number, at least 1"),
    ("summary_table_speedup_infinite", lambda w, r: _readme(_table_copy(
        w, r, _table_cell("speedup_of_specter", "inf"), checksum=False)), "a ratio is finite and positive"),
    ("aggregate_records_tpot_an_integer_no_float_holds", _aggregate(_record_field("tpot_ms", 10**400)),
     "too large for its field"),
    ("summary_table_speedup_not_its_tpots", _readme_cell("speedup_of_specter", "50"),
     "speedup_of_specter is 50, and no Specter row"),
    ("summary_table_memory_unknown", _readme_cell("memory", "same banana"), "memory is 'same banana', which no run"),
    ("summary_table_simulated_unknown", _readme_cell("simulated", "banana"),
     "simulated is 'banana', neither True nor False"),
    ("summary_claims_interval_not_holding_its_value", lambda w, r: _readme(_claims_with(w, 0, low="5")),
     "does not hold suite"),
    ("summary_claims_figure_negative", lambda w, r: _readme(_claims_with(w, 0, suite="-1.5")),
     "suite is -1.5, and a figure is finite and never negative"),
    ("summary_claims_verdict_not_its_intervals", lambda w, r: _readme(_claims_with(w, 0, verdict="reproduced")),
     "its interval against the paper's figure gives 'not reproduced'"),
    ("summary_claims_verdict_unknown", lambda w, r: _readme(_claims_with(w, 0, verdict="banana")),
     "verdict is 'banana'"),
    ("aggregate_records_profile_numbers_impossible", _aggregate(_profile_number("host", "dispatch_us", -10)),
     "dispatch_us"),
    ("summary_claims_rule_unknown", lambda w, r: _readme(_claims_with(w, 0, rule="value ", verdict="reproduced")),
     "a verdict under rule 'value '"),
    ("summary_claims_paper_empty", lambda w, r: _readme(_claims_with(w, 0, paper="", verdict="reproduced")),
     "and a verdict is against the paper's figure"),
    ("summary_claims_run_seconds_negative", lambda w, r: _readme(_beside(_claims_with(w, 0), "run.yaml", yaml.safe_dump(
        {**yaml.safe_load((Path(__file__).parents[1] / "docs/results/run.yaml").read_text()), "seconds": -5}))),
     "seconds is -5"),
    ("summary_claims_run_command_a_list", lambda w, r: _readme(_beside(_claims_with(w, 0), "run.yaml", yaml.safe_dump(
        {**yaml.safe_load((Path(__file__).parents[1] / "docs/results/run.yaml").read_text()), "command": ["rm"]}))),
     "run.yaml: command is ['rm']"),
    ("summary_table_speedup_without_specter", _readme_cell("system", "sp-moe"),
     "speedup_of_specter is 1, and no Specter row"),
    ("summary_table_tpot_under_its_lower_bound", _readme_cell("lower_bound_tpot_ms", "99999"),
     "under its own lower bound"),
    ("plot_calibration_ratio_not_its_columns", _plot_committed("calibration", 0, suite_over_published="1.0"),
     "and suite over published is"),
    ("plot_calibration_in_band_not_its_ratio", _plot_committed("calibration", 0, in_band="True"),
     "in_band is 'True', and suite_over_published"),
    ("plot_calibration_in_band_without_a_ratio", _plot_committed("calibration", 2, in_band="False"), "is no ratio"),
    ("summary_table_system_unknown", _readme_cell("system", "specter-turbo"),
     "system is 'specter-turbo', which no run"),
    ("summary_table_system_governor_unknown", _readme_cell("system", "specter (K magic)"),
     "system is 'specter (K magic)'"),
    ("summary_table_pricing_unknown", _readme_cell("pricing", "cheap"), "pricing is 'cheap', which no run writes"),
    ("plot_calibration_diagnostic_not_its_ratios", _plot_committed("calibration", 0, diagnostic="False"),
     "diagnostic is 'False', and the ratios"),
    ("aggregate_records_prompt_shorter_than_its_prefix", _aggregate(_record_field("prompt_token_ids", [5, 6, 7])),
     "prompt_token_ids holds 3 tokens, and its run's prompts are 8 long"),
    ("plot_calibration_comparable_unknown", _plot_committed("calibration", 0, comparable="maybe"),
     "neither True nor False"),
    ("plot_sim_vs_measured_ratio_not_its_columns", _plot_committed("sim_vs_measured", 0, measured_over_simulated="50"),
     "and measured_ms over simulated_ms is"),
    ("aggregate_records_system_unknown", _aggregate(_both(
        _record_field("system", "specter-turbo"), _config_field("system", "specter-turbo"))),
     "system is 'specter-turbo', which the suite does not have"),
    ("aggregate_records_a_key_twice", _aggregate(_key_twice("stall_ms", 0.0)), "the key 'stall_ms' is given twice"),
    ("config_a_key_twice", lambda w, r: _run(r, model=_model_copy(w, r, _config_key_twice)),
     "the key 'num_experts_per_tok' is given twice"),
    ("prompts_a_key_twice", lambda w, r: _run(r, "--dataset", _write(
        w, "p.jsonl", '{"prompt": "def f(x): return x", "prompt": "def g(y): return y"}\n')),
     "the key 'prompt' is given twice"),
    ("run_temperature_subnormal", lambda w, r: _run(r, "--temperature", "1e-320"),
     "--temperature must be 0 (greedy) or a number from 1e-06"),
    ("run_same_memory_above_the_experts", lambda w, r: _without(_run(r, "--same-memory-as", "9"),
                                                                "--resident-per-layer"),
     "--same-memory-as 9 must be between 1 and 8"),
    ("summary_table_a_line_break_in_a_cell", _readme_cell("model", '"smollm2-moe\n|evil|"'),
     "one line of printable text"),
    ("summary_table_p99_under_its_p90", lambda w, r: _readme(_resealed(_table_copy(w, r, lambda p: (
        _table_cell("tpot_ms_p99", str(float(_table_value(p, "tpot_ms_p90")) * 0.99))(p)), checksum=False))),
     "tpot_ms_p90 is"),
    ("summary_table_mean_above_its_max", _readme_cell("tpot_ms", "999"), "outside its prompts' range"),
    ("summary_table_dispatch_mixed", lambda w, r: _readme(_resealed(_table_copy(
        w, r, _second_row(system="on-demand", **_NO_WINDOW, dispatch_us="17", speedup_of_specter=""), checksum=False))),
     "the table mixes runs of another protocol"),
    ("summary_table_same_slots_at_other_slots", lambda w, r: _readme(_resealed(_table_copy(
        w, r, _second_row(system="on-demand", **_NO_WINDOW, slots_per_layer="7", resident_share="0.875"),
        checksum=False))),
     "has slots_per_layer 7"),
    ("summary_table_more_slots_than_experts", _readme_cell("experts_per_layer", "1"), "slots_per_layer is 2 with 1"),
    ("summary_table_resident_share_not_its_slots", _readme_cell("resident_share", "0.9"), "resident_share is 0.9"),
    ("plot_calibration_published_zero", _plot_committed("calibration", 0, published="0"),
     "a published figure is finite and positive"),
    ("summary_table_prompt_counts_mixed", lambda w, r: _readme(_resealed(_table_copy(
        w, r, _second_row(system="on-demand", **_NO_WINDOW, n="7"), checksum=False))), "has n 7"),
    ("aggregate_records_priced_at_another_architecture", _aggregate(_record_field("cost_as", "mixtral-8x7b")),
     "cost_as is 'mixtral-8x7b'"),
    ("aggregate_records_engine_not_its_configs", _aggregate(_config_field("engine", "live")),
     "engine is 'sim', and its run's config.engine"),
    ("aggregate_records_pass_hit_rate_not_its_counts", _aggregate(_record_field("hit_rate_pass", 0.123)),
     "hit_rate_pass is 0.123, and extra.counts"),
    ("aggregate_records_memory_plan_of_other_slots", lambda w, r: _aggregate(_config_field("memory", {
        **_first_record(r)["config"]["memory"], "slots_per_layer": 7}))(w, r), "its run's memory plan gives 7"),
    ("aggregate_records_commit_times_null", _aggregate(_extra_edit(lambda e: e.update(commit_ms=None))),
     "extra lacks commit_ms"),
    ("aggregate_records_counts_emptied", lambda w, r: ["aggregate", "main", _records_copy(
        w, r, _both(_extra_edit(lambda e: e.update(counts={})), _record_field("hit_rate_pass", 0.99))),
        "--out", "{out}.csv"], "extra.counts lacks"),
    ("aggregate_records_token_hit_rate_null", _aggregate(_record_field("hit_rate_token", None)),
     "hit_rate_token is None"),
    ("aggregate_records_profiles_hash_null", _aggregate(_config_field("hardware_sha256", "")),
     "config.hardware_sha256 is '', not a sha256"),
    ("aggregate_records_config_without_its_engine", _aggregate(_config_field("engine", None)), "config lacks engine"),
    ("aggregate_records_prefetch_precision_not_its_counts", _aggregate(_record_field("prefetch_precision", 0.1)),
     "prefetch_precision is 0.1"),
    ("aggregate_records_seed_not_its_configs", _aggregate(_record_field("seed", -7)), "seed is -7"),
    ("aggregate_records_stall_longer_than_the_run", _aggregate(_record_field("stall_ms", 5000.0)),
     "stall_ms is 5000.0, longer than the whole"),
    ("aggregate_records_k_on_a_system_without_a_draft", _aggregate(_both(
        _record_field("system", "on-demand"), _config_field("system", "on-demand"))),
     "k is 2 for on-demand, which drafts no window"),
    ("aggregate_records_no_k_on_a_speculative_system", _aggregate(_record_field("k", None)),
     "k is None for specter, which drafts a window"),
    ("plot_main_k_on_a_system_without_a_draft", _plot_committed("main", 0, k="4"),
     "k is 4 for fiddler, which drafts no window"),
    ("plot_main_no_k_on_a_speculative_system", _plot_committed("main", "specter", k=""),
     "k is empty for specter, which drafts a window"),
    ("plot_main_acceptance_on_a_system_without_a_draft", _plot_committed("main", 0, acceptance_rate="0.5"),
     "acceptance_rate is 0.5 for fiddler"),
    ("plot_main_speedup_over_no_specter_row", _plot_committed("main", 0, speedup_of_specter="50"),
     "speedup_of_specter is 50, and no Specter row"),
    ("plot_calibration_metric_no_row_compares", _plot_committed("calibration", 0, metric="bogus_per_s"),
     "metric is 'bogus_per_s', which no run"),
    ("aggregate_records_bytes_no_float_holds", _aggregate(_record_field("h2d_bytes_prefetch", 10**400)),
     "too large for its field"),
    ("aggregate_records_without_commit_times", _aggregate(_extra_edit(lambda e: e.pop("commit_ms"))),
     "extra lacks commit_ms"),
    ("aggregate_records_without_counts", _aggregate(_extra_edit(lambda e: e.pop("counts"))), "extra lacks counts"),
    ("aggregate_records_without_the_profiles_hash", _aggregate(_config_field("hardware_sha256", None)),
     "config lacks hardware_sha256"),
    ("aggregate_records_temperature_negative", _aggregate(_config_field("temperature", -0.7)),
     "config.temperature is -0.7"),
    ("aggregate_records_prefix_negative", _aggregate(_config_field("prefix_tokens", -16)),
     "config.prefix_tokens is -16"),
    ("aggregate_records_more_tokens_than_asked", _aggregate(_config_field("max_new_tokens", 1)), "asked for at most 1"),
    ("summary_results_main_header_only", lambda w, r: ["summary", _results_with(w, r, "main.csv", Path(
        r["table"]).read_text().splitlines()[0] + "\n")], "a header and no rows"),
    ("summary_results_with_an_empty_table", lambda w, r: ["summary", _results_with(w, r, "hardware.csv", "")],
     "is empty"),
    ("plot_table_missing", lambda w, r: ["plot", "main", "--table", str(w / "none.csv"), "--out", "{out}.png"],
     "none.csv"),
    ("plot_table_empty", lambda w, r: ["plot", "main", "--table", _write(w, "t.csv", ""), "--out", "{out}.png"],
     "t.csv"),
    ("plot_table_binary", lambda w, r: ["plot", "main", "--table", _write(w, "t.csv", bytes(range(256)) * 4),
                                        "--out", "{out}.png"], "t.csv"),
    ("plot_table_wrong_columns", lambda w, r: ["plot", "main", "--table", _table_file(w, "t.csv", "a,b\n1,2\n"),
                                               "--out", "{out}.png"], "the table is not a main table (it lacks"),
    ("plot_table_two_rows_for_one_setting", lambda w, r: ["plot", "main", "--table", _resealed(_table_copy(
        w, r, _second_row(hit_rate="0.5"), checksum=False)), "--out", "{out}.png"],
     "are two rows for one setting"),
    ("plot_another_experiments_table", lambda w, r: ["plot", "budget", "--table", str(r["table"]), "--out",
                                                     "{out}.png"], "the table is not a budget table (it holds memory"),
    ("plot_table_header_only", lambda w, r: ["plot", "main", "--table", _table_file(
        w, "t.csv", Path(r["table"]).read_text().splitlines()[0] + "\n"), "--out", "{out}.png"], "no rows"),
    ("diff_not_directories", lambda w, r: ["diff", str(w / "a"), str(w / "b")], "directory"),
    # --- outputs: the wrong kind of path, or unwritable, fails before any work ---
    ("fidelity_out_json_would_overwrite_the_csv", lambda w, r: ["fidelity", "--model", r["model"], "--draft",
                                                                str(r["draft"]), "--out", "{out}.json"], ".csv"),
    ("run_out_wrong_suffix", lambda w, r: _run(r, out="{out}.txt"), ".jsonl"),
    ("run_out_is_its_own_dataset", lambda w, r: _run(r, "--dataset", _write(w, "prompts.jsonl",
                                                                             '{"prompt": "def f(x):"}\n'),
                                                     out=str(w / "prompts.jsonl")), "--dataset"),
    ("run_device_memory_beyond_float", lambda w, r: _without(_run(r, "--device-memory-gb", "1e300",
                                                                  system="on-demand"), "--resident-per-layer"),
     "more than the device"),
    ("run_out_is_a_directory", lambda w, r: _run(r, out=_mkdir(w / "d.jsonl")), "directory"),
    ("run_out_unwritable_late_failure", lambda w, r: _run(r, out=_write(w, "afile", "x") + "/records.jsonl"),
     "not a directory"),
    ("quantize_out_is_a_file", lambda w, r: ["quantize", "--model", r["model"], "--method", "rtn",
                                             "--out", "{out}.csv"], "not a directory"),
    ("aggregate_out_wrong_suffix", lambda w, r: ["aggregate", "main", str(r["records"]), "--out", "{out}.png"],
     ".csv"),
    ("plot_out_wrong_suffix", lambda w, r: ["plot", "main", "--table", str(r["table"]), "--out", "{out}.jpg"],
     ".png"),
    ("build_out_is_a_directory_holding_no_model", lambda w, r: ["build-model", "tiny-mixtral", "--out",
                                                                _foreign(w)], "holds no model"),
    ("quantize_out_is_a_directory_holding_no_draft", lambda w, r: ["quantize", "--model", r["model"], "--method",
                                                                   "rtn", "--group-size", "32", "--out", _foreign(w)],
     "holds no draft"),
    ("memo_out_wrong_suffix", lambda w, r: _sweep(r, "--memo-out", "{out}.pkl"), ".json.gz"),
    # --- memos: every record checked against the model it replays on, and bound to that model's content ---
    ("memo_expert_id_out_of_range", lambda w, r: _replay(w, r, _route("step_routes", 0, "0", [0, 99])), "99"),
    ("memo_expert_id_negative", lambda w, r: _replay(w, r, _route("prefill_routes", 1, "1", [-1, 3])), "-1"),
    ("memo_expert_id_fraction", lambda w, r: _replay(w, r, _route("windows.0.draft_routes", 0, "0", [0.5, 3])),
     "0.5"),
    ("memo_expert_id_text", lambda w, r: _replay(w, r, _route("windows.0.verify_routes", 0, "0", ["01", 3])),
     "'01'"),
    ("memo_expert_id_bool", lambda w, r: _replay(w, r, _route("step_routes", 0, "1", [True, 3])), "True"),
    ("memo_expert_ids_duplicate", lambda w, r: _replay(w, r, _route("step_routes", 0, "0", [3, 3])), "distinct"),
    ("memo_every_expert_of_a_top_2_model", lambda w, r: _replay(w, r, _route("step_routes", 0, "0",
                                                                                list(range(8)))), "exactly 2"),
    ("memo_too_few_experts", lambda w, r: _replay(w, r, _route("prefill_routes", 0, "0", [3])), "exactly 2"),
    ("memo_layer_not_a_moe_layer", lambda w, r: _replay(w, r, _trace_edit(lambda t: t["step_routes"][0].update(
        {"7": [0, 1]}))), "MoE layers"),
    ("memo_layer_missing", lambda w, r: _replay(w, r, _trace_edit(lambda t: t["step_routes"][0].pop("1"))),
     "MoE layers"),
    ("memo_gzip_bomb_of_one_long_line", lambda w, r: _run(r, "--memo", _write(w, "memo.json.gz", gzip.compress(
        b" " * (65 * 2**20) + gzip.decompress(_recorded_memo(r).read_bytes()), compresslevel=1)), system="specter"),
     "64 MiB"),
    ("memo_token_outside_the_vocabulary", lambda w, r: _replay(w, r, _trace_edit(lambda t: t["tokens"].__setitem__(
        1, 100000))), "100000"),
    ("memo_prompt_token_negative", lambda w, r: _replay(w, r, _trace_edit(lambda t: t["prompt"].__setitem__(
        0, -5))), "-5"),
    ("memo_window_verify_too_short", lambda w, r: _replay(w, r, _trace_edit(lambda t: t["windows"][0][
        "verify_argmax"].pop())), "verify_argmax"),
    ("memo_window_routes_too_long", lambda w, r: _replay(w, r, _trace_edit(lambda t: t["windows"][0][
        "draft_routes"].append(t["windows"][0]["draft_routes"][0]))), "draft_routes"),
    ("memo_rebase_point_outside_the_trace", lambda w, r: _replay(w, r, _trace_edit(lambda t: t["windows"][0].update(
        t=999))), "999"),
    ("memo_step_routes_missing_a_step", lambda w, r: _replay(w, r, _trace_edit(lambda t: t["step_routes"].pop())),
     "step_routes"),
    ("memo_forged_token", lambda w, r: _replay(w, r, _trace_edit(lambda t: t["tokens"].__setitem__(
        1, (t["tokens"][1] + 1) % 256))), "digest"),
    ("memo_forged_window", lambda w, r: _replay(w, r, _trace_edit(lambda t: t["windows"][0]["draft_tokens"].__setitem__(
        0, (t["windows"][0]["draft_tokens"][0] + 1) % 256))), "digest"),
    # a forger who recomputes the digest passes it (see specter/numerics/memo.py); the disagreement the replay then
    # meets blames the memo, not float noise (--quiet: the run was under way, its progress lines are not the error)
    ("memo_forged_token_digest_recomputed_is_not_blamed_on_float_noise", lambda w, r: [*_replay(
        w, r, _trace_edit(lambda t: t["tokens"].__setitem__(1, (t["tokens"][1] + 1) % 256)), redigest=True),
        "--quiet"], "record the memo again"),
    ("memo_trace_count_edited", lambda w, r: _replay(w, r, lambda h, _t: h.update(traces=5)), "header says"),
    ("memo_without_a_digest", lambda w, r: _replay(w, r, lambda h, _t: h.pop("digest")), "no digest"),
    ("memo_precision_edited_in_its_header", lambda w, r: _replay(w, r, lambda h, _t: h.update(dtype="bfloat16")),
     "does not match its digest"),
    ("memo_of_another_precision", lambda w, r: _replay(w, r, lambda h, _t: h.update(dtype="bfloat16"),
                                                       redigest=True), "was recorded in bfloat16"),
    ("memo_of_another_model_header_hash_edited", lambda w, r: _replay(w, r, _own_hash(r), system="on-demand",
                                                                      foreign=True), "digest"),
    ("memo_of_another_model_header_hash_and_digest_rewritten", lambda w, r: _replay(
        w, r, _own_hash(r), system="on-demand", foreign=True, redigest=True), "does not reproduce"),
    # --- models: every weight finite, a card's weights_sha256 held, configs that can make a model ---
    ("weights_nan", lambda w, r: _run(r, model=_model_copy(w, r, _weight_set(
        "model.layers.0.block_sparse_moe.experts.0.w2.weight", float("nan"))), system="on-demand"), "NaN"),
    ("weights_inf", lambda w, r: _run(r, model=_model_copy(w, r, _weight_set("lm_head.weight", float("inf"))),
                                      system="on-demand"), "lm_head.weight"),
    ("weights_filled_with_0xff", lambda w, r: _run(r, model=_model_copy(w, r, _fill_tensor_bytes),
                                                   system="on-demand"), "NaN"),
    ("weights_nan_quantized", lambda w, r: ["quantize", "--model", _model_copy(w, r, _weight_set(
        "model.layers.1.block_sparse_moe.experts.2.w1.weight", float("nan"))), "--method", "rtn", "--group-size", "32",
        "--out", "{out}"], "NaN"),
    ("draft_scales_nan", lambda w, r: _run(r, draft=_draft_copy(w, r, _draft_scales(lambda t: t.view(-1).__setitem__(
        0, float("nan"))))), "scales"),
    ("weights_byte_edited_under_a_model_card", lambda w, r: _run(r, model=_model_copy(w, r, _carded_then_edited(r)),
                                                                 system="on-demand"), "model_card.json"),
    ("model_card_not_json", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: (d / "model_card.json").write_text(
        "{")), system="on-demand"), "model_card.json"),
    ("config_rms_norm_eps_nan", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: _edit_json(
        d / "config.json", rms_norm_eps=float("nan"))), system="on-demand"), "rms_norm_eps"),
    ("config_hidden_size_negative_inspect", lambda w, r: ["inspect", _model_copy(w, r, lambda d: _edit_json(
        d / "config.json", hidden_size=-1))], "hidden_size"),
    ("config_dtype_other_than_its_weights_inspect", lambda w, r: ["inspect", _model_copy(w, r, lambda d: _edit_json(
        d / "config.json", dtype="bfloat16"))], "config.json says dtype bfloat16, and its weights are stored in F32"),
    ("config_dtype_other_than_its_weights_live", lambda w, r: _live(r, _model_copy(w, r, lambda d: _edit_json(
        d / "config.json", dtype="bfloat16"))), "config.json says dtype bfloat16"),
    ("config_a_billion_layers_inspect", lambda w, r: ["inspect", _model_copy(w, r, lambda d: _edit_json(
        d / "config.json", num_hidden_layers=10**9))], "num_hidden_layers is 1000000000, it must be at most 1024"),
    ("config_more_experts_than_any_model_inspect", lambda w, r: ["inspect", _model_copy(w, r, lambda d: _edit_json(
        d / "config.json", num_local_experts=10**6))], "num_local_experts is 1000000, it must be at most 4096"),
    ("config_top_k_above_experts_inspect", lambda w, r: ["inspect", _model_copy(w, r, lambda d: _edit_json(
        d / "config.json", num_experts_per_tok=9))], "num_experts_per_tok"),
    ("config_top_k_above_experts_run", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: _edit_json(
        d / "config.json", num_experts_per_tok=9)), system="on-demand"), "num_experts_per_tok"),
    ("config_one_layer_more_than_the_weights", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: _edit_json(
        d / "config.json", num_hidden_layers=_config_of(d)["num_hidden_layers"] + 1)), system="on-demand"),
     "num_hidden_layers"),
    ("config_one_layer_fewer_than_the_weights", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: _edit_json(
        d / "config.json", num_hidden_layers=_config_of(d)["num_hidden_layers"] - 1)), system="on-demand"),
     "num_hidden_layers"),
    ("config_vocab_larger_than_the_weights", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: _edit_json(
        d / "config.json", vocab_size=_config_of(d)["vocab_size"] * 4)), system="on-demand"), "config.json"),
    # --- the same damages read by the live engine's streaming loader (specter.models.streaming) ---
    ("live_weights_truncated", lambda w, r: _live(r, _model_copy(w, r, lambda d: _truncate(
        d / "model.safetensors"))), "model.safetensors is truncated or corrupt"),
    ("live_weights_header_flipped", lambda w, r: _live(r, _model_copy(w, r, lambda d: _flip(
        d / "model.safetensors", 0.0))), "model.safetensors is truncated or corrupt"),
    ("live_weights_nan_in_an_expert", lambda w, r: _live(r, _model_copy(w, r, _weight_set(
        "model.layers.0.block_sparse_moe.experts.0.w2.weight", float("nan")))), "NaN"),
    ("live_weights_inf", lambda w, r: _live(r, _model_copy(w, r, _weight_set("lm_head.weight", float("inf")))),
     "lm_head.weight"),
    ("live_an_expert_missing", lambda w, r: _live(r, _model_copy(w, r, _weights(lambda t: t.pop(
        "model.layers.1.block_sparse_moe.experts.3.w3.weight")))), "missing from the weights"),
    ("live_a_tensor_with_no_place", lambda w, r: _live(r, _model_copy(w, r, _weights(lambda t: t.update(
        {"model.layers.0.block_sparse_moe.extra.weight": t["lm_head.weight"].clone()})))), "no place for"),
    ("live_an_expert_of_another_shape", lambda w, r: _live(r, _model_copy(w, r, _weights(lambda t: t.update(
        {"model.layers.0.block_sparse_moe.experts.1.w1.weight": t[
            "model.layers.0.block_sparse_moe.experts.1.w1.weight"][:-1].clone()})))), "of another shape"),
    ("live_config_one_layer_more_than_the_weights", lambda w, r: _live(r, _model_copy(w, r, lambda d: _edit_json(
        d / "config.json", num_hidden_layers=_config_of(d)["num_hidden_layers"] + 1))), "num_hidden_layers"),
    ("live_config_vocab_larger_than_the_weights", lambda w, r: _live(r, _model_copy(w, r, lambda d: _edit_json(
        d / "config.json", vocab_size=_config_of(d)["vocab_size"] * 4))), "config.json"),
    ("config_size_not_whole", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: _edit_json(
        d / "config.json", intermediate_size=2.5)), system="on-demand"), "intermediate_size"),
    ("config_field_of_the_wrong_type", lambda w, r: _run(r, model=_model_copy(w, r, lambda d: _edit_json(
        d / "config.json", use_cache="x")), system="on-demand"), "use_cache"),
    ("config_dtype_unknown", lambda w, r: ["inspect", _model_copy(w, r, lambda d: _edit_json(
        d / "config.json", dtype="float7"))], "float7"),
    ("config_not_an_object", lambda w, r: ["inspect", _model_copy(w, r, lambda d: (d / "config.json").write_text(
        "[1, 2]"))], "config.json"),
    ("cost_as_config_hidden_size_nan", lambda w, r: _run(r, "--cost-as", _architecture(w, hidden_size=float("nan")),
                                                         system="on-demand"), "hidden_size"),
    ("cost_as_config_top_k_above_experts", lambda w, r: _run(r, "--cost-as", _architecture(
        w, num_experts_per_tok=9), system="on-demand"), "num_experts_per_tok"),
    ("hardware_memory_overflows", lambda w, r: _run(r, "--hardware", _profile(w, r, lambda d: d["device"].update(
        memory_gb=1e300))), "memory_gb"),
    # --- build settings: every one range-checked before any work ---
    ("build_ridge_nan", lambda w, r: _build("ridge=nan"), "ridge"),
    ("build_ridge_zero", lambda w, r: _build("ridge=0"), "ridge"),
    ("build_lr_inf", lambda w, r: _build("distill_lr=inf"), "distill_lr"),
    ("build_experts_zero", lambda w, r: _build("experts=0"), "experts"),
    ("build_layers_negative", lambda w, r: _build("layers=-1"), "layers"),
    ("build_calibration_sequences_zero", lambda w, r: _build("calibration_sequences=0"), "calibration_sequences"),
    ("build_seq_len_negative", lambda w, r: _build("seq_len=-1"), "seq_len"),
    ("build_top_k_above_experts", lambda w, r: _build("experts=4", "top_k=5"), "top_k"),
    ("build_kmeans_iters_zero", lambda w, r: _build("kmeans_iters=0"), "kmeans_iters"),
    ("build_bool_not_a_bool", lambda w, r: _build("truncate=maybe"), "truncate"),
]


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_hostile_input_is_one_line_exit_2_and_touches_nothing(case, real, tmp_path, capsys):
    _, build, message = next(c for c in CASES if c[0] == case)
    work = tmp_path / "work"
    work.mkdir()
    argv = [a.replace("{out}", str(work / "out")) for a in build(work, real)]
    for suffix in ("", ".jsonl", ".csv", ".png", ".json", ".txt", ".pkl", ".jpg", ".json.gz"):
        (work / f"out{suffix}").write_text(SENTINEL)  # an earlier output at every path the command may write
    (work / "out").unlink()  # directory outputs: none there before
    before = _snapshot(tmp_path)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors exit from inside parse_args
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, f"exit {code}; stderr: {err}"
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("specter: error: "), err
    assert message in lines[0], f"{message!r} not named in: {lines[0]}"
    assert _snapshot(tmp_path) == before, "the failed command left or changed files"


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def test_a_planted_symlink_at_a_predictable_temporary_name_is_not_followed(tmp_path):
    """Writers take their temporary names from `tempfile` (unique, created exclusively), so links planted at the
    names an attacker could predict (`out.tmp`, `.out.tmp`, `out.jsonl.tmp`) are never written through."""
    from specter.io import atomic_write_text

    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out.jsonl"
    for name in ("out.tmp", ".out.tmp", "out.jsonl.tmp", ".out.jsonl.tmp", "out.jsonl.part"):
        os.symlink(victim, tmp_path / name)
    atomic_write_text(out, "new\n")
    assert victim.read_text() == "precious" and out.read_text() == "new\n" and not out.is_symlink()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


@pytest.mark.parametrize("signame, status, word, twice", [("SIGINT", 130, "interrupted", False),
                                                          ("SIGTERM", 143, "terminated", False),
                                                          ("SIGTERM", 143, "terminated", True),
                                                          ("SIGHUP", 129, "terminated (SIGHUP)", False),
                                                          ("SIGQUIT", 131, "terminated (SIGQUIT)", False),
                                                          ("SIGALRM", 142, "terminated (SIGALRM)", False),
                                                          ("SIGXCPU", 152, "terminated (SIGXCPU)", False)],
                         ids=["sigint", "sigterm", "sigterm_twice", "sighup", "sigquit", "sigalrm", "sigxcpu"])
def test_sigint_and_sigterm_exit_with_one_line_without_a_traceback(signame, status, word, twice, tiny_dirs,
                                                                   tmp_path):
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "specter", "build-model", "smollm2-moe", "--out",
                             str(tmp_path / "m")], stderr=subprocess.PIPE, text=True,
                            # as from a terminal: a library loaded earlier in this pytest process may leave SIGINT
                            # ignored, which a child inherits, and Python then installs no KeyboardInterrupt handler
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 180  # wait until the build is under way: its temporary directory exists
    while not any(p.name.startswith(".m.") for p in tmp_path.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "the build never started"
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(getattr(signal, signame))
    if twice:  # a second one while the first unwinds: still one line, nothing left
        time.sleep(0.05)
        proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    lines = [line for line in err.splitlines() if line.startswith("specter:")]
    assert "Traceback" not in err and len(lines) == 1 and word in lines[0], err
    assert not (tmp_path / "m").exists()


def test_models_and_drafts_are_readable_as_the_umask_says(tiny_dirs, tmp_path):
    """safetensors writes its files private (0600); a built model and a quantized draft get the umask's permissions
    like every other output, so that others on a shared cluster can read them."""
    from specter.models.builders import build_model

    old = os.umask(0o022)
    try:
        model = build_model("tiny-mixtral", tmp_path / "model")
        quantize_draft(model, tmp_path / "draft", method="rtn", bits=4, group_size=32, progress=False)
    finally:
        os.umask(old)
    for path in [*(tmp_path / "model").iterdir(), *(tmp_path / "draft").iterdir()]:
        assert path.stat().st_mode & 0o777 == 0o644, (path, oct(path.stat().st_mode))


def test_records_carry_the_checkouts_commit():
    """Run records name the commit of the checkout the suite runs from (not of a folder above it)."""
    import subprocess

    from specter.records import git_commit

    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert git_commit() == head.stdout.strip()


def test_a_writer_sweeps_what_killed_writers_left_and_nothing_else(tmp_path):
    """A SIGKILLed writer leaves its hidden temporary; the next write into the directory removes those of processes
    that no longer run on this host, and leaves a live process's, another host's, a planted link's target and every
    other file alone."""
    import subprocess
    import sys

    from specter import io

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = io._host()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("years of work\n")
    stale = [f".records.jsonl.{host}-{dead.pid}.abc123_x.tmp", f".model.{host}-{dead.pid}.k2j4h5g6.tmp",
             f".model.{host}-{dead.pid}.zz9yy8xx.old", f".link.{host}-{dead.pid}.q1w2e3r4.tmp"]
    kept = [f".records.jsonl.{host}-{os.getppid()}.abc123_x.tmp",  # a live process (pytest's parent)
            f".records.jsonl.another-node-{dead.pid}.abc123_x.tmp", ".records.jsonl.abc123_x.tmp",
            "records.jsonl.bak", f"notes.{host}-{dead.pid}.abc123_x.tmp"]
    for name in stale[:1] + kept:
        (tmp_path / name).write_text("partial\n")
    for name in stale[1:3]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"\0" * 64)
    os.symlink(victim, tmp_path / stale[3])
    io.atomic_write_text(tmp_path / "records.jsonl", "new\n")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([*kept, "records.jsonl", "victim"]), left
    assert (victim / "precious").read_text() == "years of work\n"
    with io.atomic_dir(tmp_path / "model") as tmp:  # this process's own temporaries stay while it writes them
        (tmp / "config.json").write_text("{}")
        assert tmp.name.startswith(f".model.{host}-{os.getpid()}.") and io.sweep_stale(tmp_path) == []
    assert (tmp_path / "model" / "config.json").is_file() and tmp.name not in os.listdir(tmp_path)


@pytest.mark.slow  # GPTQModel is imported before the worker finds the corpus too short: about a minute
def test_a_failed_gptq_run_leaves_an_earlier_log_as_it_was_and_nothing_behind(real, tmp_path):
    """The worker fails after every check passed (more calibration tokens than the corpus has): the error is one line
    quoting the log's end, an earlier --gptq-log FILE is left as it was, and nothing is left beside the draft or in
    TMPDIR (GPTQModel's and the worker's temporaries)."""
    import subprocess
    import sys

    log = tmp_path / "gptq.log"
    log.write_text(SENTINEL)
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run([sys.executable, "-m", "specter", "quantize", "--model", real["model"], "--group-size", "32",
                           "--calibration-sequences", "100000", "--calibration-length", "512", "--gptq-log", str(log),
                           "--threads", "1", "--quiet", "--out", str(tmp_path / "draft")],
                          capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "GPTQModel failed" in lines[0] and "is left as it was" in lines[0] and "calibration tokens" in lines[0]
    assert log.read_text() == SENTINEL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gptq.log", "tmp"]
    assert not [p for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor_")]


# --- the suite's own files as untrusted input: the disk tier, cached bytecode, the file-hash cache -----------------


def _tier_run(tiny_dirs, rtn_drafts, tmp_path):
    from conftest import spec
    from specter.runs.execute import execute
    from specter.session import Session

    request = dict(system="specter", model=tiny_dirs["mixtral"], draft=rtn_drafts["mixtral"], dataset="code",
                   hardware="a100-40gb-pcie4", out=str(tmp_path / "x.jsonl"), num_prompts=1, prefix_tokens=16,
                   max_new_tokens=8, resident_per_layer=2, k=3, warmup_prompts=0, engine="live", host_store="disk")
    records = execute(spec(**request), Session(), progress=False)
    gc.collect()  # the run's model gone, its tier's leases with it (a CLI run's process ends here)
    return records


@pytest.mark.parametrize("damage", ["nan", "finite", "finite_time_kept", "manifest_gone", "file_gone",
                                    "finite_and_unlisted"])
def test_a_damaged_disk_tier_is_found_and_built_again_never_decoded(damage, tiny_dirs, rtn_drafts, tmp_path,
                                                                     monkeypatch):
    """A layer file of the disk tier overwritten in place (NaN, or finite values, with its modification time restored
    or not, or its manifest entry removed), its manifest deleted or a file removed: the next live run finds it, builds
    the tier again from the checkpoint and decodes the tokens it decoded before, and says so in one warning."""
    import numpy as np
    import torch

    from specter.models import disk_tier, streaming

    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "cache"))
    first = _tier_run(tiny_dirs, rtn_drafts, tmp_path)
    tier = streaming.disk_tier_dir(Path(tiny_dirs["mixtral"]), torch.float32)
    layer = tier / "layer-0.bin"
    stat = layer.stat()
    if damage == "manifest_gone":
        (tier / disk_tier.MANIFEST).unlink()
    elif damage == "file_gone":
        layer.unlink()
    elif damage == "finite_and_unlisted":  # its entry removed from the manifest, its bytes other
        manifest = json.loads((tier / disk_tier.MANIFEST).read_text())
        del manifest["files"][layer.name]
        (tier / disk_tier.MANIFEST).write_text(json.dumps(manifest))
        layer.write_bytes(np.random.default_rng(1).standard_normal(stat.st_size // 4).astype(np.float32).tobytes())
    else:
        values = np.full(stat.st_size // 4, np.nan, np.float32) if damage == "nan" else \
            np.random.default_rng(0).standard_normal(stat.st_size // 4).astype(np.float32)
        layer.write_bytes(values.tobytes())
        if damage == "finite_time_kept":
            os.utime(layer, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert streaming.tier_problem(tier) is not None
    warned = []
    monkeypatch.setattr(streaming.log, "warning", lambda message, *args: warned.append(message % args))
    again = _tier_run(tiny_dirs, rtn_drafts, tmp_path)
    assert again[0].output_token_ids == first[0].output_token_ids
    assert len(warned) == 1 and "disk tier" in warned[0] and "building it again" in warned[0], warned
    assert streaming.tier_problem(tier) is None


def test_a_tier_directory_swapped_with_another_models_is_built_again(tiny_dirs, rtn_drafts, tmp_path, monkeypatch):
    """Two models' disk tiers swapped by renaming their directories (a rename keeps every file's inode and times):
    each manifest names the model and dtype its rows are of, so the next live run of the first model finds another
    model's rows, builds its tier again and decodes its own tokens; a manifest nested too deeply to read, or naming a
    file with a NUL, is damage like any other."""
    import shutil

    import torch

    from specter.models import disk_tier, streaming
    from specter.models.tiny import save_tiny_model

    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "cache"))
    first = _tier_run(tiny_dirs, rtn_drafts, tmp_path)
    other = save_tiny_model("mixtral", tmp_path / "other", seed=1)
    streaming.stream_moe_model(str(other), torch.float32, experts_on="disk")
    mine = streaming.disk_tier_dir(Path(tiny_dirs["mixtral"]), torch.float32)
    theirs = streaming.disk_tier_dir(other, torch.float32)
    mine.rename(tmp_path / "swap")
    theirs.rename(mine)
    (tmp_path / "swap").rename(theirs)
    warned = []
    monkeypatch.setattr(streaming.log, "warning", lambda message, *args: warned.append(message % args))
    again = _tier_run(tiny_dirs, rtn_drafts, tmp_path)
    assert again[0].output_token_ids == first[0].output_token_ids
    assert len(warned) == 1 and "a directory of another model" in warned[0], warned
    for manifest in ("[" * 100_000, json.dumps({"format": 3, "model": "x", "files": {"layer-\u0000.bin": {}}})):
        (mine / disk_tier.MANIFEST).write_text(manifest)
        assert disk_tier.tier_problem(mine) is not None
    shutil.rmtree(theirs)


def test_damage_the_tier_check_cannot_see_ends_a_live_run_in_one_line_before_any_record(tiny_dirs, rtn_drafts,
                                                                                       tmp_path, monkeypatch):
    """Rows damaged where the manifest's check does not look (here: the check told to pass) are found by the live
    pass's logits: one SpecterError, no record written."""
    import numpy as np
    import torch

    from specter.errors import SpecterError
    from specter.models import streaming

    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "cache"))
    _tier_run(tiny_dirs, rtn_drafts, tmp_path)
    (tmp_path / "x.jsonl").unlink(missing_ok=True)
    for layer in streaming.disk_tier_dir(Path(tiny_dirs["mixtral"]), torch.float32).glob("layer-*.bin"):
        layer.write_bytes(np.full(layer.stat().st_size // 4, np.nan, np.float32).tobytes())
    monkeypatch.setattr(streaming, "tier_problem", lambda tier, expected=None, identity=None: None)
    with pytest.raises(SpecterError, match="NaN or infinite logits"):
        _tier_run(tiny_dirs, rtn_drafts, tmp_path)
    assert not (tmp_path / "x.jsonl").exists()


def test_a_disk_tier_without_room_or_an_unwritable_cache_is_one_line_and_leaves_nothing(tiny_dirs, tmp_path,
                                                                                       monkeypatch):
    """The tier's build checks the cache before any file: a cache that is a regular file, a read-only cache, one on a
    file system mounted read-only, a file system with less room than the tier (the bytes named), and a disk that
    fills while the files are reserved; each is one SpecterError and leaves no directory and no temporary."""
    import collections

    import torch

    from specter.errors import SpecterError
    from specter.models import disk_tier, streaming

    model = tiny_dirs["olmoe"]
    as_file = tmp_path / "a-file"
    as_file.write_text("not a directory")
    monkeypatch.setenv("SPECTER_CACHE_DIR", str(as_file))
    with pytest.raises(SpecterError, match="is not a directory.*SPECTER_CACHE_DIR"):
        stream_moe_model(model, torch.float32, experts_on="disk")
    if os.geteuid() != 0:  # root writes anywhere
        read_only = tmp_path / "read-only"
        read_only.mkdir()
        read_only.chmod(0o555)
        monkeypatch.setenv("SPECTER_CACHE_DIR", str(read_only))
        with pytest.raises(SpecterError, match="permission denied.*SPECTER_CACHE_DIR"):
            stream_moe_model(model, torch.float32, experts_on="disk")
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECTER_CACHE_DIR", str(cache))
    statvfs = os.statvfs
    monkeypatch.setattr(disk_tier.os, "statvfs", lambda p: collections.namedtuple("vfs", "f_flag")(
        statvfs(p).f_flag | os.ST_RDONLY))  # a file system mounted read-only
    with pytest.raises(SpecterError, match="is on a read-only file system.*SPECTER_CACHE_DIR"):
        stream_moe_model(model, torch.float32, experts_on="disk")
    monkeypatch.setattr(disk_tier.os, "statvfs", statvfs)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(disk_tier.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(SpecterError, match=r"needs .* MiB \([0-9]+ bytes\) and 64 MiB spare in .* free"):
        stream_moe_model(model, torch.float32, experts_on="disk")
    monkeypatch.undo()
    monkeypatch.setenv("SPECTER_CACHE_DIR", str(cache))

    def full(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(streaming.os, "posix_fallocate", full)
    with pytest.raises(SpecterError, match="No space left on device.*nothing of it was kept"):
        stream_moe_model(model, torch.float32, experts_on="disk")
    expert_rows = cache / "expert-rows"
    assert not expert_rows.exists() or list(expert_rows.iterdir()) == []


TRUNCATED_UNDER_THE_MAP = textwrap.dedent("""
    import subprocess, sys, time
    import torch
    from specter.errors import SpecterError
    from specter.models.streaming import stream_moe_model

    moe = stream_moe_model(sys.argv[1], torch.float32, experts_on="disk")
    rows = moe.moe_layers[0].experts.down_proj
    file = moe.experts_on_disk / "layer-0.bin"
    cut = subprocess.Popen([sys.executable, "-c", f"import os; os.truncate({str(file)!r}, 0)"])
    try:
        for _ in range(200):  # the writer's truncation arrives while the rows are read
            float(rows.sum())
            time.sleep(0.02)
    except SpecterError as e:
        print("specter: error:", e, flush=True)
        moe.tier_leases.close()
        sys.exit(1 if cut.wait(60) == 0 else 3)
    print("read a truncated map and went on", flush=True)
""")


def test_a_disk_tier_file_truncated_while_mapped_stops_the_run_in_one_line(tiny_dirs, tmp_path):
    """A writer truncating a mapped disk-tier file while the run reads it: the run stops in one line naming the file
    (the kernel holds the writer back until the run lets go), where reading a page past the new end of the file was a
    bus error (exit -7, no line)."""
    import subprocess
    import sys

    env = {**os.environ, "SPECTER_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", TRUNCATED_UNDER_THE_MAP, str(tiny_dirs["olmoe"])], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and "layer-0.bin was opened for writing or truncated" in lines[0], out.stdout


def stream_moe_model(*args, **kwargs):
    from specter.models.streaming import stream_moe_model as load

    return load(*args, **kwargs)


def test_bytecode_cut_short_by_a_full_disk_is_never_kept_and_a_truncated_or_damaged_file_is_compiled_again(tmp_path):
    """A file-size limit stands in for a full disk (each write stops at it, as on a full file system): the bytecode
    the suite keeps in its cache is not published short, the module still imports; and a truncated file already there
    (as Python's own writer left one), or one with a byte of its code flipped, is removed and its module compiled from
    source, so later commands still run as their source says."""
    import subprocess
    import sys

    src = tmp_path / "src"
    src.mkdir()
    (src / "probe_module.py").write_text("VALUE = 7\nTEXT = " + repr("x" * 4000) + "\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "SPECTER_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(src), os.getcwd()])}
    env.pop("PYTHONPYCACHEPREFIX", None)
    full = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "from specter.bytecode import cache_bytecode; cache_bytecode(); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY)); "
            "import probe_module; print(probe_module.VALUE)")
    plain = ("from specter.bytecode import cache_bytecode; cache_bytecode(); import probe_module; "
             "print(probe_module.VALUE)")

    def python(code):
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)

    out = python(full)
    assert out.returncode == 0 and out.stdout.strip() == "7", out.stderr
    assert not list((tmp_path / "cache").rglob("probe_module*.pyc")), "a short file was published"
    assert not list((tmp_path / "cache").rglob("*.tmp"))
    out = python(plain)
    assert out.returncode == 0 and out.stdout.strip() == "7", out.stderr
    [pyc] = list((tmp_path / "cache").rglob("probe_module*.pyc"))
    _truncate(pyc)
    out = python(plain)
    assert out.returncode == 0 and out.stdout.strip() == "7" and "Traceback" not in out.stderr, out.stderr
    out = python(plain)  # written whole again by the process after
    assert out.returncode == 0 and pyc.stat().st_size > 4000
    data = bytearray(pyc.read_bytes())  # a byte of the kept code flipped, its header whole: a constant changed
    data[data.index(b"x" * 100) + 50] = ord("y")
    pyc.write_bytes(bytes(data))
    out = python(plain.replace("print(probe_module.VALUE)", "print(probe_module.TEXT == 'x' * 4000)"))
    assert out.returncode == 0 and out.stdout.strip() == "True" and "Traceback" not in out.stderr, out.stderr
    pyc.unlink(missing_ok=True)  # (the damaged file was removed, and no process has written it since)
    os.mkfifo(pyc)  # a pipe where the bytecode should be: never read (it would be read for ever)
    out = python(plain)
    assert out.returncode == 0 and out.stdout.strip() == "7" and "Traceback" not in out.stderr, out.stderr


def test_a_modules_bytecode_copied_over_anothers_of_the_same_size_and_time_is_compiled_again(tmp_path):
    """Two modules of one source size and modification time: the bytecode of one copied over the other's passes
    Python's header, and its own checksum covers only its code; the checksum of its path too makes the copy damage,
    so the module runs as its source says."""
    import subprocess
    import sys

    src = tmp_path / "src"
    src.mkdir()
    (src / "mod_a.py").write_text("NAME = 'a'\n")
    (src / "mod_b.py").write_text("NAME = 'b'\n")
    for module in ("mod_a.py", "mod_b.py"):
        os.utime(src / module, (1_700_000_000, 1_700_000_000))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "SPECTER_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(src), os.getcwd()])}
    env.pop("PYTHONPYCACHEPREFIX", None)
    code = "from specter.bytecode import cache_bytecode; cache_bytecode(); import mod_a, mod_b; print(mod_a.NAME)"

    def python():
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)

    assert python().stdout.strip() == "a"
    [a] = list((tmp_path / "cache").rglob("mod_a*.pyc"))
    [b] = list((tmp_path / "cache").rglob("mod_b*.pyc"))
    a.write_bytes(b.read_bytes())
    out = python()
    assert out.returncode == 0 and out.stdout.strip() == "a" and "Traceback" not in out.stderr, out.stderr


def test_bytecode_flagged_as_never_checked_against_its_source_is_compiled_again(tmp_path):
    """A cached bytecode file whose header's flags say "hash-based, unchecked" (one bit) is one Python never compares
    with its source again: after the source changes, the old code would run. The suite writes flags 0 and uses no file
    with others: the changed source runs."""
    import subprocess
    import sys

    src = tmp_path / "src"
    src.mkdir()
    (src / "mod_a.py").write_text("NAME = 'old'\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "SPECTER_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(src), os.getcwd()])}
    env.pop("PYTHONPYCACHEPREFIX", None)
    code = "from specter.bytecode import cache_bytecode; cache_bytecode(); import mod_a; print(mod_a.NAME)"

    def python():
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)

    assert python().stdout.strip() == "old"
    [pyc] = list((tmp_path / "cache").rglob("mod_a*.pyc"))
    data = bytearray(pyc.read_bytes())
    data[4] = 1  # the flags word: hash-based, never checked
    pyc.write_bytes(bytes(data))
    (src / "mod_a.py").write_text("NAME = 'new'\n")
    out = python()
    assert out.returncode == 0 and out.stdout.strip() == "new" and "Traceback" not in out.stderr, out.stderr


@pytest.fixture(scope="module")
def hybrid_records(tiny_dirs, tmp_path_factory):
    """One record each of the hybrids on the tiny Mixtral (4 of 8 slots: llama.cpp keeps layer 0's experts on the
    host, KTransformers both layers'), of every expert resident, and of on-demand live on the CPU."""
    root = tmp_path_factory.mktemp("hybrid")
    out = {}
    for system, *extra in (("ktransformers",), ("llama-cpp-cpu-moe",), ("resident",),
                           ("on-demand", "--engine", "live", "--device", "cpu")):
        name = system + ("-live" if extra else "")
        path = root / f"{name}.jsonl"
        assert main(["run", "--system", system, "--model", tiny_dirs["mixtral"], "--dataset", "code", "--hardware",
                     "t4-pcie3", "--num-prompts", "1", "--max-new-tokens", "4", "--resident-per-layer", "4",
                     *extra, "--out", str(path), "-q"]) == 0
        out[name] = json.loads(path.read_text().splitlines()[0])
    return out


def _relabel(record: dict, system: str, settings: dict | None = None) -> None:
    """A record given another system's name, in both places it says it, and `settings` as its options' (where given:
    the other system's defaults)."""
    record["system"] = record["config"]["system"] = system
    if settings is not None:
        record["config"]["system_settings"] = settings


@pytest.mark.parametrize("system, edit, said", [
    ("ktransformers", lambda r: r["extra"].update(host_layers=[0, 0]), "not distinct MoE layers in order"),
    ("ktransformers", lambda r: r["extra"].update(host_layers=[0, 5, 9]), "as many as the model has at most"),
    ("ktransformers", lambda r: r["extra"].update(host_layers=[0]),
     "and ktransformers keeps every MoE layer's experts on the host ([0, 1])"),
    ("ktransformers", lambda r: r["config"]["memory"].update(placed_slot_bytes=12288 * 8, expert_slot_bytes=12288 * 8),
     "placed_slot_bytes is 98304, and the 0 MoE layers"),
    ("ktransformers", lambda r: r.update(h2d_bytes_demand=24576), "copies no expert"),
    ("ktransformers", lambda r: r["extra"].update(h2d_bytes_prefill=24576), "copies no expert"),
    ("ktransformers", lambda r: r["extra"].update(link_bytes_activations=0), "extra.link_bytes_activations is 0, and"),
    ("ktransformers", lambda r: r["extra"].update(link_bytes_activations=3 * r["extra"]["link_bytes_activations"]),
     "tokens through 2 host layers cross"),
    ("ktransformers", lambda r: r["extra"].pop("host_layers"), "extra.host_layers is None, not distinct MoE layers"),
    ("ktransformers", lambda r: r["extra"].pop("activation_bytes"), "extra.activation_bytes is None"),
    ("ktransformers", lambda r: r.update(demand_hits=1, hit_rate=1 / (1 + r["demand_misses"])),
     "every MoE layer's experts are on the host"),
    ("llama-cpp-cpu-moe", lambda r: r["extra"].update(host_layers=[]), "n-cpu-moe=-1 keeps MoE layers [0] on the host"),
    ("llama-cpp-cpu-moe", lambda r: r["extra"].update(host_layers=[1]), "keeps the leading MoE layers' experts there"),
    ("llama-cpp-cpu-moe", lambda r: (r["config"]["system_settings"].update({"n-cpu-moe": 2}),
                                     r["config"].update(system_options=[["n-cpu-moe", "2"]])),
     "n-cpu-moe=2 keeps MoE layers [0, 1] on the host"),
    ("llama-cpp-cpu-moe", lambda r: r["extra"].update(link_bytes_activations=1), "extra.link_bytes_activations is 1"),
    ("llama-cpp-cpu-moe", lambda r: r["extra"].pop("moe_layers"), "extra.moe_layers is None"),
    ("llama-cpp-cpu-moe", lambda r: _relabel(r, "ktransformers"), "and ktransformers's options are cuda-graph"),
    ("llama-cpp-cpu-moe", lambda r: _relabel(r, "ktransformers", {"cuda-graph": True}),
     "ktransformers keeps every MoE layer's"),
    ("llama-cpp-cpu-moe", lambda r: _relabel(r, "fiddler", {"decide": "constants"}),
     "and fiddler places no whole layer on the host"),
    ("llama-cpp-cpu-moe", lambda r: r["extra"].update(d2h_bytes_writeback=12288), "copies no expert"),
    ("ktransformers", lambda r: r["config"]["system_settings"].update({"cuda-graph": "maybe"}),
     "config.system_settings.cuda-graph is 'maybe', and ktransformers's cuda-graph is a bool"),
    ("ktransformers", lambda r: r["config"]["system_settings"].update(bogus=3), "and ktransformers's options are "
                                                                                "cuda-graph"),
    ("ktransformers", lambda r: r["extra"]["breakdown_ms"].update(draft=r["extra"]["breakdown_ms"]["host compute"],
                                                                 **{"host compute": 0.0}),
     "extra.breakdown_ms.draft is"),
    ("ktransformers", lambda r: r["config"].update(system_options=[["cuda-graph", "false"]]),
     "config.system_options gives cuda-graph='false', and its run's setting"),
    ("ktransformers", lambda r: r["config"]["system_settings"].update({"cuda-graph": False}),
     "config.system_settings.cuda-graph is False, and config.system_options does not give it"),
    ("llama-cpp-cpu-moe", lambda r: r["config"].update(system_options=[["n-cpu-moe", "1"], ["n-cpu-moe", "2"]]),
     "not options given once each"),
    ("llama-cpp-cpu-moe", lambda r: r["config"]["system_settings"].update({"n-cpu-moe": 1.5}),
     "config.system_settings.n-cpu-moe is 1.5, and llama-cpp-cpu-moe's n-cpu-moe is an int"),
], ids=["layer_twice", "layers_past_the_model", "not_every_layer", "layers_and_placement_disagree", "demand_bytes",
        "prefill_bytes", "no_activations", "activations_thrice", "no_host_layers", "no_activation_bytes",
        "hits_with_nothing_resident", "no_host_layer", "not_leading", "not_its_n_cpu_moe", "activations_one_byte",
        "no_moe_layers", "relabelled_with_its_settings", "relabelled_ktransformers", "relabelled_fiddler",
        "write_back", "setting_not_its_type",
        "setting_not_an_option", "draft_time_without_a_draft",
        "options_given_not_the_setting", "setting_not_given_nor_the_default",
        "option_given_twice", "blocks_not_whole"])
def test_a_hybrid_record_edited_against_its_placement_is_refused(hybrid_records, system, edit, said, tmp_path):
    """A record of a system placing whole layers' experts is held to its placement (`record_sums.placement_problem`):
    its host layers, the experts the device keeps, no expert copied, activations exactly where experts are on the
    host, no hit where none is on the device."""
    from specter.errors import SpecterError
    from specter.records import read_jsonl

    record = json.loads(json.dumps(hybrid_records[system]))
    read_jsonl(_write(tmp_path, "whole.jsonl", json.dumps(record) + "\n"))  # as written: whole
    edit(record)
    with pytest.raises(SpecterError, match=re.escape(said)):
        read_jsonl(_write(tmp_path, "edited.jsonl", json.dumps(record) + "\n"))


def _recounted(record: dict, **counts) -> dict:
    """`record` with `counts` (`demand_hits`, `demand_misses` or of `extra.counts`) and every hit rate they give: an
    edit a rate check alone does not see."""
    for name, value in counts.items():
        (record if name.startswith("demand_") else record["extra"]["counts"])[name] = value
    c, rate = record["extra"]["counts"], (lambda h, m: h / (h + m) if h + m else None)
    record.update(hit_rate=rate(record["demand_hits"], record["demand_misses"]),
                  hit_rate_pass=rate(c["decode_hits"], c["decode_misses"]),
                  hit_rate_token=rate(c["decode_token_hits"], c["decode_token_misses"]))
    return record


@pytest.mark.parametrize("source, edit, said", [
    ("ktransformers", lambda r: _recounted(r, demand_misses=1000), "demand_hits + demand_misses is 1000"),
    ("ktransformers", lambda r: _recounted(r, decode_token_misses=1000), "decode_token_hits + decode_token_misses is"),
    ("ktransformers", lambda r: _recounted(r, decode_token_misses=r["extra"]["counts"]["decode_token_misses"] - 1),
     "look up"),
    ("llama-cpp-cpu-moe", lambda r: _recounted(r, demand_hits=2 * r["demand_hits"],
                                               demand_misses=2 * r["demand_misses"]), "demand_hits + demand_misses"),
    ("llama-cpp-cpu-moe", lambda r: _recounted(r, decode_hits=r["extra"]["counts"]["decode_hits"] + 50,
                                               demand_hits=r["demand_hits"] + 50), "decode_hits + decode_misses is"),
    ("llama-cpp-cpu-moe", lambda r: r["extra"]["counts"].update(decode_passes=99), "decode_passes is 99"),
    ("ktransformers", lambda r: r["extra"]["counts"].pop("decode_passes"), "decode_passes is None"),
    ("ktransformers", lambda r: r["config"]["routing"].update(top_k=9), "config.routing is"),
    ("ktransformers", lambda r: r["config"].pop("routing"), "config lacks routing"),
    ("specter", lambda r: _recounted(r, decode_misses=r["extra"]["counts"]["decode_misses"] + 500,
                                     demand_misses=r["demand_misses"] + 500), "decode_hits + decode_misses is"),
    ("specter", lambda r: r["extra"]["counts"].update(decode_passes=len(r["output_token_ids"])), "a pass per window"),
    ("specter", lambda r: _recounted(r, decode_hits=r["extra"]["counts"]["decode_hits"] - 1,
                                     decode_misses=r["extra"]["counts"]["decode_misses"] + 1),
     "extra.h2d_bytes_prefill is"),
    ("llama-cpp-cpu-moe", lambda r: _recounted(r, decode_token_hits=r["extra"]["counts"]["decode_token_hits"] + 1,
                                               decode_token_misses=r["extra"]["counts"]["decode_token_misses"] - 1),
     "one token a pass looks up each expert once"),
    ("specter", lambda r: r["accepted_length_histogram"].update(
        {"0": r["accepted_length_histogram"].get("0", 0) + 1}), "a window's verification is one decode pass"),
    ("llama-cpp-cpu-moe", lambda r: r.update(stall_ms=0.3), "waits only for copies its host has waited for"),
    ("resident", lambda r: r.update(stall_ms=0.3), "a simulated run that copies nothing"),
    ("on-demand-live", lambda r: r.update(stall_ms=0.3), "the wall clock on the CPU as device books none"),
    ("specter", lambda r: r.update(h2d_bytes_prefetch=(r["extra"]["counts"]["window_placed"] + 1)
                                   * r["config"]["expert_storage"]["expert_bytes"]), "its windows placed"),
    ("llama-cpp-cpu-moe", lambda r: _recounted(
        r, **{name: r["extra"]["counts"][name] + step for name, step in (
            ("decode_hits", -1), ("decode_misses", 1), ("decode_token_hits", -1), ("decode_token_misses", 1))},
        demand_hits=r["demand_hits"] - 1, demand_misses=r["demand_misses"] + 1), "a device layer's lookups hit"),
    ("llama-cpp-cpu-moe", lambda r: _recounted(
        r, demand_hits=r["extra"]["counts"]["decode_hits"],
        demand_misses=r["demand_misses"] + r["demand_hits"] - r["extra"]["counts"]["decode_hits"]),
     "MoE layers on the device counts"),
    ("resident", lambda r: r["extra"]["breakdown_ms"].update({
        "target compute": r["extra"]["breakdown_ms"]["target compute"] - 0.01, "host compute": 0.01}),
     "computes no expert on the host"),
    ("specmoeoff", lambda r: r.update(h2d_bytes_prefetch=(2 * r["extra"]["counts"]["decode_passes"] * 2 * 2 + 1)
                                      * r["config"]["expert_storage"]["expert_bytes"]), "windows of at most 2 plans"),
], ids=["misses_past_every_lookup", "token_lookups_past_the_tokens", "token_lookups_one_short", "counts_doubled",
        "pass_lookups_past_the_tokens", "passes_not_the_tokens", "no_passes", "top_k_past_the_experts",
        "no_routing", "speculative_pass_lookups_past_the_tokens", "more_windows_than_tokens",
        "a_decode_hit_made_a_miss", "token_counts_not_the_pass_counts", "a_window_more_than_the_passes",
        "a_stall_where_the_host_waited", "a_stall_with_nothing_copied", "a_stall_on_the_wall_clock",
        "prefetches_past_what_the_windows_placed", "a_device_layers_hit_made_a_miss", "the_prefills_hits_made_misses",
        "host_compute_where_none_is", "prefetches_past_the_plans_slots"])
def test_lookup_counts_past_what_the_routing_gives_are_refused(hybrid_records, real, source, edit, said, tmp_path):
    """A record's hits and misses are held to the lookups its routing makes (`record_sums.lookups_problem`): its
    tokens, MoE layers and top-k, its decode passes; a count raised or lowered with its rates is refused."""
    from specter.errors import SpecterError
    from specter.records import read_jsonl

    if source == "specmoeoff":  # 2 slots of each of the tiny Mixtral's 2 MoE layers
        assert main(["run", "--system", source, "--model", real["model"], "--draft", str(real["draft"]), "--dataset",
                     "code", "--hardware", "t4-pcie3", "--num-prompts", "1", "--prefix-tokens", "8",
                     "--max-new-tokens", "6", "--resident-per-layer", "2", "--out", str(tmp_path / "s.jsonl"),
                     "-q"]) == 0
    record = json.loads(real["records"].read_text().splitlines()[0]) if source == "specter" else \
        json.loads((tmp_path / "s.jsonl").read_text().splitlines()[0]) if source == "specmoeoff" else \
        json.loads(json.dumps(hybrid_records[source]))
    read_jsonl(_write(tmp_path, "whole.jsonl", json.dumps(record) + "\n"))  # as written: whole
    edit(record)
    with pytest.raises(SpecterError, match=re.escape(said)):
        read_jsonl(_write(tmp_path, "edited.jsonl", json.dumps(record) + "\n"))


def test_a_main_figure_of_a_system_at_two_budgets_says_so_in_one_line(real, tmp_path, capsys):
    """The main figure draws one bar a system and comparison: a table of one system at two budgets (a valid table) is
    refused by the figure in one line naming why, not as a damaged cell."""
    records, table = tmp_path / "r.jsonl", tmp_path / "main.csv"
    assert main(["sweep", "--systems", "on-demand", "--model", real["model"], "--dataset", "code", "--hardware",
                 "t4-pcie3", "--num-prompts", "1", "--prefix-tokens", "8", "--max-new-tokens", "4",
                 "--resident-per-layer", "1,2", "--out", str(records), "-q"]) == 0
    capsys.readouterr()
    assert main(["aggregate", "main", str(records), "--out", str(table), "--figure", str(tmp_path / "f.png")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specter: error:")]
    assert len(errors) == 1 and "holds 2 rows of on-demand" in errors[0], errors


def test_a_pipe_where_a_hashed_file_should_be_is_one_line_not_a_hang(tmp_path):
    """`specter summary` hashes every model and draft of a results tree: a pipe or a device in their place is refused
    in one line, where reading it would never end."""
    from specter.errors import SpecterError
    from specter.io import files_sha256

    os.mkfifo(tmp_path / "experts.safetensors")
    with pytest.raises(SpecterError, match="is not a regular file"):
        files_sha256([tmp_path / "experts.safetensors"])


@pytest.mark.parametrize("entry", [b"\xff\xfe" + b"\x80" * 62, b"", b"z" * 64, bytes(64), b"0" * 63, None],
                         ids=["not_utf8", "empty", "not_hex", "nul_bytes", "short", "sparse_gigabytes"])
def test_a_damaged_file_hash_entry_is_computed_again(entry, tmp_path, monkeypatch):
    """An entry of the file-hash cache that is not 64 lowercase hex digits (bytes that are not UTF-8, empty, other
    characters) is ignored and the hash computed and written again."""
    from specter.io import _files_sha256
    from specter.models.integrity import model_hash

    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    first = model_hash(model)
    [kept] = [p for p in (tmp_path / "cache" / "file-hashes").rglob("*") if p.is_file()]
    if entry is None:  # a digest followed by 16 GB of holes: read whole, it would take the machine's memory
        os.truncate(kept, 1 << 34)
    else:
        kept.write_bytes(entry)
    assert model_hash(model) == first == _files_sha256([model / "config.json"])
    assert kept.read_text().split()[:2] == [first, kept.name]


def _copy_entry(entries: dict, hashes: dict) -> None:
    entries[hashes["one"]].write_bytes(entries[hashes["two"]].read_bytes())


def _rewrite_digest(entries: dict, hashes: dict) -> None:
    kept = entries[hashes["one"]]
    _, key, tag = kept.read_text().split()
    kept.write_text(f"{hashes['two']} {key} {tag}\n")


@pytest.mark.parametrize("damage", [_copy_entry, _rewrite_digest], ids=["entry_copied", "digest_rewritten"])
def test_a_file_hash_entry_of_another_models_is_computed_again(damage, tmp_path, monkeypatch):
    """One model's entry replaced by another's (a whole, well-formed entry, moved, not forged: it names the key it was
    filed under), or its digest alone rewritten to another model's (its key kept: the tag over digest, key and a
    sample of the files no longer matches): the hash is computed again, the model keeps its own, and a disk tier of
    the other model is never taken for this one's."""
    from specter.models.integrity import model_hash

    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "cache"))
    hashes = {}
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"name": name}))
        hashes[name] = model_hash(tmp_path / name)
    entries = {p.read_text().split()[0]: p for p in (tmp_path / "cache" / "file-hashes").rglob("*") if p.is_file()}
    damage(entries, hashes)
    assert model_hash(tmp_path / "one") == hashes["one"] != hashes["two"]
    assert entries[hashes["one"]].read_text().split()[0] == hashes["one"]


# --- the workflow's config check, complete before any job ---


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["cases"][next(iter(c["cases"]))].update(model="nosuch"),
     "cases.{case}.model: 'nosuch' is not a configured model"),
    (lambda c: c["datasets"].update(nosuch={}), "config datasets.nosuch: not a prompt set the suite ships"),
    (lambda c: c["fidelity"].update(dataset="kode"), "config fidelity.dataset: 'kode' is not a prompt set the suite"),
    (lambda c: c["cases"][next(iter(c["cases"]))].update(hardware="nosuch-gpu"),
     "config cases.{case}.hardware: unknown hardware preset 'nosuch-gpu'"),
], ids=["case_model_unknown", "dataset_unknown", "fidelity_dataset_unknown", "case_hardware_unknown"])
def test_a_name_the_config_does_not_define_is_refused_with_the_config(edit, message):
    from specter.workflow_checks import ConfigError, check_config

    config = yaml.safe_load((Path(__file__).parents[1] / ".test" / "config.yaml").read_text())
    edit(config)
    with pytest.raises(ConfigError) as err:
        check_config(config)
    assert message.format(case=next(iter(config["cases"]))) in str(err.value) and "\n" not in str(err.value)


def _prompt_file(tmp_path, rows: list[dict]) -> str:
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.parametrize("edit, message", [
    (lambda c, t: c["datasets"].update(mine={"path": _prompt_file(t, [{"prompt": "def f(x):"}])}),
     "config datasets.mine.path: '{tmp}/mine.jsonl' holds 1 distinct non-empty prompts, and num_prompts asks for {n}"),
    (lambda c, t: c["datasets"].update(mine={"path": _prompt_file(t, [{"prompt": "def f(x): return x"}] * 9)}),
     "config datasets.mine.path: '{tmp}/mine.jsonl' holds 1 distinct non-empty prompts"),
    (lambda c, t: c["datasets"].update(mine={"path": _prompt_file(t, [{"prompt": " "}])}),
     "holds 0 distinct non-empty prompts, and num_prompts asks for {n}; add prompts to it"),
    (lambda c, t: c["datasets"].update(mine={"path": _prompt_file(t, [{"prompt": "def f(x):"}] * 9),
                                             "field": "nosuch"}),
     "config datasets.mine.path: {tmp}/mine.jsonl has no field 'nosuch'; its columns: ['prompt']"),
    (lambda c, t: (c["protocol"].update(num_prompts=165), c["datasets"].update(humaneval={})),
     "config datasets.humaneval: 'humaneval' holds 164"),
    (lambda c, t: c["fidelity"].update(num_prompts=81, dataset="mtbench"),
     "config fidelity.dataset: 'mtbench' holds 80 distinct non-empty prompts, and num_prompts asks for 81"),
    (lambda c, t: c["fidelity"].update(dataset=_prompt_file(t, [{"text": "  "}, {"text": "one"}])),
     "config fidelity.dataset: '{tmp}/mine.jsonl' holds 1 distinct non-empty prompts"),
], ids=["file_of_one_prompt", "one_prompt_repeated", "no_prompt", "field_nosuch", "shipped_set_too_small",
        "fidelity_set_too_small", "fidelity_file_too_small"])
def test_a_prompt_set_too_small_for_the_protocol_is_refused_with_the_config(edit, message, tmp_path):
    """A prompt set that cannot give the protocol's prompts (too few texts, or no such text field) is refused before
    any job, naming the key, not met by the first run after the builds."""
    from specter.workflow_checks import ConfigError, check_config

    config = yaml.safe_load((Path(__file__).parents[1] / ".test" / "config.yaml").read_text())
    edit(config, tmp_path)
    with pytest.raises(ConfigError) as err:
        check_config(config)
    want = message.format(tmp=tmp_path, n=config["protocol"]["num_prompts"])
    assert want in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_live_workflow_refuses_the_settings_the_live_engine_cannot_run_before_any_job():
    """With `hardware.engine: live`, every sweep at the model's own shapes decodes live: an axis, arm or option the
    live engine refuses (main's and dispatch's upstream pricing, the ablation's copied KV, sensitivity's sampling,
    the hit_rate experiment's Belady) is refused with the config, not met by its job after the builds."""
    from specter.workflow_checks import ConfigError, check_config

    config = yaml.safe_load((Path(__file__).parents[1] / ".test" / "config.yaml").read_text())
    config["hardware"]["engine"] = "live"
    expected = {}
    for refused, fix in (
            ("experiments.main.axes.pricing: 'upstream', and main's runs decode live",
             lambda: config["experiments"]["main"]["axes"].update(pricing=["fused"])),
            (r"experiments.ablation.arms.\+ copied KV: the live engine cannot run",
             lambda: config["experiments"].pop("ablation")),
            ("experiments.dispatch.axes.pricing: 'upstream', and dispatch's runs decode live",
             lambda: config["experiments"].pop("dispatch")),
            ("experiments.sensitivity.axes.temperature: 1.0, and sensitivity's runs decode live",
             lambda: config["experiments"]["sensitivity"]["axes"].update(temperature=[0.0])),
            ("experiments.hit_rate.options.replacement: the live engine cannot run 'on-demand' .replacement=belady",
             lambda: config["experiments"]["hit_rate"]["options"].update(replacement=["lru", "lfu", "least-stale"]))):
        expected[refused] = fix
    while expected:  # each refused in the config's order, one at a time
        with pytest.raises(ConfigError) as err:
            check_config(config)
        refused = next((pattern for pattern in expected if re.search(pattern, str(err.value))), None)
        assert refused is not None, str(err.value)
        expected.pop(refused)()
    check_config(config)


def test_a_key_given_twice_in_a_config_file_is_refused_naming_both_lines(tmp_path):
    import subprocess

    from specter.config_document import ConfigError, check_unique_keys

    root = Path(__file__).parents[1]
    text = (root / ".test" / "config.yaml").read_text()
    case = next(iter(yaml.safe_load(text)["cases"]))
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{case}:"))
    doubled = "\n".join([*lines[:at + 1], *lines[at:]]) + "\n"  # the case's line twice
    bad = tmp_path / "twice.yaml"
    bad.write_text(doubled)
    with pytest.raises(ConfigError, match=f"config '{case}' is given twice in one mapping of .*twice.yaml"):
        check_unique_keys([bad])
    check_unique_keys([root / ".test" / "config.yaml", root / "config" / "config.yaml", root / "config" / "paper.yaml"])
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &b {slots: 2, k: 8}\ncases:\n  big: {<<: *b, slots: 2, slots: 3}\n")
    with pytest.raises(ConfigError, match="config 'slots' is given twice in one mapping of .*merged.yaml"):
        check_unique_keys([merged])
    merged.write_text("base: &b {slots: 2, k: 8}\ncases:\n  big: {<<: *b, slots: 3}\n")
    check_unique_keys([merged])  # a merged key given again once is YAML's override, not a repeat
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(["snakemake", "-n", "--cores", "1", "--configfile", str(bad), "--directory", str(work)],
                          capture_output=True, text=True, cwd=root, timeout=300)
    err = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("specter: error:")]
    assert proc.returncode == 2 and len(err) == 1 and "given twice" in err[0], proc.stdout[-1500:] + proc.stderr[-1500:]


def test_a_record_names_its_hardware_by_name_and_by_the_hash_of_its_numbers(real):
    from specter.timing.hardware import load_profile, profile_digest

    record = json.loads(Path(real["records"]).read_text().splitlines()[0])
    profile = record["config"]["hardware_profile"]
    assert record["hardware"] == profile["name"] == "t4-pcie3"
    assert record["config"]["hardware_sha256"] == profile_digest(profile)
    assert profile_digest(profile) == profile_digest(load_profile("t4-pcie3").to_yaml_dict())
    edited = json.loads(json.dumps(profile))
    edited["host"]["dispatch_us"] += 1
    assert profile_digest(edited) != profile_digest(profile)
    assert profile_digest({**profile, "description": "other words"}) == profile_digest(profile)


def test_a_table_without_its_checksum_is_read_with_a_warning_that_it_may_be_cut_short(real, tmp_path, capsys):
    """A table cut exactly at a line's end reads as a whole one: with its checksum gone, nothing in its bytes says it
    is short, so reading it says (once) that its completeness is unchecked; with the checksum, it is refused."""
    from specter import progress
    from specter.errors import SpecterError
    from specter.report.tablefile import read_table

    progress.configure()
    lines = Path(real["table"]).read_text().splitlines(keepends=True)
    out = Path(_table_copy(tmp_path, real, lambda p: p.write_text("".join(lines[:-1]))))
    with pytest.raises(SpecterError, match="differ from main.csv.sha256"):
        read_table(out)
    Path(str(out) + ".sha256").unlink()
    capsys.readouterr()
    assert len(read_table(out)) == len(read_table(out)) == len(lines) - 2
    read_table(real["table"])
    err = capsys.readouterr().err
    assert err.count("has no main.csv.sha256 beside it") == 1 and str(out) in err and str(real["table"]) not in err


def test_diff_compares_values_as_json_writes_them():
    """`specter diff`: `true` against `1` (or `1` against `1.0`) is a difference, and NaN in both files is none."""
    from specter.report.diff import _fields

    def paths(a, b):
        out: list[str] = []
        _fields(a, b, "", set(), out)
        return out

    assert paths({"simulated": True}, {"simulated": 1}) == ["simulated"]
    assert paths({"n": 1}, {"n": 1.0}) == ["n"]
    assert paths({"tpot_ms": float("nan")}, {"tpot_ms": float("nan")}) == []
    assert paths({"a": {"b": [1, 2]}}, {"a": {"b": [1, 2]}}) == []


def test_a_full_disk_or_an_unsearchable_directory_is_one_line(real, tmp_path, monkeypatch, capsys):
    """A file system's refusal met anywhere in a command (a full disk under an output) is one line naming the fix and
    leaves nothing; an unsearchable file-hash cache costs the hashing and nothing else."""
    import errno

    from specter import io

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(io.os, "fsync", full)
    out = tmp_path / "out" / "main.csv"
    code = main(["aggregate", "main", str(real["records"]), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "No space left on device" in err[0] and "free space" in err[0], err
    assert list((tmp_path / "out").iterdir()) == []
    monkeypatch.undo()

    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "cache"))
    file = tmp_path / "weights.bin"
    file.write_bytes(b"weights")
    want = io.files_sha256([file])
    is_file = Path.is_file

    def unsearchable(self):
        if "file-hashes" in str(self):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return is_file(self)

    monkeypatch.setattr(Path, "is_file", unsearchable)
    assert io.files_sha256([file]) == want


def test_a_fifo_as_the_tiers_manifest_is_damage_not_a_wait(tmp_path):
    import threading

    from specter.models.disk_tier import MANIFEST, tier_problem

    os.mkfifo(tmp_path / MANIFEST)
    found: list = []
    reader = threading.Thread(target=lambda: found.append(tier_problem(tmp_path)), daemon=True)
    reader.start()
    reader.join(30)
    assert found == [f"{MANIFEST} is not a regular file"]


def test_a_manifest_giving_a_files_size_as_text_says_so(tmp_path):
    """A manifest entry whose byte count is not a whole number is named as that, not as a file of its own size
    "built as" the same size."""
    from specter.models.disk_tier import MANIFEST, tier_problem

    (tmp_path / "layer-0.bin").write_bytes(b"\0" * 64)
    (tmp_path / MANIFEST).write_text(json.dumps({"format": 3, "files": {"layer-0.bin": {"bytes": "64"}}}))
    assert tier_problem(tmp_path) == f"{MANIFEST} gives layer-0.bin's bytes as '64', not a whole number"


def test_an_output_on_a_read_only_file_system_is_named_so(tmp_path, monkeypatch):
    """Root may write where the permissions forbid, never on a read-only file system: the refusal names that cause."""
    from specter import io

    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(io.os, "access", lambda *a, **k: False)
    monkeypatch.setattr(io.os, "statvfs", lambda path: ReadOnly())
    assert io.writable_problem(tmp_path / "out.jsonl") == f"cannot write in {str(tmp_path)!r} (a read-only file system)"
    ReadOnly.f_flag = 0
    assert io.writable_problem(tmp_path / "out.jsonl") == f"cannot write in {str(tmp_path)!r} (permission denied)"


def test_a_sparse_manifest_of_gigabytes_is_damage_not_read_whole(tmp_path):
    from specter.models.disk_tier import MANIFEST, tier_problem

    (tmp_path / MANIFEST).write_text('{"format": 3}')
    os.truncate(tmp_path / MANIFEST, 1 << 34)
    assert tier_problem(tmp_path) == f"{MANIFEST} unreadable (ValueError)"


def test_a_full_disk_while_a_directory_output_is_written_names_the_output(tmp_path):
    """A build or quantize writes into a temporary sibling of its output: a full disk met there (Python's error, or
    safetensors' own, which says it in words) is one OSError naming the output, and nothing is left."""
    import errno

    from specter.io import atomic_dir

    class SafetensorError(Exception):
        pass

    for raised in (OSError(errno.ENOSPC, "No space left on device"),
                   SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                                   "\"No space left on device\" })")):
        with pytest.raises(OSError) as err:
            with atomic_dir(tmp_path / "draft"):
                raise raised
        assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "draft")
        assert list(tmp_path.iterdir()) == []


def test_a_full_standard_output_is_named(tmp_path):
    import subprocess
    import sys

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "specter", "systems"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith("specter: error: No space left on device (standard output); free space"), done.stderr


def test_a_table_that_is_a_directory_is_named_so(tmp_path):
    from specter.errors import SpecterError
    from specter.report.tablefile import read_table

    (tmp_path / "main.csv").mkdir()
    with pytest.raises(SpecterError, match="'.*main.csv' is not a regular file"):
        read_table(tmp_path / "main.csv")
    with pytest.raises(SpecterError, match="does not exist"):
        read_table(tmp_path / "other.csv")


def test_a_figure_that_fails_to_save_leaves_no_file(tmp_path, monkeypatch):
    """A figure whose writing fails midway (a full disk) leaves no empty or cut PNG, and any figure already there
    stays as it was."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specter.report.plotting import save

    def full(self, f, **kwargs):
        f.write(b"\x89PNG")
        raise OSError(28, "No space left on device")

    out = tmp_path / "figure.png"
    fig = plt.figure()
    monkeypatch.setattr(type(fig), "savefig", full)
    with pytest.raises(OSError):
        save(fig, out)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    out.write_bytes(b"before")
    with pytest.raises(OSError):
        save(plt.figure(), out)
    assert out.read_bytes() == b"before" and list(tmp_path.iterdir()) == [out]


@pytest.mark.parametrize("value, bound", [(1e-12, r"positive \(at least 1e-09\) and at most"), (-1.0, "non-negative")])
def test_a_profile_number_out_of_range_is_refused_with_its_true_bound(value, bound, tmp_path):
    """A number past its range is refused naming the range it must be in: a positive 1e-12 is not told to be
    positive."""
    import yaml as yaml_

    from specter.errors import SpecterError
    from specter.timing.hardware import load_profile

    preset = Path(__file__).parents[1] / "specter" / "presets" / "hardware" / "a100-40gb-pcie4.yaml"
    profile = yaml_.safe_load(preset.read_text())
    profile["name"] = "mine"
    profile["device" if value > 0 else "link"]["peak_tflops" if value > 0 else "latency_us"] = value
    (tmp_path / "mine.yaml").write_text(yaml_.safe_dump(profile))
    with pytest.raises(SpecterError, match=bound):
        load_profile(str(tmp_path / "mine.yaml"))


def test_a_presets_name_is_the_preset_whatever_the_working_directory_holds(tmp_path, monkeypatch):
    from specter.timing.hardware import load_profile

    monkeypatch.chdir(tmp_path)
    Path("a100-40gb-pcie4").write_text("name: my-a100\n")
    assert load_profile("a100-40gb-pcie4").name == "a100-40gb-pcie4"
    Path("mine").mkdir()
    from specter.errors import SpecterError

    with pytest.raises(SpecterError, match="'mine' is not a file"):
        load_profile("./mine")


def test_a_tier_file_open_for_writing_is_refused_and_one_that_cannot_be_leased_is_said(tiny_dirs, tmp_path,
                                                                                         monkeypatch):
    """A disk-tier file another writer holds open is refused in one line before it is mapped (its rows could change
    under the run); a file no lease can be had for (a file system without leases, another user's file) is read with a
    warning, and the loader's line in the record says so."""
    import errno
    import fcntl

    import torch

    from specter.errors import SpecterError
    from specter.models import disk_tier

    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "cache"))
    model = tiny_dirs["olmoe"]
    moe = stream_moe_model(model, torch.float32, experts_on="disk")
    tier = moe.experts_on_disk
    moe.tier_leases.close()
    del moe
    gc.collect()
    writer = os.open(tier / "layer-1.bin", os.O_RDWR)
    try:
        with pytest.raises(SpecterError, match="holds the disk tier's .*layer-1.bin open for writing"):
            stream_moe_model(model, torch.float32, experts_on="disk")
    finally:
        os.close(writer)
    warned = []
    monkeypatch.setattr(disk_tier.log, "warning", lambda message, *args: warned.append(message % args))
    real = fcntl.fcntl

    def no_leases(fd, cmd, arg=0):
        if cmd == fcntl.F_SETLEASE:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", no_leases)
    moe = stream_moe_model(model, torch.float32, experts_on="disk")
    assert len(warned) == 1 and "without a lease" in warned[0] and "is not detected" in warned[0]
    assert "unleased: layer-" in moe.loaded_by


def test_diff_tells_a_missing_field_from_a_null_and_refuses_what_no_parser_reads(tmp_path, capsys):
    for side, line in (("a", '{"a": 1, "b": null}'), ("b", '{"a": 1}')):
        (tmp_path / side / "runs").mkdir(parents=True)
        (tmp_path / side / "runs" / "x.jsonl").write_text(line + "\n")
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    assert "b differs" in capsys.readouterr().out
    for damage in ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", '{"a": ' + "7" * 5000 + "}"):
        for side in ("a", "b"):
            (tmp_path / side / "runs" / "x.jsonl").write_text(damage + "\n")
        assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "x.jsonl:1 is no record this suite writes" in err[0], err


def test_a_prompt_file_named_with_a_backtick_runs_and_aggregates(real, tmp_path, capsys):
    """What `run` takes, `aggregate` takes: a prompt file whose name holds a backtick (the summary escapes it)."""
    prompts = tmp_path / "a`b.jsonl"
    prompts.write_text("".join(json.dumps({"text": f"def function_{i}(argument): return argument * {i}"}) + "\n"
                               for i in range(2)))
    records = tmp_path / "records.jsonl"
    assert main(["run", "--system", "on-demand", "--model", real["model"], "--dataset", str(prompts),
                 "--hardware", "t4-pcie3", "--num-prompts", "1", "--prefix-tokens", "8", "--max-new-tokens", "4",
                 "--resident-per-layer", "2", "--out", str(records)]) == 0
    assert main(["aggregate", "main", str(records), "--out", str(tmp_path / "tables" / "main.csv")]) == 0
    assert main(["summary", str(tmp_path)]) == 0
    assert "a`b, same slots" in capsys.readouterr().out


def test_diff_of_two_tables_damaged_alike_names_the_damage_and_counts_tables(real, tmp_path, capsys):
    """The same edit made to both trees' main table (each beside its own, now wrong, checksum): diff says they are
    identical, names the tables their checksums do not vouch for, exits 1, and counts one table, not its checksum."""
    for side in ("a", "b"):
        (tmp_path / side / "tables").mkdir(parents=True)
        table = tmp_path / side / "tables" / "main.csv"
        shutil.copy(real["table"], table)
        shutil.copy(str(real["table"]) + ".sha256", str(table) + ".sha256")
        _table_cell("tpot_ms", "7.5")(table)
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "and 1 tables, leaving out" in out and "identical\nand 2 records or tables" in out
    assert "main.csv is not the table that was written" in out


@pytest.mark.parametrize("sidecar, message", [
    (lambda table, digest: f"{digest}  other.csv\n", "is the checksum of 'other.csv', not of main.csv"),
    (lambda table, digest: None, "is not a sha256sum line"),
], ids=["naming_another_file", "sparse_gigabytes"])
def test_a_tables_checksum_file_must_name_the_table_and_be_a_line(sidecar, message, real, tmp_path):
    import hashlib

    from specter.errors import SpecterError
    from specter.report.tablefile import read_table

    table = tmp_path / "main.csv"
    shutil.copy(real["table"], table)
    text = sidecar(table, hashlib.sha256(table.read_bytes()).hexdigest())
    if text is None:
        Path(f"{table}.sha256").write_text(hashlib.sha256(table.read_bytes()).hexdigest() + "  main.csv\n")
        os.truncate(f"{table}.sha256", 1 << 34)
    else:
        Path(f"{table}.sha256").write_text(text)
    with pytest.raises(SpecterError, match=message):
        read_table(table)


def test_routing_entropy_counts_the_models_experts_and_refuses_an_edited_memo(real, tmp_path, capsys):
    """A memo whose few tokens used only some of the experts still gives the model's expert count (its header carries
    the model's shape); a route edited in a line, header and digest left as they were, is refused in one line."""
    import pandas as pd

    memo = tmp_path / "memo.json.gz"
    assert main(["sweep", "--systems", "on-demand", "--model", real["model"], "--dataset", "code", "--hardware",
                 "t4-pcie3", "--num-prompts", "1", "--prefix-tokens", "1", "--max-new-tokens", "2",
                 "--resident-per-layer", "2", "--memo-out", str(memo)]) == 0
    assert main(["aggregate", "routing_entropy", str(memo), "--out", str(tmp_path / "e.csv")]) == 0
    table = pd.read_csv(tmp_path / "e.csv")
    assert set(table["experts_per_layer"]) == {8} and len(table) == 8 * table["layer"].nunique()
    header, *lines = gzip.decompress(memo.read_bytes()).decode().splitlines()
    trace = json.loads(lines[0])
    layer = next(iter(trace["prefill_routes"][0]))
    trace["prefill_routes"][0][layer] = [-1, 3]
    edited = tmp_path / "edited.json.gz"
    edited.write_bytes(gzip.compress("\n".join([header, json.dumps(trace), *lines[1:]]).encode() + b"\n"))
    capsys.readouterr()
    assert main(["aggregate", "routing_entropy", str(edited), "--out", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "edited.json.gz" in err[0] and not (tmp_path / "x.csv").exists(), err


def test_routing_entropy_refuses_two_models_memos_under_one_folder_name(real, tiny_dirs, tmp_path, capsys):
    """Two models' memos filed as `<folder>/tiny/code-p16-k4.json.gz` both read as model "tiny" on "code": their model
    hashes differ, so the table refuses them in one line rather than merge one model's layers with another's."""
    memos = []
    for side, model in (("a", real["model"]), ("b", tiny_dirs["olmoe"])):
        memo = tmp_path / side / "tiny" / "code-p16-k4.json.gz"
        memo.parent.mkdir(parents=True)
        assert main(["sweep", "--systems", "on-demand", "--model", model, "--dataset", "code", "--hardware",
                     "t4-pcie3", "--num-prompts", "1", "--prefix-tokens", "1", "--max-new-tokens", "2",
                     "--resident-per-layer", "2", "--memo-out", str(memo)]) == 0
        memos.append(str(memo))
    capsys.readouterr()
    assert main(["aggregate", "routing_entropy", *memos, "--out", str(tmp_path / "e.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "memos of two different models" in err[0] and not (tmp_path / "e.csv").exists(), err


def test_a_system_option_value_spelled_two_ways_is_refused(real, tmp_path, capsys):
    """`noise=0.0,0` names one value twice: run, it would record each prompt twice and merge them into one row."""
    assert main(["sweep", "--systems", "specter-oracle", "--system-option", "noise=0.0,0,0.5", "--model", real["model"],
                 "--draft", str(real["draft"]), "--dataset", "code", "--hardware", "t4-pcie3", "--num-prompts", "1",
                 "--max-new-tokens", "2", "--resident-per-layer", "2", "--out", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'0.0' and '0' are one value" in err[0] and not (tmp_path / "x.jsonl").exists(), err


@pytest.mark.parametrize("name", ["main", "budget"])
def test_summary_refuses_another_experiments_table_under_an_experiments_name(real, name, tmp_path, capsys):
    """The hardware experiment's table, with its checksum, written as tables/main.csv (a section of the summary) or
    tables/budget.csv (listed with its rows): the summary refuses it as `plot` does, rather than print it as that
    experiment's."""
    tables = tmp_path / "tree" / "tables"
    assert main(["aggregate", "hardware", str(real["records"]), "--out", str(tables / f"{name}.csv")]) == 0
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "tree")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{name}.csv: the table is not a {name} table" in err[0], err


def test_diff_of_two_trees_both_damaged_alike_names_the_damage(real, tmp_path, capsys):
    """Two trees holding the same impossible record (a NaN TPOT) are identical, and diff says so, and names the
    records no run writes, exiting 1: "identical" never vouches for damage."""
    record = json.loads(Path(real["records"]).read_text().splitlines()[0])
    for side in ("a", "b"):
        (tmp_path / side / "runs").mkdir(parents=True)
        (tmp_path / side / "runs" / "x.jsonl").write_text(json.dumps({**record, "tpot_ms": float("nan")}) + "\n")
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "identical\nand 2 records or tables hold what no run writes" in out
    assert "x.jsonl record 1: tpot_ms is nan" in out
    (tmp_path / "b" / "runs" / "x.jsonl").write_text(json.dumps(record) + "\n")
    (tmp_path / "a" / "runs" / "x.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0


def test_a_table_no_record_makes_a_row_of_is_refused_not_written_empty(real, tmp_path, capsys):
    """`aggregate hit_rate` of records none of which it compares (Specter at a share of its experts resident: the
    table's Specter rows are at Specter's slots) is one line, exit 2, and no file."""
    records = tmp_path / "fraction.jsonl"
    assert main(["run", "--system", "specter", "--model", real["model"], "--draft", str(real["draft"]), "--dataset",
                 "code", "--hardware", "t4-pcie3", "--num-prompts", "1", "--max-new-tokens", "4", "--k", "2",
                 "--resident-fraction", "0.5", "--out", str(records), "-q"]) == 0
    capsys.readouterr()
    assert main(["aggregate", "hit_rate", str(records), "--out", str(tmp_path / "hit.csv")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specter: error:")]
    assert len(errors) == 1 and "none of the 1 records makes a row of the hit_rate table" in errors[0], errors
    assert not (tmp_path / "hit.csv").exists()


def test_a_table_of_some_systems_refuses_another_systems_record(hybrid_records, tmp_path, capsys):
    """`aggregate hit_rate` (its rows on-demand's and Specter's caching policies) of a hybrid's records is one line
    naming the system, exit 2, and no file: never a table that silently leaves them out."""
    records = _write(tmp_path, "r.jsonl", "".join(json.dumps(r) + "\n" for r in hybrid_records.values()))
    assert main(["aggregate", "hit_rate", str(records), "--out", str(tmp_path / "hit.csv")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specter: error:")]
    assert len(errors) == 1 and "runs of on-demand and specter, and a record is of ktransformers" in errors[0], errors
    assert not (tmp_path / "hit.csv").exists()


def test_a_table_of_draft_windows_refuses_a_system_that_drafts_none(hybrid_records, tmp_path, capsys):
    """`aggregate k_sweep` (or oracle, working_set, prefetch_policy) of a system that drafts no window is one line,
    exit 2, and no file: never a row with no K that the figure then refuses."""
    records = _write(tmp_path, "r.jsonl", json.dumps(hybrid_records["ktransformers"]) + "\n")
    for name in ("k_sweep", "oracle", "working_set", "prefetch_policy"):
        assert main(["aggregate", name, str(records), "--out", str(tmp_path / f"{name}.csv")]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specter: error:")]
        assert len(errors) == 1 and "compares draft windows, and ktransformers drafts none" in errors[0], errors
        assert not (tmp_path / f"{name}.csv").exists()


def test_diff_of_records_in_another_order_says_so_in_one_line(hybrid_records, tmp_path, capsys):
    """Records written in another order are compared run by run and prompt by prompt: one line says they moved, and
    no field is called different because a record was set beside another's."""
    lines = [json.dumps(record) for record in hybrid_records.values()]
    for side, order in (("a", lines), ("b", lines[::-1])):
        (tmp_path / side / "runs").mkdir(parents=True)
        (tmp_path / side / "runs" / "x.jsonl").write_text("\n".join(order) + "\n")
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "x.jsonl: the same runs' records in another order" in out and "differs in" not in out, out


def test_a_bar_in_a_cell_stays_in_its_cell_and_diff_names_the_side_that_holds_a_file(tmp_path):
    from specter.report.diff import diff_results
    from specter.report.summary import _markdown

    assert _markdown([["fiddler|x", "1"]], ["system", "tpot"])[2] == "| fiddler\\|x | 1 |"
    assert _markdown([["d\nraft", "a`m"]], ["draft", "arm"])[2] == "| d\\nraft | a\\`m |"
    for side in ("a", "b"):
        (tmp_path / side / "tables").mkdir(parents=True)
    (tmp_path / "a" / "tables" / "t.csv").mkdir()
    (tmp_path / "b" / "tables" / "t.csv").write_text("x\n1\n")
    assert diff_results(tmp_path / "a", tmp_path / "b").differences == [
        f"tables/t.csv: a file only in {tmp_path / 'b'}"]


@pytest.mark.parametrize("value", ["1:04", "6_4", "0x40", "0100"])
def test_a_number_yaml_reads_in_another_base_is_refused_in_configs_and_profiles(value, tmp_path):
    """YAML 1.1 reads `1:04` as 64 (base 60), `6_4` as 64, `0x40` as 64 and `0100` as 64 (octal), without a word: a
    config or a profile that writes one is refused, naming the value, and the shipped ones all pass."""
    import re

    from specter.config_document import ConfigError, check_unique_keys
    from specter.errors import SpecterError
    from specter.timing.hardware import load_profile

    root = Path(__file__).parents[1]
    check_unique_keys([root / ".test" / "config.yaml", root / "config" / "config.yaml", root / "config" / "paper.yaml"])
    config = tmp_path / "config.yaml"
    config.write_text("experiments:\n  main:\n    max_new_tokens: " + value + "\n")
    with pytest.raises(ConfigError, match=f"config value '{re.escape(value)}' in .*config.yaml .line 3. is a number"):
        check_unique_keys([config])
    preset = (root / "specter/presets/hardware/t4-pcie3.yaml").read_text()
    profile = tmp_path / "profile.yaml"
    profile.write_text(re.sub(r"latency_us: *[0-9.]+", f"latency_us: {value}", preset, count=1))
    with pytest.raises(SpecterError, match=f"'{re.escape(value)}' is a number YAML 1.1 reads in another base"):
        load_profile(str(profile))
    for shipped in (root / "specter/presets/hardware").glob("*.yaml"):
        load_profile(str(shipped))


@pytest.mark.parametrize("card, message", [
    ({"weights_sha256": "af86fad4"}, "gives weights_sha256 'af86fad4', and the model's config and weights hash to"),
    ([1, 2], "is not a model card (not a JSON object)"),
    ({"stands_in_for": "gpt-5\n|x|"}, "stands_in_for is 'gpt-5\\n|x|'"),
    ({"perplexity_ratio": {"code": -3.0}}, "perplexity_ratio is {'code': -3.0}"),
    ({"perplexity_ratio": [1, 2]}, "perplexity_ratio is [1, 2]"),
    ('{"stands_in_for": "x", "stands_in_for": "y"}', "the key 'stands_in_for' is given twice")])
def test_the_summary_holds_a_model_card_to_the_files_beside_it(card, message, tiny_dirs, real, tmp_path, capsys):
    """`specter summary` prints each model's hash: the hash of its files as they are, refusing a card that gives
    another (weights replaced after the build), a card that is no object, or a name that is not one line of text."""
    from specter.cli import main

    model = tmp_path / "results" / "models" / "tiny"
    shutil.copytree(tiny_dirs["mixtral"], model)
    (tmp_path / "results" / "tables").mkdir()
    for name in ("main.csv", "main.csv.sha256"):
        shutil.copy(str(real["table"]).replace("main.csv", name), tmp_path / "results" / "tables" / name)
    (model / "model_card.json").write_text(card if isinstance(card, str) else json.dumps(card))
    assert main(["summary", str(tmp_path / "results"), "--out", str(tmp_path / "s.md")]) == 2
    assert message in capsys.readouterr().err
    (model / "model_card.json").write_text(json.dumps({"stands_in_for": "Mixtral-8x7B"}))
    assert main(["summary", str(tmp_path / "results"), "--out", str(tmp_path / "s.md")]) == 0
    from specter.models.integrity import model_hash

    assert model_hash(model) in (tmp_path / "s.md").read_text()


def test_a_table_its_reader_would_refuse_is_never_written(tmp_path):
    """`write_table` holds what it writes to `read_table`'s checks: a frame with a cell no run gives (a line break in a
    name, a share above 1) is refused, naming the inputs as the cause, and nothing is written."""
    import pandas as pd

    from specter.errors import SpecterError
    from specter.report.tablefile import write_table

    for frame in (pd.DataFrame({"system": ["specter"], "arm": ["no\u2028prefetch"], "tpot_ms": [1.0]}),
                  pd.DataFrame({"system": ["specter"], "hit_rate": [1.5], "tpot_ms": [1.0]})):
        with pytest.raises(SpecterError, match="not written: the records it was made from hold a value"):
            write_table(frame, tmp_path / "t.csv")
        assert not list(tmp_path.iterdir())


def test_a_model_larger_than_memory_is_one_line_exit_1(tmp_path, capsys):
    """torch's allocator refusing a tensor (a tiny model set 2^20 wide: 4 TB a matrix) ends the command with one
    line, not a traceback, and writes nothing."""
    from specter.cli import main

    code = main(["build-model", "tiny-mixtral", "--set", "hidden_size=1048576", "--set", "intermediate_size=1048576",
                 "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("specter:")]
    assert code == 1 and "Traceback" not in err and len(lines) == 1 and "out of memory" in lines[0], err
    assert not list(tmp_path.iterdir())


def test_diff_tells_a_damaged_checksum_from_the_table_it_was_written_for(tmp_path):
    """Two trees with the same table bytes, one with the checksum the suite wrote and one with a damaged one (every
    reader refuses its table) are not identical."""
    import hashlib

    from specter.report.diff import diff_results

    for side, digest in (("a", hashlib.sha256(b"x\n1\n").hexdigest()), ("b", "0" * 64)):
        (tmp_path / side / "tables").mkdir(parents=True)
        (tmp_path / side / "tables" / "t.csv").write_text("x\n1\n")
        (tmp_path / side / "tables" / "t.csv.sha256").write_text(f"{digest}  t.csv\n")
    differences = diff_results(tmp_path / "a", tmp_path / "b").differences
    assert differences == ["tables/t.csv.sha256: the checksum files differ"]


def test_a_table_whose_checksum_cannot_be_written_is_not_left_without_it(tmp_path, monkeypatch):
    """A disk with room for the table but not for its checksum: the table is removed with the error, never left for
    readers that would take it with a warning only."""
    import errno

    import pandas as pd

    from specter.report import tablefile

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(tablefile, "atomic_write_text", full)
    with pytest.raises(OSError):
        tablefile.write_table(pd.DataFrame({"x": [1]}), tmp_path / "t.csv")
    assert not list(tmp_path.iterdir())


def test_a_sweep_counts_the_runs_it_ran_not_those_over_budget(real, tmp_path, capsys):
    """`specter sweep` at a device memory holding on-demand's resident part but not Specter's (its draft beside) runs
    one of two: the line says 1 run and that 1 of 2 was skipped, never 2 runs."""
    assert main(["sweep", "--systems", "on-demand,specter", "--model", real["model"], "--draft", str(real["draft"]),
                 "--dataset", "code", "--hardware", "t4-pcie3", "--num-prompts", "1", "--max-new-tokens", "4",
                 "--k", "2", "--device-memory-gb", "0.00025", "--out", str(tmp_path / "r.jsonl"), "-q"]) == 0
    said = capsys.readouterr().out
    assert "1 run (1 of 2 skipped: over budget), 1 records" in said, said


def test_one_model_named_by_two_paths_is_refused_naming_the_paths(real, tmp_path, capsys, monkeypatch):
    """The same run of one checkpoint given by its absolute path and by a relative one is two runs to the table; the
    refusal says the model is one checkpoint named two ways, not only that the paths differ."""
    monkeypatch.chdir(Path(real["model"]).parent)
    for name, model in (("abs", real["model"]), ("rel", Path(real["model"]).name)):
        assert main(["run", "--system", "on-demand", "--model", str(model), "--dataset", "code", "--hardware",
                     "t4-pcie3", "--num-prompts", "1", "--max-new-tokens", "4", "--resident-per-layer", "2",
                     "--out", str(tmp_path / f"{name}.jsonl"), "-q"]) == 0
    capsys.readouterr()
    assert main(["aggregate", "main", str(tmp_path / "abs.jsonl"), str(tmp_path / "rel.jsonl"), "--out",
                 str(tmp_path / "main.csv")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specter: error:")]
    assert len(errors) == 1 and "one checkpoint (config.model_sha256) named by two paths" in errors[0], errors


def test_a_figure_of_a_table_lacking_its_columns_names_them_plainly(real, tmp_path, capsys):
    """`plot routing_entropy` of the main table: the line names the missing column, not pandas' Index repr."""
    assert main(["plot", "routing_entropy", "--table", str(real["table"]), "--out", str(tmp_path / "f.png")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specter: error:")]
    assert len(errors) == 1 and "(missing: layer)" in errors[0] and "Index" not in errors[0], errors


def test_a_slower_link_moves_an_ops_wait_from_compute_to_stall_at_the_same_tpot(real, tmp_path):
    """The breakdown times an op from its first kernel to its last (as events around it do live): on a link 8x slower,
    a launch-bound decode's TPOT is the same, and what its target compute loses its stall on copies gains, the host's
    part unchanged (docs/metrics.md)."""
    preset = dict(real["preset"], name="slow-link")
    preset["link"] = dict(preset["link"], h2d_pinned_gbps=preset["link"]["h2d_pinned_gbps"] / 8,
                          h2d_pageable_gbps=preset["link"]["h2d_pageable_gbps"] / 8)
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump(preset))
    parts = {}
    for name, hardware in (("fast", "t4-pcie3"), ("slow", str(tmp_path / "slow.yaml"))):
        assert main(["run", "--system", "on-demand", "--model", real["model"], "--dataset", "code", "--hardware",
                     hardware, "--num-prompts", "1", "--max-new-tokens", "8", "--resident-per-layer", "2",
                     "--out", str(tmp_path / f"{name}.jsonl"), "-q"]) == 0
        record = json.loads((tmp_path / f"{name}.jsonl").read_text().splitlines()[0])
        parts[name] = (record["tpot_ms"], record["extra"]["breakdown_ms"])
    (fast_tpot, fast), (slow_tpot, slow) = parts["fast"], parts["slow"]
    if fast_tpot != slow_tpot:
        pytest.skip(f"the decode is not launch-bound on t4-pcie3 ({fast_tpot} against {slow_tpot} ms)")
    assert slow["target compute"] < fast["target compute"] and slow["stall on copies"] > fast["stall on copies"]
    assert math.isclose(slow["target compute"] + slow["stall on copies"], fast["target compute"]
                        + fast["stall on copies"], rel_tol=1e-9)
    assert slow["host syncs and idle"] == pytest.approx(fast["host syncs and idle"], rel=1e-9)


@pytest.fixture(scope="module")
def budget_records(real, tmp_path_factory):
    """One record each of a run at a device memory in GB (llama.cpp's CPU experts, n-cpu-moe=-1) and at a resident
    fraction (naive), on the tiny Mixtral."""
    root, out = tmp_path_factory.mktemp("budgets"), {}
    for name, system, budget in (("gb", "llama-cpp-cpu-moe", ["--device-memory-gb", "0.0004"]),
                                 ("fraction", "naive", ["--resident-fraction", "0.25"])):
        assert main(["run", "--system", system, "--model", real["model"], "--dataset", "code", "--hardware",
                     "a100-40gb-pcie4", "--num-prompts", "1", "--max-new-tokens", "4", *budget,
                     "--out", str(root / f"{name}.jsonl"), "-q"]) == 0
        out[name] = json.loads((root / f"{name}.jsonl").read_text().splitlines()[0])
    return out


@pytest.mark.parametrize("budget, edit, said", [
    ("gb", lambda r: r["config"]["memory"].update(budget_bytes=300000), "and --device-memory-gb 0.0004 is that"),
    ("gb", lambda r: r["config"].update(device_memory_gb=0.0003), "and --device-memory-gb 0.0003 is that"),
    ("gb", lambda r: (r["config"].update(device_memory_gb=0.0003), r["config"]["memory"].update(budget_bytes=300000)),
     "and a budget of 300000 bytes beside the resident"),
    ("fraction", lambda r: r["config"]["memory"].update(budget_kind="gb"), "and its run was given --resident-fraction"),
    ("fraction", lambda r: r["config"].update(resident_fraction=0.75), "--resident-fraction 0.75 of 8 experts gives 6"),
    ("fraction", lambda r: r["config"].update(resident_fraction=None, resident_per_layer=5),
     "and its run was given --resident-per-layer"),
    ("fraction", lambda r: (r["config"].update(resident_fraction=None, resident_per_layer=5),
                            r["config"]["memory"].update(budget_kind="slots")),
     "--resident-per-layer 5 of 8 experts gives 5 slots"),
    ("fraction", lambda r: r["config"].update(resident_fraction="x"), "config.resident_fraction is 'x', not a budget"),
    ("gb", lambda r: r["config"].update(device_memory_gb=float("nan")), "config.device_memory_gb is nan, not a budget"),
], ids=["budget_bytes_not_the_flag", "flag_not_the_budget_bytes", "plan_past_its_budget", "kind_not_the_flag",
        "fraction_not_the_slots", "flag_not_the_kind", "slots_flag_not_the_slots",
        "fraction_not_a_number", "gb_nan"])
def test_a_memory_plan_edited_against_its_budget_is_refused(budget_records, budget, edit, said, tmp_path):
    """A record's memory plan is held to the one budget flag its run was given (`record_sums.budget_problem`): its
    kind, its bytes, the slots a fraction or a per-layer count gives, and the slots a budget in bytes holds."""
    from specter.errors import SpecterError
    from specter.records import read_jsonl

    record = json.loads(json.dumps(budget_records[budget]))
    read_jsonl(_write(tmp_path, "whole.jsonl", json.dumps(record) + "\n"))  # as written: whole
    edit(record)
    with pytest.raises(SpecterError, match=re.escape(said)):
        read_jsonl(_write(tmp_path, "edited.jsonl", json.dumps(record) + "\n"))


def test_a_draft_whose_sidecar_is_a_pipe_says_so(tmp_path):
    """A draft directory whose meta.json is a FIFO is refused as such, not as having no meta.json."""
    from specter.errors import SpecterError
    from specter.quant.meta import DraftMeta

    (tmp_path / "draft").mkdir()
    os.mkfifo(tmp_path / "draft" / "meta.json")
    with pytest.raises(SpecterError, match="its meta.json is not a regular file"):
        DraftMeta.read(tmp_path / "draft")


@pytest.mark.parametrize("keep, said", [
    (lambda e: e["layer"] == 0 and e["distance"] == 1, "and every window of the run drafts K = 2"),
    (lambda e: e["layer"] == 0, "expert_prediction holds 1 layers, and the run's routing has 2 MoE layers"),
], ids=["one_distance_left", "one_layer_left"])
def test_an_expert_prediction_cut_short_is_refused(real, keep, said, tmp_path):
    """A fixed-K run's expert prediction covers every MoE layer at every distance 1 .. K: a list cut to some of them
    (a routing table would silently lose the rest) is refused."""
    from specter.errors import SpecterError
    from specter.records import read_jsonl

    record = json.loads(real["records"].read_text().splitlines()[0])
    assert record["k"] == 2 and len(record["expert_prediction"]) == 4
    record["expert_prediction"] = [e for e in record["expert_prediction"] if keep(e)]
    with pytest.raises(SpecterError, match=re.escape(said)):
        read_jsonl(_write(tmp_path, "edited.jsonl", json.dumps(record) + "\n"))


def test_two_records_of_one_model_with_other_non_expert_bytes_are_refused(hybrid_records, tmp_path, capsys):
    """Two runs of one model priced alike (its shape, engine and precision) hold one size for its weights besides the
    experts: a memory plan edited with its sum kept is refused beside the other's, not drawn as two sizes."""
    edited = json.loads(json.dumps(hybrid_records["llama-cpp-cpu-moe"]))
    for name in ("non_expert_bytes", "resident_bytes"):
        edited["config"]["memory"][name] += 1000
    records = _write(tmp_path, "r.jsonl", "".join(json.dumps(r) + "\n" for r in (
        hybrid_records["ktransformers"], edited)))
    assert main(["aggregate", "memory", records, "--out", str(tmp_path / "memory.csv")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specter: error:")]
    assert len(errors) == 1 and "their memory plans give its weights besides the experts as" in errors[0], errors
    assert not (tmp_path / "memory.csv").exists()


def test_a_pipe_as_the_drafts_experts_is_one_line_not_a_wait(real, tmp_path):
    """safetensors' own open of a pipe would wait for a writer, deaf to SIGTERM: the draft's experts file that is not
    a regular file is refused before it is opened."""
    import subprocess
    import sys

    draft = tmp_path / "draft"
    shutil.copytree(real["draft"], draft)
    (draft / "experts.safetensors").unlink()
    os.mkfifo(draft / "experts.safetensors")
    argv = [a.format(out=tmp_path / "out") for a in _run(real, draft=str(draft))]
    proc = subprocess.run([sys.executable, "-m", "specter", *argv], capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("specter: error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert "experts.safetensors is not a regular file" in errors[0] and not (tmp_path / "out.jsonl").exists()


def test_a_cache_that_cannot_be_written_is_said_once(tmp_path, monkeypatch):
    """A regular file where the suite's cache goes costs every run its hashing, nothing else: one warning says so,
    naming the cache and the fix, however many files are hashed."""
    import logging

    from specter import io

    class Said(logging.Handler):  # on the module's own logger: the CLI's logging setup may stop it propagating
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    said: list[str] = []
    handler = Said(logging.WARNING)
    logging.getLogger(io.__name__).addHandler(handler)
    monkeypatch.setenv("SPECTER_CACHE_DIR", _write(tmp_path, "cache", "x"))
    io.cache_unusable.cache_clear()
    try:
        for file in [Path(_write(tmp_path, f"f{i}", f"bytes {i}")) for i in range(2)]:
            assert io.files_sha256([file]) == io._files_sha256([file])
    finally:
        logging.getLogger(io.__name__).removeHandler(handler)
    said = [line for line in said if "cannot be written" in line]
    assert len(said) == 1 and str(tmp_path / "cache") in said[0] and "SPECTER_CACHE_DIR" in said[0], said


def test_a_main_table_of_runs_at_other_slots_than_specters_is_not_written(real, tmp_path, capsys):
    """`main` at the same slots compares each system's run at Specter's slots: a baseline run at other slots, given
    beside Specter's, is refused in one line naming both, never a "same slots" row with a speedup over them."""
    other = tmp_path / "on-demand.jsonl"
    argv = [a.format(out=tmp_path / "unused") for a in _run(real, "--resident-per-layer", "4", "--max-new-tokens", "6",
                                                           out=str(other), system="on-demand")]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["aggregate", "main", str(real["records"]), str(other), "--out", str(tmp_path / "main.csv")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specter: error:")]
    said = "has slots_per_layer 4, and the Specter row its speedup divides by has 2"
    assert len(errors) == 1 and said in errors[0], errors
    assert not (tmp_path / "main.csv").exists()


@pytest.mark.parametrize("specter_flags, other_flags, said", [
    (("--resident-per-layer", "2"), ("--resident-per-layer", "2", "--max-new-tokens", "4"),
     "differ in config.max_new_tokens (4 and 6)"),
    (("--same-memory-as", "2"), ("--same-memory-as", "1"), "given the memory specter holds at 1 slots a layer"),
], ids=["other_output_lengths", "other_memories"])
def test_a_speedup_over_a_specter_run_of_another_protocol_is_refused(real, tmp_path, capsys, specter_flags,
                                                                     other_flags, said):
    """A speedup is one system's TPOT over Specter's in runs of one protocol: a baseline decoding other lengths, or
    given another run's memory in a same-memory comparison, is refused in one line naming the setting, never a ratio
    the table has no column to explain."""
    paths = {}
    for system, flags in (("specter", specter_flags), ("on-demand", other_flags)):
        paths[system] = tmp_path / f"{system}.jsonl"
        argv = _without(_run(real, "--max-new-tokens", "6", out=str(paths[system]), system=system),
                        "--resident-per-layer")
        assert main([*argv, *flags]) == 0
    capsys.readouterr()
    assert main(["aggregate", "main", *map(str, paths.values()), "--out", str(tmp_path / "main.csv")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specter: error:")]
    assert len(errors) == 1 and said in errors[0], errors
    assert not (tmp_path / "main.csv").exists()
