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

from clariedge.io import write_json, write_text
from clariedge.training.data import load_examples, stratified_sample
from clariedge.training.evaluate import EvaluateConfig, score

log = logging.getLogger(__name__)

COLUMNS = ("accuracy", "precision", "recall", "f1", "fp_rate_hard_negatives")


def _reused(predictions: Path | None, ids: list[str]) -> list[bool] | None:
    if predictions is None or not predictions.exists():
        return None
    by_id = {}
    with predictions.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row.get("system") == "adapter":
                by_id[row["id"]] = bool(row["needs"])
    if not all(i in by_id for i in ids):
        return None
    return [by_id[i] for i in ids]


def table(variants: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown table: one row per variant, the decision metrics and the hard-negative FP rate."""
    head = "| variant | train rows | hard negatives in train | accuracy | precision | recall | F1 | FP rate on hard negatives |"
    lines = [head, "|" + "---|" * 8]
    for name, v in variants.items():
        cells = [f"{v.get(c):.3f}" if isinstance(v.get(c), float) else str(v.get(c)) for c in COLUMNS]
        lines.append(
            f"| {name} | {v.get('train_rows', '?')} | {v.get('train_hard_negatives', '?')} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines) + "\n"


def plot(variants: Mapping[str, Mapping[str, Any]], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(variants)
    metrics = ["accuracy", "f1", "fp_rate_hard_negatives"]
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(names) * len(metrics) / 3, 3.4))
    width = 0.8 / max(1, len(names))
    for k, name in enumerate(names):
        vals = [variants[name].get(m) or 0.0 for m in metrics]
        xs = [i + k * width for i in range(len(metrics))]
        bars = ax.bar(xs, vals, width, label=name)
        for b, v in zip(bars, vals, strict=True):
            ax.text(b.get_x() + b.get_width() / 2, v + 0.01, f"{v:.2f}", ha="center", fontsize=8)
    ax.set_xticks(
        [i + width * (len(names) - 1) / 2 for i in range(len(metrics))], ["accuracy", "F1", "FP rate\nhard negatives"]
    )
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=8)
    ax.set_title("hard-negative ablation (test split)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
        needs = _reused(Path(predictions), [r.id for r in rows]) if (name == "default" and predictions) else None
        reused = needs is not None
        if needs is None:
            clar = Clarifier(adapter, base=base_dir, max_length=cfg.max_length, batch_size=cfg.batch_size)
            needs = [n for _, n in clar.decide(items)]
            del clar
        s = score(rows, needs)
        entry: dict[str, Any] = {c: s[c] for c in COLUMNS}
        entry["accuracy_by_category"] = s["accuracy_by_category"]
        entry["confusion"] = s["confusion"]
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
