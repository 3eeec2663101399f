"""Trees an agent shapes to hurt the host (issue #50, item 7), in overlay and copy mode:
sparse files that counted 0 bytes against the quota and then cost their full size in RAM
at a fork, folder chains deep enough to make the host's recursive walks raise
``RecursionError`` (and leave the sandbox's root behind), a flood of empty files that made
every fork and evaluation slower, and Python files made to exhaust the process scorer's
parser on the host. Each is now bounded, refused with a clear message or taken back, and
nothing raises on the host."""

from __future__ import annotations

import ast
import shlex
import time

import pytest

from treeroll.envs.swe import (
    SUBMIT_SENTINEL,
    Sandbox,
    SWEProcessScorer,
    builtin_tasks,
    make_swe_env,
)

_probe = Sandbox(isolation="auto")
OVERLAY = _probe.mode == "overlay"
_probe.close()
MODES = [pytest.param("overlay", marks=pytest.mark.skipif(
    not OVERLAY, reason="overlay sandbox needs root + namespaces")), "copy"]


@pytest.fixture(params=MODES)
def env(request):
    environment = make_swe_env("mini", builtin_tasks(), isolation=request.param,
                               allow_host_access=True, command_timeout_s=20, step_limit=50,
                               eval_timeout_s=60, disk_quota_mb=16, max_tree_entries=2000,
                               memory_mb=1024)
    environment.reset(0)
    yield environment
    environment.close()
    environment.sandbox.close()


def _step(env, command: str) -> tuple[str, dict]:
    observation, _, _, _, info = env.step(f"```bash\n{command}\n```")
    return observation, info


def _submit(env) -> float:
    _, reward, terminated, _, _ = env.step(f"```bash\necho {SUBMIT_SENTINEL}\n```")
    assert terminated
    return reward


def test_sparse_files_count_their_size_against_the_quota(env):
    """``truncate -s 30M`` three times under a 16 MB quota: 0 bytes of blocks, 90 MiB the
    moment a fork copies them. The quota counts apparent sizes: the command is stopped and
    its files deleted, so a fork copies nothing."""
    observation, info = _step(env, "truncate -s 30M a b c; echo made")
    assert info["quota_exceeded"] and "more than 16 MB" in observation
    assert env.workspace.read_bytes("a") is None
    child = env.fork()
    try:
        assert child.workspace.usage().bytes < 2**20
    finally:
        child.close()


def test_a_pristine_file_grown_past_the_quota_is_put_back(env):
    path = env.task.buggy_files[0]
    pristine = env.workspace.read_bytes(path)
    _, info = _step(env, f"truncate -s 20M {path}")  # under the 32 MB a file may take
    assert info["quota_exceeded"]
    assert env.workspace.read_bytes(path) == pristine


@pytest.mark.parametrize("depth", [1100, 5000])
def test_a_deep_folder_chain_raises_nothing_on_the_host(env, depth):
    """A chain 1,100 deep made the next command, submit, fork and close raise
    ``RecursionError`` and left the sandbox's root in ``/dev/shm``; 5,000 folders of long
    names pass ``PATH_MAX`` too. The depth limit stops the command and removes the chain."""
    name = "d" * 200
    make = (f"import os\nfor _ in range({depth}):\n    os.mkdir({name!r})\n"
            f"    os.chdir({name!r})\nopen('deep.py', 'w').write('x = 1')\nprint('made')")
    observation, info = _step(env, f"python -c {shlex.quote(make)}")
    assert info["quota_exceeded"] and "levels deep" in observation
    assert env.workspace.usage().depth <= env.sandbox.limits.max_tree_depth
    assert "hello" in _step(env, "echo hello")[0]
    child = env.fork()
    child.close()
    assert _submit(env) == 0.0
    root = env.sandbox.root
    env.close()
    env.sandbox.close()
    assert not root.exists()


def test_a_deep_chain_made_by_a_process_that_outlives_its_command_is_dropped_at_fork(env):
    """What no command's check saw (made on the host here, as a process left running in
    copy mode would): the fork checks the quota again and the branch loses its own files
    rather than the host copying them."""
    folder = env.workspace.upper
    for _ in range(200):
        folder = folder / "x"
    folder.mkdir(parents=True)
    pristine = env.workspace.read_bytes(env.task.buggy_files[0])
    child = env.fork()
    try:
        assert child.workspace.read_bytes(env.task.buggy_files[0]) == pristine
        assert env.workspace.usage().depth <= env.sandbox.limits.max_tree_depth
        assert child.workspace.usage().depth <= env.sandbox.limits.max_tree_depth
    finally:
        child.close()


def test_a_flood_of_empty_files_is_stopped_and_forks_stay_fast(env):
    """200,000 empty files made every fork take 11 s and every evaluation 20 s: the entry
    limit (2,000 here) stops the command and deletes them."""
    flood = "import os\nfor i in range(200000):\n    open(f'f{i}', 'w').close()"
    observation, info = _step(env, f"python -c {shlex.quote(flood)}")
    assert info["quota_exceeded"] and "files and folders" in observation
    assert env.workspace.usage().entries <= 2000
    start = time.perf_counter()
    env.fork().close()
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("source", [
    "'x = [' + '0, ' * 2_000_000 + ']'",
    "'x = ' + '-' * 100_000 + '1'",
    "'x = ' + '(' * 5000 + ')' * 5000",
], ids=["a 4 MB list literal", "100,000 unary minuses", "5,000 nested parentheses"])
def test_files_made_to_exhaust_a_parser_cost_the_host_nothing(env, source, monkeypatch):
    """PATR's process scorer parsed every changed ``.py`` file on the host (a 4 MB list
    literal took the trainer from 42 MiB to 1.9 GiB; deep nesting raised ``MemoryError``).
    It parses them inside the sandbox now, under the command's limits."""
    path = env.task.buggy_files[0]
    _step(env, f"python -c {shlex.quote(f'open({path!r}, {chr(34)}a{chr(34)}).write({source})')}")
    assert len(env.workspace.read_bytes(path) or b"") > 10_000

    def host_parse(*args, **kwargs):
        raise AssertionError("parsed on the host")

    monkeypatch.setattr(ast, "parse", host_parse)
    score = SWEProcessScorer(run_tests=False).score_env(env)
    assert 0.0 <= score.value <= 1.0


def test_host_walks_copies_and_removal_handle_any_depth_and_path_length(tmp_path):
    """The host's own tree functions on a chain 3,000 folders deep with 200-character names
    (600 kB paths, far past ``PATH_MAX``), a sparse file and an unreadable folder: no
    recursion, no exception, bounded counts, everything removed."""
    import subprocess

    from treeroll.envs.swe.filetree import copy_tree, list_files, remove_tree, tree_usage

    root = tmp_path / "tree"
    try:
        _deep_tree_checks(root, tmp_path, copy_tree, list_files, remove_tree, tree_usage)
    finally:  # whatever failed above, no 600 kB path is left for pytest's own cleanup
        for left in (root, tmp_path / "copy"):
            if left.exists():
                subprocess.run(["chmod", "-R", "u+rwx", str(left)], capture_output=True)
                subprocess.run(["rm", "-rf", str(left)], capture_output=True)


def _deep_tree_checks(root, tmp_path, copy_tree, list_files, remove_tree, tree_usage):
    """The body of the test above (kept apart so that its clean-up always runs)."""
    import os

    root.mkdir()
    (root / "sparse").touch()
    os.truncate(root / "sparse", 30 * 2**20)
    (root / "locked").mkdir()
    (root / "locked" / "f").write_text("x")
    os.chmod(root / "locked", 0)
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    current = top
    for _ in range(3000):
        os.mkdir("d" * 200, dir_fd=current)
        child = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=current)
        if current != top:
            os.close(current)
        current = child
    os.close(current)
    os.close(top)
    usage = tree_usage(root, max_depth=64)
    assert usage.depth == 65 and usage.bytes >= 30 * 2**20  # stopped one level past 64
    assert tree_usage(root, max_bytes=2**20).bytes >= 30 * 2**20
    assert max(rel.count("/") for rel in list_files(root, max_depth=10)) == 9
    copy_tree(root, tmp_path / "copy", max_depth=20)
    assert tree_usage(tmp_path / "copy", max_depth=100).depth == 20
    deep = root / "/".join(["d" * 200] * 40)  # a 8 kB path
    remove_tree(deep)
    remove_tree(root)
    remove_tree(tmp_path / "copy")
    assert not root.exists() and not (tmp_path / "copy").exists()
