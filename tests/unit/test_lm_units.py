"""Language models, unit by unit: the corpus split, the tokenizers, the decoder, whole-split
scoring and the spec rules (the pipeline end to end is tests/integration/test_lm.py)."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from reprogate.lm import corpus
from reprogate.lm import scoring as lm_eval
from reprogate.models.causal_lm import CausalLm
from reprogate.specs.families.causal_lm import CausalLmConfig
from reprogate.specs.lm import PlanSpec
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.specs.text import TextSpec
from reprogate.train import plan as plan_mod
from reprogate.utils.errors import UserError
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "lm" / "corpus.txt"


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
        "import sys; from reprogate.lm.tokenizer import train;"
        "from reprogate.specs.families.causal_lm import TokenizerConfig;"
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
    from reprogate.lm.tokenizer import load, train
    from reprogate.specs.families.causal_lm import TokenizerConfig

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
        ({**base, "budget": {"train_minutes": 5, "max_slowdown": 1.0}}, "greater than 1"),
        ({**base, "causal_lm": {"d_model": 30, "n_head": 4}}, "multiple of n_head"),
        ({**base, "causal_lm": {"tokenizer": {"kind": "bpe"}}}, "needs vocab_size"),
        ({**base, "family": "ngram", "ngram": {}, "causal_lm": None}, "applies to family causal_lm"),
    ]:
        with pytest.raises(ValueError, match=needle):
            ModelSpec.model_validate(bad)


# ------------------------------------------------------------------------- end to end


def _committed_plan(update_s: float) -> PlanSpec:
    return PlanSpec.model_validate(
        {
            "kind": "plan", "model": "gpt", "train_minutes": 5.0, "speed_key": "0" * 64, "steps": 6000,
            "measured": {
                "update_s": update_s, "checkpoint_s": 0.0, "updates_timed": 30, "tokens_per_s": 1.0,
                "device": "cpu", "host": "h", "cpu": "Planner CPU", "threads": 2, "torch": "2.13.0",
                "at": "2026-12-02T01:00:00+00:00",
            },
        }
    )  # fmt: skip


def test_a_planned_run_may_take_max_slowdown_times_its_plan():
    spec = ModelSpec.model_validate(
        {
            "kind": "model", "data": "specs/data/tinyshakespeare.yaml", "family": "causal_lm",
            "causal_lm": {}, "budget": {"train_minutes": 5, "max_minutes": 1},
            "checkpoint": {"every_steps": 500},
        }
    )  # fmt: skip
    committed = _committed_plan(0.05)  # 6,000 x 50 ms: 5 planned minutes
    # max_minutes (1) would cut it short; the planned run's limit is 3 x its 5 minutes.
    assert plan_mod.time_limit(spec, committed) == pytest.approx(15.0)
    assert plan_mod.time_limit(spec) == 1.0

    def over(minutes: float, step: int):
        dog = plan_mod.BudgetWatchdog(
            spec,
            Path("lm/specs/models/gpt.yaml"),
            "gpt",
            None,
            torch.device("cpu"),
            0.0,
            None,
            print,
            committed,
        )
        dog.first_step = 0
        dog.first_at = plan_mod.time.perf_counter() - minutes * 60
        # A long setup before the first update (encoding, loading) is not held against the
        # plan, which measured updates only.
        dog.since = dog.first_at - 30 * 60
        trainer = type("T", (), {"world": 1, "total_steps": 6000})()
        trainer.progress = type("P", (), {"global_step": step})()
        return dog.over_budget(trainer)

    assert over(12.0, 5000) is None  # 2.9x slower than planned: finishes inside the limit
    said = over(1.0, 300)  # 200 ms per update: 4x slower, would need 20 min
    assert said and "4.0x slower than the committed plan" in said and "Planner CPU" in said
    assert "reprogate plan gpt --write" in said and "max_slowdown" in said


def test_train_refuses_a_committed_plan_by_its_updates_minutes_not_its_setup():
    spec = ModelSpec.model_validate(
        {
            "kind": "model", "data": "specs/data/tinyshakespeare.yaml", "family": "causal_lm",
            "causal_lm": {}, "budget": {"train_minutes": 5}, "checkpoint": {"every_steps": 500},
        }
    )  # fmt: skip
    committed = _committed_plan(0.05)  # 6,000 x 50 ms: 5 planned minutes, a limit of 15

    def measured(update_s: float, setup_s: float) -> plan_mod.Plan:
        seconds = setup_s + 6000 * update_s + 13 * 0.01
        return plan_mod.Plan(
            device="cpu", total_steps=6000, measured_updates=8, update_s=update_s, checkpoint_s=0.01,
            checkpoints=13, setup_s=setup_s, peak_rss_gb=1.0, device_peak_gb=None,
            projected_minutes=seconds / 60, projected_memory_gb=1.1, budget_minutes=15.0,
            budget_memory_gb=spec.budget.max_memory_gb,
        )  # fmt: skip

    path = Path("lm/specs/models/gpt.yaml")
    # 2.8x the plan's updates and ten minutes of setup: its updates fit the 15 minutes.
    plan_mod.check_budget(measured(0.14, 600.0), spec, path, committed, "gpt")
    with pytest.raises(UserError, match=r"3\.2x slower than the committed plan"):
        plan_mod.check_budget(measured(0.16, 0.0), spec, path, committed, "gpt")


def test_a_corpus_or_char_vocabulary_past_its_cap_is_refused_before_use(tmp_path):
    import yaml

    from tests.conftest import FIXTURE_SHA, TINY_GPT, run_cli

    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "corpus.txt").write_bytes(FIXTURE.read_bytes())
    (tmp_path / "specs" / "data").mkdir(parents=True)
    (tmp_path / "specs" / "models").mkdir()
    (tmp_path / "params.yaml").write_text(
        "data: specs/data/tiny.yaml\nmodels: [gpt]\ngate: specs/gate.yaml\n"
    )
    (tmp_path / "specs" / "gate.yaml").write_text("kind: gate\nthresholds: {val_bits_per_char_max: 6.0}\n")
    text = {
        "kind": "text",
        "id": "tiny",
        "origins": {"f": {"source": {"kind": "local", "path": "raw"}, "files": {"corpus.txt": FIXTURE_SHA}}},
        "corpus": [{"origin": "f", "file": "corpus.txt"}],
        "max_chars": 1000,
    }
    (tmp_path / "specs" / "data" / "tiny.yaml").write_text(yaml.safe_dump(text))
    gpt = dict(TINY_GPT, causal_lm=dict(TINY_GPT["causal_lm"], tokenizer={"kind": "char", "max_vocab": 8}))
    (tmp_path / "specs" / "models" / "gpt.yaml").write_text(yaml.safe_dump(gpt))

    proc = run_cli("stage", "corpus", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "field 'max_chars' is 1,000, and the corpus (corpus.txt) is larger" in proc.stderr
    assert not (tmp_path / "data" / "corpus").exists()

    (tmp_path / "specs" / "data" / "tiny.yaml").write_text(yaml.safe_dump(dict(text, max_chars=10**7)))
    run_cli("stage", "corpus", cwd=tmp_path, check=True)
    proc = run_cli("stage", "tokenize", "gpt", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "field 'causal_lm.tokenizer.max_vocab' is 8, but the corpus has" in proc.stderr
    assert not (tmp_path / "data" / "tokens" / "gpt").exists()


def test_a_cap_checked_before_training_does_not_make_the_committed_plan_stale():
    from reprogate.lm.training import speed_key

    spec = load_spec(REPO / "lm" / "specs" / "models" / "gpt.yaml", ModelSpec)
    raised = spec.model_copy(
        update={
            "causal_lm": spec.causal_lm.model_copy(
                update={"tokenizer": spec.causal_lm.tokenizer.model_copy(update={"max_vocab": 9})}
            )
        }
    )
    wider = spec.model_copy(update={"causal_lm": spec.causal_lm.model_copy(update={"d_model": 128})})
    assert speed_key(raised) == speed_key(spec) != speed_key(wider)
