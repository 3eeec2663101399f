"""``llamacpp:managed``'s options from the policy: the registry GGUF served as it is, slots as
long as the model's positions (a fake server class records what it was given)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import treeroll.backends.llamacpp.backend as llamacpp


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    seen: dict[str, object] = {}

    def fake(model, tokenizer, **options):  # type: ignore[no-untyped-def]
        seen.update(options)
        return "server"

    monkeypatch.setattr(llamacpp, "ManagedLlamaCpp", fake)
    return seen


def _policy(positions: int, gguf: str | None) -> SimpleNamespace:
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=positions))
    return SimpleNamespace(model=model, tokenizer=None,
                           meta={"gguf": gguf} if gguf is not None else {})


def test_a_registry_policy_is_served_from_its_own_gguf_with_long_slots(
        recorded: dict[str, object], tmp_path: Path) -> None:
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    assert llamacpp.managed(_policy(8192, str(gguf))) == "server"
    assert recorded == {"gguf": str(gguf), "ctx_per_slot": 8192}


def test_given_options_win_and_a_missing_gguf_is_not_served(recorded: dict[str, object],
                                                            tmp_path: Path) -> None:
    llamacpp.managed(_policy(32768, str(tmp_path / "gone.gguf")), ctx_per_slot=1024)
    assert recorded == {"gguf": None, "ctx_per_slot": 1024}
    recorded.clear()
    llamacpp.managed(_policy(32768, None))
    assert recorded["ctx_per_slot"] == 8192  # capped
