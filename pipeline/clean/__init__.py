"""Stage `clean`: find label issues with cleanlab and act on them (drop, relabel, or send back to review).

Inputs:  reviewed examples (parquet, `Example` rows, `data/reviewed.parquet`).
Outputs: cleaned examples (parquet, `Example` rows with `label_quality` set on every row);
         `reports/label_issues.csv` (every flagged row: why, what was done, old and new id/label);
         `reports/label_issues.md` (category warnings first, then summary, label quality by category,
         annotator quality, agreement, the worst rows);
         `reports/confusion.png` (given label vs out-of-sample predicted category); stats JSON;
         the stage's MiniLM embedding cache (`--cache`, a DVC out with `persist: true`).
Params:  `clean.label` (needs_clarification | category), `clean.policy` (drop | relabel | send_back),
         `clean.folds`, `clean.C`, `clean.pca_components`, `clean.calibration`, `clean.filter_by`,
         `clean.max_flag_fraction`, `clean.category_warning` (`max_ratio`, `min_rows`, `send_back_all`),
         `clean.report_only_categories`, `clean.min_consensus_quality`,
         `clean.min_rows`, `clean.context_messages`, `clean.context_chars`, `clean.datalab`, `clean.report_top`;
         the top-level `seed`.

How it works
- Features: MiniLM embeddings of the dialog before the turn (most recent message first), of the turn,
  and of the document titles, plus a few scalars (setting, cosine and word overlap turn/dialog and
  turn/titles, length).
- Out-of-sample predicted probabilities: `StratifiedGroupKFold` grouped by `conversation_id` (no
  dialog is in both the fitted and the scored fold); per fold, PCA of the embedding blocks and a
  standardised logistic regression (optionally wrapped in `CalibratedClassifierCV`: params.yaml uses
  sigmoid, which raised precision at 10% planted flips from 0.45 to 0.61 in the bench). The model predicts the category;
  `p(needs_clarification)` is the sum over the two ambiguous categories, and `ambiguous_documents`
  gets probability 0 before retrieval (it cannot exist there).
- One label source per row (the generator's label, or the row's label after single review):
  `cleanlab.filter.find_label_issues` flags, `cleanlab.rank.get_label_quality_scores` ranks.
  At most `max_flag_fraction` of each category's rows are flagged (the worst first): a classifier that
  cannot tell a rare category apart must not wipe it out. Flags on `report_only_categories` (default
  `hard_negative`) are reported, never acted on: a hard negative looks ambiguous by design (pronouns,
  fragments) and whether the dialog resolves it is beyond a bag-of-embeddings classifier; on the
  sample its flags were almost all correct hard negatives ("how hot does it get there?" right after
  the planet Mercury). Annotator consensus (below) may still change or remove them.
- The cap must not let a category whose labels are wrong as a whole through (an audit found one with
  median label quality 0.33 vs 0.69 elsewhere, most of it under the cap): a category with at least
  `category_warning.min_rows` rows whose median label quality is below `category_warning.max_ratio` x the
  median of the other categories' rows is a warning: logged, in the stats (`category_warnings`), at the
  top of the report, and in the dataset card (publish reads the stats). With `policy: send_back` its rows
  lead the review queue, worst first, then the other flagged rows (review's `send_back_order`; its
  `send_back` pushes in that order); with `send_back_all` every classifier-scored row of it goes back,
  not only its capped flags (report-only categories are warned about, never sent back).
- Several annotators (rows whose `annotations` hold >= 2 distinct annotators overall, status
  `submitted`): long-format labels are converted with `cleanlab.multiannotator.convert_long_to_wide_dataset`
  and scored by `get_label_quality_multiannotator` (CROWDLAB): consensus label, consensus quality
  (-> `label_quality`), agreement, per-annotator quality. A row is flagged when its label differs from
  the consensus, or the consensus quality is below `min_consensus_quality`.
- Datalab's `near_duplicate` and `outlier` checks on the same features are extra signals: written to
  the report (with near-duplicates that carry a different label), never acted on by themselves.

Relabel rule (keeps `Example` consistent: category <-> needs_clarification <-> clarification)
- ambiguous -> not ambiguous: the question and the interpretations are removed; the new category is
  the annotators' (consensus voters') category when they gave one, else `hard_negative` (the row was
  made to look ambiguous and is judged resolvable: that is what a hard negative is).
- not ambiguous -> ambiguous: a question is required. It is the most frequent clarification written by
  the annotators who voted for the consensus; the category is theirs, else `ambiguous_dialog`
  (`ambiguous_documents` only post retrieval). With no question available (always the case for a
  single label source) the row cannot be relabelled consistently and is dropped instead, with action
  `drop_no_question` in the issues file.
- within one side (clear <-> hard_negative, ambiguous_dialog <-> ambiguous_documents): only the
  category changes.
A relabelled row gets a new content id; the issues file maps the old id to the new one.

The package: `config` (params and label spaces), `features` (features, out-of-sample probabilities),
`labels` (confident learning, CROWDLAB, Datalab), `policy` (warnings, relabel rule, actions), `report`
(issues CSV, plot, Markdown); this module holds the pure core `transform`, `run` and `send_back`.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clariedge.annotation import review
from clariedge.clean.config import (
    CAT_INDEX,
    CategoryWarningConfig,
    CleanConfig,
    DatalabConfig,
    Policy,
    class_names,
    row_label,
)
from clariedge.clean.features import build_features, confusion_counts, feature_texts, needs_probs, out_of_sample_probs
from clariedge.clean.labels import datalab_signals, multiannotator, single_source_issues
from clariedge.clean.policy import Verdicts, apply_policy, category_warnings, relabel
from clariedge.clean.report import plot_confusion, render_report, write_issues_csv
from clariedge.io import read_records, write_json, write_records, write_text
from clariedge.schema import CATEGORIES, Example

__all__ = [
    "CategoryWarningConfig",
    "CleanConfig",
    "CleanResult",
    "DatalabConfig",
    "Policy",
    "build_features",
    "category_warnings",
    "feature_texts",
    "relabel",
    "run",
    "send_back",
    "transform",
]

log = logging.getLogger(__name__)


@dataclass
class CleanResult:
    rows: list[Example]
    issues: list[dict[str, Any]]
    annotators: list[dict[str, Any]]
    confusion: dict[str, Any]
    stats: dict[str, Any]
    sent_back: list[Example] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# The pure core
# ---------------------------------------------------------------------------------------------
def transform(
    rows: list[Example],
    cfg: CleanConfig,
    *,
    rng: random.Random,
    features: np.ndarray | None = None,
    cache_path: str | Path | None = None,
) -> CleanResult:
    """Score every row's label, flag issues, apply the policy. `features` skips embedding (tests, bench)."""
    seed = rng.randrange(2**31)
    stats: dict[str, Any] = {"rows_in": len(rows), "label": cfg.label, "policy": cfg.policy}
    groups = [ex.conversation_id for ex in rows]
    if len(rows) < cfg.min_rows or len(set(groups)) < 2:
        log.warning(
            "clean: %d rows in %d conversations; too few to cross-validate, passing through",
            len(rows),
            len(set(groups)),
        )
        stats.update(rows_out=len(rows), flagged=0, skipped="too_few_rows", category_warnings=[])
        return CleanResult(list(rows), [], [], {}, stats)

    t0 = time.perf_counter()
    if features is None:
        features = build_features(
            rows,
            cache_path,
            context_messages=cfg.context_messages,
            context_chars=cfg.context_chars,
        )
    stats["seconds_features"] = round(time.perf_counter() - t0, 2)
    cats = np.asarray([CAT_INDEX[ex.category] for ex in rows])
    t1 = time.perf_counter()
    cat_probs, folds = out_of_sample_probs(features, cats, groups, [ex.setting for ex in rows], cfg, seed)
    stats["seconds_cv"] = round(time.perf_counter() - t1, 2)

    v = _single_source(rows, cats, cat_probs, folds, cfg, stats)
    annotators = _consensus(rows, v, cfg, stats)
    warned = _warn_categories(rows, v, cfg, stats)
    extra = datalab_signals(features, v.labels, rows, cfg) if cfg.datalab.enabled else {}
    stats.update(extra.pop("_stats", {}))  # extra signals from Datalab (reported, not acted on)

    out, issues, sent_back = apply_policy(rows, cfg, v, extra)
    sent_back, _ = review.send_back_order(sent_back, {}, first=[ex.id for ex in sent_back if ex.category in warned])
    counts = Counter(r["action"] for r in issues)
    stats.update(
        flagged=int(v.flagged.sum()),
        rows_out=len(out),
        dropped=counts.get("drop", 0) + counts.get("drop_no_question", 0),
        dropped_no_question=counts.get("drop_no_question", 0),
        relabeled=counts.get("relabel", 0),
        sent_back=counts.get("send_back", 0),
        sent_back_first=sum(ex.category in warned for ex in sent_back),
        report_only=counts.get("report_only", 0),
        mean_label_quality=round(float(np.mean(v.quality)), 4),
        flagged_by_category=dict(sorted(Counter(rows[i].category for i in np.flatnonzero(v.flagged)).items())),
    )
    return CleanResult(out, issues, annotators, confusion_counts(cats, cat_probs), stats, sent_back)


def _accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return round(float((probs.argmax(axis=1) == labels).mean()), 4)


def _single_source(
    rows: list[Example], cats: np.ndarray, cat_probs: np.ndarray, folds: int, cfg: CleanConfig, stats: dict[str, Any]
) -> Verdicts:
    """One label source: cleanlab's confident learning over every row, then the per-category flag cap."""
    names = class_names(cfg)
    probs = needs_probs(cat_probs) if cfg.label == "needs_clarification" else cat_probs
    labels = np.asarray([row_label(ex, cfg) for ex in rows])
    needs = np.asarray([int(ex.needs_clarification) for ex in rows])
    stats.update(
        folds=folds,
        cv_accuracy=_accuracy(probs, labels),
        cv_accuracy_category=_accuracy(cat_probs, cats),
        cv_accuracy_needs_clarification=_accuracy(needs_probs(cat_probs), needs),
    )
    flagged, quality = single_source_issues(labels, probs, cfg)
    predicted = probs.argmax(axis=1)
    n = len(rows)
    v = Verdicts(
        labels, probs, predicted.copy(), flagged, quality, [[] for _ in rows], ["single"] * n, [None] * n, [0] * n
    )
    for i in np.flatnonzero(flagged):
        v.reasons[i].append(
            f"label_issue: given {names[labels[i]]} (p={probs[i, labels[i]]:.2f}), model predicts "
            f"{names[predicted[i]]} (p={probs[i, predicted[i]]:.2f})"
        )
    # cap per category: at most max_flag_fraction of each category's rows, the worst label quality first
    # (a classifier that cannot tell a rare category apart must not wipe that category out)
    capped: list[int] = []
    caps: dict[str, int] = {}
    for cat in CATEGORIES:
        members = [i for i, ex in enumerate(rows) if ex.category == cat]
        caps[cat] = math.floor(cfg.max_flag_fraction * len(members))
        order = sorted((i for i in members if flagged[i]), key=lambda i: (quality[i], rows[i].id))
        capped += order[caps[cat] :]
    for i in capped:
        flagged[i] = False
        v.reasons[i] = []
    stats["flag_cap"] = sum(caps.values())
    stats["unflagged_by_cap"] = len(capped)
    return v


def _consensus(rows: list[Example], v: Verdicts, cfg: CleanConfig, stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Several annotators: CROWDLAB's consensus replaces the single-source verdict on annotated rows.
    Returns the per-annotator stats (none without two annotators)."""
    multi = multiannotator(rows, v.probs, cfg)
    if multi is None:
        stats["annotated_rows"] = 0
        stats["annotators"] = 0
        return []
    names = class_names(cfg)
    for j, i in enumerate(multi.rows):
        v.flagged[i] = False
        v.reasons[i] = []
        v.source[i] = "multiannotator"
        v.quality[i] = multi.quality[j]
        v.agreement[i] = round(float(multi.agreement[j]), 6)
        v.num_ann[i] = int(multi.num_annotations[j])
        v.target[i] = multi.consensus[j]
        if multi.consensus[j] != v.labels[i]:
            v.flagged[i] = True
            v.reasons[i].append(
                f"consensus_disagrees: row says {names[v.labels[i]]}, {v.num_ann[i]} annotators' consensus is "
                f"{names[multi.consensus[j]]} (agreement {multi.agreement[j]:.2f})"
            )
        if multi.quality[j] < cfg.min_consensus_quality:
            v.flagged[i] = True
            v.reasons[i].append(f"low_consensus_quality: {multi.quality[j]:.2f} < {cfg.min_consensus_quality}")
    stats["annotated_rows"] = len(multi.rows)
    stats["annotators"] = len(multi.annotators)
    stats["mean_annotator_agreement"] = round(float(np.mean(multi.agreement)), 4)
    return multi.annotators


def _warn_categories(rows: list[Example], v: Verdicts, cfg: CleanConfig, stats: dict[str, Any]) -> set[str]:
    """A category whose labels look wrong as a whole (the per-category cap would let most of it through):
    logged and in the stats; with `send_back_all` under policy send_back, all its rows are flagged.
    Returns the warned categories."""
    warnings = category_warnings(rows, v.quality, cfg.category_warning)
    stats["median_label_quality_by_category"] = {
        cat: round(float(np.median([v.quality[i] for i, ex in enumerate(rows) if ex.category == cat])), 4)
        for cat in sorted({ex.category for ex in rows})
    }
    stats["category_warnings"] = warnings
    warned = {w["category"]: w for w in warnings}
    for w in warnings:
        log.warning(
            "clean: category %s: median label quality %.3f is %.2f x the other categories' rows (%.3f) over %d rows; "
            "its labels may be wrong as a whole (row-by-row flags, capped per category, catch few of them)",
            w["category"],
            w["median_label_quality"],
            w["ratio"],
            w["others_median_label_quality"],
            w["rows"],
        )
    by_warning = 0
    if cfg.policy == "send_back" and cfg.category_warning.send_back_all:
        # every classifier-scored row of a warned category goes back for a person to check (report-only
        # categories excepted: the classifier alone may not take them out of the dataset)
        for i, ex in enumerate(rows):
            w = warned.get(ex.category)
            if w is None or v.source[i] != "single" or ex.category in cfg.report_only_categories:
                continue
            by_warning += not v.flagged[i]
            v.flagged[i] = True
            v.reasons[i].append(
                f"category_warning: {ex.category} median label quality {w['median_label_quality']:.2f} is "
                f"{w['ratio']:.2f} x the other rows' ({w['others_median_label_quality']:.2f})"
            )
    stats["flagged_by_category_warning"] = by_warning
    return set(warned)


# ---------------------------------------------------------------------------------------------
# I/O
# ---------------------------------------------------------------------------------------------
def run(
    in_path: str | Path,
    out_path: str | Path,
    cfg: CleanConfig,
    *,
    seed: int,
    issues_csv: str | Path,
    issues_md: str | Path,
    confusion_png: str | Path,
    stats_path: str | Path | None = None,
    cache_path: str | Path | None = None,
    review_cfg: Any = None,
) -> dict[str, Any]:
    """Read, clean, write the cleaned rows, the issues files, the plot and the stats."""
    t0 = time.perf_counter()
    rows = read_records(in_path, Example)
    if not rows:
        raise ValueError(f"{in_path}: no rows to clean (did review drop or discard every row?); nothing written")
    log.info(
        "clean: %d rows from %s; label=%s policy=%s folds=%d", len(rows), in_path, cfg.label, cfg.policy, cfg.folds
    )
    if cache_path:  # this stage's own cache file, a DVC out (persist): present even when nothing is embedded
        from clariedge.embed import ensure_cache

        ensure_cache(cache_path)
    result = transform(rows, cfg, rng=random.Random(seed), cache_path=cache_path)
    if result.sent_back:
        warned = {w["category"] for w in result.stats["category_warnings"]}
        first = [ex.id for ex in result.sent_back if ex.category in warned]
        result.stats["send_back_result"] = send_back(result.sent_back, review_cfg, first=first)
    write_records(out_path, result.rows)
    write_issues_csv(issues_csv, result.issues)
    note = f"{len(rows)} rows in {len({ex.conversation_id for ex in rows})} conversations: too few to cross-validate"
    plot_confusion(confusion_png, result.confusion, note=note)
    write_text(issues_md, render_report(result, cfg, cfg.report_top))
    result.stats["seconds_total"] = round(time.perf_counter() - t0, 2)
    if stats_path:
        write_json(stats_path, {k: v for k, v in result.stats.items() if not k.startswith("seconds")})
    log.info(
        "clean: flagged %d, rows out %d (%s)",
        result.stats["flagged"],
        len(result.rows),
        {k: result.stats.get(k) for k in ("dropped", "relabeled", "sent_back")},
    )
    return result.stats


def send_back(examples: list[Example], review_cfg: Any, *, first: list[str] | tuple[str, ...] = ()) -> Any:
    """Hand flagged rows to the review stage (Argilla's recheck dataset) when it is available.

    `examples` come in queue order (`send_back_order`): the rows whose ids are in `first` (those of a
    warned category), then the others, each part worst label quality first. Review's `send_back` pushes
    them in that same order (it is given `first` and the scores), so annotators meet them in it. In review
    mode `none` the rows are only marked `pending` (already done by the policy) and listed in the issues file.
    """
    if review_cfg is None:
        return {"records": len(examples), "sent": 0, "skipped_reason": "no review config given"}
    return review.send_back(examples, {e.id: e.label_quality for e in examples}, review_cfg, first=first)
