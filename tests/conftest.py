"""Shared fixtures: tiny random models of every supported class, saved once per session."""

from __future__ import annotations

from specter.determinism import pin_environment

pin_environment()  # as the CLI does, before torch computes anything

import atexit  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

# The converted GGUF of the default model's builder (specter/models/dense.py) is cached: one cache for this session and
# the processes its tests start, not the user's, so the first test that loads it converts it (about 25 s) and the rest
# read the cache (about 1 s); test_conversion_is_deterministic holds a build from the cache to one without it.
os.environ["SPECTER_CACHE_DIR"] = _CACHE = tempfile.mkdtemp(prefix="specter-test-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

from specter.bytecode import cache_bytecode  # noqa: E402

cache_bytecode()  # where bytecode may not be written beside the sources, this session's processes share one cache

import pytest  # noqa: E402
import torch  # noqa: E402

from specter.models.tiny import TINY_CONFIGS, save_tiny_model  # noqa: E402
from specter.runspec import RunSpec  # noqa: E402

ARCHS = sorted(TINY_CONFIGS)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _threads():
    from specter import determinism

    determinism.use(2)


def spec(**settings) -> RunSpec:
    """A RunSpec from flat settings, as a record's config holds them (the budget as its flag's name)."""
    return RunSpec.from_dict(settings)


@pytest.fixture(scope="session")
def free_host(tmp_path_factory) -> str:
    """The path of the A100 preset with a host that dispatches and decides for free (`host.dispatch_us` and
    `host.policy_us` 0): a tiny model's decode is otherwise bound by its host, whatever its copies, so a test of a
    mechanism that acts through the copies runs on it."""
    import yaml

    from specter.timing import load_profile

    profile = load_profile("a100-40gb-pcie4").to_yaml_dict()
    profile["host"].update(dispatch_us=0, policy_us=0)
    profile["name"] = "a100-40gb-pcie4-free-host"
    path = tmp_path_factory.mktemp("profiles") / "free-host.yaml"
    path.write_text(yaml.safe_dump(profile))
    return str(path)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, str]:
    """{model_type: directory of a saved tiny checkpoint}."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: str(save_tiny_model(arch, root / arch, seed=0)) for arch in ARCHS}


#: the classes the runtime's equality tests decode (attention variants: grouped, MLA, sliding window)
EQUALITY_ARCHS = ("mixtral", "qwen2_moe", "deepseek_v3", "gpt_oss")


@pytest.fixture(scope="session")
def rtn_drafts(tiny_dirs, tmp_path_factory) -> dict[str, str]:
    """{model_type: directory of a round-to-nearest INT4 draft of its tiny checkpoint}, for the equality classes and
    OLMoE."""
    from specter.quant.quantize import quantize_draft

    root = tmp_path_factory.mktemp("rtn")
    out = {}
    for arch in EQUALITY_ARCHS + ("olmoe",):
        quantize_draft(tiny_dirs[arch], root / arch, method="rtn", bits=4, group_size=32)
        out[arch] = str(root / arch)
    return out
