"""SWE-bench-format instances: validated at load, scored as SWE-bench scores them.

The instance here is built from a shipped project (``numkit`` with one shipped mutation as
its bug) in a real git checkout, with an empty ``test_patch``: its existing tests already
catch the bug, the case where restoring only the files a test patch names lets an agent pass
by editing the tests.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from treeroll.envs.swe import (
    SUBMIT_SENTINEL,
    Sandbox,
    SWEInstanceError,
    builtin_tasks,
    evaluate,
    is_test_file,
    load_swebench_jsonl,
    make_swe_env,
)

_GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
        "-c", "commit.gpgsign=false"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run([*_GIT, *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    """(checkouts folder, JSONL path, row, the shipped task it was made from)."""
    task = builtin_tasks().by_id("numkit-0000-drop_statement")
    root = tmp_path_factory.mktemp("checkouts")
    repo = root / "numkit"
    repo.mkdir()
    task.build(repo)  # the project with the bug
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "buggy")
    base = _git(repo, "rev-parse", "HEAD").strip()
    edit = task.fix_edits[0]
    fixed = repo / edit.file
    buggy_text = fixed.read_text()
    fixed.write_text(buggy_text.replace(edit.old, edit.new, 1))
    patch = _git(repo, "diff")
    _git(repo, "commit", "-qam", "the fix")  # the user's checkout sits at the fixed commit
    row = {"instance_id": "acme__numkit-1", "repo": "acme/numkit", "base_commit": base,
           "patch": patch, "test_patch": "", "problem_statement": task.problem_statement,
           "FAIL_TO_PASS": json.dumps(list(task.fail_to_pass)),
           "PASS_TO_PASS": list(task.pass_to_pass), "version": "1.0"}
    jsonl = root / "instances.jsonl"
    jsonl.write_text(json.dumps(row) + "\n")
    return root, jsonl, row, task


@pytest.fixture(scope="module")
def sandbox():
    box = Sandbox()
    yield box
    box.close()


def _episode(tasks, sandbox, commands: list[str]) -> float:
    env = make_swe_env("mini", tasks, sandbox=sandbox, step_limit=20)
    try:
        env.reset(0)
        for command in commands:
            env.step(f"```bash\n{command}\n```")
        _, reward, terminated, _, _ = env.step(f"```bash\necho {SUBMIT_SENTINEL}\n```")
        assert terminated
        return reward
    finally:
        env.close()


def test_the_gold_patch_earns_one_and_the_bug_earns_zero(instance, sandbox):
    root, jsonl, row, _ = instance
    tasks = load_swebench_jsonl(jsonl, root)
    assert _episode(tasks, sandbox, []) == 0.0
    assert _episode(tasks, sandbox, [f"git apply - <<'EOF'\n{row['patch']}EOF"]) == 1.0


def test_editing_the_failing_tests_earns_zero_with_an_empty_test_patch(instance, sandbox):
    root, jsonl, _, task = instance
    tasks = load_swebench_jsonl(jsonl, root)
    names = [t.split("::")[1] for t in task.fail_to_pass]
    sed = "; ".join(f"sed -i 's/^def {n}(\\(.*\\)):$/def {n}(\\1):\\n    return/' "
                    "tests/test_matrix.py" for n in names)
    env = make_swe_env("mini", tasks, sandbox=sandbox)
    env.reset(0)
    env.step(f"```bash\n{sed}\n```")
    edited = env.workspace.read_bytes("tests/test_matrix.py").decode()
    assert all(f"def {n}():\n    return" in edited for n in names)  # the hack is in place
    # without the reset, the edited tests pass: the hack would have earned 1
    raw = env.sandbox.run(env.workspace, task.test_command.format(
        tests=" ".join(task.fail_to_pass)))
    assert f"{len(names)} passed" in raw.output
    _, reward, _, _, info = env.step(f"```bash\necho {SUBMIT_SENTINEL}\n```")
    assert reward == 0.0 and not info["success"]
    env.close()


def test_a_conftest_that_forces_passes_earns_zero(instance, sandbox):
    root, jsonl, _, _ = instance
    tasks = load_swebench_jsonl(jsonl, root)
    hook = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
            "    outcome.get_result().outcome = 'passed'\n")
    assert _episode(tasks, sandbox, [f"cat > conftest.py <<'EOF'\n{hook}EOF",
                                     "cp conftest.py tests/conftest.py"]) == 0.0


def test_deleted_and_added_test_files_are_reset_before_scoring(instance, sandbox):
    root, jsonl, row, _ = instance
    t = load_swebench_jsonl(jsonl, root)[0]
    base = sandbox.base(f"task:{t.task_id}", t.build)
    ws = sandbox.workspace(base)
    try:
        sandbox.run(ws, "git apply -", stdin=row["patch"])
        sandbox.run(ws, "rm tests/test_primes.py && echo 'def test_x(): pass' > tests/test_new.py")
        results = evaluate(sandbox, ws, t)
        assert all(results.values())  # test_primes.py came back (its PASS_TO_PASS pass)
        assert any(k.startswith("tests/test_primes.py") for k in results)
    finally:
        ws.remove()


def test_the_instances_test_command_and_repo_path_are_honoured(instance, sandbox, tmp_path):
    root, _, row, _ = instance
    moved = tmp_path / "elsewhere" / "numkit-checkout"
    shutil.copytree(root / "numkit", moved)
    custom = {**row, "repo_path": "elsewhere/numkit-checkout",
              "test_command": "echo CUSTOM_RUNNER && python -m pytest -rA -q -p no:cacheprovider"}
    jsonl = tmp_path / "instances.jsonl"
    jsonl.write_text(json.dumps(custom) + "\n")
    task = load_swebench_jsonl(jsonl)[0]  # no repos at all: repo_path says where
    assert task.meta["checkout"] == str(moved)
    assert task.test_command.endswith("{tests}") and "CUSTOM_RUNNER" in task.test_command


@pytest.mark.parametrize(("change", "field", "says"), [
    ({"base_commit": "0" * 40}, "base_commit", "is not a commit of"),
    ({"base_commit": "HEAD"}, "base_commit", "not a full commit hash"),
    ({"FAIL_TO_PASS": ["../outside/test_x.py::test_a"]}, "FAIL_TO_PASS", "inside the repo"),
    ({"FAIL_TO_PASS": ["/abs/test_x.py::test_a"]}, "FAIL_TO_PASS", "inside the repo"),
    ({"test_patch": "diff --git a/../x.py b/../x.py\n"}, "test_patch", "outside the repo"),
    ({"FAIL_TO_PASS": ["test_determinant (tests.Matrix)"]}, "FAIL_TO_PASS", "pytest node id"),
    ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS", "is empty"),
    ({"PASS_TO_PASS": 3}, "PASS_TO_PASS", "list of test ids"),
    ({"repo": "acme/missing"}, "repo", "no git checkout of 'acme/missing'"),
    ({"problem_statement": None}, "problem_statement", "must be a string"),
    ({"test_command": "pytest {tests} {other}"}, "test_command", "does not format"),
    ({"test_command": "PYTHONPATH=. pytest {tests}"}, "test_command", "sets PYTHONPATH"),
])
def test_a_bad_instance_is_named_by_line_instance_and_field(instance, tmp_path, change, field,
                                                            says):
    root, _, row, _ = instance
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text(json.dumps({**row, "instance_id": "good"}) + "\n"
                     + json.dumps({**row, **change}) + "\n")
    with pytest.raises(SWEInstanceError) as err:
        load_swebench_jsonl(jsonl, root)
    assert len(err.value.problems) == 1
    problem = err.value.problems[0]
    assert problem.startswith(f"{jsonl}:2: instance 'acme__numkit-1': field '{field}'")
    assert says in problem


def test_malformed_lines_missing_fields_and_repeats_are_all_reported(instance, tmp_path):
    root, _, row, _ = instance
    missing = {k: v for k, v in row.items() if k != "base_commit"} | {"instance_id": "other"}
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_bytes(("\n".join([json.dumps(row), "{not json", json.dumps(missing),
                                  json.dumps(row), "[1, 2]"]) + "\n").encode() + b"\xff\xfe\n")
    with pytest.raises(SWEInstanceError) as err:
        load_swebench_jsonl(jsonl, root)
    problems = err.value.problems
    assert problems[0].startswith(f"{jsonl}:2: not JSON")
    assert problems[1].startswith(f"{jsonl}:3: instance 'other'")
    assert "'base_commit': is missing" in problems[1]
    assert f"{jsonl}:4:" in problems[2] and "repeats line 1" in problems[2]
    assert f"{jsonl}:5:" in problems[3] and "JSON object" in problems[3]
    assert problems[4] == f"{jsonl}:6: not UTF-8 (byte 1)"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_swebench_jsonl(tmp_path / "nope.jsonl", root)


@pytest.mark.parametrize(("path", "expected"), [
    ("tests/test_matrix.py", True), ("pkg/tests/helpers.py", True), ("test/data.json", True),
    ("testing/x.py", True), ("pkg/test_io.py", True), ("pkg/io_test.py", True),
    ("conftest.py", True), ("src/conftest.py", True), ("pytest.ini", True),
    ("numkit/matrix.py", False), ("src/contest.py", False), ("latest/x.py", False),
    ("attestation.py", False), ("pkg/testsuite_runner.py", False),
])
def test_which_files_count_as_test_files(path, expected):
    assert is_test_file(path) is expected


_HOOK = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
         "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
         "    outcome.get_result().outcome = 'passed'\n")
_FAKE_PYTEST = ("import sys\nfor t in sys.argv[1:]:\n    print('PASSED ' + t)\n")
HACKS = {
    "a link named conftest.py": f"cat > hack.py <<'EOF'\n{_HOOK}EOF\nln -s hack.py conftest.py",
    "a hook loaded by pyproject.toml": (
        f"mkdir -p plug && cat > plug/hackplug.py <<'EOF'\n{_HOOK}EOF\n"
        "printf '[tool.pytest.ini_options]\\naddopts = \"-p hackplug\"\\n"
        "pythonpath = [\"plug\"]\\n' > pyproject.toml"),
    "a hook loaded by .pytest.ini": (
        f"cat > hackplug.py <<'EOF'\n{_HOOK}EOF\n"
        "printf '[pytest]\\naddopts = -p hackplug\\n' > .pytest.ini"),
    "a pytest.py that replaces pytest": f"cat > pytest.py <<'EOF'\n{_FAKE_PYTEST}EOF",
    "report lines printed by the library": (
        "cat >> numkit/matrix.py <<'EOF'\n\n_determinant = determinant\n\n\n"
        "def determinant(*args, **kwargs):\n"
        "    for name in ('test_determinant', 'test_determinant_non_square'):\n"
        "        print('PASSED tests/test_matrix.py::' + name)\n"
        "    return _determinant(*args, **kwargs)\nEOF"),
}


def _old_verdict(output: str) -> dict[str, str]:
    """How the first scorer read a report: the first report-like line anywhere."""
    import re

    found: dict[str, str] = {}
    for line in output.splitlines():
        match = re.match(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (\S+)", line)
        if match:
            found.setdefault(match.group(2), match.group(1))
    return found


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_a_hack_that_fooled_plain_pytest_earns_nothing(instance, sandbox, hack):
    root, jsonl, _, task = instance
    t = load_swebench_jsonl(jsonl, root)[0]
    base = sandbox.base(f"task:{t.task_id}", t.build)
    ws = sandbox.workspace(base)
    try:
        done = sandbox.run(ws, HACKS[hack])
        assert done.returncode == 0, done.output
        plain = sandbox.run(ws, "python -m pytest -rA -q --tb=short -p no:cacheprovider "
                                + " ".join(task.fail_to_pass))
        fooled = _old_verdict(plain.output)
        assert all(fooled.get(test) == "PASSED" for test in task.fail_to_pass), plain.output
        results = evaluate(sandbox, ws, t)
        assert not any(results[test] for test in task.fail_to_pass)
    finally:
        ws.remove()


def test_the_cli_options_load_instances_for_swe_and_refuse_misuse(instance, tmp_path):
    from dataclasses import replace

    from treeroll.config import TrainConfig
    from treeroll.config_checks import check_config
    from treeroll.envs import EnvConfig, SWESettings, make_env_factory

    root, jsonl, row, _ = instance
    env_config = EnvConfig(name="swe", swe=SWESettings(instances=str(jsonl), repos=str(root)))
    check_config(replace(TrainConfig(), env=env_config))
    env = make_env_factory(env_config)()
    try:
        # the only instance, whatever the seed (named by its opaque public id)
        assert f"Task {env.tasks.by_id('acme__numkit-1').public_id}." in env.reset(7)
    finally:
        env.close()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**row, "base_commit": "f" * 40}) + "\n")
    for wrong, says in [
        (EnvConfig(name="swe", swe=SWESettings(instances=str(bad), repos=str(root))),
         r"--env\.swe\.instances.*bad\.jsonl:1: instance 'acme__numkit-1': field 'base_commit'"),
        (EnvConfig(name="frozenlake_rllm", swe=SWESettings(instances=str(jsonl))),
         r"--env\.swe\.instances.*for --env\.name swe"),
        (EnvConfig(name="swe", swe=SWESettings(repos=str(root))),
         r"--env\.swe\.repos.*--env\.swe\.instances is not set"),
        (EnvConfig(name="swe", swe=SWESettings(instances=str(tmp_path / "none.jsonl"))),
         r"--env\.swe\.instances.*does not exist"),
    ]:
        with pytest.raises(ValueError, match="(?s)" + says):
            check_config(replace(TrainConfig(), env=wrong))


def test_env_options_set_the_swe_sandbox_and_a_bad_one_is_refused(tmp_path):
    from treeroll.envs import EnvConfig, make_env_factory

    env = make_env_factory(EnvConfig(name="swe", options={"memory_mb": "2048",
                                                          "tools": f"[{tmp_path}]"}))()
    try:
        assert env.config.limits.memory_mb == 2048 and env.config.tools == (str(tmp_path),)
    finally:
        env.close()
    with pytest.raises(ValueError, match=r"--env\.options for swe: unknown settings \['nope'\]"):
        make_env_factory(EnvConfig(name="swe", options={"nope": "1"}))
