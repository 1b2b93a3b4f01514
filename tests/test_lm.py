"""Language models: the corpus split, the tokenizers, the decoder, whole-split scoring, the
committed plan, and the LM pipeline end to end (`dvc repro` of lm/ in a temporary copy)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from reprogate import lm_eval
from reprogate.models.causal_lm import CausalLm
from reprogate.specs import ModelSpec, TextSpec, load_spec
from reprogate.specs.lm import CausalLmConfig
from reprogate.stages import corpus
from tests.conftest import BIN, REPO, copy_project, git_cmd, run_cli

FIXTURE = REPO / "tests" / "fixtures" / "lm" / "corpus.txt"
FIXTURE_SHA = "2422657bc7b644b31019286f6c6b795df70af3b05055e2725303c8a4dc8fc40e"


def test_default_split_is_nanogpts_last_tenth_of_the_characters(mirror):
    spec = load_spec(REPO / "lm" / "specs" / "data" / "tinyshakespeare.yaml", TextSpec)
    text = (mirror / "tinyshakespeare" / "input.txt").read_text()  # Python's text mode, as nanoGPT
    train, validation = corpus.split_text(spec, {"input.txt": text})
    n = len(text)
    assert (train, validation) == (text[: int(n * 0.9)], text[int(n * 0.9) :])
    assert len(validation) == 111_540


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 5000), chunk=st.integers(1, 700), seed=st.integers(0, 2**16), share=st.floats(0.05, 0.5)
)
def test_chunk_split_keeps_every_character_once_in_contiguous_chunks(n, chunk, seed, share):
    text = "".join(chr(65 + (i * 7) % 26) for i in range(n))
    spec = TextSpec.model_validate(
        {
            "kind": "text",
            "id": "t",
            "origins": {"o": {"source": {"kind": "local", "path": "x"}, "files": {"a": "0" * 64}}},
            "corpus": [{"origin": "o", "file": "a"}],
            "split": {"kind": "chunks", "chunk_chars": chunk, "validation": share, "seed": seed},
        }
    )
    train, validation = corpus.split_text(spec, {"a": text})
    assert len(train) + len(validation) == n and validation
    chunks = [text[i : i + chunk] for i in range(0, n, chunk)]
    assert corpus.split_text(spec, {"a": text}) == (train, validation)  # seeded
    assert validation in "".join(chunks) or all(c in chunks for c in _cut(validation, chunks))


def _cut(part: str, chunks: list[str]) -> list[str]:
    out, i = [], 0
    for c in chunks:
        if part.startswith(c, i):
            out.append(c)
            i += len(c)
    assert i == len(part), "the validation part is not made of whole chunks"
    return out


def test_bpe_tokenizer_is_byte_identical_across_processes(tmp_path):
    script = (
        "import sys; from reprogate.lm_tokenizer import train; from reprogate.specs import TokenizerConfig;"
        "t = open(sys.argv[1]).read();"
        "sys.stdout.write(train(TokenizerConfig(kind='bpe', vocab_size=300), t, t).to_json())"
    )
    outs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", script, str(FIXTURE)], env=env, capture_output=True, text=True, check=True
        ).stdout
        outs.add(hashlib.sha256(out.encode()).hexdigest())
    assert len(outs) == 1


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_tokenizers_round_trip(kind):
    from reprogate.lm_tokenizer import load, train
    from reprogate.specs import TokenizerConfig

    text = FIXTURE.read_text()
    cfg = TokenizerConfig(kind=kind, vocab_size=300 if kind == "bpe" else None)
    tok = train(cfg, text, text)
    assert tok.decode(tok.encode(text)) == text
    path = Path(f"/tmp/reprogate-tok-{os.getpid()}-{kind}.json")
    path.write_text(tok.to_json())
    try:
        assert load(path).encode(text) == tok.encode(text)
    finally:
        path.unlink()


@pytest.mark.parametrize(("mlp", "positions"), [("gelu", "learned"), ("swiglu", "rope")])
def test_decoder_is_causal(mlp, positions):
    torch.manual_seed(0)
    cfg = CausalLmConfig(n_layer=2, n_head=2, d_model=16, context=12, mlp=mlp, positions=positions)
    model = CausalLm(cfg, 20).eval()
    a = torch.randint(0, 20, (1, 12))
    b = a.clone()
    b[0, 7:] = (b[0, 7:] + 1) % 20  # change the future only
    with torch.no_grad():
        assert torch.equal(model(a)[0, :7], model(b)[0, :7])
        assert not torch.equal(model(a)[0, 7:], model(b)[0, 7:])


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 90), context=st.integers(2, 16))
def test_scoring_predicts_every_token_after_the_first_exactly_once(n, context):
    torch.manual_seed(n)
    model = CausalLm(CausalLmConfig(n_layer=1, n_head=1, d_model=8, context=context), 11).eval()
    ids = torch.randint(0, 11, (n,))
    got = lm_eval.score(model, ids, context, torch.device("cpu"), batch=3)
    want = 0.0
    with torch.no_grad():
        for s in range(0, n - 1, context):  # by hand: one window after the other
            w = ids[s : min(s + context + 1, n)]
            want += float(F.cross_entropy(model(w[None, :-1])[0], w[1:], reduction="sum"))
    assert got.tokens == n - 1 and got.windows == math.ceil((n - 1) / context)
    assert got.nats == pytest.approx(want, rel=1e-5)


def test_spec_rules_for_language_models():
    base = {
        "kind": "model",
        "data": "specs/data/tinyshakespeare.yaml",
        "family": "causal_lm",
        "causal_lm": {},
        "budget": {"train_minutes": 5, "max_minutes": 10},
    }
    ModelSpec.model_validate(base)
    for bad, needle in [
        ({**base, "steps": 10}, "exactly one of steps"),
        ({**base, "budget": {"train_minutes": 20, "max_minutes": 10}}, "above budget.max_minutes"),
        ({**base, "causal_lm": {"d_model": 30, "n_head": 4}}, "multiple of n_head"),
        ({**base, "causal_lm": {"tokenizer": {"kind": "bpe"}}}, "needs vocab_size"),
        ({**base, "family": "ngram", "ngram": {}, "causal_lm": None}, "applies to family causal_lm"),
    ]:
        with pytest.raises(ValueError, match=needle):
            ModelSpec.model_validate(bad)


# ------------------------------------------------------------------------- end to end

TINY_GPT = {
    "kind": "model",
    "description": "CI-sized language model",
    "data": "specs/data/tiny.yaml",
    "family": "causal_lm",
    "causal_lm": {
        "n_layer": 1,
        "n_head": 2,
        "d_model": 16,
        "context": 16,
        "mlp": "swiglu",
        "eval_points": 2,
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
    },
    "device": "cpu",
    "threads": 1,
    "micro_batch": 8,
    "optimizer": {"lr": 0.01},
    "schedule": {"kind": "cosine", "warmup_fraction": 0.1, "min_lr_fraction": 0.1},
    "checkpoint": {"every_steps": 5, "keep": 2},
    "budget": {"train_minutes": 0.05, "max_minutes": 2},
    "resume_check": {"steps": 6, "checkpoint_every": 2, "kill_after": 3},
}


def _dvc(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(BIN / "dvc"), *args], cwd=root, env=env, capture_output=True, text=True)
    assert not check or proc.returncode == 0, f"dvc {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def lm_project(tmp_path_factory) -> Path:
    """A copy of the repository whose lm/ pipeline runs a tiny model on the fixture corpus."""
    repo = copy_project(tmp_path_factory.mktemp("lm"))
    lm = repo / "lm"
    (lm / "raw").mkdir()
    (lm / "raw" / "corpus.txt").write_bytes(FIXTURE.read_bytes())
    text = {
        "kind": "text",
        "id": "tiny",
        "origins": {
            "fixture": {"source": {"kind": "local", "path": "raw"}, "files": {"corpus.txt": FIXTURE_SHA}}
        },
        "corpus": [{"origin": "fixture", "file": "corpus.txt"}],
        "split": {"kind": "tail", "validation": 0.15},
        "samples": {"prompts": ["The ", "A"], "max_new_tokens": 12, "seed": 3},
    }
    (lm / "specs" / "data" / "tiny.yaml").write_text(yaml.safe_dump(text, sort_keys=False))
    (lm / "specs" / "models" / "gpt.yaml").write_text(yaml.safe_dump(TINY_GPT, sort_keys=False))
    gate = {"kind": "gate", "thresholds": {"val_bits_per_char_max": 6.0}}  # a few seconds of training
    (lm / "specs" / "gate.yaml").write_text(yaml.safe_dump(gate, sort_keys=False))
    params = yaml.safe_load((lm / "params.yaml").read_text())
    (lm / "params.yaml").write_text(
        yaml.safe_dump(dict(params, data="specs/data/tiny.yaml"), sort_keys=False)
    )
    run_cli("compile", cwd=lm, check=True)
    _dvc(lm, "repro", "tokenize@gpt")
    said = run_cli("plan", "gpt", "--write", cwd=lm, check=True).stdout
    assert "wrote specs/models/gpt.plan.yaml" in said
    _dvc(lm, "repro")
    git_cmd(repo, "add", "-A")
    git_cmd(repo, "commit", "-qm", "tiny lm, reproduced")
    return lm


def test_lm_pipeline_trains_the_planned_steps_and_scores_the_whole_split(lm_project):
    plan = yaml.safe_load((lm_project / "specs" / "models" / "gpt.plan.yaml").read_text())
    train = json.loads((lm_project / "metrics" / "gpt" / "train.json").read_text())
    assert train["steps"] == plan["steps"] and train["tokens_seen"] == plan["steps"] * 8 * 16
    ev = json.loads((lm_project / "results" / "gpt" / "eval.json").read_text())
    tokens = json.loads((lm_project / "data" / "tokens" / "gpt" / "manifest.json").read_text())
    val = ev["sets"]["validation"]
    assert val["n_tokens"] == tokens["parts"]["validation"]["tokens"] - 1  # every token but the first
    assert val["bits_per_char"] == pytest.approx(
        val["nats_per_token"] * val["n_tokens"] / math.log(2) / val["n_chars"]
    )
    assert 0 < val["bits_per_char"] < math.log2(300) * 2
    samples = [
        json.loads(x) for x in (lm_project / "predictions" / "gpt" / "samples.jsonl").read_text().splitlines()
    ]
    assert [s["prompt"] for s in samples] == ["The ", "A"]
    curve = (lm_project / "plots" / "gpt" / "validation_by_seconds.tsv").read_text().splitlines()
    assert curve[0] == "step\ttokens\tseconds\tnats_per_token" and len(curve) == 3
    resume = json.loads((lm_project / "results" / "gpt" / "resume.json").read_text())
    assert resume["passed"] and resume["tolerance"] == 0.0 and "validation_points" in resume["fields"]
    gate = json.loads((lm_project / "results" / "gate.json").read_text())
    rules = {r["rule"]: r["verdict"] for r in gate["candidates"]["gpt"]["rules"]}
    assert rules == {
        "val_bits_per_char": "pass",
        "resume_equivalence": "pass",
        "not_worse_than_production": "n/a",
    }


def test_lm_rerun_changes_nothing_and_a_new_plan_retrains(lm_project):
    out = _dvc(lm_project, "repro").stdout
    assert "Running stage" not in out, out
    assert git_cmd(lm_project.parent, "status", "--porcelain") == ""  # every record: the same bytes
    plan_file = lm_project / "specs" / "models" / "gpt.plan.yaml"
    plan = yaml.safe_load(plan_file.read_text())
    plan_file.write_text(yaml.safe_dump(dict(plan, steps=plan["steps"] + 2), sort_keys=False))
    try:
        status = json.loads(_dvc(lm_project, "status", "--json").stdout)
        assert "train@gpt" in status and "tokenize@gpt" not in status
    finally:
        git_cmd(lm_project.parent, "checkout", "--", "lm/specs")


def test_a_stale_or_missing_plan_is_refused_with_the_fix(lm_project, tmp_path):
    spec = yaml.safe_load((lm_project / "specs" / "models" / "gpt.yaml").read_text())
    spec["causal_lm"]["d_model"] = 32
    (lm_project / "specs" / "models" / "gpt.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    try:
        said = run_cli("stage", "train", "gpt", "--work-dir", str(tmp_path / "w"), cwd=lm_project)
        assert (
            said.returncode == 2
            and "is stale" in said.stderr
            and "plan specs/models/gpt.yaml --write" in said.stderr
        )
        (lm_project / "specs" / "models" / "gpt.plan.yaml").rename(tmp_path / "plan.yaml")
        said = run_cli("stage", "train", "gpt", "--work-dir", str(tmp_path / "w"), cwd=lm_project)
        assert said.returncode == 2 and "needs a measured number of updates" in said.stderr
        assert "Traceback" not in said.stderr
    finally:
        git_cmd(lm_project.parent, "checkout", "--", "lm/specs")


def test_promote_generate_and_serve_a_language_model(lm_project):
    from fastapi.testclient import TestClient

    from reprogate.serve import create_app

    repo = lm_project.parent
    said = run_cli("promote", cwd=lm_project, check=True).stdout
    assert "gpt" in said
    record = json.loads((lm_project / "models" / "production.json").read_text())
    assert record["family"] == "causal_lm" and record["val_bits_per_char"] > 0
    assert "heldout_accuracy" not in record and "calibration" not in record
    assert json.loads((repo / "models" / "production.json").read_text()).get("family") != "causal_lm"
    assert git_cmd(repo, "log", "-1", "--format=%s").startswith("promote gpt (gpt@")

    one = run_cli("generate", "The ", "--max-tokens", "12", "--seed", "4", cwd=lm_project, check=True)
    two = run_cli("generate", "The ", "--max-tokens", "12", "--seed", "4", cwd=lm_project, check=True)
    assert one.stdout == two.stdout and one.stdout.startswith("The ") and "12 tokens" in one.stderr
    bad = run_cli("generate", "The ", "--max-tokens", "5000", cwd=lm_project)
    assert bad.returncode == 2 and "ask for 1 to 2000" in bad.stderr and "Traceback" not in bad.stderr
    wrong = run_cli("generate", "hello", cwd=repo)  # the classifier's project
    assert wrong.returncode == 2 and "use `reprogate predict` there" in wrong.stderr

    with TestClient(create_app(lm_project, watch_interval=3600)) as c:
        r = c.post("/generate", json={"prompt": "A", "max_tokens": 8, "seed": 1})
        assert r.status_code == 200 and r.json()["tokens"] == 8
        assert r.json()["model_version"] == record["model_version"]
        again = c.post("/generate", json={"prompt": "A", "max_tokens": 8, "seed": 1}).json()
        assert again["text"] == r.json()["text"]  # the same seed, the same continuation
        for body in ({"prompt": ""}, {"prompt": "A", "max_tokens": 0}, {"prompt": "x" * 5000}, {"text": "A"}):
            assert c.post("/generate", json=body).status_code == 422, body
        assert c.post("/predict", json={"text": "A"}).status_code == 409
        assert c.get("/version").json()["family"] == "causal_lm"
