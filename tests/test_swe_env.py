"""SWE environment: both action conventions, rewards, limits, fork isolation."""

from __future__ import annotations

import shlex

import pytest

from treeroll.base import Env
from treeroll.envs.swe import SUBMIT_SENTINEL, builtin_tasks, make_swe_env, parse_action


@pytest.fixture(scope="module")
def tasks():
    return builtin_tasks()


@pytest.fixture(scope="module")
def mini(tasks):
    env = make_swe_env("mini", tasks, step_limit=8, command_timeout_s=10, max_format_errors=2,
                       output_limit_chars=400)
    yield env
    env.close()
    env.sandbox.close()


@pytest.fixture(scope="module")
def swe_agent(tasks, mini):
    env = make_swe_env("swe_agent", tasks, sandbox=mini.sandbox, step_limit=8)
    yield env
    env.close()


def bash(command: str) -> str:
    return f"THOUGHT: go.\n\n```bash\n{command}\n```"


def fix_command(task) -> str:
    edit = task.fix_edits[0]
    script = (f"import pathlib; p = pathlib.Path({edit.file!r}); "
              f"p.write_text(p.read_text().replace({edit.old!r}, {edit.new!r}, 1))")
    return f"python -c {shlex.quote(script)}"


def test_is_an_env(mini):
    assert isinstance(mini, Env)
    assert SUBMIT_SENTINEL in mini.system_prompt


def test_reset_is_deterministic_in_seed(mini, tasks):
    first = mini.reset(3)
    assert tasks.for_seed(3).public_id in first
    assert tasks.for_seed(3).task_id not in first  # it names the mutation: a hint
    assert mini.reset(3) == first
    assert mini.reset(3 + len(tasks)) == first


def test_mini_correct_fix_rewards_one(mini):
    mini.reset(0)
    task = mini.task
    obs, reward, terminated, truncated, info = mini.step(bash(fix_command(task)))
    assert "<returncode>0</returncode>" in obs and reward == 0.0 and not terminated
    obs, reward, terminated, truncated, info = mini.step(bash(f"echo {SUBMIT_SENTINEL}"))
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert info["tests_passed"] == info["tests_total"]


def test_mini_incorrect_fix_rewards_zero(mini):
    mini.reset(1)
    task = mini.task
    mini.step(bash(f"echo '# harmless' >> {task.buggy_files[0]}"))
    obs, reward, terminated, _, info = mini.step(
        bash(f"echo {SUBMIT_SENTINEL} && git diff --stat"))
    assert (reward, terminated, info["success"]) == (0.0, True, False)
    assert "target tests fail" in obs


def test_editing_tests_does_not_cheat(mini):
    mini.reset(2)
    test_files = {t.split("::")[0] for t in mini.task.fail_to_pass}
    for path in test_files:
        mini.step(bash(f"printf 'def test_ok():\\n    pass\\n' > {path}"))
    _, reward, *_ = mini.step(bash(f"echo {SUBMIT_SENTINEL}"))
    assert reward == 0.0


def test_sentinel_must_be_first_line(mini):
    mini.reset(0)
    _, _, terminated, _, _ = mini.step(bash(f"echo hello; echo {SUBMIT_SENTINEL}"))
    assert not terminated


def test_format_errors_truncate(mini):
    mini.reset(0)
    obs, _, _terminated, truncated, info = mini.step("no code block here")
    assert info["format_error"] and not truncated and "EXACTLY ONE action" in obs
    _, _, _, truncated, info = mini.step(bash("ls") + "\n" + bash("ls"))
    assert truncated and info["stop_reason"] == "format_errors" and not info["success"]


def test_format_error_counter_resets_on_valid_reply(mini):
    mini.reset(0)
    mini.step("nothing")
    mini.step(bash("true"))
    _, _, _, truncated, _ = mini.step("nothing again")
    assert not truncated and mini.format_errors == 2


def test_step_limit_truncates(mini):
    mini.reset(0)
    for _ in range(7):
        *_, truncated, _ = mini.step(bash("true"))
        assert not truncated
    _, reward, terminated, truncated, info = mini.step(bash("true"))
    assert truncated and not terminated and reward == 0.0 and info["stop_reason"] == "step_limit"
    obs, *_ = mini.step(bash("true"))
    assert "ended" in obs


def test_long_output_is_truncated_visibly(mini):
    mini.reset(0)
    obs, *_ = mini.step(bash("seq 1 5000"))
    assert "<output_head>" in obs and "characters elided" in obs and "5000" in obs
    assert len(obs) < 1200


def test_never_raises_on_garbage(mini, swe_agent):
    for env in (mini, swe_agent):
        env.reset(0)
        for text in ["", "```", "```bash\n```", "\x00\xff" * 10, "<tool_call>{bad json",
                     "```\nstr_replace_editor view\n```", "```\nstr_replace_editor 'unclosed\n```",
                     '<tool_call>{"name": "rm", "arguments": {}}</tool_call>']:
            obs, reward, _terminated, truncated, _info = env.step(text)
            assert isinstance(obs, str) and reward == 0.0
            if truncated:
                env.reset(0)


def test_parse_action_conventions():
    assert parse_action("```bash\nls\n```", "mini").kind == "bash"
    assert parse_action('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}'
                        "</tool_call>", "mini").command == "ls"
    assert parse_action("```\nsubmit\n```", "swe_agent").kind == "submit"
    action = parse_action("```\nstr_replace_editor str_replace a.py --old_str 'x = 1\ny' "
                          "--new_str z\n```", "swe_agent")
    assert action.kind == "editor" and action.arguments["old_str"] == "x = 1\ny"
    call = parse_action('<tool_call>{"name": "str_replace_editor", "arguments": {"command": '
                        '"view", "path": "a.py"}}</tool_call>', "swe_agent")
    assert call.kind == "editor" and call.command == "view"
    assert parse_action("```\nsubmit\n```", "mini").kind == "error"


def test_swe_agent_editor_fix_and_submit(swe_agent):
    swe_agent.reset(0)
    task = swe_agent.task
    edit = task.fix_edits[0]
    obs, *_ = swe_agent.step(f"```\nstr_replace_editor view {edit.file}\n```")
    assert "cat -n" in obs
    obs, *_ = swe_agent.step("```\nstr_replace_editor str_replace "
                             f"{edit.file} --old_str {shlex.quote(edit.old)} --new_str "
                             f"{shlex.quote(edit.new)}\n```")
    assert "has been edited" in obs
    obs, reward, terminated, _, info = swe_agent.step("```\nsubmit\n```")
    assert (reward, terminated, info["success"]) == (1.0, True, True)


def test_swe_agent_editor_commands(swe_agent):
    swe_agent.reset(0)
    obs, *_ = swe_agent.step("```\nstr_replace_editor create notes.txt --file_text 'a\nb'\n```")
    assert "created" in obs
    obs, *_ = swe_agent.step("```\nstr_replace_editor create notes.txt --file_text x\n```")
    assert "already exists" in obs
    obs, *_ = swe_agent.step("```\nstr_replace_editor insert notes.txt --insert_line 1 "
                             "--new_str mid\n```")
    assert "has been edited" in obs
    assert swe_agent.workspace.read_bytes("notes.txt") == b"a\nmid\nb"
    obs, *_ = swe_agent.step("```\nstr_replace_editor str_replace notes.txt --old_str zzz "
                             "--new_str y\n```")
    assert "did not appear verbatim" in obs
    obs, *_ = swe_agent.step("```\nstr_replace_editor undo_edit notes.txt\n```")
    assert "undone" in obs and swe_agent.workspace.read_bytes("notes.txt") == b"a\nb"
    obs, *_ = swe_agent.step("```\nstr_replace_editor view . \n```")
    assert "notes.txt" in obs
    obs, *_ = swe_agent.step("```\nls notes.txt && echo via-bash\n```")
    assert "via-bash" in obs


def test_fork_isolation(mini):
    mini.reset(0)
    mini.step(bash("echo parent > shared.txt"))
    child = mini.fork()
    sibling = mini.fork()
    assert (child.steps, child.history, child.task) == (mini.steps, mini.history, mini.task)
    buggy = mini.task.buggy_files[0]
    child.step(bash(f"echo child > shared.txt && echo '# child' >> {buggy}"))
    obs, *_ = sibling.step(bash(f"cat shared.txt && tail -1 {buggy}"))
    assert "parent" in obs and "child" not in obs
    obs, *_ = mini.step(bash("cat shared.txt"))
    assert "parent" in obs and "child" not in obs
    assert child.workspace.read_bytes("shared.txt") == b"child\n"
    assert child.steps == sibling.steps == mini.steps
    child.close()
    sibling.close()


def test_fork_of_finished_episode_stays_finished(mini):
    mini.reset(0)
    mini.step(bash(f"echo {SUBMIT_SENTINEL}"))
    child = mini.fork()
    obs, _, terminated, _, _ = child.step(bash("ls"))
    assert terminated and "ended" in obs
    child.close()


def test_make_swe_env_rejects_unknown_settings(tasks):
    with pytest.raises(TypeError, match="unknown settings"):
        make_swe_env("mini", tasks, step_limt=3)
    with pytest.raises(ValueError, match="convention"):
        make_swe_env("cursor", tasks)


def test_building_the_environment_says_once_which_sandbox_mode_runs(capsys) -> None:
    """Every command that builds the SWE environment (train, eval, rollout) says which sandbox
    mode runs, once per process."""
    from treeroll.envs.swe import env as swe_env

    swe_env._announce_mode.cache_clear()
    first, second = make_swe_env(), make_swe_env()
    said = capsys.readouterr().err
    mode = first.sandbox.mode
    assert said.count("the SWE sandbox runs in") == 1
    assert f"the SWE sandbox runs in {mode} mode" in said
    for env in (first, second):
        env.close()
