"""`python bench/ort_settings.py [MODEL]`: one exported model's single-query latency under ONNX
Runtime's session settings, to say which of them decide its p95 on this machine.

The settings tried: as served (`export/runtime.session_options`: the spec's threads, intra-op
spinning off, every graph optimisation ONNX Runtime has, which fuses layer norms and GELUs at load),
spinning on, one thread, and graph optimisations off (what the fusions buy). The same 300 BANKING77
test queries, one at a time, the model's own preprocessing (canonical form, tokenizer, n-gram
hashing) outside the timer: the numbers are the graph's. Default MODEL: ensemble_mpnet_int8.
Writes bench/results/ort_settings.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from serve_bench import ms  # bench/, this script's folder

from reprogate.export.runtime import INPUTS, ONNX, Preprocess, session_options
from reprogate.utils.text import canonical

ROOT = Path(__file__).resolve().parents[1]
QUERIES, WARM = 300, 20


def variants(threads: int) -> dict:
    import onnxruntime as ort

    def served(**over):
        so = session_options(over.pop("threads", threads))
        for key, value in over.items():
            if key == "spin":
                so.add_session_config_entry("session.intra_op.allow_spinning", value)
            else:
                so.graph_optimization_level = value
        return so

    return {
        f"as served ({threads} threads, no spinning, all optimisations)": served(),
        "spinning on": served(spin="1"),
        "1 thread": served(threads=1),
        "graph optimisations off": served(opt=ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
    }


def timed(session, feeds: list[dict]) -> dict[str, float]:
    output = session.get_outputs()[0].name
    for feed in feeds[:WARM]:
        session.run([output], feed)
    times = []
    for feed in feeds:
        start = time.perf_counter()
        session.run([output], feed)
        times.append(time.perf_counter() - start)
    return ms(times)


def main() -> None:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # overwriting the served spinning entry is the point
    name = sys.argv[1] if len(sys.argv) > 1 else "ensemble_mpnet_int8"
    folder = ROOT / "models" / name
    if not (folder / ONNX).is_file():
        sys.exit(f"ort_settings: no models/{name}/{ONNX}; run the pipeline that exports it first")
    threads = json.loads((folder / "config.json").read_text())["spec"].get("threads") or 2
    members = [Preprocess.of(folder, s) for s in json.loads((folder / INPUTS).read_text())]
    lines = (ROOT / "data/prepared/test.jsonl").read_text().splitlines()[:QUERIES]
    texts = [canonical(json.loads(x)["text"]) for x in lines]
    feeds = []
    for t in texts:
        feed: dict = {}
        for m in members:
            feed |= m.feed(m.rows([t]))
        feeds.append(feed)
    rows = {}
    for label, so in variants(threads).items():
        session = ort.InferenceSession(str(folder / ONNX), so, providers=["CPUExecutionProvider"])
        rows[label] = timed(session, feeds)
        print(f"ort_settings: {name}: {label}: {rows[label]}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    out = {"model": name, "commit": commit.stdout.strip(), "ort": ort.__version__, "settings": rows}
    (ROOT / "bench/results").mkdir(exist_ok=True)
    (ROOT / "bench/results/ort_settings.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"ort_settings: wrote bench/results/ort_settings.json (commit {out['commit']})")


if __name__ == "__main__":
    main()
