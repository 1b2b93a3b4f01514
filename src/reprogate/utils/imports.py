"""The package's own import graph, read from the source (every import, top-level or inside a
function). `compile` derives each stage's code dependencies from it, and the layer test checks
that imports only go down."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = "reprogate"
SOURCE = Path(__file__).resolve().parent.parent


def module_file(module: str) -> Path | None:
    """The file of a reprogate module (a package's __init__.py), or None if there is none."""
    parts = module.split(".")[1:]
    p = SOURCE.joinpath(*parts)
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(SOURCE.rglob("*.py")):
        parts = [PACKAGE, *f.relative_to(SOURCE).with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _target(name: str) -> str | None:
    """The nearest reprogate module a dotted name lives in (`reprogate.models.build` -> models)."""
    while name.startswith(PACKAGE):
        if module_file(name) is not None:
            return name
        name = name.rpartition(".")[0]
    return None


@cache
def imports(module: str) -> frozenset[str]:
    """The reprogate modules `module` imports, by any import statement anywhere in it."""
    f = module_file(module)
    if f is None:
        return frozenset()
    is_package = f.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
        for n in names:
            t = _target(n)
            if t and t != module:
                out.add(t)
    return frozenset(out)


def parents(module: str) -> list[str]:
    """The packages Python runs before `module` (not the top-level one, which is empty)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def closure(*start: str) -> set[str]:
    """Every reprogate module that importing `start` runs."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += [*imports(m), *parents(m)]
    return seen


def source_path(module: str) -> str:
    """The module's file relative to the project root, as dvc.yaml names it."""
    f = module_file(module)
    assert f is not None, module
    return f"src/{f.relative_to(SOURCE.parent).as_posix()}"
