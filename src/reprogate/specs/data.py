"""Data specs: where the raw files come from (pinned), how to read them, how to split them.

Rules here read nothing but the spec itself; that its local files exist is checked by the
loader (specs/loader.py), which knows the project root.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from reprogate.specs.base import OOS_LABEL, Commit, Fraction, Sha256, Strict, plain_relative

MAX_LABEL_CHARS = 100
# An origin's key names its download folder (data/raw/...): a plain name, never a path.
OriginName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=64)]


def check_pinned(origins: dict[str, Origin], where: str, origin: str, file: str) -> None:
    """`origin` is a key of `origins` and pins `file` (a table's or a corpus file's reference)."""
    if origin not in origins:
        raise ValueError(
            f"{where}.origin is '{origin}', which is not a key of origins (have: {sorted(origins)})"
        )
    if file not in origins[origin].files:
        raise ValueError(
            f"{where}.file is '{file}', which origin '{origin}' does not pin; add it with its sha256 "
            f"under origins.{origin}.files or use one of {sorted(origins[origin].files)}"
        )


class UrlSource(Strict):
    kind: Literal["url"]
    url: str = Field(
        description="URL template with {revision} and {file}, e.g. "
        "https://raw.githubusercontent.com/OWNER/REPO/{revision}/folder/{file}"
    )
    revision: Commit

    @field_validator("url")
    @classmethod
    def _pinned(cls, v: str) -> str:
        if not v.startswith(("https://", "http://")):
            # urllib also opens file:// and ftp:// URLs: a spec must not read this machine's files.
            raise ValueError(
                "the URL must start with https:// (or http://); other schemes are not downloaded"
            )
        if "{revision}" not in v or "{file}" not in v:
            raise ValueError(
                "the URL must contain the placeholders {revision} and {file} so that every "
                "download is pinned to the spec's revision; e.g. "
                "https://raw.githubusercontent.com/OWNER/REPO/{revision}/data/{file}"
            )
        return v


class HfSource(Strict):
    kind: Literal["hf"]
    repo: str = Field(
        pattern=r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$",
        description="Hugging Face hub dataset repo as owner/name, e.g. PolyAI/banking77.",
    )
    revision: Commit


class LocalSource(Strict):
    kind: Literal["local"]
    path: str = Field(
        description="Folder holding the raw files, relative to the project root. It must resolve "
        "(after symlinks) inside the project, the mirror, or a folder listed in params.yaml's "
        "data_roots."
    )


Source = Annotated[UrlSource | HfSource | LocalSource, Field(discriminator="kind")]


class Origin(Strict):
    """A pinned set of raw files: where they come from and the sha256 of each."""

    source: Source
    files: dict[str, Sha256] = Field(
        min_length=1,
        description="Raw file name (a plain relative path inside the source: no '..', no absolute "
        "path) -> its sha256.",
    )

    @field_validator("files")
    @classmethod
    def _plain_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if why := plain_relative(key):
                raise ValueError(f"file name {key!r} is not a plain relative name: {why}")
        return v


class Table(Strict):
    """How to read (text, label) rows out of one raw file."""

    origin: str = Field(description="Key of `origins` this file comes from.")
    file: str = Field(description="File name, one of that origin's `files`.")
    format: Literal["csv", "jsonl", "clinc_json"] = "csv"
    text_field: str = Field("text", description="Column (csv) or key (jsonl) holding the text.")
    label_field: str = Field("label", description="Column (csv) or key (jsonl) of the label.")
    keys: list[str] = Field(
        default_factory=list,
        description="clinc_json only: which top-level lists to read, e.g. [oos_test].",
    )
    exclude_labels: list[str] = Field(
        default_factory=list, description="Rows with these source labels are left out on purpose."
    )


class DevTestSplit(Strict):
    """A seeded carve of one evaluation set into `<name>_dev`, which calibration and model
    choices may look at, and `<name>_test`, measured once per change and never tuned on."""

    seed: int
    dev: float = Field(
        gt=0.0,
        lt=1.0,
        description="Share of the rows (of each label's rows, when stratified) that go to <name>_dev, "
        "rounded per label; the rest is <name>_test.",
    )
    stratify: bool = True


SetKind = Literal["out_of_scope", "real_utterance", "challenge"]


class EvalSet(Strict):
    table: Table
    kind: SetKind = Field(
        description="out_of_scope: no item has an intent (the model should not act); "
        "real_utterance: what people actually say, labelled with intents of the vocabulary (the "
        "gate's real_utterance_accuracy_min holds on it); challenge: queries no intent answers "
        "(unrelated, ambiguous, several requests in one), the table's label_field naming each "
        "row's kind, one of `kinds` (the gate's challenge_action_rate_max holds on it)."
    )
    use: Literal["evaluate", "calibrate"] = Field(
        "evaluate",
        description="calibrate: calibration and model choices may look at it (it is still "
        "evaluated, and the gate ignores it); evaluate: never seen before evaluation, judged by "
        "the gate.",
    )
    kinds: list[str] = Field(
        default_factory=list,
        description="challenge only: every kind its rows may have, e.g. [unrelated, ambiguous, "
        "multi_intent]; a row of another kind is an error, never a new kind.",
    )
    split: DevTestSplit | None = Field(
        None,
        description="Carve the set into <name>_dev (use: calibrate) and <name>_test (use: "
        "evaluate) by this seeded rule; `use` is then not given.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> EvalSet:
        if self.kind == "challenge" and not self.kinds:
            raise ValueError(
                "a challenge set must list its kinds, e.g. kinds: [unrelated, ambiguous, multi_intent]"
            )
        if self.kind != "challenge" and self.kinds:
            raise ValueError(f"kinds applies to challenge sets only, not to kind '{self.kind}'")
        if self.split is not None and "use" in self.model_fields_set:
            raise ValueError(
                "a set with a split has two parts: <name>_dev is use: calibrate and <name>_test is "
                "use: evaluate; remove `use`"
            )
        return self

    def parts(self, name: str) -> dict[str, Literal["evaluate", "calibrate"]]:
        """The prepared sets this declaration becomes, with their use."""
        if self.split is None:
            return {name: self.use}
        return {f"{name}_dev": "calibrate", f"{name}_test": "evaluate"}


class SplitPolicy(Strict):
    seed: int = 0
    validation: Fraction = 0.1
    calibration: Fraction = 0.1
    stratify: bool = True

    @model_validator(mode="after")
    def _train_left(self) -> SplitPolicy:
        if self.validation + self.calibration >= 1.0:
            raise ValueError(
                f"validation ({self.validation}) + calibration ({self.calibration}) = "
                f"{self.validation + self.calibration:g} leaves no train rows; keep the sum "
                "below 1, e.g. 0.1 and 0.1"
            )
        return self


class Normalization(Strict):
    """Text normalisation used only to find duplicates; stored texts stay as written."""

    unicode_form: Literal["NFC", "NFKC", "none"] = "NFKC"
    lowercase: bool = True
    strip_punctuation: bool = True
    collapse_whitespace: bool = True


AugmentName = Literal["typos", "casing", "fillers", "contractions", "currencies", "countries"]


class AugmentConfig(Strict):
    """Stage `augment`: readable variants of the train partition (data/augment.py says each rule)."""

    seed: int = 0
    copies: int = Field(1, ge=1, le=10, description="Variants drawn per train row (before dropping).")
    transforms: list[AugmentName] = Field(
        default_factory=lambda: ["typos", "casing", "fillers", "contractions", "currencies", "countries"],
        min_length=1,
        description="Which rules may change a row: typos, casing, fillers, contractions, "
        "currencies, countries.",
    )

    @field_validator("transforms")
    @classmethod
    def _once(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"transforms must be distinct, got {v}")
        return v


class DataSpec(Strict):
    kind: Literal["data"]
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="Dataset id (lowercase).")
    description: str = ""
    origins: dict[OriginName, Origin] = Field(
        min_length=1, description="Pinned raw-file sets by name (letters, digits, _ and -)."
    )
    train: Table
    test: Table
    labels: list[str] = Field(
        min_length=2, description="The label vocabulary: exact strings, in a fixed order."
    )
    split: SplitPolicy = SplitPolicy()
    normalization: Normalization = Normalization()
    dedupe_train: bool = Field(
        True,
        description="Drop train rows whose normalised text repeats an earlier train row or "
        "appears in any held-out or evaluation set (all counted in results/data.json).",
    )
    eval_sets: dict[str, EvalSet] = Field(default_factory=dict)
    negatives: list[Table] = Field(
        default_factory=list,
        description="Out-of-scope training examples, used by model specs that ask for an out-of-scope class.",
    )
    augment: AugmentConfig | None = Field(
        None,
        description="Seeded variants of the train rows (stage augment, data/augmented/train.jsonl), "
        "trained on by model specs with augment: true.",
    )

    @field_validator("labels")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        seen: set[str] = set()
        dup = [x for x in v if x in seen or seen.add(x)]  # type: ignore[func-returns-value]
        if dup:
            raise ValueError(f"labels must be unique; repeated: {sorted(set(dup))}")
        if any(not x.strip() for x in v):
            raise ValueError("labels must be non-empty strings")
        for x in v:
            # A label reaches files, HTTP answers, Home Assistant and the PR report's Markdown:
            # one printable line of bounded length (the report escapes it; this keeps it sane).
            if len(x) > MAX_LABEL_CHARS or not x.isprintable() or x != x.strip():
                raise ValueError(
                    f"label {x[:MAX_LABEL_CHARS]!r}{'...' if len(x) > MAX_LABEL_CHARS else ''} is not "
                    f"accepted: a label is one line of printable characters (no control characters, "
                    f"tabs or line breaks), without spaces at its ends, at most {MAX_LABEL_CHARS} long"
                )
        if OOS_LABEL in v:
            # Models name their own out-of-scope output so; a real intent of that name would
            # never be acted on.
            raise ValueError(
                f"label '{OOS_LABEL}' is reserved for the models' out-of-scope class; rename the "
                "intent, or if it marks queries not to act on, declare them under negatives (training) "
                "and eval_sets with kind: out_of_scope (evaluation)"
            )
        return v

    @model_validator(mode="after")
    def _references(self) -> DataSpec:
        tables = [("train", self.train), ("test", self.test)]
        tables += [(f"eval_sets.{k}.table", e.table) for k, e in self.eval_sets.items()]
        tables += [(f"negatives[{i}]", t) for i, t in enumerate(self.negatives)]
        for where, t in tables:
            check_pinned(self.origins, where, t.origin, t.file)
            if t.format == "clinc_json" and not t.keys:
                raise ValueError(f"{where}.keys must name at least one list for clinc_json")
        reserved = {"train", "validation", "calibration", "test", "negatives"}
        names = [p for n, e in self.eval_sets.items() for p in e.parts(n)]
        clash = reserved & set(names)
        if clash:
            raise ValueError(f"eval_sets may not be named {sorted(clash)} (reserved split names)")
        twice = sorted({p for p in names if names.count(p) > 1})
        if twice:
            raise ValueError(
                f"eval_sets name {twice} twice (a set with a split adds <name>_dev and <name>_test); "
                "rename one"
            )
        return self

    def prepared_sets(self) -> dict[str, tuple[SetKind, Literal["evaluate", "calibrate"]]]:
        """Every evaluation set `prepare` writes, split parts included: name -> (kind, use)."""
        return {p: (e.kind, use) for n, e in self.eval_sets.items() for p, use in e.parts(n).items()}
