"""YAML in, plain data out, in bounded memory and time.

A spec is a small hand-written file. Three things a hostile or careless file can do to a YAML
reader are refused before they cost anything: a file too large (read at most MAX_BYTES + 1
bytes, never the whole of it), aliases that expand into more nodes than a spec ever needs (a
"billion laughs" of a few hundred bytes), and a key given twice in one mapping (PyYAML keeps
the last one silently, and a spec would train with a value its author did not see).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from reprogate.utils.errors import UserError

MAX_BYTES = 1 << 20
# How many nodes aliases may add in one file. Anchors that reuse a block or two stay far below;
# an alias bomb passes it after a few levels, before anything large has been built.
MAX_ALIAS_NODES = 10_000


class _SpecLoader(yaml.SafeLoader):
    """safe_load, with the duplicate-key and alias-expansion rules above."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._weights: dict[int, int] = {}  # node id -> nodes it stands for, aliases expanded
        self._added = 0
        # node id -> the keys written in that mapping itself: a merge (`<<: *base`) adds keys
        # later, and a key written beside it overrides theirs on purpose.
        self._own_keys: dict[int, list[yaml.Node]] = {}

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:
                weight = self._weights.get(id(target))
                if weight is None:  # its anchor is still open: the node would contain itself
                    raise yaml.composer.ComposerError(
                        None,
                        None,
                        f"alias *{event.anchor} refers to a node that contains it",
                        event.start_mark,
                    )
                self._added += weight
                if self._added > MAX_ALIAS_NODES:
                    raise yaml.composer.ComposerError(
                        None,
                        None,
                        f"aliases expand to more than {MAX_ALIAS_NODES} nodes (at *{event.anchor})",
                        event.start_mark,
                    )
        node = super().compose_node(parent, index)
        if isinstance(node, yaml.MappingNode) and id(node) not in self._own_keys:
            self._own_keys[id(node)] = [k for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"]
        if id(node) not in self._weights:
            self._weights[id(node)] = 1 + sum(self._weights.get(id(c), 1) for c in _children(node))
        return node

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node in self._own_keys.get(id(node), []):
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first at line {first + 1})", key_node.start_mark
                )
        return super().construct_mapping(node, deep)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _bounded_text(path: Path) -> str:
    if not path.is_file():
        raise UserError(f"{path}: file not found; check the path (specs live under specs/).")
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise UserError(
            f"{path}: over {MAX_BYTES // 1024} KiB; a spec is a short hand-written file, so this is "
            "not one (or it inlines data): keep data in the files a data spec pins, not in the spec."
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason}); save it as UTF-8.") from None


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> Any:
    # One pipeline's specs name each other many times (an ensemble's members, their data spec):
    # the same text is parsed once per process, and every caller gets its own copy.
    return yaml.load(text, Loader=_SpecLoader)  # noqa: S506 (a SafeLoader)


def read_yaml(path: Path) -> dict[str, Any]:
    """A spec file's mapping, or one paragraph naming the file, the place and the fix."""
    text = _bounded_text(path)
    try:
        raw = copy.deepcopy(_parsed(text))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        if "given twice" in problem:
            fix = "keep one of them"
        elif "alias" in problem:
            fix = "write the repeated values out, or reuse fewer of them"
        else:
            fix = "fix the indentation or quoting there"
        raise UserError(f"{path}: not valid YAML{where}: {problem}; {fix}.") from None
    except RecursionError:
        raise UserError(
            f"{path}: nests deeper than Python can read (lists or mappings inside each other "
            "thousands of times); a spec is a few levels deep: write it out flat."
        ) from None
    if not isinstance(raw, dict):
        raise UserError(
            f"{path}: a spec must be a YAML mapping (key: value lines), got {type(raw).__name__}; "
            "start it with 'kind: data', 'kind: model' or 'kind: gate'."
        )
    return raw
