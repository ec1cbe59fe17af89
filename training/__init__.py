"""The model: base model stage, LoRA training, inference (`Clarifier`, `predict`), evaluation and ablation.

OpenMP's wait policy is set where the package loads (`clariedge/__init__.py`), before torch."""
