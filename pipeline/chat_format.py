"""The model's chat format, in one place: the system instruction, how documents are rendered, the target.

`publish` uses it to write the chat export (`data/clariedge-chat/{split}.jsonl`); training and
inference import the same functions, so the prompt the model is trained on is the prompt it is
asked with. The contract matches the Granite "query_clarification" intrinsic: the chat ends in the
user turn, optional documents `[{doc_id, text}]` are given, and the answer is JSON
`{"clarification": "CLEAR"}` or `{"clarification": "<the question to ask the user>"}`.

Changing `SYSTEM_PROMPT` or `render_documents` changes every trained model's input: bump
`FORMAT_VERSION` when you do, so the card and the model metadata show which format was used.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

FORMAT_VERSION = "2"
CLEAR = "CLEAR"

# Short on purpose: every token of it is paid on every row, and a small model's context is tight (at
# 256 tokens, the 150-token instruction of format 1 left the dialog ~70 tokens and cut the middle of
# half the training rows). The fine-tuned model learns the task from the examples; the instruction
# names the task and the answer format for the prompted baselines and for bigger models.
SYSTEM_PROMPT = (
    "Decide whether the assistant must ask the user a clarifying question before answering the last "
    "message: ask only when, read with the conversation and any documents, it has several plausible "
    "readings or leaves out what it refers to. "
    'Reply with JSON: {"clarification": "CLEAR"} or {"clarification": "<a short question naming the readings>"}.'
)

_DOCS_HEADER = "Documents retrieved for the last message:"


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """Read a field from a pydantic model or a mapping (parquet rows and `datasets` rows are dicts)."""
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def render_documents(documents: Sequence[Any]) -> str:
    """The documents block appended to the system message; empty string when there are none."""
    if not documents:
        return ""
    parts = [_DOCS_HEADER]
    for i, doc in enumerate(documents, 1):
        doc_id = _get(doc, "doc_id", "") or f"doc{i}"
        title = (_get(doc, "title", "") or "").strip()
        text = (_get(doc, "text", "") or "").strip()
        head = f'<document id="{doc_id}"' + (f' title="{title}"' if title else "") + ">"
        parts.append(f"{head}\n{text}\n</document>")
    return "\n".join(parts)


def build_messages(messages: Sequence[Any], documents: Sequence[Any] | None = None) -> list[dict[str, str]]:
    """The chat given to the model: one system message (instruction + documents) and the dialog.

    `messages` are `Message` models or `{"role", "content"}` mappings ending in the user turn;
    `documents` are `Document` models or `{"doc_id", "title", "text"}` mappings (None or empty
    before retrieval).
    """
    if not messages:
        raise ValueError("build_messages: the dialog is empty; it must end with a user turn")
    system = SYSTEM_PROMPT
    docs = render_documents(documents or [])
    if docs:
        system = f"{system}\n\n{docs}"
    out = [{"role": "system", "content": system}]
    for m in messages:
        role, content = _get(m, "role"), _get(m, "content")
        if role not in ("user", "assistant"):
            raise ValueError(f"build_messages: message role must be user or assistant, got {role!r}")
        out.append({"role": role, "content": content})
    if out[-1]["role"] != "user":
        raise ValueError("build_messages: the dialog must end with a user turn")
    return out


def target_json(example: Any) -> str:
    """The model's answer for an example: `{"clarification": "CLEAR" | question}` as compact JSON."""
    needs = bool(_get(example, "needs_clarification"))
    question = _get(example, "clarification")
    if needs and not question:
        raise ValueError("target_json: an example that needs clarification must carry its question")
    return json.dumps({"clarification": question if needs else CLEAR}, ensure_ascii=False)


_VALUE = re.compile(r'"clarification"\s*:\s*"((?:[^"\\]|\\.)*)', re.DOTALL)


def parse_answer(text: str | None) -> str | None:
    """`CLEAR`, a question, or None: robust to text around the JSON, a missing closing brace, a bare CLEAR.

    Accepts: a JSON object with a string `clarification` anywhere in the text (the first one that
    parses); a truncated object (`{"clarification": "Do you mean ...` cut by the token limit); a
    bare `CLEAR`; a bare question (one line ending in `?`). Everything else is None.
    """
    if not text or not text.strip():
        return None
    text = text.strip()
    # 1. the first complete JSON object with a clarification
    dec = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch != "{":
            continue
        try:
            obj, _ = dec.raw_decode(text[i:])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("clarification"), str) and obj["clarification"].strip():
            value = obj["clarification"].strip()
            return CLEAR if value.upper() == CLEAR else value
    # 2. a truncated object: take the string value as far as it goes
    m = _VALUE.search(text)
    if m:
        try:
            value = json.loads('"' + m.group(1) + '"')
        except json.JSONDecodeError:
            value = m.group(1)
        value = value.strip()
        if value.upper().startswith(CLEAR):
            return CLEAR
        return value if len(value) >= 3 and any(c.isalpha() for c in value) else None
    # 3. bare answers
    if text.strip("\"'` .").upper() == CLEAR:
        return CLEAR
    if "\n" not in text and text.endswith("?") and len(text) > 5 and "{" not in text:
        return text
    return None
