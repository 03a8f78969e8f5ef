#!/usr/bin/env bash
# One command for the ring. Usage: ./launch.sh [start|stop|restart|status|check|logs|test|prepare] [args]
#   start    install what is needed, prepare the model, bring every host in hosts.json up to date
#            (code, environment, its slice of the weights), start a rank on each (default)
#   check    a preflight table per host (ssh, path, versions, memory against its slice, links); exit 0 when all is well
#   stop     stop every rank           status   is it up, and the per-rank layer plan and memory
#   logs     follow logs/*.log         test     run the test suite (extra args go to pytest)
#   prepare  install and convert the model only
#   bench    benchmark the ring against single-process mlx_lm.server (see tools/bench.py --help)
#   plan     print the layer plan for the hostfile and model, loading no weights (--json, --model, --strategy)
#   setup    install this host's environment only (the launcher runs it on every host)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)

# Settings from the environment or .env (server.py reads .env itself for everything else).
setting() { local v="${!1:-}"; [ -z "$v" ] && [ -f .env ] && v=$(sed -n "s/^$1=//p" .env | tail -n 1 | tr -d '"'\'); echo "${v:-$2}"; }
HOSTFILE=$(setting HOSTFILE hosts.json)
HOST=$(setting HOST 127.0.0.1)
PORT=$(setting PORT 8100)
RING_PORT=$(setting RING_PORT 32323)
STARTUP_TIMEOUT=$(setting STARTUP_TIMEOUT 600)
DRAIN_TIMEOUT=$(setting DRAIN_TIMEOUT 30)
MAX_RESTARTS=$(setting MAX_RESTARTS 5)
URL_HOST=$([ "$HOST" = "0.0.0.0" ] && echo 127.0.0.1 || echo "$HOST")
URL="http://$URL_HOST:$PORT"
LOG_DIR=$(setting LOG_DIR logs)
export LOG_DIR
PIDFILE=$LOG_DIR/launcher.pid
PLANNED=$LOG_DIR/launch  # written by `python -m mlx_ring.hosts.up up`: mlx.launch's hostfile, the ranks' settings, the URL

say() { printf '%s\n' "$*" >&2; }

ensure_uv() {
  command -v uv >/dev/null 2>&1 && return
  export PATH="$HOME/.local/bin:$PATH"
  command -v uv >/dev/null 2>&1 && return
  say "installing uv (the project's environment manager) with pip..."
  python3 -m pip install --user -q uv 2>/dev/null || python3 -m pip install -q --break-system-packages uv
  command -v uv >/dev/null 2>&1 || { say "uv is not on PATH after install; add \$HOME/.local/bin to PATH"; exit 1; }
}

# On a Linux CPU, MLX's bundled BLAS is the slow reference one; Debian's OpenBLAS is ~50x faster.
OPENBLAS=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
ensure_blas() {
  [ "$(uname -s)" = Linux ] || return 0
  if [ ! -e "$OPENBLAS" ] && [ "${1:-install}" = install ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing OpenBLAS for MLX's CPU backend (apt-get install libopenblas0-pthread)..."
    (apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq libopenblas0-pthread; }) >/dev/null 2>&1 || true
  fi
  if [ -e "$OPENBLAS" ]; then
    export LD_PRELOAD="$OPENBLAS${LD_PRELOAD:+:$LD_PRELOAD}"
  else
    say "note: OpenBLAS not found; the CPU backend will be slow (install libopenblas0-pthread)"
  fi
}

ensure_env() {
  ensure_uv
  local extra=()
  [ "$(setting CUDA 0)" = 1 ] && extra=(--extra cuda)
  # From uv's cache when it holds everything (no network needed: a host the launcher provisions may have none).
  uv sync --frozen --quiet --offline "${extra[@]}" "$@" 2>/dev/null || uv sync --frozen --quiet "${extra[@]}" "$@"
  ensure_blas
}

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

# Rank 0 drains its requests, then shuts every rank down; it may be on another host.
drain_rank0() {
  local r0; r0=$(cat "$PLANNED/rank0" 2>/dev/null || echo 127.0.0.1)
  if [ "$r0" = 127.0.0.1 ]; then
    [ -f "$LOG_DIR/rank0.pid" ] && kill -TERM "$(cat "$LOG_DIR/rank0.pid")" 2>/dev/null
  else
    ssh -F "$(cd "$LOG_DIR" && pwd)/ssh_config" "$r0" "cd '$ROOT' && kill -TERM \$(cat '$LOG_DIR/rank0.pid')" 2>/dev/null
  fi
  return 0
}

# Runs in a session of its own (see start): restarts the ring when it fails, a bounded number of
# times; SIGTERM drains rank 0 (which shuts the other ranks down) and ends the loop.
supervise() {
  local tries=0 stopping=0 lp rc t0
  local sshf; sshf="$(cd "$LOG_DIR" && pwd)/ssh_config"
  trap 'stopping=1; drain_rank0' TERM INT
  while :; do
    rm -f "$LOG_DIR/rank0.pid"
    # Before a restart, the hosts again: one that went away is named in a sentence, not retried.
    if [ "$tries" -gt 0 ] && ! .venv/bin/python -m mlx_ring.hosts.up up --ring-port "$RING_PORT" --out "$PLANNED" "$@"; then
      say "not restarting: a host is not ready (above)"; exit 3
    fi
    t0=$(date +%s)
    local envs=() line
    while IFS= read -r line; do envs+=(--env "$line"); done < "$PLANNED/env"
    envs+=(--env "RING_RESTARTS=$tries")  # /metrics reports it
    # mlx.launch busy-loops on an empty or finished stdin: give it an open pipe with a byte now and
    # then (local ranks close their end at start, ssh ranks get none from bin/ssh; either way the
    # next byte fails to write and it stops watching). Its `ssh` is ours: the ring's ssh options.
    PATH="$ROOT/mlx_ring/hosts/bin:$PATH" RING_SSH_FILE="$sshf" \
      .venv/bin/mlx.launch --backend ring --hostfile "$PLANNED/hosts.json" --starting-port "$RING_PORT" --cwd "$ROOT" \
      "${envs[@]}" -- "$ROOT/launch.sh" rank "$@" < <(exec 2>/dev/null; while sleep 1; do echo; done) \
      > "$LOG_DIR/attempt.log" 2>&1 &
    lp=$!
    while kill -0 "$lp" 2>/dev/null; do
      # Rank 0 gone, yet mlx.launch still waits on a rank that cannot exit (stopped or hung): force it.
      if [ -f "$LOG_DIR/rank0.pid" ] && ! kill -0 "$(cat "$LOG_DIR/rank0.pid")" 2>/dev/null; then
        sleep 3
        kill -0 "$lp" 2>/dev/null && { say "a rank did not exit after rank 0 left; killing the ring"; pkill -KILL -P "$lp" || true; kill -KILL "$lp" || true; }
      fi
      sleep 1 & wait $! || true
    done
    rc=0; wait "$lp" || rc=$?
    cat "$LOG_DIR/attempt.log"  # into launcher.log
    [ "$stopping" = 1 ] && { say "ring stopped"; exit 0; }
    # A rank that cannot start (a setting, a model, a host that differs) fails the same way again.
    if grep -q "cannot start: " "$LOG_DIR/attempt.log" 2>/dev/null; then
      say "not restarting: $(grep -m 1 -o 'cannot start: .*' "$LOG_DIR/attempt.log")"; exit 3
    fi
    [ $(( $(date +%s) - t0 )) -gt 300 ] && tries=0  # a ring that served a while starts a fresh count
    tries=$((tries + 1))
    if [ "$tries" -gt "$MAX_RESTARTS" ]; then say "the ring failed $tries times in a row (exit $rc); giving up"; exit 1; fi
    say "the ring exited with code $rc; restart $tries of $MAX_RESTARTS in 2 s"
    sleep 2
  done
}

start() {
  if running; then say "already running (pid $(cat "$PIDFILE")) at $URL"; status; return; fi
  ensure_env
  mkdir -p "$LOG_DIR"
  say "preparing the model (converted once, then cached)..."
  .venv/bin/python server.py --prepare >/dev/null
  say "checking and provisioning the hosts in $HOSTFILE..."
  .venv/bin/python -m mlx_ring.hosts.up up --ring-port "$RING_PORT" --out "$PLANNED" "$@" || exit 2
  URL=$(cat "$PLANNED/url")
  say "starting the ring..."
  local seen=0; [ -f "$LOG_DIR/launcher.log" ] && seen=$(wc -c < "$LOG_DIR/launcher.log")  # earlier runs' lines are not this one's
  rm -f "$LOG_DIR/attempt.log"
  # A session of its own, so `stop` can reach the supervisor, the launcher and local ranks together.
  setsid nohup "$ROOT/launch.sh" supervise "$@" >> "$LOG_DIR/launcher.log" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  local rc=0
  .venv/bin/python -m mlx_ring.hosts.ready --url "$URL" --log "$LOG_DIR/attempt.log" --hosts "$PLANNED/hosts.json" \
    --pid "$(cat "$PIDFILE")" --timeout "$STARTUP_TIMEOUT" || rc=$?
  if [ "$rc" = 1 ]; then
    local why; why=$(tail -c "+$((seen + 1))" "$LOG_DIR/launcher.log" | grep -o 'cannot start: .*' | tail -n 1 || true)
    [ -n "$why" ] && { say "$why"; exit 2; }
    say "the ring exited during startup; last lines of $LOG_DIR/launcher.log:"; tail -n 20 "$LOG_DIR/launcher.log" >&2; exit 1
  fi
  [ "$rc" = 0 ] || { say "not healthy after ${STARTUP_TIMEOUT}s; see logs/"; exit 1; }
  say "ready: $URL/v1 (OpenAI-compatible)"
  status
}

stop() {
  if ! running; then say "not running"; rm -f "$PIDFILE"; return; fi
  local pid; pid=$(cat "$PIDFILE")
  kill -TERM "$pid"  # the supervisor drains rank 0, which shuts every rank down
  for _ in $(seq 1 $(( (DRAIN_TIMEOUT + 15) * 2 ))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- "-$pid" 2>/dev/null || true  # anything left in the session (normally nothing)
  rm -f "$PIDFILE"
  say "stopped"
}

status() {
  if ! running; then say "not running"; return 1; fi
  [ -f "$PLANNED/url" ] && URL=$(cat "$PLANNED/url")
  curl -sfk "$URL/health" >/dev/null || { say "launcher pid $(cat "$PIDFILE") is up but $URL/health does not answer"; return 1; }
  curl -sfk "$URL/cluster/status" | python3 -c '
import json, sys
s = json.load(sys.stdin)
print("model %(model)s, plan %(strategy)s over %(n_layers)d layers" % dict(s["plan"], model=s["model"]))
rows = [("rank", "host", "layers", "weights", "resident", "KV cache", "sequences")]
for r in s["ranks"]:
    ends = " + ends" if r["holds_embedding"] else ""
    rows.append((str(r["rank"]), r["host"], "[%d, %d)%s" % (*r["layers"], ends), "%.1f MiB" % (r["parameter_bytes_kib"] / 1024),
                 "%.1f MiB" % (r["rss_kib"] / 1024), "%.1f MiB" % (r["kv_cache_kib"] / 1024), str(r["open_sequences"])))
w = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
for row in rows:
    print("  " + "  ".join(c.ljust(n) for c, n in zip(row, w)).rstrip())
print("  %d request(s) queued" % s["queued_requests"])'
}


cmd=${1:-start}
[ $# -gt 0 ] && shift
case "$cmd" in
  start) start "$@" ;;
  supervise) supervise "$@" ;;
  stop) stop ;;
  restart) stop; start "$@" ;;
  status) status ;;
  logs) mkdir -p "$LOG_DIR"; if [ -t 1 ]; then tail -n 50 -F "$LOG_DIR"/*.log; else tail -n "${1:-100}" "$LOG_DIR"/*.log; fi ;;
  prepare) ensure_env; .venv/bin/python server.py --prepare ;;
  setup) ensure_env ;;
  check) ensure_env; mkdir -p "$LOG_DIR"; .venv/bin/python server.py --prepare >/dev/null
         exec .venv/bin/python -m mlx_ring.hosts.up check --ring-port "$RING_PORT" "$@" ;;
  # On every host, started by mlx.launch (rank) or the launcher (probe): this host's BLAS, then Python.
  rank) ensure_blas quiet; exec .venv/bin/python server.py "$@" ;;
  probe) ensure_blas quiet; exec .venv/bin/python -m mlx_ring.planning.probe "$@" ;;
  plan) ensure_env; exec .venv/bin/python -m mlx_ring.planning.planner --hostfile "$HOSTFILE" "$@" ;;  # later flags win
  test) ensure_env; exec .venv/bin/python -m pytest "$@" ;;
  bench) ensure_env; exec .venv/bin/python tools/bench.py "$@" ;;
  *) say "unknown command '$cmd'; use start, stop, restart, status, check, logs, test, prepare, plan, setup or bench"; exit 2 ;;
esac
