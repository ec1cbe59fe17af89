"""`construct`: every method over every seed turn, then de-duplication, length matching and stats."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import Any

from clariedge.construct.checks import EmbedFn, SenseJudge, topic_terms
from clariedge.construct.clear import _clear_rows
from clariedge.construct.config import ConstructConfig
from clariedge.construct.core import _Ctx, _Emitter
from clariedge.construct.dialog import _dialog_rows
from clariedge.construct.entities import _build_entities
from clariedge.construct.loose import _generalized_rows
from clariedge.construct.stats import _stats
from clariedge.construct.text import words
from clariedge.io import Rejects
from clariedge.schema import Example, SeedTurn


def construct(
    seeds: list[SeedTurn], cfg: ConstructConfig, *, rng: random.Random, embed_fn: EmbedFn | None = None
) -> tuple[list[Example], Rejects, dict[str, Any]]:
    """Build examples of all four categories from `seeds`; deterministic given `rng`'s state.

    `embed_fn` embeds texts for the sense check (default: MiniLM, `clariedge.embed`)."""
    seeds = sorted(seeds, key=lambda s: (s.conversation_id, s.turn))
    by_conv: dict[str, list[SeedTurn]] = defaultdict(list)
    for s in seeds:
        by_conv[s.conversation_id].append(s)
    groups, docs_by_title = _build_entities(seeds)
    ctx = _Ctx(seeds=seeds, cfg=cfg, rng=rng, by_conv=by_conv, groups=groups, docs_by_title=docs_by_title)
    ctx.judge = SenseJudge(docs_by_title, **cfg.checks.model_dump(exclude={"topic_max_share"}), embed_fn=embed_fn)
    ctx.topic_terms, ctx.generic = _topics(by_conv, cfg.checks.topic_max_share)
    hosts = [s for s in seeds if len(s.messages) >= 2]
    ctx.doc_hosts = [s for s in hosts if s.documents]
    out: list[Example] = []
    for seed in seeds:
        if len(words(seed.last_turn)) > cfg.max_turn_words:
            ctx.skipped["seed:too_long"] += 1
            continue
        em = _Emitter(ctx, seed, out)
        _clear_rows(em, seed)
        _dialog_rows(em, seed, hosts)
        _generalized_rows(em, seed, hosts)
    rows = _dedup(out, ctx)
    if cfg.length_match:
        rows = _length_match(rows, ctx)
    rows.sort(key=lambda e: (e.conversation_id, e.provenance.seed_id, e.category, e.setting, e.id))
    stats = _stats(rows, ctx, len(seeds), cfg)
    return rows, ctx.rejects, stats


def _topics(by_conv: dict[str, list[SeedTurn]], max_share: float) -> tuple[dict[str, frozenset[str]], frozenset[str]]:
    """Each conversation's terms (dialog + passages), and the terms too common across conversations to name a topic."""
    topic = {}
    for conv, turns in by_conv.items():
        last = max(turns, key=lambda s: s.turn)
        texts = [m.content for m in last.messages] + [d.title + " " + d.text for s in turns for d in s.documents]
        topic[conv] = frozenset().union(*(topic_terms(t) for t in texts))
    df = Counter(t for ts in topic.values() for t in ts)
    limit = max(2, int(max_share * len(topic)))
    return topic, frozenset(t for t, n in df.items() if n > limit)


_LENGTH_BINS = (0, 4, 6, 8, 10, 12, 15, 19, 25, 10_000)


def _length_bin(text: str) -> int:
    n = len(words(text))
    return next(i for i, edge in enumerate(_LENGTH_BINS[1:]) if n <= edge)


def _length_match(rows: list[Example], ctx: _Ctx) -> list[Example]:
    """Thin out clear rows (seeded) where their last-turn length is over-represented against the other
    categories, so that length alone says little about the label."""
    clear = [r for r in rows if r.category == "clear"]
    other = [r for r in rows if r.category != "clear"]
    if not clear or not other:
        return rows
    c_hist = Counter(_length_bin(r.last_turn) for r in clear)
    o_hist = Counter(_length_bin(r.last_turn) for r in other)
    ratio = {b: (o_hist[b] / len(other)) / (c_hist[b] / len(clear)) for b in c_hist}
    drop: set[str] = set()
    for r in sorted(clear, key=lambda e: e.id):
        if ctx.rng.random() >= ratio[_length_bin(r.last_turn)] * ctx.cfg.length_match_slack:
            drop.add(r.id)
    ctx.skipped["length_matched_out"] += len(drop)
    return [r for r in rows if r.id not in drop]


def _dedup(rows: list[Example], ctx: _Ctx) -> list[Example]:
    seen: dict[str, Example] = {}
    for r in rows:
        if r.id in seen:
            ctx.skipped["duplicate_id"] += 1
            continue
        seen[r.id] = r
    return list(seen.values())
