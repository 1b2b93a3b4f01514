"""The package's one-way layers: every import (top-level or inside a function) goes down or
stays in its layer, no module imports itself back through others, stages never import each
other, and no file or function outgrows what a reader holds in their head."""

from __future__ import annotations

import ast

import pytest

from reprogate.utils import imports

# The packages from the bottom: the folder tree is the layer list. A module may import its own
# package and the packages below it, never one above; `__main__` is the entry point above all.
PACKAGES = [
    "utils", "specs", "records", "runtime", "models", "data", "folder", "train", "lm", "export", "predict",
    "pipeline",
    "promote", "registry", "report", "serve", "cli", "__main__",
]  # fmt: skip
MODULES = imports.modules()


def package(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def layer(module: str) -> int:
    top = package(module)
    assert top in PACKAGES, f"{module} is in no package of the layer list: add it to PACKAGES in {__file__}"
    return PACKAGES.index(top)


def _file(module: str) -> str:
    return str(MODULES[module].relative_to(imports.SOURCE.parent.parent))


EDGES = [(a, b) for a in MODULES if a != "reprogate" for b in sorted(imports.imports(a))]


def test_every_module_has_a_layer():
    for m in MODULES:
        if m != "reprogate":
            layer(m)


@pytest.mark.parametrize(("a", "b"), EDGES, ids=[f"{a}->{b}" for a, b in EDGES])
def test_imports_only_go_down(a, b):
    assert layer(b) <= layer(a), (
        f"{_file(a)} ({package(a)}/) imports {_file(b)} ({package(b)}/), a package above it"
    )
    if a.startswith("reprogate.pipeline.stages.") and b.startswith("reprogate.pipeline.stages."):
        pytest.fail(
            f"{_file(a)} imports {_file(b)}: stages never import each other; move what both need down"
        )


def _private_uses(module: str) -> list[str]:
    """`_name`s a module takes from another package: `from reprogate.x.y import _n` or `y._n`."""
    own = package(module)
    aliases: dict[str, str] = {}  # local name -> the reprogate module it names
    found = []
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("reprogate."):
            for a in node.names:
                target = f"{node.module}.{a.name}"
                if target in MODULES:
                    aliases[a.asname or a.name] = target
                elif a.name.startswith("_") and package(node.module) != own:
                    found.append(f"{node.module}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and package(aliases[node.value.id]) != own
        ):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "reprogate"))
def test_no_private_name_crosses_a_package(module):
    assert not _private_uses(module), (
        f"{_file(module)} uses {', '.join(_private_uses(module))}: a name another package needs is "
        "public there (no leading underscore), or the code moves"
    )


def test_no_import_cycle():
    # A package importing its own children is not a cycle unless a child imports it back.
    graph = {m: set(imports.imports(m)) for m in MODULES}
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            cycle = path[path.index(m) :] + [m]
            pytest.fail("import cycle: " + " -> ".join(_file(x) for x in cycle))
        if m in done:
            return
        for n in sorted(graph.get(m, ())):
            visit(n, [*path, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])


def test_an_import_inside_a_function_is_seen():
    # The walk must not be fooled by the old trick of hiding a cycle in a function body.
    # cli imports compile in _compile only
    assert "reprogate.pipeline.compile" in imports.imports("reprogate.cli.main")
    assert "reprogate.promote.promotion" in imports.imports("reprogate.cli.main")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_files_and_functions_stay_small(module):
    source = MODULES[module].read_text()
    assert len(source.splitlines()) <= 400, (
        f"{_file(module)} has {len(source.splitlines())} lines (at most 400)"
    )
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = node.end_lineno - node.lineno + 1
            assert n <= 80, f"{_file(module)}:{node.lineno} {node.name} has {n} lines (at most 80)"


@pytest.mark.parametrize("module", [m for m in MODULES if package(m) in ("predict", "serve")])
def test_serving_never_enters_training(module):
    # What answers a query opens a model folder (folder/, lm/folder.py); the training loop, its
    # checkpoints and ranks are no part of it, not even through another package.
    entered = sorted(m for m in imports.closure(module) if package(m) == "train")
    assert entered == [], f"{module} reaches {entered}"
