"""Attacks on the SWE scorer's own reach (issue #50), driven as a policy drives the
environment (``reset`` / ``step`` with bash replies), in overlay and copy mode: the scoring
plugin replaced from the tree, a pytest plugin declared by a ``.dist-info`` folder, the
standard library shadowed, a forged bytecode cache, a scoring run the tree's code ends early,
the repository's git run by the scorer, and hidden tests carried into a later episode. Each
earned 1.0 (or raised out of ``step``) before; each earns 0 now, and the gold fix still 1."""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
from pathlib import Path

import pytest

from treeroll.envs.swe import SUBMIT_SENTINEL, Sandbox, builtin_tasks, make_swe_env, scoring
from treeroll.envs.swe.tasks import ScoringError, TaskSet, run_scored

_probe = Sandbox(isolation="auto")
OVERLAY = _probe.mode == "overlay"
_probe.close()
MODES = [pytest.param("overlay", marks=pytest.mark.skipif(
    not OVERLAY, reason="overlay sandbox needs root + namespaces")), "copy"]


@pytest.fixture(scope="module", params=MODES)
def env(request):
    environment = make_swe_env("mini", builtin_tasks(), isolation=request.param,
                               allow_host_access=True, command_timeout_s=20, step_limit=50,
                               eval_timeout_s=60, output_limit_chars=4000)
    yield environment
    environment.close()
    environment.sandbox.close()


def _bash(command: str) -> str:
    return f"THOUGHT: go.\n\n```bash\n{command}\n```"


def _run(env, command: str) -> str:
    return env.step(_bash(command))[0]


def _write(env, path: str, text: str) -> None:
    _run(env, f"mkdir -p $(dirname {shlex.quote(path)}) && cat > {shlex.quote(path)} <<'EOF'\n"
              f"{text}\nEOF")


def _submit(env) -> tuple[float, dict]:
    _, reward, terminated, _, info = env.step(_bash(f"echo {SUBMIT_SENTINEL}"))
    assert terminated
    return reward, info


def _gold(env) -> None:
    edit = env.task.fix_edits[0]
    script = (f"import pathlib; p = pathlib.Path({edit.file!r}); "
              f"p.write_text(p.read_text().replace({edit.old!r}, {edit.new!r}, 1))")
    _run(env, f"python -c {shlex.quote(script)}")


_PASS_ALL = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
             "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
             "    outcome.get_result().outcome = 'passed'\n")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_gold_fix_still_earns_one_and_the_untouched_tree_zero(env, seed):
    env.reset(seed)
    assert _submit(env)[0] == 0.0
    env.reset(seed)
    _gold(env)
    reward, info = _submit(env)
    assert reward == 1.0 and "scoring_incomplete" not in info


def test_no_agent_command_can_list_the_scoring_files(env):
    """The scoring run's folder exists only while that run lasts (copy mode, which sees the
    host, looks in its own sandbox's root; overlay mode anywhere)."""
    env.reset(0)
    _submit(env)  # a scoring run came and went
    env.reset(0)
    where = "/" if env.sandbox.mode == "overlay" else str(env.sandbox.root)
    listing = _run(env, f"ls -a /.scoring 2>&1; find {where} -name '_scoring_*' -o -name "
                        "'tree_modules.json' -o -name 'scoring-*' 2>/dev/null | head -3; "
                        "echo END")
    assert "_scoring_" not in listing and "sitecustomize" not in listing
    assert "tree_modules" not in listing


def test_a_look_alike_of_the_scoring_plugin_in_the_tree_is_not_loaded(env, monkeypatch):
    """Even with the plugin's name known (fixed here), a module of that name in the tree,
    which reports every test passed, is never imported in its place."""
    monkeypatch.setattr(scoring, "_plugin_name", lambda: "_scoring_known")
    env.reset(0)
    source = (Path(scoring.__file__).parent / "scoring_channel.py").read_text()
    forged = source.replace('"outcome": report.outcome}', '"outcome": "passed"}')
    assert forged != source
    for folder in (".", env.task.buggy_files[0].split("/")[0]):
        _write(env, f"{folder}/_scoring_known.py", forged)
    reward, info = _submit(env)
    assert reward == 0.0 and info["tests_passed"] < info["tests_total"]


def test_a_pytest_plugin_declared_by_a_dist_info_folder_in_the_tree_is_not_loaded(env):
    env.reset(0)
    _write(env, "zz_helpers-1.0.dist-info/METADATA",
           "Metadata-Version: 2.1\nName: zz_helpers\nVersion: 1.0")
    _write(env, "zz_helpers-1.0.dist-info/entry_points.txt", "[pytest11]\nzz = zz_helpers")
    _write(env, "zz_helpers.py", _PASS_ALL)
    reward, info = _submit(env)
    assert reward == 0.0 and "scoring_incomplete" not in info  # not even loaded: no tripwire


@pytest.mark.parametrize("module", ["pdb", "queue"])
def test_a_standard_library_module_shadowed_in_the_tree_is_not_imported(env, module):
    """``pdb`` and ``queue`` are imported late, once pytest put the tree on ``sys.path``: a
    copy in the tree that disables every test body is never the one imported."""
    env.reset(0)
    _write(env, f"{module}.py", "import _pytest.python\n"
                                "_pytest.python.Function.runtest = lambda self: None\n"
                                "class Pdb: pass\nclass Queue: pass\nclass Empty(Exception): pass")
    reward, info = _submit(env)
    assert reward == 0.0 and "scoring_incomplete" not in info  # not even loaded: no tripwire


def test_a_forged_bytecode_cache_of_a_library_module_is_not_loaded(env):
    """A ``__pycache__`` entry that matches the pristine source's size and mtime (so Python
    would trust it) but holds the fixed code: the scorer compiles from the source."""
    env.reset(0)
    edit = env.task.fix_edits[0]
    fixed = f"/tmp/fixed_{Path(edit.file).name}"
    script = (f"import importlib.util, os, pathlib, py_compile, shutil\n"
              f"src = pathlib.Path({edit.file!r}); st = src.stat()\n"
              f"shutil.copy(src, {fixed!r})\n"
              f"p = pathlib.Path({fixed!r}); p.write_text(p.read_text().replace("
              f"{edit.old!r}, {edit.new!r}, 1))\n"
              f"os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\n"
              f"cache = importlib.util.cache_from_source(str(src))\n"
              f"os.makedirs(os.path.dirname(cache), exist_ok=True)\n"
              f"py_compile.compile({fixed!r}, cfile=cache, dfile=str(src), "
              f"invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
              f"print('forged', cache)")
    assert "forged" in _run(env, f"python -c {shlex.quote(script)}")
    assert _submit(env)[0] == 0.0


def test_library_code_that_ends_the_test_process_early_earns_zero_not_an_error(env):
    """``os._exit(0)`` at import of the package under test: the session never ends. That is
    the agent's doing: a reward of 0 in its group (said in ``info``), never an exception out
    of ``step`` that would drop the node."""
    env.reset(0)
    _run(env, f"printf 'import os\\nos._exit(0)\\n' >> {env.task.buggy_files[0]}")
    reward, info = _submit(env)
    assert reward == 0.0 and "did not finish" in info["scoring_incomplete"]


def test_library_code_that_hangs_the_tests_earns_zero_not_an_error(env):
    env.reset(1)
    _run(env, f"printf 'import time\\ntime.sleep(3600)\\n' >> {env.task.buggy_files[0]}")
    config = env.config
    env.config = dataclasses.replace(config, eval_timeout_s=5.0)
    try:
        reward, info = _submit(env)
    finally:
        env.config = config
    assert reward == 0.0 and "timed out" in info["scoring_incomplete"]


def test_a_test_command_the_shell_cannot_run_is_treerolls_error_and_a_tree_stopping_pytest_a_zero(
        env):
    env.reset(0)
    with pytest.raises(ScoringError, match="could not run"):
        run_scored(env.sandbox, env.workspace, "no-such-test-runner -q", timeout_s=10)
    details: dict = {}
    assert run_scored(env.sandbox, env.workspace, "python -c 'import sys; sys.exit(3)'",
                      timeout_s=10, details=details) == {}
    assert "before the scoring plugin loaded" in details["incomplete"]


def test_a_tree_that_keeps_pytest_from_starting_earns_zero_not_a_dropped_node(env):
    """``chmod 000`` on the tree makes pytest fail while it looks for its configuration,
    before any plugin loads: that is the tree's doing, a 0 in the group, not an error that
    would leave the node out of it."""
    env.reset(0)
    _run(env, "chmod 000 .")
    reward, info = _submit(env)  # raised ScoringError out of step before
    assert reward == 0.0 and info["submitted"]
    if env.sandbox.mode == "overlay":  # as nobody (in copy mode root reads it anyway)
        assert "before any test was reported" in info["scoring_incomplete"]


def test_a_pytest_session_the_tested_code_starts_in_process_writes_nothing(env):
    """Library code that runs ``pytest.main`` on tests of its own (as a project's own test
    helpers may) neither forges records nor ends the channel: the gold fix still earns 1."""
    env.reset(0)
    _gold(env)
    nested = ("import os as _os, tempfile as _tf, pytest as _pt\n"
              "_d = _tf.mkdtemp()\n"
              "open(_os.path.join(_d, 'test_inner.py'), 'w').write('def test_ok(): pass\\n')\n"
              "_pt.main([_d, '-q', '-p', 'no:cacheprovider'])\n")
    _run(env, f"cat >> {env.task.buggy_files[0]} <<'EOF'\n{nested}EOF")
    reward, info = _submit(env)
    assert reward == 1.0 and "scoring_incomplete" not in info


_IN_PROCESS = {
    "runtest replaced": "import _pytest.python\n"
                        "_pytest.python.Function.runtest = lambda self: None\n",
    "runtest's code replaced": "import _pytest.python\n"
                               "_pytest.python.Function.runtest.__code__ = "
                               "(lambda self: None).__code__\n",
    "every report made passed": (
        "import _pytest.reports\n"
        "_make = _pytest.reports.TestReport.from_item_and_call.__func__\n"
        "def _passed(cls, item, call):\n"
        "    report = _make(cls, item, call)\n"
        "    report.outcome, report.longrepr = 'passed', None\n"
        "    return report\n"
        "_pytest.reports.TestReport.from_item_and_call = classmethod(_passed)\n"),
    "a hook registered from library code": (
        "import gc, pytest, _pytest.config\n"
        "class _Pass:\n"
        "    @pytest.hookimpl(hookwrapper=True)\n"
        "    def pytest_runtest_makereport(self, item, call):\n"
        "        outcome = yield\n"
        "        outcome.get_result().outcome = 'passed'\n"
        "for _o in gc.get_objects():\n"
        "    if isinstance(_o, _pytest.config.Config):\n"
        "        _o.pluginmanager.register(_Pass())\n"),
}


@pytest.mark.parametrize("hack", sorted(_IN_PROCESS))
def test_library_code_that_patches_pytest_in_its_process_earns_zero(env, hack):
    """Item 8, the gray area: code under test runs in pytest's process. The plugin's
    tripwire catches these known forms (each earned 1.0 before); code that also rewrites
    the plugin is not contained (the docs say so)."""
    env.reset(0)
    _run(env, f"cat >> {env.task.buggy_files[0]} <<'EOF'\n{_IN_PROCESS[hack]}EOF")
    reward, info = _submit(env)
    assert reward == 0.0 and "changed pytest" in info["scoring_incomplete"]


def test_the_task_cannot_be_named_by_hashing_guessed_ids(env):
    """A generated task's id names its mutation (``numkit-0000-drop_statement``). Its hash
    was the id the observation showed, and the pristine tree's folder, which the overlay's
    options show in ``/proc/self/mountinfo``: neither is a hash of the id alone now."""
    env.reset(0)
    task_id = env.task.task_id
    guesses = [hashlib.sha256(task_id.encode()).hexdigest()[:12],
               hashlib.sha1(f"task:{task_id}".encode()).hexdigest()[:16]]
    seen = env.transcript[0] + _run(env, "cat /proc/self/mountinfo")
    assert env.task.public_id in seen
    assert not any(guess in seen for guess in guesses)


def test_a_pristine_module_name_comes_from_the_tree_only_where_the_pristine_tree_has_it(
        tmp_path):
    """The launcher on its own: a pristine ``pkg/pdb.py`` is found in ``pkg`` as before; a
    ``pdb.py`` the agent adds at the top of the tree never stands in for the standard
    library's, although the name is one the pristine tree holds."""
    import json
    import os
    import subprocess
    import sys

    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "pdb.py").write_text("WHERE = 'pkg'\n")
    folder = tmp_path / "scoring"
    folder.mkdir()
    here = Path(scoring.__file__).parent
    (folder / "sitecustomize.py").write_text((here / "scoring_site.py").read_text())
    (folder / "tree_modules.json").write_text(json.dumps(scoring.tree_modules(tree)))
    (tree / "pdb.py").write_text("WHERE = 'rogue'\n")  # added by the agent
    probe = ("import sys; sys.path[:0] = {}; import pdb; "
             "print(getattr(pdb, 'WHERE', 'stdlib'))")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(folder),
           "TREEROLL_SCORING_TREE": str(tree)}
    found = [subprocess.run([sys.executable, "-c", probe.format(paths)], env=env, cwd=tree,
                            capture_output=True, text=True, check=True).stdout.strip()
             for paths in ([str(tree)], [str(tree / "pkg"), str(tree)])]
    assert found == ["stdlib", "pkg"]


_BEFORE_THE_PLUGIN = {
    "the token read and every test forged": (
        "import json as _json, os as _os\n"
        "_spec = _os.environ.get('TREEROLL_SCORING_FDS')\n"
        "if _spec:\n"
        "    _out, _fd = (int(_x) for _x in _spec.split(','))\n"
        "    _token = _os.read(_fd, 256).decode().strip()\n"
        "    def _line(**_record):\n"
        "        _os.write(_out, (_json.dumps({**_record, 'token': _token}) + '\\n').encode())\n"
        "    _line(started=True)\n"
        "    for _id in IDS:\n"
        "        for _when in ('setup', 'call', 'teardown'):\n"
        "            _line(nodeid=_id, when=_when, outcome='passed')\n"
        "    _line(done=True, exitstatus=0)\n"),
    "pytest patched before the tripwire's baseline": (
        "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n"),
}


@pytest.mark.parametrize("hack", sorted(_BEFORE_THE_PLUGIN))
@pytest.mark.parametrize("mode", MODES)
def test_a_module_the_test_command_loads_with_dash_p_runs_after_the_token_is_taken(mode, hack):
    """A task whose test command (or pristine ``addopts``) names one of the tree's modules
    with ``-p`` has pytest import it before ``PYTEST_PLUGINS``: the agent's edit of that
    module ran before the scoring plugin took its token and noted the tripwire's baseline
    (a forged 1.0). The launcher has the plugin do both at start-up now: 0, gold still 1."""
    task = builtin_tasks()[0]
    module = task.buggy_files[0].removesuffix(".py").replace("/", ".")
    command = task.test_command.replace("-p no:cacheprovider",
                                        f"-p no:cacheprovider -p {module}")
    assert command != task.test_command
    environment = make_swe_env("mini", TaskSet([dataclasses.replace(task, test_command=command)]),
                               isolation=mode, allow_host_access=True, command_timeout_s=20,
                               step_limit=50, eval_timeout_s=60, output_limit_chars=4000)
    try:
        environment.reset(0)
        _gold(environment)
        assert _submit(environment)[0] == 1.0  # the module, loaded as a plugin, is harmless
        environment.reset(0)
        ids = [*task.fail_to_pass, *task.pass_to_pass]
        attack = f"IDS = {ids!r}\n" + _BEFORE_THE_PLUGIN[hack]
        _run(environment, f"cat >> {task.buggy_files[0]} <<'EOF'\n{attack}EOF")
        reward, info = _submit(environment)
        assert reward == 0.0 and info["tests_passed"] < info["tests_total"]
    finally:
        environment.close()
        environment.sandbox.close()
