"""How cheap is forking a SWE environment compared with stepping it?

Runs one episode prefix of typical agent commands on a built-in task (listing, reading, grep,
an edit, a test run), then forks the environment repeatedly. Prints, as its last line, one JSON
object: ``fork_ms`` (median time of ``env.fork()``), ``step_median_ms`` (median ``env.step``
time over the prefix), ``fork_over_step`` (their ratio; target < 0.2), the sandbox mode, and
``full_copy_ms`` (what copying the whole working tree, ``.git`` included, would cost instead,
on the same filesystem).

    python bench/swe_fork.py --quick
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from treeroll.envs.swe import builtin_tasks, make_swe_env


def main() -> None:
    """Measure step and fork times in one run and print them as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (CI)")
    parser.add_argument("--seed", type=int, default=0, help="task seed")
    args = parser.parse_args()
    forks = 20 if args.quick else 200
    rounds = 1 if args.quick else 3
    tasks = builtin_tasks()
    env = make_swe_env("mini", tasks)
    step_ms: list[float] = []
    fork_ms: list[float] = []
    task = None
    for round_index in range(rounds):
        env.reset(args.seed + round_index)
        task = env.task
        assert task is not None
        buggy = task.buggy_files[0]
        test_file = task.fail_to_pass[0].split("::")[0]
        commands = ["ls -la", f"cat -n {buggy}", "grep -rn 'def ' --include=*.py . | head -20",
                    "git status --short", f"sed -i 's/^/ /;s/^ //' {buggy} && git diff --stat",
                    f"python -m pytest -q -x -p no:cacheprovider {test_file} 2>&1 | tail -3",
                    f"head -20 {test_file}", "echo '# note' >> NOTES.md && wc -l NOTES.md",
                    "find . -name '*.py' -not -path './.git/*' | sort", "git diff | head -20"]
        for command in commands:
            start = time.perf_counter()
            env.step(f"```bash\n{command}\n```")
            step_ms.append((time.perf_counter() - start) * 1000)
        children = []
        for _ in range(forks):
            start = time.perf_counter()
            children.append(env.fork())
            fork_ms.append((time.perf_counter() - start) * 1000)
        for child in children:
            child.close()
    assert env.workspace is not None
    tree = Path(env.workspace.base)
    copies = []
    for index in range(5):  # what a fork would cost if it copied the whole tree
        start = time.perf_counter()
        shutil.copytree(tree, env.sandbox.root / f"full-copy-{index}", symlinks=True)
        copies.append((time.perf_counter() - start) * 1000)
    full_copy_ms = statistics.median(copies)
    files = sum(1 for p in tree.rglob("*") if p.is_file())
    own = sum(1 for p in env.workspace.upper.rglob("*") if p.is_file())
    result = {
        "fork_ms": round(statistics.median(fork_ms), 3),
        "fork_mean_ms": round(statistics.fmean(fork_ms), 3),
        "step_median_ms": round(statistics.median(step_ms), 3),
        "fork_over_step": round(statistics.median(fork_ms) / statistics.median(step_ms), 4),
        "steps": len(step_ms),
        "forks": len(fork_ms),
        "sandbox_mode": env.sandbox.mode,
        "tree_files": files,
        "branch_own_files": own,
        "full_copy_ms": round(full_copy_ms, 3),
        "task": task.task_id if task else None,
    }
    env.close()
    env.sandbox.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
