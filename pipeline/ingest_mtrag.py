"""`ingest`'s readers of the MTRAG formats: the generation-task JSONL (`mtrag_task`), the evaluation
bundle JSON (`mtrag_bundle`: `documents` + `tasks` whose `contexts` hold ids) and the BEIR files
(`<domain>_questions.jsonl`, `_lastturn.jsonl`, `_rewrite.jsonl`, paired by `_id`). Each yields
validated seed turns and reports every bad row as a reject with file, line and reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clariedge.ingest_jsonl import RowError, first_seen, iter_jsonl, require, validated_seed
from clariedge.io import Rejects
from clariedge.schema import SeedTurn, Source

BEIR_KINDS = ("questions", "lastturn", "rewrite")
_TASK_ID = re.compile(r"^(?P<conv>.+?)(?:<::>|::)(?P<turn>\d+)$")
_COLLECTION = re.compile(r"mt-rag-(?P<domain>[a-z]+)-")
_DOMAIN_ALIASES = {"ibmcloud": "cloud"}
_USER_LINE = re.compile(r"^\|user\|:\s?", re.MULTILINE)
_SPEAKERS = {"user": "user", "agent": "assistant", "assistant": "assistant", "system": None}


def _parse_task_id(task_id: str) -> tuple[str, int]:
    m = _TASK_ID.match(task_id)
    if not m:
        raise RowError(f"task id {task_id!r} is not `<conversation_id>::<turn>` or `<conversation_id><::><turn>`")
    return m["conv"], int(m["turn"])


def _messages_from_mtrag(items: list[Any]) -> list[dict[str, str]]:
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise RowError(f"input.{i}: expected an object with speaker and text")
        speaker = item.get("speaker", item.get("role"))
        if speaker not in _SPEAKERS:
            raise RowError(f"input.{i}.speaker: expected user or agent, got {speaker!r}")
        text = item.get("text", item.get("content"))
        if not isinstance(text, str):
            raise RowError(f"input.{i}.text: expected a string, got {type(text).__name__}")
        if _SPEAKERS[speaker]:
            out.append({"role": _SPEAKERS[speaker], "content": text})
    return out


def _document(ctx: dict[str, Any], docs_by_id: dict[str, dict[str, Any]] | None, where: str) -> dict[str, str]:
    doc_id = ctx.get("document_id", ctx.get("doc_id"))
    if not isinstance(doc_id, str) or not doc_id:
        raise RowError(f"contexts: a context has no document_id ({where})")
    text, title = ctx.get("text"), ctx.get("title")
    if text is None and docs_by_id is not None:
        doc = docs_by_id.get(doc_id)
        if doc is None:
            raise RowError(f"contexts: document {doc_id!r} is not in the bundle's documents")
        text, title = doc.get("text"), title or doc.get("title")
    if not isinstance(text, str) or not text.strip():
        raise RowError(f"contexts: document {doc_id!r} has no text")
    return {"doc_id": doc_id, "title": title or _heading(text), "text": text.strip()}


def _heading(text: str, max_len: int = 100) -> str:
    """MTRAG passages without a title often start with their heading line: use it when it is short."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) >= 2 and len(lines[0]) <= max_len and not lines[0].endswith((".", "?", "!")):
        return lines[0]
    return ""


def _domain_from(obj: dict[str, Any], fallback: str) -> str:
    m = _COLLECTION.search(str(obj.get("Collection", "")))
    domain = m["domain"] if m else fallback
    return _DOMAIN_ALIASES.get(domain, domain)


def _task_to_seed(
    obj: dict[str, Any],
    where: str,
    fmt: str,
    path: Path,
    line: int | None,
    docs_by_id: dict[str, dict[str, Any]] | None,
    rejects: Rejects,
) -> SeedTurn | None:
    try:
        task_id = require(obj, "task_id", str)
        conv, turn = _parse_task_id(task_id)
        conv = obj.get("conversation_id") or conv
        messages = _messages_from_mtrag(require(obj, "input", list))
        contexts = obj.get("contexts") or []
        if not isinstance(contexts, list):
            raise RowError(f"contexts: expected a list, got {type(contexts).__name__}")
        documents = [_document(c, docs_by_id, where) for c in contexts if isinstance(c, dict)]
    except RowError as err:
        rejects.add("invalid_row", where, str(err), obj)
        return None
    last = messages[-1]["content"] if messages else ""
    return validated_seed(
        rejects,
        where,
        obj,
        conversation_id=conv,
        turn=turn,
        domain=_domain_from(obj, path.resolve().parent.name or "unknown"),
        messages=messages,
        last_turn=last,
        rewrite=None,
        documents=_dedup_docs(documents),
        source=Source(format=fmt, path=str(path), line=line, task_id=task_id),
    )


def _dedup_docs(documents: list[dict[str, str]]) -> list[dict[str, str]]:
    first: dict[str, dict[str, str]] = {}
    for d in documents:
        first.setdefault(d["doc_id"], d)
    return list(first.values())


def read_mtrag_tasks(path: Path, rejects: Rejects) -> Iterator[SeedTurn]:
    seen: dict[str, int] = {}
    for line, obj in iter_jsonl(path, rejects):
        if not first_seen(seen, obj.get("task_id"), line, rejects, f"{path}:{line}", "task_id", obj):
            continue
        seed = _task_to_seed(obj, f"{path}:{line}", "mtrag_task", path, line, None, rejects)
        if seed:
            yield seed


def read_mtrag_bundle(path: Path, rejects: Rejects, data: dict[str, Any]) -> Iterator[SeedTurn]:
    docs_by_id = {}
    for i, d in enumerate(data.get("documents") or []):
        if isinstance(d, dict) and isinstance(d.get("document_id"), str):
            docs_by_id[d["document_id"]] = d
        else:
            rejects.add("invalid_row", f"{path}:documents[{i}]", "document_id: field required", d)
    for i, task in enumerate(data.get("tasks") or []):
        if not isinstance(task, dict):
            rejects.add("invalid_row", f"{path}:tasks[{i}]", "expected a task object", task)
            continue
        seed = _task_to_seed(task, f"{path}:tasks[{i}]", "mtrag_bundle", path, None, docs_by_id, rejects)
        if seed:
            yield seed


def _beir_user_turns(text: str) -> list[str]:
    parts = [p.strip() for p in _USER_LINE.split(text)]
    return [p for p in parts if p]


def read_beir(files: dict[str, Path], domain: str, rejects: Rejects) -> Iterator[SeedTurn]:
    """Pair `lastturn` with `rewrite` by `_id`; `questions` (when present) gives the user history."""
    tables: dict[str, dict[str, tuple[int, str]]] = {}
    for kind, path in files.items():
        table: dict[str, tuple[int, str]] = {}
        for line, obj in iter_jsonl(path, rejects):
            where = f"{path}:{line}"
            try:
                _id, text = require(obj, "_id", str), require(obj, "text", str)
            except RowError as err:
                rejects.add("invalid_row", where, str(err), obj)
                continue
            if _id in table:
                rejects.add("duplicate_id", where, f"_id {_id!r} already seen at line {table[_id][0]}", obj)
                continue
            table[_id] = (line, text)
        tables[kind] = table
    if "lastturn" not in tables and "questions" not in tables:
        path = files["rewrite"]
        for _id, (line, _text) in sorted(tables["rewrite"].items(), key=lambda kv: kv[1][0]):
            rejects.add(
                "unpaired",
                f"{path}:{line}",
                f"_id {_id!r}: a rewrite without the user's turn; add {path.name.replace('_rewrite', '_lastturn')} "
                f"or {path.name.replace('_rewrite', '_questions')} beside it",
                {"_id": _id},
            )
        return
    anchor = "lastturn" if "lastturn" in tables else "questions"
    for _id in sorted(tables[anchor]):
        line, text = tables[anchor][_id]
        path = files[anchor]
        where = f"{path}:{line}"
        try:
            conv, turn = _parse_task_id(_id)
        except RowError as err:
            rejects.add("invalid_row", where, f"_id: {err}", {"_id": _id})
            continue
        turns = _beir_user_turns(text)
        if not turns:
            rejects.add("invalid_row", where, "text: no `|user|:` turn in it", {"_id": _id, "text": text})
            continue
        last = turns[-1]
        history: list[str] = []
        if "questions" in tables and _id in tables["questions"]:
            history = _beir_user_turns(tables["questions"][_id][1])[:-1]
        rewrite = None
        if "rewrite" in tables:
            if _id in tables["rewrite"]:
                rewrite = (_beir_user_turns(tables["rewrite"][_id][1]) or [None])[-1]
            else:
                rejects.add("unpaired", where, f"_id {_id!r} has no line in {files.get('rewrite')}")
        messages = [{"role": "user", "content": t} for t in [*history, last]]
        # consecutive user turns are merged by nothing: BEIR history has no agent turns
        seed = validated_seed(
            rejects,
            where,
            {"_id": _id},
            conversation_id=conv,
            turn=turn,
            domain=domain,
            messages=messages,
            last_turn=last,
            rewrite=rewrite,
            documents=[],
            source=Source(format="beir", path=str(path), line=line, task_id=_id),
        )
        if seed:
            yield seed
