import pytest

from graphkit.graph import Graph
from graphkit.search import bfs, connected_components, dfs, shortest_path, topological_sort


def sample():
    graph = Graph()
    for source, target, weight in [(1, 2, 7), (1, 3, 9), (1, 6, 14), (2, 3, 10), (2, 4, 15),
                                   (3, 4, 11), (3, 6, 2), (4, 5, 6), (5, 6, 9)]:
        graph.add_edge(source, target, weight)
    return graph


def test_bfs():
    assert bfs(sample(), 1) == [1, 2, 3, 6, 4, 5]


def test_dfs():
    assert dfs(sample(), 1) == [1, 2, 3, 4, 5, 6]


def test_shortest_path():
    assert shortest_path(sample(), 1, 5) == (20, [1, 3, 6, 5])


def test_shortest_path_same_node():
    assert shortest_path(sample(), 4, 4) == (0, [4])


def test_shortest_path_unreachable():
    graph = sample()
    graph.add_node(99)
    assert shortest_path(graph, 1, 99) == (None, [])


def test_topological_sort():
    graph = Graph(directed=True)
    for source, target in [(5, 11), (7, 11), (7, 8), (3, 8), (3, 10), (11, 2), (11, 9),
                           (11, 10), (8, 9)]:
        graph.add_edge(source, target)
    assert topological_sort(graph) == [3, 5, 7, 8, 11, 2, 9, 10]


def test_topological_cycle():
    graph = Graph(directed=True)
    graph.add_edge(1, 2)
    graph.add_edge(2, 1)
    with pytest.raises(ValueError):
        topological_sort(graph)


def test_components():
    graph = Graph()
    graph.add_edge(1, 2)
    graph.add_edge(3, 4)
    graph.add_node(5)
    assert connected_components(graph) == [[1, 2], [3, 4], [5]]
