"""The decision threshold on P(CLEAR), chosen after training and recorded in the adapter's metadata: the one
best on the validation split, or the one that asks on real, unlabelled turns as often as the train split needs
a question (`train.calibrate_target`)."""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any

from clariedge.io import write_json
from clariedge.training.data import ADAPTER_META, load_examples, stratified_sample

log = logging.getLogger(__name__)


def calibrate(
    adapter_dir: str | Path,
    base_dir: str | Path,
    validation_path: str | Path,
    max_rows: int | None,
    *,
    seed: int,
    precision: str,
    metric: str,
    turns: str | Path | None = None,
    ask_share: float = 0.0,
) -> dict[str, Any]:
    """Choose the decision threshold on P(CLEAR) that maximises `metric` on the validation split or, with `turns`,
    the one that asks on `ask_share` of those real turns (`prior_threshold`); record it in the adapter."""
    from clariedge.training.infer import Clarifier
    from clariedge.training.metrics import best_threshold

    t0 = time.perf_counter()
    rows = stratified_sample(load_examples(validation_path), max_rows, random.Random(seed))
    clar = Clarifier(adapter_dir, base=base_dir, threshold=0.5, precision=precision)
    probs = clar.p_clear([(r.messages, r.documents or None) for r in rows])
    gold = [r.needs_clarification for r in rows]
    threshold, acc = best_threshold(probs, gold, metric)
    real = prior_threshold(clar, turns, ask_share) if turns is not None else None
    validation_threshold = threshold
    if real is not None:
        threshold = real["threshold"]
        from sklearn.metrics import accuracy_score, balanced_accuracy_score

        score = balanced_accuracy_score if metric == "balanced_accuracy" else accuracy_score
        acc = round(float(score(gold, [p < threshold for p in probs])), 4)
    meta_path = Path(adapter_dir) / ADAPTER_META
    meta = json.loads(meta_path.read_text(encoding="utf-8"))  # required: calibration follows training
    meta["decision_threshold"] = threshold
    write_json(meta_path, meta)
    out = {
        "rows": len(rows),
        "threshold": threshold,
        "validation_threshold": validation_threshold,
        "real_turns": real,
        "metric": metric,
        f"validation_{metric}": acc,
        "validation_accuracy_at_0.5": round(
            sum((p < 0.5) == g for p, g in zip(probs, gold, strict=True)) / max(1, len(rows)), 4
        ),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    log.info("calibrated threshold %.4f on %d validation rows (accuracy %.4f)", threshold, len(rows), acc)
    return out


def prior_threshold(clar: Any, turns_path: str | Path, ask_share: float) -> dict[str, Any]:
    """The P(CLEAR) threshold at which the adapter asks on `ask_share` of the real turns under `turns_path`
    (every turn an assistant message precedes; no labels read): the share of questions our data teaches, carried
    to the conversations the model will meet. A threshold chosen on the validation split (our own construction)
    asks on few real turns: the model is less sure of real dialogs than of ours."""
    import numpy as np

    from clariedge import ingest

    seeds, _, _ = ingest.transform([Path(turns_path)])
    items = [(s.messages, s.documents or None) for s in seeds if any(m.role == "assistant" for m in s.messages[:-1])]
    if not items:
        raise ValueError(f"{turns_path}: no turn with an assistant message before it to calibrate on")
    p_clear = clar.p_clear(items)
    threshold = float(np.quantile(p_clear, ask_share))  # ask when P(CLEAR) < threshold
    return {"turns": len(items), "ask_share": round(ask_share, 4), "threshold": round(threshold, 6)}
