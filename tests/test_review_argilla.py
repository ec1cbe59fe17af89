"""Review against a real Argilla 2.8 server (scripts/argilla.sh up), and a real browser on its UI.

Annotators answer through `POST /api/v1/records/{id}/responses`, the endpoint the web UI calls; the
browser test drives the UI itself in headless Debian Chromium. Without a server these tests skip,
except in CI (CI=true), where a missing server or browser is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from conftest import params_section, write_params
from review_examples import make_examples
from typer.testing import CliRunner

from clariedge.annotation import review as R
from clariedge.annotation import settings as S
from clariedge.cli import app
from clariedge.io import read_records, write_records
from clariedge.schema import Example

pytestmark = pytest.mark.argilla

ROOT = Path(__file__).resolve().parents[1]
URL = os.environ.get("ARGILLA_API_URL", "http://127.0.0.1:6900").rstrip("/")
KEY = os.environ.get("ARGILLA_API_KEY", "owner.apikey")
ANNOTATORS = ("annotator-1", "annotator-2")
PASSWORD_SUFFIX = os.environ.get("ARGILLA_ANNOTATOR_PASSWORD_SUFFIX", ".password")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the test command must start it, see scripts/test.sh)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def server() -> str:
    try:
        r = httpx.get(f"{URL}/api/v1/me", headers={"X-Argilla-Api-Key": KEY}, timeout=5)
    except httpx.HTTPError as err:
        _missing(f"Argilla server not reachable at {URL} ({err.__class__.__name__}); start it: scripts/argilla.sh up")
    if r.status_code != 200:
        _missing(f"Argilla at {URL} refuses ARGILLA_API_KEY (HTTP {r.status_code})")
    return URL


@pytest.fixture
def cfg(server: str):
    """A config for a fresh dataset of its own; the test's datasets are deleted afterwards."""
    base = f"pytest-{uuid.uuid4().hex[:8]}"
    yield params_section(
        "review", mode="argilla", dataset=base, api_url=server, api_key=KEY, batch_size=50, min_submitted=2
    )
    owner = httpx.Client(base_url=server, headers={"X-Argilla-Api-Key": KEY}, timeout=30)
    for ds in owner.get("/api/v1/me/datasets").json()["items"]:
        if ds["name"].startswith(base):
            owner.delete(f"/api/v1/datasets/{ds['id']}")


def _owner(server: str) -> httpx.Client:
    return httpx.Client(base_url=server, headers={"X-Argilla-Api-Key": KEY}, timeout=30)


def _records(server: str, name: str) -> list[dict]:
    conn = R.Connection.open(server, KEY)
    ds = conn.find_dataset(name, "default")
    assert ds is not None, f"dataset {name} not on the server"
    return conn.list_records(ds["id"], include=("responses",))


def _answer(server: str, annotator: str, record_uuid: str, status: str = "submitted", **values) -> None:
    client = httpx.Client(base_url=server, headers={"X-Argilla-Api-Key": f"{annotator}.apikey"}, timeout=30)
    body = {"values": {k: {"value": v} for k, v in values.items()}, "status": status}
    r = client.post(f"/api/v1/records/{record_uuid}/responses", json=body)
    assert r.status_code == 201, r.text


def test_push_annotate_pull_repush(cfg: R.ReviewConfig, tmp_path: Path) -> None:
    exs = make_examples(200)
    stats = R.push(exs, cfg, progress=False)
    assert (stats["created"], stats["updated"], stats["sent"], stats["refused"]) == (200, 0, 200, [])
    uuid_of = {r["external_id"]: r["id"] for r in _records(cfg.api_url, cfg.dataset_name)}
    assert set(uuid_of) == {e.id for e in exs}

    # Two annotators through the UI's endpoint. Expected matrix: record -> {annotator: category}.
    expected: dict[str, dict[str, str]] = {}
    for ex in exs[:10]:  # both submit; annotator-2 disagrees on the first five
        other = "clear" if ex.category != "clear" else "hard_negative"
        cat2 = other if exs.index(ex) < 5 else ex.category
        for annotator, cat in zip(ANNOTATORS, (ex.category, cat2), strict=True):
            needs = "yes" if cat.startswith("ambiguous") else "no"
            values = {"needs_clarification": needs, "category": cat, "quality": 4}
            if ex.clarification and cat == ex.category:
                values["clarification"] = ex.clarification
            _answer(cfg.api_url, annotator, uuid_of[ex.id], **values)
        expected[ex.id] = {"annotator-1": ex.category, "annotator-2": cat2}
    discarded = exs[10]
    _answer(cfg.api_url, "annotator-1", uuid_of[discarded.id], category=discarded.category, needs_clarification="no")
    _answer(cfg.api_url, "annotator-2", uuid_of[discarded.id], status="discarded")
    half = exs[11]  # one submission only: pending under keep_generator_label
    _answer(cfg.api_url, "annotator-1", uuid_of[half.id], category="clear", needs_clarification="no")
    draft = exs[12]  # a draft is ignored
    _answer(cfg.api_url, "annotator-2", uuid_of[draft.id], status="draft", category="clear")
    expected[half.id] = {"annotator-1": "clear"}

    src = tmp_path / "filtered.parquet"
    write_records(src, exs)
    out, disc, snap = tmp_path / "reviewed.parquet", tmp_path / "discarded.parquet", tmp_path / "snap.jsonl"
    stats = R.run(src, out, cfg, snapshot_path=snap, discarded_path=disc, push_first=False)
    reviewed = read_records(out, Example)
    matrix: dict[str, dict[str, str]] = {}
    for row in R.long_format(reviewed):
        matrix.setdefault(row["task"], {})[row["annotator"]] = row["label"]
    assert matrix == expected
    assert [e.id for e in read_records(disc, Example)] == [discarded.id]
    by_id = {e.id: e for e in reviewed}
    assert by_id[half.id].review_status == "pending" and by_id[half.id].category == half.category
    assert by_id[draft.id].annotations == [] and by_id[draft.id].review_status == "pending"
    assert (stats["reviewed"], stats["pending"], stats["discarded"], stats["drafts_ignored"]) == (10, 189, 1, 1)
    assert stats["annotators"] == 2 and stats["consensus_relabelled"] == 0  # ties keep the generator's label
    assert len(snap.read_text().splitlines()) == 200

    # Re-push: unchanged records are skipped; forced, they are updated in place; never duplicated.
    assert R.push(exs, cfg, progress=False)["skipped_unchanged"] == 200
    forced = R.push(exs, cfg, force=True, progress=False)
    assert (forced["created"], forced["updated"]) == (0, 200)
    after = _records(cfg.api_url, cfg.dataset_name)
    assert len(after) == 200 and len({r["external_id"] for r in after}) == 200
    R.run(src, out, cfg, push_first=False)  # responses survive the re-push
    assert {(r["task"], r["annotator"]): r["label"] for r in R.long_format(read_records(out, Example))} == {
        (t, a): label for t, row in expected.items() for a, label in row.items()
    }


def test_server_stopped_mid_push_fails_cleanly_and_a_rerun_completes(cfg: R.ReviewConfig) -> None:
    pid_file = ROOT / ".argilla" / "run" / "server.pid"
    if not pid_file.exists():
        pytest.skip("the server was not started by scripts/argilla.sh: this test stops and restarts it")
    exs = make_examples(300)
    script = ["bash", str(ROOT / "scripts" / "argilla.sh")]

    def stop_after_first(sent: int, total: int) -> None:
        if sent == cfg.batch_size:
            subprocess.run([*script, "down", "server"], check=True, capture_output=True)

    try:
        with pytest.raises(R.ReviewError, match=r"stopped after 50 of 300 records: cannot reach Argilla"):
            R.push(exs, cfg, progress=False, on_batch=stop_after_first)
    finally:
        subprocess.run([*script, "up"], check=True, capture_output=True)
    again = R.push(exs, cfg, progress=False)
    assert (again["skipped_unchanged"], again["created"]) == (50, 250)
    records = _records(cfg.api_url, cfg.dataset_name)
    assert sorted(r["external_id"] for r in records) == sorted(e.id for e in exs)


def test_clear_errors_and_nothing_lost(cfg: R.ReviewConfig) -> None:
    exs = make_examples(6)
    R.push(exs, cfg, progress=False)
    uuid_of = {r["external_id"]: r["id"] for r in _records(cfg.api_url, cfg.dataset_name)}
    _answer(cfg.api_url, "annotator-1", uuid_of[exs[0].id], category="clear", needs_clarification="no")

    with pytest.raises(R.ReviewError, match="rejected the API key"):
        R.push(exs, cfg.model_copy(update={"api_key": "not-a-key"}), progress=False)
    with pytest.raises(R.ReviewError, match="cannot reach Argilla at http://127.0.0.1:9"):
        R.pull_snapshot(cfg.model_copy(update={"api_url": "http://127.0.0.1:9"}))
    with pytest.raises(R.ReviewError, match="use an owner or admin key"):
        R.push(exs, cfg.model_copy(update={"api_key": "annotator-1.apikey"}), progress=False)
    with pytest.raises(R.ReviewError, match=r"other settings than this code \(distribution min_submitted is 2"):
        R.push(exs, cfg.model_copy(update={"min_submitted": 3}), progress=False)

    # a dataset made by an older version of the code (one question fewer)
    import argilla as rg

    old = S.settings_spec(2)
    old["questions"] = [q for q in old["questions"] if q["name"] != "quality"]
    client = rg.Argilla(api_url=cfg.api_url, api_key=KEY)
    old_name = S.dataset_name(cfg.dataset + "-old")
    rg.Dataset(name=old_name, workspace="default", settings=S.build_settings(old, client), client=client).create()
    with pytest.raises(R.ReviewError, match="question 'quality' is missing"):
        R.push(exs, cfg.model_copy(update={"dataset": cfg.dataset + "-old"}), progress=False)

    records = _records(cfg.api_url, cfg.dataset_name)  # nothing lost
    assert len(records) == 6
    assert [len(r["responses"]) for r in records if r["external_id"] == exs[0].id] == [1]


def test_send_back_queues_worst_first_with_label_quality(cfg: R.ReviewConfig) -> None:
    exs = make_examples(5)
    quality = {ex.id: q for ex, q in zip(exs, (0.9, 0.05, 0.5, 0.2, 0.7), strict=True)}
    stats = R.send_back(exs, quality, cfg)
    assert stats["created"] == 5 and stats["dataset"] == cfg.recheck_dataset_name
    conn = R.Connection.open(cfg.api_url, KEY)
    ds = conn.find_dataset(cfg.recheck_dataset_name, "default")
    listed = conn.list_records(ds["id"])  # insertion order: the queue annotators work through
    scores = [r["metadata"]["label_quality"] for r in listed]
    assert scores == sorted(quality.values())
    assert R.send_back(exs, quality, cfg)["skipped_unchanged"] == 5


def test_export_to_disk_then_import_mode(cfg: R.ReviewConfig, tmp_path: Path) -> None:
    exs = make_examples(4)
    R.push(exs, cfg, progress=False)
    uuid_of = {r["external_id"]: r["id"] for r in _records(cfg.api_url, cfg.dataset_name)}
    for annotator in ANNOTATORS:
        _answer(cfg.api_url, annotator, uuid_of[exs[2].id], category="clear", needs_clarification="no", quality=5)
    R.export_dataset(cfg, tmp_path / "export")
    assert (tmp_path / "export" / "records.json").exists()
    src = tmp_path / "in.parquet"
    write_records(src, exs)
    stats = R.run(
        src,
        tmp_path / "out.parquet",
        cfg.model_copy(update={"mode": "import", "import_path": str(tmp_path / "export")}),
    )
    assert stats["reviewed"] == 1 and stats["annotations"] == 2
    (done,) = [e for e in read_records(tmp_path / "out.parquet", Example) if e.review_status == "reviewed"]
    assert done.id == exs[2].id and {a.rating for a in done.annotations} == {5}


def test_browser_annotator_corrects_a_clarification(cfg: R.ReviewConfig, tmp_path: Path, monkeypatch) -> None:
    node = shutil.which("node")
    chromium = Path("/usr/bin/chromium")
    if node is None or not chromium.exists() or not (ROOT / "tests/browser/node_modules/playwright-core").exists():
        _missing("node, /usr/bin/chromium or tests/browser/node_modules missing: run scripts/browser_deps.sh")
    ex = make_examples(2)[1]  # ambiguous_documents with two titled documents
    R.push([ex], cfg, progress=False)
    conn = R.Connection.open(cfg.api_url, KEY)
    ds = conn.find_dataset(cfg.dataset_name, "default")
    corrected = f"Do you mean the {ex.documents[0].title} or the {ex.documents[1].title}?"
    artifacts = ROOT / "test-artifacts"
    env = dict(
        os.environ,
        ARGILLA_API_URL=cfg.api_url,
        ANNOTATOR_USERNAME="annotator-1",
        ANNOTATOR_PASSWORD="annotator-1" + PASSWORD_SUFFIX,
        DATASET_ID=ds["id"],
        EXPECT_TEXTS=json.dumps([ex.last_turn, ex.documents[1].doc_id]),
        EXPECT_HEADING=f"1. {ex.documents[0].title}",
        NEW_CLARIFICATION=corrected,
        SCREENSHOT_DIR=str(artifacts),
    )
    proc = subprocess.run(
        [node, "annotate.mjs"], cwd=ROOT / "tests/browser", env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["heading"] == f"1. {ex.documents[0].title}" and seen["rawMarkdownVisible"] == 0
    assert seen["suggested"] == ex.clarification and seen["typed"] == corrected
    assert (artifacts / "review_annotate_before_submit.png").stat().st_size > 10_000

    # `clariedge review pull` returns the annotator's corrected question
    params = tmp_path / "params.yaml"
    write_params(params, review={"mode": "argilla", "dataset": cfg.dataset, "min_submitted": 2})
    src, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    write_records(src, [ex])
    monkeypatch.setenv("ARGILLA_API_URL", cfg.api_url)
    monkeypatch.setenv("ARGILLA_API_KEY", KEY)
    result = CliRunner().invoke(app, ["review", "pull", str(src), "-o", str(out), "--params", str(params)])
    assert result.exit_code == 0, result.output
    (row,) = read_records(out, Example)
    (ann,) = row.annotations
    assert (ann.annotator, ann.status, ann.clarification) == ("annotator-1", "submitted", corrected)
    assert ann.category == "ambiguous_documents" and ann.needs_clarification is True
    assert row.review_status == "pending"  # one of the two submissions a record needs
