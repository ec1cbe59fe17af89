"""Offline `construct` backend: correct-by-construction examples from the dialogs' structure (no LLM).

Every row is built by a deterministic operation on a real seed turn whose effect on the label is
known, and carries the evidence for its label:

- `hard_negative` (resolution = a standalone question the dialog or documents make explicit)
  * `hn_dialog_resolves`: a non-standalone turn (the human rewrite adds words) in its full dialog,
    where the words the rewrite adds occur earlier in the dialog; post-retrieval with its documents.
  * `hn_generalized_in_dialog`: a complete question whose distinguishing modifier was removed
    ("How long is the river?") right after a dialog that named exactly one such entity.
  * `hn_documents_resolve` (post): the generalised question with documents about one entity only.
- `ambiguous_dialog` (no row's dialog or documents contain the missing referent)
  * `ad_cut_before_referent`: the non-standalone turn with the dialog cut before the referent appeared.
  * `ad_stitched`: the turn (or a generalised question) stitched onto another conversation: a topic
    switch that drops its subject.
  * `ad_generalized_unpinned`: a complete, self-contained-looking question with a definite reference
    ("When does the plan renew?") that nothing in the dialog pins down.
  * `ad_two_candidates`: "it" after a dialog that compared two things of one kind (off by default).
  * `ad_as_written`: a sample writer's open variant of a turn, after the turn's own dialog, with the writer's
    question (`SeedTurn.clarification`; no other method reads such a seed).
- `ambiguous_documents` (post) `adoc_entity_collision`: the generalised question with documents about
  two or more distinct entities sharing a head (titles `Mercury (planet)` / `Mercury (element)`,
  `Penobscot River` / `Hudson River`); interpretations = those entities, the clarification names them.
- `clear`: `clear_as_is` (standalone turns as they are), `clear_rewrite` (a human rewrite placed as
  the turn), `clear_specific_docs` (post: the specific question with the mixed documents).

The package: `config` (method registry + params), `text` (words, terms, anchors), `entities`
(title/text entities, generalisation), `checks` (the meaning checks), `wording` (clarification banks),
`core` (context, emitter, safety net), one module per method family (`clear`, `dialog`, `loose`),
`build` (the run) and `stats`.

Wordings of clarifications and optional lead-ins / surface variants are drawn from template banks with
the caller's seeded rng and recorded in `provenance.template`. Surface variants are applied to every
category alike, so they carry no label information.

Inputs:  seed turns (`SeedTurn`).
Outputs: examples (`Example`) of the four categories in both settings, rejects, stats (counts per
         method / category / setting, pairing rate, shallow separability of the last turn).
Params:  `synthesize.construct.*` (see `ConstructConfig`); the rng comes from the caller (top-level `seed`).
"""

from __future__ import annotations

from clariedge.construct.build import construct
from clariedge.construct.config import GENERATOR, METHODS, ConstructConfig
from clariedge.construct.core import contradiction
from clariedge.construct.entities import Entity, entity_of_title, generalize, text_entities
from clariedge.construct.reading import names_own_topic
from clariedge.construct.senses import SenseJudge, SenseVerdict, broken_name, still_named
from clariedge.construct.stats import shallow_separability
from clariedge.construct.text import Anchor, find_anchor, referent_terms, stem, terms
from clariedge.construct.wording import plain_label
from clariedge.text import words

__all__ = [
    "GENERATOR",
    "METHODS",
    "Anchor",
    "ConstructConfig",
    "Entity",
    "construct",
    "contradiction",
    "entity_of_title",
    "find_anchor",
    "generalize",
    "plain_label",
    "referent_terms",
    "SenseJudge",
    "SenseVerdict",
    "broken_name",
    "names_own_topic",
    "still_named",
    "shallow_separability",
    "stem",
    "terms",
    "text_entities",
    "words",
]
