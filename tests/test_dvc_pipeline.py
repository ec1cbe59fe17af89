"""The DVC pipeline definition is consistent with the code: every stage calls a real `clariedge`
subcommand, every dependency file exists, every params key it declares exists in params.yaml."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from typer.main import get_command

from clariedge.cli import app

ROOT = Path(__file__).resolve().parents[1]
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))


def _expanded_stages() -> list[tuple[str, dict]]:
    """Stages with `foreach`/`matrix` expanded enough to check their commands and deps."""
    out = []
    for name, stage in DVC["stages"].items():
        over = stage.get("foreach")
        if isinstance(over, str) and over.startswith("${") and over.endswith("}"):
            node = PARAMS  # `foreach: ${a.b}` over a params mapping or list: one stage per key / item
            for part in over[2:-1].split("."):
                node = node[part]
            keys = list(node) if isinstance(node, dict) else [str(v) for v in node]
            for key in keys:
                text = yaml.safe_dump(stage["do"]).replace("${key}", key).replace("${item}", key)
                out.append((f"{name}@{key}", yaml.safe_load(text)))
        else:
            out.append((name, stage.get("do", stage)))
    return out


STAGES = _expanded_stages()


@pytest.mark.parametrize(("name", "stage"), STAGES, ids=[s[0] for s in STAGES])
def test_stage_calls_a_real_subcommand(name: str, stage: dict) -> None:
    words = shlex.split(stage["cmd"].replace("${", "X").replace("}", ""))
    assert words[0] == "clariedge", f"stage {name} must call the clariedge console script"
    group = get_command(app)
    cmd = group
    for w in words[1:]:
        if w.startswith("-") or not hasattr(cmd, "commands"):
            break
        assert w in cmd.commands, f"stage {name}: `{w}` is not a clariedge subcommand"
        cmd = cmd.commands[w]
    assert cmd is not group


@pytest.mark.parametrize(("name", "stage"), STAGES, ids=[s[0] for s in STAGES])
def test_stage_deps_exist_and_params_are_declared(name: str, stage: dict) -> None:
    for dep in stage.get("deps", []):
        if "${" in dep:
            continue
        produced = any(dep == o or dep.startswith(str(o).rstrip("/") + "/") for _, s in STAGES for o in _outs(s))
        assert produced or (ROOT / dep).exists(), f"stage {name}: dependency {dep} does not exist"
    for p in stage.get("params", []):
        keys = p if isinstance(p, str) else next(iter(p))
        node = PARAMS
        for part in str(keys).split("."):
            if "${" in part:
                break
            assert isinstance(node, dict) and part in node, f"stage {name}: params key {keys} not in params.yaml"
            node = node[part]


def _outs(stage: dict) -> list[str]:
    out = []
    for key in ("outs", "metrics", "plots"):
        for o in stage.get(key, []) or []:
            out.append(o if isinstance(o, str) else next(iter(o)))
    return out


def test_every_stage_module_is_a_dependency_of_its_stage() -> None:
    for name, stage in STAGES:
        modules = [d for d in stage.get("deps", []) if d.endswith(".py")]
        assert modules, f"stage {name} lists no code dependency: a code change would not rerun it"
