"""A pytest plugin that reports test outcomes through a channel the tested code cannot fake.
PYTEST_DONT_REWRITE (imported by the launcher before pytest: nothing to rewrite).

The SWE scorer copies this file (it imports nothing of treeroll) under a fresh random name
into a scoring run's own folder; the launcher there (:mod:`treeroll.envs.swe.scoring_site`)
imports it at interpreter start-up and ``PYTEST_PLUGINS`` names it, so pytest registers it
before any conftest or test module -- and so before any of the project's (the agent's) code
-- is imported. It takes two file descriptors the scorer opened outside the sandbox and
passed to the command (``TREEROLL_SCORING_FDS=<results>,<token>``): it reads a random token
from the second and closes it, and writes a ``started`` line. In a process whose command line
names pytest the launcher has it do so at interpreter start-up (:func:`open_channel`), before
pytest reads its arguments: a plugin that a task's command or its pristine ``addopts`` names
with ``-p`` is imported before ``PYTEST_PLUGINS`` are, from the tree, and would otherwise run
the agent's code before the token was taken and the tripwire's baseline noted. Elsewhere it
does so when pytest registers it. At registration it then writes one JSON line per test phase
to the first (``nodeid``, ``when``, ``outcome``, the token), and a final ``done`` line at the
end of the session, after which it closes the descriptor. The scorer reads the
results file (nowhere inside the sandbox) up to its ``done`` line and ignores what tests
print, so a fake pytest summary, a JUnit file written into the tree, or an ``atexit`` hook
that prints or writes after the session score nothing.

The tripwire: when it opens the channel it notes pytest's and pluggy's functions that run a test and
make its report (and their code objects), and every attribute of the ``pytest`` module; before
each report it writes and at the session's end it checks them, and that no hook making or
passing on reports comes from a module of the tree other than a ``conftest.py``. A change is
written as a ``tampered`` line: the scorer then counts every test failed. This catches
``_pytest.python.Function.runtest = lambda self: None`` and its kin, not code that goes
further (it runs in the same process: it can find this plugin, its token in memory or a
descriptor duplicated early, and rewrite them too).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
from typing import Any

_STATE: dict[str, Any] = {"channel": None, "token": "", "tree": "", "watched": {},
                          "namespace": {}, "tampered": ""}

_WATCHED = (
    "_pytest.python:Function.runtest", "_pytest.python:pytest_pyfunc_call",
    "_pytest.runner:call_and_report", "_pytest.runner:call_runtest_hook",
    "_pytest.runner:CallInfo.from_call", "_pytest.runner:pytest_runtest_makereport",
    "_pytest.runner:pytest_runtest_call", "_pytest.runner:runtestprotocol",
    "_pytest.reports:TestReport.from_item_and_call", "_pytest.reports:TestReport.__init__",
    "_pytest.reports:BaseReport.passed", "_pytest.reports:BaseReport.failed",
    "_pytest.skipping:pytest_runtest_makereport", "_pytest.unittest:TestCaseFunction.runtest",
    "_pytest.outcomes:fail", "_pytest.raises:raises", "_pytest.python_api:raises",
    "_pytest.python_api:approx", "pluggy._callers:_multicall",
    "pluggy._hooks:HookCaller.__call__", "pluggy._manager:PluginManager._hookexec",
    "pluggy._result:Result.get_result", "pluggy._result:Result.force_result")
"""``module:qualified.name`` of what decides a test's outcome (missing ones are skipped)."""

_HOOKS = ("pytest_runtest_protocol", "pytest_runtest_call", "pytest_pyfunc_call",
          "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_report_teststatus")
"""Hooks whose implementations may come from pytest, site-packages or a ``conftest.py`` only."""


def _resolve(spec: str) -> Any:
    module_name, _, path = spec.partition(":")
    value: Any = sys.modules.get(module_name)
    for part in path.split("."):
        value = getattr(value, part, None) if value is not None else None
    return getattr(value, "__func__", value)


def _fingerprint(value: Any) -> tuple[int, int]:
    code = getattr(value, "__code__", None)
    return id(value), id(code)


def open_channel() -> None:
    """Take the token, open the channel, note the tripwire's baseline (importing the modules
    it watches first) and write the ``started`` line; once per process, and only where the
    scorer passed its descriptors. The launcher calls it at start-up in a pytest process."""
    spec = os.environ.pop("TREEROLL_SCORING_FDS", "")
    if not spec or _STATE["channel"] is not None:
        return
    results, token_fd = (int(part) for part in spec.split(","))
    with os.fdopen(token_fd, "r") as source:
        _STATE["token"] = source.read().strip()
    _STATE["channel"] = os.fdopen(results, "w", buffering=1)
    _STATE["tree"] = os.environ.get("TREEROLL_SCORING_TREE", "").rstrip("/")
    for module in ("pytest", *{watched.partition(":")[0] for watched in _WATCHED}):
        with contextlib.suppress(Exception):  # a module this pytest lacks is not watched
            importlib.import_module(module)
    _STATE["watched"] = {spec: _fingerprint(_resolve(spec)) for spec in _WATCHED
                         if _resolve(spec) is not None}
    pytest_module = sys.modules.get("pytest")
    _STATE["namespace"] = dict(vars(pytest_module)) if pytest_module is not None else {}
    _write({"started": True})


def _write(record: dict[str, Any]) -> None:
    channel = _STATE["channel"]
    if channel is not None and not channel.closed:
        channel.write(json.dumps({**record, "token": _STATE["token"]}) + "\n")


def _from_tree(function: Any) -> bool:
    """Whether ``function`` was defined in a module of the tree other than a conftest."""
    module = sys.modules.get(getattr(function, "__module__", "") or "")
    where = os.path.abspath(str(getattr(module, "__file__", "") or ""))
    tree = _STATE["tree"]
    return bool(tree) and where.startswith(tree + "/") and \
        os.path.basename(where) != "conftest.py"


def _check(manager: Any = None) -> str:
    """What of pytest changed since registration ("" when nothing)."""
    for spec, fingerprint in _STATE["watched"].items():
        if _fingerprint(_resolve(spec)) != fingerprint:
            return spec
    pytest_module = sys.modules.get("pytest")
    for name, value in _STATE["namespace"].items():
        if getattr(pytest_module, name, None) is not value:
            return f"pytest.{name}"
    if manager is not None:
        for hook in _HOOKS:
            caller = getattr(manager.hook, hook, None)
            for impl in caller.get_hookimpls() if caller is not None else ():
                if _from_tree(impl.function):
                    return f"{hook} from {impl.function.__module__}"
    return ""


def pytest_plugin_registered(plugin: Any, manager: Any) -> None:
    """At this plugin's first registration (before any conftest): open the channel if the
    launcher did not, and register the recorder with this plugin manager alone. A session
    the tested code starts in the same process (``pytest.main``, ``pytester.inline_run``)
    may register this module again, but has no recorder: it writes nothing, so it can
    neither forge records nor end the channel early."""
    if _STATE.get("manager") is None and (_STATE["channel"] is not None
                                           or "TREEROLL_SCORING_FDS" in os.environ):
        open_channel()  # where the launcher did not: a command line not naming pytest
        for finder in list(sys.meta_path):  # the launcher's guard, back before pytest's hook
            if getattr(finder, "treeroll_scoring_guard", False):
                sys.meta_path.remove(finder)
                sys.meta_path.insert(0, finder)
        _STATE["manager"] = manager
        plugins = [name for name in os.environ.get("PYTEST_PLUGINS", "").split(",")
                   if name.strip() and name.strip() != __name__]
        os.environ["PYTEST_PLUGINS"] = ",".join(plugins)  # nested sessions do not load it
        manager.register(_Recorder(), "treeroll-scoring-recorder")


class _Recorder:
    """The hooks that write the channel, registered with the first session's manager only."""

    def pytest_runtest_logreport(self, report: Any) -> None:
        """One line per phase (setup, call, teardown) of every test, after the tripwire."""
        if not _STATE["tampered"]:
            _STATE["tampered"] = _check(_STATE.get("manager"))
            if _STATE["tampered"]:
                _write({"tampered": _STATE["tampered"]})
        _write({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome})

    def pytest_collectreport(self, report: Any) -> None:
        """A file that fails to collect is an error of every test in it."""
        if report.failed:
            _write({"nodeid": report.nodeid, "when": "collect", "outcome": "failed"})

    def pytest_sessionfinish(self, session: Any, exitstatus: Any) -> None:
        """The tripwire's last look, then the last line; the descriptor is closed after it."""
        if not _STATE["tampered"]:
            _STATE["tampered"] = _check(_STATE.get("manager"))
            if _STATE["tampered"]:
                _write({"tampered": _STATE["tampered"]})
        _write({"done": True, "exitstatus": int(exitstatus)})
        channel = _STATE["channel"]
        if channel is not None:
            channel.close()
