#!/usr/bin/env bash
# Re-record the terminal captures in docs/oncall.md ("Following a run: what the terminal shows"):
# a throwaway dev server, worker and Prometheus stand-in, a development target, and a small runbook
# followed in an 80-column tmux pane through a hold, a retry, an approval and the end.
# Usage: scripts/record-follow.sh [OUT_DIR]   (captures land in OUT_DIR/1-held.txt ... 4-end.txt)
# Ports: TEMPORAL_PORT (7299), UI_PORT (8299), PROM_PORT (9299); everything it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TMP=$(mktemp -d /tmp/record-follow.XXXXXX)
OUT=${1:-$(mktemp -d /tmp/follow-captures.XXXXXX)}
mkdir -p "$OUT" "$TMP/targets"
PORT=${TEMPORAL_PORT:-7299} UI_PORT=${UI_PORT:-8299} PROM_PORT=${PROM_PORT:-9299}
SESSION=rec-$$
export TEMPORAL_ADDRESS=127.0.0.1:$PORT TEMPORAL_NAMESPACE=default
export COLDSTART_TASK_QUEUE=record-follow-$$ COLDSTART_TARGETS=$TMP/targets COLDSTART_WEB_UI=127.0.0.1:$UI_PORT
PIDS=()
cleanup() {
  tmux kill-session -t "$SESSION" 2>/dev/null || true
  for pid in "${PIDS[@]}"; do kill -- -"$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"   # the throwaway server database, targets and runbook
}
trap cleanup EXIT

echo 0 > "$TMP/up"   # the gate's query answers 0 (failing) until we flip it
setsid "$ROOT/.venv/bin/python" scripts/fake-prometheus.py "$PROM_PORT" "$TMP/up" >"$TMP/prom.log" 2>&1 & PIDS+=($!)
setsid "$ROOT/.venv/bin/coldstart" server --db-file "$TMP/t.db" --port "$PORT" --ui-port "$UI_PORT" >"$TMP/server.log" 2>&1 & PIDS+=($!)
for _ in $(seq 60); do (echo >/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.5; done
setsid "$ROOT/.venv/bin/python" worker.py --metrics '' --allow-development >"$TMP/worker.log" 2>&1 & PIDS+=($!)

cat > "$TMP/targets/shard-7.yaml" <<YAML
name: shard-7
development: true
description: a throwaway development target for the recording
telemetry:
  prometheus: http://127.0.0.1:$PROM_PORT
YAML
cat > "$TMP/restart-shard.yaml" <<'YAML'
version: 1
metadata:
  name: restart-shard
  description: Bring a game shard back after a restart
  owner: sre-oncall
target: shard-7
approvers: [bob]
steps:
  - id: announce
    action: core.note
    with:
      message: "restart of ${{ run.target }} started by ${{ run.initiator }}"
  - id: shard-healthy
    gate:
      name: shard-up
      endpoint: ${{ target.telemetry.prometheus }}
      query: min(up{job="shard"})
      comparator: ">="
      threshold: 1
      interval: 2s
      consecutive: 3
      timeout: 10s
    on_failure: hold
  - id: open-to-players
    approval:
      prompt: "Shard is healthy: open it to players?"
  - id: done
    action: core.note
    with:
      message: "shard ${{ run.target }} is open to players"
YAML
sleep 3   # let the worker start polling

tmux new-session -d -s "$SESSION" -x 80 -y 40 \
  "cd $TMP && env COLDSTART_USER=alice $ROOT/.venv/bin/coldstart run restart-shard.yaml --target shard-7 --follow; echo '[exit '\$?']'; sleep 600"
tmux resize-window -t "$SESSION" -x 80 -y 40 2>/dev/null || true
capture() { tmux capture-pane -p -t "$SESSION" | sed -e 's/[[:space:]]*$//' | cat -s > "$OUT/$1.txt"; echo "== $1"; cat "$OUT/$1.txt"; }
wait_for() { for _ in $(seq "${2:-60}"); do tmux capture-pane -p -t "$SESSION" | grep -q -- "$1" && return 0; sleep 1; done; echo "timed out waiting for: $1" >&2; return 1; }
cs() { "$ROOT/.venv/bin/coldstart" "$@"; }

wait_for "held" 60 || true; sleep 2; capture 1-held
echo 1 > "$TMP/up"
cs retry shard-7 shard-healthy --as alice -m "shard came back after a manual restart" | tee "$OUT/retry-output.txt"
wait_for "shard-healthy  *running" 20 || true; capture 2-after-retry
wait_for "coldstart approve" 60 || true; sleep 2; capture 3-awaiting-approval
cs approve shard-7 open-to-players --as bob -m "checked the shard dashboard, looks good" | tee "$OUT/approve-output.txt"
wait_for "\[exit" 60 || true; sleep 1; capture 4-end
echo "captures in $OUT"
