"""Process-level resilience scenarios, each with real processes and a real server on loopback.

- `kill9_resume`: `clariedge synthesize` (openai backend) against the loopback OpenAI stub is killed
  with SIGKILL half-way; the re-run must pay only for the calls the first run had not finished
  (counted at the server: re-spent = hits on the re-run - (jobs - cached answers)).
- `dvc_repro_with_key`: `dvc repro synthesize` of the project's own dvc.yaml, in a copy of the
  project, with the openai backend pointed at the stub and a recognisable key in the environment.
- `key_scan`: every file under the given folders (outputs, rejects, metrics, LLM cache, logs,
  dvc.lock, DVC's cache and tmp) is searched for the key (as text and in base64).
- `argilla_stop_mid_push`: the live Argilla server (scripts/argilla.sh) is stopped after the first
  batch of a push and started again; `clariedge review run --mode argilla` then completes the push;
  the server must hold every record exactly once.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from clariedge.io import write_records

from .corpus import ROOT, SECRET, Pools, base_params, cli_command, deep_merge


def _stub_params(stub_url: str, **synth: Any) -> dict[str, Any]:
    over = {
        "synthesize": {
            "backend": "openai",
            "openai": {"base_url": stub_url, "model": "stub-model", "concurrency": 2, "backoff_base_s": 0.01},
            **synth,
        }
    }
    return deep_merge(base_params(), over)


def _cached(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT COUNT(*) FROM calls").fetchone()[0])


# ---------------------------------------------------------------------------------------------
# kill -9 of synthesis, then a re-run
# ---------------------------------------------------------------------------------------------
def kill9_resume(workdir: Path, pools: Pools, *, max_seeds: int = 10, kill_after: int = 8) -> dict[str, Any]:
    from tests.openai_stub import OpenAIStub

    d = workdir / "kill9"
    (d / "logs").mkdir(parents=True, exist_ok=True)
    write_records(d / "seeds.parquet", pools.seeds)
    args = ["synthesize", "seeds.parquet", "-o", "data/candidates.parquet", "--rejects", "data/rejects.jsonl",
            "--stats", "metrics/synthesize.json", "--cache", "cache/llm.sqlite", "--no-progress"]  # fmt: skip
    env = {**os.environ, "OPENAI_API_KEY": SECRET}
    out: dict[str, Any] = {}
    with OpenAIStub(latency=0.25) as stub:
        (d / "params.yaml").write_text(yaml.safe_dump(_stub_params(stub.base_url, max_seeds=max_seeds)))
        with (d / "logs" / "run1.log").open("w") as log:
            proc = subprocess.Popen(cli_command() + args, cwd=d, env=env, stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 120
            while stub.completed < kill_after and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.02)
            finished_early = proc.poll() is not None
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        out["killed"] = not finished_early and proc.returncode == -signal.SIGKILL
        out["answered_before_kill"] = stub.completed
        out["cached_before_rerun"] = cached = _cached(d / "cache" / "llm.sqlite")
        out["output_after_kill"] = (d / "data" / "candidates.parquet").exists()
        stub.reset_counts()
        with (d / "logs" / "run2.log").open("w") as log:  # verbose: debug logs must not hold the key either
            rc = subprocess.call([*cli_command(), "-v", *args], cwd=d, env=env, stdout=log, stderr=subprocess.STDOUT)
        out["rerun_exit"] = rc
        stats = json.loads((d / "metrics" / "synthesize.json").read_text()) if rc == 0 else {}
        jobs = stats.get("jobs", -1)
        out["jobs"] = jobs
        out["hits_on_rerun"] = stub.hits
        out["unfinished_in_first_run"] = jobs - cached
        out["respent"] = stub.hits - (jobs - cached)
        out["rows_out"] = stats.get("rows_out")
        out["cache_hits_on_rerun"] = stats.get("llm", {}).get("cache_hits")
        out["key_sent"] = set(stub.auth_headers) == {f"Bearer {SECRET}"}
        out["traceback"] = any("Traceback" in (d / "logs" / f).read_text() for f in ("run1.log", "run2.log"))
    out["dir"] = str(d)
    return out


# ---------------------------------------------------------------------------------------------
# dvc repro with the key in the environment
# ---------------------------------------------------------------------------------------------
PROJECT_PARTS = (
    "dvc.yaml",
    "pipeline",
    "annotation",
    "training",
    "generation_prompts",
    "data/sample",
    "data/mtrag",
    "tests/data/gold_labels.jsonl",
)


def dvc_repro_with_key(workdir: Path, *, max_seeds: int = 6) -> dict[str, Any]:
    """`dvc repro synthesize` (ingest + synthesize of the project's dvc.yaml) in a copy of the project."""
    from tests.openai_stub import OpenAIStub

    d = workdir / "dvc_repro"
    d.mkdir(parents=True, exist_ok=True)
    for part in PROJECT_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, d / part, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        else:
            (d / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, d / part)
    venv_bin = Path(cli_command()[0]).parent if len(cli_command()) == 1 else None
    dvc = str(venv_bin / "dvc") if venv_bin and (venv_bin / "dvc").exists() else "dvc"
    env = {**os.environ, "OPENAI_API_KEY": SECRET, "DVC_NO_ANALYTICS": "1"}
    if venv_bin:
        env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    out: dict[str, Any] = {}
    with OpenAIStub() as stub:
        (d / "params.yaml").write_text(yaml.safe_dump(_stub_params(stub.base_url, max_seeds=max_seeds)))
        (d / "logs").mkdir(exist_ok=True)
        subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=d, env=env, check=True, capture_output=True)
        with (d / "logs" / "dvc_repro.log").open("w") as log:
            rc = subprocess.call([dvc, "repro", "synthesize"], cwd=d, env=env, stdout=log, stderr=subprocess.STDOUT)
        out["exit"] = rc
        out["requests"] = stub.hits
        out["key_sent"] = bool(stub.auth_headers) and set(stub.auth_headers) == {f"Bearer {SECRET}"}
    out["dvc_lock"] = (d / "dvc.lock").exists()
    out["dir"] = str(d)
    return out


# ---------------------------------------------------------------------------------------------
# the scan
# ---------------------------------------------------------------------------------------------
def key_scan(folders: list[Path], secret: str = SECRET) -> dict[str, Any]:
    """Search every file under `folders` for the key, as bytes and base64 (an Authorization header
    dumped in some encoded form would still show)."""
    needles = [secret.encode(), base64.b64encode(secret.encode()), secret.encode("utf-16-le")]
    files = leaks = 0
    leaked: list[str] = []
    kinds: dict[str, int] = {}
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            files += 1
            kind = _kind(path)
            kinds[kind] = kinds.get(kind, 0) + 1
            data = path.read_bytes()
            if any(n in data for n in needles):
                leaks += 1
                leaked.append(str(path))
    return {"files": files, "leaks": leaks, "leaked": leaked, "by_kind": dict(sorted(kinds.items()))}


def _kind(path: Path) -> str:
    parts = path.parts
    if path.name == "dvc.lock":
        return "dvc.lock"
    if ".dvc" in parts:
        return "dvc cache/tmp"
    if path.suffix == ".log":
        return "log"
    if "metrics" in parts:
        return "metrics"
    if path.suffix in (".sqlite", ".sqlite-wal", ".sqlite-shm"):
        return "llm cache"
    if "rejects" in path.name:
        return "rejects"
    return "output/other"


# ---------------------------------------------------------------------------------------------
# Argilla stopped mid-push
# ---------------------------------------------------------------------------------------------
ARGILLA_URL = os.environ.get("ARGILLA_API_URL", "http://127.0.0.1:6900").rstrip("/")
ARGILLA_KEY = os.environ.get("ARGILLA_API_KEY", "owner.apikey")


def argilla_available() -> str | None:
    """None when the local server answers and can be stopped and restarted by scripts/argilla.sh, else why not."""
    import httpx

    try:
        r = httpx.get(f"{ARGILLA_URL}/api/v1/me", headers={"X-Argilla-Api-Key": ARGILLA_KEY}, timeout=5)
    except httpx.HTTPError as err:
        return f"no server at {ARGILLA_URL} ({err.__class__.__name__})"
    if r.status_code != 200:
        return f"server at {ARGILLA_URL} refuses the key (HTTP {r.status_code})"
    if not (ROOT / ".argilla" / "run" / "server.pid").exists():
        return "the server was not started by scripts/argilla.sh (cannot stop and restart it)"
    return None


def argilla_stop_mid_push(workdir: Path, n: int = 300, batch: int = 50) -> dict[str, Any]:
    import httpx
    from review_examples import make_examples

    from clariedge.annotation import review as R

    why = argilla_available()
    if why:
        return {"skipped": why}
    d = workdir / "argilla"
    d.mkdir(parents=True, exist_ok=True)
    script = ["bash", str(ROOT / "scripts" / "argilla.sh")]
    name = f"resilience-{uuid.uuid4().hex[:8]}"
    over = {"mode": "argilla", "dataset": name, "api_url": ARGILLA_URL, "api_key": ARGILLA_KEY, "batch_size": batch}
    cfg = R.ReviewConfig.model_validate({**base_params()["review"], **over})
    exs = make_examples(n)
    out: dict[str, Any] = {"records": n, "batch_size": batch}

    def stop_after_first(sent: int, total: int) -> None:
        if sent == batch:
            subprocess.run([*script, "down", "server"], check=True, capture_output=True)

    try:
        try:
            R.push(exs, cfg, progress=False, on_batch=stop_after_first)
            out["interrupted"] = False
        except R.ReviewError as err:
            out["interrupted"] = True
            out["error"] = str(err)[:200]
        finally:
            subprocess.run([*script, "up"], check=True, capture_output=True)
        write_records(d / "filtered.parquet", exs)
        params = deep_merge(base_params(), {"review": {"mode": "argilla", "dataset": name, "batch_size": batch}})
        (d / "params.yaml").write_text(yaml.safe_dump(params))
        env = {**os.environ, "ARGILLA_API_URL": ARGILLA_URL, "ARGILLA_API_KEY": ARGILLA_KEY}
        proc = subprocess.run(
            [*cli_command(), "review", "run", "filtered.parquet", "-o", "reviewed.parquet", "--stats", "review.json"],
            cwd=d, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        (d / "rerun.log").write_text(proc.stdout + proc.stderr)
        out["rerun_exit"] = proc.returncode
        out["traceback"] = "Traceback" in proc.stdout + proc.stderr
        stats = json.loads((d / "review.json").read_text()) if proc.returncode == 0 else {}
        out["rerun_sent"] = stats.get("push_sent")
        out["rerun_skipped_unchanged"] = stats.get("push_skipped_unchanged")
        conn = R.Connection.open(ARGILLA_URL, ARGILLA_KEY)
        ds = conn.find_dataset(cfg.dataset_name, "default")
        records = conn.list_records(ds["id"]) if ds else []
        ids = [r.get("external_id") for r in records]
        out["on_server"] = len(ids)
        out["duplicates"] = len(ids) - len(set(ids))
        out["missing"] = len({e.id for e in exs} - set(ids))
    finally:
        owner = httpx.Client(base_url=ARGILLA_URL, headers={"X-Argilla-Api-Key": ARGILLA_KEY}, timeout=30)
        for ds in owner.get("/api/v1/me/datasets").json().get("items", []):
            if ds["name"].startswith(name):
                owner.delete(f"/api/v1/datasets/{ds['id']}")
    return out
