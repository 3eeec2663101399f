"""A stale figure is labelled, not a red CI: the whole path in a temporary copy of the repo.

A clone of this repository (with this checkout's README and results page, stored results and
figure tooling copied over it, so uncommitted work on them is what is tested) gets one
dependency of one stored figure changed; ``bench/readme_results.py`` must then label exactly
that figure stale, ``tests/test_results.py`` must pass on the regenerated results page and
fail once the label is removed; ``bench/reproduce.py --list`` must say which figure is stale,
and ``--stale`` must remake it (and only it) in a worktree of the commit and copy the result
back.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from staleness import STALE_MARKER, changed_since
from test_results import stale_labels

ROOT = Path(__file__).resolve().parent.parent
TOOLING = ("README.md", "docs/results.md", "bench/readme_results.py", "bench/reproduce.py",
           "bench/staleness.py", "tests/test_results.py", "docs/results", ".gitignore")
FIGURE = "swe_fork_quick"
"""The figure whose dependency the test changes: its own benchmark script is read by no other
figure, and it runs in seconds (the ``--stale`` test remakes it)."""
OTHER = "fuzz_quick"
"""A current figure ``--stale --only FIGURE OTHER`` must leave alone."""


def run(*command: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command in ``cwd``; on an unexpected failure, show its output."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({done.returncode}):\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A clone of this repository with this checkout's figure tooling and results."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: staleness is read from git history")
    path = tmp_path_factory.mktemp("stale") / "repo"
    run("git", "clone", "-q", str(ROOT), str(path), cwd=ROOT)
    for name in TOOLING:
        source, target = ROOT / name, path / name
        if source.is_dir():
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target)
        else:
            shutil.copyfile(source, target)
    run("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam",
        "this checkout's figure tooling", "--allow-empty", cwd=path)
    # The figure as if measured on this commit (nothing it read changed since): current, so
    # the test does not depend on whether this checkout's stored figures are.
    head = run("git", "rev-parse", "HEAD", cwd=path).stdout.strip()
    for name in (FIGURE, OTHER):
        stored = path / "docs/results" / f"{name}.json"
        record = json.loads(stored.read_text())
        record["commit"] = head
        stored.write_text(json.dumps(record, indent=2) + "\n")
    run("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam",
        f"{FIGURE} and {OTHER} measured on the commit before", cwd=path)
    return path


def regenerate(repo: Path) -> dict[str, str]:
    """Regenerate the clone's results page; its stale labels ``{name: commit}``."""
    run(sys.executable, "bench/readme_results.py", cwd=repo)
    return stale_labels((repo / "docs" / "results.md").read_text())


def results_test(repo: Path) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "tests/test_results.py", cwd=repo, check=False)


def test_changing_a_dependency_labels_exactly_that_figure_and_the_check_needs_the_label(
        clone: Path) -> None:
    record = json.loads((clone / "docs/results" / f"{FIGURE}.json").read_text())
    script = record["command"].split()[1]
    assert not changed_since(record["commit"], record["depends_on"], root=clone), \
        f"{FIGURE} must be current before the change for this test to mean anything"
    before = regenerate(clone)
    assert FIGURE not in before

    with (clone / script).open("a") as changed:
        changed.write("\n# a change to a file only this figure's run read\n")
    after = regenerate(clone)
    assert set(after) - set(before) == {FIGURE}, "exactly the changed figure becomes stale"
    assert set(before) <= set(after)
    assert after[FIGURE] == record["commit"][:10]
    readme = (clone / "docs" / "results.md").read_text()
    label = next(line for line in readme.splitlines()
                 if (m := STALE_MARKER.search(line)) and m["name"] == FIGURE)
    assert f"`{script}`" in label and f"--only {FIGURE}" in label
    assert "figures quoted" in readme and f"{len(after)} stale" in readme

    passing = results_test(clone)
    assert passing.returncode == 0, passing.stdout[-3000:]

    (clone / "docs" / "results.md").write_text(readme.replace(label + "\n", ""))
    failing = results_test(clone)
    assert failing.returncode != 0
    assert FIGURE in failing.stdout and "does not say so" in failing.stdout

    listing = run(sys.executable, "bench/reproduce.py", "--list", cwd=clone).stdout
    line = next(row for row in listing.splitlines() if row.startswith(FIGURE))
    assert " stale " in line and script in line and " min on " in line
    assert all(any(f" {state} " in row for state in ("current", "stale", "dirty", "never run"))
               for row in listing.splitlines()[:-1])


def test_reproduce_stale_remakes_only_stale_figures_in_a_worktree(clone: Path) -> None:
    script = json.loads((clone / "docs/results" / f"{FIGURE}.json").read_text())["command"]
    script = script.split()[1]
    with (clone / script).open("a") as changed:
        changed.write("\n# changed again, and committed: the remake runs on this commit\n")
    run("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "change",
        cwd=clone)
    head = run("git", "rev-parse", "HEAD", cwd=clone).stdout.strip()
    (clone / "uncommitted.txt").write_text("work going on in the checkout meanwhile\n")

    done = run(sys.executable, "bench/reproduce.py", "--stale", "--only", FIGURE, OTHER,
               cwd=clone)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(summary["figures"]) == [FIGURE], f"{OTHER} is current: not remade"
    record = json.loads((clone / "docs/results" / f"{FIGURE}.json").read_text())
    assert record["commit"] == head and not record["dirty"]
    assert not changed_since(record["commit"], record["depends_on"], root=clone)
    log = [json.loads(line) for line in
           (clone / "docs/results/_remakes.jsonl").read_text().splitlines()]
    assert log[-1]["name"] == FIGURE and log[-1]["commit"] == head
    assert not (clone / ".remake" / head[:12]).exists(), "the finished worktree is removed"
    again = run(sys.executable, "bench/reproduce.py", "--stale", "--only", FIGURE, cwd=clone)
    assert json.loads(again.stdout.strip().splitlines()[-1])["figures"] == {}, \
        "a second run finds nothing stale: resumable"


def test_keep_runs_moves_a_worktrees_run_folders_and_never_overwrites(tmp_path: Path) -> None:
    from reproduce import keep_runs

    reports, into = tmp_path / "worktree" / "reports", tmp_path / "kept"
    assert keep_runs(reports, into) is None, "no reports/: nothing kept"
    (reports / "compare_hard" / "runs" / "chain_seed0").mkdir(parents=True)
    (reports / "compare_hard" / "runs" / "chain_seed0" / "metrics.jsonl").write_text("{}\n")
    (into / "compare_hard").mkdir(parents=True)
    (into / "compare_hard" / "earlier.txt").write_text("kept from before\n")
    assert keep_runs(reports, into) == into
    assert (into / "compare_hard" / "earlier.txt").read_text() == "kept from before\n"
    moved = into / "compare_hard.1" / "runs" / "chain_seed0" / "metrics.jsonl"
    assert moved.read_text() == "{}\n" and not (reports / "compare_hard").exists()
