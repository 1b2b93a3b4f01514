"""Family `encoder`: a Hugging Face encoder with mean or CLS pooling and a linear head.

Modes: `full` fine-tunes everything, `frozen` trains the head only, `lora` adds peft LoRA
adapters to the attention projections. Texts longer than max_length are truncated and
counted (`truncated`), never dropped.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from reprogate.specs import ModelSpec, resolve_encoder_path


class EncoderFeaturizer:
    def __init__(self, tokenizer, max_length: int):
        self.tokenizer, self.max_length = tokenizer, max_length
        self.truncated = 0

    def encode(self, texts: list[str]) -> list[list[int]]:
        full = self.tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]
        self.truncated += sum(1 for ids in full if len(ids) > self.max_length)
        out = []
        for ids in full:
            if len(ids) > self.max_length:
                # Keep the leading tokens and the closing [SEP].
                ids = ids[: self.max_length - 1] + ids[-1:]
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


class EncoderClassifier(nn.Module):
    def __init__(self, encoder: nn.Module, n_out: int, pooling: str, dropout: float, frozen: bool):
        super().__init__()
        self.encoder, self.pooling, self.frozen = encoder, pooling, frozen
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.config.hidden_size, n_out)
        if frozen:
            self.encoder.requires_grad_(False)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]
        m = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.embed(input_ids, attention_mask)))


def _load(path: str, mode: str, lora_cfg, n_out: int, pooling: str, dropout: float):
    from transformers import AutoModel, AutoTokenizer

    name, _, revision = path.partition("@")
    tokenizer = AutoTokenizer.from_pretrained(name, revision=revision or None)
    encoder = AutoModel.from_pretrained(name, revision=revision or None)
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        encoder = get_peft_model(
            encoder,
            LoraConfig(
                r=lora_cfg["r"],
                lora_alpha=lora_cfg["alpha"],
                lora_dropout=lora_cfg["dropout"],
                target_modules=lora_cfg["target_modules"],
            ),
        )
    model = EncoderClassifier(encoder, n_out, pooling, dropout, frozen=mode == "frozen")
    return model, tokenizer


def build(spec: ModelSpec, n_out: int, root: Path):
    cfg = spec.encoder
    assert cfg is not None
    path = resolve_encoder_path(cfg.model, root)
    lora = cfg.lora.model_dump() if cfg.lora else None
    model, tok = _load(path, cfg.mode, lora, n_out, cfg.pooling, spec.head.dropout)
    return model, EncoderFeaturizer(tok, cfg.max_length)
