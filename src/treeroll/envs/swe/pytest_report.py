"""Running a task's tests and reading what they report: the pytest command line tests run
with (:data:`DEFAULT_TEST_COMMAND`), its ``-rA`` summary (:func:`parse_pytest_report`), and
the lines of the scoring plugin's channel (:func:`channel_statuses`,
:mod:`treeroll.envs.swe.scoring_channel` writes them).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["DEFAULT_TEST_COMMAND", "ChannelReport", "channel_statuses", "parse_pytest_report",
           "read_channel"]


DEFAULT_TEST_COMMAND = ("python -P -m pytest -o pythonpath=. -rA -q --tb=short "
                        "-p no:cacheprovider {tests}")
"""How tests run (``{tests}``: the shell-quoted test ids, empty for the whole suite).
``-P`` keeps the working tree off ``sys.path`` while pytest itself loads (a ``pytest.py``
in the tree cannot replace it); ``-o pythonpath=.`` then puts the tree on ``sys.path`` for
the tests, as ``python -m pytest`` would. During scoring the launcher
(:mod:`~treeroll.envs.swe.scoring_site`) still finds the standard library's and
site-packages' modules before any the agent added to the tree."""

_REPORT = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (\S+)")


_SUMMARY = re.compile(r"^=+ short test summary info =+$")


def parse_pytest_report(output: str) -> dict[str, str]:
    """Test id -> ``PASSED`` / ``FAILED`` / ``ERROR`` / ... from ``pytest -rA`` output.

    Only the last "short test summary info" section is read when there is one: report-like
    lines that the code under test printed earlier (captured output shown with a failure)
    are not pytest's verdict."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if _SUMMARY.match(line.strip())]
    statuses: dict[str, str] = {}
    for line in lines[starts[-1] + 1:] if starts else lines:
        match = _REPORT.match(line)
        if match:
            statuses.setdefault(match.group(2), match.group(1))
    return statuses


@dataclass(frozen=True)
class ChannelReport:
    """What the scoring plugin's channel said (its lines carrying the run's token, up to its
    session-end line)."""

    statuses: dict[str, str]
    """Test id -> ``PASSED`` / ``FAILED`` / ``ERROR`` / ``SKIPPED``."""
    started: bool
    """The plugin loaded (before any of the project's code)."""
    done: bool
    """The session-end line came."""
    tampered: str = ""
    """What the plugin's tripwire found changed in pytest ("" when nothing)."""


MAX_RECORD_CHARS = 4096
"""Longer lines in the channel are not the plugin's (its records are a test id and a few
words): skipped unparsed."""


def read_channel(text: str, token: str) -> ChannelReport:
    """Read the scoring plugin's lines (see :func:`treeroll.envs.swe.scoring.run_scored`):
    lines without ``token`` and lines after the session's end are ignored."""
    phases: dict[str, list[tuple[str, str]]] = {}
    broken: list[str] = []
    started = done = False
    tampered = ""
    for line in text.splitlines():
        if len(line) > MAX_RECORD_CHARS:  # no record of the plugin's is this long
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # a line nested past the parser's depth
            continue
        if not isinstance(record, dict) or record.get("token") != token:
            continue
        if record.get("started"):
            started = True
            continue
        if record.get("tampered"):
            tampered = tampered or str(record["tampered"])[:200]
            continue
        if record.get("done"):
            done = True
            break
        nodeid, when, outcome = (str(record.get(k)) for k in ("nodeid", "when", "outcome"))
        if when == "collect":
            broken.append(nodeid)
        phases.setdefault(nodeid, []).append((when, outcome))
    return ChannelReport(_combine(phases, broken), started or bool(phases) or done, done,
                         tampered)


def channel_statuses(text: str, token: str) -> tuple[dict[str, str], bool]:
    """Test id -> status from the scoring plugin's lines, and whether its session-end line
    came (:func:`read_channel`, shorter)."""
    report = read_channel(text, token)
    return report.statuses, report.done


def _combine(phases: dict[str, list[tuple[str, str]]], broken: list[str]) -> dict[str, str]:
    statuses, failed = {}, set(broken)
    for nodeid, records in phases.items():
        parts = nodeid.split("::")  # the node and its collectors: linear, not nodes x broken
        if any("::".join(parts[:n]) in failed for n in range(1, len(parts) + 1)):
            statuses[nodeid] = "ERROR"
        elif any(outcome == "failed" for _, outcome in records):
            statuses[nodeid] = "FAILED" if ("call", "failed") in records else "ERROR"
        elif ("call", "passed") in records:
            statuses[nodeid] = "PASSED"
        else:
            statuses[nodeid] = "SKIPPED"
    return statuses
