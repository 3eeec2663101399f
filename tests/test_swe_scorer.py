"""The SWE process scorer: signals, blending, caching, cost."""

from __future__ import annotations

import shlex

import pytest

from treeroll.base import ProcessScorer
from treeroll.envs.swe import SWEProcessScorer, builtin_tasks, make_swe_env
from treeroll.tree import RolloutTree


@pytest.fixture(scope="module")
def env():
    environment = make_swe_env("mini", builtin_tasks(), step_limit=50)
    yield environment
    environment.close()
    environment.sandbox.close()


def bash(command: str) -> str:
    return f"```bash\n{command}\n```"


def grow(tree: RolloutTree, parent, env, action: str):
    obs, reward, terminated, truncated, info = env.step(action)
    return tree.add_child(parent, action_text=action, observation_text=obs, reward=reward,
                          terminated=terminated, truncated=truncated, info=info, env=env.fork())


def test_scores_rank_progress_and_tests_run_once_per_tree(env):
    prompt = env.reset(0)
    task = env.task
    edit = task.fix_edits[0]
    tree = RolloutTree.new(0, 0, 0, [], prompt)
    tree.root.env = env.fork()
    explored = grow(tree, tree.root, env.fork(), bash("ls"))
    opened_env = tree.root.env.fork()
    opened = grow(tree, tree.root, opened_env, bash(f"cat {edit.file}"))
    fix = (f"import pathlib; p = pathlib.Path({edit.file!r}); "
           f"p.write_text(p.read_text().replace({edit.old!r}, {edit.new!r}, 1))")
    fixed = grow(tree, opened, opened.env.fork(), bash(f"python -c {shlex.quote(fix)}"))
    broken = grow(tree, opened, opened.env.fork(), bash(f"echo 'def (' >> {edit.file}"))
    looping_env = opened.env.fork()
    looping = opened
    for _ in range(5):
        looping = grow(tree, looping, looping_env, bash("ls"))
    garbled = grow(tree, tree.root, tree.root.env.fork(), "no action")

    scorer = SWEProcessScorer()
    assert isinstance(scorer, ProcessScorer)
    nodes = [tree.root, explored, opened, fixed, broken, looping, garbled]
    scores = scorer(tree, nodes)
    by = dict(zip(["root", "explored", "opened", "fixed", "broken", "looping", "garbled"],
                  scores, strict=True))
    assert all(0.0 <= s.value <= 1.0 and s.reason for s in scores)
    assert by["fixed"].value > by["opened"].value > by["explored"].value
    assert by["broken"].value < by["fixed"].value
    assert "do not parse" in by["broken"].reason or "parse errors" in by["broken"].reason
    assert "100% of FAIL_TO_PASS pass" in by["fixed"].reason
    assert by["looping"].value < by["opened"].value and "repeated 5x" in by["looping"].reason
    assert by["garbled"].value < by["explored"].value and "1 format error" in by["garbled"].reason
    assert scorer.test_runs == 1 and scorer.total_seconds > 0
    again = scorer(tree, [fixed])
    assert again[0] == by["fixed"] and scorer.test_runs == 1  # cached by tree content

    submitted_env = fixed.env.fork()
    submitted = grow(tree, fixed, submitted_env,
                     bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"))
    assert scorer(tree, [submitted])[0].value == 1.0
    for node in tree.nodes:
        if node.env is not None:
            node.env.close()


def test_node_without_env_gets_neutral_score():
    tree = RolloutTree.new(0, 0, 0, [], "prompt")
    assert SWEProcessScorer(run_tests=False)(tree, [tree.root])[0].value == 0.5
