# shellcheck shell=bash
# Runs a long command with its output in LOG, printing every PROGRESS_EVERY seconds (30) how
# long it has run and the log's last line, so a first `make test` is never 10 silent minutes.
with_progress() {
  local log="$1" started=$SECONDS pid status
  shift
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq "${PROGRESS_EVERY:-30}"); do kill -0 "$pid" 2>/dev/null && sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
      local elapsed=$((SECONDS - started))
      printf '  still compiling llama.cpp: %dm%02ds — %s\n' $((elapsed / 60)) $((elapsed % 60)) \
        "$(tail -n 1 "$log" | cut -c1-100)"
    fi
  done
  status=0
  wait "$pid" || status=$?
  if [ "$status" -ne 0 ]; then
    echo "llama.cpp build failed (exit $status); last lines of $log:" >&2
    tail -n 30 "$log" >&2
  fi
  return "$status"
}
