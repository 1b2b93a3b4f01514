"""A language model's tokenizer: `char` (the corpus's characters, sorted) or byte-level BPE.

Both are one `tokenizer.json`. char: {"kind": "char", "chars": "..."}, written here. bpe: the
tokenizers library's own file, trained on the train part. The BPE trainer counts words in hash
maps and in parallel; its merges are decided by pair counts with ties broken by the pairs
themselves, but two runs are only promised to agree when the input order and thread split
are fixed, so training runs on one thread and the saved JSON is compared in the tests across
processes (different hash seeds). Same corpus and spec -> the same bytes.

The char vocabulary is taken from the whole corpus, validation included, as nanoGPT's
shakespeare_char does: a vocabulary is not fitted to statistics, and a character first seen in
validation must still be scored rather than dropped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from reprogate.specs.families.causal_lm import TokenizerConfig
from reprogate.utils.errors import UserError


class LmTokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def to_json(self) -> str: ...


class CharTokenizer:
    def __init__(self, chars: str):
        self.chars = chars
        self.index = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.index[c] for c in text]
        except KeyError as e:
            raise UserError(
                f"the character {e.args[0]!r} is not in this model's vocabulary of {self.vocab_size} "
                "characters (those of its training corpus); leave it out of the prompt."
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def to_json(self) -> str:
        return json.dumps({"kind": "char", "chars": self.chars}, ensure_ascii=False) + "\n"


class BpeTokenizer:
    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids))

    def to_json(self) -> str:
        return self.tok.to_str(pretty=False) + "\n"


def train(cfg: TokenizerConfig, train_text: str, all_text: str) -> LmTokenizer:
    if cfg.kind == "char":
        return CharTokenizer("".join(sorted(set(all_text))))
    # One thread: the trainer's parallel word count is where run-to-run order could enter.
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    # Lines, in corpus order: the trainer's unit of input.
    tok.train_from_iterator(train_text.splitlines(keepends=True), trainer=trainer)
    return BpeTokenizer(tok)


def load(path: Path, data: bytes | None = None) -> LmTokenizer:
    """A tokenizer.json written by `train` (either kind), from `data` when it was read already."""
    try:
        text = (path.read_bytes() if data is None else data).decode("utf-8")
        raw = json.loads(text)
    except (OSError, ValueError) as e:
        raise UserError(
            f"{path}: cannot read the tokenizer ({e}); `dvc repro` rebuilds it (tokenize@<m>)."
        ) from None
    if raw.get("kind") == "char":
        return CharTokenizer(raw["chars"])
    from tokenizers import Tokenizer

    return BpeTokenizer(Tokenizer.from_str(text))
