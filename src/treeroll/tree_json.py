"""A rollout tree as a JSON file: :func:`save_tree` / :func:`load_tree` (what ``treeroll
rollout --out`` writes and the viewer reads), and the dict form Ray workers send
(:func:`tree_to_dict` / :func:`tree_from_dict`). Environment snapshots are not saved."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from treeroll.tree import Node, RolloutTree, token_counts

__all__ = ["load_tree", "save_tree", "tree_from_dict", "tree_to_dict"]


_NODE_FIELDS = ("id", "depth", "action_ids", "action_logprobs", "action_text", "observation_ids",
                "observation_text", "reward", "terminated", "truncated", "status", "note",
                "score", "score_reason", "finish_reason", "entropy", "tree_index")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def tree_to_dict(tree: RolloutTree) -> dict[str, Any]:
    """A JSON-ready dict of the tree (environment snapshots are not saved)."""
    nodes = []
    for n in tree.nodes:
        d = {k: getattr(n, k) for k in _NODE_FIELDS}
        d["parent"] = None if n.parent is None else n.parent.id
        d["info"] = _jsonable(n.info)
        nodes.append(d)
    return {
        "format": "treeroll.tree/1",
        "task_seed": tree.task_seed,
        "tree_id": tree.tree_id,
        "group_id": tree.group_id,
        "meta": _jsonable(tree.meta),
        "counts": token_counts(tree).as_dict(),
        "nodes": nodes,
    }


def tree_from_dict(data: dict[str, Any]) -> RolloutTree:
    """Inverse of :func:`tree_to_dict`."""
    if data.get("format") != "treeroll.tree/1":
        raise ValueError("not a treeroll tree file (missing format 'treeroll.tree/1'); "
                         "write one with `treeroll rollout --out FILE`")
    nodes: list[Node] = []
    for d in data["nodes"]:
        parent = None if d["parent"] is None else nodes[d["parent"]]
        node = Node(parent=parent, info=d.get("info", {}),
                    **{k: d[k] for k in _NODE_FIELDS if k in d})
        if parent is not None:
            parent.children.append(node)
        nodes.append(node)
    return RolloutTree(task_seed=data["task_seed"], tree_id=data["tree_id"],
                       group_id=data["group_id"], root=nodes[0], nodes=nodes,
                       meta=data.get("meta", {}))


def save_tree(tree: RolloutTree, path: str | Path) -> None:
    """Write the tree as JSON (atomically: a crash never leaves half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(tree_to_dict(tree)))
    tmp.replace(path)


def load_tree(path: str | Path) -> RolloutTree:
    """Read a tree written by :func:`save_tree`."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no tree file at {path}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); is it a treeroll tree file?") from None
    return tree_from_dict(data)
