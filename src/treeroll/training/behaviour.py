"""A behaviour policy that lags the trained one: rollouts sampled ``lag`` updates late.

SAO samples while training goes on, so each rollout comes from weights a few updates old;
treeroll reproduces that staleness deterministically (``optim.behaviour_lag``): the rollout of
step ``t`` is sampled with the weights after update ``t - 1 - lag`` (the starting weights while
there are not that many), by a second copy of the model with its own backend. The update then
sees the behaviour policy's sampling logprobs as its old logprobs (``optim.loss.objective
truncated_is`` corrects for the lag). Written here rather than taken from a library: no RL
library on the package registries keeps a lagged in-process copy for a CPU trainer.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any

from treeroll.causal_lm import CausalLM

__all__ = ["StaleBehaviour"]


def _clone(model: CausalLM) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class StaleBehaviour:
    """The lagged copy: ``model`` samples; :meth:`after_update` moves it on by one update."""

    def __init__(self, trained: CausalLM, lag: int, history: list[dict[str, Any]] | None = None
                 ) -> None:
        if lag < 1:
            raise ValueError(f"a stale behaviour policy needs lag >= 1, got {lag}")
        self.lag = lag
        self.model = copy.deepcopy(trained).eval()
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        self.history: deque[dict[str, Any]] = deque(history or [_clone(trained)],
                                                    maxlen=lag + 1)
        self.model.load_state_dict(self.history[0])

    def after_update(self, trained: CausalLM) -> None:
        """Record the weights after an update; the behaviour copy takes the weights of
        ``lag`` updates before them (or the oldest it has)."""
        self.history.append(_clone(trained))
        self.model.load_state_dict(self.history[0])

    def state(self) -> list[dict[str, Any]]:
        """What a checkpoint keeps so that a resumed run samples with the same weights."""
        return list(self.history)
