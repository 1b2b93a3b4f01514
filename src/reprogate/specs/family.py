"""Model families, each declared once by a `Family` object, and how a spec's `family:` finds one.

A family is named in a model spec three ways: a built-in name (`ngram`, `encoder`, `ensemble`,
`causal_lm`, `export`), the name of an entry point in the group `reprogate.families` that the
user's installed package declares, or `module:Class` importable from the project. Its
declaration is light (pydantic only): the parts that need torch, ONNX or a stage's machinery
are named as "module:attribute" strings and imported only where a stage calls them, so one
family's code is never a dependency of another family's stages (utils/imports.py reads the
strings to hash what a family's stages run).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from reprogate.utils import paths

GROUP = "reprogate.families"
BUILTIN = {
    "ngram": "reprogate.specs.families.ngram:Ngram",
    "encoder": "reprogate.specs.families.encoder:Encoder",
    "ensemble": "reprogate.specs.families.ensemble:Ensemble",
    "causal_lm": "reprogate.specs.families.causal_lm:CausalLm",
    "export": "reprogate.specs.families.export:Export",
}
_REF = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_SECTION = re.compile(r"^[a-z][a-z0-9_]*$")


class Refused(Exception):
    """A rule that reads another file failed: where in the spec (a pydantic location) and why."""

    def __init__(self, loc: tuple[str, ...], message: str):
        super().__init__(message)
        self.loc, self.message = loc, message


class Family:
    """What one model family is, for every stage that asks. Subclass it for your own family
    (docs/your-own-model.md): `name`, `config` and `build` are all a classifier family needs."""

    name: ClassVar[str]
    config: ClassVar[type[BaseModel]]  # the spec's section named `name`
    kind: ClassVar[str] = "classify"  # the pipeline kind whose stages train it (pipeline/kinds.py)
    trained: ClassVar[bool] = True  # False: built from other candidates (an ensemble, an export)
    built_by: ClassVar[str] = "train"  # the stage that writes its model folder
    weights: ClassVar[str] = "model.safetensors"  # its model folder's weights file
    files: ClassVar[tuple[str, ...]] = paths.TRAIN_FILES  # what its model folder holds
    # What its train and resume-check stages read (DVC paths; ${key} is the model's name).
    # ${item.features}: the model whose features@ stage writes its features (itself, unless shared).
    inputs: ClassVar[tuple[str, ...]] = ("data/prepared", "data/features/${item.features}")
    # Plots its train stage writes beside the loss curve (DVC plot entries).
    plots: ClassVar[tuple[dict[str, Any], ...]] = ()
    # Answers with text it writes (`reprogate generate`, POST /generate), not with a label: it has
    # no calibration, no routing policy and no labels.json.
    generates: ClassVar[bool] = False
    planned: ClassVar[bool] = False  # may train for budget.train_minutes (`reprogate plan`)
    # Compiled from a source (an export): the gate also reads how well the two agree.
    compiled: ClassVar[bool] = False
    data: ClassVar[str] = "data"  # the `kind:` of the data spec it learns from ("text": a corpus)
    # build(spec, n_out, root) -> (torch module, featurizer), models/base.py's contract.
    build: ClassVar[Any] = None
    # assets(folder, spec, module, featurizer): what a model folder's assets/ holds beside the
    # weights (None: the featurizer's key as featurizer.json).
    assets: ClassVar[Any] = None
    # onnx(scorer) -> (torch module from its inputs to (logits, embedding), [export.graph.Input]):
    # its graph in an export (export/graph.py). None: no export can compile it.
    onnx: ClassVar[Any] = None
    # The class that opens its model folder and scores texts (predict, evaluate, serve), called as
    # Scorer(root, name, model_dir, device=, members_dir=, files=, members=): `files` is its folder
    # as read once and verified (folder/manifest.Files; load from it, never from disk again), and
    # it keeps it as `.files`; `members` the same for the folders it is built from.
    scorer: ClassVar[Any] = "reprogate.folder.scorer:Scorer"
    # What sets a training run up (data, model, optimizer, checkpoints); train/job.py runs it.
    setup: ClassVar[Any] = "reprogate.train.run:Setup"

    @property
    def exportable(self) -> bool:
        """Whether an export (ONNX) may compile it: it declares its graph."""
        return type(self).onnx is not None

    def rules(self, spec: Any) -> None:
        """Rules on the spec alone beyond its section's own; raise ValueError with the fix."""

    def references(self, spec: Any, root: Path) -> None:
        """Rules that read other files beyond its data spec (an ensemble's members); raise Refused."""

    def sources(self, spec: Any) -> list[str]:
        """The candidates a family that is not trained is built from (an ensemble's members)."""
        return []

    def missing_extra(self, spec: Any, root: Path) -> str | None:
        """The `make venv EXTRAS=...` a valid spec still needs before it runs here, if any."""
        return None

    def caches_embeddings(self, spec: Any) -> bool:
        """Whether its cached features are sentence embeddings a nearest-neighbour vote can search."""
        return False

    def shared_features(self, spec: Any) -> dict[str, Any] | None:
        """What shapes its cached features when another model's `features@` stage may write them
        (models whose answers are equal, and whose data and rows are, share one stage: a frozen
        encoder's embeddings are encoded once, not once per head). None: its own stage."""
        return None

    def fingerprint(self, featurizer: Any) -> dict[str, Any]:
        """What training's fingerprint records beside spec, data and code (an encoder's sha256)."""
        return {}

    def part(self, attribute: str) -> Any:
        """One of its parts by attribute name, imported now if it is given as "module:attr"."""
        # From the class: a function given as `build = build` stays a plain function, not a method.
        value = getattr(type(self), attribute)
        return load_object(value) if isinstance(value, str) else value

    def references_to_code(self, parts: tuple[str, ...] | None = None) -> list[str]:
        """The modules its declaration and its named parts live in: what a stage that runs
        `parts` of it (None: all of them) runs. Its config is part of every stage: each reads
        the spec."""
        refs = [type(self).__module__]
        for attr in dir(type(self)):
            if parts is not None and attr not in (*parts, "config"):
                continue
            value = getattr(type(self), attr, None)
            if isinstance(value, str) and _REF.match(value):
                refs.append(value.partition(":")[0])
            elif callable(value) and getattr(value, "__module__", None) and not attr.startswith("_"):
                refs.append(value.__module__)
        return sorted({r for r in refs if r and r != __name__ and r != "builtins"})


def load_object(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _installed() -> dict[str, str]:
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=GROUP)}


def _unknown(name: str) -> str:
    installed = sorted(_installed())
    found = f"; entry points installed here: {', '.join(installed)}" if installed else ""
    return (
        f"family is '{name}', which is not a built-in family ({', '.join(BUILTIN)}), not an entry "
        f"point of the group '{GROUP}' in an installed package{found}, and not 'module:Class'. "
        "Fix the name; for your own family declare the entry point in your package's pyproject.toml "
        f'([project.entry-points."{GROUP}"] {name} = "your_module:YourFamily") and reinstall it '
        "(pip install -e .), or write family: your_module:YourFamily"
    )


def family(name: str) -> Family:
    """The family a spec names; ValueError with the fix when there is none."""
    if not isinstance(name, str):
        raise ValueError(f"family must be a string naming a family, got {name!r}")
    return _family(name)


@cache
def _family(name: str) -> Family:
    ref = BUILTIN.get(name) or _installed().get(name)
    if ref is None and ":" in name:
        # `module:Class` of the project itself: every command runs in the project's folder, but an
        # installed console script does not put that folder on the import path.
        ref = name
        if str(Path.cwd()) not in sys.path:
            sys.path.append(str(Path.cwd()))
    if ref is None:
        raise ValueError(_unknown(name))
    if not _REF.match(ref):
        raise ValueError(
            f"family '{name}' names '{ref}', which is not 'module:Class'; write e.g. my_model:MyFamily"
        )
    try:
        obj = load_object(ref)
    except ImportError as e:
        raise ValueError(
            f"family '{name}' names '{ref}', but importing it failed ({e}); install the package that "
            "provides it here (pip install -e .), or fix the module name"
        ) from None
    except AttributeError:
        module, _, attr = ref.partition(":")
        raise ValueError(f"family '{name}': module {module} has no '{attr}'; fix the class name") from None
    if isinstance(obj, type) and issubclass(obj, Family):
        obj = obj()
    if not isinstance(obj, Family):
        raise ValueError(
            f"family '{name}' names '{ref}', which is not a reprogate Family; subclass "
            "reprogate.specs.family.Family (docs/your-own-model.md)"
        )
    if not isinstance(getattr(obj, "name", None), str) or not _SECTION.match(obj.name):
        raise ValueError(
            f"family '{name}' ({ref}) has name {getattr(obj, 'name', None)!r}; a family's name is its "
            "spec section: lowercase letters, digits and _"
        )
    if not (isinstance(getattr(obj, "config", None), type) and issubclass(obj.config, BaseModel)):
        raise ValueError(
            f"family '{name}' ({ref}) has no pydantic `config` class for its section '{obj.name}'"
        )
    return obj
