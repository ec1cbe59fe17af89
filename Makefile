# Entry points; each target sets up .venv first (idempotent). See README.md.
.PHONY: setup repro review-sync test test-fast lint bench argilla-up argilla-down

setup:
	bash scripts/setup.sh

repro: setup
	PATH="$(CURDIR)/.venv/bin:$$PATH" HF_HUB_OFFLINE=1 .venv/bin/dvc repro

# after annotating in Argilla (review.mode: argilla): pull the new responses and continue the pipeline
review-sync: setup
	PATH="$(CURDIR)/.venv/bin:$$PATH" HF_HUB_OFFLINE=1 .venv/bin/dvc repro --force --single-item review
	PATH="$(CURDIR)/.venv/bin:$$PATH" HF_HUB_OFFLINE=1 .venv/bin/dvc repro

test:
	bash scripts/test.sh

test-fast:
	CLARIEDGE_SKIP_ARGILLA=1 bash scripts/test.sh -m "not slow and not argilla"

lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

bench: setup
	for b in bench/bench_*.py; do echo "== $$b"; .venv/bin/python -m bench.$$(basename $$b .py) || exit 1; done

argilla-up:
	bash scripts/argilla.sh install && bash scripts/argilla.sh up

argilla-down:
	bash scripts/argilla.sh down
