"""Remake the shipped base policy with its own command and compare it with the shipped one.

Runs ``treeroll sft --config configs/sft_frozenlake.yaml`` into a temporary folder (nothing is
exported: the package's policy is left as it is), then compares the weights it made with
``src/treeroll/policies/frozenlake-tiny`` tensor by tensor.

    python bench/sft_base.py            # about 5 minutes on 2 cores

Last line: one JSON object with the run's held-out success before and after (256 tasks,
greedy, rLLM convention) and its interval, ``train_seconds``, ``eval_seconds``, ``params``,
``identical_to_shipped`` (every tensor equal) and ``max_abs_difference``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "src" / "treeroll" / "policies" / "frozenlake-tiny" / "model.safetensors"


def main() -> None:
    """Run the SFT stage, compare, print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "sft_frozenlake.yaml"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="treeroll-sft-base-") as runs:
        subprocess.run([sys.executable, "-m", "treeroll.cli", "sft", "--config", args.config,
                        "--runs-dir", runs, "--name", "base", "--export", "None"], cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL)
        run = Path(runs) / "base"
        summary = json.loads((run / "summary.json").read_text())
        made = load_file(str(run / "policy" / "model.safetensors"))
    shipped = load_file(str(SHIPPED))
    same_keys = made.keys() == shipped.keys()
    difference = max((float((made[k].float() - shipped[k].float()).abs().max())
                      for k in made if k in shipped), default=float("inf"))
    identical = same_keys and all(torch.equal(made[k], shipped[k]) for k in made)
    final, start = summary["final_eval"], summary["start_eval"]
    print(json.dumps({
        "policy": "frozenlake-tiny", "config": Path(args.config).name,
        "start_success": start["success_rate"], "final_success": final["success_rate"],
        "final_ci": [round(final["ci95_low"], 4), round(final["ci95_high"], 4)],
        "format_ok": final["format_ok"], "tasks": final["tasks"], "steps": summary["steps"],
        "params": summary["params"], "train_seconds": round(summary["train_seconds"], 1),
        "eval_seconds": round(summary["eval_seconds"], 1),
        "identical_to_shipped": identical, "max_abs_difference": difference}))


if __name__ == "__main__":
    main()
