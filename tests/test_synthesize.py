"""The synthesize stage: the LLM path against the loopback OpenAI server (all categories, both settings,
provenance that re-renders to the same hash, rejects with reasons, seeded and byte-identical), a run
killed with SIGKILL half-way resumes from the cache without paying any finished call twice, the API key
never reaches a file, and the construct backend runs through the same stage wrapper."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import params_section, write_params
from openai_stub import Behaviour, OpenAIStub

from clariedge import ingest, synthesize
from clariedge.io import read_records
from clariedge.prompts import get_prompt, messages_hash
from clariedge.schema import CATEGORIES, Example, SeedTurn
from clariedge.synthesize import SynthesizeConfig

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-test-SECRET-do-not-write-4242"


@pytest.fixture(scope="module")
def seeds_path(tmp_path_factory: pytest.TempPathFactory, sample_dir: Path) -> Path:
    path = tmp_path_factory.mktemp("seeds") / "seeds.parquet"
    ingest.run([sample_dir], path)
    return path


@pytest.fixture
def stub():
    with OpenAIStub() as s:
        yield s


def _cfg(stub: OpenAIStub, **kw) -> SynthesizeConfig:
    openai = {"base_url": stub.base_url, "model": "stub-model", "backoff_base_s": 0.01, "max_retries": 1}
    openai.update(kw.pop("openai", {}))
    return params_section(
        "synthesize", backend="openai", openai=params_section("synthesize.openai", **openai), **{"max_seeds": 12, **kw}
    )


def _run(seeds_path: Path, out: Path, cfg: SynthesizeConfig, seed: int = 7) -> dict:
    return synthesize.run(
        seeds_path,
        out / "candidates.parquet",
        out / "rejects.jsonl",
        out / "stats.json",
        cfg,
        seed=seed,
        cache_path=out / "llm.sqlite",
        api_key=SECRET,
        progress=False,
    )


def test_llm_path_makes_all_categories_with_provenance(stub: OpenAIStub, seeds_path: Path, tmp_path: Path) -> None:
    stats = _run(seeds_path, tmp_path / "a", _cfg(stub))
    rows = read_records(tmp_path / "a" / "candidates.parquet", Example)
    seeds = {s.id: s for s in read_records(seeds_path, SeedTurn)}
    assert {r.category for r in rows} == set(CATEGORIES)
    assert {r.setting for r in rows} == {"pre_retrieval", "post_retrieval"}
    assert stats["rows_out"] == len(rows) == stats["jobs"] - stats["rejected"]
    assert stats["llm"]["requests"] == stub.hits == stats["jobs"]
    assert stats["seeds_used"] == 12 and stats["by_category"]["clear"] == 12
    cfg = _cfg(stub)
    for r in rows:
        p = r.provenance
        prompt = get_prompt(f"{r.category}.v1")
        assert (p.generator, p.model, p.prompt_id, p.prompt_version) == ("openai", "stub-model", r.category, "v1")
        drawn = json.loads(p.template)
        assert drawn["setting"] == r.setting and set(drawn) == {"setting", "variant", "seed"}
        seed = seeds[p.seed_id]
        inputs = {k: v for k, v in synthesize.prompt_inputs(seed, r.setting, cfg).items() if k in prompt.inputs}
        assert p.prompt_hash == messages_hash(prompt.render(inputs)), "prompt_hash re-renders from the row"
        answer = prompt.few_shot[0].output  # what the stub answers
        assert r.last_turn == answer["turn"]
        assert r.messages[:-1] == seed.messages[:-1]
        assert r.documents == (seed.documents if r.setting == "post_retrieval" else [])
        if r.category in ("ambiguous_dialog", "ambiguous_documents"):
            assert r.clarification == answer["clarification"] and r.interpretations == answer["interpretations"]
        if r.category == "hard_negative":
            assert r.resolution == answer["resolution"]
    assert stats["prompts"]["clear.v1"] == get_prompt("clear.v1").file_hash
    # same inputs + params -> byte-identical outputs (fresh cache, same answers)
    _run(seeds_path, tmp_path / "b", _cfg(stub))
    for name in ("candidates.parquet", "rejects.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    # another seed draws other seed turns
    other = _run(seeds_path, tmp_path / "c", _cfg(stub), seed=8)
    picked = {r.provenance.seed_id for r in read_records(tmp_path / "c" / "candidates.parquet", Example)}
    assert other["seeds_used"] == 12 and picked != {r.provenance.seed_id for r in rows}


def test_failed_jobs_become_rejects_with_reasons(stub: OpenAIStub, seeds_path: Path, tmp_path: Path) -> None:
    def rule(n: int, body: dict) -> Behaviour | None:
        system = body["messages"][0]["content"]
        if "HARD NEGATIVE" in system:
            return Behaviour.invalid('{"turn": "it?", "resolution": "x"}')
        if "retrieved passages admit" in system:
            return Behaviour.server_error(500)
        return None

    stub.rule = rule
    stats = _run(seeds_path, tmp_path, _cfg(stub, max_invalid_retries=1, max_seeds=6))
    rejects = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    by_reason: dict[str, list[dict]] = {}
    for r in rejects:
        by_reason.setdefault(r["reason"], []).append(r)
    assert set(by_reason) == {"schema_mismatch", "llm_server_error"}
    assert len(by_reason["schema_mismatch"]) == 6 and len(by_reason["llm_server_error"]) == 6
    bad = by_reason["schema_mismatch"][0]
    assert "/hard_negative/" in bad["where"] and "$.evidence: required" in bad["detail"]
    assert '"output": "{\\"turn\\": \\"it?\\"' in bad["raw"]
    assert "HTTP 500" in by_reason["llm_server_error"][0]["detail"]
    assert stats["dropped_schema_mismatch"] == 6 and stats["dropped_llm_server_error"] == 6
    assert stats["by_category"]["hard_negative"] == 0 and stats["by_category"]["ambiguous_documents"] == 0
    assert stats["rows_out"] + stats["rejected"] == stats["jobs"]
    assert stats["llm"]["invalid_schema_mismatch"] == 12  # 6 jobs x 2 attempts
    assert stats["llm"]["retries_server_error"] == 6 and stats["llm"]["failed_server_error"] == 6


def test_clarification_pass_rewords_ambiguous_rows(stub: OpenAIStub, seeds_path: Path, tmp_path: Path) -> None:
    counts = {"ambiguous_dialog": 1, "ambiguous_documents": 0, "clear": 0, "hard_negative": 0}
    stats = _run(seeds_path, tmp_path, _cfg(stub, counts=counts, clarification_pass=True, max_seeds=3))
    rows = read_records(tmp_path / "candidates.parquet", Example)
    expected = get_prompt("clarification.v1").few_shot[0].output["clarification"]
    assert len(rows) == 3 and all(r.clarification == expected for r in rows)
    assert all(json.loads(r.provenance.template)["clarification_prompt"] == "clarification.v1" for r in rows)
    assert stub.hits == 6 and set(stats["prompts"]) == {"ambiguous_dialog.v1", "clarification.v1"}


def test_construct_backend_through_the_stage(seeds_path: Path, tmp_path: Path) -> None:
    cfg = params_section("synthesize", backend="construct", max_seeds=40)
    a = synthesize.run(seeds_path, tmp_path / "a.parquet", tmp_path / "a.jsonl", tmp_path / "a.json", cfg, seed=3,
                       cache_path=tmp_path / "cache" / "llm.sqlite", progress=False)  # fmt: skip
    synthesize.run(seeds_path, tmp_path / "b.parquet", tmp_path / "b.jsonl", tmp_path / "b.json", cfg, seed=3,
                   cache_path=tmp_path / "cache" / "llm.sqlite", progress=False)  # fmt: skip
    assert a["backend"] == "construct" and a["rows_out"] > 0 and a["seeds_used"] == 40
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert (tmp_path / "cache" / "llm.sqlite").exists(), "the DVC out exists even when no LLM is called"
    assert {r.provenance.generator for r in read_records(tmp_path / "a.parquet", Example)} == {"construct"}


def _cli(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "clariedge.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _count_cached(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT COUNT(*) FROM calls").fetchone()[0])


def test_killed_run_resumes_from_cache_and_never_writes_the_key(seeds_path: Path, tmp_path: Path) -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    answered = 8  # the stub answers this many calls, then hangs: the run is surely mid-way when it is killed
    with OpenAIStub() as stub:
        stub.rule = lambda n, _body: Behaviour.hang(600) if n > answered else None
        section = params["synthesize"]
        section.update(backend="openai", max_seeds=10)
        section["openai"].update(base_url=stub.base_url, model="stub-model", concurrency=2)
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
        out = tmp_path / "out"
        args = [
            "synthesize",
            str(seeds_path),
            "-o",
            str(out / "candidates.parquet"),
            "--rejects",
            str(out / "rejects.jsonl"),
            "--stats",
            str(out / "synthesize.json"),
            "--cache",
            str(tmp_path / "cache" / "llm.sqlite"),
            "--params",
            str(tmp_path / "params.yaml"),
            "--no-progress",
        ]
        env = {**os.environ, "OPENAI_API_KEY": SECRET}
        proc = _cli(args, env)
        cache = tmp_path / "cache" / "llm.sqlite"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if stub.completed >= answered and cache.exists() and _count_cached(cache) >= answered:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run stopped before it could be killed: " + (proc.stdout.read() or "")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        cached = _count_cached(cache)
        assert not (out / "candidates.parquet").exists()
        # every answer the client received is in the cache, and nothing else
        assert cached == answered == stub.completed

        stub.rule = None
        stub.reset_counts()
        proc = _cli(args, env)
        log, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, log
        stats = json.loads((out / "synthesize.json").read_text())
        total = stats["jobs"]
        assert cached < total
        assert stub.hits == total - cached, "the resumed run pays only for the calls that had not finished"
        assert stats["llm"]["cache_hits"] == cached and stats["llm"]["requests"] == total - cached
        assert stats["rows_out"] == total
        assert set(stub.auth_headers) == {f"Bearer {SECRET}"}, "the key was sent to the server"

    files = [*out.iterdir(), *(tmp_path / "cache").iterdir()]
    assert {f.name for f in files} >= {"candidates.parquet", "rejects.jsonl", "synthesize.json", "llm.sqlite"}
    for f in files:
        assert SECRET.encode() not in f.read_bytes(), f"the API key leaked into {f.name}"
    assert SECRET not in log


def test_cli_errors_are_one_line(tmp_path: Path, seeds_path: Path) -> None:
    write_params(tmp_path / "params.yaml", synthesize={"backend": "openai", "tempreature": 1})
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "clariedge.cli",
            "synthesize",
            str(seeds_path),
            "-o",
            "candidates.parquet",
            "--cache",
            "llm.sqlite",
            "--params",
            str(tmp_path / "params.yaml"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 1
    assert "synthesize.tempreature: unknown key" in r.stderr and "Traceback" not in r.stderr


def test_plan_draws_settings_and_fractional_counts_from_the_seed(seeds_path: Path) -> None:
    import random

    seeds = read_records(seeds_path, SeedTurn)
    counts = {"ambiguous_dialog": 0, "ambiguous_documents": 1, "clear": 0.5, "hard_negative": 2}
    cfg = params_section("synthesize", backend="openai", counts=counts)
    prompts = {t: get_prompt(n) for t, n in cfg.prompts.items()}

    def plan(seed: int) -> list[str]:
        jobs, skipped = synthesize.plan_jobs(seeds, cfg, prompts, rng=random.Random(seed), base_seed=seed)
        with_docs = sum(1 for s in seeds if s.documents)
        assert skipped.get("skipped_no_documents", 0) == len(seeds) - with_docs
        return [j[0].where for j in jobs]

    a = plan(1)
    assert a == plan(1) and a != plan(2)
    clear = [w for w in a if "/clear/" in w]
    assert 0.3 * len(seeds) < len(clear) < 0.7 * len(seeds)
    assert sum("/hard_negative/" in w for w in a) == 2 * len(seeds)
    assert all("/ambiguous_documents/post_retrieval/" in w for w in a if "/ambiguous_documents/" in w)
    assert {w.split("/")[2] for w in a if "/hard_negative/" in w} == {"pre_retrieval", "post_retrieval"}
