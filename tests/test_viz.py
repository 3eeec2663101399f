"""Rendering trees and runs: files are written, well formed, self-contained and escaped."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ElementTree
from html.parser import HTMLParser
from pathlib import Path

import pytest

from treeroll.tree import NodeStatus, RolloutTree
from treeroll.tree_json import load_tree, save_tree
from treeroll.viz import (
    metrics_figure,
    plot_compare,
    plot_metrics,
    render_tree_html,
    render_tree_png,
    render_tree_svg,
    show,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVIL = "<script>alert(1)</script>"


def _turn(tree: RolloutTree, parent, text: str, status: str = NodeStatus.EXPANDED, **fields):
    return tree.add_child(parent, action_ids=[1] * (3 + len(text) % 4),
                          action_logprobs=[-0.5] * (3 + len(text) % 4), action_text=text,
                          observation_ids=[2] * 5, observation_text=f"obs after {text}",
                          status=status, **fields)


def small_tree() -> RolloutTree:
    """Root -> A (branch point) -> {A1 success, A2 -> A2a budget, A2b truncated}; root -> B
    pruned; root -> C dropped; one text carries a script tag and one node is scored."""
    tree = RolloutTree.new(task_seed=7, tree_id=3, group_id=1, prompt_ids=[9] * 12,
                           prompt_text="You are in a maze & must escape <fast>.")
    tree.meta["strategy"] = "patr"
    tree.root.status = NodeStatus.EXPANDED
    a = _turn(tree, tree.root, "go north", score=0.81, score_reason="closer to goal",
              note="branch: 2 children")
    _turn(tree, a, "go east", NodeStatus.TERMINAL, terminated=True, reward=1.0,
          info={"success": True}, note="reached goal")
    a2 = _turn(tree, a, f"say {EVIL}", NodeStatus.EXPANDED, score=0.4, score_reason=EVIL)
    _turn(tree, a2, "wait", NodeStatus.BUDGET, note="token budget")
    _turn(tree, a2, "wait more", NodeStatus.TRUNCATED, truncated=True, note="turn limit")
    _turn(tree, tree.root, "go south", NodeStatus.PRUNED, score=0.05, note="score < 0.1")
    _turn(tree, tree.root, "go west", NodeStatus.DROPPED, note="repetition")
    _turn(tree, tree.nodes[-1].parent, "fall", NodeStatus.TERMINAL, terminated=True,
          info={"success": False}, note="hole")
    return tree


def big_tree(num_nodes: int = 200, seed: int = 0) -> RolloutTree:
    """A random tree of ``num_nodes`` nodes, depth <= 8, mixed statuses and scores."""
    rng = random.Random(seed)
    tree = RolloutTree.new(task_seed=seed, tree_id=0, group_id=0, prompt_ids=[9] * 40,
                           prompt_text="prompt")
    tree.meta["strategy"] = "tree-grpo"
    while len(tree.nodes) < num_nodes:
        parent = rng.choice([n for n in tree.nodes if n.depth < 8])
        _turn(tree, parent, f"step {len(tree.nodes)}", NodeStatus.TERMINAL,
              info={"success": rng.random() < 0.4},
              score=rng.random() if rng.random() < 0.5 else None)
    for node in tree.nodes:
        if node.children:
            node.status = NodeStatus.EXPANDED
    return tree


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.node_ids: list[str] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "data-node-id" and value is not None:
                self.node_ids.append(value)
            if name in ("src", "href") and value:
                self.urls.append(value)

    handle_startendtag = handle_starttag


@pytest.fixture
def roundtripped(tmp_path: Path) -> tuple[RolloutTree, Path]:
    source = tmp_path / "tree.json"
    save_tree(small_tree(), source)
    return load_tree(source), source


def test_png_and_svg(roundtripped, tmp_path: Path) -> None:
    tree, _ = roundtripped
    png = render_tree_png(tree, tmp_path / "out" / "t.png")
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert 10_000 < len(data) < 5_000_000
    svg = render_tree_svg(tree, tmp_path / "t.svg")
    root = ElementTree.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert "task seed 7" in svg.read_text()


def test_html_is_self_contained_and_escaped(roundtripped, tmp_path: Path) -> None:
    tree, _ = roundtripped
    page = render_tree_html(tree, tmp_path / "t.html").read_text()
    collector = _Collector()
    collector.feed(page)
    collector.close()
    assert sorted(collector.node_ids, key=int) == [str(n.id) for n in tree.nodes]
    assert "<script>alert" not in page
    assert "http" not in page
    assert collector.urls == []
    # the text is there (escaped inside the embedded JSON), so the panel can show it
    assert "\\u003cscript\\u003ealert(1)" in page
    # the embedded data is valid JSON and carries every field the panel shows
    start = page.index('type="application/json">') + len('type="application/json">')
    data = json.loads(page[start:page.index("</script>", start)])
    record = data["nodes"][3]
    assert record["action_text"] == f"say {EVIL}"
    assert record["score_reason"] == EVIL
    assert record["shared"] == 2 and record["depth"] == 2
    assert data["nodes"][0]["shared"] == 5  # the dropped leaf is not in the group
    for token_figure in ("generated", "unique", "chain-equivalent", "saved"):
        assert f"<b>{token_figure}</b>" in page


def test_show_writes_named_files(roundtripped, tmp_path: Path) -> None:
    _, source = roundtripped
    written = show(source, tmp_path / "shown")
    assert [p.name for p in written] == ["tree.png", "tree.html"]
    assert all(p.stat().st_size > 0 for p in written)
    with pytest.raises(ValueError, match="choose from"):
        show(source, tmp_path / "shown", formats=("gif",))


def test_big_tree_renders(tmp_path: Path) -> None:
    tree = big_tree()
    png = render_tree_png(tree, tmp_path / "big.png")
    assert png.read_bytes().startswith(PNG_MAGIC)
    collector = _Collector()
    collector.feed(render_tree_html(tree, tmp_path / "big.html").read_text())
    assert len(collector.node_ids) == len(set(collector.node_ids)) == 200


def test_root_only_tree(tmp_path: Path) -> None:
    tree = RolloutTree.new(task_seed=1, tree_id=0, group_id=0, prompt_ids=[1], prompt_text="p")
    assert render_tree_png(tree, tmp_path / "r.png").read_bytes().startswith(PNG_MAGIC)
    collector = _Collector()
    collector.feed(render_tree_html(tree, tmp_path / "r.html").read_text())
    assert collector.node_ids == ["0"]


def test_plot_metrics_skips_corrupt_lines(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": i, "success_rate": i / 10, "reward_mean": i / 5,
                         "generated_tokens": 100 * (i + 1)}) for i in range(6)]
    lines.insert(2, '{"step": 99, "success_ra')  # a half-written line
    lines.insert(4, "")
    lines.append("[1, 2]")
    log.write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match="skipping") as caught:
        out = plot_metrics(log, tmp_path / "m.png")
    assert {str(w.message).split(": ")[-1].split(" (")[0] for w in caught} == {
        "skipping corrupt line", "skipping a line that is not a JSON object"}
    assert out.read_bytes().startswith(PNG_MAGIC)
    with pytest.warns(UserWarning):
        by_tokens = plot_metrics(log, tmp_path / "m_tokens.png", x="generated_tokens")
    assert by_tokens.read_bytes().startswith(PNG_MAGIC)


def test_plot_metrics_with_nothing_to_plot(tmp_path: Path) -> None:
    log = tmp_path / "empty.jsonl"
    log.write_text("\n\n")
    with pytest.warns(UserWarning, match="no records"):
        out = plot_metrics(log, tmp_path / "e.png")
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_plot_compare(tmp_path: Path) -> None:
    results = {
        "chain": [(1000.0 * i, 0.1 * i, 0.1 * i - 0.05, 0.1 * i + 0.05) for i in range(5)],
        "tree": [(1000.0 * i, 0.15 * i, 0.15 * i - 0.04, 0.15 * i + 0.04) for i in (3, 0, 1)],
        "none": [],
    }
    out = plot_compare(results, tmp_path / "c.png")
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def _training_log(path: Path, rewards_differ: bool = False) -> Path:
    """A run's metrics: step-0 evaluation, 20 steps (step 10 with an evaluation on fewer
    tasks, reward_mean == success_rate as on FrozenLake unless told), the final evaluation."""
    records: list[dict] = [{"step": 0, "eval": {"success_rate": 0.5, "ci95_low": 0.44,
                                                "ci95_high": 0.56, "tasks": 256}}]
    for step in range(1, 21):
        success = 0.4 + 0.01 * step
        record = {"step": step, "success_rate": success, "loss": 1.0 / step,
                  "reward_mean": success + (0.1 if rewards_differ else 0.0),
                  "generated_tokens": 100 * step, "final": False}
        if step == 10:
            record["eval"] = {"success_rate": 0.5625, "ci95_low": 0.33, "ci95_high": 0.77,
                              "tasks": 16}
        records.append(record)
    records.append({"step": 20, "final": True, "eval": {"success_rate": 0.625,
                                                         "ci95_low": 0.56, "ci95_high": 0.68,
                                                         "tasks": 256}})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


KEYS = ("success_rate", "reward_mean", "loss", "entropy", "generated_tokens")


def test_plot_metrics_draws_held_out_evaluations_with_their_intervals(tmp_path: Path) -> None:
    from matplotlib.container import ErrorbarContainer

    log = _training_log(tmp_path / "metrics.jsonl")
    assert plot_metrics(log, tmp_path / "m.png", keys=KEYS).read_bytes().startswith(PNG_MAGIC)
    success = metrics_figure(log, keys=KEYS).axes[0]
    (bars,) = [c for c in success.containers if isinstance(c, ErrorbarContainer)]
    points, _, (ranges,) = bars.lines
    assert list(points.get_xdata()) == [0, 10, 20]
    assert list(points.get_ydata()) == [0.5, 0.5625, 0.625]
    drawn = [value for (x0, low), (_, high) in ranges.get_segments()
             for value in (x0, low, high)]
    assert drawn == pytest.approx([0, 0.44, 0.56, 10, 0.33, 0.77, 20, 0.56, 0.68])
    assert [t.get_text() for t in success.texts] == ["n=256", "n=16", "n=256"]
    training = [line for line in success.get_lines() if line.get_label().startswith("training")]
    assert list(training[0].get_ydata()) == pytest.approx([0.4 + 0.01 * s for s in range(1, 21)])
    assert len(training) == 2  # per step and its moving average


def test_plot_metrics_joins_the_start_and_end_read_on_the_in_between_tasks(
        tmp_path: Path) -> None:
    """A run that evaluates during training records its start and end on those tasks too
    (``eval_during``): they are drawn, with the in-between evaluations, as one curve."""
    from matplotlib.container import ErrorbarContainer

    log = _training_log(tmp_path / "metrics.jsonl")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    records[0]["eval_during"] = {"success_rate": 0.4375, "ci95_low": 0.2, "ci95_high": 0.6,
                                 "tasks": 16}
    records[-1]["eval_during"] = {"success_rate": 0.75, "ci95_low": 0.5, "ci95_high": 0.9,
                                  "tasks": 16}
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    success = metrics_figure(log, keys=KEYS).axes[0]
    ends, same = [c for c in success.containers if isinstance(c, ErrorbarContainer)]
    assert list(ends.lines[0].get_xdata()) == [0, 10, 20]  # every evaluation, as before
    assert list(same.lines[0].get_xdata()) == [0, 10, 20]
    assert list(same.lines[0].get_ydata()) == [0.4375, 0.5625, 0.75]
    assert "the same 16 tasks throughout" in [t.get_text()
                                              for t in success.get_legend().get_texts()]
    plain = metrics_figure(_training_log(tmp_path / "plain.jsonl"), keys=KEYS).axes[0]
    assert len([c for c in plain.containers if isinstance(c, ErrorbarContainer)]) == 1


def test_plot_metrics_skips_a_series_identical_to_an_earlier_panel(tmp_path: Path) -> None:
    same = metrics_figure(_training_log(tmp_path / "same.jsonl"), keys=KEYS)
    titles = [ax.get_title() for ax in same.axes if ax.get_visible()]
    assert titles == ["success_rate (= reward_mean)", "loss", "generated_tokens"]
    differ = metrics_figure(_training_log(tmp_path / "differ.jsonl", rewards_differ=True),
                            keys=KEYS)
    titles = [ax.get_title() for ax in differ.axes if ax.get_visible()]
    assert titles == ["success_rate", "reward_mean", "loss", "generated_tokens"]


def test_plot_metrics_places_held_out_points_against_tokens(tmp_path: Path) -> None:
    from matplotlib.container import ErrorbarContainer

    log = _training_log(tmp_path / "metrics.jsonl")
    success = metrics_figure(log, keys=KEYS, x="generated_tokens").axes[0]
    (bars,) = [c for c in success.containers if isinstance(c, ErrorbarContainer)]
    # the step-0 evaluation at the start, the final one at the last step's tokens
    assert list(bars.lines[0].get_xdata()) == [0, 1000, 2000]


def test_plot_metrics_held_out_only_log(tmp_path: Path) -> None:
    """An SFT log: loss per step and evaluations, no training success: a success panel of
    held-out points alone."""
    log = tmp_path / "sft.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 0, "eval": {"success_rate": 0.0, "ci95_low": 0.0, "ci95_high": 0.1,
                             "tasks": 32}},
        {"step": 5, "loss": 2.0},
        {"step": 5, "final": True, "eval": {"success_rate": 0.25, "ci95_low": 0.1,
                                            "ci95_high": 0.4, "tasks": 32}}]))
    figure = metrics_figure(log)
    assert [ax.get_title() for ax in figure.axes if ax.get_visible()] == ["success_rate", "loss"]
    assert [t.get_text() for t in figure.axes[0].texts] == ["n=32", "n=32"]


def test_a_compare_plot_keeps_a_success_rate_inside_0_and_1() -> None:
    from treeroll.viz import compare_figure

    banded = compare_figure({"chain": [(0.0, 0.9, 0.7, 1.2), (10.0, 0.95, 0.8, 1.3)]})
    ax = banded.axes[0]
    low, high = ax.get_ylim()
    assert low > -0.05 and high < 1.05  # the t-band above 1 is clipped, and the axis too
    band = ax.collections[0].get_paths()[0].vertices
    assert band[:, 1].max() <= 1.0
    assert ax.get_legend().get_title().get_text() == "strategy (band: 95% CI)"


def test_a_compare_plot_of_one_seed_names_no_band() -> None:
    from treeroll.viz import compare_figure

    one_seed = compare_figure({"chain": [(0.0, 0.5, 0.5, 0.5), (10.0, 0.6, 0.6, 0.6)]})
    title = one_seed.axes[0].get_legend().get_title().get_text()
    assert "no interval" in title and "band" not in title


def test_metrics_success_panel_stays_in_0_1_with_whole_steps(tmp_path: Path) -> None:
    from treeroll.viz import metrics_figure

    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps({"step": s, "success_rate": v}) + "\n"
                           for s, v in ((1, 0.2), (2, 0.5), (3, 0.4))))
    fig = metrics_figure(log)
    ax = next(a for a in fig.axes if a.get_title().startswith("success_rate"))
    low, high = ax.get_ylim()
    assert low > -0.05 and high < 1.05 and high > 0.99
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
