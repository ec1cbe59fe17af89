"""Probe: does a published train split teach the decision real conversations need? (prints numbers, ~2 min)

Training the adapter takes half an hour on 2 CPU cores; this probe takes two minutes, so a data change can be
screened before it is trained. It fits a logistic regression on MiniLM features of each train row: the last
turn, the dialog before it, their element-wise product and cosine (whether the turn continues the dialog's
topic), and whether there is a dialog at all. It then reports ROC AUC and balanced accuracy on every labelled
set (MTRAG task JSONL with `answerability`, as `clariedge benchmark` reads them).

The product is the adapter, not this probe: a data change that does not lift the probe is probably not worth a
training run, and one that does still has to be trained and measured. The external stage's MiniLM baseline sees
the last turn only; this one sees the dialog too, which is what an open reference after a topic switch needs.
Measured 2026-12-06: MTRAG-UN AUC 0.60 with one stitched host per turn, 0.67 with three, yet the adapter
trained on the three-host data did not improve (docs/training.md, "Tried 2026-12-06"); Abg-CoQA and PACIFIC,
whose asks depend on the documents, stay near chance either way.

Run: `.venv/bin/python -m bench.probe_data [TRAIN_PARQUET] [SET.jsonl ...]` (defaults: the published train
split and `../shared/data/realdev/*.jsonl`; skips with a message where they are absent).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score, roc_auc_score

from clariedge.embed import embed
from clariedge.io import Rejects, read_records
from clariedge.schema import Example
from clariedge.training.benchmark import LabelledRow, read_labelled

DIALOG_CHARS = 2000  # the dialog's last characters (MiniLM reads 256 tokens; the end of a dialog is its topic now)


def features(rows: Sequence[Example | LabelledRow]) -> np.ndarray:
    """One feature row per row (its last turn and the messages before it)."""
    turns = embed([r.last_turn for r in rows])
    dialogs = [" ".join(m.content for m in r.messages[:-1])[-DIALOG_CHARS:] for r in rows]
    with_dialog = [i for i, d in enumerate(dialogs) if d]
    dia = np.zeros_like(turns)
    if with_dialog:
        dia[with_dialog] = embed([dialogs[i] for i in with_dialog])
    has = np.array([[bool(d)] for d in dialogs], dtype=np.float32)
    return np.hstack([turns, dia, turns * dia, (turns * dia).sum(1, keepdims=True), has])


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    train = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "data" / "clariedge-parquet" / "train.parquet"
    sets = [Path(p) for p in sys.argv[2:]] or sorted((root.parent / "shared" / "data" / "realdev").glob("*.jsonl"))
    if not train.exists() or not sets:
        print(f"skip: need {train} (run `dvc repro publish`) and labelled sets (none found)")
        return 0
    examples = read_records(train, Example, ignore_unknown=True)
    x = features(examples)
    y = np.array([e.needs_clarification for e in examples])
    clf = LogisticRegression(max_iter=2000, class_weight="balanced").fit(x, y)
    with_dialog = sum(len(e.messages) > 1 for e in examples if e.needs_clarification)
    print(f"train {train}: {len(examples)} rows, {int(y.sum())} ask ({with_dialog} of them with a dialog)")
    for path in sets:
        labelled = read_labelled(path, Rejects())
        p = clf.predict_proba(features(labelled))[:, 1]
        gold = np.array([r.needs for r in labelled])
        auc, bal = roc_auc_score(gold, p), balanced_accuracy_score(gold, p >= 0.5)
        print(
            f"  {path.stem}: {len(labelled)} rows, {int(gold.sum())} ask: ROC AUC {auc:.3f}, balanced accuracy {bal:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
