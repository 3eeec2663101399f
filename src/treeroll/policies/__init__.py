"""Policies: the shipped base policies, policy folders, and from-scratch builds.

A *policy folder* is what ``save_pretrained`` writes for a model and its tokenizer, plus
``treeroll.json`` (the turn settings the policy was trained with -- the observation view it
reads, see :mod:`treeroll.views`, and whether the system prompt is folded into the first user
turn -- and how it was made) and a model card ``README.md``. Any treeroll command loads one
with ``--policy PATH``; a run folder of ``treeroll train`` or ``treeroll sft`` is a policy
too (its exported ``<run>/policy``); a shipped policy is named instead of a path:

* ``frozenlake-tiny`` -- a small Llama fine-tuned by ``treeroll sft --config
  configs/sft_frozenlake.yaml`` on FrozenLake (rLLM convention) planner episodes; reads grids
  through the ``cell_coordinates`` view. Its model card has the recipe and its figures.
* ``smollm2-frozenlake`` -- a LoRA adapter (:mod:`treeroll.policies.lora`) over the
  registry's SmolLM2-135M-Instruct (``smollm2-135m-instruct``, :mod:`treeroll.policies.fetch`),
  made by ``treeroll sft --config configs/smollm2_sft.yaml``; reads the
  ``cell_coordinates_safe`` view.

Nothing is ever downloaded: shipped policies are files inside the package.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from treeroll.base import Env, TurnLimitedEnv
from treeroll.causal_lm import CausalLM
from treeroll.formatting import TurnFormat
from treeroll.policies.lora import (
    is_adapter_folder,
    merge_adapter,
    save_adapter,
    weights_fingerprint,
)
from treeroll.policies.model import (
    ModelConfig,
    build_model,
    build_word_tokenizer,
    load_policy_files,
)
from treeroll.views import VIEWS, as_view

__all__ = ["SHIPPED", "Policy", "VocabularyEnv", "adapter_base", "build_policy",
           "check_context_length", "check_policy_files", "has_policy", "load_policy",
           "longest_context", "max_positions", "policy_defaults", "resolve_policy",
           "save_policy", "shipped_policies"]


SHIPPED = ("frozenlake-tiny", "smollm2-frozenlake")
"""Names of the policies shipped inside the package."""
_RECIPES = {"frozenlake-tiny": "configs/sft_frozenlake.yaml",
            "smollm2-frozenlake": "configs/smollm2_sft.yaml"}
"""The config that remakes each shipped policy (``treeroll sft --config ...``)."""

_META_FILE = "treeroll.json"


@runtime_checkable
class VocabularyEnv(Env, Protocol):
    """What a from-scratch policy asks of its environment: texts covering every word it
    writes (prompts and observations), from which its word-level tokenizer is built. Without
    it, a run starts from a policy folder (``--policy.init``)."""

    def vocabulary_texts(self) -> list[str]:
        """Prompts and observations covering every word the environment writes."""
        ...


@dataclass
class Policy:
    """A model, its tokenizer and the observation view it reads."""

    model: CausalLM
    tokenizer: Any
    view: str = "plain"
    meta: dict[str, Any] = field(default_factory=dict)
    """``treeroll.json`` of the folder it came from (empty for a fresh build)."""
    system_in_user: bool = False
    """Fold the system prompt into the first user turn (``policy.system_in_user``)."""

    def turn_format(self) -> TurnFormat:
        """The turn format this policy was trained with; a turn also stops on the model's
        ``generation_config.eos_token_id`` (one id or several)."""
        return TurnFormat(self.tokenizer, view=self.view, extra_stop_ids=generation_eos_ids(
            self.model), system_in_user=self.system_in_user)

    @property
    def parameters(self) -> int:
        """Number of parameters of the model."""
        return sum(p.numel() for p in self.model.parameters())


def generation_eos_ids(model: CausalLM) -> tuple[int, ...]:
    """``model.generation_config.eos_token_id`` as a tuple (empty when unset)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(i) for i in eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def shipped_policies() -> list[str]:
    """Names of the shipped policies whose files are present in this installation."""
    return [name for name in SHIPPED if has_policy(_shipped_dir(name))]


def has_policy(folder: Path) -> bool:
    """Whether ``folder`` holds a model (``config.json``) or an adapter over one."""
    return (folder / "config.json").is_file() or is_adapter_folder(folder)


def _shipped_dir(name: str) -> Path:
    return Path(__file__).parent / name


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
"""Files ``from_pretrained`` reads weights from (one of them)."""
_TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"),
                    ("vocab.txt",))
"""Sets of files a tokenizer loads from (one full set)."""


def resolve_policy(spec: str) -> Path:
    """The folder of a shipped policy name, a policy folder, or a run folder (its exported
    ``<run>/policy``); a clear error, before anything is loaded, when it is none of these or
    lacks the model's configuration, weights or tokenizer files (each named)."""
    from treeroll.policies.fetch import REAL_POLICIES, real_policy

    if spec in SHIPPED:
        folder = _shipped_dir(spec)
        if not has_policy(folder):
            raise FileNotFoundError(f"policy.init {spec!r}: the shipped policy's files are "
                                    f"missing from {folder}; make it with `treeroll sft "
                                    f"--config {_RECIPES[spec]} --export {folder}`")
        return folder
    if spec in REAL_POLICIES:
        return real_policy(spec)
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"policy.init {spec!r} is neither a named policy "
                                f"({', '.join([*SHIPPED, *REAL_POLICIES])}) nor a folder: pass "
                                "a folder written by save_pretrained, treeroll sft or treeroll "
                                "train (nothing is downloaded from a model hub)")
    if not has_policy(folder) and (folder / "config.yaml").is_file():
        exported = folder / "policy"
        if not has_policy(exported):
            raise FileNotFoundError(f"policy.init {spec!r} is a run folder without an exported "
                                    f"policy ({exported}/config.json): a run exports it when "
                                    "it finishes; finish it with --resume, or use its "
                                    "checkpoint where a command takes --run")
        folder = exported
    if is_adapter_folder(folder):
        return folder  # its base is checked when it is loaded (load_policy)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"policy.init {spec!r} is a folder without a model "
                                "(config.json)")
    check_policy_files(folder, spec)
    return folder


def check_policy_files(folder: Path, spec: str | None = None) -> None:
    """Refuse a policy folder that lacks weights or tokenizer files, naming what is missing
    and what the folder holds (``from_pretrained`` would fail later, or build an empty
    tokenizer that generates nothing)."""
    name = spec if spec is not None else str(folder)
    present = sorted(p.name for p in folder.iterdir())
    shown = ", ".join(present[:12]) + (", ..." if len(present) > 12 else "")
    if not any((folder / f).is_file() for f in _WEIGHT_FILES) and not any(
            folder.glob("*.safetensors")):
        raise FileNotFoundError(f"policy.init {name!r}: no weights in {folder} (expected one "
                                f"of {', '.join(_WEIGHT_FILES)}; the folder holds {shown})")
    if not any(all((folder / f).is_file() for f in files) for files in _TOKENIZER_FILES):
        wanted = " or ".join("+".join(files) for files in _TOKENIZER_FILES)
        raise FileNotFoundError(f"policy.init {name!r}: no tokenizer files in {folder} "
                                f"(expected {wanted}; the folder holds {shown}); save the "
                                "tokenizer with tokenizer.save_pretrained(folder)")


def policy_defaults(spec: str | None, _seen: frozenset[Path] = frozenset()) -> dict[str, Any]:
    """The settings a policy brings (``treeroll.json``'s ``defaults``, e.g. a real model's
    longer turn cap), read without loading or converting anything; ``{}`` when it has none
    or ``spec`` names nothing readable, adapters naming each other in a loop included
    (loading it later says why)."""
    from treeroll.policies.fetch import REAL_POLICIES

    if not spec:
        return {}
    if spec in REAL_POLICIES:
        return copy.deepcopy(REAL_POLICIES[spec].defaults)
    folder = _shipped_dir(spec) if spec in SHIPPED else Path(spec).expanduser()
    if not (folder / _META_FILE).is_file() and (folder / "policy" / _META_FILE).is_file():
        folder = folder / "policy"  # a run folder's exported policy
    try:
        meta = json.loads((folder / _META_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if isinstance(meta, dict) and "defaults" not in meta and isinstance(meta.get("base"), str) \
            and folder.resolve() not in _seen:  # an adapter brings its base's settings
        return policy_defaults(adapter_base(folder, meta["base"]), _seen | {folder.resolve()})
    defaults = meta.get("defaults", {}) if isinstance(meta, dict) else {}
    return defaults if isinstance(defaults, dict) else {}


def adapter_base(folder: Path, base: str) -> str:
    """The policy an adapter folder's ``treeroll.json`` names as its ``base``: a named policy,
    or a folder, relative to the adapter folder (as :func:`save_policy` writes it) or, for a
    folder written before that, to the working directory."""
    from treeroll.policies.fetch import REAL_POLICIES

    if base in SHIPPED or base in REAL_POLICIES or Path(base).is_absolute():
        return base
    beside = folder / base
    return str(beside.resolve()) if beside.is_dir() else base


def load_policy(spec: str, view: str | None = None, *, _adapters: tuple[Path, ...] = ()
                ) -> Policy:
    """Load a shipped policy by name, or a policy folder by path.

    ``view`` overrides the folder's recorded view (``treeroll.json``; ``plain`` when the
    folder has none, as for any Hugging Face model folder). An adapter folder loads its base
    (refused when adapters name each other in a loop, or when the base's weights are not the
    ones the adapter was trained over) and merges the adapter into it."""
    folder = resolve_policy(spec)
    meta: dict[str, Any] = {}
    if (folder / _META_FILE).is_file():
        meta = json.loads((folder / _META_FILE).read_text())
    chosen = view or meta.get("view", "plain")
    VIEWS.get(chosen)  # fails with the valid names
    if is_adapter_folder(folder):
        model, tokenizer, meta = _load_adapted(spec, folder, meta, chosen, _adapters)
    else:
        model, tokenizer = load_policy_files(folder)
    return Policy(model.eval(), tokenizer, chosen, meta,
                  system_in_user=bool(meta.get("system_in_user", False)))


def _load_adapted(spec: str, folder: Path, meta: dict[str, Any], view: str,
                  adapters: tuple[Path, ...]) -> tuple[Any, Any, dict[str, Any]]:
    """An adapter folder's base, loaded and checked, with the adapter merged into it."""
    base = meta.get("base")
    chain = (*adapters, folder.resolve())
    if not isinstance(base, str):
        raise ValueError(f"policy.init {spec!r}: the adapter folder {folder} does not name "
                         "its base policy (treeroll.json's \"base\")")
    base = adapter_base(folder, base)
    if base in SHIPPED or Path(base).expanduser().is_dir():
        base_folder = resolve_policy(base).resolve()
        if base_folder in chain:
            loop = " -> ".join(str(f) for f in (*chain, base_folder))
            raise ValueError(f"policy.init {spec!r}: adapter folders name each other as base "
                             f"in a loop ({loop}); an adapter's base must be a model")
    base_policy = load_policy(base, view, _adapters=chain)
    expected = meta.get("base_fingerprint")
    if expected is not None and (found := weights_fingerprint(base_policy.model)) != expected:
        from importlib.metadata import PackageNotFoundError, version

        def installed(name: str) -> str:
            try:
                return f"{name} {version(name)}"
            except PackageNotFoundError:
                return f"no {name}"

        raise ValueError(f"policy.init {spec!r}: the adapter in {folder} was trained over "
                         f"other weights than {base!r} holds now (base_fingerprint "
                         f"{expected[:12]}..., found {found[:12]}...): load it over the base "
                         "it was made from, or train the adapter again over this one (a "
                         "registry base is converted here from its package, with "
                         f"{installed('transformers')} and {installed('gguf')}: install the "
                         "versions of constraints.txt)")
    return (merge_adapter(base_policy.model, folder), base_policy.tokenizer,
            {**base_policy.meta, **meta})


def save_policy(policy: Policy, path: str | Path, *, card: str | None = None,
                meta: dict[str, Any] | None = None, adapter: Any = None,
                base: str | None = None) -> Path:
    """Write ``policy`` as a policy folder: model (safetensors), tokenizer, ``treeroll.json``
    (its view and ``meta``) and, if given, the model card ``README.md``. With ``adapter``
    (the ``peft`` wrapper :func:`treeroll.policies.lora.add_lora` returned) only the adapter
    is written, and ``treeroll.json`` names ``base``, the policy it adapts (a folder base as a
    path relative to ``path``, so the two can move together)."""
    from treeroll.policies.fetch import REAL_POLICIES

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if adapter is not None:
        if not base:
            raise ValueError("save_policy: an adapter needs the name of its base policy")
        if base not in SHIPPED and base not in REAL_POLICIES and Path(base).is_dir():
            # a folder base is written relative to the adapter: the two move together
            base = os.path.relpath(Path(base).resolve(), path.resolve())
        save_adapter(adapter, path, base)  # the tokenizer and the weights are the base's
    else:
        policy.model.save_pretrained(path)
        policy.tokenizer.save_pretrained(path)
    turn = {"view": policy.view, "system_in_user": policy.system_in_user,
            **({"defaults": policy.meta["defaults"]} if "defaults" in policy.meta else {}),
            **({"base": base} if adapter is not None else {})}
    (path / _META_FILE).write_text(json.dumps({**turn, **(meta or {})}, indent=2) + "\n")
    if card is not None:
        (path / "README.md").write_text(card)
    return path


def build_policy(init: str | None, model_config: ModelConfig, view: str | None,
                 make_env: Callable[[], Env], tokenizer_dir: Path | None = None, *,
                 system_in_user: bool = False) -> Policy:
    """The policy a run starts from: ``init`` (a shipped name or a folder), else a
    from-scratch build from ``model_config``. A from-scratch build reuses the tokenizer saved
    in ``tokenizer_dir`` if there is one (a resumed run), else builds a word-level tokenizer
    covering the environment's texts seen through ``view``; the caller saves it."""
    if init:
        policy = load_policy(init, view)
        return replace(policy, system_in_user=system_in_user or policy.system_in_user)
    view = view or "plain"
    observe = as_view(VIEWS.get(view))
    if tokenizer_dir is not None and (tokenizer_dir / "tokenizer.json").exists():
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    else:
        env = make_env()
        texts = env.vocabulary_texts() if isinstance(env, VocabularyEnv) else []
        if not texts:
            raise ValueError("the environment has no vocabulary_texts(); pass policy.init "
                             "with a policy folder of your own")
        texts = [observe(text, True) for text in texts]
        if observe.words is not None:  # the view's words the texts may not show
            texts.append(observe.words(env))
        tokenizer = build_word_tokenizer(texts, extra_pattern=observe.word_pattern)
    model = build_model(len(tokenizer), model_config, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    if observe.coordinate_words:
        init_cell_embeddings(model, tokenizer, seed=model_config.seed)
    return Policy(model, tokenizer, view, system_in_user=system_in_user)


def init_cell_embeddings(model: CausalLM, tokenizer: Any, seed: int = 0) -> None:
    """Give every cell word ``<symbol>@<row>,<column>`` the embedding ``e_symbol + e_row +
    e_column``, so that from the first step the symbol, the row and the column are linear
    features of one token. ``e_symbol`` is random; ``e_row`` and ``e_column`` start on a
    number line (a random direction times the centred coordinate) plus a random part, so that
    which of two cells lies further down or right is linear in their embeddings too (random
    coordinate vectors would only tell coordinates apart, not order them). All at the
    model's initialiser scale; training then moves each word freely."""
    embedding = model.get_input_embeddings().weight  # [vocab, hidden]
    scale = float(getattr(model.config, "initializer_range", 0.02))
    generator = torch.Generator().manual_seed(seed + 1)
    parsed = []
    for token, index in tokenizer.get_vocab().items():
        symbol, at, place = token.partition("@")
        row, comma, column = place.partition(",")
        if at and comma and row.isdigit() and column.isdigit():
            parsed.append((symbol, int(row), int(column), index))
    if not parsed:
        return
    symbols = sorted({p[0] for p in parsed})
    extent = max(max(p[1], p[2]) for p in parsed) + 1
    hidden = embedding.shape[1]

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale

    centred = (torch.arange(extent, dtype=torch.float32) - (extent - 1) / 2) / max(extent / 2, 1)
    symbol_table = randn(len(symbols), hidden)
    axes = {axis: centred[:, None] * randn(hidden)[None, :] * 2 + randn(extent, hidden) * 0.5
            for axis in ("row", "column")}  # [extent, hidden] each
    with torch.no_grad():
        for symbol, row, column, index in parsed:
            embedding[index] = (symbol_table[symbols.index(symbol)] + axes["row"][row]
                                + axes["column"][column])


def max_positions(model: CausalLM) -> int | None:
    """The model's ``max_position_embeddings`` (None when its config does not say)."""
    value = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(value) if value else None


def longest_context(turn_format: TurnFormat, make_env: Callable[[], Env],
                    max_turn_tokens: int, seeds: Any) -> tuple[int, str]:
    """The longest context an episode can reach on these task seeds, and how it adds up: the
    first prompt, then per turn a full reply (``max_turn_tokens``) and an observation as long
    as the longer of the first one and the one after an empty reply (an error message).
    ``(0, "")`` when the environment says nothing of its turn limit (it is not a
    :class:`~treeroll.base.TurnLimitedEnv`)."""
    longest, how = 0, ""
    for seed in seeds:
        env = make_env()
        first = env.reset(int(seed))
        if not isinstance(env, TurnLimitedEnv):
            return 0, ""
        turns = env.turn_limit
        prompt, _ = turn_format.prompt(env.system_prompt, first)
        after_empty = env.fork().step("")[0]
        observed = max(len(turn_format.observation(text, True)[0])
                       for text in (first, after_empty))
        total = len(prompt) + turns * (max_turn_tokens + observed)
        if total > longest:
            longest = total
            how = (f"task {int(seed)}: a {len(prompt)}-token prompt + {turns} turns x "
                   f"({max_turn_tokens} reply + {observed} observation tokens)")
    return longest, how


def check_context_length(policy: Policy, make_env: Callable[[], Env], max_turn_tokens: int,
                         seeds: Any) -> None:
    """Refuse, before any work, a policy whose positions (``max_position_embeddings``) are
    fewer than the contexts an episode on the first tasks can reach (:func:`longest_context`):
    a model fed past its positions generates without a word of warning."""
    limit = max_positions(policy.model)
    if limit is None:
        return
    longest, how = longest_context(policy.turn_format(), make_env, max_turn_tokens,
                                   list(seeds)[:8])
    if longest > limit:
        raise ValueError(f"contexts can reach {longest} tokens ({how}), more than the model's "
                         f"{limit} positions (max_position_embeddings): lower "
                         "rollout.max_turn_tokens or the environment's turns, or use a model "
                         "with more positions")
