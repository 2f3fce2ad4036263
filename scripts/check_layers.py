"""The import layers as a checked contract, by folder (``make lint`` and ``tests/test_layers.py`` run it).

    .venv/bin/python scripts/check_layers.py          # prints every violation; exit 1 if any

Each top-level folder of the checkout is one layer, installed under the one namespace ``memreader``
(pyproject.toml maps the folders onto subpackages):

1. **top** ``memreader/`` → ``memreader``: the CLI, the Python API, the demo, the framework adapters. Nothing below
   imports it, except a stage module's ``if __name__ == "__main__":`` block (``python -m <stage module>`` is
   ``memreader <stage>``).
2. **stages** ``ingest/ data_gen/ training/ inference/ retrieval/ eval/`` → ``memreader.<stage>``. A stage imports
   the core and itself. The one cross-stage direction allowed is ``eval`` → ``inference`` / ``retrieval`` (the
   evaluation reads and retrieves with what those stages ship).
3. **core** ``core/`` → ``memreader.core``: imports only itself (and third-party libraries).
4. **scripts** ``scripts/``: a benchmark or tool may import any layer, but never a private name (``_x``) of the
   project, never another script (shared code lives in the package or in ``scripts/_common.py``), and never
   edits ``sys.path`` to reach one.

No package reads a private name of another package. Imports are followed everywhere: absolute and relative, at
module level and inside functions, and module names given to ``importlib.import_module`` (or kept as strings
for it) count for the layer rules. No import cycle between modules, counting imports inside functions
(``__main__`` blocks and importlib strings aside: those load lazily).
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "memreader"
# folder -> (installed package, layer)
FOLDERS: dict[str, tuple[str, str]] = {
    "memreader": (NAMESPACE, "top"),
    "core": (f"{NAMESPACE}.core", "core"),
    **{stage: (f"{NAMESPACE}.{stage}", "stage")
       for stage in ("ingest", "data_gen", "training", "inference", "retrieval", "eval")},
}
ALLOWED_CROSS_STAGE = {("eval", "inference"), ("eval", "retrieval")}
SCRIPTS = "scripts"
SHARED_SCRIPT = "_common"


@dataclass(frozen=True)
class Edge:
    """One import of a project module: who imports what, where, which names, and how."""

    src: str
    dst: str
    line: int
    names: tuple[str, ...]
    lazy_string: bool = False  # a module name given to importlib (loads lazily; not counted for cycles)


@functools.cache
def _parsed(path: Path) -> tuple[str, ast.Module]:
    """A file's text and syntax tree, read once per run (the rules below each walk it)."""
    text = path.read_text(encoding="utf-8")
    return text, ast.parse(text, str(path))


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Installed dotted module name → file, for every module in the layer folders."""
    out = {}
    for folder, (package, _) in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out[".".join((package, *parts))] = path
    return out


def layer_of(path: Path, root: Path = ROOT) -> str:
    """The layer of a file, from the folder it lives in."""
    folder = path.relative_to(root).parts[0]
    if folder == SCRIPTS:
        return "script"
    return FOLDERS[folder][1]


def stage_of(module: str) -> str:
    """``memreader.eval.qa`` → ``eval``; the top, the core: their own names."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else "top"


def _is_main_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__")


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def _raw_imports(tree: ast.AST, importer: str, is_package: bool) -> Iterator[tuple[int, str, list[str], bool]]:
    """(line, absolute module, names, lazy string) for every import outside ``__main__`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if _is_main_block(child):
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield child.lineno, alias.name, [], False
            elif isinstance(child, ast.ImportFrom):
                yield (child.lineno, _absolute(child.module, child.level, importer, is_package),
                       [a.name for a in child.names], False)
            elif isinstance(child, ast.Constant) and isinstance(child.value, str) \
                    and child.value.startswith(f"{NAMESPACE}.") and " " not in child.value:
                yield child.lineno, child.value, [], True
            stack.append(child)


def edges(root: Path = ROOT) -> list[Edge]:
    """Every import between project modules (and from scripts into the project)."""
    known = modules(root)
    files = {name: (path, path.name == "__init__.py") for name, path in known.items()}
    for path in sorted((root / SCRIPTS).glob("*.py")):
        files[f"{SCRIPTS}.{path.stem}"] = (path, False)
    out = []
    for name, (path, is_package) in files.items():
        for line, target, names, lazy in _raw_imports(_parsed(path)[1], name, is_package):
            if lazy and target not in known:
                continue  # a string that only looks like a module name (a logger, a format)
            if target.split(".")[0] != NAMESPACE:
                if name.startswith(f"{SCRIPTS}.") and (root / SCRIPTS / f"{target.split('.')[0]}.py").exists():
                    out.append(Edge(name, f"{SCRIPTS}.{target}", line, tuple(names)))
                continue
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
            for module in submodules or [target]:
                rest = tuple(n for n in names if f"{target}.{n}" not in known)
                if module != name:
                    out.append(Edge(name, module, line, rest, lazy))
    return out


def _sys_path_edits(path: Path) -> list[int]:
    return [node.lineno for node in ast.walk(_parsed(path)[1])
            if isinstance(node, ast.Attribute) and node.attr in {"insert", "append"}
            and isinstance(node.value, ast.Attribute) and node.value.attr == "path"
            and isinstance(node.value.value, ast.Name) and node.value.value.id == "sys"]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_attributes(path: Path) -> list[tuple[int, str]]:
    """``x._name`` in a script: (line, name), unless ``x`` is the script's own ``self``/``cls``, a third-party
    module imported by the script, or the line says ``# third-party private`` (a library's attribute on an
    object of that library)."""
    text, tree = _parsed(path)
    third_party = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names if alias.name.split(".")[0] != NAMESPACE}
    lines = text.splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            name = getattr(base, "id", "")
            if name in {"self", "cls"} | third_party or "# third-party private" in lines[node.lineno - 1]:
                continue
            found.append((node.lineno, node.attr))
    return found


def _rule(edge: Edge, src_layer: str, dst_layer: str) -> str | None:
    src_stage, dst_stage = stage_of(edge.src), stage_of(edge.dst)
    if src_layer == "script":
        if edge.dst.startswith(f"{SCRIPTS}.") and edge.dst != f"{SCRIPTS}.{SHARED_SCRIPT}":
            return ("a script never imports another script; move the shared code into the package or "
                    f"scripts/{SHARED_SCRIPT}.py")
        return None
    if dst_layer == "top" and src_layer != "top":
        return "only the top layer (and __main__ blocks) may import the CLI, the demo, the API or the integrations"
    if src_layer == "core" and dst_layer == "stage":
        return "the core never imports a stage; move the shared service into core/"
    if src_layer == dst_layer == "stage" and src_stage != dst_stage and (src_stage, dst_stage) not in ALLOWED_CROSS_STAGE:
        return "a stage never imports a sibling stage; move the shared service into core/"
    return None


def violations(root: Path = ROOT) -> list[str]:
    """Every broken rule of the module docstring, one line each (empty: the layers hold)."""
    known = modules(root)
    problems = []
    graph: dict[str, set[str]] = {m: set() for m in known}
    for edge in edges(root):
        src_path = known.get(edge.src, root / SCRIPTS / f"{edge.src.split('.')[-1]}.py")
        where = f"{src_path.relative_to(root)}:{edge.line}: {edge.src} imports {edge.dst}"
        if edge.src in graph and not edge.lazy_string:
            graph[edge.src].add(edge.dst)
        dst_layer = layer_of(known[edge.dst], root) if edge.dst in known else "script"
        broken = _rule(edge, layer_of(src_path, root), dst_layer)
        if broken:
            problems.append(f"{where}: {broken}")
        private = [n for n in edge.names if _is_private(n)] + [
            p for p in edge.dst.split(".") if _is_private(p) and p != SHARED_SCRIPT]
        if private and (edge.src.startswith(f"{SCRIPTS}.") or stage_of(edge.src) != stage_of(edge.dst)):
            problems.append(f"{where}: private name(s) {', '.join(private)} of another package")
    for path in sorted((root / SCRIPTS).glob("*.py")):
        problems += [f"{path.relative_to(root)}:{line}: a script edits sys.path; the project is installed "
                     f"(make setup), import it by its name" for line in _sys_path_edits(path)]
        problems += [f"{path.relative_to(root)}:{line}: a script reads the private attribute {name}; use (or add) "
                     f"a public name in the package" for line, name in _private_attributes(path)]
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
    print(f"layers: {len(modules())} modules, {len(edges())} imports followed (scripts included), "
          f"{len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
