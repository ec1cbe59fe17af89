"""What cleaning does with its verdicts: category warnings, the relabel rule, the policy (drop / relabel /
send_back) and the order rows go back to review in."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from clariedge.clean.config import CategoryWarningConfig, CleanConfig, annotation_label, class_names
from clariedge.schema import AMBIGUOUS, CATEGORIES, Example


@dataclass
class Verdicts:
    """Per-row scores and flags, index-aligned with the rows: what the policy acts on and the issues file shows."""

    labels: np.ndarray  # the given label, in the configured label space
    probs: np.ndarray  # out-of-sample probabilities in that space
    target: np.ndarray  # the label a relabel moves to
    flagged: np.ndarray
    quality: np.ndarray  # label quality (CROWDLAB's consensus quality on annotated rows)
    reasons: list[list[str]]
    source: list[str]  # "single" | "multiannotator"
    agreement: list[float | None]
    num_ann: list[int]


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


def _short(text: str, n: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _decide(ex: Example, i: int, v: Verdicts, cfg: CleanConfig) -> tuple[str, Example | None]:
    """(action, the row to keep or None) for row `i` under the policy."""
    if not v.flagged[i]:
        return "keep", ex
    if v.source[i] == "single" and ex.category in cfg.report_only_categories:
        return "report_only", ex  # the classifier alone may not remove or change this category
    if cfg.policy == "drop":
        return "drop", None
    if cfg.policy == "send_back":
        return "send_back", ex.model_copy(update={"review_status": "pending"})
    if v.target[i] == v.labels[i]:
        return "keep", ex  # nothing to relabel to (e.g. low consensus quality but label = consensus)
    new = relabel(ex, int(v.target[i]), cfg)
    return ("relabel" if new is not None else "drop_no_question"), new


def _issue(
    ex: Example, i: int, v: Verdicts, names: tuple[str, ...], action: str, new: Example | None, notes: list[str]
):
    """One row of the issues file."""
    return {
        "id": ex.id,
        "conversation_id": ex.conversation_id,
        "setting": ex.setting,
        "category": ex.category,
        "given_label": names[v.labels[i]],
        "suggested_label": names[v.target[i]],
        "p_given": round(float(v.probs[i, v.labels[i]]), 6),
        "label_quality": round(float(v.quality[i]), 6),
        "source": v.source[i],
        "num_annotations": v.num_ann[i],
        "annotator_agreement": v.agreement[i],
        "flagged": bool(v.flagged[i]),
        "action": action if v.flagged[i] else "keep",
        "new_id": new.id if new is not None and new.id != ex.id else "",
        "new_category": new.category if new is not None and new.category != ex.category else "",
        "reasons": "; ".join(v.reasons[i] + notes),
        "last_turn": _short(ex.last_turn),
    }


def apply_policy(
    rows: list[Example], cfg: CleanConfig, v: Verdicts, extra: dict[int, list[str]]
) -> tuple[list[Example], list[dict[str, Any]], list[Example]]:
    """Apply drop / relabel / send_back to flagged rows; set label_quality on every kept row.
    Returns (kept rows, issues: flagged rows and rows with `extra` notes, rows sent back)."""
    names = class_names(cfg)
    out: list[Example] = []
    issues: list[dict[str, Any]] = []
    sent_back: list[Example] = []
    seen_ids: set[str] = set()
    for i, ex in enumerate(rows):
        action, new = _decide(ex, i, v, cfg)
        if new is not None:
            new = new.model_copy(update={"label_quality": round(float(v.quality[i]), 6)})
            if new.id in seen_ids:  # a relabel produced a row that already exists
                action, new = "drop_duplicate_after_relabel", None
            else:
                seen_ids.add(new.id)
                out.append(new)
                if action == "send_back":
                    sent_back.append(new)
        if v.flagged[i] or extra.get(i):
            issues.append(_issue(ex, i, v, names, action, new, extra.get(i, [])))
    issues.sort(key=lambda r: (not r["flagged"], r["label_quality"], r["id"]))
    return out, issues, sent_back
