"""A circle in a dependency graph, for the layer tests of the C core (calls) and of the package (imports)."""
from __future__ import annotations

from typing import Hashable, Iterable, Mapping, TypeVar

Node = TypeVar("Node", bound=Hashable)


def first_circle(graph: Mapping[Node, Iterable[Node]]) -> list[Node] | None:
    """The first circle a depth-first walk finds (its nodes, the first one again at the end), or None.
    Nodes and their edges are visited in sorted order, so the answer is the same on every run."""
    state: dict[Node, int] = {}  # 1: on the current path, 2: done
    path: list[Node] = []

    def visit(node: Node) -> list[Node] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):  # type: ignore[type-var]
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):  # type: ignore[type-var]
        if node not in state:
            circle = visit(node)
            if circle:
                return circle
    return None
