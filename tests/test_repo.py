"""The repository's own promises: CI runs the README's test line verbatim; conda and pip environments agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _quick_start_lines() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def test_quick_start_has_exactly_two_command_lines():
    blocks = _quick_start_lines()
    assert len(blocks) == 2 and all("\n" not in b for b in blocks), blocks


def test_ci_runs_the_readme_test_line_verbatim():
    test_line = _quick_start_lines()[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_line in ci, f"{test_line!r} not a line of .ci/run"
    assert "set -euo pipefail" in ci, "pytest's exit 5 (no tests collected) must fail CI"


def _constraints() -> dict[str, str]:
    """{normalized name: exact version} of constraints.txt."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.strip().split("==")
            pins[_normal(name)] = version
    return pins


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + project["optional-dependencies"]["test"]


def test_environment_yml_installs_this_package_with_its_python_and_the_tested_set():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert project["requires-python"] == ">=" + python.split("=")[1]
    pip = next(d for d in env["dependencies"] if isinstance(d, dict))["pip"]
    assert pip == ["-c constraints.txt", "-e .[test]"]


def test_dependencies_are_ranges_and_the_tested_set_satisfies_them():
    """pyproject.toml: a lower and an upper bound on every dependency (ruff exact: its rules change); constraints.txt
    pins each at a version inside its range, and pins nothing twice."""
    from packaging.requirements import Requirement

    pins = _constraints()
    lines = [ln for ln in (ROOT / "constraints.txt").read_text().splitlines() if ln.strip() and ln[0] != "#"]
    assert len(lines) == len(pins)
    for text in _declared():
        req = Requirement(text)
        ops = {s.operator for s in req.specifier}
        assert ops == {">=", "<"} or (req.name == "ruff" and ops == {"=="}), text
        assert _normal(req.name) in pins, f"{req.name} is not in constraints.txt"
        assert req.specifier.contains(pins[_normal(req.name)]), (text, pins[_normal(req.name)])
    nodeps = [ln for ln in (ROOT / "requirements-nodeps.txt").read_text().splitlines() if ln.strip() and ln[0] != "#"]
    assert not {_normal(ln.split("==")[0]) for ln in nodeps} & set(pins)  # those come from their own file


def test_rule_environment_pins_equal_the_tested_set():
    env = yaml.safe_load((ROOT / "workflow" / "envs" / "specter.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip = next(d for d in env["dependencies"] if isinstance(d, dict))["pip"]
    pins = _constraints()
    from packaging.requirements import Requirement

    expected = [f"{Requirement(d).name}=={pins[_normal(Requirement(d).name)]}" for d in project["dependencies"]]
    assert sorted(pip) == sorted(expected)
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert project["requires-python"] == ">=" + python.split("=")[1]
    nodeps = [line.strip() for line in (ROOT / "requirements-nodeps.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    post = (ROOT / "workflow" / "envs" / "specter.post-deploy.sh").read_text()
    assert f"pip install --no-deps {' '.join(nodeps)}" in post


def test_the_quick_start_and_the_image_install_the_tested_set():
    for line in _quick_start_lines():
        assert line.startswith("python -m pip install --no-compile -c constraints.txt -e "), line
    docker = (ROOT / "Dockerfile").read_text()
    assert 'pip install -c constraints.txt -e ".[test]"' in docker and "constraints.txt" in docker.split("COPY")[1]


def test_every_workflow_rule_declares_log_and_environment_and_calls_the_cli():
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        for rule in re.split(r"\n(?=rule \w+:)", text)[1:]:
            name = rule.split(":", 1)[0]
            assert "\n    log:" in rule and "\n    conda:" in rule, f"{smk.name}: {name}"
            assert "python -m specter " in rule and "\n    script:" not in rule, f"{smk.name}: {name}"


def test_ci_runs_every_marker_the_default_run_leaves_out():
    """The README's test line leaves the slow and SLURM tests out (addopts); CI runs each of them on its own."""
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    left_out = re.findall(r"not (\w+)", addopts)
    assert set(left_out) == {"slow", "slurm"}, addopts
    ci = (ROOT / ".ci" / "run").read_text()
    for marker in left_out:
        assert re.search(rf"python -m pytest -m {marker}\b", ci), marker


def test_the_readme_is_a_front_door_of_at_most_200_lines_none_over_200_characters():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    long = [(i + 1, len(line)) for i, line in enumerate(lines) if len(line) > 200]
    assert not long, long


def test_every_relative_link_of_the_readme_and_docs_names_a_tracked_file():
    for page in [ROOT / "README.md", ROOT / "DESIGN.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}"


README_TABLE = re.compile(r"<!-- results: begin [^\n]*-->\n(.*?)<!-- results: end -->", flags=re.S)
COMMITTED_FIGURES = ROOT / "docs" / "results" / "main.csv"
NO_FIGURES_YET = ("The table is generated by `specter summary --readme` after `snakemake --cores all`; its figures are "
                  "not committed yet.\n")


README_CLAIMS = re.compile(r"<!-- claims: begin [^\n]*-->\n(.*?)<!-- claims: end -->", flags=re.S)
COMMITTED_CLAIMS = ROOT / "docs" / "results" / "claims.csv"


def test_the_readme_opens_its_results_with_the_claims_table_of_a_named_run(capsys):
    """The README's first results block is the claims table `specter summary --readme --from
    docs/results/claims.csv` prints, and it names the run that wrote it (docs/results/run.yaml)."""
    from specter.cli import main

    readme = (ROOT / "README.md").read_text()
    blocks = README_CLAIMS.findall(readme)
    assert len(blocks) == 1, "README.md needs one block between <!-- claims: begin ... --> and <!-- claims: end -->"
    assert readme.index("<!-- claims: begin") < readme.index("<!-- results: begin"), "the claims table comes first"
    assert main(["summary", "--readme", "--from", str(COMMITTED_CLAIMS)]) == 0
    assert blocks[0] == capsys.readouterr().out, "regenerate the README's claims: specter summary --readme --from " \
                                                 "docs/results/claims.csv"
    assert blocks[0].startswith("Run: `snakemake --cores all` on `config/config.yaml`, ")


def test_the_readme_results_table_is_the_generators_output_for_the_committed_figures(capsys):
    """The block between the README's markers is what `specter summary --readme --from docs/results/main.csv` prints;
    until that file is committed, the block is the one line saying so."""
    from specter.cli import main

    blocks = README_TABLE.findall((ROOT / "README.md").read_text())
    assert len(blocks) == 1, "README.md needs one block between <!-- results: begin ... --> and <!-- results: end -->"
    if not COMMITTED_FIGURES.is_file():
        assert blocks[0] == NO_FIGURES_YET
        pytest.skip("docs/results/main.csv is absent: copy results/tables/main.csv there after `snakemake --cores "
                    "all`, then put `specter summary --readme --from docs/results/main.csv` between the markers")
    assert main(["summary", "--readme", "--from", str(COMMITTED_FIGURES)]) == 0
    assert blocks[0] == capsys.readouterr().out, "regenerate the README's table: specter summary --readme --from " \
                                                 "docs/results/main.csv"


#: phrases that tell how the suite was made (which earlier run or machine measured what, a commit as a figure's
#: source), each a pattern that leaves the ordinary uses alone ("this machine's GPU" in a command's help, a `Session`)
HISTORY = [
    r"\b(this|last|previous|earlier|an earlier|a previous) stop\b",
    r"\bstops?'s? machines?\b|\bstops' machines?\b",
    r"\b(the|a|this|last|previous|earlier) (previous|earlier|last) (stop|machine|reproduce|session)s?\b",
    r"\bprevious (stop|machine|reproduce)s?\b",
    r"\b(this|last|previous|earlier|the cold) (cold )?reproduce\b",
    r"\ba session earlier\b",
    r"\b(on|of) this machine'?s? (\d+|two) cores\b",
    r"\bmedians of this machine\b",
    r"\b(the|our) development machine\b",
    r"\b(commit|build|reproduce|at|of|since|before|the) (?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b(?! *=)",
    r"\((?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}[;)]",
]
PROSE = (".md", ".py", ".yaml", ".yml", ".smk", ".toml", ".txt", ".sh", ".cfg")


def _tracked_prose() -> list[Path]:
    import subprocess

    try:
        names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):  # an unpacked sdist: every file but generated ones
        names = "\n".join(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                          and not {"results", ".git", "__pycache__"} & set(p.relative_to(ROOT).parts))
    paths = [ROOT / n for n in names.splitlines() if n]
    return [p for p in paths if p.is_file() and (p.suffix in PROSE or p.name in ("Snakefile", "Dockerfile", "run"))]


def test_no_tracked_prose_tells_the_history_of_its_making():
    found = []
    for path in _tracked_prose():
        if path == Path(__file__).resolve():
            continue  # this file: the patterns and the lines they are tried on
        for i, line in enumerate(path.read_text(errors="replace").splitlines()):
            for pattern in HISTORY:
                if re.search(pattern, line, flags=re.I):
                    found.append(f"{path.relative_to(ROOT)}:{i + 1}: {line.strip()[:120]}")
    assert not found, "tracked files describe the software, not its making:\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    "36 min 2 s measured on this stop's machine", "27 min on the previous stop's faster one",
    "differed between two stops' machines", "in the last cold reproduce", "a cold reproduce of commit 790a9b8",
    "the reproduce of 269e3f9 on this machine a session earlier", "(9c919d9; `--system-option`",
    "the 6e32bad build with 30 steps", "4 min 49 s on this machine's 2 cores", "Not run on the development machine",
    "medians of this machine, noisy", "in the previous stop",
])
def test_the_history_patterns_catch_what_they_are_for(line):
    assert any(re.search(p, line, flags=re.I) for p in HISTORY), line


@pytest.mark.parametrize("line", [
    "measured on this machine's GPU (real slots, copies and kernels)", "every forward this session runs",
    "keep the previous one where it is", "computed by an earlier build (%s)", "from an earlier run, is left as it was",
    "its sha256 is 3f2a9c1d...", "`weights_sha256` of the model", "after the previous one's last proposal",
])
def test_the_history_patterns_leave_ordinary_uses_alone(line):
    assert not any(re.search(p, line, flags=re.I) for p in HISTORY), line


def _cited(text: str) -> set[str]:
    """The papers (arXiv ids) and public repositories (owner/name after github.com/, or a known owner) `text` names."""
    papers = set(re.findall(r"arXiv (\d{4}\.\d{4,5})", text))
    repos = set(re.findall(r"github\.com/([\w.-]+/[\w.-]+?)[,.`)\s]", text))
    repos |= set(re.findall(r"\b(huggingface/accelerate|wwwwwf/specter_asplos|mobiusml/hqq|"
                            r"dvmazur/mixtral-offloading|EfficientMoE/MoE-Infinity|efeslab/fiddler)\b", text))
    return papers | repos


def test_every_source_the_presets_and_baselines_cite_resolves_to_a_file_in_the_repository():
    """A preset's sources and a baseline's docstring name papers, repositories and files: every paper and repository
    is on docs/references.md, and every file of this repository they name exists."""
    references = (ROOT / "docs" / "references.md").read_text()
    texts = {p: p.read_text() for p in [*(ROOT / "specter" / "presets").rglob("*.yaml"),
                                        *(ROOT / "baselines").glob("*.py")]}
    missing = {f"{p.relative_to(ROOT)}: {c}" for p, t in texts.items() for c in _cited(t) if c not in references}
    assert not missing, f"cited but not on docs/references.md: {sorted(missing)}"
    files = {f"{p.relative_to(ROOT)}: {f}" for p, t in texts.items()
             for f in re.findall(r"\b((?:docs|specter|config)/[\w./-]+\.(?:md|yaml|py))", t) if not (ROOT / f).exists()}
    assert not files, f"files named as sources that the repository lacks: {sorted(files)}"
    assert "REFERENCES.md" not in "".join(texts.values()), "a source names a file outside the repository"
    for name in ("a100-40gb-pcie4", "h100-pcie5", "t4-pcie3"):
        sources = yaml.safe_load((ROOT / "specter" / "presets" / "hardware" / f"{name}.yaml").read_text())["sources"]
        assert "ASSUMED" in sources["host.dispatch_us"] and "docs/references.md" in sources["host.dispatch_us"]


GPU_FIT_TABLE = re.compile(r"<!-- plan-memory: begin [^\n]*-->\n(.*?)<!-- plan-memory: end -->", flags=re.S)


def test_docs_gpu_fit_table_is_the_memory_plans_own_output(capsys):
    """docs/gpu.md's table of which card holds which model is what `specter plan-memory --markdown` prints: the memory
    plan every run makes, never a table kept by hand."""
    from specter.cli import main

    blocks = GPU_FIT_TABLE.findall((ROOT / "docs" / "gpu.md").read_text())
    assert len(blocks) == 1, "docs/gpu.md needs one block between <!-- plan-memory: begin ... --> and its end"
    assert main(["plan-memory", "--markdown"]) == 0
    assert blocks[0] == capsys.readouterr().out, "regenerate it: specter plan-memory --markdown"
