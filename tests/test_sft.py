"""`treeroll sft`: data (JSONL with bad lines, the expert), the loss mask, the loop, resume."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from treeroll.config import EvalConfig, PolicyConfig
from treeroll.envs import EnvConfig, FrozenLakeSettings, make_frozenlake
from treeroll.formatting import TurnFormat
from treeroll.policies.model import ModelConfig
from treeroll.training.evaluation import task_pools
from treeroll.training.sft import SFTConfig, SFTDataConfig, SFTOptimConfig, sft_loss
from treeroll.training.sft_data import BadDataLine, expert_episode, read_jsonl
from treeroll.training.sft_run import make_batches, run_sft

TINY_POLICY = PolicyConfig(init=None, model=ModelConfig(hidden_size=32, num_layers=1,
                                                        num_heads=2, intermediate_size=64))


def _tiny_config(tmp_path: Path, **changes: object) -> SFTConfig:
    config = SFTConfig(name="sft", runs_dir=str(tmp_path / "runs"), checkpoint_every=2,
                       log_every=1,
                       env=EnvConfig(frozenlake=FrozenLakeSettings(size_min=2, size_max=3),
                                     train_tasks=100),
                       policy=TINY_POLICY,
                       data=SFTDataConfig(episodes_per_step=3, skill=0.7),
                       optim=SFTOptimConfig(steps=4, lr=3e-3, warmup_steps=1,
                                            micro_batch_tokens=256),
                       eval=EvalConfig(tasks=4, every=2, tasks_during=2))
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def _messages(reply: str = "```Up```") -> dict[str, object]:
    env = make_frozenlake("rllm")
    first = env.reset(3)
    second = env.step(reply)[0]
    return {"messages": [{"role": "system", "content": env.system_prompt},
                         {"role": "user", "content": first},
                         {"role": "assistant", "content": reply},
                         {"role": "user", "content": second},
                         {"role": "assistant", "content": "```Left```"}]}


def test_jsonl_bad_line_is_named_with_its_number_and_fatal_unless_skipped(
        tmp_path: Path, word_tokenizer) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "data.jsonl"
    lines = [json.dumps(_messages()), "{not json", json.dumps({"messages": [
        {"role": "assistant", "content": "hi"}]}), "",
        json.dumps({"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}),
        json.dumps({"input_ids": [5, 10**6], "loss_mask": [0, 1]}),
        json.dumps([1, 2]), json.dumps({"messages": [{"role": "user", "content": 3}]}),
        json.dumps({"messages": [{"role": "user", "content": "a"}, {
            "role": "assistant", "content": "", "tool_calls": [{"name": "x"}]}]}),
        json.dumps({"input_ids": [5, 6, 7], "labels": [-100, 6, 7]})]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe\n")
    turn_format = TurnFormat(word_tokenizer)
    with pytest.raises(BadDataLine, match=r"data\.jsonl:2: not valid JSON"):
        read_jsonl(path, turn_format, len(word_tokenizer))
    warnings: list[str] = []
    examples = read_jsonl(path, turn_format, len(word_tokenizer), on_bad_line="skip",
                          warn=warnings.append)
    assert len(examples) == 3  # lines 1, 5 and 10
    assert [w.split(": ")[0].rsplit(":", 1)[1] for w in warnings] == [
        "2", "3", "6", "7", "8", "9", "11"]
    assert "must be 'user'" in warnings[1] and "outside the vocabulary" in warnings[2]
    assert "JSON object" in warnings[3] and "string 'content'" in warnings[4]
    assert "tool_calls" in warnings[5] and "UTF-8" in warnings[6]
    assert examples[1].ids == (5, 6, 7) and examples[1].loss_mask == (0, 1, 1)
    assert examples[2].loss_mask == (0, 1, 1)  # from labels


def test_messages_become_the_rollout_context_with_loss_on_replies_only(
        word_tokenizer) -> None:  # type: ignore[no-untyped-def]
    turn_format = TurnFormat(word_tokenizer)
    record = _messages()
    from treeroll.training.sft_data import parse_line

    example = parse_line(json.dumps(record), turn_format, len(word_tokenizer))
    messages = record["messages"]
    assert isinstance(messages, list)
    # The context a rollout builds: prompt, reply + eos, observation, reply + eos.
    prompt, _ = turn_format.prompt(messages[0]["content"], messages[1]["content"])
    first = turn_format.reply(messages[2]["content"])
    observation, _ = turn_format.observation(messages[3]["content"], action_ended_turn=True)
    second = turn_format.reply(messages[4]["content"])
    assert list(example.ids) == prompt + first + observation + second
    assert list(example.loss_mask) == ([0] * len(prompt) + [1] * len(first)
                                       + [0] * len(observation) + [1] * len(second))
    assert first[-1] == turn_format.eos_token_id


def test_noisy_expert_replies_stay_in_the_context_but_out_of_the_loss(
        word_tokenizer) -> None:  # type: ignore[no-untyped-def]
    turn_format = TurnFormat(word_tokenizer)
    env = make_frozenlake("rllm", size_min=5, size_max=5)
    masked = kept = 0
    for seed in range(20):
        example = expert_episode(env, seed, turn_format, np.random.default_rng(seed), skill=0.3)
        # replay the episode: every reply is either fully trained or fully masked, and it is
        # masked exactly when it is not one of the planner's best moves
        replay = make_frozenlake("rllm", size_min=5, size_max=5)
        replay.reset(seed)
        ids, mask = list(example.ids), list(example.loss_mask)
        cursor = len(turn_format.prompt(replay.system_prompt, replay.reset(seed))[0])
        while cursor < len(ids):
            end = ids.index(turn_format.eos_token_id, cursor) + 1
            reply = turn_format.decode_action(ids[cursor:end])
            best = {f"```{name}```" for name in
                    (("Left", "Down", "Right", "Up")[i]
                     for i in replay.planner_actions(replay.position))}
            optimal = reply.replace(" ", "") in best
            assert set(mask[cursor:end]) == {int(optimal)}
            masked += not optimal
            kept += optimal
            observation, _, terminated, truncated, _ = replay.step(reply)
            cursor = end
            if terminated or truncated:
                break
            cursor += len(turn_format.observation(observation, action_ended_turn=True)[0])
        assert cursor == len(ids)
    assert masked > 0 and kept > 0


def test_sft_loss_counts_model_tokens_only(tiny_model, word_tokenizer) -> None:  # type: ignore[no-untyped-def]
    turn_format = TurnFormat(word_tokenizer)
    example = expert_episode(make_frozenlake("rllm"), 7, turn_format, np.random.default_rng(0))
    loss, count = sft_loss(tiny_model, [example])
    assert count == sum(example.loss_mask[1:]) == example.trained_tokens
    logits = tiny_model(input_ids=torch.tensor([example.ids])).logits[0, :-1]
    log_probs = torch.log_softmax(logits.float(), -1)
    positions = [t for t in range(1, len(example.ids)) if example.loss_mask[t]]
    reference = -sum(log_probs[t - 1, example.ids[t]] for t in positions) / len(positions)
    assert torch.allclose(loss, reference, atol=1e-5)


def test_sft_loss_of_a_padded_batch_is_the_sum_of_its_rows(tiny_model, word_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """The head runs at the rows' own masked positions only (ragged, padded): the batch's
    summed loss is the rows' summed losses."""
    turn_format = TurnFormat(word_tokenizer)
    rng = np.random.default_rng(1)
    examples = [expert_episode(make_frozenlake("rllm"), seed, turn_format, rng)
                for seed in (3, 11)]
    assert len(examples[0].ids) != len(examples[1].ids)
    both, count = sft_loss(tiny_model, examples, normaliser=1)
    alone = [sft_loss(tiny_model, [e], normaliser=1) for e in examples]
    assert count == sum(c for _, c in alone)
    assert torch.allclose(both, sum(loss for loss, _ in alone), atol=1e-4)


class _LakeWithOldExpert:
    """rLLM FrozenLake behind an expert written before ``safe_moves`` (its ``expert_reply``
    takes ``explain`` only); records the task seeds it is reset to in ``seen``."""

    def __init__(self, seen: list[int] | None = None) -> None:
        self.env = make_frozenlake("rllm")
        self.system_prompt = self.env.system_prompt
        self.seen = [] if seen is None else seen

    def reset(self, seed: int) -> str:
        self.seen.append(seed)
        return self.env.reset(seed)

    def step(self, action: str):  # type: ignore[no-untyped-def]
        return self.env.step(action)

    def fork(self):  # type: ignore[no-untyped-def]
        return self.env.fork()

    def expert_reply(self, rng, skill=1.0, *, explain=False):  # type: ignore[no-untyped-def]
        return self.env.expert_reply(rng, skill, explain=explain)


def test_expert_data_draws_training_seeds_only(word_tokenizer) -> None:  # type: ignore[no-untyped-def]
    env_config, eval_config = EnvConfig(train_tasks=50), EvalConfig(tasks=64)
    train, held_out = task_pools(env_config, eval_config)
    assert not set(train.tolist()) & set(held_out.tolist())
    seen: list[int] = []

    def recording() -> _LakeWithOldExpert:  # a factory, as make_env is
        return _LakeWithOldExpert(seen)

    batches = make_batches(SFTDataConfig(episodes_per_step=8), recording,
                           TurnFormat(word_tokenizer), len(word_tokenizer), train)
    for _ in range(5):
        batches(np.random.default_rng(len(seen)))
    # 5 steps of 8 episodes, and the one reply make_batches checks up front (first seed)
    assert len(seen) == 1 + 40 and set(seen) <= set(train.tolist())


def test_explained_safe_moves_are_in_the_trained_replies_and_need_an_expert_that_lists_them(
        ) -> None:
    """With ``data.explain_safe_moves`` the expert's replies, which SFT trains on (loss mask
    1), start with the header's words and its safe list (``P@r,c G@r,c safe ...``); without it
    they carry no list; an expert that cannot list safe moves is refused up front."""
    from treeroll.policies import load_policy

    policy = load_policy("frozenlake-tiny")  # its tokenizer knows the safe view's words
    fmt, tokenizer = policy.turn_format(), policy.tokenizer
    unknown = tokenizer.unk_token_id
    train = np.arange(100, 140)
    replies = {}
    for explain_safe in (False, True):
        data = SFTDataConfig(episodes_per_step=4, explain=True,
                             explain_safe_moves=explain_safe)
        batch = make_batches(data, lambda: make_frozenlake("rllm"), fmt, len(tokenizer),
                             train)(np.random.default_rng(0))
        trained = [i for e in batch for i, m in zip(e.ids, e.loss_mask, strict=True) if m]
        assert unknown not in trained
        replies[explain_safe] = tokenizer.decode(trained)
    assert " safe " not in f" {replies[False]} "
    assert replies[True].count(" safe") >= 4 and "safe" in replies[True].split()[2:3]

    with pytest.raises(ValueError, match=r"--data\.explain-safe-moves is on, but the expert"):
        make_batches(SFTDataConfig(explain=True, explain_safe_moves=True),
                     _LakeWithOldExpert, fmt, len(tokenizer), train)


def test_explained_safe_moves_are_refused_where_they_cannot_be_written_or_read(
        tmp_path: Path, word_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """``data.explain_safe_moves`` is refused before any work: from a JSONL file, for RAGEN's
    FrozenLake and the SWE agent (no list to write), and for a tokenizer without the safe
    view's words (the list would train as <unk>)."""
    from treeroll.envs.swe import builtin_tasks, make_swe_env
    from treeroll.policies import load_policy

    with pytest.raises(ValueError, match=r"--data\.explain-safe-moves.*data\.source is 'jsonl'"):
        run_sft(_tiny_config(tmp_path, name="bad", data=SFTDataConfig(
            source="jsonl", path="x.jsonl", explain=True, explain_safe_moves=True)))
    data = SFTDataConfig(explain=True, explain_safe_moves=True)
    train = np.arange(100, 110)
    shipped = load_policy("frozenlake-tiny")
    fmt, vocab = shipped.turn_format(), len(shipped.tokenizer)
    for make_env, why in ((lambda: make_frozenlake("ragen"), "rllm convention"),
                          (lambda: make_swe_env("mini", builtin_tasks()), "scripted agent")):
        with pytest.raises(ValueError, match=f"cannot list safe moves.*{why}"):
            make_batches(data, make_env, fmt, vocab, train)
    with pytest.raises(ValueError, match=r"does not know.*cell_coordinates_safe"):
        make_batches(data, lambda: make_frozenlake("rllm"), TurnFormat(word_tokenizer),
                     len(word_tokenizer), train)
    make_batches(data, lambda: make_frozenlake("rllm"), fmt, vocab, train)  # the shipped recipe


def test_sft_run_resumes_exactly_after_an_interrupt_inside_a_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    straight = run_sft(_tiny_config(tmp_path, name="straight"))
    assert straight["final_eval"]["tasks"] == 4
    import treeroll.training.sft_run as sft_run

    real = sft_run.make_batches

    def interrupting(*args, **kwargs):  # type: ignore[no-untyped-def]
        draw = real(*args, **kwargs)
        calls = [0]

        def wrapped(rng):  # type: ignore[no-untyped-def]
            calls[0] += 1
            if calls[0] == 3:  # Ctrl-C while step 3 draws its data
                raise KeyboardInterrupt
            return draw(rng)
        return wrapped

    monkeypatch.setattr(sft_run, "make_batches", interrupting)
    with pytest.raises(KeyboardInterrupt):
        run_sft(_tiny_config(tmp_path, name="split"))
    monkeypatch.setattr(sft_run, "make_batches", real)
    runs = tmp_path / "runs"
    assert torch.load(runs / "split" / "checkpoints" / "last.pt",
                      weights_only=False)["step"] == 2
    run_sft(_tiny_config(tmp_path, name="split", resume=True))
    a = torch.load(runs / "straight" / "checkpoints" / "last.pt", weights_only=False)
    b = torch.load(runs / "split" / "checkpoints" / "last.pt", weights_only=False)
    assert a["step"] == b["step"] == 4
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])

    def records(name: str) -> list[dict[str, object]]:
        lines = (runs / name / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in r.items() if k not in ("seconds",)}
                for r in map(json.loads, lines)]
    assert records("split") == records("straight")  # nothing lost, nothing twice
    assert [r["step"] for r in records("straight") if "loss" in r] == [1, 2, 3, 4]

    from treeroll.policies import load_policy

    policy = load_policy(str(runs / "straight" / "policy"))
    assert policy.view == "plain"
    reloaded = policy.model.state_dict()
    assert all(torch.equal(reloaded[k], a["model"][k]) for k in reloaded)
    card = (runs / "straight" / "policy" / "README.md").read_text()
    assert "treeroll sft" in card and "held-out" in card.lower()


def test_lr_schedule_warms_up_to_the_peak_and_ends_at_the_floor() -> None:
    from treeroll.training.sft import lr_factor

    config = SFTOptimConfig(steps=10, warmup_steps=4, min_lr_ratio=0.1)
    factors = [lr_factor(step, config) for step in range(10)]
    assert factors[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert factors[-1] == pytest.approx(0.1) and all(
        a >= b for a, b in itertools.pairwise(factors[4:]))
    constant = SFTOptimConfig(steps=10, warmup_steps=0, schedule="constant")
    assert {lr_factor(step, constant) for step in range(10)} == {1.0}


def test_resume_may_extend_a_constant_schedule_but_not_a_cosine_one(tmp_path: Path) -> None:
    cosine = _tiny_config(tmp_path, name="cosine")
    cosine.optim = SFTOptimConfig(steps=2, warmup_steps=0)
    run_sft(cosine)
    longer = _tiny_config(tmp_path, name="cosine", resume=True)
    longer.optim = SFTOptimConfig(steps=4, warmup_steps=0)
    with pytest.raises(ValueError, match=r"optim\.steps"):
        run_sft(longer)
    constant = _tiny_config(tmp_path, name="constant")
    constant.optim = SFTOptimConfig(steps=2, warmup_steps=0, schedule="constant")
    run_sft(constant)
    constant = _tiny_config(tmp_path, name="constant", resume=True)
    constant.optim = SFTOptimConfig(steps=3, warmup_steps=0, schedule="constant")
    assert run_sft(constant)["steps"] == 3


def test_export_never_replaces_a_folder_that_is_not_a_policy(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a policy folder"):
        run_sft(_tiny_config(tmp_path, name="export", export=str(precious)))
    assert (precious / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "runs" / "export").exists()
    target = tmp_path / "exported"
    config = _tiny_config(tmp_path, name="export2", export=str(target))
    config.optim = SFTOptimConfig(steps=1, warmup_steps=0)
    run_sft(config)
    assert (target / "treeroll.json").is_file() and (target / "model.safetensors").is_file()


def test_sft_resume_with_other_settings_is_refused(tmp_path: Path) -> None:
    run_sft(_tiny_config(tmp_path, name="run"))
    changed = _tiny_config(tmp_path, name="run", resume=True)
    changed.data = SFTDataConfig(episodes_per_step=3, skill=0.2)
    with pytest.raises(ValueError, match=r"data\.skill"):
        run_sft(changed)
    with pytest.raises(FileExistsError, match="--resume"):
        run_sft(_tiny_config(tmp_path, name="run"))


def test_bad_sft_settings_fail_before_the_run_folder_exists(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--data\.path is not set"):
        run_sft(_tiny_config(tmp_path, name="bad", data=SFTDataConfig(source="jsonl")))
    with pytest.raises(ValueError, match=r"--data\.source jsonl"):
        run_sft(_tiny_config(tmp_path, name="bad", data=SFTDataConfig(path="x.jsonl")))
    with pytest.raises(ValueError, match=r"--data\.explain-safe-moves is on but data\.explain"):
        run_sft(_tiny_config(tmp_path, name="bad",
                             data=SFTDataConfig(explain_safe_moves=True)))
    with pytest.raises(ValueError, match=r"--optim\.schedule is 'linear'"):
        run_sft(_tiny_config(tmp_path, name="bad",
                             optim=SFTOptimConfig(schedule="linear")))
    assert not (tmp_path / "runs" / "bad").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\n')
    config = _tiny_config(tmp_path, name="bad",
                          data=SFTDataConfig(source="jsonl", path=str(bad)))
    with pytest.raises(BadDataLine, match=r"bad\.jsonl:1: 'messages' must be a non-empty"):
        run_sft(config)
    assert not (tmp_path / "runs" / "bad").exists()


def test_sft_that_fails_in_its_start_evaluation_leaves_no_run_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import treeroll.training.sft_run as sft_run

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("the template refused a role")

    monkeypatch.setattr(sft_run, "evaluate", failing)
    with pytest.raises(RuntimeError, match="refused a role"):
        run_sft(_tiny_config(tmp_path, name="failed"))
    assert not (tmp_path / "runs" / "failed").exists()


def test_sft_refuses_a_model_with_fewer_positions_than_the_contexts(tmp_path: Path) -> None:
    small = PolicyConfig(init=None, model=ModelConfig(hidden_size=32, num_layers=1, num_heads=2,
                                                      intermediate_size=64, max_positions=64))
    with pytest.raises(ValueError, match=r"more than the model's 64 positions"):
        run_sft(_tiny_config(tmp_path, name="short", policy=small))
    assert not (tmp_path / "runs" / "short").exists()


def test_the_shipped_recipe_does_not_export_into_the_package_unless_asked() -> None:
    from treeroll.config import load_config

    recipe = load_config("configs/sft_frozenlake.yaml", SFTConfig)
    assert recipe.export is None  # only an explicit --export replaces the shipped base


def test_an_sft_step_count_beyond_a_year_stops_after_step_two_with_it_logged_and_kept(
        tmp_path: Path) -> None:
    from treeroll.checks import ConfigError

    config = _tiny_config(tmp_path, optim=SFTOptimConfig(steps=10**12, lr=3e-3,
                                                         warmup_steps=0, schedule="constant",
                                                         micro_batch_tokens=256))
    with pytest.raises(ConfigError, match=r"--optim.steps 1,000,000,000,000 is absurd"):
        run_sft(config)
    saved = torch.load(tmp_path / "runs" / "sft" / "checkpoints" / "last.pt",
                       weights_only=False)
    assert saved["step"] == 2
    logged = [json.loads(line) for line in
              (tmp_path / "runs" / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == [1, 2]  # the log has what was saved
