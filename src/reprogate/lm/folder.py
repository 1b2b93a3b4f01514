"""A language model's folder opened for scoring (evaluate, generate, serve): its spec, weights
and tokenizer. Apart from lm/training.py so that what serves a model never enters train/."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from reprogate.lm import tokenizer as lm_tokenizer
from reprogate.models.causal_lm import CausalLm
from reprogate.records.base import load
from reprogate.records.train import ModelConfig
from reprogate.specs.families.causal_lm import CausalLmConfig
from reprogate.specs.model import ModelSpec
from reprogate.utils.errors import UserError


def load_lm(model_dir: Path, device) -> tuple[CausalLm, lm_tokenizer.LmTokenizer, ModelConfig]:
    """A language model folder as evaluate, generate and serve load it."""
    fix = "`dvc repro` rebuilds it (train@<m>), or `dvc checkout` restores it."
    config = load(model_dir / "config.json", ModelConfig, fix)
    spec = ModelSpec.model_validate(config.spec)
    if not isinstance(spec.config, CausalLmConfig):
        raise UserError(f"{model_dir} holds a {config.family} model, not a language model.")
    model = CausalLm(spec.config, config.n_out)
    model.load_state_dict(load_file(str(model_dir / "model.safetensors")))
    model.to(device).eval()
    return model, lm_tokenizer.load(model_dir / "assets" / "tokenizer.json"), config
