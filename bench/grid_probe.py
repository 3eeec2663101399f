"""Can the embedded from-scratch policy learn to read a FrozenLake grid at all?

A supervised probe, not RL: one rLLM-convention observation in (the system prompt and a grid,
after 0-3 random non-fatal moves so the player is not always on the start cell), then the
reply's opening backticks; the loss is cross-entropy between the model's next-token logits
restricted to the four action words and the uniform distribution over the shortest-path
planner's best actions (``FrozenLakeEnv.planner_actions``). Every ``--every`` steps it
reports, on 300 held-out states (seeds drawn from 900,000-900,299), the share whose greedy
action is one of the planner's best. The best constant action scores about 0.39 on them.

The README quotes it: the default model (2 layers, 64 wide) stays at the constant-action
level for ~1,600 steps of 32 states (lr 1e-3) and then starts to learn.

    python bench/grid_probe.py --steps 2000            # ~6 minutes on 2 CPU cores
    python bench/grid_probe.py --hidden 128 --layers 4 --steps 400

Last line: one JSON object with the accuracy curve and the final accuracy.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from treeroll.envs.frozenlake import FrozenLakeEnv, make_frozenlake
from treeroll.envs.frozenlake_maps import ACTION_NAMES
from treeroll.formatting import TurnFormat
from treeroll.policies.model import ModelConfig, build_model, build_word_tokenizer


def sample_state(seed: int, rng: np.random.Generator) -> tuple[FrozenLakeEnv, str]:
    """The map of ``seed`` after 0-3 random moves that neither end nor leave the episode, and
    the observation the policy would see there."""
    env = make_frozenlake("rllm")
    observation = env.reset(seed)
    for _ in range(int(rng.integers(0, 4))):
        fork = env.fork()
        text, _, terminated, truncated, _ = fork.step(
            f"```{ACTION_NAMES[int(rng.integers(len(ACTION_NAMES)))]}```")
        if terminated or truncated:
            break
        env, observation = fork, text
    return env, observation


def main() -> None:
    """Train the probe; print the curve, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    env = make_frozenlake("rllm")
    tokenizer = build_word_tokenizer(env.vocabulary_texts())
    turn_format = TurnFormat(tokenizer)
    model = build_model(len(tokenizer), ModelConfig(
        hidden_size=args.hidden, num_layers=args.layers, num_heads=4,
        intermediate_size=4 * args.hidden), pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id)
    actions = [tokenizer.encode(name, add_special_tokens=False)[0] for name in ACTION_NAMES]
    opening = tokenizer.encode("```", add_special_tokens=False)

    def batch(pool: np.ndarray, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``size`` states of seeds drawn from ``pool``: right-padded prompts, the index of
        each one's last token, and the target distributions."""
        prompts, targets = [], []
        for seed in rng.choice(pool, size):
            state, observation = sample_state(int(seed), rng)
            ids, _ = turn_format.prompt(state.system_prompt, observation)
            prompts.append(ids + opening)
            best = state.planner_actions(state.position)
            targets.append([1.0 / len(best) if a in best else 0.0
                            for a in range(len(ACTION_NAMES))])
        ids = torch.zeros(len(prompts), max(len(p) for p in prompts), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = torch.tensor(prompt)
        last = torch.tensor([len(p) - 1 for p in prompts])
        return ids, last, torch.tensor(targets)

    def action_logits(ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids).logits[torch.arange(len(last)), last][:, actions]

    test_ids, test_last, test_target = batch(np.arange(900_000, 900_300), 300)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    curve: list[tuple[int, float]] = []
    start = time.perf_counter()
    for step in range(args.steps + 1):
        if step % args.every == 0 or step == args.steps:
            with torch.no_grad():
                greedy = action_logits(test_ids, test_last).argmax(-1)
            accuracy = float((test_target[torch.arange(len(greedy)), greedy] > 0).float().mean())
            curve.append((step, round(accuracy, 3)))
            print(f"step {step}: greedy action optimal on {accuracy:.3f} of held-out states "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
        if step == args.steps:
            break
        ids, last, target = batch(np.arange(100_000), args.batch)
        loss = -(target * torch.log_softmax(action_logits(ids, last), -1)).sum(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(json.dumps({"hidden": args.hidden, "layers": args.layers, "steps": args.steps,
                      "batch": args.batch, "lr": args.lr, "final_accuracy": curve[-1][1],
                      "curve": curve, "seconds": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    main()
