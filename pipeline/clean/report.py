"""The clean stage's reports: the issues CSV, the confusion plot and the Markdown report."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clariedge.io import write_text

if TYPE_CHECKING:
    from clariedge.clean import CleanResult
    from clariedge.clean.config import CleanConfig

ISSUE_COLUMNS = [  # the issues file's columns: the keys of `policy._issue`
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


def _summary(s: dict[str, Any], cfg: CleanConfig) -> list[str]:
    """The measures table: folds, accuracy, what was flagged and done, annotators, Datalab counts."""
    lines = [
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
    return [*lines, "", "![confusion](confusion.png)", ""]


def _by_category(result: CleanResult) -> list[str]:
    """Median label quality and flags per category, then the given-vs-predicted matrix."""
    lines: list[str] = []
    by_cat = result.stats.get("median_label_quality_by_category", {})
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
    return lines


def _annotators(result: CleanResult) -> list[str]:
    if not result.annotators:
        return []
    lines = [
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
    return [*lines, ""]


def _flagged(result: CleanResult, top: int) -> list[str]:
    flagged = [r for r in result.issues if r["flagged"]]
    lines = [f"## Flagged rows (worst {min(top, len(flagged))} of {len(flagged)}; all in label_issues.csv)", ""]
    if flagged:
        lines += ["| label quality | action | given -> suggested | turn | why |", "| --- | --- | --- | --- | --- |"]
        for r in flagged[:top]:
            turn = r["last_turn"].replace("|", "\\|")
            why = r["reasons"].replace("|", "\\|")
            lines.append(
                f"| {r['label_quality']:.3f} | {r['action']} | {r['given_label']} -> {r['suggested_label']} "
                f"| {turn} | {why} |"
            )
    return [*lines, ""]


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
    lines += _summary(s, cfg) + _by_category(result) + _annotators(result) + _flagged(result, top)
    return "\n".join(lines)
