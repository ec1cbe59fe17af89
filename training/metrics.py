"""Evaluation metrics as pure functions: the decision (needs_clarification) and the clarification's wording.

Decision: accuracy, precision, recall, F1 of the positive class `needs_clarification`, the
confusion counts, accuracy per group (category, setting), and the false-positive rate on hard
negatives (the share of hard negatives the model wrongly asks about).
Wording, against the reference question: ROUGE-L (F-measure of the longest common subsequence of
lower-cased word tokens), embedding cosine similarity (vectors come from the caller), and the share
of gold interpretations the question names (an interpretation is named when at least half of its
content words occur in the question).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from clariedge.text import METRIC_STOP, alnum_tokens


def _ratio(num: float, den: float) -> float:
    return round(num / den, 4) if den else 0.0


def classification(y_true: Sequence[bool], y_pred: Sequence[bool]) -> dict[str, Any]:
    """Accuracy, precision, recall, F1 (positive class: needs clarification) and the confusion counts."""
    if len(y_true) != len(y_pred):
        raise ValueError(f"classification: {len(y_true)} labels but {len(y_pred)} predictions")
    tp = sum(t and p for t, p in zip(y_true, y_pred, strict=True))
    fp = sum((not t) and p for t, p in zip(y_true, y_pred, strict=True))
    fn = sum(t and (not p) for t, p in zip(y_true, y_pred, strict=True))
    tn = len(y_true) - tp - fp - fn
    precision = _ratio(tp, tp + fp)
    recall = _ratio(tp, tp + fn)
    f1 = round(2 * precision * recall / (precision + recall), 4) if precision + recall else 0.0
    return {
        "n": len(y_true),
        "accuracy": _ratio(tp + tn, len(y_true)),
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "confusion": {"tp": tp, "fp": fp, "fn": fn, "tn": tn},
    }


def accuracy_by(groups: Sequence[str], y_true: Sequence[bool], y_pred: Sequence[bool]) -> dict[str, dict[str, Any]]:
    """{group: {n, accuracy}} for each distinct group value."""
    hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for g, t, p in zip(groups, y_true, y_pred, strict=True):
        hits[g][0] += int(t == p)
        hits[g][1] += 1
    return {g: {"n": n, "accuracy": _ratio(h, n)} for g, (h, n) in sorted(hits.items())}


def false_positive_rate(
    categories: Sequence[str], y_pred: Sequence[bool], category: str = "hard_negative"
) -> float | None:
    """Share of rows of `category` (gold: no clarification) predicted as needing one; None if there are none."""
    preds = [p for c, p in zip(categories, y_pred, strict=True) if c == category]
    return _ratio(sum(preds), len(preds)) if preds else None


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence (dynamic programming, O(len(a) * len(b)))."""
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure (beta = 1) over lower-cased alphanumeric word tokens."""
    p, r = alnum_tokens(prediction), alnum_tokens(reference)
    lcs = lcs_length(p, r)
    if not lcs:
        return 0.0
    prec, rec = lcs / len(p), lcs / len(r)
    return 2 * prec * rec / (prec + rec)


def content_words(text: str) -> set[str]:
    """`alnum_tokens` less `METRIC_STOP`: tokens of 3+ characters, and numbers of any length."""
    return {w for w in alnum_tokens(text) if w not in METRIC_STOP and (len(w) > 2 or w.isdigit())}


def names_interpretation(question: str, interpretation: str, threshold: float = 0.5) -> bool:
    """True when at least `threshold` of the interpretation's content words occur in the question."""
    words = content_words(interpretation)
    if not words:
        return False
    q = content_words(question)
    return len(words & q) / len(words) >= threshold


def interpretation_coverage(question: str, interpretations: Sequence[str]) -> float | None:
    """Share of the gold interpretations the question names; None when there are no gold interpretations."""
    if not interpretations:
        return None
    return sum(names_interpretation(question, i) for i in interpretations) / len(interpretations)


def mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(sum(vals) / len(vals), 4) if vals else None


def best_threshold(p_clear: Sequence[float], needs: Sequence[bool], metric: str = "accuracy") -> tuple[float, float]:
    """The threshold t (ask when p_clear < t) with the best `metric` (accuracy | balanced_accuracy: the mean
    of the recall of "ask" and of "answer", which does not reward never asking when few rows need a
    question), ties broken towards 0.5.

    Candidates are 0.5 and the midpoints between consecutive distinct scores. Returns (t, score).
    """
    if metric not in ("accuracy", "balanced_accuracy"):
        raise ValueError(f"metric {metric!r}: expected accuracy or balanced_accuracy")
    if not p_clear:
        return 0.5, 0.0
    vals = sorted(set(p_clear))
    cands = {0.5, vals[0] - 1e-6, vals[-1] + 1e-6} | {(a + b) / 2 for a, b in zip(vals, vals[1:], strict=False)}
    pos = sum(needs)
    neg = len(needs) - pos

    def acc(t: float) -> float:
        if metric == "accuracy" or not pos or not neg:
            return sum((p < t) == g for p, g in zip(p_clear, needs, strict=True)) / len(needs)
        tp = sum(p < t for p, g in zip(p_clear, needs, strict=True) if g)
        tn = sum(p >= t for p, g in zip(p_clear, needs, strict=True) if not g)
        return (tp / pos + tn / neg) / 2

    best = max(cands, key=lambda t: (acc(t), -abs(t - 0.5)))
    return round(best, 6), round(acc(best), 4)
