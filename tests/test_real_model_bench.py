"""``bench/real_model.py``'s long runs continue across invocations on one commit (a figure
longer than a session finishes when it is run again) and start over on another;
``bench/real_model_decode.py`` times the recipe's first turn."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


@dataclass
class _Config:
    runs_dir: str
    name: str
    resume: bool = False


def test_a_long_figures_run_resumes_on_its_commit_is_read_back_and_starts_over_on_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import real_model

    calls: list[bool] = []

    def run(config: _Config) -> dict[str, int]:
        """A run that checkpoints, is interrupted the first time (writing the summary an
        interrupted run writes, as the trainer does), and finishes after."""
        folder = Path(config.runs_dir) / config.name
        calls.append(config.resume)
        (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
        (folder / "checkpoints" / "last.pt").write_text("state")
        if len(calls) == 1:
            (folder / "summary.json").write_text(json.dumps({"interrupted_at_step": 2}))
            raise KeyboardInterrupt  # the session ended mid-run
        done = {"steps": len(calls), "final_eval": {}}
        (folder / "summary.json").write_text(json.dumps(done))
        return done

    config = _Config(str(tmp_path), "rl")
    monkeypatch.setattr(real_model, "_commit", lambda: "a" * 40)
    with pytest.raises(KeyboardInterrupt):
        real_model.resumed(config, run)
    # resumed, not read back as finished (its summary says interrupted), nor restarted
    assert real_model.resumed(config, run) == ({"steps": 2, "final_eval": {}}, True)
    assert real_model.resumed(config, run) == ({"steps": 2, "final_eval": {}}, True)  # read back
    assert calls == [False, True]
    monkeypatch.setattr(real_model, "_commit", lambda: "b" * 40)
    assert real_model.resumed(config, run) == ({"steps": 3, "final_eval": {}}, False)  # scratch
    assert calls[-1] is False and (tmp_path / "rl.old1" / "summary.json").is_file()
    monkeypatch.setattr(real_model, "_commit", lambda: "b" * 40 + "+dirty")
    real_model.resumed(config, run)
    assert calls[-1] is False  # uncommitted code never continues anything


def test_a_bench_reexecutes_in_the_engines_environment_with_its_configs_kv_cache_only_for_vllm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``vllm_env.reexec_for`` (what ``real_model.py --rl-only``, ``real_model_decode.py`` and
    ``compare_strategies.py`` call) re-executes exactly when the config samples with vllm,
    with that config's KV cache size unless one is set already; the shipped recipe and
    comparison do. (Which block each script passes, ``config.backend`` or
    ``config.base.backend``, fails loudly at run time if wrong.)"""
    import vllm_env
    from treeroll.cli.compare import CompareConfig
    from treeroll.config import TrainConfig, load_config, merged_config

    reexecs: list[str | None] = []
    monkeypatch.setattr(vllm_env, "reexec_in_venv",
                        lambda: reexecs.append(os.environ.get("VLLM_CPU_KVCACHE_SPACE")))
    # set, then removed: monkeypatch restores the variable's absence after the test (what
    # reexec_for sets itself would otherwise leak into later tests)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "unset")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    hf = merged_config(TrainConfig(), {"backend": {"name": "hf"}})
    assert vllm_env.reexec_for(hf.backend) is False and reexecs == []
    engine = merged_config(TrainConfig(), {"backend": {"name": "vllm",
                                                       "vllm": {"cpu_kvcache_gib": 3}}})
    assert vllm_env.reexec_for(engine.backend) is True and reexecs == ["3"]
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    recipe = load_config(str(ROOT / "configs" / "smollm2_rl.yaml"))
    compare = load_config(str(ROOT / "configs" / "smollm2_compare.yaml"), CompareConfig)
    assert vllm_env.reexec_for(recipe.backend) is True
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert vllm_env.reexec_for(compare.base.backend) is True
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "7")  # a size set by the user wins
    assert vllm_env.reexec_for(engine.backend) is True
    assert reexecs == ["3", str(recipe.backend.vllm.cpu_kvcache_gib),
                       str(compare.base.backend.vllm.cpu_kvcache_gib), "7"]


class _Format:
    """A turn format whose prompt ids spell the observation (no tokenizer needed)."""

    def prompt(self, system: str, observation: str) -> tuple[list[int], None]:
        return [len(system), *map(ord, observation)], None


class _Policy:
    def turn_format(self) -> _Format:
        return _Format()


def test_decode_bench_builds_the_recipes_first_turn_its_tasks_times_tree_grpos_roots() -> None:
    from real_model_decode import first_turn, recipe_config

    config = recipe_config()
    roots, tasks = config.strategy.tree_grpo.m, config.optim.tasks_per_step
    requests = first_turn(config, _Policy())
    assert len(requests) == tasks * roots == 32
    prompts = [r.prompt_ids for r in requests]
    assert all(len(set(prompts[t * roots:(t + 1) * roots])) == 1 for t in range(tasks))
    assert len(set(prompts[::roots])) == tasks  # each task its own map
    assert len({r.seed for r in requests}) == len(requests)


def test_decode_bench_refuses_a_recipe_whose_strategy_is_not_tree_grpo() -> None:
    from dataclasses import replace

    from real_model_decode import first_turn, recipe_config

    config = recipe_config()
    config = replace(config, strategy=replace(config.strategy, name="chain"))
    with pytest.raises(ValueError, match=r"strategy\.name is 'chain'"):
        first_turn(config, _Policy())
