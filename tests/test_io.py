"""The shared file helpers (clariedge.io): atomic writes that never leave a half-written file, JSON/JSONL and
parquet records (nulls, nested fields), and errors that name the row and the field."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel, ValidationError

from clariedge.io import (
    Rejects,
    atomic_path,
    describe_validation_error,
    read_records,
    read_table,
    save_figure,
    write_json,
    write_jsonl,
    write_records,
    write_text,
)
from clariedge.schema import (
    EXAMPLE_SCHEMA,
    SEED_TURN_SCHEMA,
    Annotation,
    Document,
    Example,
    Message,
    Provenance,
    SeedTurn,
    Source,
)


def ambiguous_example(conv: str = "c1", **kw) -> Example:
    """An example with every nested field filled: documents, provenance, annotations, interpretations."""
    fields = dict(
        conversation_id=conv,
        domain="wiki",
        setting="post_retrieval",
        category="ambiguous_documents",
        messages=[
            Message(role="user", content="Tell me about Mercury."),
            Message(role="assistant", content="Mercury is the planet closest to the Sun."),
            Message(role="user", content="How big is it?"),
        ],
        documents=[
            Document(doc_id="d1", title="Mercury (planet)", text="The smallest planet, 4,880 km across."),
            Document(doc_id="d2", title="Mercury (element)", text="A liquid metal, Hg."),
        ],
        needs_clarification=True,
        clarification="Do you mean the planet or the element?",
        interpretations=["the planet's diameter", "the element's atomic radius"],
        provenance=Provenance(generator="construct", method="adoc_entity_collision", seed_id=f"{conv}::2", score=0.75),
        review_status="reviewed",
        annotations=[
            Annotation(annotator="ann1", status="submitted", needs_clarification=True, rating=4),
            Annotation(annotator="ann2", status="discarded"),
        ],
        label_quality=0.5,
    )
    return Example(**{**fields, **kw})


def clear_example(conv: str = "c2") -> Example:
    return Example(
        conversation_id=conv,
        domain="wiki",
        setting="pre_retrieval",
        category="clear",
        messages=[Message(role="user", content="When was the Eiffel Tower built?")],
        needs_clarification=False,
        provenance=Provenance(generator="human", seed_id=f"{conv}::1"),
    )


def write_rows(path: Path, rows: list[dict], schema: pa.Schema = EXAMPLE_SCHEMA) -> Path:
    """Raw rows to parquet, bypassing the models (what another tool, or a null, could leave in a file)."""
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


# --- atomic writes -------------------------------------------------------------------------------------
def test_a_failed_atomic_write_keeps_the_previous_file_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    write_text(path, "good\n")
    with pytest.raises(RuntimeError, match="crash"), atomic_path(path) as tmp:
        tmp.write_text("half", encoding="utf-8")
        assert tmp != path and tmp.parent == path.parent
        assert path.read_text(encoding="utf-8") == "good\n"  # the new bytes go elsewhere until the block ends
        raise RuntimeError("crash")
    assert path.read_text(encoding="utf-8") == "good\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_successful_atomic_write_replaces_the_file_and_creates_its_folders(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "out.txt"
    write_text(path, "one")
    write_text(path, "two")
    assert path.read_text(encoding="utf-8") == "two"
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.txt"]


def test_write_jsonl_that_fails_midway_keeps_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    assert write_jsonl(path, [{"b": 1, "a": "é"}, {"a": None}]) == 2
    before = path.read_bytes()

    def rows():
        yield {"a": 1}
        yield {"a": 2}
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_jsonl(path, rows())
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["rows.jsonl"]


def test_write_jsonl_writes_one_sorted_json_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    n = write_jsonl(path, (r for r in [{"b": 1, "a": "Zürich"}, {"z": [1, 2], "y": None}]))
    assert n == 2
    assert path.read_text(encoding="utf-8") == '{"a": "Zürich", "b": 1}\n{"y": null, "z": [1, 2]}\n'


def test_write_json_is_sorted_indented_unescaped_and_ends_with_a_newline(tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    write_json(path, {"rows": 3, "by_domain": {"wiki": 2, "café": 1}})
    text = path.read_text(encoding="utf-8")
    assert text == '{\n  "by_domain": {\n    "café": 1,\n    "wiki": 2\n  },\n  "rows": 3\n}\n'
    assert json.loads(text) == {"rows": 3, "by_domain": {"wiki": 2, "café": 1}}


def test_an_atomic_write_gets_the_permissions_a_plain_write_would(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        plain = tmp_path / "plain.json"
        plain.write_text("{}\n", encoding="utf-8")
        atomic = tmp_path / "atomic.json"
        write_json(atomic, {})
        assert plain.read_text(encoding="utf-8") == atomic.read_text(encoding="utf-8")
        assert oct(atomic.stat().st_mode & 0o777) == oct(plain.stat().st_mode & 0o777) == oct(0o644)
    finally:
        os.umask(old)


def test_save_figure_writes_a_png_without_the_software_tag_and_closes_the_figure(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    fig.gca().plot([0, 1], [1, 0])
    num = fig.number
    save_figure(fig, tmp_path / "plots" / "line.png")
    data = (tmp_path / "plots" / "line.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert b"Software" not in data and b"matplotlib" not in data.lower()
    assert num not in plt.get_fignums()


# --- parquet records ------------------------------------------------------------------------------------
def test_nested_examples_round_trip_through_parquet_field_by_field(tmp_path: Path) -> None:
    rows = [ambiguous_example("c1"), clear_example("c2"), ambiguous_example("c3", label_quality=None)]
    path = tmp_path / "examples.parquet"
    write_records(path, rows)
    assert pq.read_schema(path).equals(EXAMPLE_SCHEMA, check_metadata=False)
    back = read_records(path, Example)
    assert [b.conversation_id for b in back] == ["c1", "c2", "c3"]  # order kept
    for orig, got in zip(rows, back, strict=True):
        for name in Example.model_fields:
            assert getattr(got, name) == getattr(orig, name), name
    first = back[0]
    assert [d.title for d in first.documents] == ["Mercury (planet)", "Mercury (element)"]
    assert first.annotations[0].rating == 4 and first.annotations[1].needs_clarification is None
    assert first.provenance.score == 0.75 and first.provenance.model is None
    assert back[2].label_quality is None and back[1].documents == [] and back[1].interpretations == []


def test_seed_turns_round_trip_with_their_source(tmp_path: Path) -> None:
    seed = SeedTurn(
        conversation_id="conv-9",
        turn=2,
        domain="finance",
        messages=[
            Message(role="user", content="What is an ETF?"),
            Message(role="assistant", content="An exchange-traded fund."),
            Message(role="user", content="Are they taxed?"),
        ],
        last_turn="Are they taxed?",
        rewrite="Are ETFs taxed?",
        documents=[Document(doc_id="f1", text="ETF gains are taxed when sold.")],
        source=Source(format="mtrag_tasks", path="data/mtrag/fiqa.jsonl", line=17, task_id="t-17"),
    )
    path = tmp_path / "seeds.parquet"
    write_records(path, [seed])
    assert pq.read_schema(path).equals(SEED_TURN_SCHEMA, check_metadata=False)
    (back,) = read_records(path, SeedTurn)
    assert back == seed
    assert back.source.line == 17 and back.documents[0].title == "" and back.id == "conv-9::2"
    assert back.is_standalone is False


def test_nulls_in_fields_with_defaults_read_back_as_the_defaults(tmp_path: Path) -> None:
    ex = ambiguous_example()
    row = ex.model_dump(mode="json")
    row.update(id=None, interpretations=None, annotations=None, review_status=None, label_quality=None)
    path = write_rows(tmp_path / "nulls.parquet", [row])
    assert read_table(path)[0]["annotations"] is None  # the file really holds nulls
    (back,) = read_records(path, Example)
    assert back.interpretations == [] and back.annotations == []
    assert back.review_status == "unreviewed"
    assert back.label_quality is None  # a field whose default is None keeps the null
    assert back.id == ex.id  # an empty id is recomputed from the content
    assert back.documents == ex.documents and back.provenance == ex.provenance


def test_a_null_in_a_required_field_names_the_row_and_the_field(tmp_path: Path) -> None:
    rows = [clear_example("c1").model_dump(mode="json"), clear_example("c2").model_dump(mode="json")]
    rows[1]["conversation_id"] = None
    path = write_rows(tmp_path / "bad.parquet", rows)
    with pytest.raises(ValueError) as err:
        read_records(path, Example)
    assert str(err.value) == f"{path}: row 1: conversation_id: field required"


def test_a_bad_value_names_the_row_the_field_and_a_shortened_value(tmp_path: Path) -> None:
    rows = [clear_example(f"c{i}").model_dump(mode="json") for i in range(3)]
    rows[2]["setting"] = "x" * 100
    path = write_rows(tmp_path / "bad.parquet", rows)
    with pytest.raises(ValueError, match=r"row 2: setting: Input should be 'pre_retrieval' or 'post_retrieval'") as e:
        read_records(path, Example)
    got = str(e.value).split("(got ", 1)[1]
    assert got == "'" + "x" * 56 + "...)"  # the value is cut to 60 characters


def test_a_rule_across_fields_is_reported_for_the_whole_row(tmp_path: Path) -> None:
    row = ambiguous_example().model_dump(mode="json")
    row["needs_clarification"] = False
    path = write_rows(tmp_path / "bad.parquet", [row])
    with pytest.raises(ValueError, match=r"row 0: <row>: Value error, needs_clarification=False contradicts"):
        read_records(path, Example)


def test_an_unknown_column_is_an_error_unless_ignored(tmp_path: Path) -> None:
    table = pa.Table.from_pylist([clear_example().model_dump(mode="json")], schema=EXAMPLE_SCHEMA)
    path = tmp_path / "published.parquet"
    pq.write_table(table.append_column("target", pa.array(['{"clarification": "CLEAR"}'])), path)
    with pytest.raises(ValueError, match=r"row 0: target: Extra inputs are not permitted"):
        read_records(path, Example)
    (back,) = read_records(path, Example, ignore_unknown=True)
    assert back == clear_example()


def test_reading_a_missing_file_says_which_and_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet: no such file .*dvc repro"):
        read_records(tmp_path / "nope.parquet", Example)


def test_writing_records_of_an_unregistered_model_is_refused_before_any_file_is_touched(tmp_path: Path) -> None:
    class Other(BaseModel):
        x: int

    path = tmp_path / "out.parquet"
    write_records(path, [clear_example()])
    before = path.read_bytes()
    with pytest.raises(TypeError, match="no Arrow schema registered for Other"):
        write_records(path, [Other(x=1)])
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["out.parquet"]


def test_an_empty_record_list_writes_a_file_that_reads_back_empty(tmp_path: Path) -> None:
    path = tmp_path / "empty.parquet"
    write_records(path, [])
    assert read_records(path, Example) == []


# --- error messages and rejects -------------------------------------------------------------------------
def test_describe_validation_error_gives_one_dotted_path_per_problem() -> None:
    row = clear_example().model_dump(mode="json")
    row["messages"] = [{"role": "bot", "content": "hi"}]
    del row["domain"]
    with pytest.raises(ValidationError) as err:
        Example.model_validate(row)
    text = describe_validation_error(err.value)
    assert "\n" not in text
    assert text.split("; ") == [
        "domain: field required",
        "messages.0.role: Input should be 'user' or 'assistant' (got 'bot')",
    ]


def test_rejects_count_by_reason_and_shorten_what_they_keep(tmp_path: Path) -> None:
    rejects = Rejects()
    rejects.add("too_long", "a.jsonl:3", "turn over 80 words", raw="w " * 1500)
    rejects.add("bad_json", "a.jsonl:1", "not JSON", raw={"k": "v"})
    rejects.add("too_long", "a.jsonl:7", "turn over 80 words")
    assert len(rejects) == 3
    assert rejects.counts() == {"dropped_bad_json": 1, "dropped_too_long": 2}
    assert list(rejects.counts()) == sorted(rejects.counts())
    rejects.write(tmp_path / "rejects.jsonl")
    back = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["where"] for r in back] == ["a.jsonl:3", "a.jsonl:1", "a.jsonl:7"]
    assert back[0]["raw"].startswith("w w ") and back[0]["raw"].endswith("... [1000 more chars]")
    assert len(back[0]["raw"]) == 2000 + len("... [1000 more chars]")
    assert back[1]["raw"] == '{"k": "v"}' and back[2]["raw"] is None
