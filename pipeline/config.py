"""Loading `params.yaml`: one section per stage, validated into a frozen config object.

`params.yaml` is the only place a default lives: the config classes declare types and bounds, never
values, so a missing file or key is an error naming `section.key` instead of a silent fallback to a
second set of defaults. A typo in a key fails the same way, listing the keys that exist.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

C = TypeVar("C", bound="StageConfig")


class ConfigError(ValueError):
    """A bad `params.yaml`: the message names the file, section and key."""


class StageConfig(BaseModel):
    """Base for every stage's config: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error on one line: what was being parsed and what went wrong, each with its line and column."""
    parts = []
    for what, mark in (("context", "context_mark"), ("problem", "problem_mark")):
        text, at = getattr(err, what, None), getattr(err, mark, None)
        if text:
            parts.append(f"{text} (line {at.line + 1}, column {at.column + 1})" if at is not None else text)
    return "; ".join(parts) or " ".join(str(err).split())


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: params file not found (run from the project root or pass --params)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of stage sections at the top level")
    return data


def load_section(path: str | Path, section: str, model: type[C], /, **overrides: Any) -> C:
    """Validate `params.yaml[section]` into `model`; errors name `section.key`.

    `section` may be dotted (`filter.dedup`). Every key must be present: the config classes hold no
    defaults, `params.yaml` is the only place they live. `overrides` replace keys of the section
    before validation (quick runs, tests).
    """
    raw: Any = load_params(path)
    parts = section.split(".")
    for i, part in enumerate(parts):
        if not isinstance(raw, dict) or part not in raw:
            where = ".".join(parts[:i]) or "the top level"
            raise ConfigError(f"{path}: {'.'.join(parts[: i + 1])}: missing (no key {part!r} in {where})")
        raw = raw[part]
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: section {section!r} must be a mapping, got {type(raw).__name__}")
    try:
        return model.model_validate({**raw, **overrides})
    except ValidationError as err:
        raise ConfigError(f"{path}: {describe_errors(err, section, model)}") from None


def describe_errors(err: ValidationError, section: str, model: type[BaseModel]) -> str:
    """One line per problem, each naming `section.key` (and, for an unknown key, the keys that exist)."""
    lines = []
    for e in err.errors():
        key = ".".join(str(x) for x in (section, *e["loc"]))
        if e["type"] == "extra_forbidden":
            known = ", ".join(sorted(_fields_at(model, e["loc"][:-1])))
            lines.append(f"{key}: unknown key (known keys: {known})")
        elif e["type"] == "missing":
            lines.append(f"{key}: missing")
        else:
            lines.append(f"{key}: {e['msg']}")
    hint = (
        " (every key must be set: the params file is the only place defaults live)" if "missing" in str(lines) else ""
    )
    return "; ".join(lines) + hint


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the (nested) config at `loc`; the top level's where it cannot be followed."""
    current: Any = model
    for part in loc:
        field = getattr(current, "model_fields", {}).get(part) if isinstance(part, str) else None
        ann = getattr(field, "annotation", None)
        nested = [a for a in (ann, *typing.get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not nested:
            if isinstance(part, str) and typing.get_origin(ann) is dict:
                continue  # a mapping of configs (train.variants.<name>): the next part is the name
            return list(model.model_fields)
        current = nested[0]
    return list(current.model_fields)


def load_stage_config(path: str | Path, section: str, model: type[C]) -> C:
    """`params.yaml[section]` as `model`. The params file is required: without it a stage would run on
    values written nowhere."""
    return load_section(path, section, model)


def load_seed(path: str | Path) -> int:
    """The top-level `seed` every stage draws its random choices from."""
    params = load_params(path)
    if "seed" not in params:
        raise ConfigError(f"{path}: seed: missing (the top-level seed every stage draws from)")
    seed = params["seed"]
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"{path}: seed: expected an integer, got {seed!r}")
    return seed
