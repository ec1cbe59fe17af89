"""Reading `ingest`'s input files robustly, and the project's own JSONL format.

Every problem becomes a reject with file and line, never a traceback: an unreadable or empty file, a
line that is not UTF-8 or not a JSON object, a row that fails the `SeedTurn` schema, a repeated id.
The project's JSONL (`read_clariedge`) holds one conversation per line (`turns`) or one seed turn per
line (`messages`), see `data/sample/README.md`; a user turn's hand-written `open_variant` becomes a seed turn
of its own that carries the writer's `clarification`. The MTRAG and BEIR readers are `clariedge.ingest_mtrag`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from clariedge.io import Rejects, describe_validation_error
from clariedge.schema import OPEN_VARIANT, Document, Message, SeedTurn, Source


def read_text(path: Path, rejects: Rejects) -> str | None:
    """The file's text; None (reported) when it is unreadable, empty or has no UTF-8 line at all."""
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
    text = read_text(path, rejects)
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


def validated_seed(rejects: Rejects, where: str, raw: Any, **fields: Any) -> SeedTurn | None:
    try:
        return SeedTurn(**fields)
    except ValidationError as err:
        rejects.add("invalid_row", where, describe_validation_error(err), raw)
        return None


class RowError(ValueError):
    """A row's field is missing or of the wrong type: the row becomes an `invalid_row` reject."""


def require(obj: dict[str, Any], key: str, kind: type) -> Any:
    if key not in obj:
        raise RowError(f"{key}: field required")
    value = obj[key]
    if not isinstance(value, kind):
        raise RowError(f"{key}: expected {kind.__name__}, got {type(value).__name__} ({str(value)[:40]!r})")
    return value


def first_seen(seen: dict[str, int], key: Any, line: int, rejects: Rejects, where: str, what: str, obj: Any) -> bool:
    """True the first time `key` appears in a file; a repeat is a `duplicate_id` reject (the first row stays)."""
    if not isinstance(key, str):
        return True  # no usable id: the row's own validation reports it
    if key in seen:
        rejects.add("duplicate_id", where, f"{what} {key!r} already seen at line {seen[key]} (the first is kept)", obj)
        return False
    seen[key] = line
    return True


def read_clariedge(path: Path, rejects: Rejects) -> Iterator[SeedTurn]:
    """The project's JSONL: a conversation per line (`turns`), or a seed turn per line (`messages`)."""
    seen: dict[str, int] = {}
    for line, obj in iter_jsonl(path, rejects):
        where = f"{path}:{line}"
        source = Source(format="clariedge", path=str(path), line=line)
        if "turns" in obj:
            if not first_seen(seen, obj.get("conversation_id"), line, rejects, where, "conversation_id", obj):
                continue
            yield from _conversation_seeds(obj, where, source, rejects)
        elif "messages" in obj:
            fields = {k: v for k, v in obj.items() if k != "source"}
            fields.setdefault("last_turn", _last_content(obj.get("messages")))
            seed = validated_seed(rejects, where, obj, source=source, **fields)
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
        conv = require(obj, "conversation_id", str)
        domain = require(obj, "domain", str)
        turns = require(obj, "turns", list)
        if not turns:
            raise RowError("turns: the conversation has no turns")
    except RowError as err:
        rejects.add("invalid_row", where, str(err), obj)
        return
    history: list[Message] = []
    n_user = 0
    for i, t in enumerate(turns):
        try:
            if not isinstance(t, dict):
                raise RowError(f"turns.{i}: expected an object")
            msg = Message(role=t.get("role"), content=t.get("content"))
            docs = [_turn_document(j, d) for j, d in enumerate(t.get("documents") or [])]
        except ValidationError as err:
            rejects.add("invalid_row", f"{where} turns.{i}", describe_validation_error(err), t)
            return  # a broken turn breaks the dialog after it; the turns before it are kept
        except RowError as err:
            rejects.add("invalid_row", f"{where} turns.{i}", str(err), t)
            return
        history.append(msg)
        if msg.role != "user":
            continue
        n_user += 1
        seed = validated_seed(
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
            if t.get("open_variant") is not None:
                variant = _open_variant(seed, t["open_variant"], f"{where} turns.{i}.open_variant", rejects)
                if variant:
                    yield variant


def _open_variant(seed: SeedTurn, raw: Any, where: str, rejects: Rejects) -> SeedTurn | None:
    """A sample's hand-written `open_variant` of a user turn: `{"content", "clarification", "documents"?}`, what
    the user might have asked at this point instead, which the dialog before it leaves open (the writer's
    `clarification` is the question to ask). A seed turn of its own (`::open`), with the turn's documents unless
    it names its own."""
    try:
        if not isinstance(raw, dict):
            raise RowError("expected an object with content, clarification and optional documents")
        content = require(raw, "content", str)
        clarification = require(raw, "clarification", str)
        docs = raw.get("documents")
        documents = seed.documents if docs is None else [_turn_document(j, d) for j, d in enumerate(docs)]
    except RowError as err:
        rejects.add("invalid_row", where, str(err), raw)
        return None
    return validated_seed(
        rejects,
        where,
        raw,
        **{
            **seed.model_dump(include={"conversation_id", "turn", "domain"}),
            "messages": [*seed.messages[:-1], Message(role="user", content=content)],
            "last_turn": content,
            "documents": documents,
            "clarification": clarification,
            "source": seed.source.model_copy(update={"task_id": f"{seed.id}{OPEN_VARIANT}"}),
        },
    )


def _turn_document(j: int, d: Any) -> Document:
    if not isinstance(d, dict):
        raise RowError(f"documents.{j}: expected an object with doc_id, title, text")
    try:
        return Document(**d)
    except ValidationError as err:
        raise RowError(f"documents.{j}." + describe_validation_error(err)) from None
