"""Probe (issue #9): does a view that shows the player's neighbouring cells make RL learn?

The shipped base reads ``cell_coordinates_compact``: after the first observation only the
player's and the goal's cells are shown, so avoiding a hole means recalling it from the first
grid. ``python bench/base_policy.py`` finds the base failing 109 of its 114 failed episodes in
a hole and never solving a map that needs a detour. This probe adds the four neighbouring
cells to that header line (``P@3,3 G@5,6 _@2,3 O@4,3 _@3,2 _@3,4``: up, down, left, right, the
ones inside the map), registers it as the view ``cell_coordinates_local`` in this process only
(it is not part of the package: a probe, not a figure), and then

1. makes a base with the shipped recipe (``configs/sft_frozenlake.yaml``, this view,
   ``--optim.steps`` as given) into a temporary folder (the package's policy is left alone),
2. evaluates it as ``bench/base_policy.py`` does (``--tasks`` held-out tasks, greedy),
3. trains it as ``bench/learning.py --quick`` does (the default RL config, 90 steps).

``--view moves`` registers ``cell_coordinates_moves`` instead: the header line gets, for each
action, the symbol of the cell that move lands on (``P@5,3 G@5,6 Up _ Down O Left _ Right
_``; a move into the map's edge lands on the player, ``P``), so that the word after an
action's own name says whether it ends in a hole (``bench/probe_shield.py``: never stepping
into a hole next to the player would lift the shipped base from 0.555 to 0.820).

    python bench/probe_local_view.py --sft-steps 500      # about 16 minutes on 2 cores
    python bench/probe_local_view.py --view moves
    python bench/probe_local_view.py --view safe     # only the actions that avoid a hole
    python bench/probe_local_view.py --view safe --full             # the 240-step training
    python bench/probe_local_view.py --view safe --explain-safe --sft-steps 250 \
        --max-turn-tokens 16     # the expert's explanation line copies the safe list too

``--explain-safe`` (with ``--view safe``) patches, in this process only, FrozenLake's expert
so that its explanation line also lists the safe actions as the header shows them
(``P@5,3 G@5,6 safe Up Left`` then the action): the policy then learns to write the list
before it acts. The reply is up to 12 tokens long, so ``--max-turn-tokens`` should leave room
(16) in SFT's evaluations and in RL. ``--full`` trains with the full default RL run
(``bench/learning.py`` without ``--quick``: 240 steps, 256 held-out tasks) instead of the
quick one.

Each stage's last JSON line is printed as it ends; the last line joins them.

The probe's recorded results (``probe_*.json``, removed from ``docs/sft_recipe/`` on
2026-12-05 and read from git history as that folder's README says) ran on commit 4338bb0 and
before, when the quick RL run was 90 steps and the full one 240; both are shorter now (the
default training fits 15 minutes), so rerunning it today trains for fewer steps. Since then
the package ships the safe view and the explanation that copies its list (the shipped base's
recipe, ``configs/sft_frozenlake.yaml``); the probe uses the package's view for ``safe``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import runpy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from treeroll.views import CELL_WORD_PATTERN, VIEWS, View, cell_coordinates_compact, cell_words

ROOT = Path(__file__).resolve().parent.parent
_NEIGHBOURS = ((-1, 0), (1, 0), (0, -1), (0, 1))


def cell_coordinates_local(text: str, first: bool = True) -> str:
    """``cell_coordinates_compact`` with the player's neighbouring cells (up, down, left,
    right; those inside the map) added to the header line of every observation."""
    compact = cell_coordinates_compact(text, first)
    words = {}
    for word in " ".join(cell_coordinates_compact(text, True).split("\n")).split(" "):
        if "@" in word and "," in word:
            where = word.partition("@")[2]
            row, _, column = where.partition(",")
            if row.isdigit() and column.isdigit():
                words.setdefault((int(row), int(column)), []).append(word)
    lines = compact.split("\n")
    for index, line in enumerate(lines):
        cells = line.split(" ")
        if cells and cells[0][:1] in "PX\u221a" and "@" in cells[0] and len(cells) <= 2:
            row, column = map(int, cells[0].partition("@")[2].split(","))
            near = [words[(row + dr, column + dc)][-1] for dr, dc in _NEIGHBOURS
                    if (row + dr, column + dc) in words]
            lines[index] = " ".join(cells + near)
            break
    return "\n".join(lines)


_ACTIONS = (("Up", (-1, 0)), ("Down", (1, 0)), ("Left", (0, -1)), ("Right", (0, 1)))


def cell_coordinates_moves(text: str, first: bool = True) -> str:
    """``cell_coordinates_compact`` with, on the header line of every observation, each
    action's name followed by the symbol of the cell it lands on (``P``: the map's edge)."""
    compact = cell_coordinates_compact(text, first)
    symbols = {}
    for word in " ".join(cell_coordinates_compact(text, True).split("\n")).split(" "):
        if "@" in word and "," in word:
            row, _, column = word.partition("@")[2].partition(",")
            if row.isdigit() and column.isdigit():
                symbols[(int(row), int(column))] = word[0]
    lines = compact.split("\n")
    for index, line in enumerate(lines):
        cells = line.split(" ")
        if cells and cells[0][:1] in "PX\u221a" and "@" in cells[0] and len(cells) <= 2:
            row, column = map(int, cells[0].partition("@")[2].split(","))
            moves = []
            for name, (dr, dc) in _ACTIONS:
                moves += [name, symbols.get((row + dr, column + dc), "P")]
            lines[index] = " ".join(cells + moves)
            break
    return "\n".join(lines)


def cell_coordinates_safe(text: str, first: bool = True) -> str:
    """``cell_coordinates_moves`` reduced to the actions that land on ice or the goal, after
    the word ``safe`` (``P@5,3 G@5,6 safe Up Left``): avoiding a hole becomes copying one
    of the listed words."""
    moves = cell_coordinates_moves(text, first)
    lines = moves.split("\n")
    for index, line in enumerate(lines):
        words = line.split(" ")
        if len(words) == 10 and words[2] == "Up" and "@" in words[0]:
            safe = [words[i] for i in range(2, 10, 2) if words[i + 1] in ("_", "G")]
            lines[index] = " ".join([*words[:2], "safe", *safe])
            break
    return "\n".join(lines)


def explain_the_safe_list() -> None:
    """Make FrozenLake's expert (in this process) append ``safe`` and the actions that land
    on ice or the goal to its explanation line, as :func:`cell_coordinates_safe` writes them
    on the header (``P@5,3 G@5,6 safe Up Left``)."""
    from treeroll.envs.frozenlake import FrozenLakeEnv

    planner = FrozenLakeEnv.expert_reply

    def expert_reply(self: Any, rng: Any, skill: float = 1.0, *, explain: bool = False) -> Any:
        reply = planner(self, rng, skill, explain=explain)
        if not explain or self.config.convention != "rllm":
            return reply
        header = cell_coordinates_safe(f"x\n{self.render()}\ny", True).split("\n")[1]
        line, _, action = reply.text.partition("\n")
        return type(reply)(f"{line} safe{header.partition(' safe')[2]}\n{action}",
                           reply.is_expert)

    FrozenLakeEnv.expert_reply = expert_reply  # type: ignore[method-assign]


PROBE_VIEWS = {"local": ("cell_coordinates_local", cell_coordinates_local),
               "moves": ("cell_coordinates_moves", cell_coordinates_moves),
               "safe": ("cell_coordinates_safe", cell_coordinates_safe)}


def _last_json(stage: str, path: str, argv: list[str]) -> dict[str, Any]:
    """Run a bench script or the CLI in this process (so the view stays registered) and
    return the JSON object its output ends with."""
    out = io.StringIO()
    sys.argv = [path, *argv]
    tick = time.perf_counter()
    with contextlib.redirect_stdout(out):
        try:
            if path.endswith(".py"):
                runpy.run_path(path, run_name="__main__")
            else:
                runpy.run_module(path, run_name="__main__")
        except SystemExit as exit_:
            if exit_.code not in (0, None):
                raise
    lines = [line for line in out.getvalue().splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    result["stage_seconds"] = round(time.perf_counter() - tick, 1)
    print(json.dumps({"stage": stage, **result}), flush=True)
    return result


def main() -> None:
    """Make, evaluate and train the probe's base; print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-steps", type=int, default=500)
    parser.add_argument("--tasks", type=int, default=256)
    parser.add_argument("--skip-rl", action="store_true")
    parser.add_argument("--view", choices=sorted(PROBE_VIEWS), default="local")
    parser.add_argument("--explain-safe", action="store_true",
                        help="the expert's explanation line also lists the safe actions")
    parser.add_argument("--max-turn-tokens", type=int, default=None,
                        help="rollout.max_turn_tokens for SFT's evaluations and RL "
                        "(default: the configs' 12)")
    parser.add_argument("--full", action="store_true",
                        help="the full default RL run instead of the quick one")
    parser.add_argument("--rl-config", default=str(ROOT / "configs" / "frozenlake_rllm.yaml"),
                        help="the RL config the base is trained with (its policy.init is "
                        "replaced by the probe's base)")
    args = parser.parse_args()
    view, function = PROBE_VIEWS[args.view]
    if view not in VIEWS:  # the package ships the safe view since the probe found it
        VIEWS.register(view, View(function, words=cell_words, word_pattern=CELL_WORD_PATTERN,
                                  coordinate_words=True))
    if args.explain_safe:
        if args.view != "safe":
            parser.error("--explain-safe copies the safe view's list: use it with --view safe")
        explain_the_safe_list()
    cap = ([] if args.max_turn_tokens is None
           else ["--rollout.max-turn-tokens", str(args.max_turn_tokens)])
    work = Path(tempfile.mkdtemp(prefix="treeroll-probe-local-"))
    export = work / "policy"
    sft = _last_json("sft", "treeroll.cli.commands", [
        "sft", "--config", str(ROOT / "configs" / "sft_frozenlake.yaml"), "--name", "sft_local",
        "--runs-dir", str(work / "runs"), "--policy.view", view,
        "--optim.steps", str(args.sft_steps), "--export", str(export), *cap])
    base = _last_json("base", str(ROOT / "bench" / "base_policy.py"),
                      ["--policy", str(export), "--tasks", str(args.tasks)])
    rl: dict[str, Any] = {}
    if not args.skip_rl:
        config = yaml.safe_load(Path(args.rl_config).read_text())
        config["policy"]["init"] = str(export)
        if args.max_turn_tokens is not None:
            config["rollout"]["max_turn_tokens"] = args.max_turn_tokens
        (work / "rl.yaml").write_text(yaml.safe_dump(config))
        rl = _last_json("rl", str(ROOT / "bench" / "learning.py"),
                        [*([] if args.full else ["--quick"]), "--config", str(work / "rl.yaml"),
                         "--runs-dir", str(work / "runs")])
    keys = ("success", "ci_low", "ci_high", "format_ok", "by_size", "needs_detour", "direct",
            "failed_in_hole", "sampled_success", "pass_at_k")
    print(json.dumps({"view": view, "rl_config": args.rl_config, "sft_steps": args.sft_steps,
                      "explain_safe": args.explain_safe, "full": args.full,
                      "max_turn_tokens": args.max_turn_tokens,
                      "sft": {k: sft.get(k) for k in sft if not isinstance(sft[k], dict)},
                      "base": {k: base.get(k) for k in keys},
                      "rl": {k: rl.get(k) for k in ("start_success", "final_success", "gain",
                                                    "start_ci", "final_ci", "train_seconds",
                                                    "generated_tokens")},
                      "work": str(work)}))


if __name__ == "__main__":
    main()
