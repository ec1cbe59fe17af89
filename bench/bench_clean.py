"""Benchmark of the `clean` stage: label-noise detection and cost. Prints numbers; asserts nothing.

1. Noise detection: rows built by the offline construct backend from real MTRAG dialogs (labels right
   by construction); flip `needs_clarification` on 5%, 10%, 20% of them (schema-valid flips, as a bad
   label source would make) and report the precision and recall of the flagged rows, with the
   default flag cap (`max_flag_fraction`) and without it.
2. Cost: time and peak memory of `clean.run` (read, features, grouped CV, cleanlab, Datalab, reports)
   on 10,000 rows made from the real ones by copying conversations under new ids. Their texts repeat,
   so the features come from the embedding cache; the cold embedding throughput is measured apart.

Usage: .venv/bin/python -m bench.bench_clean [--mtrag ../shared/data/mtrag] [--rows 10000]
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def real_rows(mtrag: Path, seed: int):
    from clariedge.config import load_section
    from clariedge.construct import ConstructConfig, construct
    from clariedge.ingest import transform

    seeds, _, _ = transform([mtrag])
    rows, _, _ = construct(
        seeds, load_section("params.yaml", "synthesize.construct", ConstructConfig), rng=random.Random(seed)
    )
    return rows


def noise_detection(rows, features, fractions, seed: int, cfg) -> None:
    from clariedge.clean import transform
    from tests.make_examples import plant_flips

    print(f"\n## noise detection ({len(rows)} construct rows from MTRAG, label needs_clarification)")
    print("| flips | cap | flagged | precision | recall | cv accuracy |")
    print("| --- | --- | --- | --- | --- | --- |")
    for frac in fractions:
        noisy, flipped = plant_flips(rows, frac, seed=seed)
        for cap in (cfg.max_flag_fraction, 1.0):
            res = transform(
                noisy, cfg.model_copy(update={"max_flag_fraction": cap}), rng=random.Random(seed), features=features
            )
            found = {r["id"] for r in res.issues if r["flagged"]}
            tp = len(found & flipped)
            p, r = tp / max(1, len(found)), tp / max(1, len(flipped))
            print(f"| {frac:.0%} | {cap} | {len(found)} | {p:.3f} | {r:.3f} | {res.stats['cv_accuracy']} |")


def scale_rows(rows, n: int):
    """n rows: copies of the real conversations under new conversation ids (texts unchanged)."""
    out, k = [], 0
    while len(out) < n:
        for ex in rows:
            if len(out) >= n:
                break
            data = ex.model_dump()
            data.update(conversation_id=f"{ex.conversation_id}#{k}", id="")
            out.append(type(ex).model_validate(data))
        k += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mtrag", type=Path, default=ROOT.parent / "shared" / "data" / "mtrag")
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--cache", type=Path, default=ROOT / "cache" / "embeddings_bench.sqlite")
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml", help="clean: section used")
    args = ap.parse_args()
    if not args.mtrag.exists():
        sys.exit(f"{args.mtrag}: MTRAG data not found (pass --mtrag)")

    from clariedge.clean import CleanConfig, build_features, feature_texts, run
    from clariedge.config import load_section
    from clariedge.embed import embed
    from clariedge.io import write_records

    rows = real_rows(args.mtrag, args.seed)
    t = time.perf_counter()
    features = build_features(rows, args.cache)
    print(f"features for {len(rows)} rows: {time.perf_counter() - t:.1f} s (cache {args.cache})")

    # cold embedding throughput, on a fresh cache
    texts = sorted({t for ex in rows[:100] for t in feature_texts(ex) if t})
    t = time.perf_counter()
    embed(texts, cache_path=None)
    dt = time.perf_counter() - t
    print(f"cold MiniLM embedding: {len(texts)} texts in {dt:.1f} s = {len(texts) / dt:.0f} texts/s")

    cfg = load_section(args.params, "clean", CleanConfig)
    print(f"clean config: {cfg.model_dump()}")
    noise_detection(rows, features, (0.05, 0.10, 0.20), args.seed, cfg)

    big = scale_rows(rows, args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "reviewed.parquet"
        write_records(src, big)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        tracemalloc.start()
        t = time.perf_counter()
        stats = run(
            src,
            Path(tmp) / "cleaned.parquet",
            cfg,
            seed=args.seed,
            issues_csv=Path(tmp) / "issues.csv",
            issues_md=Path(tmp) / "issues.md",
            confusion_png=Path(tmp) / "confusion.png",
            stats_path=Path(tmp) / "clean.json",
            cache_path=args.cache,
        )
        wall = time.perf_counter() - t
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"\n## cost: clean.run on {len(big)} rows ({len({r.conversation_id for r in big})} conversations)")
    print(f"wall {wall:.1f} s (features {stats['seconds_features']} s from cache, grouped CV {stats['seconds_cv']} s)")
    print(
        f"peak traced Python/numpy memory {peak / 2**20:.0f} MiB; process max RSS {rss1 / 1024:.0f} MiB "
        f"(before the run {rss0 / 1024:.0f} MiB)"
    )
    print(f"flagged {stats['flagged']}, rows out {stats['rows_out']}, cv accuracy {stats['cv_accuracy']}")


if __name__ == "__main__":
    main()
