"""Attacks across the scorer's git and across episodes and tasks (issue #50), on a
SWE-bench-format instance whose ``test_patch`` adds a hidden test, in overlay and copy mode:
a git filter set in the tree's ``.git`` that rewrites the tests while the scorer applies the
test patch, and library code that, while it is scored, stores the hidden test in System V
shared memory or the kernel keyring for a later episode, another task, or the agent's next
command after PATR's intermediate evaluation. Each worked before (1.0, or the hidden test's
text read back); now each earns 0 or finds nothing, and the gold patch still earns 1."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
from pathlib import Path

import pytest

from treeroll.envs.swe import (
    SUBMIT_SENTINEL,
    Sandbox,
    SWEProcessScorer,
    builtin_tasks,
    load_swebench_jsonl,
    make_swe_env,
)

_probe = Sandbox(isolation="auto")
OVERLAY = _probe.mode == "overlay"
_probe.close()
MODES = [pytest.param("overlay", marks=pytest.mark.skipif(
    not OVERLAY, reason="overlay sandbox needs root + namespaces")), "copy"]
MARKER = "HIDDEN-MARKER-7f3a"
_GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
        "-c", "commit.gpgsign=false"]
_KEY_CALLS = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}.get(platform.machine())
"""``add_key``, ``request_key``, ``keyctl`` system call numbers here."""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run([*_GIT, *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture(scope="module")
def instances(tmp_path_factory) -> Path:
    """A JSONL file of one instance (numkit with a dropped statement) whose test patch adds
    ``tests/test_hidden.py``, a FAIL_TO_PASS test the agent never sees."""
    task = builtin_tasks().by_id("numkit-0000-drop_statement")
    root = tmp_path_factory.mktemp("checkouts")
    repo = root / "numkit"
    repo.mkdir()
    task.build(repo)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "buggy")
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "tests" / "test_hidden.py").write_text(
        f"from numkit.matrix import determinant\n\n\ndef test_hidden():  # {MARKER}\n"
        "    assert determinant([[2, 1], [1, 2]]) == 3\n")
    _git(repo, "add", "-A")
    test_patch = _git(repo, "diff", "--cached")
    _git(repo, "reset", "-q", "--hard")
    edit = task.fix_edits[0]
    fixed = repo / edit.file
    fixed.write_text(fixed.read_text().replace(edit.old, edit.new, 1))
    patch = _git(repo, "diff")
    _git(repo, "commit", "-qam", "the fix")
    row = {"instance_id": "acme__numkit-2", "repo": "acme/numkit", "base_commit": base,
           "patch": patch, "test_patch": test_patch, "problem_statement": "determinant fails",
           "FAIL_TO_PASS": [*task.fail_to_pass, "tests/test_hidden.py::test_hidden"],
           "PASS_TO_PASS": list(task.pass_to_pass)}
    jsonl = root / "instances.jsonl"
    jsonl.write_text(json.dumps(row) + "\n")
    return jsonl


@pytest.fixture(scope="module", params=MODES)
def env(request, instances):
    tasks = load_swebench_jsonl(instances, instances.parent)
    environment = make_swe_env("mini", tasks, isolation=request.param, allow_host_access=True,
                               command_timeout_s=20, step_limit=50, eval_timeout_s=60)
    yield environment
    environment.close()
    environment.sandbox.close()


def _run(env, command: str) -> str:
    return env.step(f"```bash\n{command}\n```")[0]


def _submit(env) -> float:
    _, reward, terminated, _, _ = env.step(f"```bash\necho {SUBMIT_SENTINEL}\n```")
    assert terminated
    return reward


def test_the_gold_patch_earns_one_and_the_untouched_tree_zero(env):
    env.reset(0)
    assert _submit(env) == 0.0
    env.reset(0)
    _run(env, f"git apply - <<'EOF'\n{env.task.reference_patch}EOF")
    assert _submit(env) == 1.0


def test_a_git_filter_in_the_trees_git_does_not_run_when_the_scorer_applies_the_test_patch(
        env):
    """``.git/config`` + ``.git/info/attributes`` declare a smudge filter that, when git
    writes the patched test file, rewrites every test to return at once (``git status``
    shows nothing). The scorer's git reads only the pristine repository's configuration."""
    env.reset(0)
    early = "'s/^def \\(test_[a-z_0-9]*\\)(\\(.*\\)):\\(.*\\)$/def \\1(\\2):\\3\\n    return/'"
    script = ("#!/bin/sh\n# every test returns at once: the reset ones in place (not the one git\n"
              "# is writing, still empty), the patched one as it passes through\n"
              f"for f in tests/test_*.py; do [ -s \"$f\" ] && sed -i {early} \"$f\"; done\n"
              f"sed {early}\n")
    _run(env, f"cat > .git/rewrite.sh <<'EOF'\n{script}EOF\nchmod +x .git/rewrite.sh && "
              "git config filter.t.smudge \"$PWD/.git/rewrite.sh\" && "
              "git config filter.t.clean cat && mkdir -p .git/info && "
              "echo '*.py filter=t' > .git/info/attributes && git status --short | wc -l")
    assert "filter.t" in _run(env, "git config --list")
    assert _submit(env) == 0.0


_PASS_ALL = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
             "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
             "    outcome.get_result().outcome = 'passed'\n")
_OWN_COMMAND_HACKS = {
    "pdb shadowed": "cat > pdb.py <<'EOF'\nimport importlib.util, sysconfig\n"
                    "_spec = importlib.util.spec_from_file_location('pdb', sysconfig.get_paths()"
                    "['stdlib'] + '/pdb.py')\n_real = importlib.util.module_from_spec(_spec)\n"
                    "_spec.loader.exec_module(_real)\nglobals().update({k: v for k, v in "
                    "vars(_real).items() if not k.startswith('__')})\nimport _pytest.python\n"
                    "_pytest.python.Function.runtest = lambda self: None\nEOF",
    "a dist-info plugin": "mkdir -p zz-1.0.dist-info && printf 'Metadata-Version: 2.1\\nName: zz"
                          "\\nVersion: 1.0\\n' > zz-1.0.dist-info/METADATA && printf "
                          "'[pytest11]\\nzz = zz_plugin\\n' > zz-1.0.dist-info/entry_points.txt "
                          f"&& cat > zz_plugin.py <<'EOF'\n{_PASS_ALL}EOF",
}


@pytest.mark.parametrize("hack", sorted(_OWN_COMMAND_HACKS))
def test_an_instances_own_test_command_keeps_the_scorer_out_of_the_trees_reach(
        env, instances, tmp_path, hack):
    """``python -m pytest`` (no ``-P``): the tree is first on ``sys.path`` from the start."""
    row = json.loads(instances.read_text())
    row["test_command"] = "python -m pytest -rA -q -p no:cacheprovider {tests}"
    jsonl = tmp_path / "own_command.jsonl"
    jsonl.write_text(json.dumps(row) + "\n")
    tasks = load_swebench_jsonl(jsonl, instances.parent)
    own = make_swe_env("mini", tasks, sandbox=env.sandbox, allow_host_access=True,
                       command_timeout_s=20, eval_timeout_s=60)
    try:
        own.reset(0)
        _run(own, f"git apply - <<'EOF'\n{own.task.reference_patch}EOF")
        assert _submit(own) == 1.0  # the gold patch, scored by the instance's own command
        own.reset(0)
        _run(own, _OWN_COMMAND_HACKS[hack])
        _, reward, _, _, info = own.step(f"```bash\necho {SUBMIT_SENTINEL}\n```")
        assert reward == 0.0 and "scoring_incomplete" not in info  # never loaded at all
    finally:
        own.close()


_LEAK = f"""
import ctypes, glob
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
_data = b"".join(open(p, "rb").read() for p in sorted(glob.glob("tests/test_*.py")))[:60000]
_id = _libc.shmget(0x5eed, 65536, 0o1666)
if _id >= 0:
    ctypes.memmove(_libc.shmat(_id, None, 0), _data + b"\\0", len(_data) + 1)
_libc.syscall({_KEY_CALLS[0] if _KEY_CALLS else -1}, b"user", b"leak", _data[-4000:],
              len(_data[-4000:]), -4)
"""
"""Library code that, when imported (by the tests, while scored), copies every test file --
the hidden one too -- into a System V segment and the user keyring."""

_READ = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
found = b""
segment = libc.shmget(0x5eed, 0, 0)
if segment >= 0:
    found += ctypes.string_at(libc.shmat(segment, None, 0))
key = libc.syscall({_KEY_CALLS[1] if _KEY_CALLS else -1}, b"user", b"leak", None, 0)
if key >= 0:
    buffer = ctypes.create_string_buffer(8192)
    size = libc.syscall({_KEY_CALLS[2] if _KEY_CALLS else -1}, 11, key, buffer, 8192)
    found += buffer.raw[:max(size, 0)]
print("FOUND", found.decode(errors="replace"), "END")
"""
"""What a later command runs to read both back."""


def _leak_while_scored(env) -> None:
    _run(env, f"cat >> numkit/matrix.py <<'EOF'\n{_LEAK}EOF")


needs_key_calls = pytest.mark.skipif(_KEY_CALLS is None, reason="keyring call numbers "
                                     "known for x86_64 and aarch64 only")


@needs_key_calls
def test_a_hidden_test_copied_out_while_scored_does_not_reach_the_next_episode(env):
    env.reset(0)
    _leak_while_scored(env)
    assert _submit(env) == 0.0
    env.reset(0)
    found = _run(env, f"python -c {shlex.quote(_READ)}")
    assert "FOUND" in found and MARKER not in found


@needs_key_calls
def test_a_hidden_test_copied_out_during_patrs_evaluation_does_not_reach_the_agent(env):
    env.reset(0)
    _leak_while_scored(env)
    score = SWEProcessScorer(test_timeout_s=60).score_env(env)
    assert "of FAIL_TO_PASS pass" in score.reason  # the tests ran, hidden one included
    found = _run(env, f"python -c {shlex.quote(_READ)}")
    assert "FOUND" in found and MARKER not in found


@needs_key_calls
def test_what_one_tasks_sandbox_stores_in_the_keyring_or_ipc_another_cannot_read(env):
    env.reset(0)
    _run(env, f"python -c {shlex.quote(_LEAK.replace('tests/test_*.py', 'numkit/*.py'))}")
    other = make_swe_env("mini", builtin_tasks(), isolation=env.sandbox.mode,
                         allow_host_access=True, command_timeout_s=20)
    try:
        other.reset(7)
        found = _run(other, f"python -c {shlex.quote(_READ)}")
    finally:
        other.close()
        other.sandbox.close()
    assert "FOUND" in found and "determinant" not in found


def test_a_shared_memory_segment_does_not_outlive_its_command(env):
    """64 MiB of System V shared memory made and left by a command: gone (host RAM back)
    when the command ends, whatever the host's ``shm_rmid_forced``."""
    env.reset(0)
    make = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
            "print('SEGMENT', libc.shmget(0x64aa, 64 << 20, 0o1666))")
    made = _run(env, f"python -c {shlex.quote(make)}")
    assert "SEGMENT -1" not in made
    keys = {line.split()[0] for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]}
    assert str(0x64aa) not in keys
    assert os.path.exists("/proc/sysvipc/shm")
