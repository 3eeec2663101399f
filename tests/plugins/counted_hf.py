"""A backend in one file (ARCHITECTURE.md, *Where each kind of plug-in goes*): transformers in
process, as ``hf``, with its own setting, and counting the requests it serves. One entry-point
line registers it: ``[treeroll.backends] counted_hf = counted_hf:PLUGIN``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from treeroll.backends import BackendSpec
from treeroll.backends.hf import HFBackend
from treeroll.base import Completion, GenerationRequest, SamplingParams
from treeroll.checks import checked


@dataclass
class CountedSettings:
    """``backend.counted_hf``: the largest batch it decodes at once."""

    batch: int = checked(4, ge=1)


SERVED: list[int] = []
"""Requests served, one entry per ``generate`` call."""


class CountedHF(HFBackend):
    """:class:`~treeroll.backends.hf.HFBackend` that notes how many requests each call had."""

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams,
                 ) -> list[Completion]:
        SERVED.append(len(requests))
        return super().generate(requests, params)


def build(config: Any, policy: Any) -> CountedHF:
    """The backend for ``policy`` with ``backend.counted_hf``'s settings."""
    return CountedHF(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0,
                     max_batch_size=config.counted_hf.batch)


PLUGIN = BackendSpec(build, settings=CountedSettings, in_process=True)
