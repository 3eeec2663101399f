"""Attacks a learning policy could find on the SWE sandbox (issue #37): each earns reward 0
and leaves the host unharmed. The escapes (reads outside the task, network, fork bombs, disk,
daemons, other tasks' trees) are in ``tests/test_swe_sandbox.py``; these are the scoring
leaks, the gold fix of an installed package, and the limits of a whole command."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from treeroll.envs.swe import SUBMIT_SENTINEL, Sandbox, builtin_tasks, make_swe_env
from treeroll.envs.swe.cgroups import cgroup_support
from treeroll.envs.swe.env import check_can_score
from treeroll.envs.swe.tasks import ScoringError, channel_statuses, run_scored

ROOT = Path(__file__).resolve().parents[1]
_probe = Sandbox(isolation="auto")
OVERLAY = _probe.mode == "overlay"
_probe.close()
needs_overlay = pytest.mark.skipif(not OVERLAY, reason="overlay sandbox needs root + namespaces")
needs_cgroups = pytest.mark.skipif(not cgroup_support().version,
                                   reason=f"no cgroups here: {cgroup_support().reason}")


@pytest.fixture(scope="module")
def env():
    environment = make_swe_env("mini", builtin_tasks(), command_timeout_s=20, step_limit=50,
                               output_limit_chars=4000, memory_mb=2048, command_memory_mb=1024,
                               command_processes=24)
    yield environment
    environment.close()
    environment.sandbox.close()


def _bash(command: str) -> str:
    return f"THOUGHT: go.\n\n```bash\n{command}\n```"


def _inject(env, code: str) -> None:
    """Append ``code`` to the task's buggy library module (imported by every test)."""
    path = env.task.buggy_files[0]
    env.step(_bash(f"printf '%s\\n' {shlex.quote(code)} >> {path}"))


def _submit(env) -> tuple[float, dict]:
    _, reward, terminated, _, info = env.step(_bash(f"echo {SUBMIT_SENTINEL}"))
    assert terminated
    return reward, info


def test_a_fake_pytest_summary_printed_at_exit_scores_zero(env):
    env.reset(0)
    lines = ["", "=========================== short test summary info ==========================="]
    lines += [f"PASSED {test}" for test in (*env.task.fail_to_pass, *env.task.pass_to_pass)]
    lines += [f"=== {len(lines)} passed in 0.01s ==="]
    _inject(env, "import atexit, sys\n"
                 f"atexit.register(lambda: sys.stdout.write({chr(10).join(lines)!r} + '\\n'))")
    reward, info = _submit(env)
    assert reward == 0.0 and not info["success"]


def test_a_junit_file_written_into_the_tree_scores_zero(env):
    env.reset(1)
    cases = "".join(f'<testcase classname="x" name="{t.split("::")[-1]}"/>'
                    for t in env.task.fail_to_pass)
    junit = f'<testsuites><testsuite tests="{len(env.task.fail_to_pass)}" failures="0">' \
            f"{cases}</testsuite></testsuites>"
    for name in ("report.xml", "junit.xml", ".pytest_results.xml"):
        env.step(_bash(f"printf '%s' {shlex.quote(junit)} > {name}"))
    reward, _ = _submit(env)
    assert reward == 0.0


def test_forged_records_written_to_every_descriptor_score_zero(env):
    """Library code that, at import, writes result-like lines (pass records and a session
    end) to every open descriptor: without the channel's token they count for nothing."""
    env.reset(2)
    tests = [*env.task.fail_to_pass, *env.task.pass_to_pass]
    records = [{"nodeid": t, "when": "call", "outcome": "passed"} for t in tests]
    records.append({"done": True, "exitstatus": 0})
    payload = "".join(json.dumps(r) + "\n" for r in records)
    _inject(env, "import os\n"
                 f"for _fd in range(3, 64):\n"
                 f"    try: os.write(_fd, {payload!r}.encode())\n"
                 f"    except OSError: pass")
    reward, _ = _submit(env)
    assert reward == 0.0


def test_channel_reads_only_tokened_lines_before_the_session_end() -> None:
    token = "t0k3n"
    lines = [
        {"nodeid": "tests/a.py::test_x", "when": "call", "outcome": "passed"},  # no token
        {"nodeid": "tests/a.py::test_x", "when": "setup", "outcome": "passed", "token": token},
        {"nodeid": "tests/a.py::test_x", "when": "call", "outcome": "failed", "token": token},
        {"nodeid": "tests/a.py::test_y", "when": "call", "outcome": "passed", "token": token},
        {"nodeid": "tests/b.py", "when": "collect", "outcome": "failed", "token": token},
        {"nodeid": "tests/b.py::test_z", "when": "call", "outcome": "passed", "token": token},
        {"done": True, "exitstatus": 1, "token": token},
        {"nodeid": "tests/a.py::test_x", "when": "call", "outcome": "passed", "token": token},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + "\nnot json\n"
    statuses, done = channel_statuses(text, token)
    assert done
    assert statuses["tests/a.py::test_x"] == "FAILED"  # the line after the end is ignored
    assert statuses["tests/a.py::test_y"] == "PASSED"
    assert statuses["tests/b.py::test_z"] == "ERROR"  # its file failed to collect
    assert channel_statuses(text.replace(token, "other"), token) == ({}, False)
    nested = "[" * 100_000  # past the JSON parser's depth, and longer than any record
    assert channel_statuses(nested + "\n" + text, token) == (statuses, True)


def test_a_test_command_that_never_reaches_pytest_is_a_scoring_error(env):
    env.reset(0)
    with pytest.raises(ScoringError, match="could not run"):
        run_scored(env.sandbox, env.workspace,
                   f"echo 'PASSED {env.task.fail_to_pass[0]}'", timeout_s=10)


def test_a_sandbox_python_without_pytest_is_refused_at_start() -> None:
    with pytest.raises(RuntimeError, match="scores with pytest, which /bin/false"):
        check_can_score("/bin/false")


@needs_overlay
def test_the_package_data_of_a_non_editable_install_is_not_visible(tmp_path):
    """treeroll installed (not editable) into a virtual environment's site-packages: the
    pristine projects inside its package are not readable from the sandbox it builds."""
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True, check=True,
                             timeout=60).stdout.strip()
    # the test environment's packages (torch, pytest, ...) after the venv's own, so that its
    # installed copy of treeroll is the one imported (the editable finder is not loaded)
    (Path(purelib) / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # what a wheel install puts there (a pure-Python package: its folder, data included)
    shutil.copytree(ROOT / "src" / "treeroll", Path(purelib) / "treeroll",
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = f"""
import treeroll, pathlib
from treeroll.envs.swe import make_swe_env, builtin_tasks
package = pathlib.Path(treeroll.__file__).resolve().parent
assert str(package).startswith({str(venv)!r}), package
assert (package / "data" / "swe_projects").is_dir()
env = make_swe_env("mini", builtin_tasks(), command_timeout_s=20)
env.reset(0)
obs = env.step("```bash\\nls -A {{0}}; ls {{0}}/data/swe_projects | head -3; "
               "find / -name swe_projects 2>/dev/null | head -3; echo END\\n```"
               .format(package))[0]
print(env.sandbox.mode)
print(obs)
"""
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    mode, _, obs = done.stdout.partition("\n")
    assert mode == "overlay"
    listing = obs.split("<output>")[-1].split("END")[0]
    assert "No such file or directory" in listing  # data/swe_projects is not there
    for name in ("__init__.py", "engine.py", "numkit", "tests"):
        assert name not in listing


@needs_cgroups
def test_the_memory_of_a_whole_command_is_limited(env):
    """Three processes of 600 MiB each (under the 2 GiB per process) exceed the command's
    1 GiB together: the group's limit stops them."""
    env.reset(0)
    hold = "python -c 'import time; b = bytearray(600 * 2**20); b[::4096] = b\"x\" * " \
           "len(b[::4096]); time.sleep(3); print(\"held\")'"
    obs = env.step(_bash(f"({hold}) & ({hold}) & ({hold}) & wait; echo done"))[0]
    assert "done" in obs and "Killed" in obs
    assert obs.splitlines().count("held") <= 1  # two of 600 MiB already exceed 1 GiB


@needs_cgroups
def test_the_processes_of_a_whole_command_are_limited(env):
    env.reset(0)
    spawn = ("import subprocess\nps = []\nfor i in range(60):\n    try:\n"
             "        ps.append(subprocess.Popen(['sleep', '3']))\n    except OSError:\n"
             "        break\nprint('running', len(ps))")
    obs = env.step(_bash(f"python -c {shlex.quote(spawn)}"))[0]
    running = int(obs.split("running")[-1].split()[0])
    assert 0 < running < 24  # 60 asked; the command's own processes count too


@needs_cgroups
def test_processes_that_leave_the_session_die_with_the_command_in_copy_mode(tmp_path):
    from treeroll.envs.swe import SandboxLimits

    sandbox = Sandbox(tmp_path, SandboxLimits(wall_timeout_s=5), isolation="copy")
    try:
        base = sandbox.base("plain", lambda dest: (dest / "x.txt").write_text("x"), git=False)
        workspace = sandbox.workspace(base)
        marker = "treeroll_copy_escape_4242"
        sandbox.run(workspace, f"setsid nohup bash -c 'exec -a {marker} sleep 600' "
                               ">/dev/null 2>&1 & echo ok")
        time.sleep(0.3)
        found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
        assert found.strip() == ""
        assert sandbox.containment["command_tree_limits"]
    finally:
        sandbox.close()


def test_copy_mode_is_refused_unless_host_access_is_allowed_by_name(tmp_path):
    sandbox = Sandbox(tmp_path, isolation="copy")
    try:
        with pytest.raises(RuntimeError, match="allow_host_access"):
            make_swe_env("mini", builtin_tasks(), sandbox=sandbox)
        with pytest.warns(UserWarning, match="copy mode"):
            from treeroll.envs.swe import env as env_module

            env_module._warn_copy_mode.cache_clear()
            allowed = make_swe_env("mini", builtin_tasks(), sandbox=sandbox,
                                   allow_host_access=True)
        allowed.close()
    finally:
        sandbox.close()
