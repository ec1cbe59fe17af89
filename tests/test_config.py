"""params.yaml is the only place a default lives: every stage's config validates against its section,
the config classes hold no defaults, and a missing file, section or key is an error naming it."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
import yaml
from conftest import PARAMS, cli_sections, params_section, section_model
from pydantic import BaseModel
from pydantic_core import PydanticUndefined
from typer.testing import CliRunner

from clariedge.cli import app
from clariedge.config import ConfigError, StageConfig, load_section, load_seed, load_stage_config

RAW = yaml.safe_load(PARAMS.read_text(encoding="utf-8"))

# Fields allowed a value in code, and why. Nothing else may have one.
KNOWN_DEFAULTS = {
    # overrides, not defaults: a key a variant leaves out (None) keeps the `train` section's value
    "VariantSettings": {"drop_categories", "lr", "epochs", "max_steps", "max_rows"},
    # not params: the CLI fills them from ARGILLA_API_URL / ARGILLA_API_KEY (None: no server)
    "ReviewConfig": {"api_url", "api_key"},
}
PENDING_MODULES: tuple[str, ...] = ()


def _all_stage_configs() -> list[type[StageConfig]]:
    for pkg in ("clariedge", "clariedge.training", "clariedge.annotation"):
        for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
            importlib.import_module(info.name)

    def subclasses(cls: type) -> list[type]:
        return [s for c in cls.__subclasses__() for s in (c, *subclasses(c))]

    return sorted(set(subclasses(StageConfig)), key=lambda c: c.__qualname__)


def _nested(model: type[BaseModel]) -> set[type]:
    """The config classes reachable from `model` through its fields (directly, optional, in a dict or list)."""
    import typing

    out: set[type] = set()
    for field in model.model_fields.values():
        todo = [field.annotation]
        while todo:
            ann = todo.pop()
            if isinstance(ann, type) and issubclass(ann, BaseModel) and ann not in out:
                out |= {ann} | _nested(ann)
            todo.extend(typing.get_args(ann))
    return out


@pytest.mark.parametrize("section", sorted(cli_sections()))
def test_every_stage_config_validates_against_its_params_section(section: str) -> None:
    cfg = load_section(PARAMS, section, cli_sections()[section])
    assert cfg.model_dump(exclude={"api_url", "api_key"}) is not None
    assert params_section(section) == cfg


def test_every_config_class_is_a_params_section_or_inside_one() -> None:
    reachable = {m for top in cli_sections().values() for m in {top} | _nested(top)}
    orphans = [c.__qualname__ for c in _all_stage_configs() if c not in reachable]
    assert orphans == [], f"config classes no params.yaml section validates into: {orphans}"


def test_config_classes_hold_no_defaults() -> None:
    found = {}
    for cls in _all_stage_configs():
        if cls.__module__.startswith(PENDING_MODULES):
            continue
        with_default = {
            name
            for name, f in cls.model_fields.items()
            if f.default is not PydanticUndefined or f.default_factory is not None
        }
        extra = with_default - KNOWN_DEFAULTS.get(cls.__qualname__, set())
        if extra:
            found[cls.__qualname__] = sorted(extra)
    assert found == {}, f"defaults in code (they belong in params.yaml only): {found}"


def _without(path: list[str]) -> dict:
    """A copy of params.yaml with the key at `path` removed."""
    data = yaml.safe_load(PARAMS.read_text(encoding="utf-8"))
    node = data
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    return data


@pytest.mark.parametrize(
    "key",
    ["train.lr", "train.lora.dropout", "clean.calibration", "filter.dedup.cache", "evaluate.llm_judge.openai.model"],
)
def test_a_missing_key_is_an_error_naming_it(tmp_path: Path, key: str) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(_without(key.split("."))), encoding="utf-8")
    section = key.split(".")[0]
    with pytest.raises(ConfigError, match=re.escape(f"{key}: missing")) as err:
        load_stage_config(params, section, cli_sections()[section])
    assert str(params) in str(err.value)


def test_a_missing_section_and_a_missing_seed_are_errors(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(_without(["publish"])), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"publish: missing"):
        load_stage_config(params, "publish", cli_sections()["publish"])
    params.write_text(yaml.safe_dump(_without(["seed"])), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"seed: missing"):
        load_seed(params)


def test_an_unknown_nested_key_lists_the_keys_of_its_own_section(tmp_path: Path) -> None:
    data = yaml.safe_load(PARAMS.read_text(encoding="utf-8"))
    data["train"]["lora"]["dropuot"] = 0.1
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"train\.lora\.dropuot: unknown key \(known keys: alpha, dropout, ") as err:
        load_stage_config(params, "train", cli_sections()["train"])
    assert "train.lora.dropout" not in str(err.value)  # only the typo, not a missing key


def test_without_a_params_file_nothing_falls_back_to_code(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="params file not found"):
        load_stage_config(tmp_path / "params.yaml", "train", cli_sections()["train"])
    with pytest.raises(ConfigError, match="params file not found"):
        load_seed(tmp_path / "params.yaml")


@pytest.mark.parametrize(
    "args",
    [
        ["ingest", "-o", "seeds.parquet"],
        ["publish", "cleaned.parquet", "-o", "ds", "--parquet-dir", "pq", "--chat-dir", "chat"],
        ["base-model", "-o", "base"],
        ["train", "train.parquet", "--base", "base", "-o", "adapter", "--metrics", "m.json"],
    ],
    ids=lambda a: a[0],
)
def test_a_stage_without_a_params_file_fails_with_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no params.yaml here
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1, res.output
    assert "error: params.yaml: params file not found" in res.output
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_stage_without_its_paths_names_the_missing_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paths are written in dvc.yaml only: the commands have no default paths."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["publish", "cleaned.parquet"])
    assert res.exit_code == 2
    assert "Missing option" in res.output and "--output" in res.output


def test_params_section_helper_follows_nested_sections() -> None:
    assert section_model("filter.dedup").__name__ == "DedupConfig"
    assert section_model("train.variants.no_hard_negatives").__name__ == "VariantSettings"
    assert params_section("train", lr=5e-4).lr == 5e-4
    assert params_section("train").lr == RAW["train"]["lr"]
    assert params_section("filter.dedup", enabled=False).threshold == RAW["filter"]["dedup"]["threshold"]
