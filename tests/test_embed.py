"""MiniLM sentence embeddings (clariedge.embed) with the real offline all-MiniLM-L6-v2: unit vectors that
put paraphrases together, and the SQLite cache (one row per distinct text, read back instead of recomputed)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from clariedge import embed as E

TEXTS = [
    "When was the Eiffel Tower built?",
    "In what year was the Eiffel Tower constructed?",
    "What is the boiling point of water at sea level?",
    "When was the Eiffel Tower built?",  # a duplicate
    "Which of the two accounts do you mean?",
]


def rows(cache: Path) -> int:
    with sqlite3.connect(cache) as db:
        return db.execute("SELECT COUNT(*) FROM emb").fetchone()[0]


@pytest.fixture(scope="module")
def uncached() -> np.ndarray:
    return E.embed(TEXTS)


def test_the_model_is_the_offline_minilm_of_the_declared_dimension() -> None:
    config = json.loads((Path(E.model_path()) / "config.json").read_text(encoding="utf-8"))
    assert config["hidden_size"] == E.DIM == 384


def test_embeddings_are_unit_vectors_one_per_text(uncached: np.ndarray) -> None:
    assert uncached.shape == (len(TEXTS), E.DIM) and uncached.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(uncached, axis=1), 1.0, atol=1e-5)
    assert np.isfinite(uncached).all()


def test_a_paraphrase_is_closer_than_an_unrelated_question(uncached: np.ndarray) -> None:
    sims = uncached @ uncached.T  # cosine, since the rows are unit vectors
    assert sims[0, 1] > 0.7  # the same question, reworded
    assert sims[0, 2] < 0.3 and sims[0, 4] < 0.3
    assert sims[0, 1] > sims[0, 2] + 0.4
    np.testing.assert_allclose(uncached[0], uncached[3], atol=1e-6)  # the same text, the same vector


def test_a_vector_depends_on_its_text_alone_to_the_bit(uncached: np.ndarray) -> None:
    # Batched with padding, these texts (of different lengths) moved by up to 2e-7 with their company,
    # and a warm cache then gave other published label_quality values than a cold one.
    for i, text in enumerate(TEXTS):
        np.testing.assert_array_equal(E.embed([text])[0], uncached[i])
    np.testing.assert_array_equal(E.embed(TEXTS[::-1]), uncached[::-1])


def test_a_warm_cache_returns_what_a_cold_one_computes(tmp_path: Path, uncached: np.ndarray) -> None:
    warm = tmp_path / "warm.sqlite"
    E.embed(TEXTS[1:3], cache_path=warm)  # a few texts in earlier runs, the rest embedded now
    np.testing.assert_array_equal(E.embed(TEXTS, cache_path=warm), uncached)
    np.testing.assert_array_equal(E.embed(TEXTS, cache_path=tmp_path / "cold.sqlite"), uncached)


def test_the_cache_holds_one_row_per_distinct_text_and_keeps_the_input_order(
    tmp_path: Path, uncached: np.ndarray
) -> None:
    cache = tmp_path / "emb.sqlite"
    first = E.embed(TEXTS, cache_path=cache)
    assert rows(cache) == len(set(TEXTS)) == 4
    np.testing.assert_allclose(first, uncached, atol=1e-5)  # row i is texts[i], whatever order they were embedded in
    again = E.embed(list(reversed(TEXTS)), cache_path=cache)
    np.testing.assert_array_equal(again, first[::-1])  # from the cache: the same float32 bits
    assert rows(cache) == 4


def test_a_second_call_reads_vectors_from_the_cache_and_embeds_only_new_texts(tmp_path: Path) -> None:
    cache = tmp_path / "emb.sqlite"
    E.embed(TEXTS[:3], cache_path=cache)
    sentinel = np.zeros(E.DIM, np.float32)
    sentinel[7] = 1.0
    with sqlite3.connect(cache) as db:  # overwrite every stored vector: a recomputation would not return these
        db.execute("UPDATE emb SET vec = ?", (sentinel.tobytes(),))
    out = E.embed([TEXTS[1], "How tall is Mont Blanc?", TEXTS[0]], cache_path=cache)
    np.testing.assert_array_equal(out[0], sentinel)
    np.testing.assert_array_equal(out[2], sentinel)
    assert not np.array_equal(out[1], sentinel)  # the new text was embedded
    assert abs(float(np.linalg.norm(out[1])) - 1.0) < 1e-5
    assert rows(cache) == 4


def test_ensure_cache_creates_an_empty_table_and_keeps_what_is_there(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "nested" / "emb.sqlite"
    assert E.ensure_cache(cache) == cache
    assert cache.exists() and rows(cache) == 0
    E.embed(TEXTS[:2], cache_path=cache)
    E.ensure_cache(cache)
    assert rows(cache) == 2


def test_embedding_nothing_still_leaves_the_cache_behind(tmp_path: Path) -> None:
    cache = tmp_path / "emb.sqlite"
    out = E.embed([], cache_path=cache)
    assert out.shape == (0, E.DIM) and out.dtype == np.float32
    assert cache.exists() and rows(cache) == 0
    assert E.embed([]).shape == (0, E.DIM)
