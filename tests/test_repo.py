"""The repository's own promises: CI runs the README's test line verbatim; conda and pip environments agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

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
