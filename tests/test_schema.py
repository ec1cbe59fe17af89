"""The record types and the parquet schemas derived from them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel

from clariedge.io import read_records, write_records
from clariedge.schema import (
    EXAMPLE_SCHEMA,
    OPEN_VARIANT,
    Example,
    Message,
    Provenance,
    SeedTurn,
    Source,
    arrow_schema,
    asked_turn_id,
)


class _Inner(BaseModel):
    name: str
    score: float | None = None


class _Outer(BaseModel):
    kind: Literal["a", "b"]
    count: int
    flag: bool
    note: str | None = None
    items: list[_Inner] = []
    tags: list[str] = []


def test_arrow_schema_follows_the_model() -> None:
    schema = arrow_schema(_Outer)
    assert schema.names == ["kind", "count", "flag", "note", "items", "tags"]
    assert schema.field("kind").type == pa.string()  # a Literal is stored as its string
    assert schema.field("count").type == pa.int64() and schema.field("flag").type == pa.bool_()
    assert schema.field("note").nullable  # optional -> nullable
    assert schema.field("items").type == pa.list_(pa.struct([("name", pa.string()), ("score", pa.float64())]))
    assert schema.field("tags").type == pa.list_(pa.string())


def test_every_example_field_is_stored() -> None:
    assert EXAMPLE_SCHEMA.names == list(Example.model_fields)
    prov = EXAMPLE_SCHEMA.field("provenance").type
    assert [prov.field(i).name for i in range(prov.num_fields)] == list(Provenance.model_fields)


def test_empty_lists_and_nulls_round_trip_through_parquet(tmp_path: Path) -> None:
    ex = Example(
        conversation_id="c1",
        domain="test",
        setting="pre_retrieval",
        category="clear",
        messages=[Message(role="user", content="When was the Eiffel Tower built?")],
        needs_clarification=False,
        provenance=Provenance(generator="human", seed_id="c1::1"),
    )
    path = tmp_path / "rows.parquet"
    write_records(path, [ex])
    # the empty lists keep their element type: a reader of the file alone knows what they hold
    stored = pq.read_schema(path)
    assert stored.field("documents").type == EXAMPLE_SCHEMA.field("documents").type
    assert stored.field("annotations").type == EXAMPLE_SCHEMA.field("annotations").type
    (back,) = read_records(path, Example)
    assert back == ex and back.documents == [] and back.label_quality is None


def test_a_field_type_without_an_arrow_mapping_is_an_error() -> None:
    class _Odd(BaseModel):
        when: complex

    with pytest.raises(KeyError):
        arrow_schema(_Odd)


def test_an_open_variant_is_named_after_its_turn_and_maps_back_to_it() -> None:
    asked = SeedTurn(
        conversation_id="c1",
        turn=2,
        domain="d",
        messages=[
            Message(role="user", content="hi"),
            Message(role="assistant", content="hello"),
            Message(role="user", content="how much is the plan?"),
        ],
        last_turn="how much is the plan?",
        source=Source(format="clariedge", path="d.jsonl", line=1, task_id="c1::2"),
    )
    variant = asked.model_copy(update={"clarification": "Which plan: Basic or Business?"})
    assert asked.id == "c1::2" and variant.id == "c1::2" + OPEN_VARIANT != asked.id
    assert asked_turn_id(variant.id) == asked_turn_id(asked.id) == asked.id
    assert asked_turn_id("c1::2::openly") == "c1::2::openly"  # only the suffix itself is cut
