"""Tests of the `filter` stage on inline examples: each drop reason, near-duplicates with the real MiniLM,
balancing caps, determinism, the CLI, and the optional LLM judge against a real loopback OpenAI server."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import params_section, write_params
from typer.testing import CliRunner

from clariedge import filter as stage
from clariedge.cli import app
from clariedge.io import read_records, write_records
from clariedge.schema import Document, Example, Message, Provenance

NO_BALANCE = params_section("filter.balance", max_share=None)
NO_DEDUP = params_section("filter.dedup", enabled=False, cache=None)


def dedup(**kw) -> stage.DedupConfig:
    return params_section("filter.dedup", **kw)


def filter_cfg(**kw) -> stage.FilterConfig:
    return params_section("filter", **kw)


def ex(
    turn: str,
    category: str = "clear",
    *,
    setting: str = "pre_retrieval",
    clarification: str | None = None,
    dialog: tuple[str, ...] = (),
    documents: tuple[tuple[str, str], ...] = (),
    conv: str = "c1",
    interpretations: tuple[str, ...] = (),
    resolution: str | None = None,
) -> Example:
    msgs = [Message(role="user" if i % 2 == 0 else "assistant", content=t) for i, t in enumerate(dialog)]
    if category == "hard_negative" and resolution is None:
        resolution = turn + " (resolved)"
    return Example(
        conversation_id=conv,
        domain="test",
        setting=setting,  # type: ignore[arg-type]
        category=category,  # type: ignore[arg-type]
        messages=[*msgs, Message(role="user", content=turn)],
        documents=[Document(doc_id=f"d{i}", title=t, text=x) for i, (t, x) in enumerate(documents)],
        needs_clarification=category in ("ambiguous_dialog", "ambiguous_documents"),
        clarification=clarification,
        interpretations=list(interpretations),
        resolution=resolution,
        provenance=Provenance(generator="human", seed_id=f"{conv}::1"),
    )


def raw(*examples: Example) -> list[dict]:
    return [e.model_dump(mode="json") for e in examples]


def reasons(rejects) -> dict[str, int]:
    return {k.removeprefix("dropped_"): v for k, v in rejects.counts().items()}


CARDINALS = (
    ("Cardinals (Arizona, NFL)", "The Arizona Cardinals were founded in 1898 by Chris O'Brien in Chicago."),
    ("Cardinals (St. Louis, MLB)", "The St. Louis Cardinals baseball club was founded in 1882."),
)


def test_each_drop_reason_on_inline_examples() -> None:
    keep = ex("How long is the Penobscot River?", conv="a")
    rows = raw(keep, keep, ex("how long is the penobscot river", conv="a"))  # exact duplicates
    rows[2]["messages"][-1]["content"] = "How long is the PENOBSCOT river?!"  # same visible text, other casing
    rows[2]["id"] = Example.model_validate(rows[2] | {"id": ""}).id
    bad = raw(keep)[0] | {"category": "confusing"}
    tampered = raw(ex("Who wrote Hamlet?", conv="b"))[0] | {"id": "ex-0000000000000000"}
    rows += [bad, tampered]
    rows += raw(
        ex("x" * 700, conv="c"),  # too long
        ex(
            "Who founded the Cardinals?",
            "ambiguous_documents",
            setting="post_retrieval",
            documents=CARDINALS,
            interpretations=("Cardinals (Arizona, NFL)", "Cardinals (St. Louis, MLB)"),
            conv="d",
            clarification="The Arizona Cardinals were founded in 1898 by Chris O'Brien - is that the team you mean?",
        ),
        ex(
            "When was it founded?", "ambiguous_dialog", conv="e", clarification="Do you mean the club founded in 1882?"
        ),  # states a number the question lacks
        ex("What does it cost?", "ambiguous_dialog", conv="f", clarification="Tell me which product you mean."),
        ex(
            "Who founded the Cardinals?",
            "ambiguous_documents",
            setting="post_retrieval",
            documents=CARDINALS,
            interpretations=("Cardinals (Arizona, NFL)",),
            conv="g",
            clarification="Which Cardinals do you mean?",
        ),
        ex(
            "Who founded the Cardinals?",
            "ambiguous_documents",
            setting="post_retrieval",
            documents=CARDINALS,
            interpretations=("Cardinals (Arizona, NFL)", "Cardinals (Louisville, college)"),
            conv="h",
            clarification="Which Cardinals do you mean?",
        ),
        ex(
            "does it support JSON?",
            "hard_negative",
            conv="i",
            dialog=("Tell me about X.", "X is a DB."),
            resolution="Does it support JSON",
        ),
    )
    kept, rejects, stats = stage.transform(rows, filter_cfg(balance=NO_BALANCE, dedup=NO_DEDUP), rng=random.Random(0))
    assert [k.last_turn for k in kept] == ["How long is the Penobscot River?"]
    assert reasons(rejects) == {
        "duplicate": 2,
        "invalid_row": 1,
        "id_mismatch": 1,
        "too_long": 1,
        "clarification_answers": 2,
        "clarification_not_question": 1,
        "missing_evidence": 2,
        "unsupported_interpretation": 1,
    }
    details = {r["reason"]: r["detail"] for r in rejects.rows}
    assert "category" in details["invalid_row"]
    leaks = [r["detail"] for r in rejects.rows if r["reason"] == "clarification_answers"]
    assert any("copies" in d for d in leaks) and any("1882" in d for d in leaks)
    assert stats["rows_in"] == len(rows) and stats["rows_out"] == 1
    assert stats["dropped_duplicate"] == 2


def test_a_clarification_naming_its_interpretations_is_not_a_leak() -> None:
    row = ex(
        "Who founded the Cardinals?",
        "ambiguous_documents",
        setting="post_retrieval",
        documents=CARDINALS,
        interpretations=("Cardinals (Arizona, NFL)", "Cardinals (St. Louis, MLB)"),
        clarification="Do you mean Cardinals (Arizona, NFL) or Cardinals (St. Louis, MLB)?",
    )
    assert stage.answers_itself(row, params_section("filter.leakage")) is None


def test_near_duplicates_with_minilm_within_category_and_setting(tmp_path: Path) -> None:
    cfg = filter_cfg(balance=NO_BALANCE, dedup=dedup(threshold=0.95, cache=str(tmp_path / "emb.sqlite")))
    rows = raw(
        ex("How much does the Lite plan cost per month?", conv="a"),
        ex("How much does the Lite plan cost per month ?!", conv="b", dialog=("hi", "hello")),  # near-dup
        ex("How much does the Lite plan cost per month?", "hard_negative", conv="c", dialog=("Lite?", "Yes.")),
        ex(
            "How much does the Lite plan cost per month?",
            setting="post_retrieval",
            conv="d",
            documents=(("Lite plan", "The Lite plan is free."),),
        ),  # other setting: kept
        ex("Who painted the Mona Lisa?", conv="e"),
    )
    kept, rejects, stats = stage.transform(rows, cfg, rng=random.Random(0))
    assert reasons(rejects) == {"near_duplicate": 1}
    assert {k.conversation_id for k in kept} == {"a", "c", "d", "e"} or {k.conversation_id for k in kept} == {
        "b",
        "c",
        "d",
        "e",
    }
    assert (tmp_path / "emb.sqlite").exists()
    strict = filter_cfg(balance=NO_BALANCE, dedup=dedup(threshold=0.9999, cache=str(tmp_path / "emb.sqlite")))
    kept2, rejects2, _ = stage.transform(rows, strict, rng=random.Random(0))
    assert len(kept2) == 5 and not rejects2.rows


def _many(n_clear: int, n_amb: int) -> list[dict]:
    rows = [ex(f"What is fact number {i} about rivers?", conv=f"c{i}") for i in range(n_clear)]
    rows += [
        ex(f"what about number {i}?", "ambiguous_dialog", conv=f"a{i}", clarification=f"Which item {i} do you mean?")
        for i in range(n_amb)
    ]
    return raw(*rows)


def test_balancing_respects_max_per_cell_and_max_share() -> None:
    off = NO_DEDUP
    capped = filter_cfg(dedup=off, balance=params_section("filter.balance", max_per_cell=5, max_share=None))
    kept, rejects, stats = stage.transform(_many(12, 8), capped, rng=random.Random(1))
    assert stats["out_by_category_setting"] == {"ambiguous_dialog/pre_retrieval": 5, "clear/pre_retrieval": 5}
    assert reasons(rejects) == {"balanced_out": 10}
    shared = filter_cfg(dedup=off, balance=params_section("filter.balance", max_share=0.6))
    kept, _, stats = stage.transform(_many(30, 10), shared, rng=random.Random(1))
    counts = stats["out_by_category_setting"]
    assert counts["ambiguous_dialog/pre_retrieval"] == 10
    assert counts["clear/pre_retrieval"] / len(kept) <= 0.6 and counts["clear/pre_retrieval"] == 15


def test_balancing_is_deterministic_and_seeded(tmp_path: Path) -> None:
    cfg = filter_cfg(dedup=NO_DEDUP, balance=params_section("filter.balance", max_per_cell=7))
    a, _, sa = stage.transform(_many(20, 3), cfg, rng=random.Random(5))
    b, _, sb = stage.transform(list(reversed(_many(20, 3))), cfg, rng=random.Random(5))
    write_records(tmp_path / "a.parquet", a)
    write_records(tmp_path / "b.parquet", b)
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes() and sa == sb
    c, _, _ = stage.transform(_many(20, 3), cfg, rng=random.Random(6))
    assert {e.id for e in a} != {e.id for e in c}


def test_cli_writes_outputs_and_stats(tmp_path: Path) -> None:
    rows = [
        ex("Who wrote Hamlet?", conv="a"),
        ex("Who wrote Hamlet?", conv="a"),
        ex("Which one?", "ambiguous_dialog", conv="b", clarification="Which book do you mean?"),
    ]
    write_records(tmp_path / "in.parquet", rows)
    params = tmp_path / "params.yaml"
    no_dedup = {"enabled": False, "cache": str(tmp_path / "emb.sqlite")}
    write_params(params, seed=3, filter={"dedup": no_dedup, "balance": {"max_share": None}})
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(
        app,
        [
            "filter",
            str(tmp_path / "in.parquet"),
            "-o",
            str(out),
            "--rejects",
            str(tmp_path / "rej.jsonl"),
            "--stats",
            str(tmp_path / "s.json"),
            "--params",
            str(params),
        ],
    )
    assert result.exit_code == 0, result.output
    assert len(read_records(out, Example)) == 2
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["dropped_duplicate"] == 1 and stats["in_by_category_setting"]["clear/pre_retrieval"] == 2
    assert json.loads((tmp_path / "rej.jsonl").read_text().splitlines()[0])["reason"] == "duplicate"
    write_params(params, filter={"dedup": {"threshold": 3}})
    bad = CliRunner().invoke(app, ["filter", str(tmp_path / "in.parquet"), "-o", str(out), "--params", str(params)])
    assert bad.exit_code == 1 and "filter.dedup.threshold" in bad.output


def test_judge_drops_what_the_llm_rejects(tmp_path: Path) -> None:
    pytest.importorskip("openai")
    from openai_stub import Behaviour, OpenAIStub

    def rule(hit: int, body: dict) -> Behaviour:
        text = body["messages"][-1]["content"]
        verdict = {"is_clarification": "1898" not in text, "answers_question": "1898" in text, "reason": "test"}
        return Behaviour.ok(json.dumps(verdict))

    rows = raw(
        ex("Who founded them?", "ambiguous_dialog", conv="a", clarification="Which team do you mean?"),
        ex("Who founded it?", "ambiguous_dialog", conv="b", clarification="The one from 1898, right?"),
        ex("Who wrote Hamlet?", conv="c"),
    )
    with OpenAIStub() as stub:
        stub.rule = rule
        endpoint = params_section("filter.judge.openai", base_url=stub.base_url, model="stub", max_retries=0)
        cfg = filter_cfg(
            dedup=NO_DEDUP,
            balance=NO_BALANCE,
            leakage=params_section("filter.leakage", numbers=False),
            judge=params_section("filter.judge", enabled=True, cache=str(tmp_path / "judge.sqlite"), openai=endpoint),
        )
        kept, rejects, stats = stage.transform(rows, cfg, rng=random.Random(0), seed=1, api_key="sk-test")
        assert stub.hits == 2  # only the ambiguous rows are judged
        again, _, _ = stage.transform(rows, cfg, rng=random.Random(0), seed=1, api_key="sk-test")
        assert stub.hits == 2  # the judge's cache answers a re-run
    assert {k.conversation_id for k in kept} == {"a", "c"} and len(again) == 2
    assert reasons(rejects) == {"judge_not_clarification": 1}
    assert stats["judge"]["verdicts"] == {"accepted": 1, "not_clarification": 1}
