#!/usr/bin/env bash
# What the headless-browser review test needs: Debian's chromium (never a downloaded browser build) and
# playwright-core from npm (tests/browser/package.json pins it). Idempotent; run by scripts/test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ ! -x /usr/bin/chromium ]]; then
  if command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]]; then
    echo "browser_deps.sh: installing Debian chromium" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "browser_deps.sh: /usr/bin/chromium missing and apt-get (as root) unavailable; the browser test will skip" >&2
  fi
fi

if ! command -v npm >/dev/null; then
  echo "browser_deps.sh: npm not found; the browser test will skip" >&2
  exit 0
fi
cd "$ROOT/tests/browser"
if [[ ! -d node_modules/playwright-core ]]; then
  # playwright-core ships no browser and downloads none; the variable makes sure of it
  export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
  if [[ -f package-lock.json ]]; then
    npm ci --no-audit --no-fund --loglevel=error
  else
    npm install --no-audit --no-fund --loglevel=error
  fi
fi
