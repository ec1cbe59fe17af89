"""Fetching the public MTRAG files by URL, cached on disk and checked against SHA-256 sums.

Used by the `ingest` stage when `ingest.source: mtrag_url`. A file already in the cache with the
right checksum is never fetched again; a wrong checksum or no network is a clear error.
"""

from __future__ import annotations

import hashlib
import logging
import urllib.error
import urllib.request
from pathlib import Path

from clariedge.io import atomic_path

log = logging.getLogger(__name__)


class DownloadError(RuntimeError):
    pass


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(base_url: str, files: dict[str, str], cache_dir: str | Path, timeout_s: float = 60.0) -> Path:
    """Make sure every `relative path -> sha256` in `files` is in `cache_dir`; return that folder."""
    cache = Path(cache_dir)
    for rel, expected in sorted(files.items()):
        dest = cache / rel
        if dest.exists() and sha256_of(dest) == expected:
            continue
        url = base_url.rstrip("/") + "/" + rel
        log.info("downloading %s", url)
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp, atomic_path(dest) as tmp:
                tmp.write_bytes(resp.read())
                got = sha256_of(tmp)
                if got != expected:
                    raise DownloadError(
                        f"{url}: checksum mismatch (expected {expected}, got {got}); "
                        "the upstream file changed: update ingest.mtrag_url.files"
                    )
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            raise DownloadError(
                f"cannot download {url}: {err}. Without a network, set `ingest.source: paths` with "
                f"`ingest.paths: [data/sample]` (the bundled offline sample) or local MTRAG files, or place the "
                f"files in {cache}"
            ) from None
    return cache
