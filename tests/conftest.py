"""Shared pytest fixtures: paths to the real MTRAG data (skipping cleanly where it is absent), and
`params_section`: a stage's config as the repository's params.yaml sets it (the only place defaults live)."""

from __future__ import annotations

import functools
import importlib
import typing
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
MTRAG = ROOT.parent / "shared" / "data" / "mtrag"
SAMPLE = ROOT / "data" / "sample"
PARAMS = ROOT / "params.yaml"


@functools.cache
def cli_sections() -> dict[str, type]:
    """params.yaml section -> the config class the CLI validates it into, read from the
    `load_stage_config(params, "<section>", <Config>)` calls in pipeline/cli.py and its `cli_*` siblings
    (so a new stage is covered without a list here)."""
    import ast

    found: dict[str, type] = {}
    trees = [ast.parse(p.read_text(encoding="utf-8")) for p in sorted((ROOT / "pipeline").glob("cli*.py"))]
    for fn in (n for tree in trees for n in tree.body if isinstance(n, ast.FunctionDef)):
        names = {  # local name -> what `from X import Y as name` binds: a module or an attribute
            a.asname or a.name: (node.module, a.name)
            for node in ast.walk(fn)
            if isinstance(node, ast.ImportFrom) and node.module
            for a in node.names
        }
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "load_stage_config"):
                continue
            section, expr = node.args[1], node.args[2]
            if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):  # stage.TrainConfig
                module, name = names[expr.value.id]
                found[section.value] = getattr(importlib.import_module(f"{module}.{name}"), expr.attr)
            elif isinstance(expr, ast.Name):  # TrainConfig
                module, name = names[expr.id]
                found[section.value] = getattr(importlib.import_module(module), name)
    return found


def section_model(section: str) -> type:
    """The config class of a (dotted) params section: `train` -> TrainConfig, `filter.dedup` -> DedupConfig,
    `train.variants.default` -> VariantSettings (followed through the fields' annotations)."""
    from pydantic import BaseModel

    top, *rest = section.split(".")
    model: Any = cli_sections()[top]
    in_mapping = False
    for part in rest:
        if in_mapping:  # a key of a dict[str, Config] field
            in_mapping = False
            continue
        ann = model.model_fields[part].annotation
        if typing.get_origin(ann) is dict:
            ann, in_mapping = typing.get_args(ann)[1], True
        found = [a for a in (ann, *typing.get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not found:
            raise KeyError(f"{section}: {part} is not a config section")
        model = found[0]
    return model


def params_section(section: str, /, **overrides: Any) -> Any:
    """The validated config of `section` (dotted for nested ones) from the repository's params.yaml, with
    `overrides` replacing keys: `params_section("train", lr=5e-4)`, `params_section("filter.dedup", enabled=False)`."""
    from clariedge.config import load_section

    return load_section(PARAMS, section, section_model(section), **overrides)


def write_params(path: Path, **changes: Any) -> Path:
    """A params file at `path`: the repository's params.yaml with `changes` merged in (a mapping merges
    into the section, anything else replaces it): `write_params(p, seed=5, publish={"ratios": {...}})`."""
    import yaml

    def merge(base: Any, new: Any) -> Any:
        if isinstance(base, dict) and isinstance(new, dict):
            return {**base, **{k: merge(base.get(k), v) for k, v in new.items()}}
        return new

    data = merge(yaml.safe_load(PARAMS.read_text(encoding="utf-8")), changes)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def mtrag_dir() -> Path:
    """The real MTRAG files beside the checkout (`../shared/data/mtrag`); skip where absent."""
    if not (MTRAG / "reference_subset_with_human_evaluations.json").exists():
        pytest.skip("real MTRAG data not present (../shared/data/mtrag)")
    return MTRAG


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    return SAMPLE


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base model as an HF folder: `models/base` when `dvc repro base_model` made it, else built now (slow)."""
    built = ROOT / "models" / "base"
    if (built / "config.json").exists() and (built / "model.safetensors").exists():
        return built
    from clariedge.training.base_model import run

    out = tmp_path_factory.mktemp("models") / "base"
    run(out, params_section("base_model"))
    return out
