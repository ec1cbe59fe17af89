"""The resilience suite through real processes: every bad input of the corpus (one test id per case) run by the
`clariedge` console script, `kill -9` of synthesis against the loopback OpenAI server, a `dvc repro` and a scan
for the API key, and Argilla stopped mid-push (marked `argilla`). bench/resilience.py prints the same figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from resilience import corpus as C
from resilience import scenarios as S


@pytest.fixture(scope="session")
def pools() -> C.Pools:
    return C.make_pools()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("resilience")


def test_the_corpus_spans_twenty_kinds_and_every_data_stage() -> None:
    kinds = {c.kind for c in C.CASES}
    assert len(kinds) >= 20, sorted(kinds)
    assert {c.stage for c in C.CASES} == {"ingest", "synthesize", "filter", "review", "clean", "publish"}
    assert len({c.id for c in C.CASES}) == len(C.CASES)
    assert any(c.fatal for c in C.CASES) and any(not c.fatal for c in C.CASES)


@pytest.mark.parametrize("case", C.CASES, ids=[c.id for c in C.CASES])
def test_bad_input(case: C.Case, pools: C.Pools, work: Path) -> None:
    r = C.run_case(case, work / "corpus", pools)
    logs = work / "corpus" / case.id
    assert not r.traceback, (logs / "stderr.log").read_text()[-3000:]
    assert r.ok, f"{r.problems}; said: {r.message!r}; stderr: {(logs / 'stderr.log').read_text()[-1500:]}"
    assert r.good_rows > 0, "the case mixes in good rows (or an output that existed before)"


def test_the_checks_catch_what_they_claim(pools: C.Pools, work: Path) -> None:
    """A case whose expectations are wrong must fail: the runner really reads exit codes, places and rows."""
    real = next(c for c in C.CASES if c.id == "ingest-malformed-jsonl")

    def wrong_place(d: Path, p: C.Pools, stack) -> C.Setup:
        s = real.build(d, p, stack)
        s.place = ["in.jsonl:3"]  # the bad line is line 2
        s.good = s.good | {"never-there::1"}
        return s

    r = C.run_case(C.Case("selfcheck", "ingest", "x", False, wrong_place), work / "selfcheck", pools)
    assert not r.ok and r.lost == 1 and not r.place_named


@pytest.fixture(scope="module")
def killed_run(pools: C.Pools, work: Path) -> dict:
    return S.kill9_resume(work, pools)


def test_kill9_of_synthesis_respends_no_cached_call(killed_run: dict) -> None:
    k = killed_run
    assert k["killed"] and not k["output_after_kill"], k
    assert 0 < k["cached_before_rerun"] < k["jobs"], k
    assert k["cached_before_rerun"] >= k["answered_before_kill"] - 2  # at most the in-flight answers are lost
    assert k["rerun_exit"] == 0 and not k["traceback"], Path(k["dir"], "logs", "run2.log").read_text()[-2000:]
    assert k["hits_on_rerun"] == k["jobs"] - k["cached_before_rerun"], k
    assert k["respent"] == 0 and k["cache_hits_on_rerun"] == k["cached_before_rerun"]
    assert k["rows_out"] == k["jobs"]


def test_no_api_key_in_any_output_log_lock_or_metrics_file(killed_run: dict, work: Path) -> None:
    dvc = S.dvc_repro_with_key(work)
    assert dvc["exit"] == 0, Path(dvc["dir"], "logs", "dvc_repro.log").read_text()[-3000:]
    assert dvc["dvc_lock"] and dvc["requests"] > 0
    assert dvc["key_sent"] and killed_run["key_sent"], "the key must really be in use for the scan to mean anything"
    scan = S.key_scan([Path(killed_run["dir"]), Path(dvc["dir"])])
    assert scan["leaks"] == 0, scan["leaked"]
    for kind in ("dvc.lock", "log", "metrics", "llm cache", "rejects", "dvc cache/tmp"):
        assert scan["by_kind"].get(kind, 0) > 0, f"nothing of kind {kind!r} was scanned: {scan['by_kind']}"


def test_the_key_scan_finds_a_planted_key(tmp_path: Path) -> None:
    import base64

    (tmp_path / "a.log").write_text("nothing here\n")
    assert S.key_scan([tmp_path])["leaks"] == 0
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_bytes(b'{"auth": "' + base64.b64encode(C.SECRET.encode()) + b'"}')
    (tmp_path / "c.bin").write_bytes(b"\x00" + C.SECRET.encode() + b"\x00")
    scan = S.key_scan([tmp_path])
    assert scan["leaks"] == 2 and scan["files"] == 3


@pytest.mark.argilla
def test_argilla_stopped_mid_push_then_rerun_has_no_duplicates(work: Path) -> None:
    why = S.argilla_available()
    if why:
        pytest.skip(why)
    a = S.argilla_stop_mid_push(work)
    assert a["interrupted"] and "stopped after 50 of 300 records" in a["error"], a
    assert a["rerun_exit"] == 0 and not a["traceback"], Path(work, "argilla", "rerun.log").read_text()[-2000:]
    assert (a["rerun_skipped_unchanged"], a["rerun_sent"]) == (50, 250), a
    assert a["on_server"] == 300 and a["duplicates"] == 0 and a["missing"] == 0, a
