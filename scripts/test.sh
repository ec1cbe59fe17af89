#!/usr/bin/env bash
# The test command (README, `.ci/run`): set up the environment, start the services the tests need
# (a real local Argilla server), run the whole suite, and stop the services again, whatever happens.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if [[ -x scripts/argilla.sh && "${CLARIEDGE_SKIP_ARGILLA:-0}" != "1" ]]; then
  bash scripts/argilla.sh install
  trap 'bash scripts/argilla.sh down' EXIT
  bash scripts/argilla.sh up
  [[ -x scripts/browser_deps.sh ]] && bash scripts/browser_deps.sh
  # the running server's URL and owner key for the `argilla` tests
  eval "$(bash scripts/argilla.sh env)"
fi

status=0
python -m pytest "$@" || status=$?
# pytest exits 5 when nothing was collected: that is a failure of the test command, not a pass
exit $status
