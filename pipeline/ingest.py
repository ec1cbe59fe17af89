"""Stage `ingest`: read grounded dialogs in any supported format into one validated seed-turn table.

Inputs:  files or folders (searched recursively for *.json / *.jsonl) in these formats, detected
         from the file name and the keys of its rows:
         - `mtrag_task`:   MTRAG generation-task JSONL (`input` = [{speaker, text}], optional
                           `contexts` = [{document_id, title, text}]).
         - `mtrag_bundle`: the MTRAG evaluation JSON (`documents` + `tasks` whose `contexts` hold ids).
         - `beir`:         `<domain>_questions.jsonl`, `<domain>_lastturn.jsonl`, `<domain>_rewrite.jsonl`
                           (`_id` = `<conversation_id><::><turn>`, `text` = `|user|: ...` lines);
                           lastturn is paired with rewrite by `_id`, questions give the history.
         - `clariedge`:    the project's JSONL: one conversation per line (`turns`), or one seed turn
                           per line (`messages`), see `data/sample/README.md`.
Outputs: seed turns (parquet, `SeedTurn` rows sorted by conversation and turn), rejects JSONL (every
         bad row with file, line, field and reason), stats JSON.
Params:  `ingest.source` (paths | mtrag_url), `ingest.paths` (default: the bundled `data/sample`),
         `ingest.mtrag_url`, `ingest.strict`.
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from clariedge.config import StageConfig
from clariedge.io import Rejects, describe_validation_error, write_json, write_records
from clariedge.schema import Document, Message, SeedTurn, Source

log = logging.getLogger(__name__)

BEIR_KINDS = ("questions", "lastturn", "rewrite")
_TASK_ID = re.compile(r"^(?P<conv>.+?)(?:<::>|::)(?P<turn>\d+)$")
_COLLECTION = re.compile(r"mt-rag-(?P<domain>[a-z]+)-")
_DOMAIN_ALIASES = {"ibmcloud": "cloud"}
_USER_LINE = re.compile(r"^\|user\|:\s?", re.MULTILINE)
_SPEAKERS = {"user": "user", "agent": "assistant", "assistant": "assistant", "system": None}


class IngestConfig(StageConfig):
    source: Literal["paths", "mtrag_url"] = Field(description="read `paths`, or download `mtrag_url`'s files")
    paths: list[str] = Field(min_length=1, description="files or folders read when source is paths")
    mtrag_url: MtragUrlConfig | None
    strict: bool


class MtragUrlConfig(StageConfig):
    base_url: str
    cache_dir: str
    files: dict[str, str] = Field(description="relative path -> sha256")
    timeout_s: float = Field(gt=0)


IngestConfig.model_rebuild()


@dataclass
class IngestStats:
    files: int = 0
    rows_read: int = 0
    seed_turns: int = 0
    conversations: int = 0
    grounded_turns: int = 0
    with_rewrite: int = 0
    non_standalone: int = 0
    rejected: int = 0

    def as_dict(self, rejects: Rejects, by_format: dict[str, int], by_domain: dict[str, int]) -> dict[str, Any]:
        out = dict(self.__dict__)
        out.update(rejects.counts())
        out["by_format"] = dict(sorted(by_format.items()))
        out["by_domain"] = dict(sorted(by_domain.items()))
        return out


# ---------------------------------------------------------------------------------------------
# Reading files robustly: every problem becomes a reject with file and line, never a traceback
# ---------------------------------------------------------------------------------------------
def _read_text(path: Path, rejects: Rejects) -> str | None:
    try:
        raw = path.read_bytes()
    except OSError as err:
        rejects.add("unreadable_file", str(path), str(err))
        return None
    if not raw.strip():
        rejects.add("empty_file", str(path), "the file is empty")
        return None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    # decode line by line: a line with a bad byte is a reject (blanked, so line numbers stay right);
    # every other line is kept
    lines: list[str] = []
    for lineno, chunk in enumerate(raw.split(b"\n"), start=1):
        try:
            lines.append(chunk.decode("utf-8-sig" if lineno == 1 else "utf-8"))
        except UnicodeDecodeError as err:
            rejects.add(
                "not_utf8",
                f"{path}:{lineno}",
                f"byte 0x{chunk[err.start]:02x} at column {err.start + 1} is not UTF-8; re-encode the file as UTF-8 "
                "(the other lines are kept)",
            )
            lines.append("")
    text = "\n".join(lines)
    return text if text.strip() else None


def iter_jsonl(path: Path, rejects: Rejects) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each valid JSON object line; report the others."""
    text = _read_text(path, rejects)
    if text is None:
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            rejects.add("malformed_json", f"{path}:{lineno}", f"{err.msg} (column {err.colno})", line)
            continue
        if not isinstance(obj, dict):
            rejects.add("malformed_json", f"{path}:{lineno}", f"expected a JSON object, got {type(obj).__name__}", line)
            continue
        yield lineno, obj


def _validate(rejects: Rejects, where: str, raw: Any, **fields: Any) -> SeedTurn | None:
    try:
        return SeedTurn(**fields)
    except ValidationError as err:
        rejects.add("invalid_row", where, describe_validation_error(err), raw)
        return None


def _require(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise _RowError(f"{key}: field required")
    value = obj[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _RowError(f"{key}: expected {names}, got {type(value).__name__} ({str(value)[:40]!r})")
    return value


class _RowError(ValueError):
    pass


def _parse_task_id(task_id: str) -> tuple[str, int]:
    m = _TASK_ID.match(task_id)
    if not m:
        raise _RowError(f"task id {task_id!r} is not `<conversation_id>::<turn>` or `<conversation_id><::><turn>`")
    return m["conv"], int(m["turn"])


def _messages_from_mtrag(items: list[Any]) -> list[dict[str, str]]:
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _RowError(f"input.{i}: expected an object with speaker and text")
        speaker = item.get("speaker", item.get("role"))
        if speaker not in _SPEAKERS:
            raise _RowError(f"input.{i}.speaker: expected user or agent, got {speaker!r}")
        text = item.get("text", item.get("content"))
        if not isinstance(text, str):
            raise _RowError(f"input.{i}.text: expected a string, got {type(text).__name__}")
        if _SPEAKERS[speaker]:
            out.append({"role": _SPEAKERS[speaker], "content": text})
    return out


def _document(ctx: dict[str, Any], docs_by_id: dict[str, dict[str, Any]] | None, where: str) -> dict[str, str]:
    doc_id = ctx.get("document_id", ctx.get("doc_id"))
    if not isinstance(doc_id, str) or not doc_id:
        raise _RowError(f"contexts: a context has no document_id ({where})")
    text, title = ctx.get("text"), ctx.get("title")
    if text is None and docs_by_id is not None:
        doc = docs_by_id.get(doc_id)
        if doc is None:
            raise _RowError(f"contexts: document {doc_id!r} is not in the bundle's documents")
        text, title = doc.get("text"), title or doc.get("title")
    if not isinstance(text, str) or not text.strip():
        raise _RowError(f"contexts: document {doc_id!r} has no text")
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


# ---------------------------------------------------------------------------------------------
# Readers: one per format, each yields validated seed turns and reports bad rows
# ---------------------------------------------------------------------------------------------
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
        task_id = _require(obj, "task_id", str, where)
        conv, turn = _parse_task_id(task_id)
        conv = obj.get("conversation_id") or conv
        messages = _messages_from_mtrag(_require(obj, "input", list, where))
        contexts = obj.get("contexts") or []
        if not isinstance(contexts, list):
            raise _RowError(f"contexts: expected a list, got {type(contexts).__name__}")
        documents = [_document(c, docs_by_id, where) for c in contexts if isinstance(c, dict)]
    except _RowError as err:
        rejects.add("invalid_row", where, str(err), obj)
        return None
    last = messages[-1]["content"] if messages else ""
    return _validate(
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
    seen: set[str] = set()
    out = []
    for d in documents:
        if d["doc_id"] not in seen:
            seen.add(d["doc_id"])
            out.append(d)
    return out


def _first_seen(seen: dict[str, int], key: Any, line: int, rejects: Rejects, where: str, what: str, obj: Any) -> bool:
    """True the first time `key` appears in a file; a repeat is a `duplicate_id` reject (the first row stays)."""
    if not isinstance(key, str):
        return True  # no usable id: the row's own validation reports it
    if key in seen:
        rejects.add("duplicate_id", where, f"{what} {key!r} already seen at line {seen[key]} (the first is kept)", obj)
        return False
    seen[key] = line
    return True


def read_mtrag_tasks(path: Path, rejects: Rejects) -> Iterator[SeedTurn]:
    seen: dict[str, int] = {}
    for line, obj in iter_jsonl(path, rejects):
        if not _first_seen(seen, obj.get("task_id"), line, rejects, f"{path}:{line}", "task_id", obj):
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
                _id, text = _require(obj, "_id", str, where), _require(obj, "text", str, where)
            except _RowError as err:
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
        except _RowError as err:
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
        seed = _validate(
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


def read_clariedge(path: Path, rejects: Rejects) -> Iterator[SeedTurn]:
    """The project's JSONL: a conversation per line (`turns`), or a seed turn per line (`messages`)."""
    seen: dict[str, int] = {}
    for line, obj in iter_jsonl(path, rejects):
        where = f"{path}:{line}"
        source = Source(format="clariedge", path=str(path), line=line)
        if "turns" in obj:
            if not _first_seen(seen, obj.get("conversation_id"), line, rejects, where, "conversation_id", obj):
                continue
            yield from _conversation_seeds(obj, where, source, rejects)
        elif "messages" in obj:
            fields = {k: v for k, v in obj.items() if k != "source"}
            fields.setdefault("last_turn", _last_content(obj.get("messages")))
            seed = _validate(rejects, where, obj, source=source, **fields)
            if seed:
                yield seed
        else:
            rejects.add("invalid_row", where, "expected `turns` (a conversation) or `messages` (a seed turn)", obj)


def _last_content(messages: Any) -> Any:
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return messages[-1].get("content")
    return None


def _conversation_seeds(obj: dict[str, Any], where: str, source: Source, rejects: Rejects) -> Iterator[SeedTurn]:
    try:
        conv = _require(obj, "conversation_id", str, where)
        domain = _require(obj, "domain", str, where)
        turns = _require(obj, "turns", list, where)
        if not turns:
            raise _RowError("turns: the conversation has no turns")
    except _RowError as err:
        rejects.add("invalid_row", where, str(err), obj)
        return
    history: list[Message] = []
    n_user = 0
    for i, t in enumerate(turns):
        try:
            if not isinstance(t, dict):
                raise _RowError(f"turns.{i}: expected an object")
            msg = Message(role=t.get("role"), content=t.get("content"))
            docs = [_turn_document(j, d) for j, d in enumerate(t.get("documents") or [])]
        except ValidationError as err:
            rejects.add("invalid_row", f"{where} turns.{i}", describe_validation_error(err), t)
            return  # a broken turn breaks the dialog after it; the turns before it are kept
        except _RowError as err:
            rejects.add("invalid_row", f"{where} turns.{i}", str(err), t)
            return
        history.append(msg)
        if msg.role != "user":
            continue
        n_user += 1
        seed = _validate(
            rejects,
            f"{where} turns.{i}",
            t,
            conversation_id=conv,
            turn=n_user,
            domain=domain,
            messages=list(history),
            last_turn=msg.content,
            rewrite=t.get("rewrite"),
            documents=docs,
            source=source.model_copy(update={"task_id": f"{conv}::{n_user}"}),
        )
        if seed:
            yield seed


def _turn_document(j: int, d: Any) -> Document:
    if not isinstance(d, dict):
        raise _RowError(f"documents.{j}: expected an object with doc_id, title, text")
    try:
        return Document(**d)
    except ValidationError as err:
        raise _RowError(f"documents.{j}." + describe_validation_error(err)) from None


# ---------------------------------------------------------------------------------------------
# Detection, merging and the stage itself
# ---------------------------------------------------------------------------------------------
def _beir_kind(path: Path) -> tuple[str, str] | None:
    for kind in BEIR_KINDS:
        if path.name.endswith(f"_{kind}.jsonl"):
            return path.name[: -len(f"_{kind}.jsonl")], kind
    return None


def expand_paths(paths: list[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.suffix in {".json", ".jsonl"} and q.is_file()))
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return sorted(set(out))


def read_seed_turns(paths: list[str | Path], rejects: Rejects) -> tuple[list[SeedTurn], dict[str, int]]:
    """Read every path (files or folders) and return the seed turns, one list, unmerged."""
    files = expand_paths(paths)
    seeds: list[SeedTurn] = []
    by_format: dict[str, int] = defaultdict(int)
    beir_groups: dict[tuple[Path, str], dict[str, Path]] = defaultdict(dict)
    for path in files:
        beir = _beir_kind(path)
        if beir:
            beir_groups[(path.parent, beir[0])][beir[1]] = path
            continue
        found = list(_read_one(path, rejects))
        if found:
            by_format[found[0].source.format] += len(found)
        seeds.extend(found)
    for (_, domain), group in sorted(beir_groups.items()):
        found = list(read_beir(group, domain, rejects))
        by_format["beir"] += len(found)
        seeds.extend(found)
    return seeds, dict(by_format)


def _read_one(path: Path, rejects: Rejects) -> Iterator[SeedTurn]:
    if path.suffix == ".json":
        text = _read_text(path, rejects)
        if text is None:
            return
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            rejects.add("malformed_json", f"{path}:{err.lineno}", f"{err.msg} (column {err.colno}; truncated?)")
            return
        if isinstance(data, dict) and "tasks" in data and "documents" in data:
            yield from read_mtrag_bundle(path, rejects, data)
        else:
            rejects.add("unknown_format", str(path), "a .json file must be the MTRAG bundle (`documents` + `tasks`)")
        return
    first = next(iter_jsonl(path, Rejects()), None)
    if first is None:
        list(iter_jsonl(path, rejects))  # report why nothing could be read
        return
    keys = first[1].keys()
    if "input" in keys:
        yield from read_mtrag_tasks(path, rejects)
    elif "turns" in keys or "messages" in keys:
        yield from read_clariedge(path, rejects)
    else:
        rejects.add("unknown_format", str(path), f"cannot tell the format from the keys {sorted(keys)[:8]}")


def merge_seed_turns(seeds: list[SeedTurn]) -> list[SeedTurn]:
    """One row per (conversation, turn): the richest dialog, the first documents, any rewrite."""
    groups: dict[tuple[str, int], list[SeedTurn]] = defaultdict(list)
    for s in seeds:
        groups[(s.conversation_id, s.turn)].append(s)
    merged = []
    for key in sorted(groups):
        group = groups[key]
        best = max(group, key=lambda s: (len(s.messages), bool(s.documents)))
        documents = best.documents or next((s.documents for s in group if s.documents), [])
        rewrite = best.rewrite or next((s.rewrite for s in group if s.rewrite), None)
        merged.append(best.model_copy(update={"documents": documents, "rewrite": rewrite}))
    return merged


def transform(paths: list[str | Path]) -> tuple[list[SeedTurn], Rejects, dict[str, Any]]:
    """Pure-ish core: read, validate and merge; returns seeds, rejects and stats."""
    rejects = Rejects()
    raw, by_format = read_seed_turns(paths, rejects)
    seeds = merge_seed_turns(raw)
    by_domain: dict[str, int] = defaultdict(int)
    for s in seeds:
        by_domain[s.domain] += 1
    stats = IngestStats(
        files=len(expand_paths(paths)),
        rows_read=len(raw),
        seed_turns=len(seeds),
        conversations=len({s.conversation_id for s in seeds}),
        grounded_turns=sum(1 for s in seeds if s.documents),
        with_rewrite=sum(1 for s in seeds if s.rewrite),
        non_standalone=sum(1 for s in seeds if not s.is_standalone),
        rejected=len(rejects),
    )
    return seeds, rejects, stats.as_dict(rejects, by_format, by_domain)


class IngestError(RuntimeError):
    pass


def run(
    paths: list[str | Path],
    out_path: str | Path,
    rejects_path: str | Path | None = None,
    stats_path: str | Path | None = None,
    strict: bool = False,
) -> dict[str, Any]:
    seeds, rejects, stats = transform(paths)
    for r in rejects.rows[:20]:
        log.warning("rejected %s: %s: %s", r["where"], r["reason"], r["detail"])
    if len(rejects) > 20:
        log.warning("... and %d more rejected rows (see %s)", len(rejects) - 20, rejects_path)
    if rejects_path:
        rejects.write(rejects_path)
    if strict and len(rejects):
        raise IngestError(f"{len(rejects)} bad rows (strict mode); nothing written to {out_path}")
    if not seeds:
        raise IngestError(f"no valid seed turns in {', '.join(map(str, paths))}; nothing written")
    write_records(out_path, seeds)
    if stats_path:
        write_json(stats_path, stats)
    log.info(
        "ingest: %d seed turns from %d conversations, %d rejected",
        stats["seed_turns"],
        stats["conversations"],
        stats["rejected"],
    )
    return stats
