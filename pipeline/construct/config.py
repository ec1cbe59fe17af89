"""The construct backend's method registry and its config (params.yaml: `synthesize.construct`)."""

from __future__ import annotations

from pydantic import Field, field_validator

from clariedge.config import StageConfig
from clariedge.schema import Setting

GENERATOR = "construct"

METHODS: dict[str, str] = {
    "clear_as_is": "clear",
    "clear_rewrite": "clear",
    "clear_specific_docs": "clear",
    "hn_dialog_resolves": "hard_negative",
    "hn_generalized_in_dialog": "hard_negative",
    "hn_documents_resolve": "hard_negative",
    "hn_turn_resolves": "hard_negative",
    "ad_cut_before_referent": "ambiguous_dialog",
    "ad_stitched": "ambiguous_dialog",
    "ad_generalized_unpinned": "ambiguous_dialog",
    "adoc_entity_collision": "ambiguous_documents",
}

DEFAULT_PER_SEED: dict[str, int] = {
    "clear_as_is": 1,
    "clear_rewrite": 1,
    "clear_specific_docs": 1,
    "hn_dialog_resolves": 1,
    "hn_generalized_in_dialog": 1,
    "hn_documents_resolve": 1,
    "hn_turn_resolves": 1,
    "ad_cut_before_referent": 1,
    "ad_stitched": 1,
    "ad_generalized_unpinned": 1,
    "adoc_entity_collision": 1,
}


class CheckConfig(StageConfig):
    """Thresholds of the meaning checks (`checks.verify`), calibrated on tests/data/gold_labels.jsonl."""

    ask_max_margin: float = Field(
        0.1, ge=0.0, le=2.0, description="MiniLM margin between senses below which a turn is open"
    )
    answer_min_margin: float = Field(
        0.18, ge=0.0, le=2.0, description="margin from which the nearest sense is the one meant"
    )
    cue_min_margin: float = Field(
        0.06, ge=0.0, le=2.0, description="a lexical cue stands when its sense is also the nearest by this margin"
    )
    topic_max_share: float = Field(
        0.1, ge=0.0, le=1.0, description="a name in more than this share of conversations is generic, not a topic name"
    )
    rare_max_share: float = Field(
        0.075,
        ge=0.0,
        le=1.0,
        description="a word in at most this share of conversations tells its topic (two of them do)",
    )
    dialog_max_similarity: float = Field(
        0.5, ge=-1.0, le=1.0, description="an open turn this close (MiniLM) to the shown dialog may be resolved by it"
    )


class ConstructConfig(StageConfig):
    """Knobs of the construct backend (params.yaml: `synthesize.construct`)."""

    per_seed: dict[str, int] = Field(
        default_factory=lambda: dict(DEFAULT_PER_SEED),
        description="method -> how many instances per seed turn (each gives a row per setting; 0 disables)",
    )
    settings: list[Setting] = Field(default_factory=lambda: ["pre_retrieval", "post_retrieval"])
    max_documents: int = Field(5, ge=1, description="documents per post-retrieval row")
    max_interpretations: int = Field(4, ge=2, description="entities per ambiguous_documents row (2..this)")
    stitch_tries: int = Field(12, ge=1, description="host dialogs tried when stitching a turn elsewhere")
    stitch_other_domain: bool = Field(True, description="stitch pronoun turns only onto another domain's dialog")
    lead_in_prob: float = Field(0.12, ge=0.0, le=1.0, description="chance of a conversational lead-in, any category")
    lowercase_prob: float = Field(0.4, ge=0.0, le=1.0, description="chance of a lower-case first letter, any category")
    all_lower_prob: float = Field(0.2, ge=0.0, le=1.0, description="chance of lower-casing a whole turn, any category")
    drop_qmark_prob: float = Field(
        0.3, ge=0.0, le=1.0, description="chance of no final '?', any category (else one is added)"
    )
    max_turn_words: int = Field(80, ge=5, description="skip seed turns longer than this")
    switch_prob: float = Field(
        0.5, ge=0.0, le=1.0, description="chance a document-set row follows another conversation (topic switch)"
    )
    entities_per_seed: int = Field(2, ge=0, description="entities generalised per seed turn (loose questions)")
    length_match: bool = Field(True, description="thin out clear rows whose turn length is over-represented")
    length_match_slack: float = Field(
        1.5, ge=0.0, description="keep rate per length bin = min(1, slack * other share / clear share)"
    )
    checks: CheckConfig = Field(default_factory=CheckConfig)
    gold: str | None = Field(
        None, description="hand-labelled rows (JSONL) the checks are scored on in the stats (null: not scored)"
    )
    separability: bool = Field(True, description="compute the shallow-separability report (sklearn)")
    separability_folds: int = Field(5, ge=2)

    @field_validator("per_seed")
    @classmethod
    def _known_methods(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - set(METHODS))
        if unknown:
            raise ValueError(f"unknown construct methods {unknown} (known: {', '.join(sorted(METHODS))})")
        if any(n < 0 for n in v.values()):
            raise ValueError("per_seed counts must be >= 0")
        return {**{m: 0 for m in METHODS}, **v} if v else dict(DEFAULT_PER_SEED)
