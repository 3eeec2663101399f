"""The ``treeroll`` command line: train, eval, rollout, show, compare.

Every command takes ``--config FILE.yaml`` (see ``configs/``) and then overrides of any field,
e.g. ``--optim.steps 10 --strategy.name tree_grpo``; ``treeroll COMMAND --help`` lists every
setting with its default. Bad configs and options fail with a message naming the culprit.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import tyro
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from treeroll.checks import Check, checked, validate
from treeroll.cli.reporting import make_reporter
from treeroll.config import (
    HELD_OUT_RESERVED,
    TrainConfig,
    load_config,
    merged_config,
)
from treeroll.envs import env_spec

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from treeroll.training.evaluation import Reporter
    from treeroll.training.sft import SFTConfig

__all__ = ["main", "parse_settings"]

console = Console(stderr=True)
T = TypeVar("T", bound="DataclassInstance")


CONFIG_HELP = ("--config FILE.yaml: a YAML file of these settings (see configs/); the other "
               "options override it. --policy NAME|FOLDER names the policy in every command "
               "(a shipped name or a policy folder; eval and rollout also take a run folder).")

POLICY_OPTION = {"train": "--policy.init", "sft": "--policy.init", "eval": "--policy",
                 "rollout": "--train.policy.init", "compare": "--base.policy.init"}
"""Where each command keeps the policy: ``--policy X`` (one spelling everywhere) is read as
this option; the command's own spelling (``--policy.init``, ``--train.policy.init``,
``--base.policy.init``) still works."""


def _policy_spelling(command: str, args: list[str]) -> list[str]:
    """``args`` with ``--policy X`` (or ``--policy=X``, or ``--policy.init X`` for a command
    whose option is ``--policy``) rewritten to the command's own option."""
    target = POLICY_OPTION.get(command)
    if target is None:
        return args
    aliases = {"--policy", "--policy.init"} - {target}
    out = []
    for arg in args:
        name, equals, value = arg.partition("=")
        out.append(f"{target}={value}" if equals and name in aliases else
                   target if arg in aliases else arg)
    return out


def _named_policy(command: str, args: list[str], config_path: str | None
                  ) -> tuple[str | None, tuple[str, ...]]:
    """The policy a command line names (its option, else its config file's key) and the
    config sections it sits under; ``(None, ())`` when neither names one."""
    option = POLICY_OPTION.get(command)
    if option is None or command == "eval":  # eval applies them itself (cmd_eval)
        return None, ()
    path = option[2:].split(".")
    for i, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if name == option:
            return (value if equals else (args[i + 1] if i + 1 < len(args) else None)), \
                tuple(path[:-2])
    if config_path is not None and Path(config_path).is_file():
        node: Any = yaml.safe_load(Path(config_path).read_text())
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, str):
            return node, tuple(path[:-2])
    return None, ()


def _check_writable(path: Path, option: str) -> None:
    """Refuse, before any work, an output ``path`` that cannot be written: its nearest
    existing ancestor must be a folder this user may write in."""
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NotADirectoryError(f"{option} {path}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK):
        raise PermissionError(f"{option} {path}: {ancestor} is not writable")


def _run_folder(path: str | None) -> Path | None:
    """``path`` when it is a training run folder (``config.yaml`` and a checkpoint) and not a
    policy folder (``config.json``): the commands that take a policy take a run too."""
    if path is None:
        return None
    folder = Path(path).expanduser()
    is_run = (folder / "config.yaml").is_file() and (folder / "checkpoints" / "last.pt").is_file()
    return folder if is_run and not (folder / "config.json").is_file() else None


def _plain(text: str) -> str:
    """Help text without docstring markup: ``name`` (reST literals) reads as `name`, and a
    docstring's line breaks inside a paragraph become spaces (the terminal wraps the text);
    blank lines still separate paragraphs."""
    paragraphs = text.replace("``", "`").split("\n\n")
    return "\n\n".join(" ".join(part.split()) for part in paragraphs)


def _help_registry() -> tyro.constructors.ConstructorRegistry:
    """tyro's documented hook for how a dataclass becomes options (a struct rule), used for one
    thing: every field's help text goes through :func:`_plain` and names the range its
    :func:`treeroll.checks.checked` rule enforces. The rule asks tyro's own rules for the spec
    (it steps aside while they answer) and wraps each field's help text."""
    registry = tyro.constructors.ConstructorRegistry()
    answering = False

    @registry.struct_rule
    def plain_help(info: tyro.constructors.StructTypeInfo
                   ) -> tyro.constructors.StructConstructorSpec | None:
        nonlocal answering
        if answering or not is_dataclass(info.type):
            return None
        answering = True
        try:
            spec = tyro.constructors.ConstructorRegistry.get_struct_spec(info)
        finally:
            answering = False
        if not isinstance(spec, tyro.constructors.StructConstructorSpec):
            return None

        rules = {f.name: f.metadata.get("check") for f in dataclasses.fields(info.type)}

        def plain(field_spec: tyro.constructors.StructFieldSpec) -> Callable[[], str | None]:
            def helptext() -> str | None:
                text = field_spec.helptext
                text = text() if callable(text) else text
                if text is None and is_dataclass(field_spec.type):  # tyro's fallback: the
                    text = _class_doc(field_spec.type)  # nested dataclass's own docstring
                rule = rules.get(field_spec.name)
                if isinstance(rule, Check):  # the range treeroll.checks enforces
                    text = f"{text or ''} (valid: {rule.describe()})".strip()
                return None if text is None else _plain(text)
            return helptext

        return replace(spec, fields=tuple(replace(f, helptext=plain(f)) for f in spec.fields))

    return registry


def _class_doc(cls: Any) -> str | None:
    doc = cls.__doc__
    if not doc or doc.startswith(f"{cls.__name__}("):  # the one dataclass() writes
        return None
    return inspect.cleandoc(doc)


def parse_settings(cls: type[T], args: list[str], description: str, *, command: str,
                   default: T | None = None) -> T:
    """Settings for ``treeroll <command>``: ``default`` (or the dataclass's defaults), then
    ``--config FILE`` on top (YAML into the dataclass), then the other options on top.

    ``--help`` shows ``description``, the ``--config`` option and every field with its
    default; errors point at ``treeroll <command> --help``."""
    config_path = None
    rest = []
    args = _policy_spelling(command, args)
    i = 0
    while i < len(args):
        if args[i] == "--config":
            if i + 1 >= len(args):
                raise SystemExit("--config needs a file path (see configs/)")
            config_path = args[i + 1]
            i += 2
            continue
        if args[i].startswith("--config="):
            config_path = args[i].split("=", 1)[1]
            i += 1
            continue
        rest.append(args[i])
        i += 1
    spec, prefix = _named_policy(command, rest, config_path)
    if spec is not None:  # its settings go under the config file and the options
        from treeroll.config import with_policy_defaults

        default = with_policy_defaults(default if default is not None else cls(), spec, prefix)
    if config_path is not None:
        from_file = load_config(config_path, cls)  # checks the file and names bad keys
        if default is None:
            default = from_file
        else:
            overlay = yaml.safe_load(Path(config_path).read_text()) or {}
            default = merged_config(default, overlay)
    text = f"{_plain(description.strip())}\n{CONFIG_HELP}"
    prog = f"treeroll {command}"
    registry = _help_registry()
    if default is None:
        return tyro.cli(cls, prog=prog, args=rest, description=text, registry=registry)
    return tyro.cli(cls, prog=prog, args=rest, default=default, description=text,
                    registry=registry)


# --------------------------------------------------------------------------------------------


RunSettings = TypeVar("RunSettings", "TrainConfig", "SFTConfig")


def _run(run: Callable[[RunSettings, Reporter | None], dict[str, Any]],
         config: RunSettings) -> int:
    """Run ``run(config, reporter)`` under progress bars (plain lines when stderr is not a
    terminal); print its summary, or on Ctrl-C where its checkpoint is (only if one was
    written)."""
    run_dir = Path(config.runs_dir) / config.name
    with make_reporter(console) as reporter:
        try:
            summary = run(config, reporter)
        except KeyboardInterrupt:
            if (run_dir / "checkpoints" / "last.pt").exists():
                console.print(f"[yellow]interrupted: checkpoint and metrics are in {run_dir}; "
                              "continue with --resume")
            else:
                console.print("[yellow]interrupted before the first checkpoint")
            return 130
    _print_summary(summary, run_dir)
    return 0


def cmd_train(args: list[str]) -> int:
    """``treeroll train``: train a policy; prints held-out success before and after."""
    config = parse_settings(TrainConfig, args, "Train a policy on tree rollouts.", command="train")
    from treeroll.training.trainer import train

    return _run(train, config)


def cmd_sft(args: list[str]) -> int:
    """``treeroll sft``: supervised fine-tuning; prints held-out success before and after."""
    from treeroll.training.sft import SFTConfig

    config = parse_settings(SFTConfig, args, "Supervised fine-tuning on multi-turn trajectories "
                            "(an environment's expert or a JSONL file).", command="sft")
    from treeroll.training.sft_run import run_sft

    return _run(run_sft, config)


def _print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    table = Table(title=f"run {run_dir}")
    table.add_column("held-out")
    table.add_column("success")
    table.add_column("95% interval")
    for key in ("start_eval", "final_eval"):
        if key in summary:
            e = summary[key]
            table.add_row(key.replace("_eval", ""), f"{e['success_rate']:.3f}",
                          f"[{e['ci95_low']:.3f}, {e['ci95_high']:.3f}]")
    Console().print(table)
    print(json.dumps(summary))


@dataclass
class EvalCommand:
    """Held-out success of a run's last checkpoint or of a policy, with a 95% interval."""

    run: str | None = None
    """Run folder (``runs/<name>``) holding config.yaml and checkpoints/last.pt."""
    policy: str | None = None
    """Without --run: a shipped policy's name, a policy folder, or a run folder (its last
    checkpoint, as with --run) (default: the default
    training's starting policy, ``frozenlake-tiny``), on the default training's held-out
    tasks (FrozenLake, rLLM convention)."""
    tasks: int = checked(256, ge=1, le=HELD_OUT_RESERVED)
    """Evaluation tasks (never used in training)."""
    temperature: float = checked(0.0, ge=0)
    """Sampling temperature (0 = greedy)."""
    pool: str = checked("held_out", choices=("held_out", "validation"))
    """``held_out`` for a figure you report, ``validation`` while choosing a setting (the two
    pools share no task with each other or with training)."""


def cmd_eval(args: list[str]) -> int:
    """``treeroll eval``: evaluate a run's checkpoint (``--run``) or a policy (``--policy``)
    on held-out tasks."""
    command = parse_settings(EvalCommand, args, EvalCommand.__doc__ or "", command="eval")
    both = command.run is not None and command.policy is not None
    validate(command, extra=[("--policy", "is given with --run; pass --run (a training run's "
                              "checkpoint) or --policy (a policy folder or shipped name), not "
                              "both")] if both else [])
    from treeroll.cli.one_tree import load_run_policy, starting_policy
    from treeroll.training.evaluation import evaluate, pool_words, task_pools

    run = Path(command.run) if command.run is not None else _run_folder(command.policy)
    if run is not None:
        config, backend, turn_format, make_env = load_run_policy(run)
    else:
        from treeroll.backends import make_backend
        from treeroll.config import with_policy_defaults
        from treeroll.envs import make_env_factory

        config = with_policy_defaults(TrainConfig(), command.policy)
        if command.policy is not None:
            config.policy = replace(config.policy, init=command.policy)
        policy = starting_policy(config)
        backend = make_backend(config.backend, policy)
        turn_format, make_env = policy.turn_format(), make_env_factory(config.env)
    config.eval = replace(config.eval, tasks=command.tasks, temperature=command.temperature,
                          pool=command.pool)
    _, tasks = task_pools(config.env, config.eval)
    with make_reporter(console) as reporter:
        reporter.phase(f"evaluating {command.tasks} {pool_words(config.eval)} tasks",
                       command.tasks)
        result = evaluate(backend, turn_format, make_env, tasks[: command.tasks], config.eval,
                          config.rollout, reporter=reporter)
    print(json.dumps(result.as_dict()))
    return 0


@dataclass
class RolloutCommand:
    """Build one rollout tree, print a readable summary and save it as JSON."""

    out: str = "runs/rollouts/tree-{task}.json"
    """Where to write the tree (JSON; render it with `treeroll show`); ``{task}`` is replaced
    by the task seed."""
    run: str | None = None
    """Use this run folder's trained policy and its settings (its config.yaml supplies the
    ``--train.*`` defaults; the options given here override them). Without it: the policy of
    ``--train.policy.init``, the shipped base ``frozenlake-tiny``; the scripted agent for
    env=swe."""
    task: int = 0
    """Task seed."""
    env: str | None = None
    """Shortcut for --train.env.name (e.g. ``swe``: the scripted agent, the SWE scorer, long
    turns and K = 13 unless set otherwise)."""
    strategy: str | None = None
    """Shortcut for --train.strategy.name."""
    scorer: str | None = None
    """Shortcut for --train.scorer.name (PATR's default: frozenlake_progress, or swe)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Environment, strategy, rollout and scorer settings (as in `treeroll train`; with --run,
    the run's own unless given here)."""
    force: bool = False
    """Replace an existing ``--out`` tree (and the PNG/HTML rendered beside it); without it an
    existing tree is never overwritten."""


def cmd_rollout(args: list[str]) -> int:
    """``treeroll rollout``: build, summarise and save one tree."""
    description = RolloutCommand.__doc__ or ""
    command = parse_settings(RolloutCommand, args, description, command="rollout")
    from treeroll.cli.one_tree import (
        apply_shortcuts,
        build_one_tree,
        describe_tree,
        load_run_config,
    )
    from treeroll.tree_json import save_tree

    named = _run_folder(command.train.policy.init)  # --policy RUN: the run, as with --run
    run = command.run if command.run is not None else (str(named) if named else None)
    if run is not None:  # parse again on the run's settings: what is given overrides
        run_settings = RolloutCommand(train=load_run_config(Path(run)))
        command = replace(parse_settings(RolloutCommand, args, description, command="rollout",
                                         default=run_settings), run=run)
        if named is not None:  # the run's own policy settings stand
            command.train.policy = run_settings.train.policy
    config = apply_shortcuts(command.train, env=command.env, strategy=command.strategy,
                             scorer=command.scorer)
    out = Path(command.out.replace("{task}", str(command.task)))
    renders = [out.with_suffix(suffix) for suffix in (".png", ".html")]
    if out.exists() and not command.force:
        raise FileExistsError(f"--out {out} exists (a tree of an earlier rollout); pass another "
                              "--out, or --force to replace it and the pictures beside it")
    _check_writable(out, "--out")
    spec = env_spec(config.env.name)
    if spec is not None and spec.actor is not None and run is None:
        console.print(f"--env {config.env.name}: the {spec.actor} backend acts (no policy)")
    tree = build_one_tree(config, task_seed=command.task,
                          run_dir=Path(command.run) if command.run else None)
    for stale in renders if command.force else []:
        stale.unlink(missing_ok=True)
    save_tree(tree, out)
    Console().print(describe_tree(tree))
    console.print(f"saved {out}")
    return 0


@dataclass
class ShowCommand:
    """Render a saved tree as a PNG picture and a self-contained HTML page."""

    path: tyro.conf.Positional[str]
    """A tree JSON file (from `treeroll rollout --out` or a run's trees/ folder)."""
    out: str | None = None
    """Folder to write the pictures into (default: the tree file's own folder)."""
    formats: tuple[str, ...] = ("png", "html")
    """Any of png, svg, html."""


def cmd_show(args: list[str]) -> int:
    """``treeroll show``: picture and HTML page of a saved tree."""
    command = parse_settings(ShowCommand, args, ShowCommand.__doc__ or "", command="show")
    from treeroll.viz import show

    out = Path(command.path).parent if command.out is None else Path(command.out)
    for path in show(command.path, out, formats=command.formats):
        print(path)
    return 0


def cmd_compare(args: list[str]) -> int:
    """``treeroll compare``: strategies trained under one budget, over seeds, in a report."""
    from treeroll.cli.compare import CompareConfig, run_compare

    command = parse_settings(CompareConfig, args, CompareConfig.__doc__ or "", command="compare")
    with make_reporter(console) as reporter:
        try:
            report = run_compare(command, reporter)
        except KeyboardInterrupt:
            console.print(f"[yellow]interrupted: the finished runs and the checkpoints of the "
                          f"others are in {Path(command.report_dir) / 'runs'}; the same "
                          "command continues")
            return 130
    print(report)
    return 0


def cmd_ray_rollout(args: list[str]) -> int:
    """``treeroll ray-rollout``: a batch of trees grown on Ray workers, saved as JSON."""
    from treeroll.cli.ray_run import RayRolloutCommand, run_ray_rollout

    command = parse_settings(RayRolloutCommand, args, RayRolloutCommand.__doc__ or "",
                             command="ray-rollout")
    return run_ray_rollout(command, console)


COMMANDS = {"train": cmd_train, "sft": cmd_sft, "eval": cmd_eval, "rollout": cmd_rollout,
            "show": cmd_show, "compare": cmd_compare, "ray-rollout": cmd_ray_rollout}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``treeroll`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: treeroll {train,sft,eval,rollout,show,compare,ray-rollout} "
              "[--config FILE.yaml] "
              "[options]\n\n"
              "  train    train a policy on tree rollouts (default: FrozenLake, rLLM convention)\n"
              "  sft      supervised fine-tuning on an expert's episodes or a JSONL file\n"
              "  eval     held-out success of a run or a policy, with a 95% interval\n"
              "  rollout  build one tree, print it and save it as JSON (runs/rollouts/)\n"
              "  show     render a saved tree as PNG and HTML (beside the tree file)\n"
              "  compare  strategies under one token budget, over seeds, in a report\n"
              "  ray-rollout  a batch of trees grown on Ray workers (pip install "
              "'treeroll[ray]')\n\n"
              "--config FILE.yaml: a YAML file of a command's settings (see configs/); the "
              "other options override it.\n"
              "treeroll COMMAND --help lists every option and its default.")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"treeroll: unknown command {command!r}; valid: {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    try:
        return COMMANDS[command](rest)
    except (ValueError, OSError) as err:  # bad input, a missing or unwritable path
        console.print(f"[red]error:[/red] {escape(str(err))}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
