"""`make bench-serve`: the torch ensemble against its ONNX exports (float32, int8), and the
all-mpnet-base-v2 ensemble against its int8 export when the experiments built them: one run, the
same queries, each model in a process of its own (so its memory and threads are its own).

Per model: single-query latency in-process (tokenizing, the model, calibration and routing: the
whole `predict`), q/s at batch 1 and 64, then `reprogate serve` on loopback: single-query HTTP
latency and q/s from 32 concurrent keep-alive clients (micro-batched by the server). The clients
run on the same 2 cores as the server, so the HTTP numbers are the pair's, not the server's
alone. Accuracy, ECE and agreement with the source are the pipeline's own (results/<m>/eval.json,
metrics/<m>/export.json). Writes bench/results/serve.json and prints a table for docs/benchmarks.md.
Needs `make repro` first.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("ensemble", "ensemble_onnx", "ensemble_int8")
# all-mpnet-base-v2's ensemble and its int8 exports, the second with its feed-forward
# down-projections in float (`make repro-experiments` builds them): measured in the same run when
# they are there, and said to be missing when they are not.
MPNET = ("ensemble_mpnet", "ensemble_mpnet_int8", "ensemble_mpnet_int8_ffn_fp32")
SINGLE, BATCHED, HTTP_SINGLE, CLIENTS, LOAD_S = 300, 1024, 200, 32, 10.0


def queries() -> list[str]:
    lines = (ROOT / "data/prepared/test.jsonl").read_text().splitlines()
    return [json.loads(x)["text"] for x in lines]


def ms(times: list[float]) -> dict[str, float]:
    a = np.array(times) * 1000
    return {"p50_ms": round(float(np.percentile(a, 50)), 2), "p95_ms": round(float(np.percentile(a, 95)), 2)}


def in_process(name: str) -> dict:
    """Run in a child process: this model's in-process numbers and its resident memory."""
    import psutil

    from reprogate.predict.production import load_servable

    loaded = load_servable(ROOT, ROOT / "models" / name, device="cpu")
    texts = queries()
    for t in texts[:20]:
        loaded.predict([t])
    times = []
    for t in texts[:SINGLE]:
        start = time.perf_counter()
        loaded.predict([t])
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(0, BATCHED, 64):
        loaded.predict(texts[i : i + 64])
    batch64 = BATCHED / (time.perf_counter() - start)
    return {
        **ms(times),
        "qps_batch1": round(1 / statistics.mean(times), 1),
        "qps_batch64": round(batch64, 1),
        "rss_mb": round(psutil.Process().memory_info().rss / 2**20),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(conn: http.client.HTTPConnection, text: str) -> None:
    conn.request("POST", "/predict", json.dumps({"text": text}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    body = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {body[:200]!r}")


def over_http(name: str) -> dict:
    import psutil

    port = _free_port()
    cmd = [sys.executable, "-m", "reprogate", "serve", "--model", f"models/{name}", "--device", "cpu"]
    server = subprocess.Popen(
        [*cmd, "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                _post(conn, "warm up")
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"reprogate serve of {name} did not answer") from None
                time.sleep(0.5)
        texts = queries()
        times = []
        for t in texts[:HTTP_SINGLE]:
            start = time.perf_counter()
            _post(conn, t)
            times.append(time.perf_counter() - start)
        done = [0] * CLIENTS
        stop = time.monotonic() + LOAD_S

        def client(k: int) -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            i = k
            while time.monotonic() < stop:
                _post(c, texts[i % len(texts)])
                done[k] += 1
                i += CLIENTS

        threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        qps = sum(done) / (time.perf_counter() - start)
        rss = psutil.Process(server.pid).memory_info().rss / 2**20
        return {
            **{f"http_{k}": v for k, v in ms(times).items()},
            "qps_32_clients": round(qps, 1),
            "server_rss_mb": round(rss),
        }
    finally:
        server.terminate()
        server.wait(timeout=30)


def quality(name: str) -> dict:
    ev = json.loads((ROOT / "results" / name / "eval.json").read_text())["sets"]["test"]
    out = {"test_accuracy": round(ev["accuracy"], 4), "ece": round(ev["ece_after"], 4)}
    export = ROOT / "metrics" / name / "export.json"
    if export.is_file():
        out["agreement_test"] = round(json.loads(export.read_text())["agreement"]["test"]["share"], 4)
    return out


def table(rows: dict[str, dict]) -> str:
    cols = [
        ("p50_ms", "p50 ms"),
        ("p95_ms", "p95 ms"),
        ("http_p50_ms", "HTTP p50"),
        ("http_p95_ms", "HTTP p95"),
        ("qps_batch1", "q/s b1"),
        ("qps_batch64", "q/s b64"),
        ("qps_32_clients", "q/s 32 HTTP"),
        ("server_rss_mb", "server RSS MB"),
        ("test_accuracy", "test acc"),
        ("ece", "ECE"),
        ("agreement_test", "agrees"),
    ]
    lines = ["| model | " + " | ".join(c for _, c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(str(r.get(k, "")) for k, _ in cols) + " |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--in-process":
        print(json.dumps(in_process(sys.argv[2])))
        return
    missing = [m for m in MODELS if not (ROOT / "models" / m / "calibration.json").is_file()]
    if missing:
        sys.exit(f"bench-serve: no calibrated {', '.join(missing)} in models/; run `make repro` first")
    built = [m for m in MPNET if (ROOT / "models" / m / "calibration.json").is_file()]
    if len(built) < len(MPNET):
        print("bench-serve: no all-mpnet-base-v2 rows: run `make repro-experiments` first", flush=True)
    rows = {}
    for name in (*MODELS, *built):
        child = subprocess.run(
            [sys.executable, __file__, "--in-process", name], capture_output=True, text=True, check=True
        )
        rows[name] = json.loads(child.stdout.strip().splitlines()[-1]) | over_http(name) | quality(name)
        print(f"bench-serve: {name}: {rows[name]}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    out = {"commit": commit.stdout.strip(), "cpus": os.cpu_count(), "models": rows}
    (ROOT / "bench/results").mkdir(exist_ok=True)
    (ROOT / "bench/results/serve.json").write_text(json.dumps(out, indent=2) + "\n")
    print(table(rows))
    print(f"bench-serve: wrote bench/results/serve.json (commit {out['commit']})")


if __name__ == "__main__":
    main()
