"""The sandbox contains escape attempts, reports them to the agent, and leaves the host alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import treeroll
from treeroll.envs.swe import Sandbox, SandboxLimits, builtin_tasks, make_swe_env

_probe = Sandbox(isolation="auto")
OVERLAY = _probe.mode == "overlay"
_probe.close()
needs_overlay = pytest.mark.skipif(not OVERLAY, reason="overlay sandbox needs root + namespaces")


@pytest.fixture(scope="module")
def env():
    environment = make_swe_env("mini", builtin_tasks(), command_timeout_s=2, max_processes=64,
                               disk_quota_mb=20, file_size_mb=8, memory_mb=1024,
                               output_limit_chars=2000, step_limit=100)
    environment.reset(0)
    yield environment
    environment.close()
    environment.sandbox.close()


def run(env, command: str) -> str:
    obs, _reward, terminated, _truncated, info = env.step(f"```bash\n{command}\n```")
    assert not info["format_error"] and not terminated
    return obs


def test_mode_and_containment_are_reported(env):
    containment = env.sandbox.containment
    assert containment["rlimits"] and containment["wall_timeout"]
    assert containment["reads_outside_task_blocked"] is OVERLAY
    if OVERLAY:
        assert all(containment[k] for k in ("no_network", "host_filesystem_read_only",
                                            "host_filesystem_hidden", "unprivileged_user",
                                            "private_pid_namespace"))


@needs_overlay
def test_a_file_outside_the_task_cannot_be_read(env, tmp_path):
    checkout = tmp_path / "user_checkout"  # a user's checkout of the repository, fix applied
    checkout.mkdir()
    (checkout / "fixed.py").write_text("GOLD_FIX_MARKER = 1\n")
    for path in (tmp_path, checkout):
        os.chmod(path, 0o755)
    os.chmod(checkout / "fixed.py", 0o644)
    obs = run(env, f"cat {checkout}/fixed.py; ls {tmp_path}; diff -r {checkout} . ; "
                   f"grep -rs GOLD_FIX_MARKER /home {tmp_path.parent} "
                   "| head -3")
    assert "timed out" not in obs
    assert "GOLD_FIX_MARKER" not in obs
    assert f"cat: {checkout}/fixed.py: No such file or directory" in obs
    assert f"ls: cannot access '{tmp_path}': No such file or directory" in obs


@needs_overlay
def test_treeroll_sources_and_the_host_home_are_not_visible(env):
    source = Path(treeroll.__file__).resolve()
    obs = run(env, f"cat {source} | head -2; ls {source.parent}; "
                   "python -c 'import treeroll' 2>&1 | tail -1")
    assert '"""' not in obs and "engine.py" not in obs
    assert "No module named 'treeroll'" in obs
    home = Path.home().resolve()
    listing = run(env, f"ls -A {home}").split("<output>")[-1].split("</output>")[0].split()
    needed = {Path(os.path.relpath(p, home)).parts[0] for p in (sys.prefix, sys.base_prefix)
              if Path(p).resolve().is_relative_to(home)}
    assert set(listing) <= needed  # only the way to the interpreter, nothing else of home
    assert set(os.listdir(home)) - needed  # (the host's home does hold more)


@needs_overlay
def test_the_host_processes_are_not_visible(env):
    marker = "treeroll_host_process_marker_777"
    host = subprocess.Popen(["bash", "-c", f"exec -a {marker} sleep 30"])
    try:
        obs = run(env, f"cat /proc/*/cmdline | tr '\\0' ' '; echo; ls /proc | grep -c '^[0-9]'; "
                       f"cat /proc/{host.pid}/cmdline; ls /sys/fs 2>&1 | head -1")
    finally:
        host.kill()
        host.wait()
    assert marker not in obs
    counts = [int(line) for line in obs.splitlines() if line.strip().isdigit()]
    assert counts and counts[0] < 10  # only the command's own processes


@needs_overlay
def test_other_tasks_trees_cannot_be_found(env):
    other = Sandbox(isolation="overlay")  # another task's sandbox on the same host
    try:
        base = other.base("secret", lambda d: (d / "other_task.txt").write_text("OTHER_TREE\n"))
        mine = env.sandbox
        obs = run(env, f"cat {base}/other_task.txt; ls {other.root} {mine.root}/bases "
                       f"{mine.root}/ws; find /dev /tmp /home {other.root.parent} "
                       "-name '*.txt' 2>/dev/null | xargs -r cat")
    finally:
        other.close()
    assert "timed out" not in obs
    assert "OTHER_TREE" not in obs and "No such file or directory" in obs
    assert not any(line.endswith("other_task.txt") for line in obs.splitlines())
    listing = run(env, f"ls {env.sandbox.root}; pwd")
    assert "No such file or directory" in listing and "/testbed" in listing


@needs_overlay
def test_a_sandbox_rooted_under_tmp_still_runs_closed(tmp_path):
    box = Sandbox(tmp_path, isolation="overlay")  # /tmp holds its trees: still overlay mode
    try:
        base = box.base("t", lambda d: (d / "a.txt").write_text("hi\n"), git=False)
        out = box.run(box.workspace(base), f"cat a.txt; pwd; ls {tmp_path} 2>&1; "
                                           "python -c 'import multiprocessing as m; m.Lock(); "
                                           "print(\"shm ok\")'").output
        assert out.startswith("hi\n/testbed\n") and "No such file" in out and "shm ok" in out
    finally:
        box.close()


def test_a_tool_path_that_would_show_the_sandboxs_trees_is_refused(tmp_path):
    with pytest.raises(ValueError, match="holds the sandbox's own trees"):
        Sandbox(tmp_path, tools=["/"])
    with pytest.raises(ValueError, match="does not exist"):
        Sandbox(tmp_path, tools=[str(tmp_path / "missing")])


@needs_overlay
def test_write_outside_via_dotdot_and_absolute_paths(env, tmp_path):
    target = env.sandbox.root / "escaped.txt"
    obs = run(env, "echo x > ../escaped.txt; echo x > ../../escaped.txt; "
                   f"echo x > {target}; echo x > {tmp_path}/escaped.txt; "
                   f"touch {Path(treeroll.__file__).parent}/escaped.py; echo x > /tmp/escaped.txt")
    assert "Read-only file system" in obs or "Permission denied" in obs
    assert not target.exists() and not (tmp_path / "escaped.txt").exists()
    assert not (Path(treeroll.__file__).parent / "escaped.py").exists()
    assert not (env.sandbox.root.parent / "escaped.txt").exists()


@needs_overlay
def test_write_through_symlinks(env, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("safe\n")
    os.chmod(tmp_path, 0o777)
    obs = run(env, f"ln -s {victim} link && echo pwned > link; ln -s {tmp_path} dirlink && "
                   "echo pwned > dirlink/new.txt; ln -s / root && echo pwned > root/tmp/x.txt; "
                   "cat link")
    assert victim.read_text() == "safe\n" and not (tmp_path / "new.txt").exists()
    assert not Path("/tmp/x.txt").exists() or Path("/tmp/x.txt").read_text() != "pwned\n"
    assert "link: No such file or directory" in obs  # the host path does not exist inside


@needs_overlay
def test_the_shared_pristine_tree_is_not_writable(env):
    base = env.workspace.base
    buggy = env.task.buggy_files[0]
    before = (base / buggy).read_bytes()
    obs = run(env, f"echo '# evil' >> {base}/{buggy}; rm -rf {base}/tests")
    assert (base / buggy).read_bytes() == before and (base / "tests").is_dir()
    assert f"{buggy}: No such file or directory" in obs  # not even visible from inside


@needs_overlay
def test_no_network(env):
    obs = run(env, "python -c \"import socket; s = socket.socket(); s.settimeout(1); "
                   "s.connect(('1.1.1.1', 80))\"; python -c \"import socket; "
                   "socket.create_connection(('127.0.0.1', 22), timeout=1)\"")
    assert "Network is unreachable" in obs or "Connection refused" in obs
    assert "Traceback" in obs


def test_sleeping_forever_is_killed(env):
    start = time.perf_counter()
    obs = run(env, "sleep 1000")
    assert time.perf_counter() - start < 10
    assert "timed out" in obs


@needs_overlay
def test_daemonised_processes_die_with_the_command(env):
    marker = "treeroll_escape_marker_4242"
    run(env, f"setsid nohup bash -c 'exec -a {marker} sleep 600' > /dev/null 2>&1 & echo ok")
    time.sleep(0.2)
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert found.strip() == ""


@needs_overlay
def test_fork_bomb_is_contained(env):
    start = time.perf_counter()
    marker = "treeroll_bomb_marker_4242"  # forked subshells keep this command line
    obs = run(env, f"exec -a {marker} bash -c 'bomb() {{ bomb | bomb & }}; bomb'")
    assert time.perf_counter() - start < 15
    assert "<returncode>" in obs
    time.sleep(0.2)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert left.strip() == ""
    assert "ok" in run(env, "echo ok")  # the sandbox still works afterwards


def test_filling_the_disk_is_contained(env):
    obs = run(env, "for i in $(seq 1 40); do head -c 4M /dev/zero > fill_$i.bin || break; done; "
                   "head -c 100M /dev/zero > one_big.bin")
    assert "disk quota" in obs or "signal" in obs or "File size limit" in obs
    assert env.workspace.own_bytes() <= 20 * 2**20 + 10 * 2**20
    assert "fill_40.bin" not in run(env, "ls")


def test_host_environment_is_not_visible(env, monkeypatch):
    monkeypatch.setenv("TREEROLL_HOST_SECRET", "hunter2")
    obs = run(env, "env; cat /proc/1/environ; cat /proc/$PPID/environ; "
                   f"cat /proc/{os.getpid()}/environ")
    assert "hunter2" not in obs and "TREEROLL_HOST_SECRET" not in obs


def test_resource_limits_are_reported(env):
    obs = run(env, "python -c \"x = bytearray(3 * 1024**3)\"")
    assert "MemoryError" in obs


def test_copy_mode_still_runs_and_times_out():
    sandbox = Sandbox(isolation="copy", limits=SandboxLimits(wall_timeout_s=1))
    try:
        base = sandbox.base("t", lambda d: (d / "a.txt").write_text("hi\n"), git=False)
        workspace = sandbox.workspace(base)
        assert sandbox.run(workspace, "cat a.txt").output == "hi\n"
        child = workspace.fork()
        sandbox.run(child, "echo changed > a.txt")
        assert workspace.read_bytes("a.txt") == b"hi\n"
        assert child.read_bytes("a.txt") == b"changed\n"
        assert child.changed_files() == ["a.txt"]
        assert sandbox.run(workspace, "sleep 30").timed_out
    finally:
        sandbox.close()
    assert not sandbox.root.exists()


@needs_overlay
def test_a_tool_under_tmp_is_visible_read_only_inside(tmp_path):
    tool = tmp_path / "toolchain"  # e.g. a virtual environment made under /tmp (CI's clone)
    tool.mkdir()
    (tool / "run.sh").write_text("echo tool ran\n")
    for path in (tmp_path, tool):
        os.chmod(path, 0o755)
    box = Sandbox(tmp_path / "trees", isolation="overlay", tools=[str(tool)])
    try:
        base = box.base("t", lambda d: (d / "a.txt").write_text("hi\n"), git=False)
        out = box.run(box.workspace(base), f"bash {tool}/run.sh; touch {tool}/x; "
                                           "echo y > /tmp/y && cat /tmp/y").output
        assert "tool ran" in out and "Read-only file system" in out and out.endswith("y\n")
    finally:
        box.close()


@pytest.mark.parametrize("with_filter", [True, False])
def test_no_command_can_gain_privileges_with_or_without_the_syscall_filter(env, with_filter):
    """``no_new_privs`` is set in every command (a set-user-ID program gains nothing), also
    where libseccomp is missing and no system-call filter loads (it was set only with it)."""
    syscalls = env.sandbox._syscalls
    if with_filter and syscalls is None:
        pytest.skip("no system-call filter on this machine")
    env.sandbox._syscalls = syscalls if with_filter else None
    try:
        assert "NoNewPrivs:\t1" in run(env, "grep NoNewPrivs /proc/self/status")
    finally:
        env.sandbox._syscalls = syscalls
