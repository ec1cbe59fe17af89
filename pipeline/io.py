"""File helpers shared by every stage: atomic writes, parquet/JSONL records, stats and rejects.

Nothing here knows about a particular stage. Every output goes through `atomic_path`, so a crash
never leaves a half-written file where a good one was.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ValidationError

from clariedge.schema import EXAMPLE_SCHEMA, SEED_TURN_SCHEMA, Example, SeedTurn

M = TypeVar("M", bound=BaseModel)
_SCHEMAS: dict[type[BaseModel], pa.Schema] = {SeedTurn: SEED_TURN_SCHEMA, Example: EXAMPLE_SCHEMA}


_UMASK = os.umask(0o022)
os.umask(_UMASK)  # the process umask (read by setting it; restored at once)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; move it over `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it owner-only; the output gets a plain write's mode
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def save_figure(fig: Any, path: str | Path, dpi: int = 100) -> None:
    """Write a matplotlib figure as PNG atomically, without the (version-bearing) Software tag; closes it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": None})
    finally:
        plt.close(fig)


def write_json(path: str | Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    n = 0
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
    return n


def write_records(path: str | Path, records: Sequence[BaseModel]) -> None:
    """Write records of one model to parquet with that model's explicit Arrow schema."""
    model = type(records[0]) if records else None
    schema = _SCHEMAS.get(model) if model else None
    rows = [r.model_dump(mode="json") for r in records]
    if schema is None and model is not None:
        raise TypeError(f"no Arrow schema registered for {model.__name__}")
    table = pa.Table.from_pylist(rows, schema=schema) if schema else pa.table({})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_table(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file (did the previous stage run? try `dvc repro`)")
    return pq.read_table(path).to_pylist()


def read_records(path: str | Path, model: type[M], ignore_unknown: bool = False) -> list[M]:
    """Read and validate a parquet file of `model` rows; a bad row raises with its index and field.

    `ignore_unknown`: drop columns the model does not know (a published split's `target`), else they are errors."""
    out: list[M] = []
    for i, row in enumerate(read_table(path)):
        if ignore_unknown:
            row = {k: v for k, v in row.items() if k in model.model_fields}
        try:
            out.append(model.model_validate(_drop_nulls_for_defaults(row, model)))
        except ValidationError as err:
            raise ValueError(f"{path}: row {i}: {describe_validation_error(err)}") from None
    return out


def _drop_nulls_for_defaults(row: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    # parquet stores a missing nested list as null; let the model's default apply instead
    return {k: v for k, v in row.items() if v is not None or k not in model.model_fields or _nullable(model, k)}


def _nullable(model: type[BaseModel], name: str) -> bool:
    info = model.model_fields[name]
    return info.is_required() is False and info.default is None


def describe_validation_error(err: ValidationError) -> str:
    """One line per problem: `field.path: message (got VALUE)`."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<row>"
        got = e.get("input")
        shown = repr(got)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        parts.append(f"{loc}: {e['msg']} (got {shown})" if e["type"] != "missing" else f"{loc}: field required")
    return "; ".join(parts)


@dataclass
class Rejects:
    """Rows a stage could not use, with where they came from and why; counted by reason."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, reason: str, where: str, detail: str, raw: Any = None) -> None:
        self.rows.append({"reason": reason, "where": where, "detail": detail, "raw": _short(raw)})

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[f"dropped_{r['reason']}"] = out.get(f"dropped_{r['reason']}", 0) + 1
        return dict(sorted(out.items()))

    def __len__(self) -> int:
        return len(self.rows)

    def write(self, path: str | Path) -> None:
        write_jsonl(path, self.rows)


def _short(raw: Any, limit: int = 2000) -> Any:
    if raw is None:
        return None
    text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"
