"""Print the resilience figures: the bad-input corpus through the real CLI, kill -9 of synthesis, Argilla stopped
mid-push, and a scan of every output, log, dvc.lock and metrics file for the API key.

    .venv/bin/python -m bench.resilience            # everything (Argilla part only when its server is up)
    .venv/bin/python -m bench.resilience --cases    # also one line per case (kind, exit code, what was said)
    .venv/bin/python -m bench.resilience --keep     # keep the work folder (every case's files and logs)

Exits non-zero when a figure misses its target (any traceback, lost row, vague error, re-spent call,
duplicate or leak). tests/test_resilience.py asserts the same cases one by one.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.resilience import corpus as C
from tests.resilience import scenarios as S


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", action="store_true", help="print one line per corpus case")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--only", default="", help="run only the corpus cases whose id contains this")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="clariedge-resilience-"))
    t0 = time.perf_counter()
    try:
        pools = C.make_pools()
        results = []
        cases = [c for c in C.CASES if args.only in c.id]
        for i, case in enumerate(cases, 1):
            r = C.run_case(case, work / "corpus", pools)
            results.append(r)
            status = "ok" if r.ok else "FAIL: " + "; ".join(r.problems)
            print(f"[{i:2d}/{len(cases)}] {r.id:<40} exit {r.rc}  {r.seconds:5.1f} s  {status}", file=sys.stderr)
        print("kill -9 of synthesis ...", file=sys.stderr)
        kill = S.kill9_resume(work, pools)
        print("dvc repro synthesize with the key in the environment ...", file=sys.stderr)
        dvc = S.dvc_repro_with_key(work)
        scan = S.key_scan([work])
        print("Argilla stopped mid-push ...", file=sys.stderr)
        arg = S.argilla_stop_mid_push(work)
        seconds = time.perf_counter() - t0

        kinds = {r.kind for r in results}
        stages = sorted({r.stage for r in results})
        clear = sum(1 for r in results if r.place_named and not r.traceback and r.rc == (1 if r.fatal else 0))
        tracebacks = sum(r.traceback for r in results) + int(kill["traceback"])
        per_row = [r for r in results if not r.fatal]
        fatal = [r for r in results if r.fatal]
        good = sum(max(r.good_rows, 0) for r in per_row)
        lost = sum(max(r.lost, 0) for r in per_row)
        kept_outputs = sum(max(r.good_rows, 0) for r in fatal)
        clobbered = sum(max(r.lost, 0) for r in fatal)
        if "skipped" in arg:
            dup = f"skipped: {arg['skipped']}"
            dup_ok = True
        else:
            dup = (
                f"{arg['duplicates']} ({arg['on_server']} records on the server for {arg['records']} pushed, "
                f"{arg['missing']} missing; re-run sent {arg['rerun_sent']}, skipped {arg['rerun_skipped_unchanged']})"
            )
            dup_ok = arg["interrupted"] and arg["duplicates"] == 0 and arg["missing"] == 0 and arg["rerun_exit"] == 0
        respent_ok = kill["killed"] and kill["respent"] == 0 and kill["rerun_exit"] == 0
        leak_ok = scan["leaks"] == 0 and kill["key_sent"] and dvc["key_sent"] and dvc["exit"] == 0 and dvc["dvc_lock"]
        rows = [
            ("inputs tried", f"{len(results)} cases, {len(kinds)} kinds of bad input, stages {', '.join(stages)}",
             len(kinds) >= 20),
            ("clear errors (exit code as expected, the place named)", f"{clear} of {len(results)}",
             clear == len(results)),
            ("tracebacks", str(tracebacks), tracebacks == 0),
            ("good rows lost (per-row cases)", f"{lost} of {good}", lost == 0),
            ("rows of pre-existing outputs changed by a fatal error", f"{clobbered} of {kept_outputs}", clobbered == 0),
            ("calls re-spent after kill -9",
             f"{kill['respent']} (jobs {kill['jobs']}, cached at the kill {kill['cached_before_rerun']}, "
             f"server hits on the re-run {kill['hits_on_rerun']})", respent_ok),
            ("duplicates after Argilla restart", dup, dup_ok),
            ("API key leaks", f"{scan['leaks']} in {scan['files']} files ("
             + ", ".join(f"{k} {v}" for k, v in scan["by_kind"].items()) + ")", leak_ok),
        ]  # fmt: skip
        print(f"\nclariedge resilience suite ({seconds:.0f} s)\n")
        print("| figure | value | target met |")
        print("|---|---|---|")
        for name, value, ok in rows:
            print(f"| {name} | {value} | {'yes' if ok else 'NO'} |")
        if scan["leaked"]:
            print("\nleaked into: " + ", ".join(scan["leaked"]))
        if args.cases:
            print("\n| case | stage | kind | exit | what the user sees |")
            print("|---|---|---|---|---|")
            for r in results:
                msg = r.message.replace("|", "\\|")
                print(f"| {r.id} | {r.stage} | {r.kind} | {r.rc} | {msg} |")
        failed = [name for name, _, ok in rows if not ok]
        if failed:
            print(f"\ntargets missed: {', '.join(failed)}")
        return 1 if failed else 0
    finally:
        if args.keep:
            print(f"\nwork folder kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
