"""The shared chat format: system instruction, documents block, target JSON and output parsing."""

from __future__ import annotations

import json

import pytest

from clariedge.chat_format import CLEAR, SYSTEM_PROMPT, build_messages, parse_answer, target_json
from clariedge.schema import Document, Example, Message, Provenance


def _example(needs: bool, docs: bool = False) -> Example:
    return Example(
        conversation_id="c1",
        domain="clapnq",
        setting="post_retrieval" if docs else "pre_retrieval",
        category="ambiguous_dialog" if needs else "clear",
        messages=[Message(role="user", content="Who founded the Cardinals?")],
        documents=[Document(doc_id="d1", title="Arizona Cardinals", text="Founded in 1898.")] if docs else [],
        needs_clarification=needs,
        clarification="Do you mean the Arizona or the St. Louis Cardinals?" if needs else None,
        provenance=Provenance(generator="construct", seed_id="c1::1"),
    )


def test_build_messages_pre_retrieval_has_system_then_dialog():
    ex = _example(False)
    out = build_messages(ex.messages, ex.documents)
    assert out[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert out[1:] == [{"role": "user", "content": "Who founded the Cardinals?"}]


def test_build_messages_renders_documents_from_models_or_dicts():
    ex = _example(True, docs=True)
    from_models = build_messages(ex.messages, ex.documents)
    from_dicts = build_messages([m.model_dump() for m in ex.messages], [d.model_dump() for d in ex.documents])
    assert from_models == from_dicts
    system = from_models[0]["content"]
    assert system.startswith(SYSTEM_PROMPT)
    assert '<document id="d1" title="Arizona Cardinals">\nFounded in 1898.\n</document>' in system


def test_build_messages_rejects_dialog_not_ending_in_user():
    with pytest.raises(ValueError, match="end with a user turn"):
        build_messages([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    with pytest.raises(ValueError, match="empty"):
        build_messages([])


def test_target_json_and_parse_round_trip():
    amb, clear = _example(True), _example(False)
    assert json.loads(target_json(clear)) == {"clarification": CLEAR}
    assert json.loads(target_json(amb)) == amb.target
    assert parse_answer(target_json(amb)) == amb.clarification
    assert parse_answer('Sure! {"clarification": "clear"} done') == CLEAR
    assert parse_answer("no json here") is None
    assert parse_answer('{"clarification": 3}') is None
