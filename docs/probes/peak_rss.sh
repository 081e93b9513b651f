#!/usr/bin/env bash
# Run a command and sample the resident memory of it and its children every 2 s; print the
# largest sample (MB) at the end. The probe behind docs/RESULTS.md's oneDNN cache table
# (2026-11-27), e.g.:
#   bash docs/probes/peak_rss.sh bash data-prep/train-drafter.sh data-bin/demo-multi30k verifier.pt \
#     --lr 1e-3 --warmup-updates 100 --drafter-cuts 2 --max-update 300 --no-save --disable-validation
set -uo pipefail
"$@" &
pid=$!
peak=0
while kill -0 "$pid" 2>/dev/null; do
  for p in $pid $(pgrep -P "$pid"); do
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null)
    [[ -n "$rss" ]] && (( rss > peak )) && peak=$rss
  done
  sleep 2
done
wait "$pid"
status=$?
echo "peak resident memory: $((peak / 1024)) MB" >&2
exit "$status"
