"""Record types shared by every stage: seed turns (ingest output) and examples (dataset rows).

Column names are contracts: every stage reads and writes these models, and the Arrow schemas at the
bottom of this module fix how they are stored in parquet. Ids are content-derived, so the same
content always gets the same id and re-running a stage never renames a row.
"""

from __future__ import annotations

import hashlib
import json
import types
from typing import Any, Literal, Union, get_args, get_origin

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["user", "assistant"]
Setting = Literal["pre_retrieval", "post_retrieval"]
Category = Literal["ambiguous_dialog", "ambiguous_documents", "clear", "hard_negative"]
ReviewStatus = Literal["unreviewed", "pending", "reviewed", "discarded"]

SETTINGS: tuple[Setting, ...] = ("pre_retrieval", "post_retrieval")
CATEGORIES: tuple[Category, ...] = ("ambiguous_dialog", "ambiguous_documents", "clear", "hard_negative")
AMBIGUOUS: frozenset[str] = frozenset({"ambiguous_dialog", "ambiguous_documents"})


def content_id(*parts: object, prefix: str = "", length: int = 16) -> str:
    """A stable id: the SHA-256 of the parts' canonical JSON, shortened."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return prefix + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:length]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class Message(_Record):
    """One dialog message. MTRAG's `speaker: user|agent` is mapped to `role: user|assistant`."""

    role: Role
    content: str = Field(min_length=1)


class Document(_Record):
    """A retrieved passage."""

    doc_id: str = Field(min_length=1)
    title: str = ""
    text: str = Field(min_length=1)


class Source(_Record):
    """Where a seed turn came from: the reader's format, the file and line, and the original task id."""

    format: str
    path: str
    line: int | None = None
    task_id: str | None = None


def _check_dialog(messages: list[Message]) -> list[Message]:
    if not messages:
        raise ValueError("a dialog needs at least one message")
    if messages[-1].role != "user":
        raise ValueError(f"the dialog must end with a user turn, it ends with role {messages[-1].role!r}")
    return messages


OPEN_VARIANT = "::open"


def asked_turn_id(seed_id: str) -> str:
    """The id of the turn as it was asked, for a seed id that may name its open variant (SeedTurn.id)."""
    return seed_id.removesuffix(OPEN_VARIANT)


class SeedTurn(_Record):
    """One user turn at the end of a grounded dialog: what synthesis starts from."""

    conversation_id: str = Field(min_length=1)
    turn: int = Field(ge=1, description="1-based index of the user turn in its dialog (as MTRAG counts)")
    domain: str = Field(min_length=1)
    messages: list[Message]
    last_turn: str = Field(min_length=1)
    rewrite: str | None = None
    documents: list[Document] = []
    source: Source
    clarification: str | None = Field(
        default=None,
        min_length=1,
        description="the question the dialog's writer would ask here: the turn, at this point of its dialog, is "
        "open (a sample's hand-written `open_variant`); None for every turn as it was asked",
    )

    _dialog = field_validator("messages")(_check_dialog)

    @model_validator(mode="after")
    def _last_turn_matches(self) -> SeedTurn:
        if self.messages[-1].content != self.last_turn:
            raise ValueError("last_turn must equal the content of the final user message")
        return self

    @property
    def id(self) -> str:
        """`<conversation>::<turn>`; a writer's open variant of that turn adds `::open` (OPEN_VARIANT)."""
        return f"{self.conversation_id}::{self.turn}" + (OPEN_VARIANT if self.clarification else "")

    @property
    def is_standalone(self) -> bool:
        """False when a human rewrite differs from the turn: the turn leans on the dialog."""
        return self.rewrite is None or _norm(self.rewrite) == _norm(self.last_turn)


def _norm(text: str) -> str:
    return " ".join(text.lower().split()).rstrip("?.! ")


class Provenance(_Record):
    """How an example was made; enough to regenerate or audit it."""

    generator: str = Field(description="backend: construct | openai | transformers | human")
    model: str | None = None
    method: str | None = Field(None, description="construction method or task name")
    prompt_id: str | None = None
    prompt_version: str | None = None
    prompt_hash: str | None = None
    seed_id: str = Field(description="id of the seed turn, `conversation_id::turn`")
    template: str | None = Field(None, description="the wording template or sampled variant drawn")
    score: float | None = Field(None, ge=0.0, le=1.0, description="generator's confidence, if any")


class Annotation(_Record):
    """One annotator's response to one example (long format: what cleanlab's helpers take)."""

    annotator: str
    status: Literal["submitted", "discarded"]
    needs_clarification: bool | None = None
    clarification: str | None = None
    category: Category | None = None
    rating: int | None = Field(None, ge=1, le=5)


class Example(_Record):
    """A dataset row: a dialog (and documents) with the decision and, if needed, the question to ask."""

    id: str = ""
    conversation_id: str = Field(min_length=1)
    domain: str
    setting: Setting
    category: Category
    messages: list[Message]
    documents: list[Document] = []
    needs_clarification: bool
    clarification: str | None = None
    interpretations: list[str] = []
    resolution: str | None = None
    provenance: Provenance
    review_status: ReviewStatus = "unreviewed"
    annotations: list[Annotation] = []
    label_quality: float | None = None

    _dialog = field_validator("messages")(_check_dialog)

    @model_validator(mode="after")
    def _consistent(self) -> Example:
        expected = self.category in AMBIGUOUS
        if self.needs_clarification != expected:
            raise ValueError(f"needs_clarification={self.needs_clarification} contradicts category {self.category!r}")
        if self.needs_clarification and not self.clarification:
            raise ValueError(f"category {self.category!r} needs a clarification question")
        if not self.needs_clarification and self.clarification:
            raise ValueError(f"category {self.category!r} must not carry a clarification question")
        if self.setting == "pre_retrieval" and self.documents:
            raise ValueError("a pre_retrieval example has no documents")
        if self.setting == "post_retrieval" and not self.documents:
            raise ValueError("a post_retrieval example needs its retrieved documents")
        if self.category == "ambiguous_documents" and self.setting != "post_retrieval":
            raise ValueError("ambiguous_documents only exists post_retrieval")
        if not self.id:
            object.__setattr__(self, "id", self.compute_id())
        return self

    def compute_id(self) -> str:
        """Content hash of what defines the example (not its review state)."""
        return content_id(
            self.conversation_id,
            self.setting,
            self.category,
            [m.model_dump() for m in self.messages],
            [d.doc_id for d in self.documents],
            self.clarification,
            prefix="ex-",
        )

    @property
    def last_turn(self) -> str:
        return self.messages[-1].content

    @property
    def target(self) -> dict[str, str]:
        """The model's contract output for this example."""
        return {"clarification": self.clarification if self.needs_clarification else "CLEAR"}


# ---------------------------------------------------------------------------------------------
# Arrow schemas: how the records are stored in parquet, derived from the models (explicit, so empty lists
# keep their type)
# ---------------------------------------------------------------------------------------------
_SCALARS = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def arrow_type(annotation: Any) -> pa.DataType:
    """The Arrow type of a model field: optional -> nullable (Arrow's default), Literal -> string, list -> list,
    a record -> struct."""
    origin = get_origin(annotation)
    if origin in (types.UnionType, Union):
        (inner,) = [a for a in get_args(annotation) if a is not type(None)]
        return arrow_type(inner)
    if origin is Literal:
        return pa.string()
    if origin is list:
        return pa.list_(arrow_type(get_args(annotation)[0]))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return pa.struct([(name, arrow_type(f.annotation)) for name, f in annotation.model_fields.items()])
    return _SCALARS[annotation]


def arrow_schema(model: type[BaseModel]) -> pa.Schema:
    return pa.schema([(name, arrow_type(f.annotation)) for name, f in model.model_fields.items()])


SEED_TURN_SCHEMA = arrow_schema(SeedTurn)
EXAMPLE_SCHEMA = arrow_schema(Example)
