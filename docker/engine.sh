#!/usr/bin/env bash
# Make sure a Docker engine answers; start dockerd in the background when none does.
# Usage: source docker/engine.sh; engine_up LOGFILE || skip; ...; engine_down
# engine_down stops only a dockerd this script started (by its PID).
BI_DOCKERD_PID=""
engine_up() {
  local log=${1:-/tmp/bi-dockerd.log}
  if docker info >/dev/null 2>&1; then
    return 0
  fi
  command -v dockerd >/dev/null 2>&1 || {
    echo "no dockerd on PATH"
    return 1
  }
  [ "$(id -u)" -eq 0 ] || {
    echo "dockerd needs root and no Docker engine is running"
    return 1
  }
  dockerd >"$log" 2>&1 &
  BI_DOCKERD_PID=$!
  for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
      return 0
    fi
    if ! kill -0 "$BI_DOCKERD_PID" 2>/dev/null; then
      echo "dockerd exited: $(tail -n 3 "$log" | tr '\n' ' ')"
      BI_DOCKERD_PID=""
      return 1
    fi
    sleep 1
  done
  echo "dockerd did not answer within 60 s (log: $log)"
  return 1
}
engine_down() {
  if [ -n "$BI_DOCKERD_PID" ]; then
    kill "$BI_DOCKERD_PID" 2>/dev/null || true
    wait "$BI_DOCKERD_PID" 2>/dev/null || true
    BI_DOCKERD_PID=""
  fi
}
