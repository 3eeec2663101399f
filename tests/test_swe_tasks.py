"""Task generation (AST mutations, validation), the shipped index, the SWE-bench loader."""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from treeroll.envs.swe import (
    Mutation,
    Sandbox,
    builtin_tasks,
    generate_tasks,
    load_swebench_jsonl,
    make_swe_env,
    mutation_sites,
    validate_task,
)
from treeroll.envs.swe.tasks import parse_pytest_report

SOURCE = '''
def clamp(value, low, high):
    """Clamp."""
    if value < low:
        return low
    total = value + 1
    return min(high, total - 1)
'''


@pytest.fixture(scope="module")
def sandbox():
    box = Sandbox()
    yield box
    box.close()


def test_mutation_sites_cover_every_kind_and_are_deterministic():
    sites = mutation_sites(SOURCE, "m.py")
    assert sites == mutation_sites(SOURCE, "m.py")
    kinds = {m.kind for m in sites}
    assert {"swap_operator", "off_by_one", "negate_condition", "wrong_variable",
            "drop_statement", "swap_arguments"} <= kinds
    for mutation in sites:
        mutated = mutation.apply(SOURCE)
        assert mutated != SOURCE
        compile(mutated, "m.py", "exec")
        assert mutation.revert(mutated) == SOURCE


def test_mutation_checks_its_span():
    mutation = Mutation("m.py", 4, 7, 18, "value < low", "value <= low", "swap_operator")
    assert "value <= low" in mutation.apply(SOURCE)
    with pytest.raises(ValueError):
        mutation.apply(SOURCE.replace("value < low", "value > low"))


def test_parse_pytest_report():
    out = "PASSED tests/a.py::test_x\nFAILED tests/a.py::test_y - AssertionError\nERROR t.py::z"
    assert parse_pytest_report(out) == {"tests/a.py::test_x": "PASSED",
                                        "tests/a.py::test_y": "FAILED", "t.py::z": "ERROR"}


def test_shipped_index_has_200_validated_tasks():
    tasks = builtin_tasks()
    assert len(tasks) >= 200
    assert len({t.meta["project"] for t in tasks}) >= 4
    assert len({t.meta["kind"] for t in tasks}) >= 6
    for task in tasks:
        assert task.fail_to_pass and task.buggy_files and task.fix_edits
        assert not set(task.fail_to_pass) & set(task.pass_to_pass)
        assert task.fail_to_pass[0] in task.problem_statement


def test_random_sample_of_shipped_tasks_fails_before_and_passes_after_fix(sandbox):
    tasks = builtin_tasks()
    for task in random.Random(1234).sample(list(tasks), 5):
        ok, reason = validate_task(task, sandbox)
        assert ok, f"{task.task_id}: {reason}"


def test_generation_is_deterministic_and_validated(sandbox):
    first = generate_tasks(2, seed=7, projects=["ledger"], sandbox=sandbox)
    second = generate_tasks(2, seed=7, projects=["ledger"], sandbox=sandbox)
    assert first == second and len(first) == 2
    for entry in first:
        assert entry["fail_to_pass"] and entry["problem_statement"]
        assert entry["mutation"]["file"].startswith("ledger/")


@pytest.fixture(scope="module")
def swebench_repo(tmp_path_factory):
    """A tiny git repository with a bug, a gold patch and a test patch, SWE-bench style."""
    root = tmp_path_factory.mktemp("checkout")
    repo = root / "acme__calc"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text("def add(a, b):\n    return a - b\n\n\n"
                                          "def neg(a):\n    return -a\n")
    (repo / "tests" / "test_ops.py").write_text("from calc.ops import neg\n\n\n"
                                                "def test_neg():\n    assert neg(2) == -2\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=repo, check=True)
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                          text=True, check=True).stdout.strip()
    patch = ("diff --git a/calc/ops.py b/calc/ops.py\n--- a/calc/ops.py\n+++ b/calc/ops.py\n"
             "@@ -1,5 +1,5 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n \n \n"
             " def neg(a):\n")
    test_patch = ("diff --git a/tests/test_ops.py b/tests/test_ops.py\n"
                  "--- a/tests/test_ops.py\n+++ b/tests/test_ops.py\n"
                  "@@ -1,5 +1,9 @@\n-from calc.ops import neg\n+from calc.ops import add, neg\n"
                  " \n \n def test_neg():\n     assert neg(2) == -2\n+\n+\n"
                  "+def test_add():\n+    assert add(2, 3) == 5\n")
    row = {"instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": base,
           "patch": patch, "test_patch": test_patch, "problem_statement": "add() subtracts",
           "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_add"]),
           "PASS_TO_PASS": ["tests/test_ops.py::test_neg"]}
    jsonl = root / "instances.jsonl"
    jsonl.write_text(json.dumps(row) + "\n")
    return root, jsonl


def test_swebench_loader_and_reference_fix(swebench_repo, sandbox):
    root, jsonl = swebench_repo
    tasks = load_swebench_jsonl(jsonl, root)
    task = tasks.by_id("acme__calc-1")
    assert task.buggy_files == ("calc/ops.py",) and task.test_paths == ("tests/test_ops.py",)
    assert task.fail_to_pass == ("tests/test_ops.py::test_add",)
    ok, reason = validate_task(task, sandbox)
    assert ok, reason


def test_swebench_task_in_env(swebench_repo, sandbox):
    root, jsonl = swebench_repo
    env = make_swe_env("mini", load_swebench_jsonl(jsonl, {"acme/calc": root / "acme__calc"}),
                       sandbox=sandbox)
    obs = env.reset(0)
    assert "add() subtracts" in obs
    env.step("```bash\nsed -i 's/a - b/a + b/' calc/ops.py\n```")
    _, reward, terminated, _, info = env.step(
        "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```")
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    env.close()


def test_report_lines_printed_before_the_summary_are_not_the_verdict():
    out = ("____ test_y ____\n----- Captured stdout call -----\nPASSED tests/a.py::test_y\n"
           "=========================== short test summary info ============================\n"
           "PASSED tests/a.py::test_x\nFAILED tests/a.py::test_y - AssertionError\n")
    assert parse_pytest_report(out) == {"tests/a.py::test_x": "PASSED",
                                        "tests/a.py::test_y": "FAILED"}
