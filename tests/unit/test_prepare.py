"""Stage `prepare` on the real pinned BANKING77/CLINC150 files and on a user's own data."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from reprogate.data.fetch import mirror_dirs
from reprogate.data.prepare import normalize, prepare
from reprogate.specs.data import Normalization
from reprogate.utils.errors import UserError
from reprogate.utils.text import canonical
from tests.conftest import REPO, run_cli

BANKING = REPO / "specs" / "data" / "banking77.yaml"


@pytest.fixture(scope="module")
def banking(tmp_path_factory, mirror):
    out = tmp_path_factory.mktemp("prep")
    import os

    os.environ["REPROGATE_MIRROR"] = str(mirror)
    metrics = prepare(BANKING, REPO, out / "prepared", out)
    return out, metrics


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_banking77_counts_and_hashes(banking):
    out, m = banking
    rows = m["rows"]
    assert rows["test"] == 3080  # the upstream held-out set is kept whole
    assert rows["oos_val"] == 100 and rows["oos_test"] == 1000
    dropped = sum(m["dropped"]["train"].values())
    # Every upstream train row is accounted for: kept in a partition or dropped with a reason.
    assert rows["train"] + rows["validation"] + rows["calibration"] + dropped == 10003
    for name, sha in m["sha256"].items():
        assert hashlib.sha256((out / "prepared" / f"{name}.jsonl").read_bytes()).hexdigest() == sha
    assert json.loads((out / "results" / "data.json").read_text()) == m
    labels = {r["label"] for r in _rows(out / "prepared" / "train.jsonl")}
    assert "reverted_card_payment?" in labels and "Refund_not_showing_up" in labels


def test_partitions_are_disjoint_and_stratified(banking):
    out, m = banking
    n = Normalization()
    parts = {p: _rows(out / "prepared" / f"{p}.jsonl") for p in ("train", "validation", "calibration")}
    keys = {p: {normalize(r["text"], n) for r in rows} for p, rows in parts.items()}
    assert not keys["train"] & keys["validation"] and not keys["train"] & keys["calibration"]
    test_keys = {normalize(r["text"], n) for r in _rows(out / "prepared" / "test.jsonl")}
    assert not keys["train"] & test_keys, "dedupe_train must remove train rows seen in test"
    assert len({r["label"] for r in parts["validation"]}) == 77
    assert len({r["label"] for r in parts["calibration"]}) == 77


def test_out_of_scope_sets_have_no_intent(banking):
    out, _ = banking
    for name in ("oos_val", "oos_test", "negatives"):
        assert all(r["label"] is None for r in _rows(out / "prepared" / f"{name}.jsonl"))
    negatives = _rows(out / "prepared" / "negatives.jsonl")
    assert not {r["source_label"] for r in negatives} & {"transfer", "credit_score", "exchange_rate"}


def test_byte_identical_rerun(banking, tmp_path):
    out, m = banking
    again = prepare(BANKING, REPO, tmp_path / "prepared", tmp_path)
    assert again == m
    for f in (out / "prepared").iterdir():
        assert (tmp_path / "prepared" / f.name).read_bytes() == f.read_bytes()


def test_canonicalisation_folds_quoted_newlines_and_typographic_forms():
    assert canonical("\nI can't seem to use my card\n\n\n") == "I can't seem to use my card"
    # What phones and word processors type, and fullwidth input, become what keyboards type.
    typed = "I can\u2019t use my \uff43\uff41\uff52\uff44\u00a0abroad"
    assert canonical(typed) == "I can't use my card abroad"
    assert canonical("a \u201efee\u201d of \u20181\u2019") == "a \"fee\" of '1'"
    assert canonical("cafe\u0301") == "caf\u00e9"  # one spelling of é, as NFC and NFKC agree
    assert normalize("What's  my PIN?!", Normalization()) == "what s my pin"


@given(st.text(max_size=200))
def test_canonical_form_is_stable(text):
    # Stored texts are canonicalised again when a prepared text is sent as a query: the model
    # must see the same string both times, for any input.
    once = canonical(text)
    assert canonical(once) == once
    assert once == once.strip() and "  " not in once and "\n" not in once


def _own_dataset(tmp_path: Path, rows: list[tuple[str, str]], labels: list[str]) -> Path:
    """A user's own intents: a CSV and a data spec pinning it (as README shows)."""
    (tmp_path / "params.yaml").write_text("mirror: []\n")
    raw = tmp_path / "raw"
    raw.mkdir()
    with open(raw / "commands.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["utterance", "intent"])
        w.writerows(rows)
    sha = hashlib.sha256((raw / "commands.csv").read_bytes()).hexdigest()
    spec = {
        "kind": "data",
        "id": "home",
        "origins": {"mine": {"source": {"kind": "local", "path": "raw"}, "files": {"commands.csv": sha}}},
        "train": {
            "origin": "mine",
            "file": "commands.csv",
            "text_field": "utterance",
            "label_field": "intent",
        },
        "test": {
            "origin": "mine",
            "file": "commands.csv",
            "text_field": "utterance",
            "label_field": "intent",
        },
        "split": {"seed": 1, "validation": 0.2, "calibration": 0.2},
        "dedupe_train": False,
        "labels": labels,
    }
    (tmp_path / "specs").mkdir()
    path = tmp_path / "specs" / "home.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


HOME = [
    (f"turn {w} the {room} lights", f"lights_{w}")
    for w in ("on", "off")
    for room in ("kitchen", "hall", "office", "garage", "attic", "porch")
]
HOME += [(f"set a timer for {n} minutes", "set_timer") for n in range(3, 9)]
HOME += [("   ", "set_timer")]


def test_users_own_local_data_end_to_end(tmp_path):
    spec = _own_dataset(tmp_path, HOME, ["lights_on", "lights_off", "set_timer"])
    proc = run_cli("stage", "prepare", "--spec", str(spec), cwd=tmp_path, check=True)
    assert "prepare: home:" in proc.stdout
    m = json.loads((tmp_path / "results" / "data.json").read_text())
    assert m["dropped"]["train"] == {"empty_text": 1}
    # The DVC metric is the headline: rows per split and rows dropped, by reason only above.
    headline = json.loads((tmp_path / "metrics" / "data.json").read_text())
    assert headline == {
        "dataset": "home",
        "labels": 3,
        "rows": m["rows"],
        "dropped": {split: sum(r.values()) for split, r in m["dropped"].items()},
    }
    assert headline["dropped"]["train"] == 1
    assert m["rows"]["train"] + m["rows"]["validation"] + m["rows"]["calibration"] == 18
    # round(0.2 * 6) = 1 row per label in each carved partition
    assert m["rows"]["validation"] == 3 and m["rows"]["calibration"] == 3
    assert (tmp_path / "data" / "prepared" / "train.jsonl").is_file()


def test_label_outside_vocabulary_is_an_error_not_a_skip(tmp_path):
    spec = _own_dataset(
        tmp_path, [*HOME, ("dim the lights", "lights_dim")], ["lights_on", "lights_off", "set_timer"]
    )
    proc = run_cli("stage", "prepare", "--spec", str(spec), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "'lights_dim' (1 rows" in proc.stderr and "commands.csv:" in proc.stderr
    assert "Nothing was written" in proc.stderr
    assert not (tmp_path / "data" / "prepared").exists()
    assert not (tmp_path / "metrics").exists() and not (tmp_path / "results").exists()


def test_hash_mismatch_names_file_and_writes_nothing(tmp_path):
    spec = _own_dataset(tmp_path, HOME, ["lights_on", "lights_off", "set_timer"])
    expected = hashlib.sha256((tmp_path / "raw" / "commands.csv").read_bytes()).hexdigest()
    with open(tmp_path / "raw" / "commands.csv", "a") as f:
        f.write("open the garage,lights_on\n")
    actual = hashlib.sha256((tmp_path / "raw" / "commands.csv").read_bytes()).hexdigest()
    with pytest.raises(UserError) as exc:
        prepare(spec, tmp_path)
    msg = str(exc.value)
    assert "commands.csv" in msg and expected in msg and actual in msg and "Nothing was written" in msg
    assert not (tmp_path / "data").exists() and not (tmp_path / "metrics").exists()
    assert not (tmp_path / "results").exists()


def test_missing_local_file_names_the_origin_and_the_fix(tmp_path):
    spec = _own_dataset(tmp_path, HOME, ["lights_on", "lights_off", "set_timer"])
    (tmp_path / "raw" / "commands.csv").unlink()
    proc = run_cli("stage", "prepare", "--spec", str(spec), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "home.yaml" in proc.stderr and "raw/commands.csv does not exist" in proc.stderr
    assert "fix origins.mine.source.path" in proc.stderr


def test_a_header_only_csv_is_named_as_empty(tmp_path):
    spec = _own_dataset(tmp_path, [], ["lights_on", "lights_off", "set_timer"])
    proc = run_cli("stage", "prepare", "--spec", str(spec), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "commands.csv: has no rows for this table" in proc.stderr


def test_a_file_in_another_format_is_explained_not_a_traceback(tmp_path):
    spec = _own_dataset(tmp_path, HOME, ["lights_on", "lights_off", "set_timer"])
    raw = yaml.safe_load(spec.read_text())
    (tmp_path / "raw" / "commands.csv").write_text('{"utterance": "turn on", "intent": \n')  # cut-off JSON
    sha = hashlib.sha256((tmp_path / "raw" / "commands.csv").read_bytes()).hexdigest()
    raw["origins"]["mine"]["files"]["commands.csv"] = sha
    for table in ("train", "test"):
        raw[table]["format"] = "jsonl"
    spec.write_text(yaml.safe_dump(raw))
    proc = run_cli("stage", "prepare", "--spec", str(spec), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "commands.csv:1: not valid JSON" in proc.stderr
    assert proc.stderr.count("\n") == 1, "one paragraph, no library log lines"
    assert not (tmp_path / "data").exists()


def _as_jsonl(tmp_path: Path, spec: Path, lines: list[bytes]) -> None:
    """Replace the own-data CSV with JSON Lines, re-pinned."""
    f = tmp_path / "raw" / "commands.csv"
    f.write_bytes(b"".join(lines))
    raw = yaml.safe_load(spec.read_text())
    raw["origins"]["mine"]["files"]["commands.csv"] = hashlib.sha256(f.read_bytes()).hexdigest()
    for table in ("train", "test"):
        raw[table]["format"] = "jsonl"
    spec.write_text(yaml.safe_dump(raw))


def test_jsonl_reads_like_the_same_csv(tmp_path):
    for d in ("csv", "jsonl"):
        (tmp_path / d).mkdir()
    labels = ["lights_on", "lights_off", "set_timer"]
    plain = _own_dataset(tmp_path / "csv", HOME, labels)
    lines = _own_dataset(tmp_path / "jsonl", HOME, labels)
    rows = [
        json.dumps({"utterance": x, "intent": y, "extra": [1, {"any": None}]}).encode() + b"\n"
        for x, y in HOME
    ]
    _as_jsonl(tmp_path / "jsonl", lines, [b"\xef\xbb\xbf" + rows[0], *rows[1:], b"\n"])  # BOM, blank line
    a, b = prepare(plain, tmp_path / "csv"), prepare(lines, tmp_path / "jsonl")
    assert a["rows"] == b["rows"] and a["dropped"] == b["dropped"] and a["sha256"] == b["sha256"]


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (
            b'{"utterance": "lights on", "intent": "lights_on",}\n',
            "3: not valid JSON (Expecting property name",
        ),
        (b'["lights on", "lights_on"]\n', "3: is a JSON list, not an object"),
        (b'{"utterance": 42, "intent": "lights_on"}\n', "3: 'utterance' is 42, not a string"),
        (
            b'{"utterance": "lights \\ud800 on", "intent": "lights_on"}\n',
            "3: 'utterance' holds an unpaired surrogate",
        ),
        (
            b'{"utterance": "lights \xff on", "intent": "lights_on"}\n',
            "3: byte 0xff is not UTF-8 (column 23 of this line)",
        ),
    ],
)
def test_a_bad_jsonl_line_is_named_by_its_line(tmp_path, bad, said):
    spec = _own_dataset(tmp_path, HOME, ["lights_on", "lights_off", "set_timer"])
    good = [json.dumps({"utterance": x, "intent": y}).encode() + b"\n" for x, y in HOME]
    _as_jsonl(tmp_path, spec, [*good[:2], bad, *good[2:]])
    proc = run_cli("stage", "prepare", "--spec", str(spec), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"commands.csv:{said}" in proc.stderr, proc.stderr
    assert not (tmp_path / "data").exists()


def test_a_jsonl_without_the_text_key_lists_the_keys_it_has(tmp_path):
    spec = _own_dataset(tmp_path, HOME, ["lights_on", "lights_off", "set_timer"])
    _as_jsonl(tmp_path, spec, [json.dumps({"text": x, "intent": y}).encode() + b"\n" for x, y in HOME])
    with pytest.raises(UserError, match=r"no line has the key 'utterance' \(keys: \['intent', 'text'\]\)"):
        prepare(spec, tmp_path)


def test_mirror_is_found_by_name_and_hash(tmp_path, mirror, monkeypatch):
    # A mirror laid out differently (flat) still serves the file, because lookup is by name + sha256.
    flat = tmp_path / "flat"
    flat.mkdir()
    for f in ("train.csv", "test.csv", "categories.json"):
        shutil.copy(mirror / "banking77" / f, flat / f)
    shutil.copy(mirror / "clinc150" / "data_full.json", flat / "data_full.json")
    (flat / "decoy").mkdir()
    (flat / "decoy" / "train.csv").write_text("text,category\nnot the pinned file,card_arrival\n")
    monkeypatch.setenv("REPROGATE_MIRROR", str(flat))
    assert mirror_dirs(REPO) == [flat]
    m = prepare(BANKING, REPO, tmp_path / "p", tmp_path)
    assert m["rows"]["test"] == 3080


def test_offline_without_mirror_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("REPROGATE_MIRROR", str(tmp_path))  # an empty mirror
    monkeypatch.setattr("urllib.request.OpenerDirector.open", _no_network)
    with pytest.raises(UserError, match="could not download https://raw.githubusercontent.com/PolyAI-LDN"):
        prepare(BANKING, REPO, tmp_path / "p", tmp_path)
    assert not (tmp_path / "p").exists()


def test_a_mirror_that_is_not_there_is_named_when_the_download_fails(tmp_path, monkeypatch):
    # A clone without ../shared beside it: the configured mirror is missing, not silently skipped.
    gone = tmp_path / "shared" / "datasets"
    monkeypatch.setenv("REPROGATE_MIRROR", str(gone))
    monkeypatch.setattr("urllib.request.OpenerDirector.open", _no_network)
    with pytest.raises(UserError) as err:
        prepare(BANKING, REPO, tmp_path / "p", tmp_path)
    msg = str(err.value)
    assert f"searched {gone} (does not exist)" in msg
    assert "train.csv with sha256 b06e26ac675513959a63135f11b94ea7786ed02da65db93a5650d8838cbc664b" in msg


def _no_network(*a, **k):
    # Every urllib request, whichever opener sends it, fails as on a machine without a route out.
    raise OSError("network is unreachable")


def test_a_spreadsheet_csv_with_bom_and_crlf_reads_like_a_plain_one(tmp_path):
    # Excel's "CSV UTF-8" starts with a byte-order mark and ends lines with CRLF.
    for d in ("plain", "excel"):
        (tmp_path / d).mkdir()
    plain = _own_dataset(tmp_path / "plain", HOME, ["lights_on", "lights_off", "set_timer"])
    excel = _own_dataset(tmp_path / "excel", HOME, ["lights_on", "lights_off", "set_timer"])
    f = tmp_path / "excel" / "raw" / "commands.csv"
    f.write_bytes(b"\xef\xbb\xbf" + f.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    raw = yaml.safe_load(excel.read_text())
    raw["origins"]["mine"]["files"]["commands.csv"] = hashlib.sha256(f.read_bytes()).hexdigest()
    excel.write_text(yaml.safe_dump(raw))
    a, b = prepare(plain, tmp_path / "plain"), prepare(excel, tmp_path / "excel")
    assert a["rows"] == b["rows"] and a["dropped"] == b["dropped"]
    assert a["sha256"] == b["sha256"]  # the same prepared rows, byte for byte


@pytest.fixture
def http_folder(tmp_path, monkeypatch):
    """A real HTTP server on localhost serving tmp_path/site: the download path, not a mock."""
    import functools
    import http.server
    import threading

    for var in ("no_proxy", "NO_PROXY"):  # a machine's HTTP proxy must not sit in between
        monkeypatch.setenv(var, "127.0.0.1,localhost")
    site = tmp_path / "site"
    site.mkdir()
    seen: list[tuple[str, str | None]] = []  # (path, Authorization header) of each request

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path.startswith("/elsewhere/"):  # like the hub's redirect to its storage host
                self.send_response(302)
                port = self.server.server_address[1]
                self.send_header(
                    "Location", f"http://localhost:{port}/{self.path.removeprefix('/elsewhere/')}"
                )
                self.end_headers()
                return
            super().do_GET()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(site))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield site, f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_a_pinned_url_is_downloaded_verified_and_cached(tmp_path, http_folder):
    site, base, seen = http_folder
    revision = "0123456789abcdef0123456789abcdef01234567"
    spec_path = _own_dataset(tmp_path, HOME, ["lights_on", "lights_off", "set_timer"])
    (site / revision).mkdir()
    shutil.copy(tmp_path / "raw" / "commands.csv", site / revision / "commands.csv")
    spec = yaml.safe_load(spec_path.read_text())
    url = base + "/{revision}/{file}"
    spec["origins"]["mine"]["source"] = {"kind": "url", "url": url, "revision": revision}
    spec_path.write_text(yaml.safe_dump(spec))

    first = prepare(spec_path, tmp_path)
    sha = spec["origins"]["mine"]["files"]["commands.csv"]
    cached = tmp_path / "data" / "raw" / "downloads" / sha / "commands.csv"
    assert cached.read_bytes() == (tmp_path / "raw" / "commands.csv").read_bytes()
    # Upstream changed under the same revision (or a proxy served something else): the pinned
    # cache keeps serving the verified bytes; nothing is fetched again.
    (site / revision / "commands.csv").write_text("utterance,intent\nsomething else,lights_on\n")
    assert prepare(spec_path, tmp_path)["sha256"] == first["sha256"]

    # Without the cache, the changed file is refused by its sha256 and not kept.
    shutil.rmtree(tmp_path / "data")
    with pytest.raises(UserError) as err:
        prepare(spec_path, tmp_path)
    msg = str(err.value)
    assert "origins.mine.files.commands.csv: sha256 mismatch" in msg
    assert f"{base}/{revision}/commands.csv" in msg
    assert not cached.exists() and not list(cached.parent.glob("*.part"))
    assert not (tmp_path / "data" / "prepared").exists()


def test_a_hub_dataset_is_fetched_from_hf_endpoint_with_hf_token(tmp_path, http_folder, monkeypatch):
    # The variables huggingface_hub reads: HF_ENDPOINT (a mirror of the hub, here a real local
    # server laid out like it) and HF_TOKEN (gated or private datasets), sent only to the hub.
    site, base, seen = http_folder
    monkeypatch.setenv("HF_ENDPOINT", base + "/")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    revision = "89abcdef0123456789abcdef0123456789abcdef"
    spec_path = _own_dataset(tmp_path, HOME, ["lights_on", "lights_off", "set_timer"])
    served = site / "datasets" / "me" / "home-commands" / "resolve" / revision / "data"
    served.mkdir(parents=True)
    shutil.copy(tmp_path / "raw" / "commands.csv", served / "my commands.csv")
    spec = yaml.safe_load(spec_path.read_text())
    sha = spec["origins"]["mine"]["files"].pop("commands.csv")
    spec["origins"]["mine"] = {
        "source": {"kind": "hf", "repo": "me/home-commands", "revision": revision},
        "files": {"data/my commands.csv": sha},
    }
    for part in ("train", "test"):
        spec[part]["file"] = "data/my commands.csv"
    spec_path.write_text(yaml.safe_dump(spec))

    prepare(spec_path, tmp_path)
    cached = tmp_path / "data" / "raw" / "downloads" / sha / "my commands.csv"
    assert cached.read_bytes() == (tmp_path / "raw" / "commands.csv").read_bytes()
    path = f"/datasets/me/home-commands/resolve/{revision}/data/my%20commands.csv"
    assert seen == [(path, "Bearer hf_secret")]
    # Sent to another host (the hub's storage), the file comes without the token going along.
    shutil.rmtree(tmp_path / "data")
    monkeypatch.setenv("HF_ENDPOINT", base + "/elsewhere")
    prepare(spec_path, tmp_path)
    assert cached.read_bytes() == (tmp_path / "raw" / "commands.csv").read_bytes()
    assert seen[1:] == [(f"/elsewhere{path}", "Bearer hf_secret"), (path, None)]
    # A repo id that is not owner/name (here a stray space) is a spec error before any request.
    spec["origins"]["mine"]["source"]["repo"] = "me/home commands"
    spec_path.write_text(yaml.safe_dump(spec))
    with pytest.raises(UserError, match=r"field 'origins\.mine\.source\.repo': value 'me/home commands'"):
        prepare(spec_path, tmp_path)
    assert len(seen) == 3
