"""What every spec kind shares: the strict base model, field types, and the content hash.

Specs are strict: unknown keys are errors, and a string is never coerced into a number.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, TypeAdapter

# The name of a model's own out-of-scope output (head.out_of_scope_class): no intent may use it.
OOS_LABEL = "out_of_scope"

Sha256 = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9a-f]{64}$"),
    Field(description="sha256 of the raw file: 64 lowercase hex digits (`sha256sum FILE`)."),
]
Commit = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9a-f]{40}$"),
    Field(description="An immutable revision: a full 40-hex-digit commit id, never a branch."),
]
# A model's name: the file specs/models/NAME.yaml and the folders models/NAME, runs/NAME. A plain
# name by construction (no separator, never "." or ".."), so it can never name a path elsewhere.
ModelName = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=64),
    Field(description="A model spec's name: specs/models/NAME.yaml (letters, digits, _ and -)."),
]
Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]
PosInt = Annotated[int, Field(ge=1)]
Pair = Annotated[list[PosInt], Field(min_length=2, max_length=2)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# One folder, or none, is a list too (params.yaml's `mirror`).
Folders = Annotated[
    list[str], BeforeValidator(lambda v: [v] if isinstance(v, str) and v else [] if v in (None, "") else v)
]
FOLDERS = TypeAdapter(Folders, config=ConfigDict(strict=True))


def plain_relative(key: str) -> str | None:
    """Why `key` is not a plain relative file name (None when it is one): a name a spec pins
    inside its origin's folder must stay inside it whatever the platform, so no absolute path,
    no drive letter, no backslash, no empty, '.' or '..' part. Paths are still resolved and
    confined where they are opened (specs/roots.py); this rule keeps the spec itself honest."""
    if not key or len(key) > 255:
        return "it must be 1 to 255 characters"
    if any(ord(c) < 32 for c in key) or "\\" in key:
        return "it holds a control character or a backslash; use '/' between folders"
    if key.startswith("/") or (len(key) > 1 and key[1] == ":"):
        return "it is an absolute path; give the name relative to the origin's folder"
    if any(part in ("", ".", "..") for part in key.split("/")):
        return "a part of it is empty, '.' or '..'; name the file inside the origin's folder"
    return None


def spec_hash(spec: BaseModel, exclude: set[str] | None = None) -> str:
    """Hash of the validated content (comments and key order do not change it)."""
    return content_hash(spec.model_dump(mode="json", exclude=exclude))


def content_hash(dumped: dict) -> str:
    blob = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
