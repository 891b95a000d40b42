"""The shape of the code, checked by reading it (`ast`): the layers depend one way.

- no import cycle among fitkit's modules, counting imports inside functions too;
- no module but `fitkit/model.py` touches a private member of `Model`;
- `fitkit/model.py` stays a facade (at most 300 lines) and no function of the engine is longer
  than 60 lines.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fitkit"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str) -> set[str]:
    """The fitkit modules `name` imports anywhere in its text (functions included)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package this module is in
                package = name if _is_package(name) else name.rsplit(".", 1)[0]
                for _ in range(node.level - 1):
                    package = package.rsplit(".", 1)[0]
                base = f"{package}.{base}" if base else package
            # `from pkg import mod` imports the module `pkg.mod`; `from mod import name`, `mod`
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), as sorted lists."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_the_import_graph_finds_what_it_should():
    # the checker itself: a known edge inside a function and a known top-level edge are seen
    assert "fitkit.search" in _imports("fitkit.model")  # imported inside hyperparameter_search
    assert "fitkit.engine.trainer" in _imports("fitkit.model")
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_fitkit_modules():
    graph = {name: _imports(name) for name in MODULES}
    assert _cycles(graph) == []


def test_the_engine_never_imports_the_facade_or_the_search():
    for name in MODULES:
        if name.startswith("fitkit.engine"):
            assert not _imports(name) & {"fitkit.model", "fitkit.search"}, name


def _model_privates() -> set[str]:
    """Names of `Model`'s private members: its `_methods` and the `self._attributes` it sets."""
    tree = ast.parse((PACKAGE / "model.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_module_but_model_py_uses_a_private_member_of_model():
    privates = _model_privates()
    assert {"_runtime", "_trial"} <= privates  # the checker sees what it must guard
    files = [p for p in ROOT.glob("*/**/*.py") if p.parts[len(ROOT.parts)] in ("fitkit", "tests", "examples", "benchmarks")]
    offenders = []
    for path in files:
        if path == PACKAGE / "model.py" or path == pathlib.Path(__file__).resolve():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr in privates
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert offenders == []


def test_the_facade_is_small():
    lines = (PACKAGE / "model.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"fitkit/model.py has {lines} lines: move engine work into fitkit/engine"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("fitkit.engine")))
def test_no_engine_function_is_longer_than_60_lines(name):
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    long = [f"{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60]
    assert long == []
