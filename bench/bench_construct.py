"""Benchmark: the offline `construct` backend on the full shared MTRAG data -> rows/s (prints numbers).

Run: `.venv/bin/python -m bench.bench_construct [MTRAG_DIR]` (default `../shared/data/mtrag`). Skips with a
message where the data is absent. The shallow-separability report is timed separately, since it fits
sklearn models and is not part of the construction itself.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from clariedge import ingest
from clariedge.config import load_section
from clariedge.construct import ConstructConfig, construct, shallow_separability


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else root.parent / "shared" / "data" / "mtrag"
    if not data.exists():
        print(f"skip: MTRAG data not found at {data}")
        return 0
    seeds, _, _ = ingest.transform([data])
    cfg = load_section("params.yaml", "synthesize.construct", ConstructConfig, separability=False)
    runs = []
    for i in range(3):
        t0 = time.perf_counter()
        rows, rejects, stats = construct(seeds, cfg, rng=random.Random(i))
        runs.append(time.perf_counter() - t0)
    best = min(runs)
    t0 = time.perf_counter()
    report = shallow_separability(rows)
    t_sep = time.perf_counter() - t0
    print(f"construct on {data.name}: {len(seeds)} seed turns -> {len(rows)} rows ({len(rejects)} rejected)")
    print(f"  best of 3: {best:.3f} s = {len(rows) / best:,.0f} rows/s, {len(seeds) / best:,.0f} seeds/s")
    print(f"  by category: {json.dumps(stats['by_category'])}")
    print(f"  shallow separability (bag of words, last turn, grouped 5-fold AUC) in {t_sep:.1f} s:")
    print(f"    {json.dumps(report['bow_last_turn'])}")
    print(f"  length only: {json.dumps(report['length_only'])}")
    print(f"  position only: {json.dumps(report['position_only'])}")
    print(f"  passage keyword overlap only: {json.dumps(report['passage_overlap_only'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
