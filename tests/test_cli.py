"""The `clariedge` console script, run as DVC runs it (a subprocess): a subcommand for every stage in dvc.yaml,
a bad params file, a missing or unknown key and a bad override each reported as one `error:` line with exit
code 1 and no traceback, and the command-line overrides of params."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from conftest import PARAMS, ROOT, SAMPLE, write_params

from clariedge.io import read_records
from clariedge.schema import SeedTurn

_SCRIPT = Path(sys.executable).with_name("clariedge")
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "clariedge.cli"]


def dvc_stages() -> dict[str, tuple[list[str], str]]:
    """dvc.yaml stage -> (the arguments its `cmd` passes to `clariedge`, the params section it reads first)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    out = {}
    for name, stage in stages.items():
        body = stage.get("do", stage)  # a foreach stage keeps its command under `do`
        argv = shlex.split(body["cmd"].replace("${key}", "default"))
        assert argv[0] == "clariedge", f"{name}: {body['cmd']}"
        section = next(p for p in body["params"] if p != "seed").split(".")[0]
        out[name] = (argv[1:], section)
    return out


STAGES = dvc_stages()


def clariedge(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env, timeout=120, check=False
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single `error: ...` line a failed stage prints (and nothing else), without the prefix."""
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0].removeprefix("error: ")


def params_without(path: Path, dotted: str) -> Path:
    data = yaml.safe_load(PARAMS.read_text(encoding="utf-8"))
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node[part]
    del node[last]
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# --- the commands -----------------------------------------------------------------------------------------
def test_help_lists_a_subcommand_for_every_dvc_stage(tmp_path: Path) -> None:
    top = clariedge("--help", cwd=tmp_path)
    assert top.returncode == 0, top.stderr
    listed = set(re.findall(r"^\W*\s([a-z][a-z-]*)\s{2,}[A-Z]", top.stdout, flags=re.M))
    review = clariedge("review", "--help", cwd=tmp_path)
    assert review.returncode == 0, review.stderr
    listed |= {f"review {c}" for c in re.findall(r"^\W*\s([a-z][a-z-]*)\s{2,}[A-Z]", review.stdout, flags=re.M)}
    wanted = {" ".join(args[:2]) if args[0] == "review" else args[0] for args, _ in STAGES.values()}
    assert len(wanted) >= 10
    assert wanted <= listed, f"dvc.yaml stages without a listed subcommand: {sorted(wanted - listed)}"
    assert "review" in listed and "predict" in listed


def test_version_prints_the_installed_version(tmp_path: Path) -> None:
    proc = clariedge("--version", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == version("clariedge")


# --- params problems: one line, exit 1, nothing written --------------------------------------------------------
@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_stage_names_its_missing_params_section_in_one_line(tmp_path: Path, stage: str) -> None:
    args, section = STAGES[stage]
    params = params_without(tmp_path / "params.yaml", section)
    message = one_error_line(clariedge(*args, "--params", params, cwd=tmp_path))
    assert message == f"{params}: {section}: missing (no key {section!r} in the top level)"
    assert [p.name for p in tmp_path.iterdir()] == ["params.yaml"]  # no output, not even a folder


@pytest.mark.parametrize(
    ("stage", "key"),
    [("publish", "publish.ratios"), ("filter", "filter.dedup.threshold"), ("review", "review.annotators")],
)
def test_a_missing_key_is_one_line_naming_it(tmp_path: Path, stage: str, key: str) -> None:
    args, _ = STAGES[stage]
    params = params_without(tmp_path / "params.yaml", key)
    message = one_error_line(clariedge(*args, "--params", params, cwd=tmp_path))
    assert (
        message == f"{params}: {key}: missing (every key must be set: the params file is the only place defaults live)"
    )


@pytest.mark.parametrize(
    ("stage", "changes", "key", "known"),
    [
        ("filter", {"filter": {"dedup": {"treshold": 0.9}}}, "filter.dedup.treshold", "threshold"),
        ("publish", {"publish": {"hub_privat": False}}, "publish.hub_privat", "hub_private"),
    ],
)
def test_an_unknown_key_is_one_line_naming_it_and_the_keys_that_exist(
    tmp_path: Path, stage: str, changes: dict, key: str, known: str
) -> None:
    args, _ = STAGES[stage]
    params = write_params(tmp_path / "params.yaml", **changes)
    message = one_error_line(clariedge(*args, "--params", params, cwd=tmp_path))
    assert f"{key}: unknown key (known keys: " in message
    listed = message.split("known keys: ", 1)[1].rstrip(")").split(", ")
    assert known in listed and key.rsplit(".", 1)[1] not in listed


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(
            "seed: 1\npublish: [unclosed\n  ratios: 1\n",
            r"not valid YAML: while parsing a flow sequence \(line 2, column \d+\); .*\(line 3, column \d+\)",
            id="invalid-yaml",
        ),
        pytest.param("- publish\n- train\n", r"expected a mapping of stage sections at the top level", id="a-list"),
        pytest.param("seed: 1\npublish: 3\n", r"section 'publish' must be a mapping, got int", id="scalar-section"),
        pytest.param("", r"publish: missing", id="empty-file"),
    ],
)
def test_a_bad_params_file_is_one_line_naming_it(tmp_path: Path, content: str, expected: str) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(content, encoding="utf-8")
    message = one_error_line(clariedge(*STAGES["publish"][0], "--params", params, cwd=tmp_path))
    assert message.startswith(f"{params}: ") and re.search(expected, message), message


def test_a_seed_that_is_not_an_integer_is_one_line(tmp_path: Path) -> None:
    params = write_params(tmp_path / "params.yaml", seed="twelve")
    message = one_error_line(clariedge(*STAGES["publish"][0], "--params", params, cwd=tmp_path))
    assert message == f"{params}: seed: expected an integer, got 'twelve'"


def test_a_params_path_that_is_a_folder_is_one_line_from_the_console_script(tmp_path: Path) -> None:
    message = one_error_line(clariedge(*STAGES["publish"][0], "--params", tmp_path, cwd=tmp_path))
    assert message == f"cannot read or write {tmp_path}: Is a directory"


def test_a_missing_input_says_which_file_and_to_run_the_previous_stage(tmp_path: Path) -> None:
    write_params(tmp_path / "params.yaml")
    args, _ = STAGES["publish"]  # reads data/cleaned.parquet, which is not there
    message = one_error_line(clariedge(*args, cwd=tmp_path))  # the default --params: ./params.yaml
    assert message == "data/cleaned.parquet: no such file (did the previous stage run? try `dvc repro`)"
    assert [p.name for p in tmp_path.iterdir()] == ["params.yaml"]


def test_an_output_below_a_file_is_one_line_naming_the_path(tmp_path: Path) -> None:
    params = write_params(tmp_path / "params.yaml")
    (tmp_path / "data").write_text("a file where the data folder belongs", encoding="utf-8")
    src = SAMPLE / "dialogs.jsonl"
    message = one_error_line(clariedge("ingest", src, "-o", "data/seeds.parquet", "--params", params, cwd=tmp_path))
    assert message.startswith("cannot read or write data")


# --- overrides --------------------------------------------------------------------------------------------
def test_paths_on_the_command_line_replace_params_ingest_paths(tmp_path: Path) -> None:
    params = write_params(tmp_path / "params.yaml", ingest={"source": "paths", "paths": ["nowhere/"]})
    src = SAMPLE / "dialogs.jsonl"
    without = clariedge("ingest", "-o", "seeds.parquet", "--params", params, cwd=tmp_path)
    assert one_error_line(without) == "nowhere: no such file or folder"
    proc = clariedge("ingest", src, "-o", "seeds.parquet", "--params", params, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    seeds = read_records(tmp_path / "seeds.parquet", SeedTurn)
    in_file = {json.loads(line)["conversation_id"] for line in src.read_text(encoding="utf-8").splitlines()}
    assert seeds and {s.conversation_id for s in seeds} == in_file
    assert {Path(s.source.path).name for s in seeds} == {"dialogs.jsonl"}


def test_no_strict_on_the_command_line_overrides_params_strict(tmp_path: Path) -> None:
    params = write_params(tmp_path / "params.yaml", ingest={"strict": True})
    src = tmp_path / "mixed.jsonl"
    good = (SAMPLE / "dialogs.jsonl").read_text(encoding="utf-8").splitlines()[0]
    src.write_text(good + "\n" + '{"conversation_id": "broken", "turns": "not a list"}\n', encoding="utf-8")
    strict = clariedge("ingest", src, "-o", "strict.parquet", "--params", params, cwd=tmp_path)
    assert strict.returncode == 1 and "Traceback" not in strict.stderr
    assert not (tmp_path / "strict.parquet").exists()
    lenient = clariedge(
        "ingest", src, "-o", "seeds.parquet", "--rejects", "rej.jsonl", "--no-strict", "--params", params, cwd=tmp_path
    )
    assert lenient.returncode == 0, lenient.stderr
    seeds = read_records(tmp_path / "seeds.parquet", SeedTurn)
    assert {s.conversation_id for s in seeds} == {json.loads(good)["conversation_id"]}
    rejected = [json.loads(line) for line in (tmp_path / "rej.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rejected) == 1 and "mixed.jsonl:2" in rejected[0]["where"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(
            ["synthesize", "s.parquet", "-o", "c.parquet", "--cache", "llm.sqlite", "--backend", "gpt"],
            "--backend 'gpt': expected construct, openai or transformers",
            id="synthesize-backend",
        ),
        pytest.param(
            ["clean", "r.parquet", "-o", "c.parquet", "--issues", "i.csv", "--report", "r.md"]
            + ["--confusion", "c.png", "--policy", "bogus"],
            "--policy: policy: Input should be 'drop', 'relabel' or 'send_back' (got 'bogus')",
            id="clean-policy",
        ),
        pytest.param(
            ["review", "run", "f.parquet", "-o", "r.parquet", "--mode", "bogus"],
            "--mode 'bogus': expected none, argilla or import",
            id="review-mode",
        ),
        pytest.param(
            ["benchmark", "--train-split", "t.parquet", "--adapter", "a", "--base", "b", "--metrics", "m.json"]
            + ["--predictions", "p.jsonl", "--plot", "p.png", "--set", "realdev"],
            "--set 'realdev': expected NAME=PATH",
            id="benchmark-set",
        ),
    ],
)
def test_a_bad_override_is_one_line_naming_the_option(tmp_path: Path, args: list[str], expected: str) -> None:
    params = write_params(tmp_path / "params.yaml")
    assert one_error_line(clariedge(*args, "--params", params, cwd=tmp_path)) == expected
    assert [p.name for p in tmp_path.iterdir()] == ["params.yaml"]
