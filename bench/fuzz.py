"""Fuzz every reply parser, environment ``step`` and the SFT JSONL reader for a fixed budget.

The generators and targets of ``tests/test_fuzz.py`` (``bench/fuzz_targets.py``), each run on
``--examples`` hypothesis inputs (derandomised: the same inputs every run). Counts the inputs
tried and the exceptions a target's contract does not allow (anything but the one clear
error type it may raise, assertion failures of its invariants included), prints a table and,
as its last line, one JSON object with ``inputs_tried`` and ``exceptions`` (target: 0), and
the first failing input of each target.

Usage: ``python bench/fuzz.py --quick`` (300 inputs per target) or without ``--quick``
(3,000).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_targets import Target, targets


def run(target: Target, examples: int) -> dict[str, Any]:
    """Feed ``examples`` inputs to ``target``; count them and the disallowed exceptions."""
    counts: dict[str, Any] = {"inputs": 0, "exceptions": 0, "allowed_errors": 0,
                              "first_failure": None}

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(target.inputs)
    def feed(value: Any) -> None:
        counts["inputs"] += 1
        try:
            target.call(value)
        except target.allowed:
            counts["allowed_errors"] += 1
        except Exception as err:  # counted, not raised: the budget runs out either way
            counts["exceptions"] += 1
            if counts["first_failure"] is None:
                counts["first_failure"] = f"{type(err).__name__}: {err} on {value!r}"[:300]

    feed()
    return counts


def main() -> None:
    """Fuzz every target and print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 inputs per target")
    parser.add_argument("--examples", type=int, default=None, help="inputs per target")
    args = parser.parse_args()
    examples = args.examples or (300 if args.quick else 3000)
    results, start = {}, time.perf_counter()
    for target in targets():
        results[target.name] = run(target, examples)
        r = results[target.name]
        print(f"{target.name:32s} {r['inputs']:6d} inputs {r['exceptions']:3d} exceptions "
              f"{r['allowed_errors']:5d} clear errors", file=sys.stderr)
    print(json.dumps({
        "inputs_tried": sum(r["inputs"] for r in results.values()),
        "exceptions": sum(r["exceptions"] for r in results.values()),
        "clear_errors": sum(r["allowed_errors"] for r in results.values()),
        "targets": len(results), "examples_per_target": examples,
        "per_target": {name: {k: r[k] for k in ("inputs", "exceptions")}
                       for name, r in results.items()},
        "first_failures": {name: r["first_failure"] for name, r in results.items()
                           if r["first_failure"]},
        "seconds": round(time.perf_counter() - start, 1),
    }))


if __name__ == "__main__":
    main()
