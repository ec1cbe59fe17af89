"""The Argilla review dataset, defined in code: fields, questions, metadata, guidelines, task distribution.

Argilla cannot change a dataset's settings after it is created, so the settings live here, the dataset
name carries a version (`clariedge-review-v1`), and a change to anything below means a new version.
`settings_spec` is plain data (tested without a server); `build_settings` turns it into `rg.Settings`;
`settings_mismatch` compares the spec with what a live dataset has, so a stale dataset gives a clear
error instead of a half-working push.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any

from clariedge.schema import CATEGORIES

if TYPE_CHECKING:  # argilla is heavy: imported only where a live server is used
    import argilla as rg

SETTINGS_VERSION = 1
"""Bump when anything in `settings_spec` changes; it becomes part of the dataset name."""

CATEGORY_LABELS: dict[str, str] = {
    "ambiguous_dialog": "Ambiguous from the dialog (several readings, the dialog does not settle it)",
    "ambiguous_documents": "Ambiguous from the documents (they support different answers)",
    "clear": "Clear (one reading, answerable as is)",
    "hard_negative": "Hard negative (looks ambiguous, but the dialog/documents settle it)",
}
assert tuple(CATEGORY_LABELS) == CATEGORIES

NEEDS_CLARIFICATION_LABELS: dict[str, str] = {
    "yes": "Yes: ask a clarifying question first",
    "no": "No: answer directly",
}
RATING_VALUES: list[int] = [1, 2, 3, 4, 5]

FIELD_DIALOG = "dialog"
FIELD_DOCUMENTS = "documents"
FIELD_FINAL_TURN = "final_turn"
Q_NEEDS = "needs_clarification"
Q_CLARIFICATION = "clarification"
Q_CATEGORY = "category"
Q_RATING = "quality"
META_LABEL_QUALITY = "label_quality"
META_PUSH_HASH = "push_hash"
META_CATEGORY = "generated_category"
METADATA_TERMS: tuple[str, ...] = (META_CATEGORY, "setting", "domain", "generator")


def dataset_name(base: str, version: int = SETTINGS_VERSION) -> str:
    """The versioned dataset name, e.g. `clariedge-review-v1`."""
    return f"{base}-v{version}"


def guidelines() -> str:
    """The annotator guidelines (annotation/guidelines.md, shipped as package data)."""
    return resources.files("clariedge.annotation").joinpath("guidelines.md").read_text(encoding="utf-8")


def settings_spec(min_submitted: int = 2) -> dict[str, Any]:
    """The dataset settings as plain data: what `build_settings` creates and `settings_mismatch` checks."""
    return {
        "fields": [
            {"name": FIELD_DIALOG, "type": "chat", "title": "Dialog (oldest first)", "required": True},
            {
                "name": FIELD_DOCUMENTS,
                "type": "text",
                "title": "Retrieved documents",
                "required": True,
                "use_markdown": True,
            },
            {"name": FIELD_FINAL_TURN, "type": "text", "title": "Final user turn (judge this)", "required": True},
        ],
        "questions": [
            {
                "name": Q_NEEDS,
                "type": "label_selection",
                "title": "Does the assistant need to ask a clarifying question before answering?",
                "labels": NEEDS_CLARIFICATION_LABELS,
                "required": True,
            },
            {
                "name": Q_CLARIFICATION,
                "type": "text",
                "title": "The clarifying question to ask (edit the suggestion; leave empty if none is needed)",
                "required": False,
            },
            {
                "name": Q_CATEGORY,
                "type": "label_selection",
                "title": "Category",
                "labels": CATEGORY_LABELS,
                "required": True,
            },
            {
                "name": Q_RATING,
                "type": "rating",
                "title": "Quality of the suggested clarification/decision (1 = wrong, 5 = exactly right)",
                "values": RATING_VALUES,
                "required": False,
            },
        ],
        "metadata": [
            *({"name": m, "type": "terms", "title": m.replace("_", " "), "visible": True} for m in METADATA_TERMS),
            {"name": META_LABEL_QUALITY, "type": "float", "title": "label quality (cleanlab)", "visible": True},
            {"name": META_PUSH_HASH, "type": "terms", "title": "push hash", "visible": False},
        ],
        "distribution": {"strategy": "overlap", "min_submitted": min_submitted},
    }


def build_settings(spec: dict[str, Any], client: rg.Argilla) -> rg.Settings:
    """`rg.Settings` for `spec`. The SDK builds settings only with a live client: `client` must exist
    (constructing `rg.Argilla` makes it the SDK's default, which the settings objects pick up)."""
    import argilla as rg

    del client  # the SDK's settings classes take the default client

    fields: list[Any] = []
    for f in spec["fields"]:
        if f["type"] == "chat":
            fields.append(rg.ChatField(name=f["name"], title=f["title"], required=f["required"]))
        else:
            fields.append(
                rg.TextField(
                    name=f["name"],
                    title=f["title"],
                    required=f["required"],
                    use_markdown=f.get("use_markdown", False),
                )
            )
    questions: list[Any] = []
    for q in spec["questions"]:
        common = {"name": q["name"], "title": q["title"], "required": q["required"]}
        if q["type"] == "label_selection":
            questions.append(rg.LabelQuestion(labels=q["labels"], **common))
        elif q["type"] == "text":
            questions.append(rg.TextQuestion(use_markdown=False, **common))
        else:
            questions.append(rg.RatingQuestion(values=q["values"], **common))
    metadata: list[Any] = []
    for m in spec["metadata"]:
        cls = rg.TermsMetadataProperty if m["type"] == "terms" else rg.FloatMetadataProperty
        metadata.append(cls(name=m["name"], title=m["title"], visible_for_annotators=m["visible"]))
    return rg.Settings(
        fields=fields,
        questions=questions,
        metadata=metadata,
        guidelines=guidelines(),
        allow_extra_metadata=False,
        distribution=rg.TaskDistribution(min_submitted=spec["distribution"]["min_submitted"]),
    )


def settings_mismatch(spec: dict[str, Any], live: dict[str, Any]) -> list[str]:
    """Differences between `spec` and a live dataset's settings (same shape, as read from the REST API).

    `live` holds `fields` / `questions` / `metadata` lists of {name, type, ...} and `distribution`.
    An empty list means the live dataset can take this code's records and responses.
    """
    problems: list[str] = []
    for part in ("fields", "questions", "metadata"):
        want = {x["name"]: x for x in spec[part]}
        have = {x["name"]: x for x in live.get(part, [])}
        for name in sorted(want.keys() - have.keys()):
            problems.append(f"{part[:-1] if part != 'metadata' else 'metadata property'} {name!r} is missing")
        for name in sorted(have.keys() - want.keys()):
            problems.append(f"{part[:-1] if part != 'metadata' else 'metadata property'} {name!r} is not in the code")
        for name in sorted(want.keys() & have.keys()):
            if want[name]["type"] != have[name]["type"]:
                problems.append(f"{name!r} has type {have[name]['type']!r}, the code wants {want[name]['type']!r}")
            elif "labels" in want[name] and sorted(want[name]["labels"]) != sorted(have[name].get("labels") or []):
                problems.append(f"question {name!r} has labels {sorted(have[name].get('labels') or [])}")
            elif "values" in want[name] and sorted(want[name]["values"]) != sorted(have[name].get("values") or []):
                problems.append(f"question {name!r} has values {sorted(have[name].get('values') or [])}")
    want_min = spec["distribution"]["min_submitted"]
    have_min = (live.get("distribution") or {}).get("min_submitted")
    if have_min is not None and have_min != want_min:
        problems.append(f"distribution min_submitted is {have_min}, params want {want_min}")
    return problems
