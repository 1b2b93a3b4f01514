"""What stage `corpus` runs: the text spec's pinned files decoded, canonicalised and split into
train and validation text (pipeline/stages/corpus.py declares it to DVC)."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import numpy as np

from reprogate.data.fetch import fetch_origin
from reprogate.records.base import write
from reprogate.records.lm import CorpusMetrics, CorpusRecord, Part
from reprogate.specs.loader import load_spec
from reprogate.specs.text import Canonical, TextSpec
from reprogate.utils import paths
from reprogate.utils.atomic import replace_dir
from reprogate.utils.errors import UserError
from reprogate.utils.hashing import sha256_file


def decode(raw: bytes, where: str, c: Canonical) -> str:
    try:
        text = raw.decode(c.encoding)
    except UnicodeDecodeError as e:
        raise UserError(
            f"{where}: byte {e.start} is not valid UTF-8 ({raw[e.start : e.start + 4]!r}); the corpus "
            "must be UTF-8 text. Convert the file (e.g. `iconv -t utf-8`) and pin its new sha256."
        ) from None
    if c.newlines == "lf":
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if c.unicode_form != "none":
        text = unicodedata.normalize(c.unicode_form, text)
    return text


def split_text(spec: TextSpec, texts: dict[str, str]) -> tuple[str, str]:
    """(train, validation) from the canonical texts of the corpus files, in corpus order."""
    s, j = spec.split, spec.canonical.joiner
    if s.kind == "files":
        val = set(s.validation_files)
        return j.join(t for f, t in texts.items() if f not in val), j.join(
            t for f, t in texts.items() if f in val
        )
    text = j.join(texts.values())
    if s.kind == "tail":
        cut = int(len(text) * (1 - s.validation))  # nanoGPT: int(n * 0.9)
        return text[:cut], text[cut:]
    n_chunks = -(-len(text) // s.chunk_chars)
    n_val = max(1, round(n_chunks * s.validation))
    chosen = set(np.random.default_rng(s.seed).choice(n_chunks, size=n_val, replace=False).tolist())
    chunks = [text[i * s.chunk_chars : (i + 1) * s.chunk_chars] for i in range(n_chunks)]
    # Contiguous stretches stay whole; the parts keep corpus order.
    return "".join(c for i, c in enumerate(chunks) if i not in chosen), "".join(
        c for i, c in enumerate(chunks) if i in chosen
    )


def build(spec_path: Path, root: Path) -> dict[str, Any]:
    spec = load_spec(spec_path, TextSpec)
    files = {name: fetch_origin(name, o, spec_path, root) for name, o in spec.origins.items()}
    sizes = {f.file: files[f.origin][f.file].stat().st_size for f in spec.corpus}
    # UTF-8 takes 1 to 4 bytes a character: files this large cannot fit, whatever they hold.
    if sum(sizes.values()) > 4 * spec.max_chars:
        _too_large(spec_path, spec, f"its files hold {sum(sizes.values()):,} bytes")
    texts = {
        f.file: decode(
            files[f.origin][f.file].read_bytes(), f"{spec_path}: corpus file {f.file}", spec.canonical
        )
        for f in spec.corpus
    }
    if (chars := sum(map(len, texts.values()))) > spec.max_chars:
        _too_large(spec_path, spec, f"it has {chars:,} characters")
    train, validation = split_text(spec, texts)
    for part, text in (("train", train), ("validation", validation)):
        if not text:
            raise UserError(
                f"{spec_path}: split: the {part} part came out empty ({sum(map(len, texts.values()))} "
                "characters in all); change split.validation (or split.validation_files)."
            )
    out = root / paths.CORPUS
    parts = {}
    with replace_dir(out) as tmp:
        for part, text in (("train", train), ("validation", validation)):
            (tmp / f"{part}.txt").write_bytes(text.encode("utf-8"))
            parts[part] = Part(
                chars=len(text), bytes=len(text.encode("utf-8")), sha256=sha256_file(tmp / f"{part}.txt")
            )
    record = CorpusRecord(
        kind="text",
        dataset=spec.id,
        split=spec.split.model_dump(mode="json"),
        parts=parts,
        raw_sha256={f"{o}/{f}": s for o, org in spec.origins.items() for f, s in org.files.items()},
    )
    write(root / paths.DATA_RECORD, record)
    write(root / paths.DATA_METRICS, CorpusMetrics.of(record))
    return record.model_dump(mode="json")


def _too_large(spec_path: Path, spec: TextSpec, found: str) -> None:
    files = ", ".join(f.file for f in spec.corpus)
    raise UserError(
        f"{spec_path}: field 'max_chars' is {spec.max_chars:,}, and the corpus ({files}) is larger "
        f"({found}): refused before tokenizing or training allocate for it. Raise max_chars if this "
        "machine has the memory (about 10 bytes a character while tokenizing), or pin a smaller corpus."
    )


def summary(m: dict[str, Any]) -> str:
    t, v = m["parts"]["train"], m["parts"]["validation"]
    return (
        f"corpus: {m['dataset']}: train {t['chars']:,} characters, validation {v['chars']:,} "
        f"({m['split']['kind']} split)"
    )
