"""The price of portable products, and candidates for a path both fast and equal across vendors.

`gemm: portable` runs MKL's products on its COMPATIBLE branch (SSE2 code), the one Intel documents
as giving the same results on every vendor's CPU. This measures what that costs against MKL's own
dispatch, on three workloads: one 256x384x1536 product, MiniLM's encoding of 256 queries, and a
training step of the language model (lm/specs/models/gpt.yaml's shape, fused AdamW). Each
candidate runs in a process of its own (MKL reads its branch once, at load):

- portable: the pin as committed (MKL_CBWR=COMPATIBLE);
- mkl_own: the pin without MKL_CBWR (MKL's own dispatch: on AMD its own path, on Intel AVX2+);
- mkl_avx2: MKL_CBWR=AVX2 (Intel's AVX2 branch; MKL ignores it on AMD);
- onednn_avx2: the pin, with every Linear run by oneDNN (torch.utils.mkldnn, inference only:
  the product and the encoding) under ONEDNN_MAX_CPU_ISA=AVX2.

With --emulate [CANDIDATE...], those candidates' digests (small inputs) are recomputed under QEMU as an Intel
(`-cpu Haswell-v4`) and an AMD (`-cpu EPYC-Milan`) CPU: a candidate is portable when all three
agree, as doctor --emulate judges the pin.

    python bench/gemm_price.py [--emulate [CANDIDATE...]] [--out bench/results/gemm_price.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = {
    "portable": {},
    "mkl_own": {"MKL_CBWR": None},
    "mkl_avx2": {"MKL_CBWR": "AVX2"},
    "onednn_avx2": {},
}
ONEDNN = {"onednn_avx2"}
CPUS = {"GenuineIntel": "Haswell-v4", "AuthenticAMD": "EPYC-Milan"}


def _digest(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().float().numpy().tobytes())
    return h.hexdigest()[:16]


def _time(fn, reps: int) -> float:
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _gemm(onednn: bool, reps: int):
    import torch

    from reprogate.train.probe import field

    x, w = field(256, 384, salt=1), field(1536, 384, salt=2, scale=0.05)
    lin = torch.nn.Linear(384, 1536, bias=False)
    lin.weight.data.copy_(w)
    if onednn:
        from torch.utils import mkldnn as onednn_modules

        lin = onednn_modules.to_mkldnn(lin)
    with torch.inference_mode():
        return _time(lambda: lin(x), reps), _digest(lin(x))


def _queries(n: int) -> list[str]:
    words = [
        "card",
        "transfer",
        "pending",
        "refund",
        "top",
        "up",
        "limit",
        "exchange",
        "rate",
        "atm",
        "pin",
        "lost",
        "stolen",
        "fee",
        "cash",
    ]
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(4 + i % 9)) for i in range(n)]


def _minilm(onednn: bool, n: int, reps: int):
    import torch
    from transformers import AutoModel, AutoTokenizer

    from reprogate.specs.families.encoder import resolve_encoder_path
    from reprogate.train.probe import ENCODER

    folder = resolve_encoder_path(ENCODER, REPO)
    tok, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    if onednn:
        from torch.utils import mkldnn as onednn_modules

        model = onednn_modules.to_mkldnn(model)
    batch = tok(_queries(n), padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.inference_mode():
        return _time(lambda: model(**batch), reps), _digest(model(**batch).last_hidden_state)


def _lm_step(steps: int, reps: int):
    import torch
    import torch.nn.functional as F

    from reprogate.models.causal_lm import CausalLm
    from reprogate.specs.families.causal_lm import CausalLmConfig
    from reprogate.train.probe import fill, ints

    cfg = CausalLmConfig(n_layer=2, n_head=4, d_model=96, context=64, mlp="swiglu", dropout=0.0)
    model = CausalLm(cfg, vocab_size=65)
    fill(model, 7)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = (ints(32 * 65, 9) % 65).reshape(32, 65)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(x[:, :-1])
        F.cross_entropy(logits.reshape(-1, 65), x[:, 1:].reshape(-1)).backward()
        opt.step()

    for _ in range(steps):
        step()
    digest = _digest(*model.state_dict().values())
    return _time(step, reps), digest


def worker(candidate: str, small: bool) -> dict:
    import torch

    torch.set_num_threads(2)
    onednn = candidate in ONEDNN
    reps = 1 if small else 20
    out = {"aten": torch.backends.cpu.get_cpu_capability()}
    out["gemm_256x384x1536"] = _gemm(onednn, 3 if small else 200)
    out["minilm_encode"] = _minilm(onednn, 32 if small else 256, reps if small else 5)
    if not onednn:  # oneDNN through torch.utils.mkldnn is inference only
        out["lm_train_step"] = _lm_step(3, reps)
    return out


def _env(candidate: str) -> dict[str, str]:
    from reprogate.runtime import numerics

    n = numerics.read(REPO)
    env = {k: v for k, v in os.environ.items() if k not in numerics.VARIABLES}
    env |= numerics.variables(n)
    for k in numerics.unset(n):
        env.pop(k, None)
    for k, v in CANDIDATES[candidate].items():
        env.pop(k, None) if v is None else env.__setitem__(k, v)
    return env


def _run(candidate: str, small: bool, qemu_cpu: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--worker", candidate] + (["--small"] if small else [])
    if qemu_cpu:
        cmd = ["qemu-x86_64", "-cpu", qemu_cpu, *cmd]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(candidate), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"gemm_price: {candidate} ({qemu_cpu or 'native'}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker")
    parser.add_argument("--small", action="store_true")
    parser.add_argument(
        "--emulate",
        nargs="*",
        metavar="CANDIDATE",
        help="judge these candidates under emulation (default, given bare: onednn_avx2; "
        "minutes each under QEMU)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/gemm_price.json")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.small)))
        return
    timed = {c: _run(c, small=False) for c in CANDIDATES}
    fast = {w: min(r[w][0] for r in timed.values() if w in r) for w in timed["portable"] if w != "aten"}
    record: dict = {"candidates": {}}
    for c, r in timed.items():
        row = {
            w: {"ms": round(v[0] * 1000, 2), "over_fastest": round(v[0] / fast[w], 2)}
            for w, v in r.items()
            if w != "aten"
        }
        record["candidates"][c] = row
        print(f"{c:12} " + "  ".join(f"{w} {v['ms']} ms ({v['over_fastest']}x)" for w, v in row.items()))
    if args.emulate is not None:
        for c in args.emulate or ["onednn_avx2"]:
            native = _run(c, small=True)
            emulated = {v: _run(c, small=True, qemu_cpu=m) for v, m in CPUS.items()}
            digests = {
                w: [native[w][1], *(e[w][1] for e in emulated.values())] for w in native if w != "aten"
            }
            equal = {w: len(set(d)) == 1 for w, d in digests.items()}
            record["candidates"][c]["equal_native_intel_amd"] = equal
            print(f"{c:12} equal as native, emulated Intel and AMD: {equal}")
    from reprogate.runtime import numerics

    cpu = numerics.cpu()
    record |= {"cpu": f"{cpu.vendor} {cpu.brand}", "threads": 2}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"gemm_price: wrote {args.out}")


if __name__ == "__main__":
    main()
