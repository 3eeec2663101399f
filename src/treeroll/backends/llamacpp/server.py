"""A llama.cpp server on this machine: its binary, built from a registry package's sources and
cached outside any clone, and a server process treeroll starts, waits for and stops.

The sources come from PyPI: the ``llama-cpp-python`` source distribution vendors a whole
llama.cpp tree (``vendor/llama.cpp``, server included). :func:`server_binary` downloads it
with pip, builds only ``llama-server`` with CMake (CPU, no web UI, no network features), and
keeps the result in ``$TREEROLL_CACHE`` (default ``~/.cache/treeroll``)
``/llama.cpp-<version>``; a second call, from any clone, reuses it. ``$TREEROLL_LLAMA_SERVER``
names a ``llama-server`` binary to use instead (a GPU build, a distribution's package).
A cold build takes about 5 minutes on 2 cores (the download half a minute, CMake
the rest); it is done once per machine, under a lock, so
parallel test runs wait for one build rather than racing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from treeroll.backends.http import ServerError, get_json

__all__ = ["LLAMA_CPP_PYTHON", "LlamaServer", "cache_dir", "server_binary", "source_dir"]

LLAMA_CPP_PYTHON = "0.3.36"
"""The ``llama-cpp-python`` source distribution whose vendored llama.cpp is built."""

CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
)
"""A CPU build of the server alone; nothing in it downloads anything (the prebuilt web UI
would come from a model hub)."""


def cache_dir() -> Path:
    """Where the built server and its sources are kept: ``$TREEROLL_CACHE/llama.cpp-<v>``."""
    root = Path(os.environ.get("TREEROLL_CACHE", Path.home() / ".cache" / "treeroll"))
    return root / f"llama.cpp-{LLAMA_CPP_PYTHON}"


def source_dir() -> Path:
    """The llama.cpp source tree the cached server is built from (its ``gguf-py`` writes the
    GGUF version that server reads)."""
    return cache_dir() / "src" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"


def server_binary(*, build: bool = True, log: Path | None = None) -> Path:
    """The ``llama-server`` to run: ``$TREEROLL_LLAMA_SERVER``, else the cached build, else
    (``build``) a fresh build into the cache; a clear error if none can be had."""
    given = os.environ.get("TREEROLL_LLAMA_SERVER")
    if given:
        path = Path(given)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise FileNotFoundError(f"TREEROLL_LLAMA_SERVER={given} is not an executable file")
        return path
    binary = cache_dir() / "bin" / "llama-server"
    if binary.is_file():
        return binary
    if not build:
        raise FileNotFoundError(f"no llama-server at {binary}; build it with "
                                "`python -m treeroll.backends.llamacpp.server` or set "
                                "TREEROLL_LLAMA_SERVER")
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it
        if not binary.is_file():
            _build(binary, log or cache_dir() / "build.log")
    return binary


def _build(binary: Path, log: Path) -> None:
    """Download the sources with pip, configure and build ``llama-server`` into ``binary``."""
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"building llama-server needs {tool} on PATH")
    src_root = cache_dir() / "src"
    with open(log, "w") as out, tempfile.TemporaryDirectory() as tmp:
        def run(*command: str) -> None:
            print("$", " ".join(command), file=out, flush=True)
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                raise RuntimeError(f"building llama-server failed at `{' '.join(command)}`; "
                                   f"see {log}")

        if not source_dir().is_dir():
            run(sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", tmp)
            archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            with tarfile.open(archive) as tar:
                tar.extractall(src_root, filter="data")
        build = cache_dir() / "build"
        generator = ("-G", "Ninja") if shutil.which("ninja") else ()
        run("cmake", "-S", str(source_dir()), "-B", str(build), *generator, *CMAKE_OPTIONS)
        run("cmake", "--build", str(build), "--target", "llama-server", "-j",
            str(os.cpu_count() or 2))
        binary.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(build / "bin" / "llama-server", binary)


def free_port() -> int:
    """A TCP port on localhost nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LlamaServer:
    """One ``llama-server`` process serving one GGUF file on localhost.

    ``slots`` requests are decoded together (continuous batching); each slot keeps the KV of
    the last sequence it ran, and the server sends a request to the slot whose cached tokens
    share the longest prefix with it. ``cache_ram_mib`` is the host-memory prompt cache idle
    slots are saved to and restored from (0 turns it off). ``ctx_per_slot`` bounds one
    sequence (prompt + completion). The server's log goes to ``log`` (a temporary file by
    default), whose tail any start-up error quotes.
    """

    model: Path
    slots: int = 8
    ctx_per_slot: int = 2048
    threads: int = 2
    cache_ram_mib: int = 1024
    kv_type: str = "f32"
    """The KV cache's element type (llama.cpp's default is f16; f32 keeps the logprobs within
    float rounding of the transformers model's)."""
    port: int = 0
    extra_args: tuple[str, ...] = ()
    log: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def command(self, binary: Path) -> list[str]:
        """The command line that starts this server."""
        return [str(binary), "-m", str(self.model), "--host", "127.0.0.1",
                "--port", str(self.port), "-np", str(self.slots),
                "-c", str(self.ctx_per_slot * self.slots), "-t", str(self.threads),
                "-tb", str(self.threads), "--cache-ram", str(self.cache_ram_mib),
                "-ctk", self.kv_type, "-ctv", self.kv_type, "--no-webui", "--no-warmup",
                *self.extra_args]

    def start(self, timeout: float = 120.0) -> LlamaServer:
        """Start the process and wait until ``/health`` answers; an error with the log's tail
        if it exits or does not come up within ``timeout`` seconds."""
        if self.process is not None:
            return self
        binary = server_binary()
        self.port = self.port or free_port()
        self.log = self.log or Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(self.command(binary), stdout=out,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"llama-server exited ({self.process.returncode}) while "
                                  f"starting:\n{self.log_tail()}")
            try:
                if get_json(self.url + "/health", timeout=2.0).get("status") == "ok":
                    return self
            except (ServerError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise ServerError(f"llama-server did not come up in {timeout:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Terminate the process (kill it if it does not exit within 10 s)."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log."""
        return self.log.read_text(errors="replace")[-chars:] if self.log else ""

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def running(model: Path, **options: object) -> Iterator[LlamaServer]:
    """``with running(gguf) as server:`` a started :class:`LlamaServer`, stopped after."""
    server = LlamaServer(model, **options)  # type: ignore[arg-type]
    try:
        yield server.start()
    finally:
        server.stop()


if __name__ == "__main__":
    print(server_binary())
