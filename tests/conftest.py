"""Shared pytest fixtures: paths to the real MTRAG data (skipping cleanly where it is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MTRAG = ROOT.parent / "shared" / "data" / "mtrag"
SAMPLE = ROOT / "data" / "sample"


@pytest.fixture(scope="session")
def mtrag_dir() -> Path:
    """The real MTRAG files beside the checkout (`../shared/data/mtrag`); skip where absent."""
    if not (MTRAG / "reference_subset_with_human_evaluations.json").exists():
        pytest.skip("real MTRAG data not present (../shared/data/mtrag)")
    return MTRAG


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    return SAMPLE


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base model as an HF folder: `models/base` when `dvc repro base_model` made it, else built now (slow)."""
    built = ROOT / "models" / "base"
    if (built / "config.json").exists() and (built / "model.safetensors").exists():
        return built
    from clariedge.training.base_model import BaseModelConfig, run

    out = tmp_path_factory.mktemp("models") / "base"
    run(out, BaseModelConfig())
    return out
