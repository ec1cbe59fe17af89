"""The construct backend's method registry and its config (params.yaml: `synthesize.construct`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from clariedge.config import StageConfig
from clariedge.schema import Setting

GENERATOR = "construct"

METHODS: dict[str, str] = {
    "clear_as_is": "clear",
    "clear_rewrite": "clear",
    "clear_specific_docs": "clear",
    "clear_one_of_two": "clear",
    "hn_dialog_resolves": "hard_negative",
    "hn_generalized_in_dialog": "hard_negative",
    "hn_documents_resolve": "hard_negative",
    "hn_turn_resolves": "hard_negative",
    "ad_cut_before_referent": "ambiguous_dialog",
    "ad_stitched": "ambiguous_dialog",
    "ad_generalized_unpinned": "ambiguous_dialog",
    "ad_two_candidates": "ambiguous_dialog",
    "ad_as_written": "ambiguous_dialog",
    "adoc_entity_collision": "ambiguous_documents",
}

# methods whose label a person wrote (a sample's `open_variant`): no construction to check, so neither the safety
# net (`core.contradiction`) nor the meaning checks (`checks.verify`) second-guess it
WRITTEN = frozenset({"ad_as_written"})
COUNTED = frozenset({"ad_stitched", "adoc_entity_collision", "clear_specific_docs"})  # per_seed: instances; else on/off


class CheckConfig(StageConfig):
    """Thresholds of the meaning checks (`checks.verify`), calibrated on tests/data/gold_labels.jsonl."""

    ask_max_margin: float = Field(ge=0.0, le=2.0, description="MiniLM margin between senses below which a turn is open")
    answer_min_margin: float = Field(ge=0.0, le=2.0, description="margin from which the nearest sense is the one meant")
    cue_min_margin: float = Field(
        ge=0.0, le=2.0, description="a lexical cue stands when its sense is also the nearest by this margin"
    )
    topic_max_share: float = Field(
        ge=0.0,
        le=1.0,
        description="a name (or an open noun) in more than this share of conversations is generic: no topic's own",
    )
    rare_max_share: float = Field(
        ge=0.0,
        le=1.0,
        description="a word in at most this share of conversations tells its topic (two of them do)",
    )
    dialog_max_similarity: float = Field(
        ge=-1.0, le=1.0, description="an open turn this close (MiniLM) to the shown dialog may be resolved by it"
    )
    rewrite_max_similarity: float = Field(
        ge=-1.0,
        le=1.0,
        description="a turn this close (MiniLM) to its human rewrite stands alone: the rewrite adds little",
    )
    passage_max_similarity: float = Field(
        ge=-1.0,
        le=1.0,
        description="an open turn this close (MiniLM) to a shown passage may be resolved by it: not made",
    )
    sense_dialog_max_similarity: float = Field(
        ge=-1.0,
        le=1.0,
        description="a dialog this close (MiniLM) to one sense's passages settles a shared name: not an ask row",
    )


class ConstructConfig(StageConfig):
    """Knobs of the construct backend (params.yaml: `synthesize.construct`)."""

    per_seed: dict[str, int] = Field(
        description="method -> how many instances per seed turn (each gives a row per setting; 0 disables)",
    )
    settings: list[Setting] = Field(min_length=1, description="settings rows are made in")
    max_documents: int = Field(ge=1, description="documents per post-retrieval row")
    max_interpretations: int = Field(ge=2, description="entities per ambiguous_documents row (2..this)")
    stitch_tries: int = Field(ge=1, description="host dialogs tried when stitching a turn elsewhere")
    stitch_other_domain: bool = Field(
        description="place a turn only after another domain's dialog (a same-domain one can supply a referent)"
    )
    lead_in_prob: float = Field(ge=0.0, le=1.0, description="chance of a conversational lead-in, any category")
    lowercase_prob: float = Field(ge=0.0, le=1.0, description="chance of a lower-case first letter, any category")
    all_lower_prob: float = Field(ge=0.0, le=1.0, description="chance of lower-casing a whole turn, any category")
    drop_qmark_prob: float = Field(
        ge=0.0, le=1.0, description="chance of no final '?', any category (else one is added)"
    )
    max_turn_words: int = Field(ge=5, description="skip seed turns longer than this")
    switch_prob: float = Field(
        ge=0.0, le=1.0, description="chance a document-set row follows another conversation (topic switch)"
    )
    missed_passages_prob: float = Field(
        ge=0.0,
        le=1.0,
        description="chance a turn whose label is not the passages' (clear, resolved by its dialog) is shown a retriever's miss",
    )
    entities_per_seed: int = Field(ge=0, description="entities generalised per seed turn (loose questions)")
    length_match: list[Literal["clear", "hard_negative"]] = Field(
        description="answer categories thinned where their last turn's surface is over-represented against asks"
    )
    length_match_slack: float = Field(
        ge=0.0, description="keep rate per length bin = min(1, slack * ask share / answer share)"
    )
    checks: CheckConfig = Field(description="meaning-check thresholds")
    gold: str | None = Field(
        description="hand-labelled rows (JSONL) the checks are scored on in the stats (null: not scored)"
    )
    separability: bool = Field(description="compute the shallow-separability report (sklearn)")
    separability_folds: int = Field(ge=2)

    @field_validator("per_seed")
    @classmethod
    def _known_methods(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - set(METHODS))
        if unknown:
            raise ValueError(f"unknown construct methods {unknown} (known: {', '.join(sorted(METHODS))})")
        missing = sorted(set(METHODS) - set(v))
        if missing:
            raise ValueError(f"per_seed must give every method a count (0 turns one off); missing: {missing}")
        if any(n < 0 for n in v.values()):
            raise ValueError("per_seed counts must be >= 0")
        switches = sorted(f"{m}: {n}" for m, n in v.items() if n > 1 and m not in COUNTED)
        if switches:
            raise ValueError(
                f"per_seed {switches}: these methods are on (1) or off (0); only {', '.join(sorted(COUNTED))} "
                "make several instances per seed turn"
            )
        return dict(v)
