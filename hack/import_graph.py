"""The import graph of one package, read from its source (no import runs): circles, floors, walks.

    .venv/bin/python hack/import_graph.py trainer/kubetune_trainer
    .venv/bin/python hack/import_graph.py trainer/kubetune_trainer --entry prepare --entry training.run
    .venv/bin/python hack/import_graph.py api/kubetune_api cli/kubetune_cli

Every ``import`` and ``from ... import`` of a module of the package is an edge, marked ``top`` when the
statement runs as the module is imported (module or class level, ``if`` blocks included) and ``fn``
when it sits inside a function (it runs when the function is called). Printed:

* circles: the strongly connected components of more than one module, with their edges (an ``fn``
  edge inside a circle is usually an import placed inside a function to dodge the circle);
* floors: the depth of the graph, the longest chain of module-to-module imports once each circle is
  taken as one node, and that chain;
* for each entry module: its stops (every module it reaches), its longest walk (the longest import
  chain from it without visiting a module twice) and its returns (imports met on the way that lead
  back to a module already on the walk, i.e. circles entered);
* rooms: when the package has subpackages, the imports between them (room to room, counted; a
  subpackage ends with ``/``, a module at the top is its own room).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

Edges = dict[str, dict[str, str]]  # module -> {imported module: "top" | "fn"}


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name of every module of the package at ``root`` (``pkg.sub.mod``; ``pkg.sub`` for
    ``__init__.py``)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(node: ast.AST, module: str, is_package: bool, known: set[str]) -> list[str]:
    found = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.append(name)
    elif isinstance(node, ast.ImportFrom):
        source = _resolve(module, is_package, node)
        for alias in node.names:
            if f"{source}.{alias.name}" in known:
                found.append(f"{source}.{alias.name}")
            elif source in known:
                found.append(source)
    return found


def _walk_imports(tree: ast.AST) -> list[tuple[ast.AST, bool]]:
    """Every import statement of ``tree`` and whether it sits inside a function."""
    out: list[tuple[ast.AST, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                out.append((child, in_function))
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, inner)

    visit(tree, False)
    return out


def build(root: Path) -> Edges:
    names = module_names(root)
    known = set(names)
    edges: Edges = {name: {} for name in names}
    for module, path in names.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for node, in_function in _walk_imports(tree):
            for target in _targets(node, module, is_package, known):
                if target == module:
                    continue
                kind = "fn" if in_function else "top"
                if edges[module].get(target) != "top":
                    edges[module][target] = kind
    return edges


def circles(edges: Edges) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative), each sorted; singletons included."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
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
                out.append(sorted(component))
    return out


def floors(edges: Edges, components: list[list[str]]) -> list[list[str]]:
    """The longest chain of imports once each circle is one node: a list of components, importer
    first."""
    owner = {m: i for i, comp in enumerate(components) for m in comp}
    succ: dict[int, set[int]] = defaultdict(set)
    for module, targets in edges.items():
        for target in targets:
            if owner[module] != owner[target]:
                succ[owner[module]].add(owner[target])
    # Tarjan emits a component after every component it imports: the list is in reverse topological order.
    best: dict[int, tuple[int, int | None]] = {}
    for i in range(len(components)):
        options = [(best[j][0], j) for j in succ[i]]
        length, nxt = max(options) if options else (0, None)
        best[i] = (length + 1, nxt)
    start = max(best, key=lambda i: best[i][0]) if best else None
    chain: list[list[str]] = []
    while start is not None:
        chain.append(components[start])
        start = best[start][1]
    return chain


def longest_walk(edges: Edges, entry: str, budget: int = 2_000_000) -> tuple[list[str], int, bool]:
    """The longest import chain from ``entry`` visiting no module twice, how many imports met on
    the way lead back to a module already on the walk, and whether the search finished within
    ``budget`` steps (the problem is exponential in general; these graphs are small)."""
    best: list[str] = [entry]
    returns = 0
    steps = 0
    seen_back: set[tuple[str, str]] = set()
    path = [entry]
    on_path = {entry}
    work = [iter(sorted(edges[entry]))]
    while work and steps < budget:
        steps += 1
        child = next(work[-1], None)
        if child is None:
            work.pop()
            on_path.discard(path.pop())
            continue
        if child in on_path:
            if (path[-1], child) not in seen_back:
                seen_back.add((path[-1], child))
                returns += 1
            continue
        path.append(child)
        on_path.add(child)
        work.append(iter(sorted(edges[child])))
        if len(path) > len(best):
            best = list(path)
    return best, returns, steps < budget


def reach(edges: Edges, entry: str) -> set[str]:
    seen = {entry}
    todo = [entry]
    while todo:
        for child in edges[todo.pop()]:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def room_of(module: str, package: str, rooms: set[str]) -> str:
    parts = module.split(".")
    if len(parts) > 2 and f"{package}.{parts[1]}" in rooms:
        return parts[1] + "/"
    return parts[1] if len(parts) > 1 else "(package)"


def short(module: str, package: str) -> str:
    return module[len(package) + 1 :] if module.startswith(package + ".") else module


def report(root: Path, entries: list[str]) -> None:
    package = root.name
    edges = build(root)
    n_top = sum(kind == "top" for t in edges.values() for kind in t.values())
    n_fn = sum(kind == "fn" for t in edges.values() for kind in t.values())
    print(f"## {package}: {len(edges)} modules, {n_top} top-level imports, {n_fn} function-level imports")
    components = circles(edges)
    multi = [c for c in components if len(c) > 1]
    print(f"circles: {len(multi)}" + ("" if multi else " (none)"))
    for comp in multi:
        print(f"  circle of {len(comp)}: " + ", ".join(short(m, package) for m in comp))
        for module in comp:
            for target, kind in sorted(edges[module].items()):
                if target in comp:
                    print(f"    {short(module, package)} -> {short(target, package)} [{kind}]")
    top_only = {m: {t: k for t, k in ts.items() if k == "top"} for m, ts in edges.items()}
    multi_top = [c for c in circles(top_only) if len(c) > 1]
    print(f"circles with top-level imports only: {len(multi_top)}")
    chain = floors(edges, components)
    print(f"floors: {len(chain)}")
    print("  " + " -> ".join("{" + ", ".join(short(m, package) for m in c) + "}" for c in chain))
    chain_top = floors(top_only, circles(top_only))
    print(f"floors counting top-level imports only: {len(chain_top)}")
    print("  " + " -> ".join("{" + ", ".join(short(m, package) for m in c) + "}" for c in chain_top))
    for entry in entries:
        name = entry if entry.startswith(package) else f"{package}.{entry}"
        if name not in edges:
            print(f"entry {short(name, package)}: not a module")
            continue
        walk, returns, finished = longest_walk(edges, name)
        stops = reach(edges, name)
        print(
            f"entry {short(name, package)}: {len(stops)} stops, longest walk {len(walk)} modules, "
            f"{returns} returns{'' if finished else ' (search cut short)'}"
        )
        print("  " + " -> ".join(short(m, package) for m in walk))
    rooms = {m for m, p in module_names(root).items() if p.name == "__init__.py" and m != package}
    if rooms:
        between: dict[tuple[str, str], int] = defaultdict(int)
        for module, targets in edges.items():
            for target in targets:
                a, b = room_of(module, package, rooms), room_of(target, package, rooms)
                if a != b:
                    between[(a, b)] += 1
        print("rooms (imports from -> to):")
        for (a, b), count in sorted(between.items()):
            print(f"  {a} -> {b}: {count}")
    print()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("packages", nargs="+", type=Path, help="package folders, e.g. trainer/kubetune_trainer")
    p.add_argument("--entry", action="append", default=[], help="entry module (relative to the package)")
    args = p.parse_args(argv)
    for root in args.packages:
        report(root, args.entry if len(args.packages) == 1 else [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
