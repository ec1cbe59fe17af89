"""Construction stats and the shallow-separability report (how well the last turn alone gives the label away)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from clariedge.construct.config import ConstructConfig
from clariedge.construct.text import passage_terms, terms
from clariedge.schema import CATEGORIES, Example, asked_turn_id
from clariedge.text import words

if TYPE_CHECKING:
    from clariedge.construct.core import _Ctx


def _stats(rows: list[Example], ctx: _Ctx, n_seeds: int, cfg: ConstructConfig) -> dict[str, Any]:
    cells = Counter(f"{r.category}/{r.setting}" for r in rows)
    by_turn: dict[str, set[str]] = defaultdict(set)  # a written open variant is paired with its turn as asked
    for r in rows:
        by_turn[asked_turn_id(r.provenance.seed_id)].add(r.category)
    amb = [r for r in rows if r.needs_clarification]
    paired = sum(1 for r in amb if "hard_negative" in by_turn[asked_turn_id(r.provenance.seed_id)])
    stats: dict[str, Any] = {
        "seeds": n_seeds,
        "rows": len(rows),
        "by_category_setting": dict(sorted(cells.items())),
        "by_category": dict(sorted(Counter(r.category for r in rows).items())),
        "by_method": dict(sorted(Counter(r.provenance.method or "" for r in rows).items())),
        "skipped": dict(sorted(ctx.skipped.items())),
        "entity_groups": len(ctx.groups),
        "ambiguous_paired_with_hard_negative": round(paired / len(amb), 4) if amb else 0.0,
        "last_turn_words_mean": {
            c: round(
                sum(len(words(r.last_turn)) for r in rows if r.category == c)
                / max(1, sum(1 for r in rows if r.category == c)),
                2,
            )
            for c in CATEGORIES
        },
    }
    stats.update(ctx.rejects.counts())
    if cfg.separability:
        stats["shallow_separability"] = shallow_separability(rows, folds=cfg.separability_folds)
    return stats


def shallow_separability(rows: Sequence[Example], folds: int = 5) -> dict[str, Any]:
    """How well a bag-of-words logistic regression on the LAST TURN ALONE tells each category from the rest.

    Out-of-fold ROC AUC with folds grouped by conversation (0.5 = chance, 1.0 = a telltale artifact),
    per category (one vs rest), for the binary decision `needs_clarification`, and the same for the
    last turn's length alone, for its position (messages before it) alone, and, over the rows with passages, for
    the share of the turn's content words its passages contain (a retriever's keyword match), where artifacts show.
    """
    import numpy as np
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import GroupKFold

    texts = [r.last_turn for r in rows]
    groups = [r.conversation_id for r in rows]
    n_groups = len(set(groups))
    if n_groups < 2 or len(rows) < 10:
        return {"note": "too few rows or conversations"}
    k = min(folds, n_groups)
    lengths = np.array([len(words(t)) for t in texts], dtype=float)
    positions = np.array([len(r.messages) for r in rows], dtype=float)
    with_docs = np.array([bool(r.documents) for r in rows])
    overlap = np.array([passage_overlap(r) for r in rows])
    targets = {c: np.array([r.category == c for r in rows]) for c in CATEGORIES}
    targets["needs_clarification"] = np.array([r.needs_clarification for r in rows])
    bow: dict[str, float | None] = {}
    position: dict[str, float | None] = {}
    length: dict[str, float | None] = {}
    passages: dict[str, float | None] = {}
    splits = list(GroupKFold(n_splits=k).split(texts, groups=groups))
    for name, y in targets.items():
        yd = y[with_docs]
        passages[name] = _auc_either_way(yd, overlap[with_docs]) if yd.any() and not yd.all() else None
        if y.sum() < k or (~y).sum() < k:
            bow[name] = length[name] = position[name] = None
            continue
        oof = np.zeros(len(rows))
        for train, test in splits:
            if len(set(y[train])) < 2:
                oof[test] = y[train].mean()
                continue
            vec = CountVectorizer(lowercase=True, token_pattern=r"(?u)\b\w+\b", ngram_range=(1, 2), binary=True)
            x_train = vec.fit_transform([texts[i] for i in train])
            clf = LogisticRegression(max_iter=2000, C=1.0)
            clf.fit(x_train, y[train])
            oof[test] = clf.predict_proba(vec.transform([texts[i] for i in test]))[:, 1]
        bow[name] = round(float(roc_auc_score(y, oof)), 4)
        length[name] = _auc_either_way(y, lengths)
        position[name] = _auc_either_way(y, positions)
    return {
        "metric": "roc_auc_oof_grouped",
        "folds": k,
        "bow_last_turn": bow,
        "length_only": length,
        "position_only": position,
        "passage_overlap_only": passages,
    }


def _auc_either_way(y: Any, feature: Any) -> float:
    """ROC AUC of one feature, whichever way it points (0.5 = no signal)."""
    from sklearn.metrics import roc_auc_score

    auc = float(roc_auc_score(y, feature))
    return round(max(auc, 1 - auc), 4)


def passage_overlap(row: Example) -> float:
    """Share of the last turn's content terms that its passages contain (0 without passages)."""
    want = terms(row.last_turn)
    if not row.documents or not want:
        return 0.0
    return len(want & passage_terms(row.documents)) / len(want)
