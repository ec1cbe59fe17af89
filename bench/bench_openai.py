"""Throughput of the `openai` backend against a loopback OpenAI-compatible server answering after 200 ms.

The server (tests/openai_stub.py) runs in its own process, as a real one would. For each concurrency
(1, 4, 16, 64) the bench runs fresh jobs (a new cache) through `clariedge.llm.Runner`, prints calls/s
and the speedup over concurrency 1 (goal: >= 12x at 16), then re-runs the last batch with the warm
cache and prints how many calls the server received (goal: 0).

    .venv/bin/python -m bench.bench_openai [--latency 0.2] [--levels 1 4 16 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from clariedge.config import load_section
from clariedge.llm import Job, LLMCache, OpenAIBackend, OpenAIConfig, Runner
from clariedge.prompts import get_prompt

STUB = Path(__file__).resolve().parents[1] / "tests" / "openai_stub.py"
PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


class Server:
    """tests/openai_stub.py in a child process; `hits()` reads its request count."""

    def __init__(self, latency: float, tmp: Path) -> None:
        port_file = tmp / "port"
        self.proc = subprocess.Popen(
            [sys.executable, str(STUB), "--port", "0", "--latency", str(latency), "--port-file", str(port_file)],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the stub server did not start")
            time.sleep(0.05)
        self.base_url = f"http://127.0.0.1:{int(port_file.read_text())}/v1"

    def hits(self) -> int:
        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/stats", timeout=5) as r:
            return int(json.load(r)["hits"])

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def jobs_for(n: int, tag: str) -> list[Job]:
    prompt = get_prompt("clear.v1")
    return [
        Job(
            f"{tag}-{i}",
            prompt,
            {**prompt.sample_inputs, "last_turn": f"when was the eiffel tower built ({tag} {i})"},
            i,
        )
        for i in range(n)
    ]


def run(stub: Server, cache: LLMCache, jobs: list[Job], concurrency: int) -> tuple[float, int, int]:
    endpoint = load_section(
        PARAMS, "synthesize.openai", OpenAIConfig, base_url=stub.base_url, model="bench", timeout_s=30
    )
    backend = OpenAIBackend(endpoint, "bench-key")
    runner = Runner(backend, cache, concurrency=concurrency)
    before = stub.hits()
    t0 = time.perf_counter()
    outs = runner.run_many(jobs)
    elapsed = time.perf_counter() - t0
    assert all(o.ok for o in outs), [o.detail for o in outs if not o.ok][:3]
    return elapsed, stub.hits() - before, runner.usage.cache_hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--calls-per-slot", type=int, default=8, help="calls per concurrency slot (min 16 calls)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stub = Server(args.latency, Path(tmp))
        try:
            _bench(stub, Path(tmp), args)
        finally:
            stub.close()


def _bench(stub: Server, tmp: Path, args: argparse.Namespace) -> None:
    rows = []
    run(stub, LLMCache(tmp / "warmup.sqlite"), jobs_for(2, "warmup"), 2)  # import + connect once
    base = None
    last: tuple[LLMCache, list[Job], int] | None = None
    print(f"loopback server answering after {args.latency * 1000:.0f} ms")
    print(f"{'concurrency':>11} {'calls':>6} {'seconds':>8} {'calls/s':>8} {'speedup':>8}")
    for c in args.levels:
        n = max(16, args.calls_per_slot * c)
        cache = LLMCache(tmp / f"c{c}.sqlite")
        jobs = jobs_for(n, f"c{c}")
        elapsed, hits, _ = run(stub, cache, jobs, c)
        assert hits == n
        rate = n / elapsed
        base = base or rate
        rows.append((c, n, elapsed, rate, rate / base))
        print(f"{c:>11} {n:>6} {elapsed:>8.2f} {rate:>8.1f} {rate / base:>7.1f}x", flush=True)
        last = (cache, jobs, c)
    assert last is not None
    cache, jobs, c = last
    elapsed, hits, cache_hits = run(stub, cache, jobs, c)
    print(
        f"warm-cache re-run of {len(jobs)} jobs: {hits} calls to the server, {cache_hits} cache hits, {elapsed:.2f} s"
    )
    at16 = next((r[4] for r in rows if r[0] == 16), None)
    if at16 is not None:
        print(f"speedup at 16: {at16:.1f}x (goal >= 12x): {'OK' if at16 >= 12 else 'BELOW GOAL'}")


if __name__ == "__main__":
    main()
