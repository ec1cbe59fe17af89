"""Loading `params.yaml`: one section per stage, validated into a frozen config object.

A typo in a key fails fast with a message naming the section and key, instead of being ignored.
"""

from __future__ import annotations

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


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: params file not found (run from the project root or pass --params)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of stage sections at the top level")
    return data


def load_section(path: str | Path, section: str, model: type[C]) -> C:
    """Validate `params.yaml[section]` into `model`; errors name `section.key`."""
    params = load_params(path)
    raw = params.get(section, {})
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: section {section!r} must be a mapping, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            key = ".".join(str(x) for x in (section, *e["loc"]))
            if e["type"] == "extra_forbidden":
                known = ", ".join(sorted(model.model_fields))
                lines.append(f"{key}: unknown key (known keys: {known})")
            else:
                lines.append(f"{key}: {e['msg']}")
        raise ConfigError(f"{path}: " + "; ".join(lines)) from None


DEFAULT_PARAMS = Path("params.yaml")


def load_stage_config(path: str | Path, section: str, model: type[C]) -> C:
    """`params.yaml[section]` as `model`. Without a params file the model's defaults apply, but only
    for the default path: a `--params FILE` that does not exist is an error, not silently ignored."""
    path = Path(path)
    if not path.exists():
        if path == DEFAULT_PARAMS:
            return model()
        raise ConfigError(f"{path}: params file not found")
    return load_section(path, section, model)


def load_seed(path: str | Path) -> int:
    """The top-level `seed` every stage draws its random choices from (0 without a params file)."""
    path = Path(path)
    if not path.exists() and path == DEFAULT_PARAMS:
        return 0
    seed = load_params(path).get("seed", 0)
    if not isinstance(seed, int):
        raise ConfigError(f"{path}: seed: expected an integer, got {seed!r}")
    return seed
