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


def test_environment_yml_installs_this_package_with_its_python():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert project["requires-python"] == ">=" + python.split("=")[1]
    pip = next(d for d in env["dependencies"] if isinstance(d, dict))["pip"]
    assert pip == ["-e .[test]"]


def test_key_dependencies_are_pinned_exactly():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for name in ("torch", "transformers", "gptqmodel", "snakemake", "pandas", "seaborn"):
        (spec,) = [d for d in deps if re.split(r"[=<>!~ ]", d)[0] == name]
        assert "==" in spec, spec


def test_rule_environment_pins_equal_the_package_pins():
    env = yaml.safe_load((ROOT / "workflow" / "envs" / "specter.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip = next(d for d in env["dependencies"] if isinstance(d, dict))["pip"]
    assert pip == project["dependencies"]
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert project["requires-python"] == ">=" + python.split("=")[1]
    nodeps = [line.strip() for line in (ROOT / "requirements-nodeps.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    post = (ROOT / "workflow" / "envs" / "specter.post-deploy.sh").read_text()
    assert f"pip install --no-deps {' '.join(nodeps)}" in post


def test_every_workflow_rule_declares_log_and_environment_and_calls_the_cli():
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        for rule in re.split(r"\n(?=rule \w+:)", text)[1:]:
            name = rule.split(":", 1)[0]
            assert "\n    log:" in rule and "\n    conda:" in rule, f"{smk.name}: {name}"
            assert "python -m specter " in rule and "\n    script:" not in rule, f"{smk.name}: {name}"
