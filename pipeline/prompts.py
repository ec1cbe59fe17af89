"""Prompts as files: load, validate and render the YAML prompt files in `generation_prompts/`.

One file per prompt version (`<id>.<version>.yaml`); a released version is never edited, a change is
a new file and `params.yaml` picks the version. A file holds:

    id, version, description
    inputs:          {name: description}; exactly the variables the templates use
    generation:      default sampling params (temperature, max_tokens), overridable in params.yaml
    response_schema: the JSON schema the model's answer must follow (checked by `validate_json`)
    messages:        [{role, content}], content is Jinja2, rendered with StrictUndefined
    few_shot:        [{inputs, output}]: rendered as user/assistant pairs before the final user message
    sample_inputs:   inputs for the snapshot test and `clariedge synthesize --dry-run`

Everything is checked when the file is loaded (declared inputs against the templates' variables,
few-shot outputs against the schema), so a broken prompt fails before any call is paid for.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import yaml
from jinja2 import meta

ROLES = ("system", "user", "assistant")
_NAME = re.compile(r"^(?P<id>[a-z][a-z0-9_]*)\.(?P<version>v[0-9]+)$")
_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False)
_ENV.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)


class PromptError(ValueError):
    """A prompt file that cannot be used: the message names the file and the field."""


def sha256_text(text: str, length: int = 16) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def messages_hash(messages: list[dict[str, str]]) -> str:
    """Hash of rendered messages (role + content): what `provenance.prompt_hash` stores."""
    return "sha256:" + sha256_text(json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":")))


# ---------------------------------------------------------------------------------------------
# A small JSON-schema validator (the subset prompt schemas use; `jsonschema` is not a dependency)
# ---------------------------------------------------------------------------------------------
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}
_KEYWORDS = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
    "uniqueItems",
    "description",
    "minimum",
    "maximum",
}


def check_schema(schema: Any, where: str = "response_schema") -> None:
    """Reject schema keywords this validator does not implement (so none is silently ignored)."""
    if not isinstance(schema, dict):
        raise PromptError(f"{where}: a schema must be a mapping")
    unknown = set(schema) - _KEYWORDS
    if unknown:
        raise PromptError(f"{where}: unsupported schema keyword(s) {sorted(unknown)} (supported: {sorted(_KEYWORDS)})")
    types = schema.get("type")
    for t in types if isinstance(types, list) else [types] if types else []:
        if t not in _TYPES:
            raise PromptError(f"{where}.type: unknown type {t!r}")
    for name, sub in (schema.get("properties") or {}).items():
        check_schema(sub, f"{where}.properties.{name}")
    if isinstance(schema.get("items"), dict):
        check_schema(schema["items"], f"{where}.items")
    if "pattern" in schema:
        re.compile(schema["pattern"])


def validate_json(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Return the problems of `value` against `schema` (empty list: valid), each naming its JSON path."""
    errors: list[str] = []
    types = schema.get("type")
    if types is not None:
        allowed = types if isinstance(types, list) else [types]
        ok = any(
            isinstance(value, _TYPES[t]) and not (t in ("integer", "number") and isinstance(value, bool))
            for t in allowed
        )
        if not ok:
            return [f"{path}: expected {'/'.join(allowed)}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, str):
        if len(value.strip()) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: longer than {schema['maxLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: does not match /{schema['pattern']}/")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: below minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: above maximum {schema['maximum']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: needs at least {schema['minItems']} items, got {len(value)}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: at most {schema['maxItems']} items, got {len(value)}")
        if schema.get("uniqueItems"):
            seen = [json.dumps(v, sort_keys=True).lower() for v in value]
            if len(set(seen)) != len(seen):
                errors.append(f"{path}: items must be distinct")
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                errors.extend(validate_json(item, schema["items"], f"{path}[{i}]"))
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{path}.{name}: required")
        props = schema.get("properties", {})
        for name, item in value.items():
            if name in props:
                errors.extend(validate_json(item, props[name], f"{path}.{name}"))
            elif schema.get("additionalProperties", True) is False:
                errors.append(f"{path}.{name}: unexpected property")
    return errors


def parse_answer(text: str, schema: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None, str]:
    """Parse a model's answer: `(value, None, "")` or `(None, reason, detail)`.

    `json.loads` only (never eval). A fenced ```json block or text around one JSON object is tolerated,
    because small local models add them; the object itself must be valid JSON and follow the schema.
    """
    candidate = _extract_json(text)
    try:
        value = json.loads(candidate)
    except json.JSONDecodeError as err:
        return None, "invalid_json", f"{err.msg} at line {err.lineno} column {err.colno}"
    errors = validate_json(value, schema)
    if errors:
        return None, "schema_mismatch", "; ".join(errors[:5])
    return value, None, ""


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _extract_json(text: str) -> str:
    text = text.strip()
    if text.startswith("{"):
        return text
    fenced = _FENCE.search(text)
    if fenced:
        return fenced.group(1).strip()
    start, end = text.find("{"), text.rfind("}")
    return text[start : end + 1] if 0 <= start < end else text


# ---------------------------------------------------------------------------------------------
# Prompt files
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FewShot:
    inputs: dict[str, Any]
    output: dict[str, Any]


@dataclass(frozen=True)
class Prompt:
    id: str
    version: str
    description: str
    inputs: dict[str, str]
    generation: dict[str, Any]
    response_schema: dict[str, Any]
    messages: tuple[tuple[str, str], ...]
    few_shot: tuple[FewShot, ...] = ()
    sample_inputs: dict[str, Any] = field(default_factory=dict)
    file_hash: str = ""
    path: str = ""

    @property
    def name(self) -> str:
        return f"{self.id}.{self.version}"

    def render(self, inputs: dict[str, Any]) -> list[dict[str, str]]:
        """Render the chat messages for `inputs` (exactly the declared inputs; extra or missing is an error)."""
        missing = sorted(set(self.inputs) - set(inputs))
        extra = sorted(set(inputs) - set(self.inputs))
        if missing or extra:
            raise PromptError(f"{self.name}: inputs do not match the declared ones (missing {missing}, extra {extra})")
        user_idx = max(i for i, (role, _) in enumerate(self.messages) if role == "user")
        out: list[dict[str, str]] = []
        for i, (role, template) in enumerate(self.messages):
            if i == user_idx:
                for shot in self.few_shot:
                    out.append({"role": "user", "content": _render(template, shot.inputs, self.name)})
                    out.append({"role": "assistant", "content": json.dumps(shot.output, ensure_ascii=False)})
            out.append({"role": role, "content": _render(template, inputs, self.name)})
        return out


@lru_cache(maxsize=256)
def _compiled(template: str) -> jinja2.Template:
    return _ENV.from_string(template)  # compiling costs ~10 ms; rendering a compiled template ~0.1 ms


def _render(template: str, inputs: dict[str, Any], name: str) -> str:
    try:
        return _compiled(template).render(**inputs).strip()
    except jinja2.UndefinedError as err:
        raise PromptError(f"{name}: {err.message}") from None


_KEYS = {
    "id",
    "version",
    "description",
    "inputs",
    "generation",
    "response_schema",
    "messages",
    "few_shot",
    "sample_inputs",
}


def _parse_messages(msgs: Any, where: str) -> tuple[list[tuple[str, str]], set[str]]:
    """A prompt file's `messages` as (role, template) pairs, and the variables the templates use."""
    if not isinstance(msgs, list) or not msgs:
        raise PromptError(f"{where}: messages: a non-empty list of {{role, content}}")
    parsed: list[tuple[str, str]] = []
    used: set[str] = set()
    for i, msg in enumerate(msgs):
        if not isinstance(msg, dict) or set(msg) != {"role", "content"} or msg["role"] not in ROLES:
            raise PromptError(f"{where}: messages[{i}]: needs exactly role ({'|'.join(ROLES)}) and content")
        try:
            used |= meta.find_undeclared_variables(_ENV.parse(msg["content"]))
        except jinja2.TemplateSyntaxError as err:
            raise PromptError(f"{where}: messages[{i}].content line {err.lineno}: {err.message}") from None
        parsed.append((msg["role"], msg["content"]))
    if not any(role == "user" for role, _ in parsed):
        raise PromptError(f"{where}: messages: needs a user message")
    return parsed, used


def load_prompt(path: str | Path) -> Prompt:
    """Load and check one prompt file; every problem raises `PromptError` naming the file and field."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PromptError(f"{path.name}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise PromptError(f"{path.name}: expected a mapping")
    where = path.name
    unknown = set(data) - _KEYS
    if unknown:
        raise PromptError(f"{where}: unknown key(s) {sorted(unknown)} (known: {sorted(_KEYS)})")
    for key in ("id", "version", "description", "inputs", "response_schema", "messages"):
        if key not in data:
            raise PromptError(f"{where}: missing required key {key!r}")
    m = _NAME.match(path.name.removesuffix(".yaml"))
    if not m or m["id"] != data["id"] or m["version"] != str(data["version"]):
        raise PromptError(f"{where}: file name must be `<id>.<version>.yaml` matching id/version inside")
    inputs = data["inputs"]
    if not isinstance(inputs, dict) or not inputs:
        raise PromptError(f"{where}: inputs: a mapping of name -> description")
    parsed, used = _parse_messages(data["messages"], where)
    if used != set(inputs):
        raise PromptError(
            f"{where}: declared inputs {sorted(inputs)} differ from the templates' variables {sorted(used)}"
        )
    schema = data["response_schema"]
    check_schema(schema, f"{where}: response_schema")
    gen = data.get("generation") or {}
    bad_gen = set(gen) - {"temperature", "max_tokens"}
    if bad_gen:
        raise PromptError(f"{where}: generation: unknown key(s) {sorted(bad_gen)} (known: temperature, max_tokens)")
    shots = []
    for i, shot in enumerate(data.get("few_shot") or []):
        if not isinstance(shot, dict) or set(shot) != {"inputs", "output"}:
            raise PromptError(f"{where}: few_shot[{i}]: needs exactly inputs and output")
        errs = validate_json(shot["output"], schema)
        if errs:
            raise PromptError(f"{where}: few_shot[{i}].output does not follow response_schema: {errs[0]}")
        shots.append(FewShot(inputs=shot["inputs"], output=shot["output"]))
    prompt = Prompt(
        id=data["id"],
        version=str(data["version"]),
        description=str(data["description"]).strip(),
        inputs={k: str(v) for k, v in inputs.items()},
        generation=dict(gen),
        response_schema=schema,
        messages=tuple(parsed),
        few_shot=tuple(shots),
        sample_inputs=data.get("sample_inputs") or {},
        file_hash="sha256:" + sha256_text(text),
        path=f"generation_prompts/{path.name}",
    )
    for i, shot in enumerate(shots):  # few-shot inputs must render too
        try:
            prompt.render(shot.inputs)
        except PromptError as err:
            raise PromptError(f"{where}: few_shot[{i}].inputs: {err}") from None
    return prompt


def prompts_dir() -> Path:
    return Path(str(resources.files("clariedge.generation_prompts")))


def available() -> list[str]:
    """Every prompt file's `<id>.<version>` name, sorted."""
    return sorted(p.name.removesuffix(".yaml") for p in prompts_dir().glob("*.yaml"))


@lru_cache(maxsize=64)
def get_prompt(name: str) -> Prompt:
    """Load a bundled prompt by `<id>.<version>` (e.g. `ambiguous_dialog.v1`)."""
    if not _NAME.match(name):
        raise PromptError(f"prompt name {name!r}: expected `<id>.<version>`, e.g. ambiguous_dialog.v1")
    path = prompts_dir() / f"{name}.yaml"
    if not path.exists():
        raise PromptError(f"prompt {name!r} not found in generation_prompts/ (available: {', '.join(available())})")
    return load_prompt(path)
