"""Review stage without a server: record building, snapshot conversion, the review policies, settings checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import params_section, write_params
from review_examples import make_examples
from typer.testing import CliRunner

from clariedge.annotation import review as R
from clariedge.annotation import settings as S
from clariedge.cli import app
from clariedge.io import read_records, write_records
from clariedge.schema import Example

CFG = params_section("review", mode="argilla", min_submitted=2)


def _resp(annotator: str, status: str = "submitted", **values) -> dict:
    return {"annotator": annotator, "status": status, "values": values}


def _snap(record_id: str, *responses: dict, drafts: int = 0) -> dict:
    return {"record_id": record_id, "record_status": "pending", "responses": list(responses), "drafts": drafts}


# ---- records ----------------------------------------------------------------------------------
def test_record_carries_dialog_documents_suggestions_and_metadata() -> None:
    ex = make_examples(2)[1]  # ambiguous_documents, post-retrieval
    rec = R.example_to_record(ex)
    assert rec["external_id"] == ex.id
    assert rec["fields"]["dialog"] == [{"role": m.role, "content": m.content} for m in ex.messages]
    assert rec["fields"]["final_turn"] == ex.last_turn
    docs = rec["fields"]["documents"]
    assert docs.startswith("### 1. ") and "### 2. " in docs and ex.documents[1].doc_id in docs
    assert "**" in docs  # markdown in the passage is kept for the markdown field
    sugg = {s["question"]: s for s in rec["suggestions"]}
    assert sugg["needs_clarification"]["value"] == "yes"
    assert sugg["category"]["value"] == "ambiguous_documents"
    assert sugg["clarification"]["value"] == ex.clarification
    assert {s["agent"] for s in sugg.values()} == {"construct"}
    assert {s["score"] for s in sugg.values()} == {ex.provenance.score}
    meta = rec["metadata"]
    assert meta[S.META_CATEGORY] == "ambiguous_documents" and meta["setting"] == "post_retrieval"
    assert meta["domain"] == "cloud" and meta["generator"] == "construct"
    assert S.META_LABEL_QUALITY not in meta


def test_clear_record_has_no_clarification_suggestion_and_pre_retrieval_says_no_documents() -> None:
    ex = make_examples(4)[3]  # hard negative, pre-retrieval
    rec = R.example_to_record(ex)
    assert [s["question"] for s in rec["suggestions"]] == ["needs_clarification", "category"]
    assert rec["suggestions"][0]["value"] == "no"
    assert rec["fields"]["documents"] == R.NO_DOCUMENTS


def test_push_hash_is_stable_and_changes_with_content_and_label_quality() -> None:
    ex = make_examples(1)[0]
    h = R.example_to_record(ex)["metadata"][S.META_PUSH_HASH]
    assert h == R.example_to_record(ex)["metadata"][S.META_PUSH_HASH]
    with_q = R.example_to_record(ex, label_quality=0.25)
    assert with_q["metadata"][S.META_LABEL_QUALITY] == 0.25
    assert with_q["metadata"][S.META_PUSH_HASH] != h


def test_agent_name_is_sanitised_for_argilla() -> None:
    ex = make_examples(1)[0]
    odd = ex.model_copy(update={"provenance": ex.provenance.model_copy(update={"model": "org/model@v1 (beta)"})})
    assert R.agent_name(odd) == "construct:org/model_v1 _beta_"


# ---- settings ---------------------------------------------------------------------------------
def test_settings_spec_matches_the_brief() -> None:
    spec = S.settings_spec(3)
    assert [f["type"] for f in spec["fields"]] == ["chat", "text", "text"]
    q = {x["name"]: x for x in spec["questions"]}
    assert set(q["needs_clarification"]["labels"]) == {"yes", "no"}
    assert set(q["category"]["labels"]) == {"ambiguous_dialog", "ambiguous_documents", "clear", "hard_negative"}
    assert q["clarification"]["type"] == "text" and q["quality"]["type"] == "rating"
    assert {m["name"] for m in spec["metadata"]} >= {"generated_category", "setting", "domain", "generator"}
    assert spec["distribution"] == {"strategy": "overlap", "min_submitted": 3}
    assert S.dataset_name("clariedge-review") == f"clariedge-review-v{S.SETTINGS_VERSION}"


def test_guidelines_have_a_worked_example_per_category_and_explain_hard_negatives() -> None:
    text = S.guidelines()
    for cat in ("ambiguous_dialog", "ambiguous_documents", "clear", "hard_negative"):
        assert f"Worked example: `{cat}`" in text
    assert "Why hard negatives need no clarification" in text


def test_settings_mismatch_names_what_changed() -> None:
    spec = S.settings_spec(2)
    live = json.loads(json.dumps(spec))
    assert S.settings_mismatch(spec, live) == []
    live["questions"][2]["labels"] = {"clear": "", "ambiguous": ""}
    live["fields"] = live["fields"][:2]
    live["distribution"]["min_submitted"] = 1
    problems = S.settings_mismatch(spec, live)
    assert any("field 'final_turn' is missing" in p for p in problems)
    assert any("question 'category' has labels" in p for p in problems)
    assert any("min_submitted is 1" in p for p in problems)


# ---- snapshot conversion ----------------------------------------------------------------------
def test_snapshot_from_api_maps_users_and_drops_drafts() -> None:
    api = [
        {
            "external_id": "ex-b",
            "status": "completed",
            "responses": [
                {"user_id": "u2", "status": "submitted", "values": {"category": {"value": "clear"}}},
                {"user_id": "u1", "status": "draft", "values": {"category": {"value": "hard_negative"}}},
                {"user_id": "u3", "status": "discarded", "values": {}},
            ],
        },
        {"external_id": "ex-a", "status": "pending", "responses": []},
    ]
    snap = R.snapshot_from_api(api, {"u1": "ann-1", "u2": "ann-2"})
    assert [r["record_id"] for r in snap] == ["ex-a", "ex-b"]
    b = snap[1]
    assert b["drafts"] == 1
    assert b["responses"] == [
        {"annotator": "ann-2", "status": "submitted", "values": {"category": "clear"}},
        {"annotator": "u3", "status": "discarded", "values": {}},
    ]


def test_snapshot_from_export_regroups_answers_per_user() -> None:
    exported = [
        {
            "id": "ex-1",
            "status": "completed",
            "responses": {
                "category": [
                    {"value": "clear", "user_id": "u1", "status": "submitted"},
                    {"value": "hard_negative", "user_id": "u2", "status": "submitted"},
                    {"value": "clear", "user_id": "u3", "status": "draft"},
                ],
                "needs_clarification": [{"value": "no", "user_id": "u1", "status": "submitted"}],
            },
        }
    ]
    (row,) = R.snapshot_from_export(exported)
    assert row["drafts"] == 1
    assert row["responses"] == [
        {"annotator": "u1", "status": "submitted", "values": {"category": "clear", "needs_clarification": "no"}},
        {"annotator": "u2", "status": "submitted", "values": {"category": "hard_negative"}},
    ]


def test_to_annotation_converts_values_and_ignores_junk() -> None:
    a = R.to_annotation(
        _resp("x", needs_clarification="yes", clarification="  Which one?  ", category="ambiguous_dialog", quality=4)
    )
    assert (a.needs_clarification, a.clarification, a.category, a.rating) == (True, "Which one?", "ambiguous_dialog", 4)
    b = R.to_annotation(_resp("y", needs_clarification="maybe", clarification="", category="nope", quality=9))
    assert (b.needs_clarification, b.clarification, b.category, b.rating) == (None, None, None, None)


# ---- transform --------------------------------------------------------------------------------
def test_mode_none_passes_everything_through_unreviewed() -> None:
    exs = make_examples(8)
    out, disc, stats = R.transform(exs, [], params_section("review"))
    assert [e.id for e in out] == sorted(e.id for e in exs)
    assert {e.review_status for e in out} == {"unreviewed"} and disc == []
    assert {e.id: e.target for e in out} == {e.id: e.target for e in exs}
    assert stats["unreviewed"] == 8 and stats["annotations"] == 0


def test_complete_records_get_the_majority_label_and_one_annotation_per_annotator() -> None:
    ex = make_examples(4)[3]  # hard negative; annotators say it is ambiguous
    snap = [
        _snap(
            ex.id,
            _resp("a1", needs_clarification="yes", category="ambiguous_dialog", clarification="Which plan?"),
            _resp("a2", needs_clarification="yes", category="ambiguous_dialog", clarification="Which plan?"),
            _resp("a3", needs_clarification="no", category="hard_negative"),
            drafts=2,
        )
    ]
    (out,), disc, stats = R.transform([ex], snap, CFG)
    assert out.id == ex.id and out.review_status == "reviewed"
    assert out.category == "ambiguous_dialog" and out.clarification == "Which plan?" and out.needs_clarification
    assert [a.annotator for a in out.annotations] == ["a1", "a2", "a3"]
    assert stats["consensus_relabelled"] == 1 and stats["drafts_ignored"] == 2 and disc == []
    # consensus off: the generator's label stays, the annotations are still recorded
    (kept,), _, _ = R.transform([ex], snap, CFG.model_copy(update={"consensus": "generator"}))
    assert kept.category == "hard_negative" and len(kept.annotations) == 3


def test_majority_tie_keeps_generator_label_and_edited_clarification_wins() -> None:
    ex = make_examples(1)[0]  # ambiguous_dialog
    snap = [
        _snap(
            ex.id,
            _resp("a1", category="ambiguous_dialog", clarification="Basic or Team: which plan's price?"),
            _resp("a2", category="clear"),
        )
    ]
    (out,), _, stats = R.transform([ex], snap, CFG)
    assert out.category == "ambiguous_dialog"
    assert out.clarification == "Basic or Team: which plan's price?"
    assert stats["consensus_relabelled"] == 1


def test_invalid_majority_keeps_generator_label() -> None:
    ex = make_examples(4)[3]  # pre-retrieval hard negative: ambiguous_documents is impossible here
    snap = [_snap(ex.id, *(_resp(a, category="ambiguous_documents", clarification="Which?") for a in ("a1", "a2")))]
    (out,), _, stats = R.transform([ex], snap, CFG)
    assert out.category == "hard_negative" and out.review_status == "reviewed"
    assert stats["consensus_kept_invalid_majority"] == 1


def test_discarded_records_are_kept_apart() -> None:
    exs = make_examples(3)
    snap = [
        _snap(exs[0].id, _resp("a1", "discarded")),
        _snap(exs[1].id, _resp("a1", category=exs[1].category), _resp("a2", "discarded")),
        _snap(exs[2].id, *(_resp(a, category=exs[2].category) for a in ("a1", "a2")), _resp("a3", "discarded")),
    ]
    out, disc, stats = R.transform(exs, snap, CFG)
    assert sorted(e.id for e in disc) == sorted([exs[0].id, exs[1].id])
    assert {e.review_status for e in disc} == {"discarded"}
    assert [e.id for e in out] == [exs[2].id] and out[0].review_status == "reviewed"
    assert [a.status for a in out[0].annotations] == ["submitted", "submitted", "discarded"]
    assert stats["discarded"] == 2


@pytest.mark.parametrize("policy", ["keep_generator_label", "drop", "wait"])
def test_incomplete_policy(policy: str) -> None:
    exs = make_examples(2)
    snap = [
        _snap(exs[0].id, *(_resp(a, category=exs[0].category) for a in ("a1", "a2"))),
        _snap(exs[1].id, _resp("a1")),
    ]
    cfg = CFG.model_copy(update={"incomplete": policy})
    if policy == "wait":
        with pytest.raises(R.ReviewIncomplete, match="1 of 2 records have fewer than 2 submitted"):
            R.transform(exs, snap, cfg)
        return
    out, _, stats = R.transform(exs, snap, cfg)
    if policy == "drop":
        assert [e.id for e in out] == [exs[0].id] and stats["dropped_incomplete"] == 1
    else:
        pending = [e for e in out if e.id == exs[1].id]
        assert pending[0].review_status == "pending" and pending[0].category == exs[1].category
        assert len(pending[0].annotations) == 1


def test_long_format_feeds_cleanlab() -> None:
    from cleanlab.multiannotator import convert_long_to_wide_dataset

    exs = make_examples(3)
    snap = [
        _snap(exs[0].id, _resp("a1", category="clear"), _resp("a2", category="ambiguous_dialog")),
        _snap(
            exs[1].id,
            _resp("a1", category="clear"),
            _resp("a2", category="ambiguous_documents"),
            _resp("a3", "discarded"),
        ),
    ]
    out, _, _ = R.transform(exs, snap, CFG.model_copy(update={"consensus": "generator"}))
    import pandas as pd

    wide = convert_long_to_wide_dataset(pd.DataFrame(R.long_format(out)))
    assert wide.loc[exs[0].id, "a1"] == "clear" and wide.loc[exs[0].id, "a2"] == "ambiguous_dialog"
    assert wide.loc[exs[1].id, "a2"] == "ambiguous_documents"
    assert "a3" not in wide.columns  # discards are not labels


# ---- stage I/O and CLI ------------------------------------------------------------------------
def test_run_mode_none_writes_outputs(tmp_path: Path) -> None:
    src = tmp_path / "filtered.parquet"
    write_records(src, make_examples(6))
    stats = R.run(
        src,
        tmp_path / "reviewed.parquet",
        params_section("review"),
        snapshot_path=tmp_path / "snap.jsonl",
        discarded_path=tmp_path / "disc.parquet",
        stats_path=tmp_path / "review.json",
    )
    assert stats["rows_out"] == 6
    assert len(read_records(tmp_path / "reviewed.parquet", Example)) == 6
    assert (tmp_path / "snap.jsonl").read_text() == ""
    assert json.loads((tmp_path / "review.json").read_text())["unreviewed"] == 6
    before = (tmp_path / "reviewed.parquet").read_bytes()
    R.run(src, tmp_path / "reviewed.parquet", params_section("review"))
    assert (tmp_path / "reviewed.parquet").read_bytes() == before


def test_import_mode_reads_an_export_and_reports_a_missing_one(tmp_path: Path) -> None:
    exs = make_examples(2)
    export = tmp_path / "export"
    export.mkdir()
    ans = [{"value": exs[0].category, "user_id": u, "status": "submitted"} for u in ("u1", "u2")]
    (export / "records.json").write_text(json.dumps([{"id": exs[0].id, "responses": {"category": ans}}]))
    cfg = params_section("review", mode="import", import_path=str(export))
    src = tmp_path / "in.parquet"
    write_records(src, exs)
    stats = R.run(src, tmp_path / "out.parquet", cfg)
    assert stats["reviewed"] == 1 and stats["unreviewed"] == 1
    with pytest.raises(R.ReviewError, match="no Argilla export here"):
        R.run(src, tmp_path / "out.parquet", cfg.model_copy(update={"import_path": str(tmp_path / "nope")}))


def test_send_back_is_a_no_op_offline() -> None:
    exs = make_examples(2)
    assert R.send_back(exs, {exs[0].id: 0.1}, params_section("review"))["sent"] == 0


def test_cli_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "in.parquet"
    write_records(src, make_examples(2))
    write_params(tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ARGILLA_API_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("ARGILLA_API_KEY", "owner.apikey")
    result = CliRunner().invoke(app, ["review", "push", str(src)])
    assert result.exit_code == 1
    assert "cannot reach Argilla at http://127.0.0.1:9" in result.output
    assert "Traceback" not in result.output
    monkeypatch.delenv("ARGILLA_API_KEY")
    result = CliRunner().invoke(app, ["review", "push", str(src)])
    assert "set ARGILLA_API_KEY" in result.output


def test_cli_run_none_mode(tmp_path: Path) -> None:
    src = tmp_path / "in.parquet"
    write_records(src, make_examples(3))
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(app, ["review", "run", str(src), "-o", str(out), "--mode", "none"])
    assert result.exit_code == 0, result.output
    assert "3 unreviewed" in result.output
    assert {e.review_status for e in read_records(out, Example)} == {"unreviewed"}


def test_import_mode_reads_a_pulled_snapshot_with_discards(tmp_path: Path) -> None:
    exs = make_examples(2)
    snap = tmp_path / "snap.jsonl"
    rows = [_snap(exs[0].id, _resp("a1", "discarded")), _snap(exs[1].id, _resp("a1", category="clear"))]
    snap.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert R.read_export(snap) == sorted(rows, key=lambda r: r["record_id"])
    src = tmp_path / "in.parquet"
    write_records(src, exs)
    stats = R.run(src, tmp_path / "out.parquet", params_section("review", mode="import", import_path=str(snap)))
    assert (stats["discarded"], stats["pending"]) == (1, 1)
    snap.write_text('{"record_id": "x"}\nnot json\n')
    with pytest.raises(R.ReviewError, match=r"snap.jsonl:2: not valid JSON"):
        R.read_export(snap)
