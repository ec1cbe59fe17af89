"""Review stage: human review of examples in Argilla (push records, pull annotators' responses).

Inputs:  data/filtered.parquet (Example rows)
Outputs: data/reviewed.parquet (Example rows with review_status and annotations, discarded ones removed),
         data/review_discarded.parquet (records annotators discarded, kept apart),
         data/review_snapshot.jsonl (the pulled responses, one line per record: what the output is built from),
         metrics/review.json (counts)
Params (`review:` in params.yaml):
  mode          none (offline default: generator labels pass through, marked "unreviewed") |
                argilla (push to and pull from a live server; URL/key from ARGILLA_API_URL / ARGILLA_API_KEY) |
                import (an Argilla dataset exported with `Dataset.to_disk`, read from `import_path`)
  dataset       base name; the settings version is appended (`clariedge-review-v1`)
  workspace     Argilla workspace
  min_submitted submitted responses that complete a record (Argilla's overlap task distribution)
  batch_size    records per bulk request on push
  incomplete    what to do with records short of `min_submitted` submissions:
                keep_generator_label (keep, review_status "pending") | drop | wait (fail until annotated)
  consensus     majority (relabel complete records to the annotators' majority category) | generator
  import_path   folder written by `Dataset.to_disk`, for mode import
  recheck_suffix  name part of the dataset `send_back` fills (`clariedge-review-recheck-v1`)
  timeout_s     HTTP timeout
  owner, annotators  user names `clariedge review up` creates on the local server

Three layers: pure `example_to_record` / `snapshot_from_api` / `snapshot_from_export` / `transform`;
the server side (`push`, `pull_snapshot`, `send_back`, over the REST client `annotation/client.py`);
and `run` (files in, files out).
Record ids are example ids, so a re-push updates records and never duplicates them; each pushed record
carries a hash of its content, so a push that stopped half way resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from clariedge.annotation import settings as S
from clariedge.annotation.client import Connection, ReviewError, ensure_dataset, push_records
from clariedge.config import StageConfig
from clariedge.io import read_records, write_json, write_jsonl, write_records
from clariedge.schema import AMBIGUOUS, CATEGORIES, Annotation, Example, content_id

log = logging.getLogger(__name__)

Mode = Literal["none", "argilla", "import"]
IncompletePolicy = Literal["keep_generator_label", "drop", "wait"]


class ReviewConfig(StageConfig):
    mode: Mode
    dataset: str
    workspace: str
    min_submitted: int = Field(ge=1)
    batch_size: int = Field(ge=1, le=500)
    incomplete: IncompletePolicy
    consensus: Literal["majority", "generator"]
    import_path: str
    recheck_suffix: str
    timeout_s: float = Field(gt=0)
    owner: str
    annotators: list[str]
    # Not params: the CLI fills them from ARGILLA_API_URL / ARGILLA_API_KEY (never in params.yaml);
    # None = not connected to a server.
    api_url: str | None = None
    api_key: str | None = None

    @property
    def dataset_name(self) -> str:
        return S.dataset_name(self.dataset)

    @property
    def recheck_dataset_name(self) -> str:
        return S.dataset_name(f"{self.dataset}-{self.recheck_suffix}")


class ReviewIncomplete(ReviewError):
    """`incomplete: wait` and some records still need annotation."""


# ---------------------------------------------------------------------------------------------
# Pure core: examples -> Argilla records; Argilla responses -> snapshot -> reviewed examples
# ---------------------------------------------------------------------------------------------
_AGENT_BAD = re.compile(r"[^a-zA-Z0-9\-_:./\s]")
NO_DOCUMENTS = "_No documents: this is a pre-retrieval record. Judge the turn from the dialog alone._"


def render_documents(ex: Example) -> str:
    """The retrieved documents as readable markdown: a numbered title, the doc id, the text."""
    if not ex.documents:
        return NO_DOCUMENTS
    parts = []
    for i, doc in enumerate(ex.documents, 1):
        title = (doc.title or doc.doc_id).replace("\n", " ").strip()
        parts.append(f"### {i}. {title}\n\n`{doc.doc_id}`\n\n{doc.text.strip()}")
    return "\n\n---\n\n".join(parts)


def agent_name(ex: Example) -> str:
    """The suggestion agent: the generator (and its model), in the characters Argilla accepts."""
    p = ex.provenance
    name = f"{p.generator}:{p.model}" if p.model else p.generator
    return _AGENT_BAD.sub("_", name)[:200] or "generator"


def example_to_record(ex: Example, label_quality: float | None = None) -> dict[str, Any]:
    """One Argilla record (REST shape, questions by name) for an example; `external_id` is the example id."""
    fields = {
        S.FIELD_DIALOG: [{"role": m.role, "content": m.content} for m in ex.messages],
        S.FIELD_DOCUMENTS: render_documents(ex),
        S.FIELD_FINAL_TURN: ex.last_turn,
    }
    quality = ex.label_quality if label_quality is None else label_quality
    metadata: dict[str, Any] = {
        S.META_CATEGORY: ex.category,
        "setting": ex.setting,
        "domain": ex.domain,
        "generator": ex.provenance.generator,
    }
    if quality is not None:
        metadata[S.META_LABEL_QUALITY] = float(quality)
    agent, score = agent_name(ex), ex.provenance.score
    suggestions = [
        {"question": S.Q_NEEDS, "value": "yes" if ex.needs_clarification else "no", "agent": agent, "score": score},
        {"question": S.Q_CATEGORY, "value": ex.category, "agent": agent, "score": score},
    ]
    if ex.clarification:
        suggestions.append({"question": S.Q_CLARIFICATION, "value": ex.clarification, "agent": agent, "score": score})
    record = {"external_id": ex.id, "fields": fields, "metadata": metadata, "suggestions": suggestions}
    metadata[S.META_PUSH_HASH] = content_id(record, length=24)
    return record


def _response_values(values: dict[str, Any]) -> dict[str, Any]:
    """REST `{"q": {"value": v}}` -> `{"q": v}` (already-flat values pass through)."""
    out = {}
    for name, v in (values or {}).items():
        out[name] = v.get("value") if isinstance(v, dict) else v
    return dict(sorted(out.items()))


def snapshot_from_api(records: Iterable[dict[str, Any]], usernames: dict[str, str]) -> list[dict[str, Any]]:
    """Records as the REST API lists them (with responses) -> snapshot rows; drafts are left out."""
    rows = []
    for rec in records:
        responses, drafts = [], 0
        for resp in rec.get("responses") or []:
            if resp.get("status") == "draft":
                drafts += 1
                continue
            uid = str(resp.get("user_id"))
            responses.append(
                {
                    "annotator": usernames.get(uid, uid),
                    "status": resp.get("status"),
                    "values": _response_values(resp.get("values") or {}),
                }
            )
        rows.append(
            {
                "record_id": rec.get("external_id") or str(rec.get("id")),
                "record_status": rec.get("status", "pending"),
                "responses": sorted(responses, key=lambda r: r["annotator"]),
                "drafts": drafts,
            }
        )
    return sorted(rows, key=lambda r: r["record_id"])


def snapshot_from_export(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records from `Dataset.to_disk` (records.json) -> snapshot rows.

    The export groups responses by question and names annotators by user id only. Argilla 2.8's export
    also leaves out each response's status (read as "submitted": drafts cannot be told apart) and a
    discard with no answers has no question to sit under, so it is not in the export at all. For full
    fidelity import a snapshot written by `clariedge review pull --snapshot` instead.
    """
    rows = []
    for rec in records:
        by_user: dict[str, dict[str, Any]] = {}
        for question, answers in (rec.get("responses") or {}).items():
            for ans in answers or []:
                uid = str(ans.get("user_id"))
                status = ans.get("status") or "submitted"
                entry = by_user.setdefault(uid, {"annotator": uid, "status": status, "values": {}})
                entry["values"][question] = ans.get("value")
                if status == "draft":
                    entry["status"] = "draft"
        responses = [dict(r, values=dict(sorted(r["values"].items()))) for r in by_user.values()]
        kept = [r for r in responses if r["status"] in ("submitted", "discarded")]
        rows.append(
            {
                "record_id": str(rec.get("id")),
                "record_status": rec.get("status") or "pending",
                "responses": sorted(kept, key=lambda r: r["annotator"]),
                "drafts": len(responses) - len(kept),
            }
        )
    return sorted(rows, key=lambda r: r["record_id"])


def to_annotation(response: dict[str, Any]) -> Annotation:
    """One snapshot response -> `schema.Annotation`; answers outside the schema become None."""
    v = response.get("values") or {}
    needs = v.get(S.Q_NEEDS)
    category = v.get(S.Q_CATEGORY)
    rating = v.get(S.Q_RATING)
    text = v.get(S.Q_CLARIFICATION)
    return Annotation(
        annotator=str(response["annotator"]),
        status=response["status"],
        needs_clarification={"yes": True, "no": False}.get(needs) if isinstance(needs, str) else None,
        clarification=(text.strip() or None) if isinstance(text, str) else None,
        category=category if category in CATEGORIES else None,
        rating=rating if isinstance(rating, int) and 1 <= rating <= 5 else None,
    )


def long_format(examples: Sequence[Example], question: str = "category") -> list[dict[str, Any]]:
    """Submitted annotations as long-format rows {task, annotator, label}: what
    `cleanlab.multiannotator.convert_long_to_wide_dataset` takes."""
    rows = []
    for ex in examples:
        for a in ex.annotations:
            value = getattr(a, question)
            if a.status == "submitted" and value is not None:
                rows.append({"task": ex.id, "annotator": a.annotator, "label": value})
    return rows


def _majority(values: list[str], prefer: str | None) -> str:
    counts = Counter(values)
    top = max(counts.values())
    tied = sorted(v for v, n in counts.items() if n == top)
    return prefer if prefer in tied else tied[0]


def _relabel(ex: Example, submitted: list[Annotation]) -> tuple[Example, str]:
    """The annotators' majority label on `ex` (id kept); the outcome is a stats key."""
    votes = [a.category for a in submitted if a.category is not None]
    if not votes:
        return ex, "kept_no_category_answer"
    category = _majority(votes, ex.category)
    clarification: str | None = None
    if category in AMBIGUOUS:
        texts = [a.clarification for a in submitted if a.category == category and a.clarification]
        preferred = ex.clarification if ex.clarification in texts else None
        clarification = _majority(texts, preferred) if texts else ex.clarification
        if not clarification:
            return ex, "kept_missing_clarification"
    if category == ex.category and clarification == ex.clarification:
        return ex, "agreed"
    data = ex.model_dump()
    data.update(category=category, needs_clarification=category in AMBIGUOUS, clarification=clarification)
    try:
        return Example.model_validate(data), "relabelled"
    except ValueError:  # e.g. ambiguous_documents voted on a pre-retrieval record
        return ex, "kept_invalid_majority"


def transform(
    examples: Sequence[Example], snapshot: Sequence[dict[str, Any]], cfg: ReviewConfig
) -> tuple[list[Example], list[Example], dict[str, Any]]:
    """Apply pulled responses to examples -> (reviewed, discarded, stats).

    A record is discarded when it has a discard and no more submissions than discards; complete when it
    has `min_submitted` submissions (then relabelled to the majority if `consensus: majority`); the rest
    follow `incomplete`. Annotations are kept long-format, one per annotator, discards included.
    """
    by_id = {row["record_id"]: row for row in snapshot}
    reviewed: list[Example] = []
    discarded: list[Example] = []
    stats: Counter[str] = Counter()
    waiting: list[str] = []
    annotators: set[str] = set()
    for ex in sorted(examples, key=lambda e: e.id):
        row = by_id.get(ex.id)
        stats["drafts_ignored"] += row["drafts"] if row else 0
        annotations = sorted((to_annotation(r) for r in (row or {}).get("responses", [])), key=lambda a: a.annotator)
        annotators.update(a.annotator for a in annotations)
        submitted = [a for a in annotations if a.status == "submitted"]
        n_discarded = len(annotations) - len(submitted)
        if n_discarded and n_discarded >= len(submitted):
            discarded.append(ex.model_copy(update={"review_status": "discarded", "annotations": annotations}))
            stats["discarded"] += 1
            continue
        if len(submitted) >= cfg.min_submitted:
            out, outcome = _relabel(ex, submitted) if cfg.consensus == "majority" else (ex, "agreed")
            stats[outcome] += 1
            reviewed.append(out.model_copy(update={"review_status": "reviewed", "annotations": annotations}))
            stats["reviewed"] += 1
            continue
        if cfg.mode == "none" or row is None and cfg.mode == "import":
            reviewed.append(ex.model_copy(update={"review_status": "unreviewed", "annotations": annotations}))
            stats["unreviewed"] += 1
        elif cfg.incomplete == "drop":
            stats["dropped_incomplete"] += 1
        elif cfg.incomplete == "wait":
            waiting.append(ex.id)
        else:
            reviewed.append(ex.model_copy(update={"review_status": "pending", "annotations": annotations}))
            stats["pending"] += 1
    if waiting:
        raise ReviewIncomplete(
            f"{len(waiting)} of {len(examples)} records have fewer than {cfg.min_submitted} submitted responses "
            f"(review.incomplete is 'wait'): annotate them in the Argilla UI, then run again (first: {waiting[0]})"
        )
    out_stats: dict[str, Any] = {
        "mode": cfg.mode,
        "rows_in": len(examples),
        "rows_out": len(reviewed),
        "annotations": sum(len(e.annotations) for e in reviewed + discarded),
        "annotators": len(annotators),
        "snapshot_records": len(snapshot),
        "snapshot_unmatched": len(set(by_id) - {e.id for e in examples}),
    }
    for key in ("reviewed", "pending", "unreviewed", "discarded", "dropped_incomplete", "drafts_ignored"):
        out_stats[key] = stats.get(key, 0)
    for key in ("agreed", "relabelled", "kept_no_category_answer", "kept_missing_clarification"):
        out_stats[f"consensus_{key}"] = stats.get(key, 0)
    out_stats["consensus_kept_invalid_majority"] = stats.get("kept_invalid_majority", 0)
    return reviewed, discarded, dict(sorted(out_stats.items()))


# ---------------------------------------------------------------------------------------------
# Server side (over `clariedge.annotation.client`)
# ---------------------------------------------------------------------------------------------
def push(
    examples: Sequence[Example],
    cfg: ReviewConfig,
    *,
    dataset: str | None = None,
    label_quality: dict[str, float] | None = None,
    force: bool = False,
    progress: bool = True,
    on_batch: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Push examples as records to the dataset (default: `cfg.dataset_name`), creating it if needed."""
    conn = Connection.open(cfg.api_url, cfg.api_key, cfg.timeout_s)
    try:
        ds = ensure_dataset(conn, dataset or cfg.dataset_name, cfg)
        lq = label_quality or {}
        records = [example_to_record(ex, lq.get(ex.id)) for ex in examples]
        stats = push_records(conn, ds, records, cfg, force=force, progress=progress, on_batch=on_batch)
        stats["dataset"] = ds["name"]
        return stats
    finally:
        conn.close()


def pull_snapshot(cfg: ReviewConfig, *, dataset: str | None = None) -> list[dict[str, Any]]:
    """Every record of the live dataset with its submitted/discarded responses (drafts counted, not kept)."""
    conn = Connection.open(cfg.api_url, cfg.api_key, cfg.timeout_s)
    try:
        ds = ensure_dataset(conn, dataset or cfg.dataset_name, cfg, create=False)
        names = conn.usernames()
        return snapshot_from_api(conn.list_records(ds["id"], include=("responses",)), names)
    finally:
        conn.close()


def read_export(path: str | Path) -> list[dict[str, Any]]:
    """Snapshot rows from a folder written by `Dataset.to_disk` (records.json beside .argilla/), or from a
    snapshot JSONL written by an earlier pull (`review pull --snapshot`: keeps statuses and discards)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".jsonl":
        rows = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                row = json.loads(line) if line.strip() else None
            except json.JSONDecodeError as err:
                raise ReviewError(f"{path}:{i}: not valid JSON ({err})") from None
            if row is not None:
                if not isinstance(row, dict) or "record_id" not in row:
                    raise ReviewError(f"{path}:{i}: not a snapshot row (needs record_id and responses)")
                rows.append({"responses": [], "drafts": 0, "record_status": "pending", **row})
        return sorted(rows, key=lambda r: r["record_id"])
    records_file = path / "records.json"
    if not records_file.exists():
        raise ReviewError(
            f"{records_file}: no Argilla export here (review.import_path); write one with "
            "`clariedge review export` or the SDK's `dataset.to_disk(path)`"
        )
    try:
        records = json.loads(records_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ReviewError(f"{records_file}: not valid JSON ({err})") from None
    if not isinstance(records, list):
        raise ReviewError(f"{records_file}: expected a JSON list of records")
    return snapshot_from_export(records)


def export_dataset(cfg: ReviewConfig, path: str | Path, *, dataset: str | None = None) -> Path:
    """Write the live dataset to `path` with the SDK's `Dataset.to_disk` (what mode `import` reads)."""
    conn = Connection.open(cfg.api_url, cfg.api_key, cfg.timeout_s)
    try:
        name = dataset or cfg.dataset_name
        ensure_dataset(conn, name, cfg, create=False)
        client = conn.sdk()
    finally:
        conn.close()
    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise ReviewError(f"{path}: the export folder must be empty or absent")
    path.mkdir(parents=True, exist_ok=True)
    client.datasets(name, workspace=cfg.workspace).to_disk(str(path))
    return path


def send_back_order(
    examples: Sequence[Example], label_quality: dict[str, float], first: Iterable[str] = ()
) -> tuple[list[Example], dict[str, float]]:
    """The recheck queue: the examples whose ids are in `first` (e.g. the rows of a category cleaning warns
    about), then the rest; each part in ascending label quality (ties by id). Returns (ordered, scores)."""
    head = set(first)

    def score(ex: Example) -> float:
        value = label_quality.get(ex.id, ex.label_quality)
        return 1.0 if value is None else float(value)

    ordered = sorted(examples, key=lambda ex: (ex.id not in head, score(ex), ex.id))
    return ordered, {ex.id: score(ex) for ex in ordered}


def send_back(
    examples: Sequence[Example], label_quality: dict[str, float], cfg: ReviewConfig, *, first: Iterable[str] = ()
) -> dict[str, Any]:
    """Send records flagged by cleaning back for a second look, worst first.

    `examples`: the flagged examples; `label_quality`: example id -> score in [0, 1] (low = suspect; ids
    missing here fall back to `Example.label_quality`); `cfg`: the review config, with `api_url`/`api_key`
    filled (the CLI does it from ARGILLA_API_URL / ARGILLA_API_KEY); `first`: ids that go ahead of the
    rest (clean passes the rows of a category it warns about). The records go to the recheck dataset
    (`clariedge-review-recheck-v1`, same settings) in that order (`send_back_order`: `first`, then the rest,
    each in ascending label quality), with the score as `label_quality` metadata, so annotators meet the
    worst first and can sort or filter by it. Records already on the server with unchanged content keep
    their place. Idempotent (ids = example ids). With `review.mode` other than argilla nothing is sent
    and the stats say so. Returns push stats: records, created, updated, skipped_unchanged, refused, dataset.
    """
    if cfg.mode != "argilla":
        return {"records": len(examples), "sent": 0, "skipped_reason": f"review.mode is {cfg.mode!r}"}
    ordered, scores = send_back_order(examples, label_quality, first)
    return push(ordered, cfg, dataset=cfg.recheck_dataset_name, label_quality=scores, progress=False)


# ---------------------------------------------------------------------------------------------
# I/O: the stage
# ---------------------------------------------------------------------------------------------
def run(
    in_path: str | Path,
    out_path: str | Path,
    cfg: ReviewConfig,
    *,
    snapshot_path: str | Path | None = None,
    discarded_path: str | Path | None = None,
    stats_path: str | Path | None = None,
    push_first: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """The review stage: (push, then) pull or import, write the snapshot, apply it, write the outputs.

    Mode none writes an empty snapshot and passes every example through as "unreviewed".
    """
    examples = read_records(in_path, Example)
    push_stats: dict[str, Any] = {}
    if cfg.mode == "argilla":
        if push_first:
            push_stats = push(examples, cfg, progress=progress)
        snapshot = pull_snapshot(cfg)
    elif cfg.mode == "import":
        snapshot = read_export(cfg.import_path)
    else:
        snapshot = []
    if snapshot_path is not None:
        write_jsonl(snapshot_path, snapshot)
    reviewed, discarded, stats = transform(examples, snapshot, cfg)
    if push_stats:
        stats["push_sent"] = push_stats["sent"]
        stats["push_skipped_unchanged"] = push_stats["skipped_unchanged"]
        stats["push_refused"] = len(push_stats["refused"])
    write_records(out_path, reviewed)
    if discarded_path is not None:
        write_records(discarded_path, discarded)
    if stats_path is not None:
        write_json(stats_path, stats)
    log.info("review (%s): %s", cfg.mode, json.dumps(stats, sort_keys=True))
    return stats
