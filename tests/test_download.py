"""The online MTRAG source: files fetched by URL into a cache, checked by SHA-256; offline, a clear error.

A real HTTP server on loopback stands in for the upstream host (no network here)."""

from __future__ import annotations

import hashlib
import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import write_params

from clariedge.download import DownloadError, fetch

BEIR_LINE = b'{"_id": "c<::>1", "text": "|user|: who wrote Dune?"}\n'


@pytest.fixture()
def upstream(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    root = tmp_path / "upstream"
    (root / "retrieval_tasks" / "x").mkdir(parents=True)
    (root / "retrieval_tasks" / "x" / "x_lastturn.jsonl").write_bytes(BEIR_LINE)
    hits: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *args) -> None:
            hits.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()


def test_fetch_caches_and_checks_the_checksum(upstream: tuple[str, list[str]], tmp_path: Path) -> None:
    url, hits = upstream
    files = {"retrieval_tasks/x/x_lastturn.jsonl": hashlib.sha256(BEIR_LINE).hexdigest()}
    cache = fetch(url, files, tmp_path / "cache")
    assert (cache / "retrieval_tasks/x/x_lastturn.jsonl").read_bytes() == BEIR_LINE
    fetch(url, files, tmp_path / "cache")  # cached: not fetched again
    assert len(hits) == 1
    with pytest.raises(DownloadError, match="checksum mismatch"):
        fetch(url, {"retrieval_tasks/x/x_lastturn.jsonl": "0" * 64}, tmp_path / "other")
    assert not (tmp_path / "other" / "retrieval_tasks/x/x_lastturn.jsonl").exists()


def test_offline_ingest_fails_with_a_clear_message(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mtrag = {"base_url": f"http://127.0.0.1:{port}", "files": {"a.jsonl": "0" * 64}, "timeout_s": 5}
    write_params(tmp_path / "params.yaml", ingest={"source": "mtrag_url", "mtrag_url": mtrag})
    proc = subprocess.run(
        [sys.executable, "-m", "clariedge.cli", "ingest", "-o", "seeds.parquet"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "cannot download" in proc.stderr and "ingest.source: paths" in proc.stderr
    assert not (tmp_path / "seeds.parquet").exists()
