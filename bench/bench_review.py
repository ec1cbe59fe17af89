"""Benchmark: push throughput (records/s) for 2,000 records and pull time, against a live Argilla server.

Needs a running server (`scripts/argilla.sh up`); URL and key from ARGILLA_API_URL / ARGILLA_API_KEY
(defaults: the local stack). Uses a throwaway dataset, deleted at the end. Prints the numbers; asserts
nothing about speed. Run: `.venv/bin/python -m bench.bench_review [--records 2000] [--batch-size 100]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

from clariedge.annotation import review as R  # noqa: E402
from clariedge.config import load_section  # noqa: E402
from tests.review_examples import make_examples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--keep", action="store_true", help="keep the benchmark dataset")
    args = ap.parse_args()
    url = os.environ.get("ARGILLA_API_URL", "http://127.0.0.1:6900")
    key = os.environ.get("ARGILLA_API_KEY", "owner.apikey")
    cfg = load_section(
        Path(__file__).resolve().parents[1] / "params.yaml",
        "review",
        R.ReviewConfig,
        mode="argilla",
        dataset=f"bench-{uuid.uuid4().hex[:6]}",
        api_url=url,
        api_key=key,
        batch_size=args.batch_size,
    )
    try:
        R.Connection.open(url, key).close()
    except R.ReviewError as err:
        print(f"bench_review: skipped: {err}")
        return 0
    exs = make_examples(args.records)

    t0 = time.perf_counter()
    stats = R.push(exs, cfg, progress=False)
    push_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = R.push(exs, cfg, progress=False)
    repush_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    snapshot = R.pull_snapshot(cfg)
    pull_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    reviewed, _, _ = R.transform(exs, snapshot, cfg)
    apply_s = time.perf_counter() - t0

    assert stats["created"] == args.records and again["skipped_unchanged"] == args.records
    assert len(snapshot) == args.records and len(reviewed) == args.records
    print(f"records:            {args.records} (batch size {args.batch_size}, dataset created in the push)")
    print(f"push:               {push_s:.2f} s  = {args.records / push_s:.0f} records/s")
    print(f"re-push (no-op):    {repush_s:.2f} s  (all {again['skipped_unchanged']} unchanged, skipped by hash)")
    print(f"pull (snapshot):    {pull_s:.2f} s  = {args.records / pull_s:.0f} records/s")
    print(f"apply (transform):  {apply_s:.3f} s")
    if not args.keep:
        conn = R.Connection.open(url, key)
        ds = conn.find_dataset(cfg.dataset_name, cfg.workspace)
        if ds:
            conn.request("DELETE", f"/api/v1/datasets/{ds['id']}")
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
