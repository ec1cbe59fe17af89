"""`construct`: every method over every seed turn, then de-duplication, length matching and stats."""

from __future__ import annotations

import json
import random
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from clariedge.construct.checks import RowChecker, build_checker, gold_precision
from clariedge.construct.clear import _clear_rows
from clariedge.construct.config import METHODS, CheckConfig, ConstructConfig
from clariedge.construct.core import _Ctx, _Emitter, corpus_passages, is_donor
from clariedge.construct.dialog import _dialog_rows, written_rows
from clariedge.construct.entities import _build_entities
from clariedge.construct.loose import _generalized_rows
from clariedge.construct.senses import EmbedFn
from clariedge.construct.stats import _stats
from clariedge.io import Rejects
from clariedge.schema import Document, Example, SeedTurn
from clariedge.text import words


def construct(
    seeds: list[SeedTurn], cfg: ConstructConfig, *, rng: random.Random, embed_fn: EmbedFn | None = None
) -> tuple[list[Example], Rejects, dict[str, Any]]:
    """Build examples of all four categories from `seeds`; deterministic given `rng`'s state.

    `embed_fn` embeds texts for the sense check (default: MiniLM, `clariedge.embed`)."""
    written = [s for s in seeds if s.clarification]  # a person labelled these: only `ad_as_written` reads them
    by_conv = asked_by_conversation(seeds)
    seeds = [s for turns in by_conv.values() for s in turns]
    groups, docs_by_title = _build_entities(seeds)
    ctx = _Ctx(seeds=seeds, cfg=cfg, rng=rng, by_conv=by_conv, groups=groups, docs_by_title=docs_by_title)
    ctx.checker = meaning_checker(by_conv, cfg.checks, embed_fn=embed_fn, docs_by_title=docs_by_title)
    hosts = [s for s in seeds if len(s.messages) >= 2 and any(m.role == "assistant" for m in s.messages)]
    ctx.doc_hosts = [s for s in hosts if s.documents]
    ctx.passages = corpus_passages(seeds)
    out: list[Example] = []
    for seed in seeds:
        if len(words(seed.last_turn)) > cfg.max_turn_words:
            ctx.skipped["seed:too_long"] += 1
            continue
        em = _Emitter(ctx, seed, out)
        _clear_rows(em, seed, hosts)
        _dialog_rows(em, seed, hosts)
        _generalized_rows(em, seed, hosts)
    for seed in sorted(written, key=lambda s: (s.conversation_id, s.turn)):
        written_rows(_Emitter(ctx, seed, out), seed)
    rows = _dedup(out, ctx)
    if cfg.length_match:
        rows = _surface_match(rows, ctx)
    rows.sort(key=lambda e: (e.conversation_id, e.provenance.seed_id, e.category, e.setting, e.id))
    stats = _stats(rows, ctx, len(seeds), cfg)
    if cfg.gold:
        stats["gold_precision"] = _score_gold(ctx, Path(cfg.gold))
    return rows, ctx.rejects, stats


def _as_donor(seed: SeedTurn) -> SeedTurn:
    return seed.model_copy(update={"messages": seed.messages[-1:]})


def _score_gold(ctx: _Ctx, path: Path) -> dict[str, Any]:
    """The meaning checks on the hand-labelled gold rows (precision of "ask" and "answer" per method)."""
    if not path.exists():
        raise FileNotFoundError(f"synthesize.construct.gold: {path} does not exist (set it to null to skip the score)")
    gold = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert ctx.checker is not None
    return gold_precision(ctx.checker, gold, METHODS)


def asked_by_conversation(seeds: list[SeedTurn]) -> dict[str, list[SeedTurn]]:
    """The seed turns as they were asked, by conversation in turn order: a writer's open variant left out (only
    `ad_as_written` reads it), a donor turn (`core.is_donor`) cut to its own message."""
    by_conv: dict[str, list[SeedTurn]] = defaultdict(list)
    for s in sorted(seeds, key=lambda s: (s.conversation_id, s.turn)):
        if not s.clarification:
            by_conv[s.conversation_id].append(_as_donor(s) if is_donor(s) else s)
    return dict(by_conv)


def meaning_checker(
    by_conv: dict[str, list[SeedTurn]],
    checks: CheckConfig,
    *,
    embed_fn: EmbedFn | None = None,
    docs_by_title: dict[str, list[Document]] | None = None,
) -> RowChecker:
    """The meaning checks over these conversations (`asked_by_conversation`), as `construct` and the gold test
    use them; `docs_by_title` is the passages by title (`_build_entities`), found here when not given."""
    if docs_by_title is None:
        _, docs_by_title = _build_entities([s for turns in by_conv.values() for s in turns])
    return build_checker(_conversation_texts(by_conv), docs_by_title, **checks.model_dump(), embed_fn=embed_fn)


def _conversation_texts(by_conv: dict[str, list[SeedTurn]]) -> dict[str, list[str]]:
    """Each conversation's texts: its longest dialog's messages and every passage its turns retrieved (without
    titles, whose capitals say nothing about names)."""
    out = {}
    for conv, turns in by_conv.items():
        last = max(turns, key=lambda s: s.turn)
        out[conv] = [m.content for m in last.messages] + [d.text for s in turns for d in s.documents]
    return out


_LENGTH_BINS = (0, 4, 6, 8, 10, 12, 15, 19, 25, 10_000)
_DEFINITE = re.compile(r"\bthe\s+[a-z]", re.I)
_DEMONSTRATIVE = re.compile(r"\b(?:this|that|these|those)\b", re.I)


def _surface_bin(text: str) -> tuple[int, bool, bool]:
    """What a shallow reader sees of a turn: its length (binned), whether it has a definite noun phrase ("the
    ...") and a demonstrative ("this", "that"). (Not "it": follow-ups with "it" that the dialog resolves are
    the hard negatives real users write.)"""
    n = len(words(text))
    length = next(i for i, edge in enumerate(_LENGTH_BINS[1:]) if n <= edge)
    return length, bool(_DEFINITE.search(text)), bool(_DEMONSTRATIVE.search(text))


def _surface_match(rows: list[Example], ctx: _Ctx) -> list[Example]:
    """Thin out answer rows of the categories in `length_match` (seeded) where their last turn's surface (length,
    "the ...", "this"/"that") is over-represented against the rows that need a question, so that neither tells
    the label.

    Human rewrites (clear) are long complete questions full of "the ..."; the follow-ups a dialog resolves (hard
    negatives) are longer on average than the open references (10.4 against 7.7 words, 2026-12-05). Left alone,
    "short -> ask" and "the -> answer" are the easiest rules in the data, and real users do the reverse (a
    complete question with an open definite reference). Thinning keeps the short follow-ups, the ones real users
    write most."""
    ask = [r for r in rows if r.needs_clarification]
    q_hist = Counter(_surface_bin(r.last_turn) for r in ask)
    drop: set[str] = set()
    for category in ctx.cfg.length_match:
        answer = [r for r in rows if r.category == category]
        if not answer or not ask:
            continue
        a_hist = Counter(_surface_bin(r.last_turn) for r in answer)
        ratio = {b: (q_hist[b] / len(ask)) / (a_hist[b] / len(answer)) for b in a_hist}
        for r in sorted(answer, key=lambda e: e.id):
            if ctx.rng.random() >= ratio[_surface_bin(r.last_turn)] * ctx.cfg.length_match_slack:
                drop.add(r.id)
        ctx.skipped[f"length_matched_out:{category}"] += sum(r.id in drop for r in answer)
    return [r for r in rows if r.id not in drop]


def _dedup(rows: list[Example], ctx: _Ctx) -> list[Example]:
    seen: dict[str, Example] = {}
    for r in rows:
        if r.id in seen:
            ctx.skipped["duplicate_id"] += 1
            continue
        seen[r.id] = r
    return list(seen.values())
