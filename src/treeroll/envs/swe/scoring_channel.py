"""A pytest plugin that reports test outcomes through a channel the tested code cannot fake.

The SWE scorer copies this file (it imports nothing of treeroll) next to the sandbox and
runs the task's test command with ``-p`` naming it, so pytest loads it before any conftest or
test module -- and so before any of the project's (the agent's) code -- is imported. At import
it takes two file descriptors the scorer opened outside the sandbox and passed to the command
(``TREEROLL_SCORING_FDS=<results>,<token>``): it reads a random token from the second and
closes it, then writes one JSON line per test phase to the first (``nodeid``, ``when``,
``outcome``, the token), and a final ``done`` line at the end of the session, after which it
closes the descriptor. The scorer reads the results file (nowhere inside the sandbox) up to
its ``done`` line and ignores what tests print, so a fake pytest summary, a JUnit file written
into the tree, or an ``atexit`` hook that prints or writes after the session score nothing.

What this does not stop: code that, inside the tests' own process, finds this plugin's
token in memory (``gc``, ``sys.modules``) and writes forged lines through a descriptor it
duplicated before the plugin closed its own. The agent never sees how it is scored (the
plugin's name, the variable and the protocol appear in no observation).
"""

from __future__ import annotations

import json
import os
from typing import Any


def _open() -> tuple[Any, str] | None:
    spec = os.environ.pop("TREEROLL_SCORING_FDS", "")
    if not spec:
        return None
    results, token_fd = (int(part) for part in spec.split(","))
    with os.fdopen(token_fd, "r") as source:
        token = source.read().strip()
    return os.fdopen(results, "w", buffering=1), token


_CHANNEL = _open()


def _write(record: dict[str, Any]) -> None:
    if _CHANNEL is not None and not _CHANNEL[0].closed:
        _CHANNEL[0].write(json.dumps({**record, "token": _CHANNEL[1]}) + "\n")


def pytest_runtest_logreport(report: Any) -> None:
    """One line per phase (setup, call, teardown) of every test."""
    _write({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome})


def pytest_collectreport(report: Any) -> None:
    """A file that fails to collect is an error of every test in it."""
    if report.failed:
        _write({"nodeid": report.nodeid, "when": "collect", "outcome": "failed"})


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    """The last line; the descriptor is closed after it."""
    _write({"done": True, "exitstatus": int(exitstatus)})
    if _CHANNEL is not None:
        _CHANNEL[0].close()
