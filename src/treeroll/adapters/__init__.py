"""treeroll's trees inside the trainers people already run (TRL, verl, rLLM).

Every adapter is a thin shell over :class:`treeroll.adapters.tree_groups.TreeGroups`, which grows
one tree per task with the model the trainer is training and hands back exactly the group
size the trainer expects, each leaf as token ids with its environment mask and its sampling
logprobs (token in, token out: nothing is re-tokenised). See ``docs/trainers/``.

- :mod:`treeroll.adapters.trl`: a ``rollout_func`` for TRL's ``GRPOTrainer``;
- :mod:`treeroll.adapters.verl`: a verl agent loop fed by a per-group tree coordinator, and a
  tree-credit advantage estimator;
- :mod:`treeroll.adapters.rllm`: an rLLM workflow returning one episode per tree.

The adapters import their trainer only when used; ``treeroll`` itself never needs them.
"""
