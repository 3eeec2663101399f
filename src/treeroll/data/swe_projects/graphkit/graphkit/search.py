"""Traversals, shortest paths, orderings."""

import heapq
from collections import deque


def bfs(graph, start):
    """Nodes in breadth-first order from ``start`` (neighbours in sorted order)."""
    seen = {start}
    order = []
    queue = deque([start])
    while queue:
        node = queue.popleft()
        order.append(node)
        for neighbour in graph.neighbors(node):
            if neighbour not in seen:
                seen.add(neighbour)
                queue.append(neighbour)
    return order


def dfs(graph, start):
    """Nodes in depth-first (pre-)order from ``start``."""
    seen = set()
    order = []
    stack = [start]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        order.append(node)
        for neighbour in reversed(graph.neighbors(node)):
            if neighbour not in seen:
                stack.append(neighbour)
    return order


def shortest_path(graph, source, target):
    """Dijkstra: ``(distance, path)``, or ``(None, [])`` when unreachable."""
    distances = {source: 0}
    previous = {}
    heap = [(0, source)]
    done = set()
    while heap:
        distance, node = heapq.heappop(heap)
        if node in done:
            continue
        done.add(node)
        if node == target:
            break
        for neighbour in graph.neighbors(node):
            candidate = distance + graph.weight(node, neighbour)
            if neighbour not in distances or candidate < distances[neighbour]:
                distances[neighbour] = candidate
                previous[neighbour] = node
                heapq.heappush(heap, (candidate, neighbour))
    if target not in distances:
        return None, []
    path = [target]
    while path[-1] != source:
        path.append(previous[path[-1]])
    return distances[target], path[::-1]


def topological_sort(graph):
    """Kahn's algorithm (smallest available node first); ``ValueError`` on a cycle."""
    indegree = {node: 0 for node in graph.nodes()}
    for node in graph.nodes():
        for neighbour in graph.neighbors(node):
            indegree[neighbour] += 1
    ready = [node for node, degree in indegree.items() if degree == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        node = heapq.heappop(ready)
        order.append(node)
        for neighbour in graph.neighbors(node):
            indegree[neighbour] -= 1
            if indegree[neighbour] == 0:
                heapq.heappush(ready, neighbour)
    if len(order) != len(indegree):
        raise ValueError("graph has a cycle")
    return order


def connected_components(graph):
    """Components of an undirected graph, each sorted, ordered by their smallest node."""
    seen = set()
    components = []
    for node in graph.nodes():
        if node in seen:
            continue
        component = bfs(graph, node)
        seen.update(component)
        components.append(sorted(component))
    return components
