"""What the portable optimizer step costs: torch's fused AdamW (every op correctly rounded, the
same bits on any vendor's CPU) against the default foreach AdamW (whose float32 sqrt is MKL's
vsSqrt, the vendor's rounding), on the parameters of the project's two default models.

    python bench/adamw_price.py [--steps 30] [--out bench/results/adamw_price.json]

Each model's step is timed for both implementations interleaved (one step of each in turn, so
the machine's load falls on both alike), under the project's pin, on the spec's thread count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from reprogate.runtime import numerics

REPO = Path(__file__).resolve().parents[1]


def _models():
    from reprogate.models.causal_lm import CausalLm
    from reprogate.models.ngram import NgramClassifier
    from reprogate.specs.families.causal_lm import CausalLmConfig

    cfg = CausalLmConfig(n_layer=2, n_head=4, d_model=96, context=64, mlp="swiglu", dropout=0.0)
    return {
        "ngram (specs/models/ngram.yaml: 65,536 x 64 buckets, 78 classes)": NgramClassifier(
            buckets=65536, dim=64, n_out=78, dropout=0.0
        ),
        "gpt (lm/specs/models/gpt.yaml: 2 layers, d_model 96, 65 chars)": CausalLm(cfg, vocab_size=65),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/adamw_price.json")
    args = parser.parse_args()
    numerics.pin(REPO)
    import torch

    torch.set_num_threads(args.threads)
    out = {}
    for name, model in _models().items():
        params = [p for p in model.parameters()]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-2
        opts = {
            "fused": torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True),
            "default": torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01),
        }
        times: dict[str, list[float]] = {k: [] for k in opts}
        for _ in range(args.steps + 3):
            for k, opt in opts.items():
                t0 = time.perf_counter()
                opt.step()
                times[k].append(time.perf_counter() - t0)
        ms = {k: round(statistics.median(v[3:]) * 1000, 3) for k, v in times.items()}
        out[name] = {"median_ms": ms, "default_over_fused": round(ms["default"] / ms["fused"], 2)}
        print(f"{name}: fused {ms['fused']} ms, default {ms['default']} ms per step")
    cpu = numerics.cpu()
    record = {"cpu": f"{cpu.vendor} {cpu.brand}", "threads": args.threads, "steps": args.steps, "models": out}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"adamw_price: wrote {args.out}")


if __name__ == "__main__":
    main()
