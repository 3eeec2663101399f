"""An adjacency-map graph."""


class Graph:
    """Weighted graph; undirected unless ``directed``."""

    def __init__(self, directed=False):
        self.directed = directed
        self.adjacency = {}

    def add_node(self, node):
        """Add ``node`` if it is new."""
        self.adjacency.setdefault(node, {})

    def add_edge(self, source, target, weight=1):
        """Add an edge (both directions when undirected); weights must be non-negative."""
        if weight < 0:
            raise ValueError("weights must be non-negative")
        self.add_node(source)
        self.add_node(target)
        self.adjacency[source][target] = weight
        if not self.directed:
            self.adjacency[target][source] = weight

    def neighbors(self, node):
        """Sorted neighbours of ``node``."""
        return sorted(self.adjacency.get(node, {}))

    def nodes(self):
        """Sorted nodes."""
        return sorted(self.adjacency)

    def degree(self, node):
        """Number of edges leaving ``node``."""
        return len(self.adjacency.get(node, {}))

    def edge_count(self):
        """Number of edges (an undirected edge counts once)."""
        total = sum(len(targets) for targets in self.adjacency.values())
        return total if self.directed else total // 2

    def weight(self, source, target):
        """Weight of an edge; ``KeyError`` if absent."""
        return self.adjacency[source][target]
