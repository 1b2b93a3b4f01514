"""A model folder's files, each read once: its manifest (relative path -> bytes).

Whoever opens a model folder reads it here: every file's bytes are read once, hashed from
those bytes when a promotion's pins are checked (folder/pins.py), and then loaded from the same
bytes (weights by safetensors, a graph by ONNX Runtime, records by pydantic). So what was
verified is what answers: a file swapped between the check and the load cannot be served.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, TypeVar

from reprogate.records.base import Record, validated
from reprogate.utils import paths
from reprogate.utils.errors import UserError

R = TypeVar("R", bound=Record)


def damaged(model_dir: Path) -> str:
    """The fix for a model folder with a missing or damaged file."""
    if paths.PROMOTED.name in model_dir.parts:
        return (
            f"the kept copy {model_dir} is damaged: delete {model_dir.parent} to fall back to the "
            "workspace's models/ (when it holds the promoted files)."
        )
    return (
        f"the model folder {model_dir} is damaged: `dvc checkout {model_dir}` restores what DVC cached, "
        "or `dvc repro` rebuilds it."
    )


class Files:
    """The files of one model folder as read once (relative path -> bytes)."""

    def __init__(self, folder: Path, data: dict[str, bytes]):
        self.dir, self.data = folder, data
        self._sha256: dict[str, str] = {}

    @classmethod
    def read(cls, folder: Path) -> Files:
        if not folder.is_dir():
            return cls(folder, {})
        found = sorted(p for p in folder.rglob("*") if p.is_file())
        return cls(folder, {p.relative_to(folder).as_posix(): p.read_bytes() for p in found})

    @property
    def damaged(self) -> str:
        return damaged(self.dir)

    def has(self, rel: str) -> bool:
        return rel in self.data

    def bytes(self, rel: str) -> bytes:
        if rel not in self.data:
            raise UserError(f"{self.dir / rel} does not exist; {self.damaged}")
        return self.data[rel]

    def sha256(self, rel: str) -> str:
        if rel not in self._sha256:
            self._sha256[rel] = hashlib.sha256(self.bytes(rel)).hexdigest()
        return self._sha256[rel]

    def md5(self, rel: str) -> str:
        return hashlib.md5(self.bytes(rel)).hexdigest()  # what dvc.lock records for a file

    def json(self, rel: str) -> Any:
        try:
            return json.loads(self.bytes(rel).decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{self.dir / rel} is not valid JSON ({e}); {self.damaged}") from None
        except RecursionError:
            deep = f"{self.dir / rel} nests deeper than any file reprogate writes"
            raise UserError(f"{deep}; {self.damaged}") from None

    def record(self, rel: str, shape: type[R]) -> R:
        return validated(self.json(rel), shape, str(self.dir / rel), self.damaged)

    def tensors(self, rel: str) -> dict[str, Any]:
        """A safetensors file's tensors, from the bytes read."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        try:
            return load(self.bytes(rel))
        except (SafetensorError, ValueError) as e:
            raise UserError(f"{self.dir / rel} cannot be read ({e}); {self.damaged}") from None

    def under(self, prefix: str) -> dict[str, bytes]:
        """The files below `prefix/`, relative to it (a folder output DVC hashes as one)."""
        cut = f"{prefix}/"
        return {k[len(cut) :]: v for k, v in self.data.items() if k.startswith(cut)}
