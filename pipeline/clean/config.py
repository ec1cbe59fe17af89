"""The `clean:` section of params.yaml as frozen configs, and the label spaces cleanlab scores in."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from clariedge.config import StageConfig
from clariedge.schema import AMBIGUOUS, CATEGORIES, Category, Example

Policy = Literal["drop", "relabel", "send_back"]
NEEDS_CLASSES = ("CLEAR", "CLARIFY")  # index = int(needs_clarification)
CAT_INDEX = {c: i for i, c in enumerate(CATEGORIES)}


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
    """params.yaml `clean:`; see the package docstring."""

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


def class_names(cfg: CleanConfig) -> tuple[str, ...]:
    return NEEDS_CLASSES if cfg.label == "needs_clarification" else CATEGORIES


def row_label(ex: Example, cfg: CleanConfig) -> int:
    return int(ex.needs_clarification) if cfg.label == "needs_clarification" else CAT_INDEX[ex.category]


def annotation_label(ann: Any, cfg: CleanConfig) -> int | None:
    """An annotator's label in the configured label space, or None when the response has none."""
    if ann.status != "submitted":
        return None
    if cfg.label == "category":
        return CAT_INDEX[ann.category] if ann.category else None
    if ann.needs_clarification is not None:
        return int(ann.needs_clarification)
    return int(ann.category in AMBIGUOUS) if ann.category else None
