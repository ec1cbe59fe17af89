"""The base_model stage: its output folder is a DVC output, so it must hash the same on every run."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from conftest import params_section


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.slow
def test_base_model_folder_is_byte_identical_across_runs(base_model_dir: Path, tmp_path: Path) -> None:
    from clariedge.training.base_model import run

    summary = run(tmp_path / "base", params_section("base_model"))
    assert summary["parameters"] > 100_000_000
    assert "load_s" in summary  # the timing is reported to the caller ...
    assert "load_s" not in (tmp_path / "base" / "clariedge_base.json").read_text(encoding="utf-8")  # ... not saved
    assert _digests(tmp_path / "base") == _digests(base_model_dir)
