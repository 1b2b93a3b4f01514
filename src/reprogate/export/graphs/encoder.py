"""Family `encoder` on an export's graph: token ids and mask through the encoder, its pooling
and its head, whether the encoder is frozen (in the featurizer) or fine-tuned (in the model)."""

from __future__ import annotations

import torch
from torch import nn

from reprogate.export.graph import Input
from reprogate.models.encoder import EmbeddingFeaturizer
from reprogate.utils.errors import UserError


class TokensMember(nn.Module):
    """An encoder model: ids and mask -> (logits, the pooled embedding its head reads)."""

    def __init__(self, encoder: nn.Module, pooler, head: nn.Linear):
        super().__init__()
        self.encoder, self.pooler, self.head = encoder, pooler, head

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embedding = self.pooler(self.encoder, ids, mask)
        return self.head(embedding), embedding


def onnx(scorer) -> tuple[nn.Module, list[Input]]:
    feat, model = scorer.featurizer, scorer.model
    if isinstance(feat, EmbeddingFeaturizer):  # frozen: the encoder lives in the featurizer
        module = TokensMember(feat.encoder, feat.pooler, model.head)
    else:
        encoder = model.encoder
        if hasattr(encoder, "merge_and_unload"):  # LoRA: adapters folded into the weights
            encoder = encoder.merge_and_unload()
        module = TokensMember(encoder, model.pooler, model.head)
    read = getattr(scorer, "files", None)  # its folder as read (a model built in memory has none)
    tokenizer = "assets/tokenizer/tokenizer.json"
    if read is not None and not read.has(tokenizer):
        raise UserError(
            f"{read.dir / tokenizer} is missing: the export needs the fast tokenizer its member was "
            f"trained with. `dvc repro --force train@{scorer.name}` writes it again."
        )
    files = {"tokenizer.json": read.bytes(tokenizer)} if read is not None else {}
    return module, [Input(scorer.name, "tokens", {"max_length": feat.max_length}, files)]
