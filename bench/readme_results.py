"""Regenerate the site's results page and the README's headline table from
``docs/results/*.json``.

A maintainer's helper, run after ``bench/reproduce.py``: every figure on the page
(``docs/results.md``) is copied from a stored result (never typed), and whether each target is
met is computed from it; the README's table of headline results (between its ``headline
results`` markers) is made the same way and links to the page.

    python bench/readme_results.py

A figure whose dependencies changed since its commit is quoted with a stale label under it
(``staleness.stale_label``); the summary at the top says how many are current and stale.
"""
import functools
import json
import re
import sys
from pathlib import Path

import yaml

from readme_trees import section as where_trees_section
from staleness import changed_since, stale_label

ROOT = Path(__file__).resolve().parent.parent
R = {p.stem: json.loads(p.read_text()) for p in (ROOT / "docs/results").glob("*.json")
     if not p.stem.startswith("_")}


def res(name):
    return R[name]["result"]


QUOTED = []
"""The figures quoted, in order (for the summary at the top of *Results*)."""


@functools.cache
def stale(name):
    """Files the figure's run depended on that changed since its commit (empty: current)."""
    return changed_since(R[name]["commit"], R[name]["depends_on"])


def quote(name, keys):
    """A figure's marker, its JSON line, where it came from, and a stale label when a file
    its run depended on changed since (the figure stays: the label says what changed)."""
    r = res(name)
    sub = {k: r[k] for k in keys if k in r}
    QUOTED.append(name)
    label = f"\n\n{stale_label(name, R[name], stale(name))}" if stale(name) else ""
    return f"<!-- result: {name} -->\n`{json.dumps(sub)}`\n\n(`{R[name]['command']}`, commit {R[name]['commit'][:10]}, {R[name]['seconds']:.0f} s{', ' + R[name]['cpu'] if R[name].get('cpu') else ''}){label}"


def minutes(value):
    """Minutes as quoted, or why there are none (a run continued across invocations)."""
    return "?" if value is None else value


def f3(x):
    return f"{x:.3f}"


def ci(lo_hi):
    return f"[{lo_hi[0]:.3f}, {lo_hi[1]:.3f}]"


def met_word(ok):
    """How a target's verdict reads."""
    return "**met**" if ok else "**not met**"


PACKED_HOWTO = 'How it works (`treeroll/training/packed.py`, `treeroll/training/attention.py`): each group\'s\nleaves become a token trie; each unary run of the trie (a segment) is forwarded once, with\nthe cached keys and values of its root-to-parent path as prefix, and each token\'s loss weight\naggregates the leaves through it (advantages split by sign for the clipped surrogate). The\nbackward is depth first, so only one root-to-leaf chain of calls holds activations. The\npacked update equals the expanded one exactly (tests: float64 ≤ 1e-5, float32 ≤ 1e-3 on loss\nand every gradient, over chains, deep, wide and pruned trees, mixed batches, both\nnormalisations, KL, every estimator, a grouped-query-attention Qwen2).\n\nWhat made it faster than expanded at full step size:\n- **Attention without a mask.** A segment after a cached prefix needs "lower-right causal"\n  attention; transformers builds it as a dense mask, and with a mask PyTorch\'s CPU flash\n  kernel cannot skip the blocks above the diagonal (up to twice the attention work of a\n  long segment). treeroll\n  registers its own attention function with transformers for the packed update: the prefix\n  part and the causal part are computed by the fused kernel separately and merged exactly\n  through their log-sum-exps; the backward of each part runs against the merged output.\n- **Batching across parents.** Children of different segments (and different groups) share\n  one call, their prefixes gathered right-padded with a key mask, instead of one call per\n  parent.\n- **Cost-based grouping.** Segments are grouped into calls by dynamic programming over an\n  estimated cost (call overhead, padded tokens, attention to the prefix), instead of padding a\n  short segment to its long sibling.\n\nOn a GPU the same attention function falls back to PyTorch SDPA with an explicit mask (exact,\nnot the fused path). On an NVIDIA H200 (2026-12-04, `python bench/gpu_check.py`, with the device\nfix that is now on main; `docs/gpu/`) the packed update equalled the expanded one within\n5.4e-7 relative on the tree shapes of tests/test_packed.py.\n\n'

out = []
w = out.append
w("""# Results

Measured on this project's 2-core CPU machine, no GPU, by `python bench/reproduce.py`
(`--quick` for the quick figures, `--full` for all): each figure below is the last JSON line
of the command named under it, stored in `docs/results/NAME.json` with the commit it ran on;
`tests/test_results.py` fails if a quoted figure differs from its file, was measured on
uncommitted code, or is stale without saying so. A figure is *stale* when a file its run
imported or read (code, configs, the shipped weights, pinned dependencies) changed since its
commit: it stays quoted, with a line under it naming that commit, the first files that changed
and the command that remakes it (`python bench/reproduce.py --stale` remakes every stale one).
SUMMARY_PLACEHOLDER

Every FrozenLake figure says its convention: **rLLM** =
non-slippery, sizes 2–9, one action per turn, 2·size turns (PATR's benchmark). Held-out tasks
are the first 128 or 256 task seeds drawn from seed 42, never in the training pool (10,000
seeds drawn from seed 0; SFT's expert episodes come from that pool too, and
`tests/test_sft.py` checks the pools are disjoint); greedy decoding; 95% Wilson intervals.
Settings are chosen on a third pool, the **validation** tasks (`eval.pool: validation`: seeds
drawn from seed 7, skipping the training pool and the first 4,096 held-out seeds;
`tests/test_task_pools.py`), and reported on the held-out ones. The validation pool exists
since issue #33: the choices made before it (the base recipe's 250 steps, the default
training's learning rate and steps) were made looking at held-out success, so the held-out
figures of those settings may sit a little high; on 512 tasks the project had never used, the
base and a default-trained policy both scored about 5 points under their held-out figures
(issue #33), the gain held. The default training's format penalty (below) was chosen on the
validation pool.
""")

# ---------------------------------------------------------------- base


def shield_bullet():
    """The shield probe's bullet (what one local rule is worth)."""
    if "probe_shield" not in R:
        return ""
    sh = res("probe_shield")
    return f"""- What one local rule is worth: with a one-step *shield* on the environment's side (a
  diagnostic, `python bench/probe_shield.py`: a move into a hole is swapped for the safe move
  nearest the goal, {sh['moves_replaced']} moves swapped) the same base scores {f3(sh['shielded_success'])} {ci(sh['shielded_ci'])} on the
  same {sh['tasks']} tasks instead of {f3(sh['success'])}: "never step into a hole next to you" is worth {100 * sh['gain']:+.1f} points
  to this base. (On the previous base, which read no safe list, it was worth +26.6, yet RL
  raised that base by only about 5 points in every setting tried; probe figures of earlier
  code: `docs/sft_recipe/README.md`.)

{quote('probe_shield', ['success', 'ci', 'shielded_success', 'shielded_ci', 'gain', 'moves_replaced', 'tasks'])}
"""
sb, bp, bq = res("sft_base"), res("base_policy"), res("base_policy_quick")
SAFETENSORS_MB = (ROOT / "src/treeroll/policies/frozenlake-tiny/model.safetensors").stat().st_size / 1e6
w("### The shipped base policy `frozenlake-tiny` (rLLM convention)\n")
w(f"""Made by `treeroll sft --config configs/sft_frozenlake.yaml --export src/treeroll/policies/frozenlake-tiny`: {sb['steps']} steps, {sb['train_seconds'] / 60:.1f} min of training
and {sb['eval_seconds'] / 60:.1f} min of held-out evaluations on the 2 cores. `python bench/sft_base.py` runs that command
again into a temporary folder and compares the weights it makes with the shipped ones
({'identical, tensor for tensor' if sb['identical_to_shipped'] else f"not identical: largest difference {sb['max_abs_difference']:.2e}, held-out success {f3(sb['final_success'])} against the shipped {f3(bp['success'])}. The run is deterministic on one machine, but not across CPUs: 500 from-scratch steps at learning rate 2e-3 amplify a different float rounding. This one ran on {R['sft_base'].get('cpu', 'an unrecorded CPU')}; the shipped weights were made on a 2-core Intel Xeon, where the remake at commit 59e9ea6 gave them tensor for tensor (CHANGELOG)"}):

{quote('sft_base', ['final_success', 'final_ci', 'format_ok', 'tasks', 'steps', 'params', 'train_seconds', 'identical_to_shipped', 'max_abs_difference'])}

`python bench/base_policy.py` evaluates the shipped folder (256 held-out tasks), with where it
fails and how much room RL has:

{quote('base_policy', ['success', 'ci_low', 'ci_high', 'format_ok', 'params', 'tasks', 'by_size', 'needs_detour', 'direct', 'failed_in_hole', 'failed_out_of_turns', 'turns', 'misread_player', 'misread_goal', 'sample_temperature', 'sampled_success', 'pass_at_k', 'k'])}

- Greedy held-out success {f3(bp['success'])} [{f3(bp['ci_low'])}, {f3(bp['ci_high'])}] (target band 0.30–0.65:
  {'met' if 0.30 <= bp['success'] <= 0.65 else 'not met'}), well-formed replies {bp['format_ok']:.3f} (target ≥ 0.99: {'met' if bp['format_ok'] >= 0.99 else 'not met'}).
- Its failed episodes: {bp['failed_in_hole']} end in a hole and {bp['failed_out_of_turns']} run out of turns; its explanation names the
  wrong player cell in {bp['misread_player']} and the wrong goal cell in {bp['misread_goal']} of {bp['turns']} turns.
  It solves {bp['needs_detour'][0]:.3f} of the {bp['needs_detour'][1]} maps whose shortest path must detour around holes and
  {bp['direct'][0]:.3f} of the {bp['direct'][1]} others; by side 2–9: {' / '.join(f"{v[0]:.2f}" for v in bp['by_size'].values())}.
- Room for RL: one sample at temperature {bp['sample_temperature']:g} succeeds {bp['sampled_success']:.3f} of the time, and at least one of
  {bp['k']} samples solves {bp['pass_at_k']:.3f} of the tasks: the ceiling that sharpening the sampled policy can reach.
{shield_bullet()}
`python bench/base_policy.py --quick` (128 tasks; loads and evaluates in seconds, so
`treeroll eval --policy frozenlake-tiny` and `treeroll rollout` start sampling at once):

{quote('base_policy_quick', ['success', 'ci_low', 'ci_high', 'format_ok', 'params', 'tasks', 'load_seconds', 'seconds'])}
""")
w(f"""**Recipe.** A Llama with 4 layers, width 128, 4 heads, MLP 512 ({sb['params']:,} parameters, {SAFETENSORS_MB:.1f} MB
of safetensors weights, with its frozen word-level tokenizer), trained from scratch for 250 AdamW
steps (lr 2e-3, 100 warm-up steps, then constant) on 16 episodes a step of FrozenLake's
noisy shortest-path planner (`data.skill: 0.75`: a quarter of its moves random; those replies
stay in the context, showing off-path states, and out of the loss). Four choices made it
learn in minutes instead of not at all, and made RL able to raise it:

1. **Per-cell coordinate words** (`policy.view: cell_coordinates_safe`, see
   `treeroll.views`): every cell of the grid is one token naming its symbol and place
   (`O@2,3`), and the first grid is headed by a line naming the player's and the goal's cells
   (`P@5,3 G@5,6`); later observations show that line instead of the grid (the map never
   changes within an episode, so the history keeps all the grid's information in a tenth of
   the tokens). Per-cell coordinate tokens follow Ivanitskiy et al. (arXiv 2312.02566). The
   rLLM environment, its texts, rewards and parsing are unchanged; `plain` (the default view)
   is what a real model reads.
2. **The moves that do not land in a hole on the header line** (`P@5,3 G@5,6 safe Up
   Left`): what the player's neighbourhood says about the next move, in the words of the
   actions. treeroll had to choose here (rLLM's text shows only the grid): without it the
   base walked into holes in most of its failures and RL did not teach it to stop
   (`bench/probe_shield.py` above; `cell_coordinates_compact` is the same view without the
   list, the previous base's).
3. **Coordinates on a number line**: a cell word's embedding starts as `e_symbol + e_row +
   e_column` with `e_row`, `e_column` a random direction times the centred coordinate (plus
   noise), so "is the goal further down than me" is linear from the first step.
4. **A one-line explanation before each action** (`data.explain: true`,
   `data.explain_safe_moves: true`): the expert's reply is `P@5,3 G@5,6 safe Up Left` then
   `` ```Up``` `` (the brief reasoning rLLM's prompt asks for; the environment reads only the
   last backtick block). Copying the header is learned first and puts what the action depends
   on right before it. Without copying the list, SFT never learned to consult it, and RL from
   that base stalled near 0.61 (probes of 2026-12-04, earlier code).

What was tried on the way to this recipe (views, the explanation line, coordinate
initialisations, schedules, bases that RL could not raise) is recorded with its logs in
`docs/sft_recipe/README.md`; those runs were made on earlier states of the code, so their
figures are a record of the search, not figures of this code (the few quoted in this section
are theirs, labelled so). In short: without the
explanation line the same model stayed at the uniform-action loss; the explanation needed the
header line and the number-line coordinates; a base that did not copy the safe list gained
about 5 points in RL whatever the step size, KL, temperature, credit or batch. Not tried:
map-size curricula, other widths and depths, MLM-U-style objectives. The base stops at 250
steps so that its greedy success lands inside the band the issue asks for (room for RL to
show): the same recipe reaches about 0.80 at 300 steps. A reply is up to 12 tokens, so the
configs sample up to 16 a turn (`rollout.max_turn_tokens`).
""")

# ---------------------------------------------------------------- default training
def seeds_paragraph(dt):
    """The default training over seeds: what a user can expect, and why one run's figure is
    not reproduced to the digit on another machine."""
    if "over_seeds" not in dt:
        return ""
    ov, runs = dt["over_seeds"], dt["per_seed"]
    fin, gain = ov["final_success"], ov["gain"]
    rows = "\n".join(f"| {r['seed']} | {f3(r['final_success'])} {ci(r['final_ci'])} | {100 * r['gain']:+.1f} | {r['format_ok']:.3f} | {r['generated_tokens']:,} | {r['step_seconds'] / 60:.1f} |" for r in runs)
    return f"""
**Over {len(runs)} seeds** (`python bench/learning.py --seeds {' '.join(str(s) for s in ov['seeds'])}`: the same command with
`--seed` changed, which changes the training tasks drawn and the samples; the start and the
held-out tasks are the same): final success **{f3(fin['mean'])}** (sd {fin['sd']:.3f}, 95% t-interval {ci(fin['t95'])}), gain
{100 * gain['mean']:+.1f} points (sd {100 * gain['sd']:.1f}; {', '.join(f"seed {r['seed']} {100 * r['gain']:+.1f}" for r in runs if r['gain'] < 0.20) or 'none'} under the +20 of issue #9), every run's well-formed replies at least {ov['min_format_ok']:.3f} (target ≥ 0.95:
**{'met' if ov['min_format_ok'] >= 0.95 else 'not met'}**).

| seed | final success [95% Wilson] | gain | format_ok | generated tokens | minutes of steps |
|---|---|---|---|---|---|
{rows}

A single run's figure depends on the CPU's float rounding: the same command and seed on
another CPU (an Intel Xeon and an AMD EPYC here) computes losses that differ in the ninth
digit from the first step, and after some tens of steps the samples part; expect the spread
above, not the seed-0 figure to the digit.
"""


dt, lq = res("default_training"), res("learning_quick")
met = dt["gain"] >= 0.20 and dt["separated"]
w("### Default training (rLLM convention)\n")
w(f"""Command: `treeroll train --config configs/frozenlake_rllm.yaml` (the README's first command;
`python bench/learning.py` runs exactly it), from `frozenlake-tiny`: Tree-GRPO rollouts (M = 4,
N = 2, L = 1, so up to 12 leaves a task), advantages `grpo` over each task's leaves (one
group per task; Tree-GRPO's paper uses intra + inter-tree advantages, `--advantage.name
tree`), 16 tasks a step, {dt['steps']} steps, AdamW 1e-4, PPO-clip, one update a step, tree-packed,
up to 16 tokens a turn, a format penalty of 0.1 in the training reward (`env.frozenlake.format_penalty`:
a turn whose reply holds no valid action earns 0.1 less; success is rLLM's, unchanged;
without it greedy replies drifted into trailing backtick blocks late in training, so that one
turn in five was malformed: on the validation pool, seed 0, 0.773 well-formed replies and
0.738 success without, 1.000 and 0.809 with; chosen there); held-out = 256 tasks, greedy. Its `metrics.jsonl`, `summary.json` and `metrics.png` are in
`docs/default_training/`.

{quote('default_training', ['start_success', 'start_ci', 'final_success', 'final_ci', 'gain', 'separated', 'steps', 'tasks', 'format_ok', 'evals', 'generated_tokens', 'train_seconds', 'step_seconds', 'over_seeds', 'per_seed'])}
{seeds_paragraph(dt)}
| | held-out success (256 tasks) | 95% interval |
|---|---|---|
| start: `frozenlake-tiny` | {f3(dt['start_success'])} | {ci(dt['start_ci'])} |
| after {dt['steps']} RL steps | {f3(dt['final_success'])} | {ci(dt['final_ci'])} |

Its {dt['steps']} RL steps (rollouts and updates) took {dt['step_seconds'] / 60:.1f} min of training on the 2 cores (the issue's limit, 15: {'met' if dt['step_seconds'] <= 900 else 'not met'}), the
whole run {dt['train_seconds'] / 60:.1f} min with its held-out evaluations; {dt['generated_tokens']:,} generated tokens; the
evaluations along the way (step, success, tasks; the middle ones on the first 128 tasks):
{', '.join(f"{s}: {v:.3f} ({n})" for s, v, n in dt['evals'])}.

**The target {'is met' if met else 'is not met'}: {dt['gain'] * 100:+.1f} points{'' if met else ', not +20'}, the intervals {'do not overlap' if dt['separated'] else 'overlap'}.**

The run uses the engine's synchronous rounds, which sample the same trees as the loop before
the engine; the HF backend's kept branch-point logits equal a re-fed token's only within float
rounding, so over a run a few samples may differ from that loop's (`tests/test_engine.py`
pins the synchronous rounds to that loop's trees token for token on short rollouts).
""")
w("""What made it learn: the base. The previous shipped base read the same grid without the
safe list and explained its moves by copying only the two cells; RL raised it by about 5
points whatever was tried (step size, a KL term, nucleus sampling, temperature, TreeRL's and
GiGPO's per-turn credit, more epochs, a weaker or a longer-trained base: the logs and their
commands, on earlier code, are in `docs/sft_recipe/README.md`). At its fatal steps it already
put about a third of the action's probability on safe moves, and RL left it there. With the
safe list on the header and copied into the explanation before the action, the decision RL
has to sharpen is one the base already writes down; the figures above are what the same
training makes of it.
""")
w(f"""`python bench/learning.py --quick` (the same training cut to {lq['steps']} steps and 128 held-out tasks):

{quote('learning_quick', ['start_success', 'start_ci', 'final_success', 'final_ci', 'gain', 'separated', 'steps', 'tasks', 'generated_tokens', 'train_seconds', 'step_seconds'])}

(target `gain >= 0.10`: **{'met' if lq['gain'] >= 0.10 else 'not met'}**, {lq['gain'] * 100:+.1f} points in {lq['train_seconds'] / 60:.1f} min, both evaluations included.)
""")

# ---------------------------------------------------------------- a real model
if "real_model" in R:
    rm = res("real_model")
    rl_gain = rm["rl_final_success"]["success"] - rm["rl_start_success"]["success"]
    WHY = f"""Why the target is not met: the SFT base writes every reply in the format (well-formed
{rm["sft_success"]["format_ok"]:.3f}) but its moves rarely solve rLLM's grids: a 135M model reading a grid of up to 9x9 characters as text,
after only {rm["sft_steps"]} steps of 4 expert episodes ({minutes(rm["sft_minutes"])} min here). From a base at {f3(rm["rl_start_success"]["success"])} a Tree-GRPO group is most often all failures, with no
signal (of 6 independent leaves, {(1 - rm["rl_start_success"]["success"]) ** 6:.2f} of groups would be; shared prefixes make it more; the
run's own share was not recorded), and {rm["rl_steps"]} steps of 4 tasks are what {minutes(rm["rl_minutes"])} min
buy on two cores (the update runs forward and backward over every observation token of a
tree, at ~{rm["update_tokens_per_s"]:.0f} tokens/s). What would change it: a much longer SFT (the tiny
model's recipe takes 250 steps of 16 episodes), a faster update (LoRA, bfloat16), a
curriculum from small maps, or a GPU; none was run here yet.
"""
    w("### A real model: SmolLM2-135M-Instruct (rLLM convention, plain view)\n")
    w(f"""`python bench/real_model.py` on `--policy smollm2-135m-instruct` (a pretrained LLM from PyPI,
*A real model* below): the zero-shot figures, the engine's speeds on this model, Tree-GRPO
against chains, the llama.cpp gap, then SFT (`configs/smollm2_sft.yaml`) and RL from the SFT
policy (`configs/smollm2_rl.yaml`); held-out tasks drawn from seed 42, greedy, 95% Wilson
intervals; one seed.

{quote("real_model", ["params", "zero_shot_success", "zero_shot_ci95", "format_ok", "zero_shot_tasks", "decode_tokens_per_s", "decode_tokens_per_s_batch1", "update_tokens_per_s", "optimizer_step_s", "peak_rss_gib", "tree_over_chain_wall_per_leaf", "tree_over_chain_computed_per_leaf", "tree_generated_per_leaf", "chain_generated_per_leaf", "tree_computed_per_leaf", "chain_computed_per_leaf", "llamacpp_logprob_gap", "llamacpp_f32_logprob_gap", "sft_success", "sft_minutes", "rl_start_success", "rl_final_success", "rl_minutes", "rl_steps", "rl_separated"])}

| | held-out success | 95% interval | well-formed turns | minutes |
|---|---|---|---|---|
| zero-shot ({rm["zero_shot_tasks"]} tasks) | {f3(rm["zero_shot_success"])} | {ci(rm["zero_shot_ci95"])} | {rm["format_ok"]:.3f} | {rm["zero_shot_minutes"]} |
| after SFT ({rm["sft_success"]["tasks"]} tasks, {rm["sft_steps"]} steps) | {f3(rm["sft_success"]["success"])} | {ci(rm["sft_success"]["ci95"])} | {rm["sft_success"]["format_ok"]:.3f} | {minutes(rm["sft_minutes"])} |
| RL start (the SFT policy) | {f3(rm["rl_start_success"]["success"])} | {ci(rm["rl_start_success"]["ci95"])} | {rm["rl_start_success"]["format_ok"]:.3f} | |
| after RL ({rm["rl_steps"]} Tree-GRPO steps) | {f3(rm["rl_final_success"]["success"])} | {ci(rm["rl_final_success"]["ci95"])} | {rm["rl_final_success"]["format_ok"]:.3f} | {minutes(rm["rl_minutes"])} |

(target: RL +10 points over its start with separated intervals: **{'met' if rl_gain >= 0.10 and rm["rl_separated"] else 'not met'}**, {rl_gain * 100:+.1f} points{'' if rm["rl_separated"] else ', intervals overlap'}.)
{WHY if not (rl_gain >= 0.10 and rm["rl_separated"]) else ""}Tree-GRPO against chains matched leaf for leaf on this model: {rm["tree_over_chain_wall_per_leaf"]}x the
wall time and {rm["tree_over_chain_computed_per_leaf"]}x the computed tokens per leaf ({rm["tree_computed_per_leaf"]} against
{rm["chain_computed_per_leaf"]}; episodes cut to {rm["cost_turns"]} turns of at most 48 tokens, {rm["cost_tasks"]} tasks).
""")

# ---------------------------------------------------------------- the update's speed (#49)
if "real_model_update" in R:
    ru = res("real_model_update")
    w("### The update at a real model's speed (SmolLM2-135M-Instruct, issue #49)\n")
    w(f"""`python bench/real_model.py --update-only` times, on the same 4 expert episodes
({ru["update_tokens"]} tokens, {ru["update_model_tokens"]} of them the model's), the trainer's packed RL update, which
runs the output head and the softmax over the 49,152-word vocabulary only where a model token
is predicted, against transformers' own forward + backward (`labels=`, logits at every
position), both at the RL recipe's compute dtype (`{ru["update_dtype"]}`: `torch.autocast`, float32
master weights; `configs/smollm2_rl.yaml`'s `optim.loss.compute_dtype`) and in float32, and
the SFT loss; `{ru["cpu_capability"]}` kernels, 2 threads.

{quote("real_model_update", ["update_tokens_per_s", "update_dtype", "plain_fwd_bwd_tokens_per_s", "update_over_plain", "update_f32_tokens_per_s", "plain_f32_fwd_bwd_tokens_per_s", "update_f32_over_plain", "sft_fwd_bwd_tokens_per_s", "update_tokens", "update_model_tokens", "optimizer_step_s", "cpu_capability"])}

Against issue #49's update targets, read at the recipe's dtype (the update the recipe runs):
`update_over_plain` >= 1.0: {ru["update_over_plain"]} ({met_word(ru["update_over_plain"] >= 1.0)}; in float32
{ru["update_f32_over_plain"]}); `update_tokens_per_s` >= 2x the earlier 96.2 (192.4): {ru["update_tokens_per_s"]}
({met_word(ru["update_tokens_per_s"] >= 192.4)}; in float32 {ru["update_f32_tokens_per_s"]}, {met_word(ru["update_f32_tokens_per_s"] >= 192.4)}). The
earlier 96.2 was the SFT loss's forward + backward before the head change, on an Intel host
of this machine kind; the same loss runs {ru["sft_fwd_bwd_tokens_per_s"]} here with it. On a CPU whose kernels lack
bfloat16 (torch reports `{ru["cpu_capability"]}` here) autocast emulates it slowly: set
`optim.loss.compute_dtype: float32` there (the `update_f32_*` figures). The learning target
of #49 is measured in *Tree-GRPO on a real model* below.
""")

# ---------------------------------------------------------------- rollouts at the engine's speed (#49)
if "real_model_decode" in R:
    rd = res("real_model_decode")
    w("### Rollouts at the engine's speed (SmolLM2 recipe, issue #49)\n")
    w(f"""`python bench/real_model_decode.py` builds the RL recipe's policy (`{rd["decode_policy"]}`, the
`{rd["decode_view"]}` view) and backend (`{rd["decode_backend"]}`, in process, with the recipe's settings
`{json.dumps(rd["decode_backend_settings"])}`) as `treeroll train --config configs/smollm2_rl.yaml` does, and times one recipe step's
first turn: {rd["decode_batch"]} requests (8 tasks x Tree-GRPO's 4 roots), sampled as the engine samples a turn
(temperature 1, at most 48 tokens, stopping where the turn ends), against treeroll's HF
backend on the same requests; 2 threads.

{quote("real_model_decode", ["decode_tokens_per_s", "decode_hf_tokens_per_s", "decode_over_hf", "decode_tokens_per_s_batch1", "decode_hf_tokens_per_s_batch1", "decode_batch", "decode_prompt_tokens", "decode_reply_tokens", "decode_hf_reply_tokens", "decode_prefill_over_distinct", "decode_hf_prefill_over_distinct"])}

The engine samples the recipe's turn {rd["decode_over_hf"]}x as fast as the HF backend ({rd["decode_tokens_per_s"]} against
{rd["decode_hf_tokens_per_s"]} tokens/s, prompt processing included: a turn reads a {rd["decode_prompt_tokens"]:.0f}-token prompt and writes
{rd["decode_reply_tokens"]:.0f} tokens). Against issue #49's rollout target (`decode_tokens_per_s` >= 3x the earlier
65.5 = 196.5): {met_word(rd["decode_tokens_per_s"] >= 196.5)}. The earlier 65.5 was the HF backend sampling 64 tokens a
request without stopping (decoding alone), 16 requests, on an Intel host; decoding alone, the
engine ran 3.17x the HF backend on this host (`vllm_cpu` below, batch 16).
""")

# ---------------------------------------------------------------- RL that raises SmolLM2 (#49)
if "real_model_rl" in R:
    rr = res("real_model_rl")
    start, final = rr["rl_start_success"], rr["rl_final_success"]
    reached = rr["rl_gain"] >= 0.10 and rr["rl_separated"]
    # The figure says which recipe it ran: one measured before rl_backend was recorded is
    # the first recipe (HF backend, Tree-GRPO's own credit, untuned); one with it names its
    # sampler and credit, chosen on the validation pool (validation run C).
    if "rl_backend" in rr:
        rl_sampling = (f"rollouts through the {rr['rl_backend']} backend, "
                       f"{rr.get('rl_minibatches', 1)} minibatches a step, "
                       f"{rr.get('rl_advantage', 'grpo')} credit")
        rl_chosen = ("Settings chosen on the validation pool only\n"
                     "(`docs/smollm2_recipe.md`, validation runs A to C).")
    else:
        rl_sampling = "HF backend"
        rl_chosen = ("Settings were not tuned on the validation pool (one 2-step\n"
                     "pilot sized the steps).")
    w("### Tree-GRPO on a real model: SmolLM2-135M-Instruct from `smollm2-frozenlake` (issue #49)\n")
    w(f"""`python bench/real_model.py --rl-only` runs `configs/smollm2_rl.yaml` as a user would
(`treeroll train --config configs/smollm2_rl.yaml`): Tree-GRPO (M = 4, N = 2, L = 1) from the
shipped start `smollm2-frozenlake` (the registry's SmolLM2 with the LoRA adapter of
`configs/smollm2_sft.yaml` merged; every weight then trained, bfloat16 compute, float32
master weights), {rr["rl_tasks_per_step"]} tasks a step, learning rate {rr["rl_lr"]:g}, {rl_sampling}. FrozenLake
in rLLM's convention (its rules, sizes 2-9, its turn limits) read through the
`cell_coordinates_safe` view (cell words; each observation's header names the player's and the
goal's cells and the moves that do not land in a hole: `docs/smollm2_recipe.md` says
why and what that view alone is worth); 256 held-out tasks drawn from seed 42, greedy, 95%
Wilson intervals; one seed (0). {rl_chosen}

{quote("real_model_rl", ["rl_start_success", "rl_final_success", "rl_gain", "rl_separated", "rl_minutes", "rl_step_minutes", "rl_steps", "rl_step_rollout_s", "rl_step_update_s", "rl_signal_groups", "rl_train_success_first_last", "rl_generated_tokens", "rl_tasks_per_step", "rl_lr", "convention"])}

| | held-out success | 95% interval | well-formed turns |
|---|---|---|---|
| start (`smollm2-frozenlake`) | {f3(start["success"])} | {ci(start["ci95"])} | {start["format_ok"]:.3f} |
| after {rr["rl_steps"]} Tree-GRPO steps ({f'{rr["rl_minutes"]} min with both evaluations; ' if rr.get("rl_minutes") is not None else 'run over several invocations; '}the steps {rr["rl_step_minutes"]} min) | {f3(final["success"])} | {ci(final["ci95"])} | {final["format_ok"]:.3f} |

(issue #49's targets: start >= 0.20: {met_word(start["success"] >= 0.20)}; RL +10 points with
separated intervals: {met_word(reached)}, {rr["rl_gain"] * 100:+.1f} points.)
""")

# ---------------------------------------------------------------- trees vs chains on SmolLM2 (#49)
if "smollm2_compare" in R:
    sc = res("smollm2_compare")
    # how the leaves ended: figures from before bench/compare_strategies.py reported it lack it
    share = lambda figures, key: f"{figures[key]:.2f}" if key in figures else "not measured"
    w("### Trees against chains on a real model: SmolLM2 from `smollm2-frozenlake` (issue #49)\n")
    rows = []
    for arm in ("chain", "tree_grpo"):
        a = sc[arm]
        success, low, high = a["final_wilson95"]
        rows.append(f"| {arm} | {f3(success)} | {ci([low, high])} | {f3(a['start'])} | "
                    f"{a['generated_tokens']} | {a['generated_per_leaf']} | {a['computed_per_leaf']} | "
                    f"{a['wall_per_step_s']:.0f} ({a['rollout_per_step_s']:.0f} + {a['update_per_step_s']:.0f}) | "
                    f"{a['signal_groups']:.2f} | {share(a, 'ended_share')} | "
                    f"{share(a, 'budget_cut_share')} |")
    tree, chain = sc["tree_grpo"], sc["chain"]
    # per-leaf tokens compare leaves of different lengths where the budget cut one arm's
    cut_note = (f"""The budget cut {chain["budget_cut_share"]:.0%} of the chains' leaves before their episode ended and
{tree["budget_cut_share"]:.0%} of the tree's, so a tree leaf runs further into its episode: per-leaf tokens compare
leaves of different lengths, not the same work done twice.
""" if "budget_cut_share" in chain and "budget_cut_share" in tree else "")
    overlap = not (tree["final_wilson95"][1] > chain["final_wilson95"][2]
                   or chain["final_wilson95"][1] > tree["final_wilson95"][2])
    w(f"""`python bench/compare_strategies.py --config configs/smollm2_compare.yaml` trains Tree-GRPO
(M = 4, N = 2, L = 1) and independent chains (up to 16 a task) from the same start, with the
same budget of {sc["token_budget"]} generated tokens a task a step and the same {sc["steps"]} updates of
{sc["tasks_per_step"]} tasks, `configs/smollm2_rl.yaml`'s settings otherwise (the vLLM engine, GiGPO
credit by cell, learning rate 2e-5, bfloat16 compute); each arm in a process of its own. The
budget and sizes were chosen before any run (the config's header says why); one seed (0);
{sc["eval_tasks"]} held-out tasks drawn from seed 42, greedy, 95% Wilson intervals over tasks
(one seed: no interval over seeds); the `cell_coordinates_safe` view.

{quote("smollm2_compare", ["token_budget", "steps", "tasks_per_step", "eval_tasks", "chain", "tree_grpo"])}

| arm | held-out success | 95% interval | start | generated tokens | generated / leaf | computed / leaf | wall s / step (rollout + update) | groups with signal | leaves whose episode ended (goal or hole) | leaves cut by the budget |
|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Per leaf the tree generated {tree["generated_per_leaf"] / chain["generated_per_leaf"]:.2f}x and computed
{tree["computed_per_leaf"] / chain["computed_per_leaf"]:.2f}x what a chain did (computed: prompt tokens not
served from the engine's prefix cache, plus sampled ones), and a step took
{tree["wall_per_step_s"] / chain["wall_per_step_s"]:.2f}x the wall. Held-out success at the end:
{f3(tree["final_wilson95"][0])} against {f3(chain["final_wilson95"][0])}, intervals
{"overlapping: one seed of " + str(sc["steps"]) + " steps does not tell the two apart" if overlap else "separated"}.
{cut_note}Report, curves and an example tree of each arm: `docs/smollm2_compare/`;
what was read from it: `docs/smollm2_recipe.md`, *Trees against chains on SmolLM2*.
""")

# ---------------------------------------------------------------- vLLM for real
if "vllm_cpu" in R:
    vc = res("vllm_cpu")
    ratios = vc.get("train_first_abs_log_ratio", [])
    w("### The real vLLM engine on this CPU (SmolLM2-135M-Instruct, rLLM convention)\n")
    w(f"""`python bench/vllm_cpu.py` runs treeroll's `vllm` backend on vLLM's own CPU build
(`{vc["engine"]}`, in the `treeroll[vllm-cpu]` environment `bench/vllm_env.py` builds) with
`--policy smollm2-135m-instruct` held in float32 like the trainer; held-out tasks drawn from
seed 42; cost episodes cut to {vc["cost_turns"]} turns of at most 48 tokens.

{quote("vllm_cpu", ["computed_over_unique", "block_aligned_limit", "computed_over_block_limit", "b128_computed_over_unique", "b128_block_aligned_limit", "tree_over_chain_computed_per_leaf", "tree_over_chain_wall_per_leaf", "b128_tree_over_chain_wall_per_leaf", "tree_computed_per_leaf", "chain_computed_per_leaf", "decode_tokens_per_s_b16", "raw_decode_tokens_per_s_b16", "over_raw_b16", "decode_tokens_per_s_b1", "raw_decode_tokens_per_s_b1", "over_raw_b1", "hf_decode_tokens_per_s_b16", "hf_decode_tokens_per_s_b1", "logprob_gap_mean", "logprob_gap_max", "weight_update_s", "update_changes_samples", "update_restores_samples", "train_first_abs_log_ratio", "train_grad_norm", "train_minutes", "block_size"])}

| target (issue #48) | measured | |
|---|---|---|
| trees' `computed_over_unique` <= 1.1, beside the block-aligned limit | {vc["computed_over_unique"]} at {vc["block_size"]}-token blocks (limit {vc["block_aligned_limit"]}; the engine computes {vc["computed_over_block_limit"]}x the limit); vLLM's own 128: {vc.get("b128_computed_over_unique")} (limit {vc.get("b128_block_aligned_limit")}); 32 is the finest the CPU attention kernel takes | {met_word(vc["computed_over_block_limit"] <= 1.1)} against the block-aligned limit, as the target allows for; the absolute {vc["computed_over_unique"]} is {"above" if vc["computed_over_unique"] > 1.1 else "within"} 1.1 |
| tree / chain computed tokens per leaf < 1 | {vc["tree_over_chain_computed_per_leaf"]} ({vc["tree_computed_per_leaf"]} against {vc["chain_computed_per_leaf"]}); wall per leaf {vc["tree_over_chain_wall_per_leaf"]} | {met_word(vc["tree_over_chain_computed_per_leaf"] < 1)} |
| treeroll's rollouts decode at >= 0.8x the raw engine | {vc["over_raw_b16"]} at batch 16 ({vc["decode_tokens_per_s_b16"]} against {vc["raw_decode_tokens_per_s_b16"]} tokens/s), {vc["over_raw_b1"]} at batch 1 | {met_word(min(vc["over_raw_b16"], vc["over_raw_b1"]) >= 0.8)} |

The engine decodes {vc["decode_tokens_per_s_b16"] / vc["hf_decode_tokens_per_s_b16"]:.1f}x as fast as treeroll's HF backend at batch 16 on the same
requests ({vc["hf_decode_tokens_per_s_b16"]} tokens/s) and {vc["decode_tokens_per_s_b1"] / vc["hf_decode_tokens_per_s_b1"]:.1f}x at batch 1. Its logprobs are the trainer's within
{vc["logprob_gap_max"]:.1e} (mean {vc["logprob_gap_mean"]:.1e}, temperature 1); a weight update takes {vc["weight_update_s"]} s; a short
`treeroll train --policy smollm2-135m-instruct --backend.name vllm` ({vc.get("train_steps")} steps, {vc.get("train_minutes")} min) started
each update at a mean |log ratio| of {", ".join(f"{x:.1e}" for x in ratios)} (PPO's first ratio 1 within rounding). Its
groups had no signal (signal groups {vc.get("train_signal_groups")}: the zero-shot model fails every task), so its
updates left the weights as they were; that the next rollout samples from updated weights is
tested on the shipped base in CI (`tests/test_vllm_engine.py`: without the sync the second
step's first |log ratio| was 0.15).
""")

# ---------------------------------------------------------------- compare
JOBS_NOTE = ("Runs trained two at a time, one thread each (`jobs: 2`: a run computes what it\n"
             "computes alone; its wall time is that of a run sharing the 2 cores). ")
if "compare_strategies" in R:
    cs = res("compare_strategies")
    names = [k for k in ("chain", "tree_grpo", "random_tree", "patr") if k in cs]
    ccfg = yaml.safe_load((ROOT / "configs/compare_frozenlake.yaml").read_text())["base"]
    w("### Strategies under one budget (`treeroll compare`, rLLM convention)\n")
    w(f"""`python bench/compare_strategies.py` runs `treeroll compare --config
configs/compare_frozenlake.yaml`: from `frozenlake-tiny`, {cs['steps']} updates of {cs['tasks_per_step']} tasks, the same
budget of {cs['token_budget']} generated tokens per task per step for every strategy (a cap: a
strategy may spend less), AdamW {ccfg['optim']['lr']:g}, {cs['seeds']} seeds (the seed changes
the training tasks and the sampling); held-out success on {cs['eval_tasks']} tasks, greedy; intervals are 95%
t-intervals over seeds. {JOBS_NOTE if cs.get('jobs', 1) > 1 else ''}The report, its plot and an
example tree per strategy are in `docs/compare_frozenlake/`.

{quote('compare_strategies', ['seeds', 'steps', 'tasks_per_step', 'token_budget', *names, 'patr_minus_chain', 'patr_separated_from_chain', 'patr_tokens_over_chain'])}

| strategy | final held-out success | 95% interval | start | generated tokens | tokens to reach chain's final |
|---|---|---|---|---|---|""")
    for n in names:
        r = cs[n]
        t = r["tokens_to_chain_final"]
        w(f"| {n} | {r['final']:.3f} | {ci(r['ci95'])} | {r['start']:.3f} | {r['generated_tokens']:,} | {'never' if t is None else f'{t:,.0f}'} |")
    w("")
    w("![held-out success vs generated tokens](docs/compare_frozenlake/success_vs_tokens.png)\n")
    sep = cs.get("patr_separated_from_chain")
    ratio = cs.get("patr_tokens_over_chain")
    ch = cs["chain"]
    report = json.loads((ROOT / "docs/compare_frozenlake/results.json").read_text())
    per_seed = {n: [run["final_success"] for run in report[n]["runs"]] for n in names}
    signal = {n: report[n].get("signal_groups") for n in names}
    worst = min(per_seed["patr"]) if "patr" in per_seed else None
    w(f"""The budget, {cs['token_budget']} generated tokens per task per step, is about what the default training's
Tree-GRPO spends unconstrained on this base and half of what chain's 16 chains would
(`configs/compare_frozenlake.yaml` says how it was chosen): a cap, so the strategies that spend
less per leaf get more leaves. Generated tokens in
all: {', '.join(f"{n} {cs[n]['generated_tokens']:,}" for n in names)}. Task groups with a reward signal (not
all leaves equal): {', '.join(f"{n} {signal[n]:.2f}" for n in names)}. Final success per seed
(`docs/compare_frozenlake/report.md`, from the same run):

| strategy | seeds 0 / 1 / 2 / 3 / 4 |
|---|---|""")
    for n in names:
        w(f"| {n} | {' / '.join(f'{v:.3f}' for v in per_seed[n])} |")
    collapsed = worst is not None and worst < cs['patr']['start'] - 0.1
    c_lo, c_hi = cs["chain"]["ci95"]
    apart = [n for n in names if n != "chain" and (cs[n]["ci95"][0] > c_hi or cs[n]["ci95"][1] < c_lo)]
    verdict = ("No strategy separates from chain" if not apart else
               f"Separated from chain: {', '.join(apart)}; the others overlap it")
    w(f"""
{verdict}: Tree-GRPO ends {100 * (cs['tree_grpo']['final'] - cs['chain']['final']):+.1f} points from chain with
{cs['tree_grpo']['generated_tokens'] / cs['chain']['generated_tokens']:.2f} of its tokens, the random tree {100 * (cs['random_tree']['final'] - cs['chain']['final']):+.1f} with {cs['random_tree']['generated_tokens'] / cs['chain']['generated_tokens']:.2f}, PATR {100 * (cs['patr']['final'] - cs['chain']['final']):+.1f} with {cs['patr']['generated_tokens'] / cs['chain']['generated_tokens']:.2f}. In
{cs['steps']} updates the strategies moved the greedy held-out success from {cs['chain']['start']:.3f} to between {min(cs[n]['final'] for n in names):.3f} and {max(cs[n]['final'] for n in names):.3f}.
""")
    if collapsed:
        w(f"""PATR's mean is pulled down by one seed that collapsed (seed {per_seed['patr'].index(worst)}: {worst:.3f}; the seeds start at
{cs['patr']['start']:.3f} on average); its other four seeds end between {sorted(per_seed['patr'])[1]:.3f} and {max(per_seed['patr']):.3f}.
""")
    low_run = min(((v, n, i) for n in names for i, v in enumerate(per_seed[n])))
    w(f"""
This run's lowest seed is {low_run[1]}'s seed {low_run[2]} at {low_run[0]:.3f} (its other seeds
{min(v for i, v in enumerate(per_seed[low_run[1]]) if i != low_run[2]):.3f}–{max(v for i, v in enumerate(per_seed[low_run[1]]) if i != low_run[2]):.3f}); with single seeds
dropping like this from run to run, five seeds separate only large effects.
""")
    w(f"""Targets (PATR's paper: +9.3 over GRPO on this convention): PATR ends above chain with
separated intervals: **{'met' if sep else 'not met'}** ({cs['patr_minus_chain'] * 100:+.1f} points); PATR reaches chain's final success with at
most half of chain's tokens: **{'met' if ratio is not None and ratio <= 0.5 else 'not met'}** ({'never reached' if ratio is None else f'{ratio:.2f} of chain' + "'s"}).
""")
    every = ccfg["eval"]["every"]
    curves = {n: [[sum(run["curve"][i][k] for run in report[n]["runs"]) / len(report[n]["runs"])
                   for k in (0, 1)] for i in range(min(len(run["curve"])
                                                       for run in report[n]["runs"]))]
              for n in names}
    reach = next((i for i, (_, v) in enumerate(curves["patr"]) if v >= ch["final"] - 1e-12), None)
    first = {n: curves[n][1] for n in names}
    faster = all(first[n][1] > first["chain"][1] for n in names if n != "chain")
    w(f"""{'Per update the trees learn faster at first' if faster else 'At the first evaluation'}: after {every} updates (held-out success on the
same {cs['eval_tasks']} tasks as the final; the seeds' means) {', '.join(f"{n} {first[n][1]:.3f} with {first[n][0]:,.0f} tokens" for n in names)};
after {cs['steps']} they end as in the table. The token target takes the first point
of PATR's mean curve at or above chain's final success: {'none' if reach is None else f"its {reach * every}-update evaluation ({curves['patr'][reach][1]:.3f})"}.
""")

# ---------------------------------------------------------------- family
if "compare_family" in R:
    cf = res("compare_family")
    fam = [k for k in ("chain", "tree_grpo", "patr", "arpo", "rtpo", "igrpo", "chain+vigor")
           if k in cf]
    freport = json.loads((ROOT / "docs/compare_family/results.json").read_text())
    w("### The rest of the family under one budget (`treeroll compare`, rLLM convention)\n")
    w(f"""`python bench/compare_strategies.py --config configs/compare_family.yaml` runs ARPO, RTPO and
IGRPO (issue #12; `docs/methods.md` has each one's definition) beside chain, Tree-GRPO and
PATR: from `frozenlake-tiny`, {cf['steps']} updates of {cf['tasks_per_step']} tasks, {cf['token_budget']} generated tokens per task per step for
every strategy (a cap), {cf['seeds']} seeds, held-out success on {cf['eval_tasks']} tasks, greedy, 95% t-intervals over
seeds. It is shorter than the comparison above, so it shows what each strategy spends and
samples more than what it learns{', two runs at a time, one thread each (`jobs: 2`)' if cf.get('jobs', 1) > 1 else ''}. VIGOR is an allocator, not a strategy: `chain+vigor` is
chains whose leaves VIGOR moves between the tasks of each batch by reward variance (16 a task
on average, as chain's group). The report is in `docs/compare_family/`.

{quote('compare_family', ['seeds', 'steps', 'token_budget', *fam])}

| strategy | final held-out success | 95% interval | start | generated tokens | leaves per 1k tokens | groups with a signal | wall per run (s) |
|---|---|---|---|---|---|---|---|""")
    for n in fam:
        r, row = cf[n], freport[n]
        w(f"| {n} | {r['final']:.3f} | {ci(r['ci95'])} | {r['start']:.3f} | {r['generated_tokens']:,} | {row['leaves_per_1k_tokens']:.1f} | {row['signal_groups']:.2f} | {row['wall_seconds']:.0f} |")
    ch = cf["chain"]
    above = [n for n in fam if n != "chain" and cf[n]["ci95"][0] > ch["ci95"][1]]
    below = [n for n in fam if n != "chain" and cf[n]["ci95"][1] < ch["ci95"][0]]
    fseeds = {n: [run["final_success"] for run in freport[n]["runs"]] for n in fam}
    same = [n for n in fam if len(set(fseeds[n])) == 1 and len(fseeds[n]) > 1]
    w(f"""
What it shows: in {cf['steps']} updates {'no strategy separates from chain (every interval overlaps chain' + "'s)" if not above and not below else f"above chain with separated intervals: {', '.join(above) or 'none'}; below: {', '.join(below) or 'none'}"}; the
differences are in what they spend and sample. Generated tokens relative to chain:
{', '.join(f"{n} {cf[n]['generated_tokens'] / ch['generated_tokens']:.2f}" for n in fam if n != 'chain')}. Task groups with a reward
signal (not all leaves equal): chain {freport['chain']['signal_groups']:.2f}, {', '.join(f"{n} {freport[n]['signal_groups']:.2f}" for n in fam if n != 'chain')} (above chain's by 0.05 or more:
{', '.join(n for n in fam if freport[n]['signal_groups'] >= freport['chain']['signal_groups'] + 0.05) or 'none'}). VIGOR over chains spends what chain
spends (its rounds deal the same total) and ends {100 * (cf['chain+vigor']['final'] - ch['final']):+.1f} points from it.
""" if "chain+vigor" in cf else "")
    if same:
        w(f"""{', '.join(same)}: every seed ends at the same success ({', '.join(f"{fseeds[n][0]:.4f}" for n in same)}, i.e. the same count of 128
tasks) with different tokens spent (`docs/compare_family/results.json`), hence the zero-width interval.
""")

# ---------------------------------------------------------------- where trees pay off
w(where_trees_section(R, quote, ROOT))

# ---------------------------------------------------------------- allocation
ALLOC_ARMS = ("chain", "tree_grpo", "patr", "chain+vigor", "igrpo", "arpo")


def arms_of(al):
    """The allocation figure's methods, in the table's order."""
    return [k for k in ALLOC_ARMS if k in al]


def allocation_table(name, aopt, aeval):
    """The quoted line and the table of one allocation figure (``aopt`` / ``aeval``: the
    config's ``optim`` and ``eval`` blocks)."""
    al = res(name)
    arms = [k for k in ALLOC_ARMS if k in al]
    w(f"""{quote(name, ['target_success', 'gain', 'start_success', 'seeds', *arms])}

| method | tokens to target | relative to chain | final success | generated tokens |
|---|---|---|---|---|""")
    for n in arms:
        r = al[n]
        tt = "never" if r["tokens_to_target"] is None else f"{r['tokens_to_target']:,}"
        oc = "-" if r["over_chain"] is None else f"{r['over_chain']:.2f}"
        w(f"| {n} | {tt} | {oc} | {r['final_success']:.3f} | {r['generated_tokens']:,} |")
    reached = [n for n in arms if al[n]["tokens_to_target"] is not None]
    unsustained = [n for n in reached if al[n]["final_success"] < al["target_success"]]
    first = aeval["every"] / aopt["steps"]
    # a method that reached it at its first evaluation: its tokens to target are the tokens of
    # the first `every` updates, about `first` of its run's (at most, 1.2x for the uneven steps)
    at_first = [n for n in reached
                if al[n]["tokens_to_target"] <= 1.2 * first * al[n]["generated_tokens"]]
    w(f"""
Reached the target within the run: {', '.join(reached) if reached else 'none'}{f"; of these, {', '.join(unsustained)} ended below it again" if unsustained else ''}.
""")
    if at_first:
        w(f"""Reached at the first evaluation (after {aeval['every']} of {aopt['steps']} updates): {', '.join(at_first)}. The benchmark reads
success only at evaluations, so for these the ratio to chain is the ratio of the tokens each
spent in its first {aeval['every']} updates (a tree spends fewer under the same cap), not a measured
difference in how fast they learn; `configs/compare_hard.yaml`'s interpolated crossings, with
intervals, are the figure for that.
""")
    return al


current_alloc = [n for n in ("allocation", "allocation_quick") if n in R]
w("### Tokens to a fixed success (`bench/allocation.py`, rLLM convention)\n")
if current_alloc:
    acfg = yaml.safe_load((ROOT / "configs/allocation.yaml").read_text())
    aopt, aeval = acfg["base"]["optim"], acfg["base"]["eval"]
    w(f"""`python bench/allocation.py` trains chain, Tree-GRPO, PATR, VIGOR over chains
(`chain+vigor`), IGRPO and ARPO with `treeroll compare --config configs/allocation.yaml`: from
`frozenlake-tiny`, {aopt['steps']} updates of {aopt['tasks_per_step']} tasks, {acfg['token_budget']} generated tokens per task per step for each (a
cap), the config's seeds {acfg['seeds']} (`--quick`: the first only); held-out success (greedy) every {aeval['every']} updates on the same {aeval['tasks_during']} held-out
tasks, averaged over the seeds. The target is the start's success plus the stated gain;
`tokens_to_target` is the cumulative generated tokens (seed mean) at the first evaluation
whose seed-mean success reaches it (null: never reached), `over_chain` its ratio to chain's.
""")
for n in current_alloc:
    al = allocation_table(n, aopt, aeval)
    finals = [al[m]["final_success"] for m in arms_of(al)]
    verdict = ""
    if al["seeds"] > 1 and all(al[m]["tokens_to_target"] is None for m in arms_of(al)):
        verdict = (f"\nOver {al['seeds']} seeds no method's mean gains {al['gain']:.2f} within "
                   f"{aopt['steps']} updates (from {al['start_success']:.3f} to finals of "
                   f"{min(finals):.3f}–{max(finals):.3f}): with the base learning as slowly as "
                   "it does (issue #9), there is no gain yet for an allocation to reach "
                   "sooner, so this benchmark cannot rank the methods' token efficiency.")
    w(f"""One evaluation on 128 tasks has a 95% Wilson interval about +-0.085 wide around 0.57;
{al['seeds']} seed(s) averaged on the same tasks narrow the training noise, not the choice of tasks,
so a +{al['gain']:.2f} target can be reached and lost by noise. Anchors (VIGOR: 2.3x
fewer rollouts than GRPO, `chain+vigor` over chain <= 0.43; Tree-GRPO: a quarter of the
budget, <= 0.25): {'; '.join(f"{m} {al[m]['over_chain']:.2f}" + (' (within the anchor)' if al[m]['over_chain'] <= bound else ' (not within it)') for m, bound in (('chain+vigor', 0.43), ('tree_grpo', 0.25)) if al.get(m, {}).get('over_chain') is not None) or 'neither reached the target'}{'; a single crossing of a noisy curve, not a ranking of the methods' if al['seeds'] == 1 else ''}.{verdict}
""")

# ---------------------------------------------------------------- benchmarks
rc, pf, tc, pc, sf = (res(n) for n in ("rollout_cost_quick", "packed_full_step", "train_cost_quick", "patr_cost_quick", "swe_fork_quick"))
rs, es = res("rollout_scaling_quick"), res("engine_step")
w("""### Benchmarks

The rollout benchmarks run on the shipped base `frozenlake-tiny` (`bench/rollout_cost.py`,
`bench/rollout_scaling.py`, `bench/patr_cost.py`, `bench/engine_step.py`) or the default
config, which starts from it (`bench/packed_full_step.py`); `bench/train_cost.py` times the
loss alone on a from-scratch policy's small batches.
""")
w(f"""#### Rollout cost: Tree-GRPO vs chains on the engine (rLLM convention; SWE tasks)

Same leaves per task for both (chains matched task by task to the tree's), same tasks,
alternating order, the unsynchronised engine; the SWE setting drives the built-in tasks
through the HF backend with a from-config byte-level Llama (its replies are noise, so every
turn is an invalid command answered by the environment, but observations are long: the task
statement alone is about 1,500 bytes), environment steps on 4 threads.

{quote('rollout_cost_quick', ['computed_over_unique', 'forwarded_over_unique', 'boundary_tokens', 'replayed_turn_tokens', 'shared_tokens', 'reused_tokens', 'forwarded_over_needed', 'branch_points_refed', 'tree_over_chain_wall_per_leaf', 'swe_tree_over_chain_wall_per_leaf', 'chain_computed_over_unique', 'chain_forwarded_over_unique', 'tree_wall_per_leaf_ms', 'chain_wall_per_leaf_ms', 'continuous_tree_over_chain_wall_per_leaf', 'continuous_swe_tree_over_chain_wall_per_leaf', 'continuous_tree_wall_per_leaf_ms', 'continuous_chain_wall_per_leaf_ms', 'continuous_forwarded_over_unique', 'tree_generated_per_leaf', 'chain_generated_per_leaf', 'tree_computed_per_leaf', 'chain_computed_per_leaf', 'swe_tree_computed_per_leaf', 'swe_chain_computed_per_leaf', 'tree_leaves', 'swe_tree_leaves', 'tasks', 'swe_tasks', 'repeats'])}

- `computed_over_unique` {rc['computed_over_unique']:.3f} (target ≤ 1.001: **{'met' if rc['computed_over_unique'] <= 1.001 else 'not met'}**, and out of
  reach as defined: generated plus prefilled tokens count each turn's last sampled token
  twice, when it is sampled and when the next turn's prefill feeds it; that is the whole
  excess, `boundary_tokens` = computed - forwarded = {rc['boundary_tokens']}). What the target asks for, every
  position computed once, is `forwarded_over_unique`: tokens fed through the model over the
  trees' token-trie positions that must be fed, **{rc['forwarded_over_unique']:.4f}**{' (met)' if rc['forwarded_over_unique'] <= 1.001 else ''}. {rc['replayed_turn_tokens']} sampled tokens
  repeated, token for token, a turn sampled earlier in the same context (the sharp base's
  Tree-GRPO expansions often re-sample their chain's turn): {rc['shared_tokens']} were decoded in the same
  batch row as their twin (same call), {rc['reused_tokens']} were sampled from logits kept from an earlier
  call, with no forward (`backend.hf.replay`). Chains on the same tasks: {rc['chain_forwarded_over_unique']:.4f} (below 1:
  a batch's trees share the system prompt, which the per-tree trie counts once per tree).
  {rc['branch_points_refed']} requests re-fed a cached prompt's last token (the kept branch-point logits).
- Per leaf, Tree-GRPO's wall time over chains' on FrozenLake: {rc['tree_over_chain_wall_per_leaf']:.3f} (target < 0.8: **{'met' if rc['tree_over_chain_wall_per_leaf'] < 0.8 else 'not met'}**).
  The tree generates {rc['tree_generated_per_leaf']:.1f} tokens a leaf against the chains' {rc['chain_generated_per_leaf']:.1f} and computes {rc['tree_computed_per_leaf']:.1f} against
  {rc['chain_computed_per_leaf']:.1f} ({rc['tree_computed_per_leaf'] / rc['chain_computed_per_leaf']:.2f} of the chains' work per leaf): on these short episodes (the base
  solves small maps in a few turns) a branch saves only the turns before it, so the wall ratio
  cannot go below the work ratio; and with 8 tasks in flight the tiny model's decode steps are
  latency-bound (a step costs about the same for a few rows as for thirty), so the tree also
  pays for its second sequential phase, the expansions that start when their chain ends
  (`bench/rollout_scaling.py` below). With the growing KV cache (a decode step no longer
  copies the whole cache, a cost that grew with the cached tokens, which the chains hold more
  of) the chains' wall per leaf fell more than the tree's; the CHANGELOG has the before and after.
- On SWE tasks, with long observations: {rc['swe_tree_over_chain_wall_per_leaf']:.3f} (target < 0.6: **{'met' if rc['swe_tree_over_chain_wall_per_leaf'] < 0.6 else 'not met'}**); the tree
  computes {rc['swe_tree_computed_per_leaf']:.0f} tokens a leaf against the chains' {rc['swe_chain_computed_per_leaf']:.0f} ({rc['swe_tree_computed_per_leaf'] / rc['swe_chain_computed_per_leaf']:.2f} of their work{': the target is below that ratio, so no engine can meet it with these trees and 4-step episodes' if rc['swe_tree_computed_per_leaf'] / rc['swe_chain_computed_per_leaf'] >= 0.6 else ''}). Two repeats on a shared machine, so
  the ratio is noisy from run to run.
- The same comparisons with continuous batching (`rollout.continuous`): tree over chains
  {rc['continuous_tree_over_chain_wall_per_leaf']:.3f} on FrozenLake, {rc['continuous_swe_tree_over_chain_wall_per_leaf']:.3f} on SWE tasks; per leaf, the tree took {rc['continuous_tree_wall_per_leaf_ms']:.1f} ms
  continuous against {rc['tree_wall_per_leaf_ms']:.1f} ms in calls per round, the chains {rc['continuous_chain_wall_per_leaf_ms']:.1f} against {rc['chain_wall_per_leaf_ms']:.1f}
  ({'faster' if rc['continuous_tree_wall_per_leaf_ms'] < rc['tree_wall_per_leaf_ms'] and rc['continuous_chain_wall_per_leaf_ms'] < rc['chain_wall_per_leaf_ms'] else 'not faster'}: one call's FrozenLake replies end within a few tokens of each other, so there
  is little waiting to remove, and each join adds a prefill forward).
""")
sizes = [8, 32, 128]
w(f"""#### How the cost grows with the work in flight (`bench/rollout_scaling.py --quick`)

{quote('rollout_scaling_quick', [k for n in sizes for k in (f'tree_leaves_per_s_{n}', f'chain_leaves_per_s_{n}', f'tree_over_chain_wall_per_leaf_{n}')] + ['cache_bytes_per_token', 'repeats'])}

| tasks in flight | tree leaves/s | chain leaves/s | tree / chain wall per leaf |
|---|---|---|---|""")
for n in sizes:
    w(f"| {n} | {rs[f'tree_leaves_per_s_{n}']:.1f} | {rs[f'chain_leaves_per_s_{n}']:.1f} | {rs[f'tree_over_chain_wall_per_leaf_{n}']:.3f} |")
w(f"""
One repeat per size (noisy). {('The tree is cheaper per leaf than chains at every size, but nowhere below 0.8 of them' if all(rs[f'tree_over_chain_wall_per_leaf_{n}'] < 1 for n in sizes) else 'The tree is not cheaper per leaf than chains at every size')}:
its token saving on FrozenLake is small (above: a branch saves only the turns before it, and
the base solves small maps in a few turns). With few tasks in flight the decode step is
latency-bound, so the tree pays for its second sequential phase (more backend calls, each
waiting for its longest reply); with many, the HF backend decodes at most `max_batch_size`
(64) requests at once, so both strategies run as chunks of 64, and the tree's calls, more and
smaller, fill fewer of them. Each call also copies every request's cached prefix out of the
trie into the decode batch, a cost that grows with the context, not with the tokens
generated. The KV cache holds {rs['cache_bytes_per_token']:.0f} bytes per cached token
(4 layers × 2 × 4 heads × 32 dims × 4 bytes = 4,096: nothing is stored twice).

#### The new engine on the default training's batches (`bench/engine_step.py`)

The default config's rollouts (16 tasks a step), each step's tasks rolled out three times, in
synchronous rounds (the default: the loop every earlier figure used), unsynchronised
(each of a task's M trees expanded as soon as its chain ends) and with continuous batching,
each mode first in turn:

{quote('engine_step', ['sync_s', 'unsync_s', 'continuous_s', 'unsync_over_sync', 'continuous_over_sync', 'sync_backend_calls_per_step', 'unsync_backend_calls_per_step', 'sync_leaves_per_step', 'unsync_leaves_per_step', 'sync_generated_per_step', 'unsync_generated_per_step', 'steps', 'tasks_per_step'])}

Unsynchronised, a step needs fewer backend calls ({es['unsync_backend_calls_per_step']:.1f} against {es['sync_backend_calls_per_step']:.1f}) and takes {es['unsync_over_sync']:.2f}× the
time ({'at least as fast' if es['unsync_over_sync'] <= 1.0 else 'not faster'}): in process, one call costs what its decode steps cost, and the calls saved are the
small tail ones. Continuous batching takes {es['continuous_over_sync']:.2f}× the synchronous time. The default stays synchronous (the rounds of the released codes, token for
token the loop earlier figures used); the default training runs that way, and its figures
above were measured that way on this code.
""")
w(f"""#### Tree-packed update (rLLM convention)

**Default `treeroll train` step, packed vs expanded** (`bench/packed_full_step.py`: the default
config's policy, the shipped base, then 6 training steps of 16 tasks; each step's items go
through the trainer's own update twice, `optim.packed` on and off, on copies of the same model
and optimiser, order alternating; training continues from the packed copy; 2 threads):

{quote('packed_full_step', ['strategy', 'steps', 'threads', 'tasks_per_step', 'rollout_s', 'update_expanded_s', 'update_packed_s', 'step_expanded_s', 'step_packed_s', 'tokens_ratio', 'packed_over_expanded'])}

On the shipped base's trees the packed update forwards {pf['tokens_ratio']:.2f}× fewer tokens than the expanded
one and takes {pf['packed_over_expanded']:.2f}× its time.

**The loss alone on small batches** (`bench/train_cost.py --quick`, 2 tasks per strategy, 1 thread,
from-scratch policy): target `speedup_over_ideal` ≥ 0.8: **{'met' if tc['speedup_over_ideal'] >= 0.8 else 'not met'}** ({tc['speedup_over_ideal']:.3f}).

{quote('train_cost_quick', ['tokens_ratio', 'speedup', 'speedup_over_ideal', 'expanded_peak_mb', 'packed_peak_mb', 'tasks_per_strategy', 'repeats', 'threads'])}
""")
w(PACKED_HOWTO)
w(f"""#### PATR's cost (`bench/patr_cost.py --quick`, rLLM convention, the shipped base)

{quote('patr_cost_quick', ['scorer_time_fraction', 'leaves_per_1k_tokens_over_chain', 'leaves_per_1k_computed_over_chain', 'scorer', 'scorer_ms_per_node', 'k_turns', 'tasks', 'chain_group_size', 'policy'])}

Scoring costs {100 * pc['scorer_time_fraction']:.1f}% of rollout time (target < 10%: **{'met' if pc['scorer_time_fraction'] < 0.10 else 'not met'}**). PATR makes
{pc['leaves_per_1k_tokens_over_chain']:.2f}× the leaves per 1,000 generated tokens of chains (target ≥ 1.5: **{'met' if pc['leaves_per_1k_tokens_over_chain'] >= 1.5 else 'not met'}**). The
shipped base solves or fails most maps in a couple of turns (the chains' median episode is
{pc['chain']['median_leaf_depth']:g} turns, PATR's leaves' {pc['patr']['median_leaf_depth']:g}): PATR's survivors and expansions run longer than the
chains' episodes, so what its branches share is spent again on their length. (With the
from-scratch policy after a format warm start, `--policy none`, the figure was 1.30 on the
code before the engine; an ablation on older code, `docs/patr_ablation.md`, found pruning with
the paper's alpha = 0.5 barely acts on progress scores in [0, 1].)

#### SWE-style tasks (`bench/swe_fork.py --quick`)

{quote('swe_fork_quick', ['fork_ms', 'fork_mean_ms', 'step_median_ms', 'fork_over_step', 'steps', 'forks', 'sandbox_mode', 'tree_files', 'branch_own_files', 'full_copy_ms', 'task'])}

Forking a task's working tree (overlay copy-on-write of the files, counters, history) costs
{sf['fork_over_step']:.3f} of a median command step (target < 0.2: **{'met' if sf['fork_over_step'] < 0.2 else 'not met'}**).
""")

sb, rs = res("server_backend_quick"), res("ray_scaling_quick")
lb, lc, hb = sb["backends"]["llamacpp"], sb["backends"]["llamacpp_n_cmpl"], sb["backends"]["hf"]
w(f"""#### Through a llama.cpp server (`bench/server_backend.py --quick`, rLLM convention, the shipped base)

The rollout-cost measurement above, on the transformers backend and on a real `llama-server`
serving the same policy as GGUF ({sb['llamacpp_server']['slots']} slots, f32 KV cache, {sb['llamacpp_server']['threads']} threads), in one run; every run
starts from an empty cache:

{quote('server_backend_quick', ['computed_over_unique', 'tree_over_chain_wall_per_leaf', 'llamacpp_server', 'tasks', 'repeats', 'policy'])}

Through the server, a tree computes {lb['computed_over_unique']:.2f}× its unique tokens (the HF trie: {hb['computed_over_unique']:.2f}×): each sibling
request lands in its own slot and computes the shared prompt there. Sending a branch point's
children as one `n_cmpl` call (`share_prompts`) brings it to {lc['computed_over_unique']:.2f}× and the tree's wall per leaf
from {lb['tree_wall_per_leaf_ms']:.1f} to {lc['tree_wall_per_leaf_ms']:.1f} ms. Tree over chain wall per leaf: {lb['tree_over_chain_wall_per_leaf']:.3f} per request, {lc['tree_over_chain_wall_per_leaf']:.3f} with
`n_cmpl` (the chains' first turns share the root prompt through `n_cmpl` too), {hb['tree_over_chain_wall_per_leaf']:.3f} on the HF
backend.

#### Ray (`bench/ray_scaling.py --quick`, rLLM convention, the shipped base)

{quote('ray_scaling_quick', ['rollouts_per_second', 'local_rollouts_per_second', 'speedup_2_over_1', 'identical_to_local', 'tasks_per_batch', 'repeats', 'strategy'])}

Two Ray workers (one CPU and one torch thread each) make {rs['speedup_2_over_1']:.2f}× the rollouts per second of one on this
2-core machine, and every tree is the one-process tree (`identical_to_local`: {str(rs['identical_to_local']).lower()}).
""")

if "trl_adapter_quick" in R and "early_forks" not in res("trl_adapter_quick"):
    ta = res("trl_adapter_quick")  # measured before EarlyForks: Tree-GRPO cut to G only
    w(f"""#### TRL's GRPOTrainer with treeroll's rollout_func (`bench/trl_adapter.py --quick`, rLLM convention, the shipped base)

Three runs of TRL's real `GRPOTrainer` on the same prompts: TRL's own generation, treeroll's
`rollout_func` with independent chains, and with Tree-GRPO trees cut to G = 4.

{quote('trl_adapter_quick', ['tree_over_trl_tokens_per_completion', 'tree_over_chain_tokens_per_completion', 'tree_tokens_per_completion', 'chain_tokens_per_completion', 'model_tokens_per_row_tree', 'tree_wall_per_step', 'chain_wall_per_step'])}
""")
elif "trl_adapter_quick" in R:
    ta = res("trl_adapter_quick")
    w(f"""#### TRL's GRPOTrainer with treeroll's rollout_func (`bench/trl_adapter.py --quick`, rLLM convention, the shipped base)

Runs of TRL's real `GRPOTrainer` on the same prompts ({ta['tasks_per_step']} tasks per step, {ta['steps']} steps each): TRL's own
generation (G = 4), treeroll's `rollout_func` with G independent chains and with `EarlyForks`
trees of exactly G leaves (one chain, the other G - 1 leaves forked from it as it goes, each
at a turn drawn from its first {ta['early_forks']['within']}), at G = 4 and G = 8, and the adapter's earlier Tree-GRPO tree cut to
G = 4.

{quote('trl_adapter_quick', ['tree_over_chain_tokens_per_completion', 'tree_over_chain_tokens_per_completion_g8', 'tree_over_chain_wall_per_step', 'tree_over_chain_wall_per_step_g8', 'tree_grpo_cut_over_chain_tokens_per_completion', 'tree_tokens_per_completion', 'chain_tokens_per_completion', 'tree_g8_tokens_per_completion', 'chain_g8_tokens_per_completion', 'model_tokens_per_row_tree', 'model_tokens_per_row_chain', 'tree_wall_per_step', 'chain_wall_per_step', 'tree_g8_wall_per_step', 'chain_g8_wall_per_step', 'trl_tokens_per_completion', 'trl_wall_per_step'])}

Generated tokens per completion, tree over chain: {ta['tree_over_chain_tokens_per_completion']:.2f} at G = 4 ({ta['tree_tokens_per_completion']:.1f} against {ta['chain_tokens_per_completion']:.1f}) and
{ta['tree_over_chain_tokens_per_completion_g8']:.2f} at G = 8 ({ta['tree_g8_tokens_per_completion']:.1f} against {ta['chain_g8_tokens_per_completion']:.1f}); the Tree-GRPO tree cut to G cost {ta['tree_grpo_cut_over_chain_tokens_per_completion']:.2f}×.
Target (issue #39) below 0.8 at both: {met_word(ta['tree_over_chain_tokens_per_completion'] < 0.8 and ta['tree_over_chain_tokens_per_completion_g8'] < 0.8)}. Wall time per step, tree over chain:
{ta['tree_over_chain_wall_per_step']:.2f} at G = 4 and {ta['tree_over_chain_wall_per_step_g8']:.2f} at G = 8 (no worse than chains': {met_word(ta['tree_over_chain_wall_per_step'] <= 1.0 and ta['tree_over_chain_wall_per_step_g8'] <= 1.0)}; a few steps on two
tasks are noisy, and each run trains its own copy, so its episodes drift apart from the
others'). A tree row holds {ta['model_tokens_per_row_tree']:.1f} model tokens (a chain row {ta['model_tokens_per_row_chain']:.1f}): shared turns are
generated once. TRL's own generation cannot step the environment (its multi-turn hook needs a
chat template with tool calls, which the tiny policy lacks): its {ta['trl_tokens_per_completion']:.1f} tokens per completion
are one reply, not an episode.
""")
    if "tree_repeat_over_chain_tokens_per_completion" in ta:
        w(f"""
With `EarlyForks(on_end="repeat")` (every row a sample of the policy's episodes; a branch that
ends before its split repeats its row, decoding nothing): tokens per completion over chains'
{ta['tree_repeat_over_chain_tokens_per_completion']:.2f} at G = 4 and {ta['tree_repeat_over_chain_tokens_per_completion_g8']:.2f} at G = 8, wall per step {ta['tree_repeat_over_chain_wall_per_step']:.2f} and {ta['tree_repeat_over_chain_wall_per_step_g8']:.2f}. A repeated row
counts as a completion here, as it does for the trainer, but brings no new episode: fewer
distinct rows leave fewer groups with a reward signal (the frozen figure, *Exact-G trees* below).

{quote('trl_adapter_quick', ['tree_repeat_over_chain_tokens_per_completion', 'tree_repeat_over_chain_tokens_per_completion_g8', 'tree_repeat_over_chain_wall_per_step', 'tree_repeat_over_chain_wall_per_step_g8'])}
""")

if "trl_adapter" in R:
    tf = res("trl_adapter")
    w(f"""
Over {tf['steps']} steps (`python bench/trl_adapter.py`, the same runs five times longer): generated tokens
per completion, tree over chain, {tf['tree_over_chain_tokens_per_completion']:.2f} at G = 4 and {tf['tree_over_chain_tokens_per_completion_g8']:.2f} at G = 8 (below 0.8 at both:
{met_word(tf['tree_over_chain_tokens_per_completion'] < 0.8 and tf['tree_over_chain_tokens_per_completion_g8'] < 0.8)}); wall per step {tf['tree_over_chain_wall_per_step']:.2f} and {tf['tree_over_chain_wall_per_step_g8']:.2f}. A tree row holds {tf['model_tokens_per_row_tree']:.1f} model tokens at G = 4
against a chain row's {tf['model_tokens_per_row_chain']:.1f}: each run trains its own copy of the policy, and the
runs' episodes drift apart over the steps, so the quick run's 4 steps (on nearly the base
policy) are the shape's cost, and this longer one what training did to each run's episodes.

{quote('trl_adapter', ['tree_over_chain_tokens_per_completion', 'tree_over_chain_tokens_per_completion_g8', 'tree_over_chain_wall_per_step', 'tree_over_chain_wall_per_step_g8', 'model_tokens_per_row_tree', 'model_tokens_per_row_chain', 'tree_tokens_per_completion', 'chain_tokens_per_completion'])}
""")

if "trl_drift" in R:
    td = res("trl_drift")
    per_seed = ", ".join(f"{r:.2f}" for r in td["per_seed_tree_over_chain"])
    grew = [i for i, r in enumerate(td["per_seed_tree_over_chain"]) if r >= 1]
    drift_said = ("No tree run cost more than its chain run over 20 steps" if not grew else
                  f"So the 20-step figure at G = 4 holds {len(grew)} drifting run"
                  f"{'s' if len(grew) > 1 else ''}, not the shape's cost alone, and how often a "
                  f"tree run drifts is not known from {len(td['seeds'])} seeds")
    repeat_line = "" if "tree_repeat" not in td else (
        "With `on_end=\"repeat\"` (every row a sample of the policy's episodes) the tree costs "
        + ", ".join(f"{r:.2f}" for r in td["per_seed_tree_repeat_over_chain"])
        + " of the chains' tokens per completion per seed ("
        + f"{td['tree_repeat_over_chain_tokens_per_completion']:.2f} for the means, "
        + f"{td['tree_repeat_over_chain_tokens_per_completion_late']:.2f} over the last "
        + f"{td['steps'] // 2} steps; last-half row rewards "
        + ", ".join(f"{r['reward_late']:.2f}" for r in td["tree_repeat"]) + ").\n")
    w(f"""
The same two G = 4 runs at rollout seeds {', '.join(map(str, td['seeds']))} (`python bench/trl_drift.py`; the initial weights and
the tasks shared): tree over chain, generated tokens per completion, {per_seed} per seed,
{td['tree_over_chain_tokens_per_completion']:.2f} for the seeds' means and {td['tree_over_chain_tokens_per_completion_late']:.2f} over the last {td['steps'] // 2} steps. {len(grew)} of {len(td['seeds'])} tree runs cost more than
their chain runs ({', '.join(f"seed {td['seeds'][i]}: {td['tree'][i]['tokens_per_completion_late']:.0f} tokens a completion over the last half, row reward {td['tree'][i]['reward_early']:.2f} then {td['tree'][i]['reward_late']:.2f}" for i in grew) or 'none'}).
{drift_said} (chain's last-half row
rewards {', '.join(f"{r['reward_late']:.2f}" for r in td['chain'])}, the trees' {', '.join(f"{r['reward_late']:.2f}" for r in td['tree'])}).
{repeat_line}
{quote('trl_drift', ['tree_over_chain_tokens_per_completion', 'tree_over_chain_tokens_per_completion_late', 'per_seed_tree_over_chain', 'tree_repeat_over_chain_tokens_per_completion', 'per_seed_tree_repeat_over_chain'])}
""")

if "early_forks" in R:
    ef = res("early_forks")
    w(f"""#### Exact-G trees for a trainer's groups (`bench/early_forks.py`, rLLM convention, the shipped base)

`EarlyForks` (`treeroll.strategies`) against G independent chains on the same
{ef['tasks']} training tasks and the same frozen policy, temperature 1: generated tokens per row (tree
over chains), a row's own model tokens, the share of groups with a reward signal, and the wall
time to grow the groups (tree over chains).

{quote('early_forks', ['early_forks_g4_within4', 'early_forks_g8_within4', 'chain_g4', 'chain_g8'])}

| G | within | tokens per row, tree / chains | row tokens | groups with signal (chains) | wall, tree / chains |
|---|---|---|---|---|---|
""")
    for g in (4, 8):
        for within in (2, 4, 6):
            r, c = ef[f"early_forks_g{g}_within{within}"], ef[f"chain_g{g}"]
            w(f"| {g} | {within} | {r['tokens_ratio']:.2f} | {r['row_tokens']:.1f} | {r['signal']:.2f} ({c['signal']:.2f}) | {r['wall_ratio']:.2f} |\n")
    r4, r8 = ef["early_forks_g4_within4"], ef["early_forks_g8_within4"]
    w(f"""
At the default, `within = 4`, a tree row costs {r4['tokens_ratio']:.2f}× a chain row at G = 4 and {r8['tokens_ratio']:.2f}× at G = 8
(the issue's target, below 0.8 at both: {met_word(r4['tokens_ratio'] < 0.8 and r8['tokens_ratio'] < 0.8)}). Sharing more turns (a larger `within`) saves more
and leaves fewer groups with a reward signal, so the default was not raised to meet a cost
target. Forked rows run longer than chain rows: a fork starts from a branch still alive at its
turn.
""")
    if "early_forks_g4_within4_repeat" in ef:
        def repeat_row(g):
            r, f, c = (ef[f"early_forks_g{g}_within4_repeat"], ef[f"early_forks_g{g}_within4"],
                       ef[f"chain_g{g}"])
            return (f"| {g} | {c['row_tokens']:.1f} / {c['reward']:.3f} | {f['row_tokens']:.1f} / {f['reward']:.3f} | "
                    f"{r['row_tokens']:.1f} / {r['reward']:.3f} | {f['tokens_ratio']:.2f} / {r['tokens_ratio']:.2f} | "
                    f"{f['signal']:.2f} / {r['signal']:.2f} ({c['signal']:.2f}) |")
        longer = {e: [ef[f"early_forks_g{g}_within4{x}"]["row_tokens"] / ef[f"chain_g{g}"]["row_tokens"] - 1
                      for g in (4, 8)] for e, x in (("fork_last", ""), ("repeat", "_repeat"))}
        shown = {e: " and ".join(f"{100 * v:+.0f}%" for v in vs) for e, vs in longer.items()}
        w(f"""
The rule for a branch that ends before its split: `on_end="fork_last"` (the default) hands the
rows it still owes to a fork from its last turn, a second chance at the move that ended it, so
a group over-represents episodes that go on; `on_end="repeat"` makes them repeats of the ended
row, so that every row is, on its own, a sample of the policy's episodes (split turns are
fixed before the turns they split; `tests/test_early_forks.py` checks both on a coin-flip
environment). Here a row's own model tokens against a chain row's, at G = 4 and 8:
fork_last {shown['fork_last']}, repeat {shown['repeat']}. Row length and mean row reward, chain / fork_last / repeat, `within = 4`:

| G | chain row tokens / reward | fork_last | repeat | tokens per row over chain's, fork_last / repeat | signal, fork_last / repeat (chain) |
|---|---|---|---|---|---|
{repeat_row(4)}
{repeat_row(8)}

{quote('early_forks', ['early_forks_g4_within4_repeat', 'early_forks_g8_within4_repeat'])}
""")

if "fuzz_quick" in R:
    fz = res("fuzz_quick")
    w(f"""#### Fuzzing (`bench/fuzz.py --quick`)

The property tests' generators (`bench/fuzz_targets.py`: random text, decoded random bytes,
huge replies, control characters, nested backticks and tags, near misses of valid actions,
tool calls, editor lines and chat messages) on every reply parser, environment `step` and the
SFT JSONL reader, {fz['examples_per_target']} inputs each:

{quote('fuzz_quick', ['inputs_tried', 'exceptions', 'clear_errors', 'targets'])}

{fz['exceptions']} exceptions (target 0: **{'met' if fz['exceptions'] == 0 else 'not met'}**); the {fz['clear_errors']} clear errors are JSONL lines refused with a
message saying what is wrong, as their contract allows.
""")

if "crash_resume_quick" in R:
    cr = res("crash_resume_quick")
    w(f"""#### Crash and resume (`bench/crash_resume.py --quick`)

`treeroll train` on `configs/tiny.yaml` ({cr['steps']} steps) killed with SIGKILL {cr['kills']} times (of {cr.get('kills_promised', '?')} promised) at random moments
(kill seed {cr['kill_seed']}) and resumed each time, against the same run uninterrupted:

{quote('crash_resume_quick', ['kills', 'kills_promised', 'lost_steps', 'duplicated_steps', 'resumed_ok', 'records_equal', 'weights_equal'])}

Lost steps {cr['lost_steps']}, steps logged twice {cr['duplicated_steps']}; the resumed run's `metrics.jsonl` (wall times aside) and final
weights are the uninterrupted run's: **{'met' if cr['resumed_ok'] and cr['lost_steps'] == 0 and cr['duplicated_steps'] == 0 else 'not met'}**.
""")

HEADLINE_START, HEADLINE_END = "<!-- headline results -->", "<!-- end headline results -->"


HEADLINES = (
    ("default_training", "Default training, `frozenlake-tiny` (first command)",
     lambda d: f"{f3(d['start_success'])} -> {f3(d['final_success'])} {ci(d['final_ci'])}"),
    ("compare_hard", "PATR against chains, hard FrozenLake, one token budget",
     lambda c: f"{c['patr']['final']:.3f} against {c['chain']['final']:.3f} "
               f"({'separated' if c['patr_separated_from_chain'] else 'overlapping'})"),
    ("vllm_cpu", "Tree against chains on vLLM's CPU engine, computed tokens per leaf",
     lambda v: f"{v['tree_over_chain_computed_per_leaf']}x"),
    ("real_model_update", "Packed update on SmolLM2 against a plain forward+backward",
     lambda u: f"{u['update_over_plain']}x ({u['update_tokens_per_s']} tokens/s, {u['update_dtype']})"),
    ("smollm2_compare", "Tree-GRPO against chains on SmolLM2, same token budget and updates",
     lambda c: f"held-out {f3(c['tree_grpo']['final_wilson95'][0])} against "
               f"{f3(c['chain']['final_wilson95'][0])} after {c['steps']} steps, one seed "
               f"(from {f3(c['chain']['start'])})"),
    ("real_model_rl", "Tree-GRPO on SmolLM2 from `smollm2-frozenlake`",
     lambda r: f"{f3(r['rl_start_success']['success'])} -> "
               f"{f3(r['rl_final_success']['success'])} {ci(r['rl_final_success']['ci95'])}"),
)
"""The README's headline figures: name, what it shows, its value from the stored result."""


def headline(page: str) -> str:
    """The README's table: one row per headline figure, its state, and a link to the section
    of the results page that quotes it (the anchor MkDocs gives that section's heading)."""
    from markdown.extensions.toc import slugify

    rows = []
    for name, what, value in HEADLINES:
        if name not in R:
            continue
        marker = page.index(f"<!-- result: {name} -->")
        heading = next(line for line in reversed(page[:marker].splitlines())
                       if line.startswith("#"))
        anchor = slugify(heading.lstrip("#").strip().replace("`", ""), "-")
        state = "stale" if stale(name) else "current"
        rows.append(f"| {what} | {value(res(name))} | [{name}](docs/results.md#{anchor}) "
                    f"({state}) |")
    return "| result | figure | where (state) |\n|---|---|---|\n" + "\n".join(rows) + "\n"


QUOTED[:] = list(dict.fromkeys(QUOTED))  # a figure quoted in two places counts once
stale_names = [n for n in QUOTED if stale(n)]
summary = (f"**{len(QUOTED)} figures quoted: {len(QUOTED) - len(stale_names)} current, "
           f"{len(stale_names)} stale**" + (f" ({', '.join(f'`{n}`' for n in stale_names)})"
                                            if stale_names else "") + ".")
out[:] = [part.replace("SUMMARY_PLACEHOLDER", summary) for part in out]
page = "\n".join(out).rstrip() + "\n"
page = re.sub(r"^#(#+) ", lambda m: m.group(1) + " ", page, flags=re.M)  # sections up a level
page = page.replace("](docs/", "](")  # the page lives in docs/
text = (ROOT / "README.md").read_text()
start, end = text.index(HEADLINE_START), text.index(HEADLINE_END)
readme = text[:start] + HEADLINE_START + "\n" + headline(page) + text[end:]
if "--check" in sys.argv[1:]:  # tests/test_results.py: is the README's table generated?
    # (the results page's stale labels list the changed files, so they move with every code
    # change; test_results checks that each stale figure there carries its label)
    if text != readme:
        raise SystemExit("README.md's headline table differs from what `python "
                         "bench/readme_results.py` generates from docs/results/: run it")
    print("the README's headline table is as generated")
else:
    (ROOT / "docs" / "results.md").write_text(page)
    (ROOT / "README.md").write_text(readme)
    print("docs/results.md and the README's headline table regenerated")
