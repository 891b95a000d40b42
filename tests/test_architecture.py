"""The shape of the code, checked by reading it (`ast`): the layers depend one way.

- no import cycle among fitkit's modules, counting imports inside functions too, nor among
  its packages (importing `a.b.c` runs `a/__init__` and `a/b/__init__` first);
- the packages are layers: each imports only its own modules and the packages below it
  (`LAYERS`); packages on one level (`SIBLINGS`) import neither each other nor anything above;
- jobs, not counts, shape the modules: no module is over 500 lines; a folder past 16 modules is
  reported (give it a subpackage), and one past 20 fails; `fitkit/` itself holds at most 12;
- no module but `fitkit/model.py` touches a private member of `Model`;
- `fitkit/model.py` stays a facade (at most 300 lines) and no function anywhere in the package
  is longer than 60 lines;
- the modules docs/concepts.md names for the checkpoint story exist and hold what it says.
"""

from __future__ import annotations

import ast
import pathlib
import re

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


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside `if TYPE_CHECKING:` blocks: imports that never run."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    return skipped


def _imports(name: str, packages: bool = False) -> set[str]:
    """The fitkit modules `name` imports anywhere in its text (functions included; not under
    `if TYPE_CHECKING:`). With `packages`, also the packages each import runs first (their
    `__init__`), but for `name`'s own, which are being imported already."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
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
    if packages:
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1 + _is_package(name))}
        for target in list(found):
            parts = target.split(".")
            found.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in MODULES and p not in own)
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


def test_no_import_cycle_counting_the_packages_an_import_runs():
    # the checker sees a package's __init__ run by an import of a module inside it
    assert "fitkit.events" in _imports("fitkit.engine.loop", packages=True)
    assert "fitkit.engine" not in _imports("fitkit.engine.loop", packages=True)  # its own: being imported
    graph = {name: _imports(name, packages=True) for name in MODULES}
    assert _cycles(graph) == []


#: The layers, top to bottom: each package imports only packages below it (its own modules aside).
#: A subpackage is a layer of its own (`fitkit.engine.data` sits below the loop in `fitkit.engine`).
LAYER_ROLES = {
    "fitkit": "the public names (lazy) and the `Model` facade",
    "fitkit.facade": "`Model`'s mixins: the overridable steps, Keras' and HF's methods, saving, summary, default callbacks",
    "fitkit.search": "`hyperparameter_search` over Optuna (imported on use)",
    "fitkit.integrations": "trackers behind `report_to` (imported on use)",
    "fitkit.callbacks.keras": "Keras-style callbacks (`Callback`, `LambdaCallback`), the one adapter that runs them on the event set, and Keras' own callbacks",
    "fitkit.callbacks": "one built-in callback a module, and their shared bases",
    "fitkit.callbacks.display": "the progress bar, epoch lines, the printer",
    "fitkit.engine": "the loop, the step, one call from user input to the loop",
    "fitkit.engine.checkpoint": "what a checkpoint holds and when; writing (synchronous and background); verifying, loading",
    "fitkit.engine.checks": "the first-batch checks: armed per source, run on the run's own first batch and forward",
    "fitkit.engine.data": "inputs -> batches: sources, sampling, collation, prefetching, the RNG",
    "fitkit.engine.devices": "Fabric, the one-device path, strategies, launching",
    "fitkit.events": "the callback contract the engine fires: state, control, the handler",
    "fitkit.config": "`TrainingArguments`, names, checks, the compile configuration, option merging",
    "fitkit.adapters": "optimizers, losses, metrics, outputs: names -> torch objects",
    "fitkit.common": "helpers that import nothing of fitkit's other packages",
}
LAYERS = list(LAYER_ROLES)

#: Packages that sit on the level of another (the first of its row in `LAYERS`): neither imports the
#: other, and each imports only what is below that level. New siblings need no cap raised anywhere.
SIBLINGS: dict[str, str] = {"fitkit.engine.checks": "fitkit.engine.checkpoint"}


def _package(name: str) -> str:
    return name if _is_package(name) else name.rsplit(".", 1)[0]


def _level(package: str) -> int:
    """The rank of `package`'s level: siblings share their first package's rank."""
    return LAYERS.index(SIBLINGS.get(package, package))


def test_every_package_is_a_layer():
    assert sorted({_package(n) for n in MODULES}) == sorted(LAYERS)
    assert set(SIBLINGS) <= set(LAYERS)


def _upward(name: str) -> list[str]:
    """What `name` imports from a level above its own, or from a sibling on its level."""
    here = _level(_package(name))
    return sorted(t for t in _imports(name, packages=True)
                  if _package(t) != _package(name) and _level(_package(t)) <= here)


def test_the_layer_check_sees_an_upward_import():
    assert "fitkit.engine.checkpoint.verify" in _imports("fitkit.callbacks.backup_and_restore")  # downward: allowed
    assert _upward("fitkit.callbacks.backup_and_restore") == []
    assert LAYERS.index("fitkit.engine") < LAYERS.index("fitkit.events")  # the engine fires the contract's events


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_module_imports_only_its_own_package_and_the_layers_below(name):
    assert _upward(name) == [], f"{name} ({_package(name)}) imports layers above it"


def test_the_sibling_levels_are_checked():
    assert _level("fitkit.engine.checkpoint") > _level("fitkit.engine")
    for sibling, first in SIBLINGS.items():
        assert sibling in LAYERS and first in LAYERS and _level(sibling) == _level(first)


def test_folders_past_16_modules_are_reported_and_past_20_fail():
    folders: dict[str, int] = {}
    for path in MODULES.values():
        folders[str(path.parent.relative_to(ROOT))] = folders.get(str(path.parent.relative_to(ROOT)), 0) + 1
    crowded = {f: n for f, n in folders.items() if n > 16}
    if crowded:
        print(f"folders past 16 modules (give each a subpackage by job): {crowded}")
    assert {f: n for f, n in folders.items() if n > 20} == {}
    assert folders["fitkit"] <= 12, sorted(p.name for p in PACKAGE.glob("*.py"))


#: The grab bags this round splits by job; each leaves this set as it is split (it ends empty).
SPLITTING: set[str] = set()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_over_500_lines(name):
    lines = MODULES[name].read_text(encoding="utf-8").count("\n")
    if name in SPLITTING:
        pytest.xfail(f"{name}: {lines} lines, being split by job")
    assert lines <= 500, f"{name} has {lines} lines: split it by job, each new module named for what it holds"


def _summary(path: pathlib.Path) -> str:
    """A module's docstring, first sentence."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    return re.split(r"(?<=\.)\s", text, maxsplit=1)[0].rstrip(".")


def module_map() -> str:
    """The module map of docs/concepts.md, made from the code: the layers in order, each module
    with its docstring's first sentence."""
    out = []
    for package in LAYERS:
        folder = ROOT.joinpath(*package.split("."))
        out += [f"**`{folder.relative_to(ROOT)}/`**: {LAYER_ROLES[package]}", "", "| module | holds |", "| --- | --- |"]
        for path in sorted(folder.glob("*.py")):
            if path.name != "__init__.py" or _summary(path):
                held = _summary(path).replace("|", "\\|")
                out.append(f"| `{path.name}` | {held} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


MAP_START, MAP_END = "<!-- module map: made by `python tests/test_architecture.py` -->", "<!-- end of the module map -->"


def test_the_module_map_in_the_docs_is_the_codes():
    text = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    assert MAP_START in text and MAP_END in text
    shown = text.split(MAP_START, 1)[1].split(MAP_END, 1)[0].strip("\n") + "\n"
    assert shown == module_map(), "docs/concepts.md's module map is stale: run `python tests/test_architecture.py`"


def test_the_public_import_paths_hold():
    import fitkit.callbacks.base
    import fitkit.engine.checkpoint
    from fitkit.events.handler import TrainerCallback

    assert fitkit.callbacks.base.TrainerCallback is TrainerCallback is fitkit.TrainerCallback
    assert {"verified", "is_complete", "CheckpointError"} <= set(dir(fitkit.engine.checkpoint)) | set(
        fitkit.engine.checkpoint.__all__)
    from fitkit.engine.checkpoint import CheckpointError, is_complete, verified  # noqa: F401


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


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_function_is_longer_than_60_lines(name):
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    long = [f"{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60]
    assert long == []


# -- the checkpoint story, as docs/concepts.md tells it -------------------------------------------
def _story_table() -> dict[str, list[str]]:
    """The rows of the table under "### The checkpoint story" in docs/concepts.md: module path ->
    the names (in backticks) the docs say it holds."""
    text = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    section = text.split("### The checkpoint story", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 2 and cells[0].startswith("`fitkit/"):
            rows[cells[0].strip("`")] = re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)`", cells[1])
    return rows


def _defined(path: pathlib.Path) -> set[str]:
    """Top-level names a module defines, and `Class.member` for its classes' members."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names.update(f"{node.name}.{n.name}" for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_the_checkpoint_story_modules_hold_what_the_docs_say():
    rows = _story_table()
    assert {"fitkit/engine/checkpoint/checkpointer.py", "fitkit/engine/checkpoint/writing.py"} <= set(rows)
    for module, names in rows.items():
        path = ROOT / module
        assert path.is_file(), f"docs/concepts.md names {module}, which does not exist"
        assert names, f"docs/concepts.md names nothing {module} holds"
        missing = sorted(set(names) - _defined(path))
        assert missing == [], f"docs/concepts.md says {module} holds {missing}, which it does not define"


def test_checkpoint_error_is_defined_where_it_is_raised():
    assert "CheckpointError" in _defined(PACKAGE / "engine" / "checkpoint" / "layout.py")
    assert not any("CheckpointError" in _defined(p) for n, p in MODULES.items() if n != "fitkit.engine.checkpoint.layout")


if __name__ == "__main__":  # rewrite the module map in docs/concepts.md
    page = ROOT / "docs" / "concepts.md"
    text = page.read_text(encoding="utf-8")
    head, rest = text.split(MAP_START, 1)
    page.write_text(head + MAP_START + "\n" + module_map() + rest[rest.index(MAP_END):], encoding="utf-8")
