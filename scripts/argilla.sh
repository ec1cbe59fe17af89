#!/usr/bin/env bash
# A local Argilla 2.8 stack for development and tests, without Docker.
#
#   scripts/argilla.sh install   # .argilla/venv with argilla-server 2.8.0 + noida-db (ES/Redis-compatible store)
#   scripts/argilla.sh up        # noida + migrated SQLite DB + users + server (127.0.0.1:6900) + one worker
#   scripts/argilla.sh status    # which of the recorded processes run, and whether the API answers
#   scripts/argilla.sh down      # stops exactly the PIDs `up` recorded (idempotent); `down server` stops one part
#   scripts/argilla.sh env       # prints `export ARGILLA_API_URL=... ARGILLA_API_KEY=...` (for eval)
#   scripts/argilla.sh reset     # down, then delete the server's data (datasets, users)
#
# Everything lives under .argilla/ (gitignored). Names, passwords and API keys come from the environment
# (defaults below: development-only credentials for a loopback server).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="${ARGILLA_LOCAL_DIR:-$ROOT/.argilla}"
VENV="$BASE/venv"
RUN="$BASE/run"
LOGS="$BASE/logs"
DATA="$BASE/data"

HOST="${ARGILLA_HOST:-127.0.0.1}"
PORT="${ARGILLA_PORT:-6900}"
ES_PORT="${ARGILLA_ES_PORT:-9200}"
REDIS_PORT="${ARGILLA_REDIS_PORT:-6379}"
WORKSPACE="${ARGILLA_WORKSPACE:-default}"
OWNER="${ARGILLA_OWNER:-owner}"
OWNER_PASSWORD="${ARGILLA_OWNER_PASSWORD:-owner.password}"
OWNER_KEY="${ARGILLA_OWNER_API_KEY:-owner.apikey}"
# space-separated annotator usernames; password <name>.password, API key <name>.apikey
ANNOTATORS="${ARGILLA_ANNOTATORS:-annotator-1 annotator-2}"
ANNOTATOR_PASSWORD_SUFFIX="${ARGILLA_ANNOTATOR_PASSWORD_SUFFIX:-.password}"

SERVER_PKGS=("argilla-server==2.8.0" "click<8.2" "noida-db==0.2.3")
URL="http://$HOST:$PORT"

log() { printf 'argilla.sh: %s\n' "$*" >&2; }
die() { printf 'argilla.sh: error: %s\n' "$*" >&2; exit 1; }

server_env() {
  export ARGILLA_HOME_PATH="$DATA/home"
  export ARGILLA_DATABASE_URL="sqlite+aiosqlite:///$DATA/argilla.db"
  export ARGILLA_SEARCH_ENGINE=elasticsearch
  export ARGILLA_ELASTICSEARCH="http://$HOST:$ES_PORT"
  export ARGILLA_REDIS_URL="redis://$HOST:$REDIS_PORT/0"
  export ARGILLA_ENABLE_TELEMETRY=0
  export HF_HUB_OFFLINE=1
  export HF_HUB_DISABLE_TELEMETRY=1
}

cmd_install() {
  mkdir -p "$BASE"
  if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import argilla_server, noida_db" 2>/dev/null; then
    log "server venv ready: $VENV"
    return 0
  fi
  local py="${ARGILLA_PYTHON:-python3.11}"
  command -v "$py" >/dev/null || py=python3
  log "creating $VENV with ${SERVER_PKGS[*]} (about a minute)"
  "$py" -m venv "$VENV"
  mkdir -p "$LOGS"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${SERVER_PKGS[@]}" >"$LOGS/install.log" 2>&1 \
    || { tail -n 30 "$LOGS/install.log" >&2; die "pip install failed; see $LOGS/install.log"; }
  "$VENV/bin/python" -c "import argilla_server, noida_db" || die "install finished but imports fail"
  log "installed"
}

# a recorded PID counts only while it is alive AND still runs what we started (PIDs get reused)
marker() { case "$1" in noida) echo "noida-db" ;; server) echo "argilla_server start" ;; worker) echo "argilla_server worker" ;; esac; }
# runs_marker PID NAME: the process's command line contains NAME's marker (read into a variable, so
# the answer does not hang on the exit status of every member of a pipe under pipefail)
runs_marker() {
  local cmdline
  cmdline="$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null)" || return 1
  [[ "$cmdline" == *"$(marker "$2")"* ]]
}
# just started by us: alive is enough (the marker check is for stale PID files from earlier sessions)
started_alive() { [[ -f "$RUN/$1.pid" ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }
pid_alive() {
  started_alive "$1" || return 1
  local pid
  pid="$(cat "$RUN/$1.pid")"
  [[ ! -r "/proc/$pid/cmdline" ]] || runs_marker "$pid" "$1"
}

# start NAME LOGFILE CMD... : run CMD in its own session, record its PID
start() {
  local name="$1" logf="$2"; shift 2
  if pid_alive "$name"; then
    log "$name already running (pid $(cat "$RUN/$name.pid"))"
    return 0
  fi
  setsid "$@" >>"$logf" 2>&1 < /dev/null &
  local pid=$! i
  echo "$pid" >"$RUN/$name.pid"
  # until the forked shell has exec'd the command, its cmdline lacks the marker: give it a moment
  # (or until the process ends) so the PID file is trustworthy for `down` and `status` right away
  for ((i = 0; i < 100; i++)); do
    { pid_alive "$name" || ! kill -0 "$pid" 2>/dev/null; } && break  # exec done, or it ended
    sleep 0.1
  done
  log "started $name (pid $pid)"
}

wait_port() {  # wait_port PORT SECONDS NAME
  local port="$1" secs="$2" name="$3" i
  for ((i = 0; i < secs * 4; i++)); do
    if (exec 3<>"/dev/tcp/$HOST/$port") 2>/dev/null; then return 0; fi
    started_alive "$name" || die "$name exited; see $LOGS/$name.log"
    sleep 0.25
  done
  die "$name did not open port $port within ${secs}s; see $LOGS/$name.log"
}

api_ok() {
  "$VENV/bin/python" - "$URL" "$OWNER_KEY" <<'PY'
import sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/api/v1/me", headers={"X-Argilla-Api-Key": sys.argv[2]})
try:
    with urllib.request.urlopen(req, timeout=3) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

create_user() {  # create_user NAME PASSWORD KEY ROLE
  local out
  if out=$("$VENV/bin/python" -m argilla_server database users create --first-name "$1" --username "$1" \
      --password "$2" --api-key "$3" --role "$4" --workspace "$WORKSPACE" 2>&1); then
    log "user $1 ($4) created"
  elif grep -qi "already exists" <<<"$out"; then
    log "user $1 exists"
  else
    printf '%s\n' "$out" >&2
    die "could not create user $1"
  fi
}

cmd_up() {
  [[ -x "$VENV/bin/python" ]] || cmd_install
  mkdir -p "$RUN" "$LOGS" "$DATA/noida" "$DATA/home"
  server_env
  local noida_bin
  noida_bin="$("$VENV/bin/python" -c 'import noida_db, os; print(os.path.join(os.path.dirname(noida_db.__file__), "noida-db"))')"
  [[ -x "$noida_bin" ]] || die "noida-db binary not found at $noida_bin"
  start noida "$LOGS/noida.log" "$noida_bin" start --data-dir "$DATA/noida" --host "$HOST" \
    --only elasticsearch,redis --elasticsearch-port "$ES_PORT" --redis-port "$REDIS_PORT"
  wait_port "$ES_PORT" 60 noida
  wait_port "$REDIS_PORT" 30 noida

  # migrate + users once per data folder and user list (each is a Python start-up: seconds apiece)
  local a setup_key
  setup_key="${SERVER_PKGS[*]}|$WORKSPACE|$OWNER|$OWNER_KEY|$ANNOTATORS|$ANNOTATOR_PASSWORD_SUFFIX"
  if [[ ! -f "$DATA/argilla.db" || "$(cat "$DATA/setup.done" 2>/dev/null)" != "$setup_key" ]]; then
    "$VENV/bin/python" -m argilla_server database migrate >>"$LOGS/migrate.log" 2>&1 \
      || die "database migration failed; see $LOGS/migrate.log"
    create_user "$OWNER" "$OWNER_PASSWORD" "$OWNER_KEY" owner
    for a in $ANNOTATORS; do
      create_user "$a" "$a$ANNOTATOR_PASSWORD_SUFFIX" "$a.apikey" annotator
    done
    printf '%s' "$setup_key" >"$DATA/setup.done"
  fi

  start server "$LOGS/server.log" "$VENV/bin/python" -m argilla_server start --host "$HOST" --port "$PORT"
  start worker "$LOGS/worker.log" "$VENV/bin/python" -m argilla_server worker --num-workers 1
  local i
  for ((i = 0; i < 240; i++)); do
    api_ok && break
    started_alive server || die "server exited; see $LOGS/server.log"
    sleep 0.5
  done
  api_ok || die "server did not answer $URL/api/v1/me within 120s; see $LOGS/server.log"
  cat <<MSG
Argilla is up: $URL  (UI and API; data in ${BASE#"$ROOT"/})
  owner:      $OWNER / $OWNER_PASSWORD   API key: $OWNER_KEY
MSG
  for a in $ANNOTATORS; do
    printf '  annotator:  %s / %s   API key: %s\n' "$a" "$a$ANNOTATOR_PASSWORD_SUFFIX" "$a.apikey"
  done
  cat <<MSG
For the pipeline:  export ARGILLA_API_URL=$URL ARGILLA_API_KEY=$OWNER_KEY
Stop with:         scripts/argilla.sh down
MSG
}

cmd_down() {
  local name pid i names=("$@")
  [[ ${#names[@]} -gt 0 ]] || names=(worker server noida)
  for name in "${names[@]}"; do
    [[ "$name" =~ ^(worker|server|noida)$ ]] || die "unknown part $name (worker|server|noida)"
    [[ -f "$RUN/$name.pid" ]] || continue
    pid="$(cat "$RUN/$name.pid")"
    if pid_alive "$name"; then
      # setsid made the PID a process-group leader: stop the group it leads (its own children), nothing else
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      for ((i = 0; i < 40; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      if kill -0 "$pid" 2>/dev/null; then
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      fi
      log "stopped $name (pid $pid)"
    fi
    rm -f "$RUN/$name.pid"
  done
  return 0
}

cmd_status() {
  local name rc=0
  for name in noida server worker; do
    if pid_alive "$name"; then
      printf '%-7s running (pid %s)\n' "$name" "$(cat "$RUN/$name.pid")"
    else
      printf '%-7s stopped\n' "$name"; rc=1
    fi
  done
  if [[ -x "$VENV/bin/python" ]] && api_ok; then
    printf 'api     %s answers\n' "$URL"
  else
    printf 'api     %s not answering\n' "$URL"; rc=1
  fi
  return $rc
}

case "${1:-}" in
  install) cmd_install ;;
  up) cmd_up ;;
  down) shift; cmd_down "$@" ;;
  env) printf 'export ARGILLA_API_URL=%q ARGILLA_API_KEY=%q\n' "$URL" "$OWNER_KEY" ;;
  status) cmd_status ;;
  reset) cmd_down; rm -rf "$DATA" "$RUN"; log "removed server data under ${BASE#"$ROOT"/}" ;;
  *) echo "usage: $0 install|up|down [part...]|status|env|reset" >&2; exit 2 ;;
esac
