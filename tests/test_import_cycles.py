"""No import cycles between modules, typing-only imports included: each tier reads bottom-up, and
a type two modules share lives below both (``docs/concepts/architecture.md``)."""

from __future__ import annotations

import grimp

PACKAGES = ("edge", "simulator", "models", "export", "server", "trickle", "bench")


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    modules = sorted(m for m in graph.modules if m.split(".")[0] in PACKAGES)
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child.split(".")[0] not in PACKAGES:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph(*PACKAGES)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for m in ("edge.a", "edge.b", "edge.c", "edge.d"):
        graph.add_module(m)
    graph.add_import(importer="edge.a", imported="edge.b")
    graph.add_import(importer="edge.b", imported="edge.c")
    graph.add_import(importer="edge.c", imported="edge.a")
    graph.add_import(importer="edge.c", imported="edge.d")
    assert _cycles(graph) == [["edge.a", "edge.b", "edge.c"]]
