"""Benchmark: a cold `dvc repro` of the whole pipeline on the default params (bundled sample), stage by
stage (wall time, peak RAM), then the no-op re-run. Prints a table; this is what the README reports.

Usage: .venv/bin/python -m bench.bench_pipeline [--keep DIR] [--lock-to PATH]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.pipeline_run import copy_project, ran_stages, repro, repro_by_stage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a temp folder)")
    ap.add_argument("--lock-to", type=Path, help="copy the resulting dvc.lock here")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="clariedge-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    project = copy_project(work)
    t0 = time.perf_counter()
    runs = repro_by_stage(project)
    total = time.perf_counter() - t0
    noop_s, noop_out = repro(project)
    print(f"{'stage':<26}{'wall s':>9}{'peak RAM MB':>13}")
    for r in runs:
        print(f"{r.stage:<26}{r.seconds:>9.1f}{r.peak_rss_mb:>13.0f}")
    print(f"{'cold run, total':<26}{total:>9.1f}{max(r.peak_rss_mb for r in runs):>13.0f}")
    print(f"{'no-op dvc repro':<26}{noop_s:>9.1f}   stages rerun: {len(ran_stages(noop_out))}")
    if args.lock_to:
        shutil.copy2(project / "dvc.lock", args.lock_to)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
