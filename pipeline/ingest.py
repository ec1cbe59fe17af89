"""Stage `ingest`: read grounded dialogs in any supported format into one validated seed-turn table.

Inputs:  files or folders (searched recursively for *.json / *.jsonl) in these formats, detected
         from the file name and the keys of its rows:
         - `mtrag_task`:   MTRAG generation-task JSONL (`input` = [{speaker, text}], optional
                           `contexts` = [{document_id, title, text}]).
         - `mtrag_bundle`: the MTRAG evaluation JSON (`documents` + `tasks` whose `contexts` hold ids).
         - `beir`:         `<domain>_questions.jsonl`, `<domain>_lastturn.jsonl`, `<domain>_rewrite.jsonl`
                           (`_id` = `<conversation_id><::><turn>`, `text` = `|user|: ...` lines);
                           lastturn is paired with rewrite by `_id`, questions give the history.
         - `clariedge`:    the project's JSONL: one conversation per line (`turns`), or one seed turn
                           per line (`messages`), see `data/sample/README.md`.
Outputs: seed turns (parquet, `SeedTurn` rows sorted by conversation and turn), rejects JSONL (every
         bad row with file, line, field and reason), stats JSON.
Params:  `ingest.source` (paths | mtrag_url), `ingest.paths` (default: the bundled `data/sample`),
         `ingest.mtrag_url`, `ingest.strict`.
The readers: `clariedge.ingest_mtrag` (MTRAG and BEIR), `clariedge.ingest_jsonl` (the project's JSONL and
the robust file reading they share); this module detects formats, merges and writes.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from clariedge.config import StageConfig
from clariedge.ingest_jsonl import iter_jsonl, read_clariedge, read_text
from clariedge.ingest_mtrag import BEIR_KINDS, read_beir, read_mtrag_bundle, read_mtrag_tasks
from clariedge.io import Rejects, write_json, write_records
from clariedge.schema import SeedTurn

log = logging.getLogger(__name__)


class MtragUrlConfig(StageConfig):
    base_url: str
    cache_dir: str
    files: dict[str, str] = Field(description="relative path -> sha256")
    timeout_s: float = Field(gt=0)


class IngestConfig(StageConfig):
    source: Literal["paths", "mtrag_url"] = Field(description="read `paths`, or download `mtrag_url`'s files")
    paths: list[str] = Field(min_length=1, description="files or folders read when source is paths")
    mtrag_url: MtragUrlConfig | None
    strict: bool


# ---------------------------------------------------------------------------------------------
# Detection, merging and the stage itself
# ---------------------------------------------------------------------------------------------
def _beir_kind(path: Path) -> tuple[str, str] | None:
    for kind in BEIR_KINDS:
        if path.name.endswith(f"_{kind}.jsonl"):
            return path.name[: -len(f"_{kind}.jsonl")], kind
    return None


def expand_paths(paths: list[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.suffix in {".json", ".jsonl"} and q.is_file()))
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return sorted(set(out))


def read_seed_turns(paths: list[str | Path], rejects: Rejects) -> tuple[list[SeedTurn], dict[str, int]]:
    """Read every path (files or folders) and return the seed turns, one list, unmerged."""
    files = expand_paths(paths)
    seeds: list[SeedTurn] = []
    by_format: dict[str, int] = defaultdict(int)
    beir_groups: dict[tuple[Path, str], dict[str, Path]] = defaultdict(dict)
    for path in files:
        beir = _beir_kind(path)
        if beir:
            beir_groups[(path.parent, beir[0])][beir[1]] = path
            continue
        found = list(_read_one(path, rejects))
        if found:
            by_format[found[0].source.format] += len(found)
        seeds.extend(found)
    for (_, domain), group in sorted(beir_groups.items()):
        found = list(read_beir(group, domain, rejects))
        by_format["beir"] += len(found)
        seeds.extend(found)
    return seeds, dict(by_format)


def _read_one(path: Path, rejects: Rejects) -> Iterator[SeedTurn]:
    if path.suffix == ".json":
        text = read_text(path, rejects)
        if text is None:
            return
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            rejects.add("malformed_json", f"{path}:{err.lineno}", f"{err.msg} (column {err.colno}; truncated?)")
            return
        if isinstance(data, dict) and "tasks" in data and "documents" in data:
            yield from read_mtrag_bundle(path, rejects, data)
        else:
            rejects.add("unknown_format", str(path), "a .json file must be the MTRAG bundle (`documents` + `tasks`)")
        return
    first = next(iter_jsonl(path, Rejects()), None)
    if first is None:
        list(iter_jsonl(path, rejects))  # report why nothing could be read
        return
    keys = first[1].keys()
    if "input" in keys:
        yield from read_mtrag_tasks(path, rejects)
    elif "turns" in keys or "messages" in keys:
        yield from read_clariedge(path, rejects)
    else:
        rejects.add("unknown_format", str(path), f"cannot tell the format from the keys {sorted(keys)[:8]}")


def merge_seed_turns(seeds: list[SeedTurn]) -> list[SeedTurn]:
    """One row per (conversation, turn) and per hand-written open variant of it: the richest dialog, the first
    documents, any rewrite."""
    groups: dict[tuple[str, int, bool], list[SeedTurn]] = defaultdict(list)
    for s in seeds:
        groups[(s.conversation_id, s.turn, s.clarification is not None)].append(s)
    merged = []
    for key in sorted(groups):
        group = groups[key]
        best = max(group, key=lambda s: (len(s.messages), bool(s.documents)))
        documents = best.documents or next((s.documents for s in group if s.documents), [])
        rewrite = best.rewrite or next((s.rewrite for s in group if s.rewrite), None)
        merged.append(best.model_copy(update={"documents": documents, "rewrite": rewrite}))
    return merged


def transform(paths: list[str | Path]) -> tuple[list[SeedTurn], Rejects, dict[str, Any]]:
    """Pure-ish core: read, validate and merge; returns seeds, rejects and stats."""
    rejects = Rejects()
    raw, by_format = read_seed_turns(paths, rejects)
    seeds = merge_seed_turns(raw)
    stats = {
        "files": len(expand_paths(paths)),
        "rows_read": len(raw),
        "seed_turns": len(seeds),
        "conversations": len({s.conversation_id for s in seeds}),
        "grounded_turns": sum(1 for s in seeds if s.documents),
        "with_rewrite": sum(1 for s in seeds if s.rewrite),
        "non_standalone": sum(1 for s in seeds if not s.is_standalone),
        "open_variants": sum(1 for s in seeds if s.clarification),
        "rejected": len(rejects),
        **rejects.counts(),
        "by_format": dict(sorted(by_format.items())),
        "by_domain": dict(sorted(Counter(s.domain for s in seeds).items())),
    }
    return seeds, rejects, stats


class IngestError(RuntimeError):
    pass


def run(
    paths: list[str | Path],
    out_path: str | Path,
    rejects_path: str | Path | None = None,
    stats_path: str | Path | None = None,
    strict: bool = False,
) -> dict[str, Any]:
    seeds, rejects, stats = transform(paths)
    for r in rejects.rows[:20]:
        log.warning("rejected %s: %s: %s", r["where"], r["reason"], r["detail"])
    if len(rejects) > 20:
        log.warning("... and %d more rejected rows (see %s)", len(rejects) - 20, rejects_path)
    if rejects_path:
        rejects.write(rejects_path)
    if strict and len(rejects):
        raise IngestError(f"{len(rejects)} bad rows (strict mode); nothing written to {out_path}")
    if not seeds:
        raise IngestError(f"no valid seed turns in {', '.join(map(str, paths))}; nothing written")
    write_records(out_path, seeds)
    if stats_path:
        write_json(stats_path, stats)
    log.info(
        "ingest: %d seed turns from %d conversations, %d rejected",
        stats["seed_turns"],
        stats["conversations"],
        stats["rejected"],
    )
    return stats
