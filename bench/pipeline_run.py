"""Run the DVC pipeline stage by stage in a fresh copy of the project, timing each stage.

Shared by `bench/bench_pipeline.py` (default params: the numbers the README reports) and the slow
end-to-end test (a tiny params profile). A "cold" run starts from a copy of the tracked files only:
no outputs, no DVC cache, nothing from an earlier run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = f"{VENV_BIN}{os.pathsep}{e.get('PATH', '')}"
    e.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", DVC_NO_ANALYTICS="1")
    return e


def copy_project(dest: Path) -> Path:
    """Copy the files git knows (tracked + untracked-not-ignored) into `dest`, as a new git repo."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, files):
        rel = raw.decode()
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    for rel in ("dvc.lock",):  # a cold run: no lock, no outputs
        (dest / rel).unlink(missing_ok=True)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run(
        ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "copy"],
        cwd=dest,
        check=True,
    )
    return dest


def set_params(project: Path, overrides: dict[str, Any]) -> None:
    """Apply dotted-key overrides (`{"train.max_steps": 2}`) to the copy's params.yaml."""
    path = project / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    for dotted, value in overrides.items():
        node = params
        *parents, last = dotted.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def stage_names(project: Path) -> list[str]:
    out = subprocess.run(
        ["dvc", "stage", "list", "--name-only"], cwd=project, env=env(), capture_output=True, text=True, check=True
    ).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


@dataclass
class StageRun:
    stage: str
    seconds: float
    peak_rss_mb: float
    ran: bool
    output: str


def run_cmd(cmd: list[str], project: Path) -> tuple[int, float, float, str]:
    """Run `cmd`; return (exit code, wall seconds, peak RSS of the process tree in MB, output)."""
    log = project / ".bench.log"
    start = time.perf_counter()
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, cwd=project, env=env(), stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    return proc.returncode, seconds, usage.ru_maxrss / 1024, log.read_text(encoding="utf-8", errors="replace")


def repro_by_stage(project: Path) -> list[StageRun]:
    """`dvc repro --single-item` for each stage in pipeline order, so each gets its own time and RAM."""
    runs = []
    for stage in stage_names(project):
        code, seconds, rss, output = run_cmd(["dvc", "repro", "--single-item", stage], project)
        if code != 0:
            raise RuntimeError(f"stage {stage} failed (exit {code}):\n{output[-4000:]}")
        runs.append(StageRun(stage, seconds, rss, bool(ran_stages(output)), output))
    return runs


_RUNNING = re.compile(r"Running stage '([^']+)'")


def ran_stages(output: str) -> list[str]:
    return _RUNNING.findall(output)


def repro(project: Path, *args: str) -> tuple[float, str]:
    code, seconds, _, output = run_cmd(["dvc", "repro", *args], project)
    if code != 0:
        raise RuntimeError(f"dvc repro failed (exit {code}):\n{output[-4000:]}")
    return seconds, output
