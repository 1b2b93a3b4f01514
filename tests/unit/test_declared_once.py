"""Each family and each pipeline kind is declared once (specs/families/, pipeline/kinds.py): the
code that runs them asks the declaration, never `family == "..."` or `kind == "lm"`, so a new
family or kind is one module and no `if` elsewhere."""

from __future__ import annotations

import ast

from reprogate.specs.family import BUILTIN
from reprogate.utils import imports

KIND_NAMES = {"classify", "lm"}
DECLARATIONS = ("reprogate.specs.family", "reprogate.specs.families.", "reprogate.pipeline.kinds")


def _named(node: ast.expr) -> list[str]:
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    names = {*BUILTIN, *KIND_NAMES}
    return [n.value for n in items if isinstance(n, ast.Constant) and n.value in names]


def comparisons() -> list[str]:
    found = []
    for module, path in imports.modules().items():
        if module.startswith(DECLARATIONS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(_named(n) for n in (node.left, *node.comparators)):
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.MatchValue) and _named(node.value):
                found.append(f"{module}:{node.lineno}: case {ast.unparse(node.value)}")
    return found


def test_no_code_outside_the_declarations_compares_a_family_or_kind_name():
    assert comparisons() == [], "ask the Family (specs/family.py) or Kind (pipeline/kinds.py) instead"


def test_the_scan_sees_a_comparison(tmp_path, monkeypatch):
    # The check above must be able to fail: a module that asks `family == "ngram"` is caught.
    (tmp_path / "probe.py").write_text('def f(spec):\n    return spec.family == "ngram"\n')
    monkeypatch.setattr(imports, "modules", lambda: {"reprogate.probe": tmp_path / "probe.py"})
    assert comparisons() == ["reprogate.probe:2: spec.family == 'ngram'"]
