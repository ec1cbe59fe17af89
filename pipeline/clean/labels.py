"""Label scores: one label source per row (confident learning), several annotators (CROWDLAB), and
Datalab's near-duplicate / outlier signals."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from clariedge.clean.config import CleanConfig, annotation_label, class_names
from clariedge.schema import Example

log = logging.getLogger(__name__)


def long_format_annotations(rows: list[Example], cfg: CleanConfig):
    """Long-format labels (`task`, `annotator`, `label`), as cleanlab's helpers take them."""
    import pandas as pd

    records = []
    for i, ex in enumerate(rows):
        seen: set[str] = set()
        for ann in ex.annotations:
            label = annotation_label(ann, cfg)
            if label is None or ann.annotator in seen:
                continue
            seen.add(ann.annotator)
            records.append({"task": i, "annotator": ann.annotator, "label": label})
    return pd.DataFrame(records, columns=["task", "annotator", "label"])


@dataclass
class MultiResult:
    rows: list[int]  # indices (into all rows) of the annotated rows
    consensus: np.ndarray
    quality: np.ndarray
    agreement: np.ndarray
    num_annotations: np.ndarray
    annotators: list[dict[str, Any]]


def multiannotator(rows: list[Example], probs: np.ndarray, cfg: CleanConfig) -> MultiResult | None:
    """CROWDLAB over the annotated rows; None when fewer than two annotators answered."""
    from cleanlab.multiannotator import convert_long_to_wide_dataset, get_label_quality_multiannotator

    long = long_format_annotations(rows, cfg)
    if long.empty or long["annotator"].nunique() < 2:
        return None
    wide = convert_long_to_wide_dataset(long)
    wide = wide.reindex(sorted(wide.index), columns=sorted(wide.columns))
    idx = [int(i) for i in wide.index]
    try:
        res = get_label_quality_multiannotator(wide, probs[idx], verbose=False)
    except (ValueError, AssertionError) as err:  # e.g. too few overlapping labels for CROWDLAB
        log.warning("clean: multi-annotator scoring failed (%s); using the single-source path", err)
        return None
    lq = res["label_quality"]
    names = class_names(cfg)
    stats = res["annotator_stats"]
    annotators = [
        {
            "annotator": str(a),
            "annotator_quality": round(float(s["annotator_quality"]), 6),
            "num_examples_labeled": int(s["num_examples_labeled"]),
            "agreement_with_consensus": round(float(s["agreement_with_consensus"]), 6),
            "worst_class": names[int(s["worst_class"])] if not _isnan(s["worst_class"]) else None,
        }
        for a, s in stats.iterrows()
    ]
    annotators.sort(key=lambda r: (r["annotator_quality"], r["annotator"]))
    return MultiResult(
        rows=idx,
        consensus=lq["consensus_label"].to_numpy().astype(int),
        quality=lq["consensus_quality_score"].to_numpy().astype(float),
        agreement=lq["annotator_agreement"].to_numpy().astype(float),
        num_annotations=lq["num_annotations"].to_numpy().astype(int),
        annotators=annotators,
    )


def _isnan(x: Any) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return x is None


def single_source_issues(labels: np.ndarray, probs: np.ndarray, cfg: CleanConfig) -> tuple[np.ndarray, np.ndarray]:
    """(flagged mask, label quality) from one label per row."""
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    quality = get_label_quality_scores(labels, probs, method="self_confidence")
    present = np.unique(labels)
    if len(present) < 2:
        return np.zeros(len(labels), bool), quality
    # cleanlab needs every class it sees in `labels` to be a column: restrict to the classes present
    sub = probs[:, present]
    sub = sub / sub.sum(axis=1, keepdims=True)
    remap = {c: i for i, c in enumerate(present)}
    flagged = find_label_issues(np.asarray([remap[c] for c in labels]), sub, filter_by=cfg.filter_by)
    return np.asarray(flagged, bool), quality


def datalab_signals(features: np.ndarray, labels: np.ndarray, rows: list[Example], cfg: CleanConfig) -> dict[int, Any]:
    """Per-row near-duplicate / outlier notes from cleanlab's Datalab, plus counts under `_stats`."""
    from cleanlab import Datalab

    types = {}
    if cfg.datalab.near_duplicate:
        types["near_duplicate"] = {}
    if cfg.datalab.outlier:
        types["outlier"] = {}
    if not types:
        return {}
    lab = Datalab(data={"label": labels.tolist()}, label_name="label", verbosity=0)
    lab.find_issues(features=features, issue_types=types)
    notes: dict[Any, Any] = {}
    st: dict[str, int] = {}
    if "near_duplicate" in types:
        nd = lab.get_issues("near_duplicate")
        st["near_duplicates"] = int(nd["is_near_duplicate_issue"].sum())
        conflicts = 0
        for i in np.flatnonzero(nd["is_near_duplicate_issue"].to_numpy()):
            others = sorted(int(j) for j in nd["near_duplicate_sets"].iloc[i])
            conflict = [j for j in others if labels[j] != labels[i]]
            conflicts += bool(conflict)
            shown = ", ".join(rows[j].id for j in (conflict or others)[:3])
            kind = "near_duplicate_label_conflict" if conflict else "near_duplicate"
            notes.setdefault(int(i), []).append(f"{kind}: {shown}")
        st["near_duplicate_label_conflicts"] = conflicts
    if "outlier" in types:
        ou = lab.get_issues("outlier")
        st["outliers"] = int(ou["is_outlier_issue"].sum())
        for i in np.flatnonzero(ou["is_outlier_issue"].to_numpy()):
            notes.setdefault(int(i), []).append(f"outlier: score {ou['outlier_score'].iloc[i]:.3f}")
    notes["_stats"] = st
    return notes
