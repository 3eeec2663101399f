"""End-to-end through the real `treeroll` command: train, resume, eval, rollout, show."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from treeroll.config import load_config
from treeroll.policies.model import ModelConfig, build_model

ROOT = Path(__file__).resolve().parents[1]


def _treeroll(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "treeroll.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, check=check, timeout=600)


def test_train_changes_parameters_and_writes_metrics(tmp_path) -> None:
    runs = tmp_path / "runs"
    result = _treeroll("train", "--config", "configs/tiny.yaml", "--runs-dir", str(runs),
                       "--name", "e2e")
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"start_eval", "final_eval"} <= summary.keys()
    run = runs / "e2e"
    config = load_config(run / "config.yaml")
    assert config.optim.steps == 3
    # Parameters changed: rebuild the initial model (same seed) and compare.
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(run / "policy")
    initial = build_model(len(tokenizer), ModelConfig(**vars(config.policy.model)),
                          pad_token_id=tokenizer.pad_token_id,
                          eos_token_id=tokenizer.eos_token_id).state_dict()
    trained = torch.load(run / "checkpoints" / "last.pt", weights_only=False)["model"]
    changed = [k for k in initial if not torch.equal(initial[k], trained[k])]
    assert len(changed) >= len(initial) // 2
    # The metrics file: one JSON object per line, steps 1..3 with the logged figures.
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "success_rate" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert 0.0 <= r["success_rate"] <= 1.0
        assert r["leaves"] > 0 and r["generated_tokens"] > 0
        assert 0.0 <= r["signal_groups"] <= 1.0
        assert r["tokens"]["unique"] <= r["tokens"]["chain_unique"]
        assert isinstance(r["loss"], float)
    assert records[0]["step"] == 0 and "eval" in records[0]
    assert [p.name for p in (run / "trees").glob("*.json")] == ["step_00003.json"]  # last only

    # Training again refuses to overwrite the finished run, --resume refuses to touch it
    # (naming --extend), and --extend with more steps continues it.
    again = _treeroll("train", "--config", "configs/tiny.yaml", "--runs-dir", str(runs),
                      "--name", "e2e", check=False)
    assert again.returncode == 2 and "finished" in again.stderr and "--name" in again.stderr
    before = (run / "metrics.jsonl").read_text()
    again = _treeroll("train", "--config", "configs/tiny.yaml", "--runs-dir", str(runs),
                      "--name", "e2e", "--resume", "--optim.steps", "4", check=False)
    assert again.returncode == 2 and "--extend" in again.stderr
    assert (run / "metrics.jsonl").read_text() == before  # nothing touched
    resumed = _treeroll("train", "--config", "configs/tiny.yaml", "--runs-dir", str(runs),
                        "--name", "e2e", "--extend", "--optim.steps", "4")
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["steps"] == 4
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines if "success_rate" in x][-1] == 4

    evaluated = _treeroll("eval", "--run", str(run), "--tasks", "4")
    result_json = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert result_json["tasks"] == 4 and 0 <= result_json["success_rate"] <= 1
    # a run folder is a policy wherever a policy is taken (the same evaluation as --run)
    as_policy = _treeroll("eval", "--policy", str(run), "--tasks", "4")
    assert json.loads(as_policy.stdout.strip().splitlines()[-1]) == result_json
    # the finished run exported its trained weights as a policy folder (evaluated in the
    # default environment: a policy folder carries turn settings, not the run's environment)
    from treeroll.policies import load_policy

    exported = load_policy(str(run / "policy")).model.state_dict()
    final = torch.load(run / "checkpoints" / "last.pt", weights_only=False)["model"]
    assert all(torch.equal(exported[k], final[k]) for k in final)
    as_folder = _treeroll("eval", "--policy", str(run / "policy"), "--tasks", "4")
    assert json.loads(as_folder.stdout.strip().splitlines()[-1])["tasks"] == 4
    _treeroll("rollout", "--policy", str(run), "--out", str(tmp_path / "by_policy.json"),
              "--task", "5")
    assert (tmp_path / "by_policy.json").is_file()

    tree_path = tmp_path / "tree.json"
    _treeroll("rollout", "--run", str(run), "--out", str(tree_path), "--task", "5",
              "--train.strategy.name", "tree_grpo")
    shown = _treeroll("show", str(tree_path), "--out", str(tmp_path / "pics"))
    assert (tmp_path / "pics" / "tree.png").exists() and (tmp_path / "pics" / "tree.html").exists()
    assert "tree.png" in shown.stdout


def test_bad_config_and_options_are_named(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  stepz: 3\n")
    result = _treeroll("train", "--config", str(bad), check=False)
    assert result.returncode == 2
    assert "optim.stepz" in result.stderr and "steps" in result.stderr
    bad.write_text("optim:\n  steps: three\n")
    result = _treeroll("train", "--config", str(bad), check=False)
    assert "optim.steps" in result.stderr and "int" in result.stderr
    result = _treeroll("train", "--strategy.name", "nope", "--runs-dir", str(tmp_path),
                       check=False)
    assert result.returncode == 2 and "chain" in result.stderr
    result = _treeroll("frobnicate", check=False)
    assert result.returncode == 2 and "train" in result.stderr
    help_text = _treeroll("train", "--help").stdout
    assert "--optim.steps" in help_text and "default: 60" in help_text.replace("\n", " ")


def test_rollout_swe_with_patr_and_show(tmp_path) -> None:
    """`treeroll rollout --env swe --strategy patr` builds a tree on a generated task with the
    scripted agent and the SWE scorer; `treeroll show` renders it."""
    out = tmp_path / "swe.json"
    ran = _treeroll("rollout", "--env", "swe", "--strategy", "patr", "--out", str(out),
                    "--train.strategy.patr.k-turns", "2", "--task", "3")
    from treeroll.envs.swe import Sandbox

    probe = Sandbox()
    said_mode = f"the SWE sandbox runs in {probe.mode} mode"
    probe.close()
    said_rollout = " ".join((ran.stdout + ran.stderr).split())
    assert said_mode in said_rollout and "swe_scripted backend acts" in said_rollout
    data = json.loads(out.read_text())
    assert data["meta"]["strategy"] == "patr"
    nodes = data["nodes"]
    assert len(nodes) > 4
    assert any(n["score"] is not None for n in nodes)  # the SWE scorer ran
    assert any("bash" in n["action_text"] for n in nodes[1:])
    folder = str(ROOT / "src" / "treeroll" / "policies" / "frozenlake-tiny")  # a policy, by path
    refused = _treeroll("rollout", "--env", "swe", "--policy", folder, "--out",
                        str(tmp_path / "x.json"), check=False)
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode == 2 and "swe_scripted backend there" in said

    _treeroll("show", str(out), "--out", str(tmp_path / "pics"))
    page = (tmp_path / "pics" / "swe.html").read_text()
    drawn = {int(i) for i in re.findall(r'<circle[^>]*data-node-id="(\d+)"', page)}
    assert drawn == {n["id"] for n in nodes}


def test_format_warm_start_teaches_well_formed_replies_and_needs_an_expert() -> None:
    import numpy as np

    from treeroll.backends.hf import HFBackend
    from treeroll.config import EvalConfig, PolicyConfig
    from treeroll.engine import RolloutConfig
    from treeroll.envs import make_frozenlake
    from treeroll.policies import build_policy
    from treeroll.policies.model import ModelConfig
    from treeroll.training.evaluation import evaluate
    from treeroll.training.sft_run import format_warm_start

    make_env = lambda: make_frozenlake("rllm", size_min=3, size_max=4)
    config = PolicyConfig(init=None, model=ModelConfig(hidden_size=32, num_layers=1,
                                                       num_heads=2, intermediate_size=64),
                          warm_start_steps=80, warm_start_batch=8, warm_start_lr=3e-3)
    policy = build_policy(None, config.model, None, make_env)
    seeds = np.arange(200, 220)

    def well_formed() -> float:
        return evaluate(HFBackend(policy.model), policy.turn_format(), make_env, seeds,
                        EvalConfig(tasks=len(seeds)), RolloutConfig(max_turn_tokens=8)).format_ok

    before = well_formed()
    loss = format_warm_start(policy, make_env, np.arange(50), config, np.random.default_rng(0))
    after = well_formed()
    assert before < 0.5 and after > 0.95, (before, after)
    assert np.isfinite(loss)

    class NoExpert:
        def __init__(self) -> None:
            self.env = make_env()
            self.system_prompt = self.env.system_prompt

        def reset(self, seed: int) -> str:
            return self.env.reset(seed)

        def step(self, action: str):  # type: ignore[no-untyped-def]
            return self.env.step(action)

        def fork(self):  # type: ignore[no-untyped-def]
            return self.env.fork()

    with pytest.raises(ValueError, match="has no expert"):
        format_warm_start(policy, NoExpert, np.arange(50), config, np.random.default_rng(0))


def test_sft_command_writes_metrics_and_a_loadable_policy(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    args = ["sft", "--runs-dir", str(runs), "--name", "s", "--policy.init", "None",
            "--policy.model.hidden-size", "32", "--policy.model.num-layers", "1",
            "--policy.model.num-heads", "2", "--policy.model.intermediate-size", "64",
            "--env.frozenlake.size-min", "2", "--env.frozenlake.size-max", "3",
            "--env.train-tasks", "50",
            "--data.episodes-per-step", "2", "--optim.steps", "3", "--optim.warmup-steps", "0",
            "--log-every", "1", "--eval.tasks", "4", "--eval.every", "0"]
    result = _treeroll(*args)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["final_eval"]["tasks"] == 4
    records = [json.loads(x) for x in (runs / "s" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    assert all(r["loss"] > 0 and r["trained_tokens"] > 0 for r in records if "loss" in r)
    evaluated = _treeroll("eval", "--policy", str(runs / "s" / "policy"), "--tasks", "2")
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["tasks"] == 2
    # an SFT run folder is taken where a run is: its fine-tuned policy, in its environment
    # (sizes 2-3 here, not the default's 2-9), where it failed on SFT's own config keys
    from treeroll.cli.one_tree import load_run_config

    as_run = load_run_config(runs / "s")
    assert as_run.policy.init == str(runs / "s" / "policy") and as_run.env.frozenlake.size_max == 3
    by_run = _treeroll("eval", "--run", str(runs / "s"), "--tasks", "2")
    assert json.loads(by_run.stdout.strip().splitlines()[-1])["tasks"] == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": "nope"}\n')
    failed = _treeroll(*args[:4], "t", "--data.source", "jsonl", "--data.path", str(bad),
                       check=False)
    assert failed.returncode == 2 and "bad.jsonl:1" in failed.stderr
    assert not (runs / "t").exists()


def _run_folder(path: Path, **rollout: int) -> Path:
    """A run folder as `treeroll train` leaves it (config.yaml, checkpoints/last.pt), with
    configs/tiny.yaml's settings and ``rollout`` changed, without training."""
    from dataclasses import replace

    import yaml

    from treeroll.config import config_to_dict
    from treeroll.envs import make_env_factory
    from treeroll.policies import build_policy

    config = load_config(ROOT / "configs" / "tiny.yaml")
    config.rollout = replace(config.rollout, **rollout)
    policy = build_policy(None, config.policy.model, config.policy.view,
                          make_env_factory(config.env))
    (path / "checkpoints").mkdir(parents=True)
    torch.save({"model": policy.model.state_dict()}, path / "checkpoints" / "last.pt")
    plain = json.loads(json.dumps(config_to_dict(config)))  # tuples as lists
    (path / "config.yaml").write_text(yaml.safe_dump(plain, sort_keys=False))
    return path


def test_rollout_with_run_uses_its_settings_and_writes_under_runs(tmp_path, monkeypatch,
                                                                    capsys) -> None:
    """`rollout --run` samples with the run's config.yaml (turns cut at its 12 tokens, its
    tree_grpo strategy), options given override it, and the tree and its pictures land under
    runs/rollouts/ (ignored by git), not in the current folder."""
    from treeroll.cli.commands import main

    run = _run_folder(tmp_path / "the_run", max_turn_tokens=12)
    monkeypatch.chdir(tmp_path)
    assert main(["rollout", "--run", str(run), "--task", "3"]) == 0
    tree_path = tmp_path / "runs" / "rollouts" / "tree-3.json"
    data = json.loads(tree_path.read_text())
    assert data["meta"]["strategy"] == "tree_grpo"  # the run's, not the default chain
    assert max(len(n["action_ids"]) for n in data["nodes"]) == 12  # not the default 24
    assert str(tree_path.relative_to(tmp_path)) in capsys.readouterr().err

    assert main(["rollout", "--run", str(run), "--task", "3", "--out", "given.json",
                 "--train.rollout.max-turn-tokens", "5"]) == 0
    data = json.loads((tmp_path / "given.json").read_text())
    assert data["meta"]["strategy"] == "tree_grpo"
    assert max(len(n["action_ids"]) for n in data["nodes"]) == 5

    assert main(["show", str(tree_path)]) == 0  # pictures beside the tree file
    assert (tree_path.with_suffix(".png")).exists() and (tree_path.with_suffix(".html")).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["given.json", "runs", "the_run"]

    # an earlier tree is never overwritten; --force replaces it and drops its old pictures
    before = tree_path.read_text()
    assert main(["rollout", "--run", str(run), "--task", "3"]) == 2
    captured = capsys.readouterr()
    said = " ".join((captured.out + captured.err).split())
    assert "exists" in said and "--force" in said, said[-300:]
    assert tree_path.read_text() == before
    assert main(["rollout", "--run", str(run), "--task", "3", "--force"]) == 0
    assert tree_path.exists() and not tree_path.with_suffix(".png").exists()
    # a path that cannot be written is one line naming it, not a traceback
    assert main(["rollout", "--run", str(run), "--out", "given.json/tree.json"]) == 2
    captured = capsys.readouterr()
    said = " ".join((captured.out + captured.err).split())
    assert "error:" in said and "given.json/tree.json" in said and "Traceback" not in said


def test_help_lists_config_without_markup_and_errors_name_the_command(capsys) -> None:
    from treeroll.cli.commands import main

    with pytest.raises(SystemExit) as exited:
        main(["train", "--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    assert help_text.startswith("usage: treeroll train")
    assert "--config FILE.yaml" in help_text and "--optim.steps" in help_text
    assert "``" not in help_text
    assert "`<runs_dir>/<name>`" in help_text  # docstring literals read as `name`
    with pytest.raises(SystemExit) as exited:
        main(["train", "--no-such-option"])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    error = " ".join((captured.out + captured.err).split())
    assert "--no-such-option" in error and "treeroll train --help" in error


def test_policy_is_spelled_the_same_in_every_command() -> None:
    from treeroll.cli.commands import _policy_spelling, parse_settings
    from treeroll.cli.compare import CompareConfig
    from treeroll.config import TrainConfig

    assert _policy_spelling("train", ["--policy", "p", "--policy.view", "plain"]) == \
        ["--policy.init", "p", "--policy.view", "plain"]
    assert _policy_spelling("rollout", ["--policy=p"]) == ["--train.policy.init=p"]
    assert _policy_spelling("compare", ["--policy", "p"]) == ["--base.policy.init", "p"]
    assert _policy_spelling("eval", ["--policy.init", "p"]) == ["--policy", "p"]
    assert _policy_spelling("show", ["--policy", "p"]) == ["--policy", "p"]
    assert parse_settings(TrainConfig, ["--policy", "my_folder"], "", command="train").policy.init \
        == "my_folder"
    compare = parse_settings(CompareConfig, ["--policy", "f"], "", command="compare")
    assert compare.base.policy.init == "f"
