"""Prompt files: every bundled prompt loads and renders its sample inputs exactly as the committed
snapshot (so a prompt change shows in review), bad files fail with a message naming the problem, and
the small JSON-schema validator accepts and rejects what it should.

Regenerate the snapshots after an intended prompt change: `UPDATE_SNAPSHOTS=1 pytest tests/test_prompts.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from clariedge import prompts
from clariedge.prompts import PromptError, get_prompt, load_prompt, messages_hash, parse_answer, validate_json
from clariedge.synthesize import PROMPT_TASKS, SynthesizeConfig

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = Path(__file__).parent / "snapshots" / "prompts"
NAMES = prompts.available()


def _snapshot_text(name: str) -> str:
    p = get_prompt(name)
    rendered = p.render(p.sample_inputs)
    parts = [f"# {p.name}  rendered hash {messages_hash(rendered)}"]
    for m in rendered:
        parts.append(f"=== {m['role']} ===\n{m['content']}")
    return "\n".join(parts) + "\n"


def test_the_expected_prompts_are_bundled() -> None:
    for name in (*(f"{task}.v1" for task in PROMPT_TASKS), "judge_clarification.v1"):
        assert name in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_prompt_renders_its_sample_inputs_as_the_snapshot(name: str) -> None:
    path = SNAPSHOTS / f"{name}.txt"
    text = _snapshot_text(name)
    if os.environ.get("UPDATE_SNAPSHOTS") == "1" or not path.exists():
        if os.environ.get("UPDATE_SNAPSHOTS") != "1":
            pytest.fail(f"no snapshot {path.name}: run UPDATE_SNAPSHOTS=1 pytest tests/test_prompts.py and commit it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} renders differently from {path}"


@pytest.mark.parametrize("name", NAMES)
def test_prompt_file_is_complete(name: str) -> None:
    p = get_prompt(name)
    assert p.id and p.version.startswith("v") and p.description
    assert p.few_shot, "each prompt carries at least one few-shot example"
    assert set(p.sample_inputs) == set(p.inputs)
    rendered = p.render(p.sample_inputs)
    # few-shot pairs come before the final user message; the assistant turns are schema-valid JSON
    assert rendered[-1]["role"] == "user"
    shots = [m for m in rendered if m["role"] == "assistant"]
    assert len(shots) == len(p.few_shot)
    for m in shots:
        assert validate_json(json.loads(m["content"]), p.response_schema) == []
    assert p.file_hash.startswith("sha256:") and len(p.file_hash) == 23


def test_render_is_strict_about_inputs() -> None:
    p = get_prompt("hard_negative.v1")
    inputs = dict(p.sample_inputs)
    with pytest.raises(PromptError, match=r"missing \['rewrite'\]"):
        p.render({k: v for k, v in inputs.items() if k != "rewrite"})
    with pytest.raises(PromptError, match=r"extra \['surprise'\]"):
        p.render({**inputs, "surprise": 1})
    # StrictUndefined: a declared input without the attribute the template reads fails loudly
    with pytest.raises(PromptError, match="content"):
        p.render({**inputs, "dialog": [{"role": "user"}]})


def test_rendered_hash_changes_with_inputs_and_is_stable() -> None:
    p = get_prompt("clear.v1")
    a = messages_hash(p.render(p.sample_inputs))
    assert a == messages_hash(p.render(dict(p.sample_inputs)))
    assert a != messages_hash(p.render({**p.sample_inputs, "last_turn": "something else"}))


def _write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _minimal() -> dict:
    return {
        "id": "tiny",
        "version": "v1",
        "description": "a test prompt",
        "inputs": {"question": "the question"},
        "response_schema": {"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}},
        "messages": [{"role": "system", "content": "Answer JSON."}, {"role": "user", "content": "Q: {{ question }}"}],
        "few_shot": [{"inputs": {"question": "x"}, "output": {"a": "y"}}],
    }


def test_a_good_minimal_prompt_loads(tmp_path: Path) -> None:
    p = load_prompt(_write(tmp_path, "tiny.v1.yaml", _minimal()))
    assert p.render({"question": "why?"})[-1] == {"role": "user", "content": "Q: why?"}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda d: d["messages"][1].update(content="{{ question }} {{ other }}"),
            r"differ from the templates' variables",
        ),
        (lambda d: d["inputs"].update(unused="never used"), r"differ from the templates' variables"),
        (lambda d: d["few_shot"][0].update(output={"a": 3}), r"few_shot\[0\]\.output does not follow"),
        (lambda d: d["response_schema"].update(oneOf=[]), r"unsupported schema keyword"),
        (lambda d: d.update(temperature=0.3), r"unknown key\(s\) \['temperature'\]"),
        (lambda d: d.update(version="v2"), r"file name must be"),
        (lambda d: d["messages"][1].update(content="{% if %}"), r"messages\[1\]\.content line 1"),
        (lambda d: d.pop("response_schema"), r"missing required key 'response_schema'"),
        (lambda d: d["few_shot"][0].update(inputs={}), r"few_shot\[0\]\.inputs"),
    ],
)
def test_a_bad_prompt_file_fails_naming_the_problem(tmp_path: Path, change, match: str) -> None:
    data = _minimal()
    change(data)
    with pytest.raises(PromptError, match=match) as info:
        load_prompt(_write(tmp_path, "tiny.v1.yaml", data))
    assert "tiny.v1.yaml" in str(info.value)


def test_unknown_prompt_name_lists_the_available_ones() -> None:
    with pytest.raises(PromptError, match="available: .*clear.v1"):
        get_prompt("clear.v99")


def test_validator() -> None:
    schema = get_prompt("ambiguous_documents.v1").response_schema
    good = {
        "turn": "Who founded the Cardinals?",
        "removed": "Arizona",
        "interpretations": ["Arizona Cardinals", "St. Louis Cardinals"],
        "clarification": "Do you mean the Arizona Cardinals or the St. Louis Cardinals?",
    }
    assert validate_json(good, schema) == []
    assert any("required" in e for e in validate_json({k: v for k, v in good.items() if k != "turn"}, schema))
    assert any("unexpected property" in e for e in validate_json({**good, "extra": 1}, schema))
    assert any("/\\?" in e for e in validate_json({**good, "clarification": "Tell me which Cardinals."}, schema))
    assert any("at least 2" in e for e in validate_json({**good, "interpretations": ["one"]}, schema))
    assert any("distinct" in e for e in validate_json({**good, "interpretations": ["a b", "A B"]}, schema))
    assert any("expected string" in e for e in validate_json({**good, "turn": 5}, schema))
    judge = get_prompt("judge_clarification.v1").response_schema
    assert validate_json({"is_clarification": True, "answers_question": False, "reason": "asks"}, judge) == []
    assert validate_json({"is_clarification": 1, "answers_question": False, "reason": "asks"}, judge)
    assert validate_json(1, {"type": "integer"}) == [] and validate_json(True, {"type": "integer"})


def test_parse_answer() -> None:
    schema = get_prompt("clear.v1").response_schema
    assert parse_answer('{"turn": "When was the Eiffel Tower built?"}', schema)[0] == {
        "turn": "When was the Eiffel Tower built?"
    }
    fenced = 'Sure!\n```json\n{"turn": "When was the Eiffel Tower built?"}\n```'
    assert parse_answer(fenced, schema)[0] is not None
    value, reason, detail = parse_answer("I cannot help with that.", schema)
    assert value is None and reason == "invalid_json" and "line 1" in detail
    value, reason, detail = parse_answer('{"turn": "x"}', schema)
    assert value is None and reason == "schema_mismatch" and "$.turn" in detail
    assert parse_answer("{'turn': 'python dict'}", schema)[1] == "invalid_json"  # never eval


def test_params_yaml_picks_existing_prompt_versions() -> None:
    section = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))["synthesize"]
    cfg = SynthesizeConfig.model_validate(section)
    for name in cfg.prompts.values():
        assert get_prompt(name).name == name
    with pytest.raises(ValueError, match="unknown task"):
        SynthesizeConfig.model_validate({**section, "prompts": {**section["prompts"], "ambigous_dialog": "x.v1"}})
    without_clear = {k: v for k, v in section["prompts"].items() if k != "clear"}
    with pytest.raises(ValueError, match=r"no prompt for task\(s\) \['clear'\]"):
        SynthesizeConfig.model_validate({**section, "prompts": without_clear})
