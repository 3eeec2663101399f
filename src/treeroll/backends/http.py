"""JSON over HTTP for the server backends (llama.cpp, vLLM, SGLang).

The standard library's ``urllib`` is enough here: every call is one JSON POST or GET to a
server on a known address, and concurrency comes from a thread pool (one request in flight
per thread), so no HTTP client dependency is added for it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["ServerError", "get_json", "map_concurrently", "post_json", "post_text"]

T = TypeVar("T")
R = TypeVar("R")


class ServerError(RuntimeError):
    """A server answered with an error, an unreadable body, or not at all."""


def _send(request: urllib.request.Request, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:2000]
        raise ServerError(f"{request.get_method()} {request.full_url}: HTTP {e.code}: "
                          f"{detail}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        raise ServerError(f"{request.get_method()} {request.full_url}: no answer "
                          f"({getattr(e, 'reason', e)})") from None


def _call(request: urllib.request.Request, timeout: float) -> Any:
    body = _send(request, timeout)
    try:
        return json.loads(body) if body else {}
    except json.JSONDecodeError:
        raise ServerError(f"{request.get_method()} {request.full_url}: the answer is not JSON: "
                          f"{body[:300]!r}") from None


def post_json(url: str, payload: dict[str, Any], *, timeout: float = 600.0,
              headers: dict[str, str] | None = None) -> Any:
    """POST ``payload`` as JSON to ``url``; the decoded JSON answer, or :class:`ServerError`."""
    data = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", **(headers or {})})
    return _call(request, timeout)


def post_text(url: str, payload: dict[str, Any], *, timeout: float = 600.0) -> str:
    """POST ``payload`` as JSON; the answer as text (for endpoints that answer in prose),
    or :class:`ServerError` on an HTTP error."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    return _send(request, timeout).decode(errors="replace")


def get_json(url: str, *, timeout: float = 30.0) -> Any:
    """GET ``url``; the decoded JSON answer, or :class:`ServerError`."""
    return _call(urllib.request.Request(url, method="GET"), timeout)


def map_concurrently(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[fn(x) for x in items]`` with up to ``workers`` calls in flight; results in order;
    the first error is raised after the others finish."""
    if len(items) <= 1 or workers <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(fn, items))
