"""treeroll: shared-prefix tree rollouts for multi-turn LLM-agent reinforcement learning."""

__version__ = "0.1.0"

from treeroll import _moved

_moved.install()  # the 0.1 import paths, with a DeprecationWarning, for one release
