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
         `clean.min_rows`, `clean.context_messages`, `clean.context_chars`, `clean.datalab`, `clean.report_top`,
         `clean.embed_batch_size`; the top-level `seed`.

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
  lead the review queue, worst first, then the other flagged rows (`send_back_queue`; review's
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
"""

from __future__ import annotations

import logging
import math
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from clariedge.config import StageConfig
from clariedge.io import read_records, write_json, write_records, write_text
from clariedge.schema import AMBIGUOUS, CATEGORIES, Category, Example

log = logging.getLogger(__name__)

Policy = Literal["drop", "relabel", "send_back"]
NEEDS_CLASSES = ("CLEAR", "CLARIFY")  # index = int(needs_clarification)
_CAT_INDEX = {c: i for i, c in enumerate(CATEGORIES)}
_AMB_DOCS = _CAT_INDEX["ambiguous_documents"]


class DatalabConfig(StageConfig):
    enabled: bool
    near_duplicate: bool
    outlier: bool


class CategoryWarningConfig(StageConfig):
    """params.yaml `clean.category_warning:` (a category whose labels look wrong as a whole)."""

    max_ratio: float = Field(
        ge=0.0, le=1.0, description="warn below this x the other rows' median label quality (0: never)"
    )
    min_rows: int = Field(ge=1, description="categories with fewer rows are never warned about")
    send_back_all: bool = Field(
        description="policy send_back: every row of a warned category goes back, not only its capped flags"
    )


class CleanConfig(StageConfig):
    """params.yaml `clean:`; see the module docstring."""

    label: Literal["needs_clarification", "category"]
    policy: Policy
    folds: int = Field(ge=2)
    C: float = Field(gt=0)
    pca_components: int = Field(ge=0, description="PCA size for the embedding blocks; 0 keeps all 1152 dims")
    calibration: Literal["none", "sigmoid", "isotonic"]
    filter_by: Literal["prune_by_noise_rate", "prune_by_class", "both", "confident_learning", "predicted_neq_given"]
    max_flag_fraction: float = Field(ge=0.0, le=1.0)
    category_warning: CategoryWarningConfig
    report_only_categories: list[Category] = Field(
        description="categories whose classifier-only flags are reported but never acted on",
    )
    min_consensus_quality: float = Field(ge=0.0, le=1.0)
    min_rows: int = Field(ge=2)
    context_messages: int = Field(ge=0, description="dialog messages before the turn used as features")
    context_chars: int = Field(ge=0, description="the dialog text is cut to this many characters")
    datalab: DatalabConfig
    report_top: int = Field(ge=0)
    embed_batch_size: int = Field(ge=1)


# ---------------------------------------------------------------------------------------------
# Features and out-of-sample probabilities
# ---------------------------------------------------------------------------------------------
def feature_texts(ex: Example, context_messages: int = 2, context_chars: int = 600) -> tuple[str, str, str]:
    """(dialog before the turn, most recent first; the turn; the document titles) for embedding."""
    prior = ex.messages[:-1][-context_messages:] if context_messages else []
    dialog = "\n".join(f"{m.role}: {m.content}" for m in reversed(prior))[:context_chars]
    titles = "; ".join((d.title or d.text[:80]).strip() for d in ex.documents)
    return dialog, ex.last_turn, titles


_WORD = re.compile(r"[a-z0-9]{3,}")
N_SCALARS = 8


def _overlap(turn: str, context: str) -> float:
    """Share of the turn's words (3+ letters) that occur in the context: does the context pin it down?"""
    words = set(_WORD.findall(turn.lower()))
    return len(words & set(_WORD.findall(context.lower()))) / len(words) if words else 0.0


def build_features(
    rows: list[Example],
    cache_path: str | Path | None,
    *,
    context_messages: int = 2,
    context_chars: int = 600,
    batch_size: int = 64,
) -> np.ndarray:
    """MiniLM features: [dialog | turn | titles] embeddings + scalars; empty texts get zero vectors."""
    from clariedge.embed import DIM, embed

    texts = [feature_texts(ex, context_messages, context_chars) for ex in rows]
    flat = sorted({t for triple in texts for t in triple if t})
    vecs = embed(flat, cache_path=cache_path, batch_size=batch_size) if flat else np.zeros((0, DIM), np.float32)
    index = {t: i for i, t in enumerate(flat)}
    zero = np.zeros(DIM, np.float32)

    def vec(t: str) -> np.ndarray:
        return vecs[index[t]] if t else zero

    out = np.zeros((len(rows), 3 * DIM + N_SCALARS), np.float32)
    for i, (ex, (dialog, turn, titles)) in enumerate(zip(rows, texts, strict=True)):
        d, t, ti = vec(dialog), vec(turn), vec(titles)
        scalars = [
            float(ex.setting == "post_retrieval"),
            float(bool(dialog)),
            math.log1p(len(ex.messages)),
            float(t @ d),
            float(t @ ti),
            math.log1p(len(turn.split())),
            _overlap(turn, dialog),
            _overlap(turn, titles),
        ]
        out[i] = np.concatenate([d, t, ti, np.asarray(scalars, np.float32)])
    return out


def _classifier(cfg: CleanConfig, seed: int, n_features: int):
    """PCA of the embedding blocks (fitted inside the fold) + the scalars -> standardised logistic regression."""
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.compose import ColumnTransformer
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    n_emb = n_features - N_SCALARS
    steps = []
    if cfg.pca_components:
        steps.append(
            ColumnTransformer(
                [
                    ("embeddings", PCA(n_components=cfg.pca_components, random_state=seed), list(range(n_emb))),
                    ("scalars", "passthrough", list(range(n_emb, n_features))),
                ]
            )
        )
    base = make_pipeline(*steps, StandardScaler(), LogisticRegression(C=cfg.C, max_iter=2000, random_state=seed))
    if cfg.calibration == "none":
        return base
    return CalibratedClassifierCV(base, method=cfg.calibration, cv=3)


def out_of_sample_probs(
    features: np.ndarray, categories: np.ndarray, groups: list[str], settings: list[str], cfg: CleanConfig, seed: int
) -> tuple[np.ndarray, int]:
    """Category probabilities (N, 4) predicted for each row by a model that never saw its conversation."""
    from sklearn.model_selection import StratifiedGroupKFold

    n_groups = len(set(groups))
    folds = min(cfg.folds, n_groups)
    probs = np.zeros((len(categories), len(CATEGORIES)), np.float64)
    splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    for train_idx, test_idx in splitter.split(features, categories, groups):
        present = np.unique(categories[train_idx])
        if len(present) == 1:  # a fold whose training part holds one class: predict that class
            probs[np.ix_(test_idx, present)] = 1.0
            continue
        clf = _classifier(cfg, seed, features.shape[1])
        clf.fit(features[train_idx], categories[train_idx])
        probs[np.ix_(test_idx, clf.classes_)] = clf.predict_proba(features[test_idx])
    pre = np.asarray([s == "pre_retrieval" for s in settings])
    probs[pre, _AMB_DOCS] = 0.0  # ambiguous_documents does not exist before retrieval
    probs = np.clip(probs, 1e-6, None)
    probs /= probs.sum(axis=1, keepdims=True)
    return probs, folds


def needs_probs(cat_probs: np.ndarray) -> np.ndarray:
    """(N, 2) [p(CLEAR), p(CLARIFY)] from category probabilities."""
    amb = np.asarray([c in AMBIGUOUS for c in CATEGORIES])
    p_yes = cat_probs[:, amb].sum(axis=1)
    return np.stack([1.0 - p_yes, p_yes], axis=1)


# ---------------------------------------------------------------------------------------------
# Labels: single source and several annotators
# ---------------------------------------------------------------------------------------------
def class_names(cfg: CleanConfig) -> tuple[str, ...]:
    return NEEDS_CLASSES if cfg.label == "needs_clarification" else CATEGORIES


def row_label(ex: Example, cfg: CleanConfig) -> int:
    return int(ex.needs_clarification) if cfg.label == "needs_clarification" else _CAT_INDEX[ex.category]


def annotation_label(ann: Any, cfg: CleanConfig) -> int | None:
    """An annotator's label in the configured label space, or None when the response has none."""
    if ann.status != "submitted":
        return None
    if cfg.label == "category":
        return _CAT_INDEX[ann.category] if ann.category else None
    if ann.needs_clarification is not None:
        return int(ann.needs_clarification)
    return int(ann.category in AMBIGUOUS) if ann.category else None


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


# ---------------------------------------------------------------------------------------------
# Category warnings and the send-back queue
# ---------------------------------------------------------------------------------------------
def category_warnings(rows: list[Example], quality: np.ndarray, cfg: CategoryWarningConfig) -> list[dict[str, Any]]:
    """Categories whose median label quality is below `cfg.max_ratio` x the median of every other
    category's rows (pooled), among categories with at least `cfg.min_rows` rows; worst ratio first.

    The per-category flag cap protects a rare category from a classifier that cannot tell it apart,
    but it also lets a category whose labels are wrong as a whole through; this names such a category.
    """
    if cfg.max_ratio <= 0:
        return []
    cats = np.asarray([ex.category for ex in rows])
    quality = np.asarray(quality, float)
    out = []
    for cat in sorted(set(cats.tolist())):
        mine, others = quality[cats == cat], quality[cats != cat]
        if len(mine) < cfg.min_rows or not len(others):
            continue
        med, others_med = float(np.median(mine)), float(np.median(others))
        if others_med <= 0:
            continue
        ratio = med / others_med
        if ratio < cfg.max_ratio:
            out.append(
                {
                    "category": cat,
                    "rows": int(len(mine)),
                    "median_label_quality": round(med, 4),
                    "others_median_label_quality": round(others_med, 4),
                    "ratio": round(ratio, 4),
                }
            )
    return sorted(out, key=lambda w: (w["ratio"], w["category"]))


def send_back_queue(examples: list[Example], warned: set[str]) -> list[Example]:
    """The order rows go back to review in: rows of a warned category first, then the other flagged rows;
    each part worst label quality first (ties by id)."""

    def key(ex: Example) -> tuple[bool, float, str]:
        lq = ex.label_quality if ex.label_quality is not None else 1.0
        return (ex.category not in warned, lq, ex.id)

    return sorted(examples, key=key)


# ---------------------------------------------------------------------------------------------
# Relabelling (see the module docstring for the rule)
# ---------------------------------------------------------------------------------------------
def _voters(ex: Example, new_label: int, cfg: CleanConfig) -> list[Any]:
    return [a for a in ex.annotations if annotation_label(a, cfg) == new_label]


def relabel(ex: Example, new_label: int, cfg: CleanConfig) -> Example | None:
    """The row with its label set to `new_label`, kept consistent; None when no question is available."""
    voters = _voters(ex, new_label, cfg)
    if cfg.label == "category":
        new_cat = CATEGORIES[new_label]
    else:
        want_amb = bool(new_label)
        cats = Counter(a.category for a in voters if a.category and (a.category in AMBIGUOUS) == want_amb)
        default = "ambiguous_dialog" if want_amb else "hard_negative"
        new_cat = min(cats.items(), key=lambda kv: (-kv[1], kv[0]))[0] if cats else default
    if new_cat == "ambiguous_documents" and ex.setting != "post_retrieval":
        new_cat = "ambiguous_dialog"
    if new_cat == ex.category:
        return ex
    data = ex.model_dump()
    data.update(category=new_cat, needs_clarification=new_cat in AMBIGUOUS, id="")
    if new_cat in AMBIGUOUS and ex.category not in AMBIGUOUS:
        questions = Counter(a.clarification for a in voters if a.clarification)
        if not questions:
            return None
        data["clarification"] = min(questions.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    elif new_cat not in AMBIGUOUS and ex.category in AMBIGUOUS:
        data.update(clarification=None, interpretations=[])
    return Example.model_validate(data)


# ---------------------------------------------------------------------------------------------
# The pure core
# ---------------------------------------------------------------------------------------------
@dataclass
class CleanResult:
    rows: list[Example]
    issues: list[dict[str, Any]]
    annotators: list[dict[str, Any]]
    confusion: dict[str, Any]
    stats: dict[str, Any]
    sent_back: list[Example] = field(default_factory=list)


def _short(text: str, n: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


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
    names = class_names(cfg)
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
            batch_size=cfg.embed_batch_size,
        )
    stats["seconds_features"] = round(time.perf_counter() - t0, 2)
    cats = np.asarray([_CAT_INDEX[ex.category] for ex in rows])
    t1 = time.perf_counter()
    cat_probs, folds = out_of_sample_probs(features, cats, groups, [ex.setting for ex in rows], cfg, seed)
    stats["seconds_cv"] = round(time.perf_counter() - t1, 2)
    probs = needs_probs(cat_probs) if cfg.label == "needs_clarification" else cat_probs
    labels = np.asarray([row_label(ex, cfg) for ex in rows])
    predicted = probs.argmax(axis=1)
    stats.update(
        folds=folds,
        cv_accuracy=round(float((predicted == labels).mean()), 4),
        cv_accuracy_category=round(float((cat_probs.argmax(axis=1) == cats).mean()), 4),
        cv_accuracy_needs_clarification=round(
            float(
                (
                    needs_probs(cat_probs).argmax(axis=1) == np.asarray([int(ex.needs_clarification) for ex in rows])
                ).mean()
            ),
            4,
        ),
    )

    # one label source: cleanlab's confident learning over every row
    flagged, quality = single_source_issues(labels, probs, cfg)
    reasons: list[list[str]] = [[] for _ in rows]
    target = predicted.copy()  # the label a relabel moves to
    source = ["single"] * len(rows)
    agreement = [None] * len(rows)
    num_ann = [0] * len(rows)
    for i in np.flatnonzero(flagged):
        reasons[i].append(
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
        reasons[i] = []
    stats["flag_cap"] = sum(caps.values())
    stats["unflagged_by_cap"] = len(capped)

    # several annotators: CROWDLAB consensus replaces the single-source verdict on annotated rows
    multi = multiannotator(rows, probs, cfg)
    annotators: list[dict[str, Any]] = []
    if multi is not None:
        annotators = multi.annotators
        for j, i in enumerate(multi.rows):
            flagged[i] = False
            reasons[i] = []
            source[i] = "multiannotator"
            quality[i] = multi.quality[j]
            agreement[i] = round(float(multi.agreement[j]), 6)
            num_ann[i] = int(multi.num_annotations[j])
            target[i] = multi.consensus[j]
            if multi.consensus[j] != labels[i]:
                flagged[i] = True
                reasons[i].append(
                    f"consensus_disagrees: row says {names[labels[i]]}, {num_ann[i]} annotators' consensus is "
                    f"{names[multi.consensus[j]]} (agreement {multi.agreement[j]:.2f})"
                )
            if multi.quality[j] < cfg.min_consensus_quality:
                flagged[i] = True
                reasons[i].append(f"low_consensus_quality: {multi.quality[j]:.2f} < {cfg.min_consensus_quality}")
        stats["annotated_rows"] = len(multi.rows)
        stats["annotators"] = len(annotators)
        stats["mean_annotator_agreement"] = round(float(np.mean(multi.agreement)), 4)
    else:
        stats["annotated_rows"] = 0
        stats["annotators"] = 0

    # a category whose labels look wrong as a whole: the per-category cap would let most of it through
    warnings = category_warnings(rows, quality, cfg.category_warning)
    stats["median_label_quality_by_category"] = {
        cat: round(float(np.median([quality[i] for i, ex in enumerate(rows) if ex.category == cat])), 4)
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
            if w is None or source[i] != "single" or ex.category in cfg.report_only_categories:
                continue
            by_warning += not flagged[i]
            flagged[i] = True
            reasons[i].append(
                f"category_warning: {ex.category} median label quality {w['median_label_quality']:.2f} is "
                f"{w['ratio']:.2f} x the other rows' ({w['others_median_label_quality']:.2f})"
            )
    stats["flagged_by_category_warning"] = by_warning

    # extra signals from Datalab (reported, not acted on)
    extra = datalab_signals(features, labels, rows, cfg) if cfg.datalab.enabled else {}
    stats.update(extra.pop("_stats", {}))

    out, issues, sent_back = apply_policy(
        rows, cfg, flagged, quality, target, labels, reasons, extra, source, agreement, num_ann, probs
    )
    sent_back = send_back_queue(sent_back, set(warned))
    counts = Counter(r["action"] for r in issues)
    stats.update(
        flagged=int(flagged.sum()),
        rows_out=len(out),
        dropped=counts.get("drop", 0) + counts.get("drop_no_question", 0),
        dropped_no_question=counts.get("drop_no_question", 0),
        relabeled=counts.get("relabel", 0),
        sent_back=counts.get("send_back", 0),
        sent_back_first=sum(ex.category in warned for ex in sent_back),
        report_only=counts.get("report_only", 0),
        mean_label_quality=round(float(np.mean(quality)), 4),
        flagged_by_category=dict(sorted(Counter(rows[i].category for i in np.flatnonzero(flagged)).items())),
    )
    confusion = confusion_counts(labels, cats, cat_probs, names)
    return CleanResult(out, issues, annotators, confusion, stats, sent_back)


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


def apply_policy(
    rows: list[Example],
    cfg: CleanConfig,
    flagged: np.ndarray,
    quality: np.ndarray,
    target: np.ndarray,
    labels: np.ndarray,
    reasons: list[list[str]],
    extra: dict[int, list[str]],
    source: list[str],
    agreement: list[float | None],
    num_ann: list[int],
    probs: np.ndarray,
) -> tuple[list[Example], list[dict[str, Any]], list[Example]]:
    """Apply drop / relabel / send_back to flagged rows; set label_quality on every kept row."""
    names = class_names(cfg)
    out: list[Example] = []
    issues: list[dict[str, Any]] = []
    sent_back: list[Example] = []
    seen_ids: set[str] = set()
    for i, ex in enumerate(rows):
        lq = round(float(quality[i]), 6)
        action, new = "keep", ex
        if flagged[i]:
            if source[i] == "single" and ex.category in cfg.report_only_categories:
                action = "report_only"  # the classifier alone may not remove or change this category
            elif cfg.policy == "drop":
                action, new = "drop", None
            elif cfg.policy == "send_back":
                action = "send_back"
                new = ex.model_copy(update={"review_status": "pending"})
            elif target[i] == labels[i]:
                action = "keep"  # nothing to relabel to (e.g. low consensus quality but label = consensus)
            else:
                new = relabel(ex, int(target[i]), cfg)
                action = "relabel" if new is not None else "drop_no_question"
        if new is not None:
            new = new.model_copy(update={"label_quality": lq})
            if new.id in seen_ids:  # a relabel produced a row that already exists
                action, new = "drop_duplicate_after_relabel", None
            else:
                seen_ids.add(new.id)
                out.append(new)
                if action == "send_back":
                    sent_back.append(new)
        if flagged[i] or extra.get(i):
            issues.append(
                {
                    "id": ex.id,
                    "conversation_id": ex.conversation_id,
                    "setting": ex.setting,
                    "category": ex.category,
                    "given_label": names[labels[i]],
                    "suggested_label": names[target[i]],
                    "p_given": round(float(probs[i, labels[i]]), 6),
                    "label_quality": lq,
                    "source": source[i],
                    "num_annotations": num_ann[i],
                    "annotator_agreement": agreement[i],
                    "flagged": bool(flagged[i]),
                    "action": action if flagged[i] else "keep",
                    "new_id": new.id if new is not None and new.id != ex.id else "",
                    "new_category": new.category if new is not None and new.category != ex.category else "",
                    "reasons": "; ".join(reasons[i] + extra.get(i, [])),
                    "last_turn": _short(ex.last_turn),
                }
            )
    issues.sort(key=lambda r: (not r["flagged"], r["label_quality"], r["id"]))
    return out, issues, sent_back


def confusion_counts(
    labels: np.ndarray, cats: np.ndarray, cat_probs: np.ndarray, names: tuple[str, ...]
) -> dict[str, Any]:
    """Given category x out-of-sample predicted category counts (for the plot and the report)."""
    pred = cat_probs.argmax(axis=1)
    matrix = np.zeros((len(CATEGORIES), len(CATEGORIES)), int)
    for g, p in zip(cats, pred, strict=True):
        matrix[g, p] += 1
    return {"classes": list(CATEGORIES), "matrix": matrix.tolist()}


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------
ISSUE_COLUMNS = [
    "id",
    "conversation_id",
    "setting",
    "category",
    "given_label",
    "suggested_label",
    "p_given",
    "label_quality",
    "source",
    "num_annotations",
    "annotator_agreement",
    "flagged",
    "action",
    "new_id",
    "new_category",
    "reasons",
    "last_turn",
]


def write_issues_csv(path: str | Path, issues: list[dict[str, Any]]) -> None:
    import csv
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=ISSUE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in issues:
        writer.writerow({k: "" if row[k] is None else row[k] for k in ISSUE_COLUMNS})
    write_text(path, buf.getvalue())


def plot_confusion(path: str | Path, confusion: dict[str, Any], note: str = "") -> None:
    """The given-vs-predicted matrix; with no matrix (rows passed through unscored), a figure saying why.

    The file is a declared DVC output, so it is written in both cases."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from clariedge.io import save_figure

    if not confusion:
        fig, ax = plt.subplots(figsize=(6, 2), dpi=100)
        ax.axis("off")
        ax.text(0.5, 0.5, f"clean: not scored\n{note}", ha="center", va="center", wrap=True)
        save_figure(fig, path)
        return
    matrix = np.asarray(confusion["matrix"])
    classes = confusion["classes"]
    fig, ax = plt.subplots(figsize=(6, 5), dpi=100)
    norm = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    for r in range(len(classes)):
        for c in range(len(classes)):
            ax.text(c, r, str(matrix[r, c]), ha="center", va="center", color="white" if norm[r, c] > 0.5 else "black")
    ax.set_xticks(range(len(classes)), classes, rotation=30, ha="right")
    ax.set_yticks(range(len(classes)), classes)
    ax.set_xlabel("out-of-sample predicted category")
    ax.set_ylabel("given category")
    ax.set_title("clean: given vs predicted (grouped CV)")
    fig.tight_layout()
    save_figure(fig, path)


def render_category_warnings(result: CleanResult, cfg: CleanConfig) -> list[str]:
    """The report's first section: categories whose labels look wrong as a whole (none: no lines)."""
    s = result.stats
    warnings = s.get("category_warnings") or []
    if not warnings:
        return []
    lines = [
        "## Category warnings",
        "",
        f"**{len(warnings)} categor{'y' if len(warnings) == 1 else 'ies'} with a median label quality below "
        f"{cfg.category_warning.max_ratio} x the other categories' rows.** The labels of the whole category may be "
        f"wrong: row-by-row flags catch few rows of a category that is wrong as a whole, and the per-category cap "
        f"flags at most {cfg.max_flag_fraction:.0%} of it.",
        "",
        "| category | rows | median label quality | other rows' median | ratio |",
        "| --- | --- | --- | --- | --- |",
    ]
    for w in warnings:
        lines.append(
            f"| {w['category']} | {w['rows']} | {w['median_label_quality']:.3f} | "
            f"{w['others_median_label_quality']:.3f} | {w['ratio']:.2f} |"
        )
    lines.append("")
    warned = {w["category"] for w in warnings}
    if cfg.policy == "send_back":
        skipped = sorted(warned & set(cfg.report_only_categories))
        lines.append(
            f"Policy `send_back`: {s.get('sent_back_first', 0)} rows of the warned categories lead the review "
            "queue (worst label quality first), ahead of the other flagged rows"
            + (
                "; every classifier-scored row of theirs is sent back (`category_warning.send_back_all`)"
                if cfg.category_warning.send_back_all
                else "; only their flagged rows are sent back (`category_warning.send_back_all: false`)"
            )
            + (f". Report-only categories are not sent back: {', '.join(skipped)}." if skipped else ".")
        )
    else:
        lines.append(
            f"Policy `{cfg.policy}` acts only on the capped flags: read a sample of these categories' rows, or run "
            "with `policy: send_back` to have a person check them, worst first."
        )
    worst = sorted(
        (r for r in result.issues if r["category"] in warned and r["flagged"]),
        key=lambda r: (r["label_quality"], r["id"]),
    )[: cfg.report_top]
    if worst:
        lines += ["", "| category | label quality | action | turn |", "| --- | --- | --- | --- |"]
        for r in worst:
            turn = r["last_turn"].replace("|", "\\|")
            lines.append(f"| {r['category']} | {r['label_quality']:.3f} | {r['action']} | {turn} |")
    lines.append("")
    return lines


def render_report(result: CleanResult, cfg: CleanConfig, top: int) -> str:
    s = result.stats
    lines = ["# Label issues", ""]
    lines += render_category_warnings(result, cfg)
    lines += [
        f"Label checked: `{cfg.label}`; policy: `{cfg.policy}`. Rows in: {s['rows_in']}, rows out: {s['rows_out']}.",
        "",
    ]
    if s.get("skipped"):
        lines += [f"Cleaning skipped: {s['skipped']} (fewer than {cfg.min_rows} rows or one conversation).", ""]
        return "\n".join(lines)
    lines += [
        "| measure | value |",
        "| --- | --- |",
        f"| folds (grouped by conversation) | {s['folds']} |",
        f"| out-of-sample accuracy, {cfg.label} | {s['cv_accuracy']} |",
        f"| out-of-sample accuracy, category | {s['cv_accuracy_category']} |",
        f"| flagged | {s['flagged']} (per-category cap {cfg.max_flag_fraction:.0%}: {s['unflagged_by_cap']} more left "
        f"unflagged; {s.get('flagged_by_category_warning', 0)} more as their category is warned about) |",
        f"| dropped / relabelled / sent back / report only | {s['dropped']} / {s['relabeled']} / {s['sent_back']} / "
        f"{s['report_only']} |",
        f"| mean label quality | {s['mean_label_quality']} |",
        f"| annotated rows / annotators | {s['annotated_rows']} / {s['annotators']} |",
    ]
    if "mean_annotator_agreement" in s:
        lines.append(f"| mean annotator agreement with consensus | {s['mean_annotator_agreement']} |")
    for key in ("near_duplicates", "near_duplicate_label_conflicts", "outliers"):
        if key in s:
            lines.append(f"| Datalab {key.replace('_', ' ')} (reported only) | {s[key]} |")
    lines += ["", "![confusion](confusion.png)", ""]
    by_cat = s.get("median_label_quality_by_category", {})
    if by_cat:
        rows_by_cat = Counter(r["category"] for r in result.issues if r["flagged"])
        lines += [
            "## Label quality by category",
            "",
            "| category | median label quality | flagged |",
            "| --- | --- | --- |",
            *(f"| {c} | {m:.3f} | {rows_by_cat.get(c, 0)} |" for c, m in by_cat.items()),
            "",
        ]
    conf = result.confusion
    if conf:
        lines += [
            "## Given vs predicted category",
            "",
            "| given \\ predicted | " + " | ".join(conf["classes"]) + " |",
            "| --- |" + " --- |" * len(conf["classes"]),
        ]
        for name, row in zip(conf["classes"], conf["matrix"], strict=True):
            lines.append(f"| {name} | " + " | ".join(str(v) for v in row) + " |")
        lines.append("")
    if result.annotators:
        lines += [
            "## Annotators (CROWDLAB, lowest quality first)",
            "",
            "| annotator | quality | labeled | agreement with consensus | worst class |",
            "| --- | --- | --- | --- | --- |",
        ]
        for a in result.annotators:
            lines.append(
                f"| {a['annotator']} | {a['annotator_quality']:.3f} | {a['num_examples_labeled']} | "
                f"{a['agreement_with_consensus']:.3f} | {a['worst_class'] or ''} |"
            )
        lines.append("")
    flagged = [r for r in result.issues if r["flagged"]]
    lines += [f"## Flagged rows (worst {min(top, len(flagged))} of {len(flagged)}; all in label_issues.csv)", ""]
    if flagged:
        lines += ["| label quality | action | given -> suggested | turn | why |", "| --- | --- | --- | --- | --- |"]
        for r in flagged[:top]:
            turn = r["last_turn"].replace("|", "\\|")
            why = r["reasons"].replace("|", "\\|")
            lines.append(
                f"| {r['label_quality']:.3f} | {r['action']} | {r['given_label']} -> {r['suggested_label']} "
                f"| {turn} | {why} |"
            )
    lines.append("")
    return "\n".join(lines)


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

    `examples` come in queue order (`send_back_queue`): the rows whose ids are in `first` (those of a
    warned category), then the others, each part worst label quality first. Review's `send_back` pushes
    them in that same order (it is given `first` and the scores), so annotators meet them in it. In review
    mode `none` the rows are only marked `pending` (already done by the policy) and listed in the issues file.
    """
    if review_cfg is None:
        return {"records": len(examples), "sent": 0, "skipped_reason": "no review config given"}
    from clariedge.annotation.review import send_back as review_send_back

    return review_send_back(examples, {e.id: e.label_quality for e in examples}, review_cfg, first=first)
