"""Stage `ablation`: the train variants (e.g. with and without hard negatives) side by side on the same test rows.

Every variant is scored by its decision from P(CLEAR) (see `clariedge.training.evaluate`)
on the same stratified test rows `evaluate` uses; the `default` variant's decisions are reused from
evaluate's predictions file when given, so it is not run twice. The headline is the false-positive
rate on hard negatives: how often a model asks about a turn the dialog or documents already resolve.

Inputs:  the test split, `models/<variant>/` for each variant in `train.variants`, the base model,
         optionally evaluate's per-row predictions, `metrics/train_<variant>.json`.
Outputs: `metrics/ablation.json`, a comparison plot (PNG), a Markdown table (for the README).
Params:  `train.variants` (the names), `evaluate.max_rows`, `evaluate.batch_size`, the top-level `seed`.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clariedge.io import save_figure, write_json, write_text
from clariedge.training.data import adapter_meta, load_examples, stratified_sample
from clariedge.training.evaluate import EvaluateConfig, score

log = logging.getLogger(__name__)

COLUMNS = ("accuracy", "precision", "recall", "f1", "fp_rate_hard_negatives")


def _reused(predictions: Path | None, ids: list[str]) -> tuple[list[bool], list[float]] | None:
    """The default adapter's (decisions, P(CLEAR)) from evaluate's predictions, if they cover these rows."""
    if predictions is None or not predictions.exists():
        return None
    by_id = {}
    with predictions.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row.get("system") == "adapter" and "p_clear" in row:
                by_id[row["id"]] = (bool(row["needs"]), float(row["p_clear"]))
    if not all(i in by_id for i in ids):
        return None
    return [by_id[i][0] for i in ids], [by_id[i][1] for i in ids]


def table(variants: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown table: one row per variant and threshold, the decision metrics and the hard-negative FP rate."""
    head = (
        "| variant | threshold | train rows | hard negatives in train | accuracy | precision | recall | F1 "
        "| FP rate on hard negatives |"
    )
    lines = [head, "|" + "---|" * 9]
    for name, v in variants.items():
        for label, m in ((f"calibrated ({v.get('threshold', 0.5):.3f})", v), ("0.5", v.get("at_0.5"))):
            if not m:
                continue
            cells = [f"{m.get(c):.3f}" if isinstance(m.get(c), float) else str(m.get(c)) for c in COLUMNS]
            lines.append(
                f"| {name} | {label} | {v.get('train_rows', '?')} | {v.get('train_hard_negatives', '?')} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines) + "\n"


def _threshold(adapter: Path) -> float:
    return float(adapter_meta(adapter).get("decision_threshold", 0.5))


def plot(variants: Mapping[str, Mapping[str, Any]], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(variants)
    metrics = ["accuracy", "f1", "fp_rate_hard_negatives", "fp_rate_hard_negatives@0.5"]
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(names) * len(metrics) / 3, 3.4))
    width = 0.8 / max(1, len(names))
    for k, name in enumerate(names):
        v = variants[name]
        vals = [(v.get("at_0.5") or {}).get(m[:-4]) if m.endswith("@0.5") else v.get(m) for m in metrics]
        vals = [x or 0.0 for x in vals]
        xs = [i + k * width for i in range(len(metrics))]
        bars = ax.bar(xs, vals, width, label=name)
        for b, v in zip(bars, vals, strict=True):
            ax.text(b.get_x() + b.get_width() / 2, v + 0.01, f"{v:.2f}", ha="center", fontsize=8)
    ax.set_xticks(
        [i + width * (len(names) - 1) / 2 for i in range(len(metrics))],
        ["accuracy", "F1", "FP rate HN\n(calibrated)", "FP rate HN\n(threshold 0.5)"],
    )
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=8)
    ax.set_title("hard-negative ablation (test split)")
    fig.tight_layout()
    save_figure(fig, path)


def run(
    test_path: str | Path,
    adapters: Mapping[str, str | Path],
    base_dir: str | Path,
    predictions: str | Path | None,
    train_metrics_dir: str | Path,
    out_path: str | Path,
    plot_path: str | Path,
    table_path: str | Path,
    cfg: EvaluateConfig,
    *,
    seed: int,
) -> dict[str, Any]:
    from clariedge.training.infer import Clarifier

    rows = stratified_sample(load_examples(test_path), cfg.max_rows, random.Random(seed))
    items = [(r.messages, r.documents or None) for r in rows]
    out: dict[str, dict[str, Any]] = {}
    for name, adapter in adapters.items():
        t0 = time.perf_counter()
        got = _reused(Path(predictions), [r.id for r in rows]) if (name == "default" and predictions) else None
        reused = got is not None
        if got is None:
            clar = Clarifier(
                adapter, base=base_dir, max_length=cfg.max_length, batch_size=cfg.batch_size, precision=cfg.precision
            )
            decided = clar.decide(items)
            got = ([n for _, n in decided], [p for p, _ in decided])
            threshold = clar.threshold
            del clar
        else:
            threshold = _threshold(Path(adapter))
        needs, p_clear = got
        s = score(rows, needs)
        entry: dict[str, Any] = {c: s[c] for c in COLUMNS}
        entry["threshold"] = threshold
        entry["accuracy_by_category"] = s["accuracy_by_category"]
        entry["confusion"] = s["confusion"]
        # the same adapter with the plain 0.5 threshold: calibration on the validation split (which has
        # hard negatives) can hide part of what training without them does
        s05 = score(rows, [p < 0.5 for p in p_clear])
        entry["at_0.5"] = {c: s05[c] for c in COLUMNS}
        tm = Path(train_metrics_dir) / f"train_{name}.json"
        if tm.exists():
            t = json.loads(tm.read_text(encoding="utf-8"))
            entry["train_rows"] = t.get("rows")
            entry["train_hard_negatives"] = t.get("rows_by_category", {}).get("hard_negative", 0)
            entry["train_final_loss"] = t.get("final_loss")
        entry["reused_evaluate_predictions"] = reused
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        out[name] = entry
        log.info(
            "ablation %s: accuracy %.4f, FP rate on hard negatives %s",
            name,
            entry["accuracy"],
            entry["fp_rate_hard_negatives"],
        )
    result: dict[str, Any] = {"rows": len(rows), "variants": out}
    if "default" in out:
        result["delta_vs_default"] = {
            n: {c: round((v[c] or 0.0) - (out["default"][c] or 0.0), 4) for c in COLUMNS}
            for n, v in out.items()
            if n != "default"
        }
    result["table"] = table(out)
    write_json(out_path, result)
    write_text(table_path, result["table"])
    plot(out, plot_path)
    return result
