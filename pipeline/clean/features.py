"""Features and out-of-sample probabilities: MiniLM embeddings + scalars, a grouped-CV classifier."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from clariedge.clean.config import CAT_INDEX, CleanConfig
from clariedge.schema import AMBIGUOUS, CATEGORIES, Example
from clariedge.text import alnum_tokens

_AMB_DOCS = CAT_INDEX["ambiguous_documents"]


def feature_texts(ex: Example, context_messages: int = 2, context_chars: int = 600) -> tuple[str, str, str]:
    """(dialog before the turn, most recent first; the turn; the document titles) for embedding."""
    prior = ex.messages[:-1][-context_messages:] if context_messages else []
    dialog = "\n".join(f"{m.role}: {m.content}" for m in reversed(prior))[:context_chars]
    titles = "; ".join((d.title or d.text[:80]).strip() for d in ex.documents)
    return dialog, ex.last_turn, titles


N_SCALARS = 8


def _long_tokens(text: str) -> set[str]:
    return {t for t in alnum_tokens(text) if len(t) >= 3}


def _overlap(turn: str, context: str) -> float:
    """Share of the turn's words (3+ letters) that occur in the context: does the context pin it down?"""
    words = _long_tokens(turn)
    return len(words & _long_tokens(context)) / len(words) if words else 0.0


def build_features(
    rows: list[Example],
    cache_path: str | Path | None,
    *,
    context_messages: int = 2,
    context_chars: int = 600,
) -> np.ndarray:
    """MiniLM features: [dialog | turn | titles] embeddings + scalars; empty texts get zero vectors."""
    from clariedge.embed import DIM, embed

    texts = [feature_texts(ex, context_messages, context_chars) for ex in rows]
    flat = sorted({t for triple in texts for t in triple if t})
    vecs = embed(flat, cache_path=cache_path) if flat else np.zeros((0, DIM), np.float32)
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


def _classifier(cfg: CleanConfig, seed: int, n_features: int, least: int = 3):
    """PCA of the embedding blocks (fitted inside the fold) + the scalars -> standardised logistic regression,
    calibrated in up to 3 inner folds (`least`: rows of the training part's rarest category; under 2 rows
    there is nothing to calibrate on, and sklearn refuses more folds than that category has rows)."""
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
    if cfg.calibration == "none" or least < 2:
        return base
    return CalibratedClassifierCV(base, method=cfg.calibration, cv=min(3, least))


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
        least = int(np.bincount(categories[train_idx])[present].min())
        clf = _classifier(cfg, seed, features.shape[1], least)
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


def confusion_counts(cats: np.ndarray, cat_probs: np.ndarray) -> dict[str, Any]:
    """Given category x out-of-sample predicted category counts (for the plot and the report)."""
    pred = cat_probs.argmax(axis=1)
    matrix = np.zeros((len(CATEGORIES), len(CATEGORIES)), int)
    for g, p in zip(cats, pred, strict=True):
        matrix[g, p] += 1
    return {"classes": list(CATEGORIES), "matrix": matrix.tolist()}
