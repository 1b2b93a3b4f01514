"""What every record is: a pydantic model that its writer dumps and every reader validates.

The writer builds the model and `write` dumps exactly the fields it set; every reader validates the file
against the same model (strictly: a string is never read as a number), so a hand edit, a merge conflict or a
file from another tool is named by its field, never a KeyError three modules away. Extra fields are kept: a
newer writer's record still reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from reprogate.utils.atomic import write_file
from reprogate.utils.errors import UserError, first_problem, read_json
from reprogate.utils.hashing import content_key


class Record(BaseModel):
    model_config = ConfigDict(extra="allow")


R = TypeVar("R", bound=Record)
Interval = Annotated[list[float], Field(min_length=2, max_length=2)]
# Formats checked wherever a record holds them: a hand-made record cannot carry 50 MB where a
# hash belongs, or an option (`-ofoo`) where `dvc get --rev` takes a commit.
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
CommitId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{7,40}$")]
ModelVersion = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}@[0-9a-f]{1,64}$")]


def dumps(record: Record, indent: int = 2) -> str:
    """The record as its file holds it: the fields its writer set, keys sorted."""
    return (
        json.dumps(record.model_dump(mode="json", exclude_unset=True), indent=indent, sort_keys=True) + "\n"
    )


def write(path: Path, record: Record, indent: int = 2) -> None:
    """Whole or not at all, and in place of a symlink rather than through it: a committed link
    never carries a write to the file it points at."""
    write_file(path, dumps(record, indent).encode())


def validated(raw: str | bytes | dict, shape: type[R], where: str, fix: str) -> R:
    """`raw` (JSON text, or parsed) as `shape`, strictly; or a paragraph naming `where`, field, `fix`."""
    try:
        if isinstance(raw, dict):
            return shape.model_validate(raw, strict=True)
        return shape.model_validate_json(raw, strict=True)
    except ValidationError as e:
        field, found = first_problem(e)
        raise UserError(f"{where}: field '{field}': {found}; {fix}") from None


def load(path: Path, shape: type[R], fix: str) -> R:
    """A record reprogate wrote, or one paragraph naming the file, the field and `fix`."""
    return validated(read_json(path, fix), shape, str(path), fix)


def parse(path: Path, shape: type[R]) -> tuple[R | None, str | None]:
    """(record, None) for a file of this shape; (None, why) for a damaged one (truncated, a merge
    conflict, a field of the wrong type), why naming the file's field; (None, None) if absent."""
    if not path.is_file():
        return None, None
    try:
        return shape.model_validate_json(path.read_bytes(), strict=True), None
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        if first["type"] in ("json_invalid", "json_type"):
            return None, f"{path.name} is not valid JSON ({first['ctx'].get('error', first['msg'])})"
        if first["type"] == "model_type":
            return None, f"{path.name} is not a JSON object"
        # Drop the tags pydantic adds for the set kinds: the user sees sets.test.accuracy.
        field, found = first_problem(e, skip=("labelled", "real_utterance", "out_of_scope", "challenge"))
        return None, f"{path.name} does not have the fields reprogate writes ({field}: {found})"


def record_key(record: Record) -> str:
    """The content key of a record as its file holds it (the fields its writer set)."""
    return content_key(record.model_dump(mode="json", exclude_unset=True))
