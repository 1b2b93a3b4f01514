"""Text specs (`kind: text`): a pinned corpus for language models, how it is read, how it is
split into train and validation by contiguous stretches, and the prompts samples start from.

The origins are the data spec's (url, hf or local; a sha256 per file; the same mirror). Rules
here read nothing but the spec itself; the loader checks that local files exist.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from reprogate.specs.base import Fraction, PosInt, Strict
from reprogate.specs.data import Origin, OriginName, check_pinned


class CorpusFile(Strict):
    origin: str = Field(description="Key of `origins` this file comes from.")
    file: str = Field(description="File name, one of that origin's `files`.")


class Canonical(Strict):
    """How raw bytes become the text every tokenizer and metric sees (stated once, applied by
    the `corpus` stage; the files themselves are never changed)."""

    encoding: Literal["utf-8"] = "utf-8"
    newlines: Literal["lf", "keep"] = Field(
        "lf",
        description="lf: CRLF and CR become LF (what Python's text mode does, and so nanoGPT's "
        "prepare.py); keep: the bytes' own line ends.",
    )
    unicode_form: Literal["none", "NFC", "NFKC"] = "none"
    joiner: str = Field(
        "\n", description="Put between two corpus files (the files are concatenated in order)."
    )


class TextSplit(Strict):
    """Which contiguous stretches of the corpus are validation; the rest is train."""

    kind: Literal["tail", "chunks", "files"] = Field(
        "tail",
        description="tail: the last `validation` share of the characters (nanoGPT's shakespeare_char "
        "split: train = text[:int(n * 0.9)]); chunks: the text cut into chunks of chunk_chars, a "
        "seeded choice of them is validation; files: the corpus files named in validation_files.",
    )
    validation: Fraction = Field(0.1, description="Share of the characters (tail, chunks).")
    chunk_chars: PosInt = Field(10_000, description="chunks only: characters per chunk.")
    seed: int = Field(0, description="chunks only: which chunks are drawn for validation.")
    validation_files: list[str] = Field(
        default_factory=list, description="files only: corpus file names that are the validation part."
    )

    @model_validator(mode="after")
    def _consistent(self) -> TextSplit:
        if self.kind == "files" and not self.validation_files:
            raise ValueError("split kind 'files' needs validation_files, e.g. [valid.txt]")
        if self.kind != "files" and self.validation_files:
            raise ValueError(f"validation_files applies to split kind 'files', not '{self.kind}'")
        if self.kind != "files" and self.validation <= 0:
            raise ValueError("validation must be above 0: a language model is measured on it")
        return self


class Samples(Strict):
    """Text generated from fixed prompts with a fixed seed at evaluation (predictions/<m>/samples.jsonl)."""

    prompts: list[str] = Field(default_factory=lambda: ["\n"], min_length=1, max_length=32)
    max_new_tokens: int = Field(200, ge=1, le=4096)
    temperature: float = Field(0.8, gt=0.0, le=5.0)
    top_k: int | None = Field(None, ge=1)
    seed: int = 0


class TextSpec(Strict):
    kind: Literal["text"]
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="Corpus id (lowercase).")
    description: str = ""
    origins: dict[OriginName, Origin] = Field(
        min_length=1, description="Pinned raw-file sets by name (letters, digits, _ and -)."
    )
    corpus: list[CorpusFile] = Field(min_length=1, description="The files of the corpus, in order.")
    canonical: Canonical = Canonical()
    split: TextSplit = TextSplit()
    samples: Samples = Samples()
    max_chars: int = Field(
        50_000_000,
        ge=1,
        le=2_000_000_000,
        description="the most characters the whole corpus may have after canonicalisation; a larger "
        "corpus is refused at the corpus stage (its files' sizes are checked before they are read), "
        "so memory is bounded before tokenizing and training",
    )

    @model_validator(mode="after")
    def _references(self) -> TextSpec:
        for i, f in enumerate(self.corpus):
            check_pinned(self.origins, f"corpus[{i}]", f.origin, f.file)
        names = [f.file for f in self.corpus]
        missing = [v for v in self.split.validation_files if v not in names]
        if missing:
            raise ValueError(f"split.validation_files {missing} are not corpus files (have: {names})")
        if self.split.kind == "files" and len(set(self.split.validation_files)) == len(set(names)):
            raise ValueError("split.validation_files names every corpus file: nothing is left to train on")
        return self
