"""The workflow on a real SLURM cluster: a one-node cluster on localhost (`.ci/slurm-up`, with slurmdbd, so `sacct`
answers), a slice of the `.test` configuration (`SLICE`: one model built, one GPTQ draft quantized, one recording, one
sweep, one aggregate) run through the SLURM profile's test variant (`.test/slurm`), every job in `sacct`, the outputs
equal to a local run's; the quantize job cancelled with `scancel` mid-run and the workflow rerun; a job past its time
limit reported failed with its log. The whole `.test` workflow runs locally in `tests/test_workflow.py`; through the
cluster each rule kind once proves what the whole would, in minutes rather than twenty.

Marked `slurm` and left out of the default run (pyproject.toml's addopts); `.ci/run` runs `python -m pytest -m slurm`
after the unit tests. Where the cluster cannot start (`.ci/slurm-up` exits 3: not root, no apt-get, a daemon that does
not come up) every test here is skipped, with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"
TEST_PROFILE = ROOT / ".test" / "slurm" / "config.yaml"
SACCT_FIELDS = "JobID,JobName,Comment,State,ExitCode,Elapsed"
#: the target the cluster runs: its DAG is build_model, quantize (GPTQ), record, sweep and aggregate, one job each
SLICE = "results/tables/prefetch_policy.csv"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The environment of a started one-node cluster (SLURM_CONF, PATH); stopped and removed afterwards."""
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        pytest.fail("the SLURM executor plugin is not installed: python -m pip install --no-deps -r "
                    "requirements-slurm.txt")
    where = tmp_path_factory.mktemp("slurm") / "cluster"
    up = subprocess.run([str(ROOT / ".ci" / "slurm-up"), str(where)], capture_output=True, text=True)
    if up.returncode == 3:
        pytest.skip(up.stderr.strip())
    assert up.returncode == 0, up.stdout + up.stderr
    env = dict(os.environ)
    for line in (where / "env").read_text().splitlines():
        name, value = line.removeprefix("export ").split("=", 1)
        env[name] = value.replace("$PATH", os.environ["PATH"])
    try:
        yield env
    finally:
        subprocess.run([str(ROOT / ".ci" / "slurm-down"), str(where)], capture_output=True, text=True)


def _sacct(env, since: str) -> list[dict]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-a", "-S", since, "-o", SACCT_FIELDS], capture_output=True,
                         text=True, env=env, check=True).stdout
    keys = ["id", "name", "comment", "state", "exit", "elapsed"]
    return [dict(zip(keys, line.split("|"))) for line in out.splitlines() if line.strip()]


def _squeue(env) -> list[tuple[str, str, str]]:
    out = subprocess.run(["squeue", "-h", "-o", "%i|%k|%T"], capture_output=True, text=True, env=env).stdout
    return [tuple(line.split("|", 2)) for line in out.splitlines() if line.strip()]


def _dag_jobs(workdir: Path) -> dict[str, int]:
    """The jobs of each rule the slice of the .test workflow runs from nothing."""
    proc = subprocess.run(["snakemake", SLICE, "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
                           "--configfile", str(ROOT / ".test" / "config.yaml"), "-n", "--quiet", "rules"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines()]
    start = next(i for i, row in enumerate(rows) if row[:2] == ["job", "count"]) + 2
    end = next(i for i, row in enumerate(rows) if row and row[0] == "total")
    return {row[0]: int(row[1]) for row in rows[start:end]}


def _temporaries(results: Path) -> list[Path]:
    """Half-written outputs: the temporary files and directories the suite writes before renaming (`.NAME.*.tmp`)."""
    return [p for p in results.rglob(".*.tmp")]


def _outputs(results: Path) -> list[str]:
    return sorted(str(p.relative_to(results)) for p in results.rglob("*") if p.is_file()
                  and p.relative_to(results).parts[0] not in ("logs", "benchmarks"))


def test_the_test_profile_differs_from_the_real_one_only_where_its_comment_says():
    """Account, partitions, GPU requests, memory, software deployment and status polling; nothing else."""
    real, test = yaml.safe_load(PROFILE.read_text()), yaml.safe_load(TEST_PROFILE.read_text())
    allowed = {"slurm_account", "slurm_partition", "gres", "mem_mb"}
    assert set(real) - {"software-deployment-method"} <= set(test)
    for key in set(real) | set(test):
        if key in ("software-deployment-method", "slurm-init-seconds-before-status-checks",
                   "seconds-between-status-checks"):
            continue
        if key in ("default-resources", "set-resources"):
            continue
        assert real.get(key) == test.get(key), key
    assert set(real["set-resources"]) == set(test["set-resources"])
    pairs = [(real["default-resources"], test["default-resources"])]
    pairs += [(real["set-resources"][r], test["set-resources"][r]) for r in real["set-resources"]]
    for a, b in pairs:
        for key in set(a) | set(b):
            if key not in allowed:
                assert a.get(key) == b.get(key), key
    assert not any("gres" in r for r in test["set-resources"].values())  # the one-node cluster has no GPU
    assert all(r.get("slurm_partition", "cpu") == "cpu" for r in test["set-resources"].values())


def test_the_test_workflow_through_slurm_equals_a_local_run_after_a_scancel(cluster, tmp_path):
    config = [SLICE, "-s", str(ROOT / "Snakefile"), "--configfile", str(ROOT / ".test" / "config.yaml")]
    local, remote = tmp_path / "local", tmp_path / "slurm"
    jobs = _dag_jobs(tmp_path / "dry")
    assert jobs == {"build_model": 1, "quantize": 1, "record": 1, "sweep": 1, "aggregate": 1}, jobs
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    # The local run it is compared with runs meanwhile, beside the cluster's jobs: the slice is one chain of mostly
    # one-thread jobs, so a core is free most of the time, and the numerics do not depend on the load.
    local_log = tmp_path / "local.log"
    with local_log.open("w") as sink:
        alongside = subprocess.Popen(["snakemake", *config, "--directory", str(local), "--cores", "2"], cwd=ROOT,
                                     stdout=sink, stderr=subprocess.STDOUT)
    try:
        _through_slurm_after_a_scancel(cluster, config, remote, jobs, started)
        assert alongside.wait(timeout=900) == 0, local_log.read_text()[-3000:]
    finally:
        if alongside.poll() is None:
            alongside.kill()
    assert _outputs(local / "results") == _outputs(remote / "results")
    diff = subprocess.run([sys.executable, "-m", "specter", "diff", str(local / "results"), str(remote / "results")],
                          capture_output=True, text=True)
    assert diff.returncode == 0, diff.stdout[-3000:] + diff.stderr[-2000:]
    assert (local / SLICE).read_bytes() == (remote / SLICE).read_bytes()


def _through_slurm_after_a_scancel(cluster, config: list[str], remote: Path, jobs: dict[str, int], started: str):
    """The slice through the cluster, its quantize job cancelled mid-run, then the workflow again: every job in
    sacct, the cancelled one rerun, no half-written output and no GPTQ worker left."""

    via_slurm = ["snakemake", *config, "--directory", str(remote), "--workflow-profile", str(TEST_PROFILE.parent)]
    first = subprocess.Popen(via_slurm, cwd=ROOT, env=cluster, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    victim = None
    deadline = time.monotonic() + 600
    while victim is None and time.monotonic() < deadline and first.poll() is None:
        for job_id, comment, state in _squeue(cluster):
            if comment.startswith("rule_quantize") and state == "RUNNING":
                log = next(iter((remote / "results" / "logs" / "quantize").rglob("*.log")), None)
                if log is not None:  # the job's command has started
                    victim = job_id
                    break
        time.sleep(0.5)
    assert victim is not None, "no quantize job was seen running: " + (first.stdout.read() if first.poll() else "")
    time.sleep(2)
    subprocess.run(["scancel", victim], env=cluster, check=True)
    out, _ = first.communicate(timeout=900)
    assert first.returncode != 0, out[-3000:]  # the cancelled job failed the run
    assert not _temporaries(remote / "results"), _temporaries(remote / "results")
    worker = f"specter.quant.gptq_worker.*{remote.resolve()}"  # the local run's own worker may be running meanwhile
    assert not subprocess.run(["pgrep", "-f", worker], capture_output=True).stdout, \
        "a GPTQ worker outlived its cancelled job"

    again = subprocess.run(via_slurm, cwd=ROOT, env=cluster, capture_output=True, text=True, timeout=1800)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert not _temporaries(remote / "results")

    rows = _sacct(cluster, started)
    print("sacct -X -n -P -a -S", started, "-o", SACCT_FIELDS)
    for row in rows:
        print("|".join(row.values()))
    by_state = {}
    for row in rows:
        by_state.setdefault(row["state"].split()[0], []).append(row)
    cancelled = [r for r in rows if r["id"] == victim]
    assert cancelled and cancelled[0]["state"].startswith("CANCELLED"), cancelled  # it had not finished
    assert set(by_state) <= {"COMPLETED", "CANCELLED"}, {s: len(r) for s, r in by_state.items()}
    completed = {r["comment"] for r in by_state["COMPLETED"]}
    assert all(c.startswith("rule_") for c in completed)
    assert len(completed) == sum(jobs.values()), (completed, jobs)  # every job of the slice ran as a SLURM job
    assert all(r["comment"] in completed for r in by_state["CANCELLED"])  # and what was cancelled reran



def test_a_job_past_its_time_limit_is_reported_failed_with_its_log(cluster, tmp_path):
    (tmp_path / "Snakefile").write_text(
        'rule slow:\n'
        '    output: "done.txt"\n'
        '    log: "logs/slow.log"\n'
        '    resources: runtime=1\n'
        '    shell: "sleep 400 > {log} 2>&1; touch {output}"\n')
    profile = yaml.safe_load(TEST_PROFILE.read_text())
    start = time.monotonic()
    proc = subprocess.run(
        ["snakemake", "--executor", "slurm", "--jobs", "1", "--default-resources",
         f"slurm_account={profile['default-resources']['slurm_account']}", "slurm_partition=cpu", "mem_mb=500",
         *[a for k in ("slurm-init-seconds-before-status-checks", "seconds-between-status-checks",
                       "slurm-status-command") for a in (f"--{k}", str(profile[k]))]],
        cwd=tmp_path, env=cluster, capture_output=True, text=True, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "TIMEOUT" in text, text[-3000:]
    assert "logs/slow.log" in text and ".snakemake/slurm_logs/rule_slow/" in text, text[-3000:]
    assert not (tmp_path / "done.txt").exists()
    assert time.monotonic() - start < 400  # SLURM ended it, not the command
