import pytest

from graphkit.graph import Graph


def make():
    graph = Graph()
    graph.add_edge("a", "b", 2)
    graph.add_edge("b", "c", 3)
    return graph


def test_undirected_edges_both_ways():
    graph = make()
    assert graph.neighbors("b") == ["a", "c"]
    assert graph.weight("c", "b") == 3


def test_directed_edges_one_way():
    graph = Graph(directed=True)
    graph.add_edge(1, 2)
    assert graph.neighbors(1) == [2]
    assert graph.neighbors(2) == []


def test_negative_weight():
    with pytest.raises(ValueError):
        Graph().add_edge(1, 2, -1)


def test_nodes_and_degree():
    graph = make()
    assert graph.nodes() == ["a", "b", "c"]
    assert graph.degree("b") == 2
    assert graph.degree("zzz") == 0


def test_edge_count():
    assert make().edge_count() == 2
    directed = Graph(directed=True)
    directed.add_edge(1, 2)
    directed.add_edge(2, 1)
    assert directed.edge_count() == 2
