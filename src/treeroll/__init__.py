"""treeroll: shared-prefix tree rollouts for multi-turn LLM-agent reinforcement learning."""

__version__ = "0.1.0"
