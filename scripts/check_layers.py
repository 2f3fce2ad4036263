"""The import layers as a checked contract (``make lint`` and ``tests/test_layers.py`` run it).

    .venv/bin/python scripts/check_layers.py          # prints every violation; exit 1 if any

Layers, from the top:

1. **top**: ``memreader.cli`` (the ``memreader`` command, built from the stages), ``memreader.demo`` (the
   whole pipeline as a script), ``memreader.api`` (the Python API over the stages) and ``memreader.integrations``
   (LangChain / LlamaIndex retrievers on the API). Nothing below imports them, except a stage module's ``if __name__ ==
   "__main__":`` block (``python -m <stage module>`` is ``memreader <stage>``).
2. **stages**: ``ingest``, ``data_gen``, ``training``, ``inference``, ``retrieval``, ``eval``. A stage imports the core and
   itself. The one cross-stage direction allowed is ``eval`` → ``inference`` / ``retrieval`` (the evaluation
   reads and retrieves with what those stages ship), and never a private name (``_x``) of another package.
3. **core**: every other ``memreader`` module. It imports only itself (and third-party libraries).

No import cycle between modules, counting imports inside functions too (``__main__`` blocks aside).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("memreader", "ingest", "data_gen", "training", "inference", "retrieval", "eval")
STAGES = ("ingest", "data_gen", "training", "inference", "retrieval", "eval")
TOP = ("memreader.cli", "memreader.demo", "memreader.api", "memreader.integrations")
ALLOWED_CROSS_STAGE = {("eval", "inference"), ("eval", "retrieval")}


def layer(module: str) -> str:
    if module in TOP or module.startswith("memreader.integrations."):
        return "top"
    return "core" if module.split(".")[0] == "memreader" else "stage"


def _is_main_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__")


def _imports(tree: ast.AST) -> Iterator[tuple[int, str, list[str]]]:
    """(line, imported module, names) for every import outside ``if __name__ == "__main__":`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if _is_main_block(child):
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield child.lineno, alias.name, []
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                yield child.lineno, child.module, [a.name for a in child.names]
            stack.append(child)


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name → file, for every module of the project's packages."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def edges(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[tuple[str, str, int, list[str]]]:
    """(importer, imported project module, line, names) for every import between project modules."""
    known = modules(root, packages)
    out = []
    for name, path in known.items():
        for line, target, names in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if target.split(".")[0] not in packages:
                continue
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
            for module in submodules or [target]:
                out.append((name, module, line, [n for n in names if f"{target}.{n}" not in known]))
    return out


def violations(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every broken rule of the module docstring, one line each (empty: the layers hold)."""
    known = modules(root, packages)
    problems = []
    graph: dict[str, set[str]] = {m: set() for m in known}
    for src, dst, line, names in edges(root, packages):
        where = f"{known[src].relative_to(root)}:{line}: {src} imports {dst}"
        graph[src].add(dst)
        src_pkg, dst_pkg = src.split(".")[0], dst.split(".")[0]
        if layer(dst) == "top" and layer(src) != "top":
            problems.append(f"{where}: only the top layer (and __main__ blocks) may import the CLI, the demo, the API or the integrations")
        elif layer(src) == "core" and layer(dst) == "stage":
            problems.append(f"{where}: the core never imports a stage; move the shared service into memreader/")
        elif layer(src) == "stage" and src_pkg != dst_pkg and layer(dst) == "stage" \
                and (src_pkg, dst_pkg) not in ALLOWED_CROSS_STAGE:
            problems.append(f"{where}: a stage never imports a sibling stage; move the shared service into memreader/")
        private = [n for n in names if n.startswith("_")] + [p for p in dst.split(".") if p.startswith("_")
                                                             and p != "__init__"]
        if src_pkg != dst_pkg and private:
            problems.append(f"{where}: private name(s) {', '.join(private)} of another package")
    problems += [f"import cycle among {', '.join(c)}: each imports the next, possibly through the others"
                 for c in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules of each strongly connected component with more than one module (Tarjan): each group
    holds at least one cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main() -> int:
    problems = violations()
    for line in problems:
        print(line)
    print(f"layers: {len(modules())} modules, {len(edges())} internal imports, {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
