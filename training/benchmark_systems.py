"""The systems the `external` stage (`training/benchmark.py`) scores, each mapping labelled rows to
(decisions, P(ask) or None): the adapter and the zero-shot base model through `Clarifier`, the never-ask
floor and the MiniLM classifier of `evaluate`; and the timed passes of the enabled ones over every set.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clariedge.training.benchmark import ExternalConfig, LabelledRow

log = logging.getLogger(__name__)

Prediction = tuple[list[bool], list[float] | None]


def always_clear(rows: Sequence[LabelledRow]) -> Prediction:
    return [False] * len(rows), None


def lm_decide(clarifier: Any, rows: Sequence[LabelledRow], *, desc: str, progress: bool = True) -> Prediction:
    """Decisions from P(CLEAR) below the clarifier's threshold, in chunks (a progress bar); P(ask) = 1 - P(CLEAR)."""
    from tqdm.auto import tqdm

    items = [(r.messages, r.documents or None) for r in rows]
    chunk = max(1, clarifier.batch_size * 8)
    decided: list[tuple[float, bool]] = []
    with tqdm(total=len(items), desc=desc, unit="row", disable=not progress, leave=False) as bar:
        for i in range(0, len(items), chunk):
            decided.extend(clarifier.decide(items[i : i + chunk]))
            bar.update(len(items[i : i + chunk]))
    return [n for _, n in decided], [round(1.0 - p, 5) for p, _ in decided]


def lm_questions(clarifier: Any, rows: Sequence[LabelledRow], flagged: Sequence[int]) -> dict[int, str | None]:
    """The question the model asks (greedy; `CLEAR` forbidden first) for the rows at `flagged`; None if unparseable."""
    from clariedge.chat_format import parse_answer

    raws = clarifier.generate([(rows[i].messages, rows[i].documents or None) for i in flagged], question=True)
    return {i: parse_answer(raw) for i, raw in zip(flagged, raws, strict=True)}


@dataclass
class Passes:
    """What the systems' passes over the sets give: set -> system -> prediction, set -> row -> the adapter's
    question, system -> seconds, and the reading window (`max_length`, the adapter's threshold)."""

    decisions: dict[str, dict[str, Prediction]]
    questions: dict[str, dict[int, str | None]] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    window: dict[str, Any] = field(default_factory=dict)

    @contextmanager
    def timed(self, system: str, rows: int) -> Iterator[None]:
        """Record the seconds of the block (a system's pass over `rows` rows) and its rows per second."""
        t0 = time.perf_counter()
        yield
        wall = time.perf_counter() - t0
        self.timing[system] = {"seconds": round(wall, 1), "rows_per_s": round(rows / wall, 2) if wall >= 0.1 else None}


def predict_sets(
    rows_by_set: Mapping[str, list[LabelledRow]],
    train_rows: Callable[[], list[Any]],
    adapter_dir: str | Path,
    base_dir: str | Path,
    cfg: ExternalConfig,
    lm: dict[str, Any],
    *,
    seed: int,
    threads: int | None,
    progress: bool,
) -> Passes:
    """Each enabled system over every set, in the order of `SYSTEMS`; `lm`: the `Clarifier` settings."""
    out = Passes({n: {} for n in rows_by_set})
    if not rows_by_set:
        return out
    n_rows = sum(len(r) for r in rows_by_set.values())
    if (cfg.adapter or cfg.baselines.zero_shot) and threads:
        import torch

        torch.set_num_threads(threads)
    if cfg.adapter:
        from clariedge.training.infer import Clarifier

        clar = Clarifier(adapter_dir, base=base_dir, **lm)
        out.window = {"max_length": clar.max_length, "adapter_threshold": round(clar.threshold, 5)}
        with out.timed("adapter", n_rows):
            for name, rows in rows_by_set.items():
                out.decisions[name]["adapter"] = pred = lm_decide(clar, rows, desc=f"adapter {name}", progress=progress)
                if cfg.generate:
                    flagged = [i for i, n in enumerate(pred[0]) if n][: cfg.max_generate]
                    out.questions[name] = lm_questions(clar, rows, flagged) if flagged else {}
        del clar
    if cfg.baselines.always_clear:
        with out.timed("always_clear", n_rows):
            for name, rows in rows_by_set.items():
                out.decisions[name]["always_clear"] = always_clear(rows)
    if cfg.baselines.minilm:
        from clariedge.training.evaluate import fit_minilm

        with out.timed("minilm", n_rows):
            predict = fit_minilm(train_rows(), seed=seed)
            for name, rows in rows_by_set.items():
                out.decisions[name]["minilm"] = predict(rows)
    if cfg.baselines.zero_shot:
        from clariedge.training.infer import Clarifier

        length = out.window.get("max_length") or lm["max_length"] or adapter_max_length(adapter_dir)
        base = Clarifier(None, base=base_dir, **(lm | {"max_length": length}))
        out.window.setdefault("max_length", base.max_length)
        with out.timed("zero_shot", n_rows):
            for name, rows in rows_by_set.items():
                out.decisions[name]["zero_shot"] = lm_decide(base, rows, desc=f"zero_shot {name}", progress=progress)
        del base
    return out


def adapter_max_length(adapter_dir: str | Path) -> int | None:
    """The adapter's training `max_length` (the window `evaluate` uses by default), if recorded."""
    from clariedge.training.data import adapter_meta

    value = adapter_meta(adapter_dir).get("max_length")
    return int(value) if value else None
