"""Benchmark: how far the seed alone moves what the data teaches about real conversations.

One cold build of the data (`dvc repro publish`) per seed, each in a fresh copy of the project, then the
MiniLM classifier (the `external` stage's `minilm` baseline: logistic regression on MiniLM embeddings of the
last turn, the dialog and the documents) trained on that build's train split and scored on every real set
in `external.sets`: ROC AUC of P(ask), with the spread over the seeds. No LoRA training: minutes per seed.
Each set is also split by position: `<set>@first` holds the conversations' opening turns, `<set>@later` the
turns after a dialog (where most real turns are, and where a short follow-up must be told from an open one).

A data change moves the real-set figures only if it moves them by more than this spread: compare a
variant's seeds with the default's (`--set` applies dotted params overrides to every build).
The MiniLM AUC is a proxy: on the builds measured it moved with the adapter's (docs/training.md). A linear model
on the three embeddings side by side cannot see how the turn relates to the dialog (whether the dialog resolves
it), which decides a turn after a dialog; `--pair` adds a second proxy, `pair`, whose features also hold the
turn's elementwise products and cosines with the dialog and the documents (sentence-pair features).

Usage: .venv/bin/python -m bench.bench_seeds [--seeds 20261202 1 2] [--set synthesize.construct.per_seed.ad_stitched=2]
       [--splits-only] [--keep DIR] [--pair] [--rescore DIR]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.pipeline_run import ROOT, copy_project, repro, set_params


def _value(text: str) -> Any:
    return yaml.safe_load(text)  # "2" -> 2, "[a, b]" -> list, "true" -> True


def _auc(gold: list[bool], p_ask: list[float]) -> float:
    """ROC AUC of P(ask); NaN where the rows hold one class only (no ranking to measure)."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(gold, p_ask)) if len(set(gold)) == 2 and p_ask else float("nan")


def fit_pair(train: list[Any], seed: int, cache: str) -> Any:
    """Logistic regression on the MiniLM views (turn t, dialog d, documents c) and their relations: t*d, t*c and
    the cosines t.d, t.c. A function from rows to P(ask)."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from clariedge.embed import embed
    from clariedge.training.evaluate import minilm_texts

    def features(rows: list[Any]) -> Any:
        views = [minilm_texts(r) for r in rows]
        t, d, c = (embed([v[j] for v in views], cache_path=cache) for j in range(3))
        cos = np.stack([(t * d).sum(1), (t * c).sum(1)], axis=1)
        return np.concatenate([t, d, c, t * d, t * c, cos], axis=1)

    clf = LogisticRegression(max_iter=4000, C=1.0, random_state=seed)
    clf.fit(features(train), [int(r.needs_clarification) for r in train])
    return lambda rows: [float(x) for x in clf.predict_proba(features(rows))[:, list(clf.classes_).index(1)]]


def real_set_aucs(train_split: Path, params: dict[str, Any], pair: bool = False) -> tuple[int, int, dict[str, float]]:
    """(train rows, of them ask, set -> ROC AUC of P(ask)) of the MiniLM classifier trained on `train_split` (with
    `pair`, of the sentence-pair proxy, `fit_pair`), on all of each set's rows and, as `<set>@first` /
    `<set>@later`, on its opening turns / turns after a dialog.
    The sets are `external.sets`, read relative to this checkout (they live outside the project)."""
    from clariedge.training.benchmark import load_sets
    from clariedge.training.data import load_examples
    from clariedge.training.evaluate import fit_minilm

    train = load_examples(train_split)
    rows_by_set, _ = load_sets(
        {n: ROOT / p for n, p in params["external"]["sets"].items()}, None, params["external"]["sample_seed"]
    )
    cache = str(ROOT / "cache/bench_seeds.sqlite")
    if pair:
        pair_predict = fit_pair(train, params["seed"], cache)
    else:
        minilm = fit_minilm(train, seed=params["seed"], cache=cache)
    aucs = {}
    for name, rows in rows_by_set.items():
        p_ask = pair_predict(rows) if pair else minilm(rows)[1]
        gold = [r.needs for r in rows]
        aucs[name] = _auc(gold, p_ask)
        later = [sum(m.role == "user" for m in r.messages) > 1 for r in rows]
        for part, keep in (("first", False), ("later", True)):
            idx = [i for i, is_later in enumerate(later) if is_later == keep]
            aucs[f"{name}@{part}"] = _auc([gold[i] for i in idx], [p_ask[i] for i in idx] if p_ask else [])
    return len(train), sum(r.needs_clarification for r in train), aucs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[20261202, 1, 2], help="top-level `seed` of each build")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="params override for every build")
    ap.add_argument(
        "--splits-only",
        action="store_true",
        help="build the data once (first seed), then rerun only `publish` with each seed: the split's share of the spread",
    )
    ap.add_argument("--keep", type=Path, help="build in this folder and keep it (default: a temp folder)")
    ap.add_argument("--pair", action="store_true", help="score with the sentence-pair proxy (`fit_pair`)")
    ap.add_argument("--rescore", type=Path, help="build nothing: score the builds a --keep run left in this folder")
    args = ap.parse_args()
    if args.rescore and (args.set or args.splits_only):
        ap.error("--rescore builds nothing: --set and --splits-only have no effect with it")
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set {item!r}: expected KEY=VALUE")
        overrides[key] = _value(value)
    work = args.keep or args.rescore or Path(tempfile.mkdtemp(prefix="clariedge-seeds-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    first: Path | None = None
    for seed in args.seeds:
        t0 = time.perf_counter()
        if args.rescore:
            project = args.rescore / f"seed-{seed}"
        elif args.splits_only and first is not None:
            project = first
            set_params(project, {"seed": seed})
            repro(project, "--single-item", "publish")
        else:
            project = copy_project(work / f"seed-{seed}")
            set_params(project, {**overrides, "seed": seed})
            for cache in ROOT.glob("cache/embeddings_*.sqlite"):  # warm MiniLM caches give the same bytes (README)
                (project / "cache").mkdir(exist_ok=True)
                shutil.copy2(cache, project / "cache" / cache.name)
            repro(project, "publish")
            first = first or project
        params = yaml.safe_load((project / "params.yaml").read_text(encoding="utf-8"))
        rows, ask, aucs = real_set_aucs(project / "data/clariedge-parquet/train.parquet", params, pair=args.pair)
        results.append((seed, rows, ask, aucs, time.perf_counter() - t0))
        print(f"seed {seed}: {aucs} ({results[-1][-1]:.0f} s)", flush=True)
    # a set with no opening turns (Abg-CoQA) has no `@first` figure: left out rather than printed as nan
    names = sorted({n for *_, aucs, _ in results for n, v in aucs.items() if not math.isnan(v)})
    proxy = "sentence-pair MiniLM" if args.pair else "MiniLM"
    print(f"\n{proxy} ROC AUC of P(ask) on each real set; overrides {overrides or 'none'}")
    width = max(14, *(len(n) + 2 for n in names))
    print(f"{'seed':>10}{'train rows':>12}{'ask':>6}" + "".join(f"{n:>{width}}" for n in names) + f"{'wall s':>9}")
    for seed, rows, ask, aucs, seconds in results:
        cells = "".join(f"{aucs.get(n, float('nan')):>{width}.3f}" for n in names)
        print(f"{seed:>10}{rows:>12}{ask:>6}{cells}{seconds:>9.0f}")
    if len(results) > 1:
        for label, fn in (("mean", statistics.mean), ("sd", statistics.stdev)):
            cells = [[r[3][n] for r in results if not math.isnan(r[3].get(n, math.nan))] for n in names]
            print(f"{label:>10}{'':>18}" + "".join(f"{fn(c) if len(c) > 1 else math.nan:>{width}.3f}" for c in cells))
    if not args.keep and not args.rescore:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
