"""The package's own import graph, read from the source (every import, top-level or inside a
function). `compile` derives each stage's code dependencies from it, and the layer test checks
that imports only go down."""

from __future__ import annotations

import ast
import atexit
import hashlib
import importlib.util
import json
import os
from functools import cache
from pathlib import Path

PACKAGE = "reprogate"
SOURCE = Path(__file__).resolve().parent.parent


def module_file(module: str) -> Path | None:
    """The file of a module of this package or of a user's package outside it (a family named
    `module:Class`), a package's __init__.py; None if there is none."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return _outside_file(module)
    parts = module.split(".")[1:]
    p = SOURCE.joinpath(*parts)
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


@cache
def _outside_file(module: str) -> Path | None:
    """A user's module, found as Python would import it (its parent packages are imported to
    find it, as naming the family in a spec imports them anyway)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    return origin if origin is not None and origin.suffix == ".py" and origin.is_file() else None


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(SOURCE.rglob("*.py")):
        parts = [PACKAGE, *f.relative_to(SOURCE).with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _target(name: str, own: str) -> str | None:
    """The nearest module of this package or of the importer's own top-level package `own` that
    a dotted name lives in (`reprogate.models.build` -> models); None for any other library."""
    while name == own or name.startswith(own + ".") or name.startswith(PACKAGE + "."):
        if module_file(name) is not None:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported_names(module: str, tree: ast.Module, is_package: bool) -> list[str]:
    """Every dotted name an import statement anywhere in `tree` names, relative ones resolved."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            names += [f"{base}.{a.name}" for a in node.names]
    return names


@cache
def imports(module: str) -> frozenset[str]:
    """The modules of this package (and of the module's own top-level package) that `module`
    imports, by any import statement anywhere in it."""
    facts = _facts(module)
    if facts is None:
        return frozenset()
    targets = (_target(n, module.partition(".")[0]) for n in facts["names"])
    return frozenset(t for t in targets if t and t != module)


def parents(module: str) -> list[str]:
    """The packages Python runs before `module` (not this package's top level, which is empty)."""
    parts = module.split(".")
    first = 2 if parts[0] == PACKAGE else 1
    return [".".join(parts[:i]) for i in range(first, len(parts))]


def closure(*start: str) -> set[str]:
    """Every module of this package (or of a start's own package) that importing `start` runs."""
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


# --- Code identity by meaning --------------------------------------------------------------
# A stage's identity is what its modules mean, not their bytes: a comment, a docstring or a
# reformat leaves it, so DVC reruns nothing and a finished training is not thrown away. The
# canonical form below is the syntax tree with docstrings dropped; fields that are None or empty
# are left out, so Python 3.11, 3.12 (type_params) and 3.13 (which omits them itself) agree.

_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


@cache
def _tree(module: str) -> ast.Module:
    f = module_file(module)
    return ast.parse(f.read_text(encoding="utf-8")) if f is not None else ast.Module(body=[])


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _canonical(node: object) -> str:
    if isinstance(node, list):
        return "[" + ",".join(_canonical(x) for x in node) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = []
    for name, value in ast.iter_fields(node):
        if name == "body" and isinstance(node, _DOCUMENTED) and value and _is_docstring(value[0]):
            value = value[1:]
        if name == "kind" and isinstance(node, ast.Constant):
            continue  # the u prefix of a string: the same value
        if value is None or value == []:
            continue
        fields.append(f"{name}={_canonical(value)}")
    return f"{type(node).__name__}({','.join(fields)})"


def source_meaning(source: str) -> str:
    """sha256 of what Python source means: its syntax tree without docstrings, comments or layout."""
    return hashlib.sha256(_canonical(ast.parse(source)).encode()).hexdigest()


@cache
def meaning(module: str) -> str:
    facts = _facts(module)
    return facts["meaning"] if facts is not None else hashlib.sha256(b"").hexdigest()


# Parsing and walking every module a pipeline runs takes about a second on each `dvc repro`.
# What a file means and what it imports follow from its name and bytes alone, so both are kept
# under the sha256 of those (a changed file is a new key; nothing is ever stale), in the user's
# cache folder. A cache that cannot be read or written is only slower.
_MEMO_FILE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / PACKAGE / "code-meanings.json"
_MEMO_MAX = 4000
_memo: dict[str, dict] | None = None
_memo_added: list[str] = []


def _memo_table() -> dict[str, dict]:
    global _memo
    if _memo is None:
        try:
            _memo = json.loads(_MEMO_FILE.read_text(encoding="utf-8"))
            assert isinstance(_memo, dict)
        except (OSError, ValueError, AssertionError):
            _memo = {}
        atexit.register(_save_memo)
    return _memo


def _save_memo() -> None:
    if not _memo_added or _memo is None:
        return
    try:
        _MEMO_FILE.parent.mkdir(parents=True, exist_ok=True)
        tmp = _MEMO_FILE.with_name(f"{_MEMO_FILE.name}.{os.getpid()}.tmp")
        kept = dict(list(_memo.items())[-_MEMO_MAX:])  # the newest: every edit adds a key
        tmp.write_text(json.dumps(kept), encoding="utf-8")
        os.replace(tmp, _MEMO_FILE)
    except OSError:
        pass


def _facts(module: str) -> dict | None:
    """{"meaning": sha256 of its canonical tree, "names": what it imports, "parts": the family
    parts it asks for}, or None: no file."""
    f = module_file(module)
    if f is None:
        return None
    data = f.read_bytes()
    key = hashlib.sha256(f"{_FACTS_VERSION}\0{module}\0{f.name}\0".encode() + data).hexdigest()
    table = _memo_table()
    if key not in table:
        tree = ast.parse(data.decode("utf-8"))
        table[key] = {
            "meaning": hashlib.sha256(_canonical(tree).encode()).hexdigest(),
            "names": _imported_names(module, tree, f.name == "__init__.py"),
            "parts": _parts_asked(tree),
        }
        _memo_added.append(key)
    return table[key]


_FACTS_VERSION = 2  # what _facts records; a new field is a new key, never a stale entry
ANY_PART = "*"


def _parts_asked(tree: ast.Module) -> list[str]:
    """The family parts a module asks for by name, `family.part("scorer")` (specs/family.py);
    ANY_PART when one is named by a value the source does not spell out, which then means all."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "part":
            arg = node.args[0] if len(node.args) == 1 and not node.keywords else None
            literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            out.add(arg.value if literal else ANY_PART)  # type: ignore[union-attr]
    return sorted(out)


def parts_asked(mods: set[str]) -> frozenset[str] | None:
    """The family parts the modules `mods` ask for (None: any part, so all of them count)."""
    asked = {p for m in mods for p in (_facts(m) or {"parts": []})["parts"]}
    return None if ANY_PART in asked else frozenset(asked)


def constant(module: str, name: str) -> object:
    """A module-level constant (`RUNS = ("train",)`), read from the source without importing it
    (importing a stage imports torch)."""
    for node in _tree(module).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(node.value)
    return None


def stage_modules(stage: str) -> set[str]:
    """Every reprogate module `reprogate stage STAGE` runs: its module's import closure and those
    of the stages it runs as child processes (its RUNS)."""
    top = f"{PACKAGE}.pipeline.stages.{stage}"
    runs = (stage, *(constant(top, "RUNS") or ()))
    return closure(*(f"{PACKAGE}.pipeline.stages.{n}" for n in runs)) - {PACKAGE}


def stage_identity(stage: str, extra: tuple[str, ...] = ()) -> tuple[str, dict[str, str]]:
    """(identity, {module: meaning}) of a stage's code, with the modules `extra` imports (its
    model's family, named by the family's declaration): the hash DVC compares (code/) and
    training's fingerprint holds."""
    mods = stage_modules(stage) | (closure(*extra) - {PACKAGE} if extra else set())
    meanings = {m: meaning(m) for m in sorted(mods)}
    joined = "".join(f"{m}\0{h}\n" for m, h in meanings.items())
    return hashlib.sha256(joined.encode()).hexdigest(), meanings
