"""Tests for the ingest stage: every reader on real MTRAG files, the bundled sample, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_params

from clariedge.ingest import merge_seed_turns, read_seed_turns, run, transform
from clariedge.io import Rejects, read_records
from clariedge.schema import Document, Message, SeedTurn, Source

# ---------------------------------------------------------------------------------------------
# Real MTRAG files (skipped where ../shared/data/mtrag is absent)
# ---------------------------------------------------------------------------------------------


def test_bundle_yields_159_grounded_turns_of_20_conversations(mtrag_dir: Path) -> None:
    seeds, rejects, stats = transform([mtrag_dir / "reference_subset_with_human_evaluations.json"])
    assert len(rejects) == 0
    assert len(seeds) == 159
    assert len({s.conversation_id for s in seeds}) == 20
    grounded = [s for s in seeds if s.documents]
    assert len(grounded) == 150  # 9 tasks of the bundle retrieved no passage
    # passage texts are resolved from the bundle's documents, with their titles
    assert all(d.text.strip() and d.doc_id for s in grounded for d in s.documents)
    # Wikipedia and government pages carry titles (given, or the passage's heading line); forum posts do not
    titled = [d.title for s in grounded if s.domain in {"clapnq", "govt"} for d in s.documents]
    assert titled and all(titled)
    # the dialog keeps the agent turns and ends on the user turn
    multi = next(s for s in seeds if s.turn > 1)
    assert [m.role for m in multi.messages][:2] == ["user", "assistant"]
    assert multi.messages[-1].role == "user"


def test_beir_pairs_777_lastturn_rewrites_of_110_conversations(mtrag_dir: Path) -> None:
    seeds, rejects, stats = transform([mtrag_dir / "retrieval_tasks"])
    assert len(rejects) == 0
    assert len(seeds) == 777
    assert len({s.conversation_id for s in seeds}) == 110
    assert all(s.rewrite for s in seeds)
    assert set(stats["by_domain"]) == {"clapnq", "cloud", "fiqa", "govt"}
    # questions.jsonl gives the earlier user turns as history
    s = next(s for s in seeds if s.conversation_id == "dd6b6ffd177f2b311abe676261279d2f" and s.turn == 3)
    assert s.last_turn == "Are the Arizona Cardinals and the Chicago Cardinals the same team?"
    assert [m.content for m in s.messages][0] == "where do the arizona cardinals play this week"
    # hard-negative material: most turns lean on the dialog and a human rewrite resolves them
    assert 400 < stats["non_standalone"] < 777


def test_generation_task_jsonl_with_context_texts(mtrag_dir: Path) -> None:
    seeds, rejects, _ = transform([mtrag_dir / "taskb_input.jsonl"])
    assert len(rejects) == 0 and len(seeds) == 10
    grounded = [s for s in seeds if s.documents]
    assert grounded and all(d.title and d.text for s in grounded for d in s.documents)
    assert all(s.source.format == "mtrag_task" and s.source.line for s in seeds)


def test_whole_folder_merges_sources_into_one_table(mtrag_dir: Path) -> None:
    seeds, rejects, stats = transform([mtrag_dir])
    assert len(rejects) == 0
    assert stats["by_format"] == {"beir": 777, "mtrag_bundle": 159, "mtrag_task": 20}
    ids = [s.id for s in seeds]
    assert len(ids) == len(set(ids)) == stats["seed_turns"]
    assert stats["conversations"] == 110
    # a turn present in the bundle and in the BEIR files gets both the passages and the rewrite
    both = [s for s in seeds if s.documents and s.rewrite]
    assert len(both) >= 140
    assert ids == sorted(ids, key=lambda i: (i.rsplit("::", 1)[0], int(i.rsplit("::", 1)[1])))


# ---------------------------------------------------------------------------------------------
# The bundled sample
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [False, True], ids=["sample", "sample_more"])
def test_bundled_sample_has_what_later_stages_need(sample_dir: Path, extra: bool) -> None:
    # data/sample_more is read only when params name it; read alone and beside data/sample, nothing is rejected
    # (a passage id it shared with data/sample would have to carry the same text)
    folder = sample_dir.parent / "sample_more" if extra else sample_dir
    assert len(transform([sample_dir, folder])[1]) == 0
    seeds, rejects, stats = transform([folder])
    assert len(rejects) == 0
    convs: dict[str, list[SeedTurn]] = {}
    for s in seeds:
        if not s.clarification:  # a hand-written open variant is a seed of its own beside its turn
            convs.setdefault(s.conversation_id, []).append(s)
    assert len(convs) >= 24
    assert len(stats["by_domain"]) >= 4
    assert all(3 <= len(turns) <= 8 for turns in convs.values())
    assert all(2 <= len(s.documents) <= 6 for s in seeds)
    assert stats["non_standalone"] >= 48
    # passages about different entities sharing a head name (`Head (Disambiguator)` titles)
    colliding = 0
    for s in seeds:
        heads: dict[str, set[str]] = {}
        for d in s.documents:
            if " (" in d.title:
                head, rest = d.title.split(" (", 1)
                heads.setdefault(head, set()).add(rest)
        colliding += any(len(v) >= 2 for v in heads.values())
    assert colliding >= 14


# ---------------------------------------------------------------------------------------------
# Bad input: reported with file, line and field; good rows kept; never a traceback
# ---------------------------------------------------------------------------------------------

GOOD = {
    "conversation_id": "c1",
    "domain": "wiki",
    "turns": [
        {
            "role": "user",
            "content": "Who wrote Dune?",
            "documents": [{"doc_id": "d1", "title": "Dune", "text": "Dune is a novel by Frank Herbert."}],
        },
        {"role": "assistant", "content": "Frank Herbert."},
        {"role": "user", "content": "when was it published?", "rewrite": "When was Dune published?"},
    ],
}


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_project_conversation_jsonl_expands_to_one_seed_per_user_turn(tmp_path: Path) -> None:
    f = _write(tmp_path / "d.jsonl", [json.dumps(GOOD)])
    seeds, rejects, _ = transform([f])
    assert len(rejects) == 0
    assert [s.turn for s in seeds] == [1, 2]
    assert seeds[1].rewrite == "When was Dune published?" and not seeds[1].is_standalone
    assert seeds[0].is_standalone and seeds[0].documents[0].title == "Dune"
    assert [m.role for m in seeds[1].messages] == ["user", "assistant", "user"]


def test_open_variant_is_a_seed_of_its_own_after_the_same_dialog(tmp_path: Path) -> None:
    # a writer's open variant of turn 2: the dialog before it, the variant as the last turn, the writer's question,
    # its own passages; the turn as asked stays a seed of its own, and no rewrite is carried over to the variant
    conv = json.loads(json.dumps(GOOD))
    passage = {"doc_id": "d2", "title": "Dune Messiah", "text": "Dune Messiah is the second Dune novel."}
    conv["turns"][2]["open_variant"] = {
        "content": "and the sequel, when did that come out?",
        "clarification": "Which sequel do you mean: Dune Messiah or Children of Dune?",
        "documents": [passage],
    }
    broken = dict(GOOD, conversation_id="c2", turns=[*GOOD["turns"][:2], dict(GOOD["turns"][2], open_variant={})])
    f = _write(tmp_path / "d.jsonl", [json.dumps(conv), json.dumps(broken)])
    seeds, rejects, stats = transform([f])
    by_id = {s.id: s for s in seeds}
    variant = by_id["c1::2::open"]
    assert by_id["c1::2"].last_turn == "when was it published?" and by_id["c1::2"].clarification is None
    assert variant.last_turn == "and the sequel, when did that come out?" and variant.rewrite is None
    assert variant.messages[:-1] == by_id["c1::2"].messages[:-1]
    assert variant.clarification.startswith("Which sequel") and variant.documents[0].title == "Dune Messiah"
    assert stats["open_variants"] == 1
    # the broken variant is reported where it is; its turn and conversation are kept
    assert "c2::2" in by_id and "c2::2::open" not in by_id
    assert [r["where"] for r in rejects.rows] == [f"{f}:2 turns.2.open_variant"]
    assert "content: field required" in rejects.rows[0]["detail"]


def test_bad_rows_are_reported_with_line_and_field_and_good_rows_kept(tmp_path: Path) -> None:
    other = dict(GOOD, conversation_id="c2")
    wrong_type = dict(GOOD, conversation_id="c3", domain=7)
    missing = {k: v for k, v in GOOD.items() if k != "domain"}
    missing["conversation_id"] = "c4"
    assistant_last = {"conversation_id": "c5", "domain": "x", "messages": [{"role": "assistant", "content": "hi"}]}
    no_text = dict(
        GOOD, conversation_id="c6", turns=[{"role": "user", "content": "q", "documents": [{"doc_id": "d", "text": ""}]}]
    )
    f = _write(
        tmp_path / "mixed.jsonl",
        [
            json.dumps(GOOD),
            '{"conversation_id": "broken", ',
            json.dumps(wrong_type),
            json.dumps(missing),
            json.dumps(assistant_last),
            json.dumps(no_text),
            json.dumps(other),
        ],
    )
    seeds, rejects, stats = transform([f])
    assert sorted({s.conversation_id for s in seeds}) == ["c1", "c2"]
    where = {r["where"].split(" ")[0]: r for r in rejects.rows}
    assert where[f"{f}:2"]["reason"] == "malformed_json"
    assert "domain: expected str" in where[f"{f}:3"]["detail"]
    assert "domain: field required" in where[f"{f}:4"]["detail"]
    assert "must end with a user turn" in where[f"{f}:5"]["detail"]
    assert "documents.0.text" in where[f"{f}:6"]["detail"]
    assert stats["dropped_malformed_json"] == 1 and stats["dropped_invalid_row"] == 4


def test_empty_and_truncated_and_non_utf8_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    truncated = tmp_path / "bundle.json"
    truncated.write_text('{"documents": [], "tasks": [{"task_id": "a<::>1", ', encoding="utf-8")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(GOOD).encode() + b"\n" + '{"conversation_id": "caf\xe9"}'.encode("latin-1") + b"\n")
    seeds, rejects, stats = transform([empty, truncated, latin])
    reasons = {r["reason"]: r for r in rejects.rows}
    assert reasons["empty_file"]["where"] == str(empty)
    assert reasons["malformed_json"]["where"].startswith(f"{truncated}:1")
    assert reasons["not_utf8"]["where"] == f"{latin}:2"
    assert [s.conversation_id for s in seeds] == ["c1", "c1"]  # the good line before the bad byte is kept


def test_mtrag_task_rows_with_bad_fields(tmp_path: Path) -> None:
    good = {"task_id": "conv<::>1", "input": [{"speaker": "user", "text": "hi?"}], "contexts": []}
    rows = [
        good,
        {"task_id": "conv<::>2", "input": "oops"},
        {"task_id": "nope", "input": []},
        {"task_id": "conv<::>3", "input": [{"speaker": "robot", "text": "x"}]},
    ]
    f = _write(tmp_path / "tasks.jsonl", [json.dumps(r) for r in rows])
    seeds, rejects, _ = transform([f])
    assert [s.turn for s in seeds] == [1]
    details = [r["detail"] for r in rejects.rows]
    assert any("input: expected list" in d for d in details)
    assert any("task id 'nope'" in d for d in details)
    assert any("speaker: expected user or agent" in d for d in details)


def test_beir_duplicate_id_and_unpaired_rewrite(tmp_path: Path) -> None:
    _write(
        tmp_path / "x_lastturn.jsonl",
        [
            json.dumps({"_id": "c<::>1", "text": "|user|: what about it?"}),
            json.dumps({"_id": "c<::>1", "text": "|user|: dup"}),
            json.dumps({"_id": "c<::>2", "text": "|user|: and then?"}),
        ],
    )
    _write(tmp_path / "x_rewrite.jsonl", [json.dumps({"_id": "c<::>1", "text": "|user|: what about the Moon?"})])
    seeds, rejects, _ = transform([tmp_path])
    assert {r["reason"] for r in rejects.rows} == {"duplicate_id", "unpaired"}
    assert [(s.turn, s.rewrite) for s in seeds] == [(1, "what about the Moon?"), (2, None)]


def test_merge_prefers_the_richest_dialog() -> None:
    src = Source(format="t", path="p")
    short = SeedTurn(
        conversation_id="c",
        turn=2,
        domain="d",
        last_turn="and it?",
        rewrite="and the Moon?",
        messages=[Message(role="user", content="Mars?"), Message(role="user", content="and it?")],
        source=src,
    )
    rich = SeedTurn(
        conversation_id="c",
        turn=2,
        domain="d",
        last_turn="and it?",
        messages=[
            Message(role="user", content="Mars?"),
            Message(role="assistant", content="red"),
            Message(role="user", content="and it?"),
        ],
        documents=[Document(doc_id="m", text="The Moon.")],
        source=src,
    )
    (merged,) = merge_seed_turns([short, rich])
    assert len(merged.messages) == 3 and merged.documents[0].doc_id == "m" and merged.rewrite == "and the Moon?"


def test_run_writes_rejects_and_never_overwrites_on_strict_failure(tmp_path: Path) -> None:
    src = _write(tmp_path / "d.jsonl", [json.dumps(GOOD), "not json"])
    out = tmp_path / "seeds.parquet"
    stats = run([src], out, tmp_path / "rej.jsonl", tmp_path / "stats.json")
    assert stats["seed_turns"] == 2 and stats["rejected"] == 1
    before = out.read_bytes()
    assert len(read_records(out, SeedTurn)) == 2
    with pytest.raises(RuntimeError, match="1 bad rows"):
        run([src], out, tmp_path / "rej.jsonl", strict=True)
    assert out.read_bytes() == before
    # same input, same bytes
    run([src], tmp_path / "again.parquet")
    assert (tmp_path / "again.parquet").read_bytes() == before


def test_cli_strict_mode_exits_non_zero_without_traceback(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_bytes(b"\xff\xfe garbage\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "clariedge.cli",
            "ingest",
            str(src),
            "-o",
            str(tmp_path / "o.parquet"),
            "--strict",
            "--params",
            str(write_params(tmp_path / "params.yaml")),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "not UTF-8" in proc.stderr and f"{src}:1" in proc.stderr
    assert not (tmp_path / "o.parquet").exists()


def test_params_typo_names_the_key(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    write_params(params, ingest={"sorce": "paths"})
    proc = subprocess.run(
        [sys.executable, "-m", "clariedge.cli", "ingest", "-o", str(tmp_path / "o.parquet"), "--params", str(params)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and "ingest.sorce: unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_read_seed_turns_reports_unknown_format(tmp_path: Path) -> None:
    f = _write(tmp_path / "weird.jsonl", [json.dumps({"foo": 1})])
    rejects = Rejects()
    seeds, _ = read_seed_turns([f], rejects)
    assert seeds == [] and rejects.rows[0]["reason"] == "unknown_format"


def test_explicit_params_file_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "clariedge.cli", "ingest", "-o", "o.parquet", "--params", "params.yml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and "params.yml: params file not found" in proc.stderr
    assert not (tmp_path / "o.parquet").exists()
