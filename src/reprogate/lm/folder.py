"""A language model's folder opened for scoring (evaluate, generate, serve): its spec, weights
and tokenizer. Apart from lm/training.py so that what serves a model never enters train/."""

from __future__ import annotations

from pathlib import Path

from reprogate.folder.manifest import Files
from reprogate.lm import tokenizer as lm_tokenizer
from reprogate.models.causal_lm import CausalLm
from reprogate.records.train import ModelConfig
from reprogate.specs.families.causal_lm import CausalLmConfig
from reprogate.specs.model import ModelSpec
from reprogate.utils.errors import UserError


def load_lm(
    model_dir: Path, device, files: Files | None = None
) -> tuple[CausalLm, lm_tokenizer.LmTokenizer, ModelConfig]:
    """A language model folder as evaluate, generate and serve load it: from `files` as read
    and verified (folder/manifest.py), or read here, each file once."""
    files = files or Files.read(model_dir)
    config = files.record("config.json", ModelConfig)
    spec = ModelSpec.model_validate(config.spec)
    if not isinstance(spec.config, CausalLmConfig):
        raise UserError(f"{model_dir} holds a {config.family} model, not a language model.")
    model = CausalLm(spec.config, config.n_out)
    model.load_state_dict(files.tensors("model.safetensors"))
    model.to(device).eval()
    tokenizer = "assets/tokenizer.json"
    return model, lm_tokenizer.load(model_dir / tokenizer, files.bytes(tokenizer)), config
