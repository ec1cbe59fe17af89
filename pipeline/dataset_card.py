"""The dataset card (`README.md` of the published dataset): the YAML header the Hub reads, then counts,
how the data was built, reviewed and cleaned, the files and the license. Written by the `publish` stage,
which hands it the splits (in their order) and, when there is one, the clean stage's stats."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import yaml

from clariedge.chat_format import FORMAT_VERSION
from clariedge.schema import CATEGORIES, SETTINGS, Example

if TYPE_CHECKING:
    from clariedge.publish import PublishConfig

INTRO = [
    "Multi-turn, document-grounded dialogs ending in a user turn, each labelled with whether the assistant "
    "should ask a clarifying question before answering, and if so which one. Four categories: "
    "`ambiguous_dialog` (the turn is underspecified given the dialog), `ambiguous_documents` (the retrieved "
    "passages admit several interpretations), `clear`, and `hard_negative` (looks ambiguous, but the dialog "
    "or the documents resolve it). Two settings: `pre_retrieval` (no documents) and `post_retrieval`.",
    "",
    "Model contract (as the Granite `query_clarification` intrinsic): input = the chat ending in the user turn "
    'plus optional documents; output = JSON `{"clarification": "CLEAR"}` or '
    '`{"clarification": "<question>"}` (the `target` column).',
    "",
]
FILES = [
    "## Files and fields",
    "",
    "- `data/clariedge/`: `datasets.load_from_disk` folder (this card inside); `data/clariedge-parquet/"
    "{split}.parquet`: the same tables; `data/clariedge-chat/{split}.jsonl`: chat format "
    f"(`clariedge.chat_format`, format version {FORMAT_VERSION}): `messages` = system instruction "
    "(+ documents after retrieval) + dialog, `target` = the JSON answer.",
    "- `category`, `setting` are `ClassLabel`s; `target` is the JSON answer string; `interpretations` are "
    "the competing readings of an ambiguous turn; `resolution` is what resolves a hard negative; "
    "`provenance` records the generator, method, prompt id/version/hash and seed turn.",
    "",
]


def _size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < limit:
            return name
    return "n>1M"


def card_header(dd, cfg: PublishConfig) -> dict[str, Any]:
    """The YAML metadata the Hub reads: license, tasks, configs (data files), features, split sizes."""
    features = dd["train"].features
    splits = [{"name": s, "num_bytes": int(dd[s].data.nbytes), "num_examples": dd[s].num_rows} for s in dd]
    return {
        "pretty_name": cfg.pretty_name,
        "license": cfg.license,
        "language": ["en"],
        "task_categories": ["text-classification", "text-generation"],
        "tags": ["clarification", "conversational", "rag", "multi-turn", "synthetic"],
        "size_categories": [_size_category(sum(s["num_examples"] for s in splits))],
        "configs": [
            {
                "config_name": "default",
                "data_files": [{"split": s, "path": f"data/{s}-*"} for s in dd],
            }
        ],
        "dataset_info": {
            "features": features._to_yaml_list(),
            "splits": splits,
            "dataset_size": sum(s["num_bytes"] for s in splits),
        },
    }


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(str(v) for v in r) + " |" for r in rows]
    return out


def card_warnings(clean_stats: dict[str, Any] | None, published: Counter) -> list[str]:
    """The card's warning section: categories the clean stage found with a median label quality far below
    the rest (`category_warnings` in its stats); no lines when there are none."""
    stats = clean_stats or {}
    warnings = stats.get("category_warnings") or []
    if not warnings:
        return []
    lines = [
        "## Warning: label quality",
        "",
        "> **The labels of these categories may be wrong as a whole.** Label cleaning (cleanlab, out-of-sample) "
        "found their median label quality far below the other categories' rows. Row-by-row cleaning catches few "
        "rows of a category that is wrong as a whole (and flags at most a share of each category), so the rows "
        "published under it may be mislabelled: check them before relying on them. Details in "
        "`reports/label_issues.md`.",
        "",
    ]
    lines += _table(
        ["category", "rows scored", "rows published", "median label quality", "other rows' median", "ratio"],
        [
            [
                f"`{w['category']}`",
                w["rows"],
                published.get(w["category"], 0),
                f"{w['median_label_quality']:.3f}",
                f"{w['others_median_label_quality']:.3f}",
                f"{w['ratio']:.2f}",
            ]
            for w in warnings
        ],
    )
    if stats.get("policy") == "send_back":
        lines += [
            "",
            f"Policy `send_back`: {stats.get('sent_back_first', 0)} of their rows were sent back to review "
            "first (worst label quality first); rows pending review are left out of this dataset.",
        ]
    return [*lines, ""]


def _counts(splits: dict[str, list[Example]], cfg: PublishConfig) -> list[str]:
    """Rows per category x setting and split, rows and conversations per split, how the splits were made."""
    counts = {s: Counter((ex.category, ex.setting) for ex in rows) for s, rows in splits.items()}
    table = []
    for c, st in [(c, st) for c in CATEGORIES for st in SETTINGS]:
        per = [counts[s][(c, st)] for s in splits]
        if sum(per):
            table.append([c, st, *per, sum(per)])
    table.append(["**total**", "", *(len(rows) for rows in splits.values()), sum(map(len, splits.values()))])
    return [
        "## Counts",
        "",
        *_table(["category", "setting", *splits, "all"], table),
        "",
        *_table(
            ["split", "rows", "conversations"],
            [[s, len(rows), len({ex.conversation_id for ex in rows})] for s, rows in splits.items()],
        ),
        "",
        "Splits are grouped by `conversation_id` (no conversation appears in two splits) and stratified by "
        f"category x setting (ratios {cfg.ratios.train}/{cfg.ratios.validation}/{cfg.ratios.test}).",
        "",
    ]


def _built(everything: list[Example]) -> list[str]:
    """Rows per generator, model, method and prompt; the seed dialogs' domains."""
    prov = Counter(
        (
            p.generator,
            p.model or "",
            p.method or "",
            p.prompt_id or "",
            p.prompt_version or "",
            (p.prompt_hash or "")[:12],
        )
        for p in (ex.provenance for ex in everything)
    )
    domains = Counter(ex.domain for ex in everything)
    return [
        "## How it was built",
        "",
        *_table(
            ["generator", "model", "method", "prompt id", "prompt version", "prompt hash", "rows"],
            [[*k, v] for k, v in sorted(prov.items())],
        ),
        "",
        "Seed dialogs: " + ", ".join(f"{d} ({n})" for d, n in sorted(domains.items())) + ". Pipeline: "
        "ingest -> synthesize -> filter -> review -> clean -> publish (`dvc repro`).",
        "",
    ]


def _review(everything: list[Example]) -> list[str]:
    review = Counter(ex.review_status for ex in everything)
    if set(review) == {"unreviewed"}:
        line = (
            "**Unreviewed.** No human has checked these labels (review mode `none`): the labels are the "
            "generator's, checked only by the automatic filters and the label cleaning below."
        )
    else:
        annotated = sum(1 for ex in everything if ex.annotations)
        line = (
            "Review status: " + ", ".join(f"{k} {v}" for k, v in sorted(review.items())) + f"; rows with "
            f"annotator responses: {annotated}."
        )
    return ["## Review", "", line, ""]


def _cleaning(everything: list[Example], clean_stats: dict[str, Any] | None) -> list[str]:
    lines = ["## Cleaning", ""]
    qualities = [ex.label_quality for ex in everything if ex.label_quality is not None]
    if not clean_stats and not qualities:
        lines.append("No label cleaning information was recorded for these rows.")
    if qualities:
        lines.append(
            f"Every row carries `label_quality` (cleanlab, out-of-sample): mean {sum(qualities) / len(qualities):.3f}, "
            f"min {min(qualities):.3f}."
        )
    if clean_stats:
        keys = ("label", "policy", "rows_in", "flagged", "dropped", "relabeled", "sent_back", "cv_accuracy")
        lines.append(
            "Label cleaning (`clean` stage): "
            + ", ".join(f"{k} {clean_stats[k]}" for k in keys if k in clean_stats)
            + ". Every removal or relabel is listed in `reports/label_issues.csv`."
            + (
                " Category warnings: see **Warning: label quality** above."
                if clean_stats.get("category_warnings")
                else ""
            )
        )
    return [*lines, ""]


def render_card(
    dd, splits: dict[str, list[Example]], cfg: PublishConfig, clean_stats: dict[str, Any] | None = None
) -> str:
    """README.md: the Hub YAML header, then counts, how it was built, reviewed and cleaned."""
    header = yaml.safe_dump(card_header(dd, cfg), sort_keys=False, allow_unicode=True, width=1000)
    everything = [ex for rows in splits.values() for ex in rows]
    lines = [
        "---",
        header.rstrip(),
        "---",
        "",
        f"# {cfg.pretty_name}",
        "",
        *INTRO,
        *card_warnings(clean_stats, Counter(ex.category for ex in everything)),
        *_counts(splits, cfg),
        *_built(everything),
        *_review(everything),
        *_cleaning(everything, clean_stats),
        *FILES,
        "## License",
        "",
        f"{cfg.license}. Seed dialogs: MTRAG (IBM, Apache-2.0) and the project's own sample.",
        "",
    ]
    return "\n".join(lines)
