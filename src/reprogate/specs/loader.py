"""Reading specs: YAML in, a validated spec out, and the rules that read another file.

The spec models validate what a file says on its own. What it refers to is checked here, once
the file itself is valid: a data spec's local files exist, a model's data spec exists and
agrees with its head, an ensemble's members exist and fit together, an encoder folder holds a
model. Relative paths inside a spec are relative to the project root (the nearest folder
above the spec holding `params.yaml` or `.dvc`), so a spec means the same from any working dir.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, Field, ValidationError

from reprogate.specs.base import Strict
from reprogate.specs.data import DataSpec, LocalSource
from reprogate.specs.family import Refused
from reprogate.specs.model import ModelSpec
from reprogate.specs.params import Numerics, Params
from reprogate.specs.reading import read_yaml
from reprogate.specs.roots import allowed_roots, confine
from reprogate.specs.text import TextSpec
from reprogate.utils import paths
from reprogate.utils.errors import UserError, format_validation_error

T = TypeVar("T", bound=Strict)


def find_root(start: Path) -> Path:
    """The project root: nearest folder at or above `start` holding params.yaml or .dvc."""
    start = start.resolve()
    for d in [start, *start.parents]:
        if (d / "params.yaml").is_file() or (d / ".dvc").is_dir():
            return d
    return start if start.is_dir() else start.parent


def kind_of(cls: type[Strict]) -> str:
    """The `kind:` a spec class is written with (its Literal field)."""
    return get_args(cls.model_fields["kind"].annotation)[0]


def load_spec(path: Path, expect: type[T]) -> T:
    """Read and validate one spec file of kind `expect`; raise UserError naming file, field, value
    and fix. (A file of any kind: specs/catalog.py, which the stages never import.)"""
    path = Path(path)
    raw = read_yaml(path)
    kind, want = raw.get("kind"), kind_of(expect)
    if kind != want:
        said = f"'{kind}'" if isinstance(kind, str) else repr(kind)
        raise UserError(
            f"{path}: field 'kind' is {said}, but a '{want}' spec is expected here; "
            f"make the first line 'kind: {want}'."
        )
    cls = expect
    try:
        spec = cls.model_validate(raw)
        check_references(spec, find_root(path.parent))
    except ValidationError as err:
        raise UserError(format_validation_error(path, err, cls)) from None
    except Refused as r:
        raise UserError(format_validation_error(path, _as_validation_error(cls, raw, r), cls)) from None
    except UserError as err:
        # A spec this one refers to is broken: name both.
        raise UserError(f"{path}: refers to a spec that is not valid:\n{err}") from None
    return spec  # type: ignore[return-value]


def _as_validation_error(cls: type[BaseModel], raw: dict[str, Any], r: Refused) -> ValidationError:
    """A reference rule's failure in pydantic's shape, so it is reported like every other rule."""
    value: Any = raw
    for part in r.loc:
        value = value.get(part) if isinstance(value, dict) else None
    return ValidationError.from_exception_data(
        cls.__name__, [{"type": "value_error", "loc": r.loc, "input": value, "ctx": {"error": r.message}}]
    )


def check_references(spec: Strict, root: Path) -> None:
    if isinstance(spec, DataSpec | TextSpec):
        _data_files(spec, root)
    elif isinstance(spec, ModelSpec):
        family = spec.family_def
        family.references(spec, root)
        if family.trained:
            _data_of_model(spec, root)


def _data_files(spec: DataSpec | TextSpec, root: Path) -> None:
    """Every local file resolves inside an allowed root, and exists; checked before any is opened."""
    roots = allowed_roots(root)
    for name, o in spec.origins.items():
        if not isinstance(o.source, LocalSource):
            continue
        loc = ("origins", name, "source", "path")
        try:
            folder = confine(
                root, f"origins.{name}.source.path '{o.source.path}'", root / o.source.path, roots
            )
        except ValueError as e:
            raise Refused(loc, str(e)) from None
        for f in o.files:
            try:
                confine(root, f"origins.{name}.files '{f}'", folder / f, roots)
            except ValueError as e:
                raise Refused(("origins", name, "files"), str(e)) from None
            if not (folder / f).is_file():
                raise Refused(
                    (),
                    f"origins.{name}: local file {folder / f} does not exist; "
                    f"fix origins.{name}.source.path or put the file there",
                )


def _data_of_model(spec: ModelSpec, root: Path) -> None:
    try:
        data_path = confine(root, f"data '{spec.data}'", root / spec.data)
    except ValueError as e:
        raise Refused(("data",), str(e)) from None
    if not data_path.is_file():
        raise Refused(
            (),
            f"data is '{spec.data}', but {data_path} does not exist; point it at a "
            "data spec such as specs/data/banking77.yaml",
        )
    raw_kind, want = read_yaml(data_path).get("kind"), spec.family_def.data
    if want == "text":
        _text_of_model(spec, data_path, raw_kind)
        return
    if raw_kind == "text":
        raise Refused(
            ("data",),
            f"data is '{spec.data}', a text corpus (kind: text); family {spec.family} classifies "
            "labelled rows: point it at a data spec (kind: data), or use family causal_lm",
        )
    data = load_spec(data_path, DataSpec)
    expected = len(data.labels) + (1 if spec.head.out_of_scope_class else 0)
    if spec.head.num_labels is not None and spec.head.num_labels != expected:
        raise Refused(
            (),
            f"head.num_labels is {spec.head.num_labels}, but the data spec {spec.data} "
            f"has {len(data.labels)} labels"
            + (" + 1 out-of-scope class" if spec.head.out_of_scope_class else "")
            + f", so the head has {expected} outputs; remove head.num_labels (the size comes "
            f"from the vocabulary) or set it to {expected}",
        )
    if spec.head.out_of_scope_class and not data.negatives:
        raise Refused(
            (),
            f"head.out_of_scope_class is true but the data spec {spec.data} declares no "
            "negatives; add a 'negatives' table there or set it to false",
        )
    if spec.augment and data.augment is None:
        fix = "add one (e.g. `augment: {seed: 0}`) or set augment to false"
        said = f"augment is true but the data spec {spec.data} has no 'augment' section; {fix}"
        raise Refused(("augment",), said)


def _text_of_model(spec: ModelSpec, data_path: Path, raw_kind: object) -> None:
    if raw_kind != "text":
        raise Refused(
            ("data",),
            f"data is '{spec.data}', which is not a text corpus (kind: text); family {spec.family} "
            "learns from one, e.g. specs/data/tinyshakespeare.yaml",
        )
    load_spec(data_path, TextSpec)


def missing_extra(spec: Strict, root: Path) -> str | None:
    """The `make venv EXTRAS=...` a valid spec still needs before it runs here, if any."""
    return spec.family_def.missing_extra(spec, root) if isinstance(spec, ModelSpec) else None


class _NumericsOnly(BaseModel):
    """params.yaml as the pin reads it: its `numerics` alone, the rest checked by each command."""

    model_config = {"extra": "ignore"}
    numerics: Numerics = Field(default_factory=Numerics)


def load_numerics(root: Path) -> Numerics:
    """params.yaml's `numerics`, validated on its own: the entry point pins it before any command
    runs, and a command that does not read the pipeline (`remote`, a stage run in a scratch
    folder) must not fail on another field it never uses."""
    path = root / paths.PARAMS
    raw = read_yaml(path)
    try:
        return _NumericsOnly.model_validate(raw if isinstance(raw, dict) else {}).numerics
    except ValidationError as err:
        raise UserError(format_validation_error(path, err, Params)) from None


def load_params(root: Path) -> Params:
    path = root / paths.PARAMS
    if not path.is_file():
        raise UserError(f"{path}: not found; run reprogate from the project root.")
    try:
        return Params.model_validate(read_yaml(path))
    except ValidationError as err:
        raise UserError(format_validation_error(path, err, Params)) from None
