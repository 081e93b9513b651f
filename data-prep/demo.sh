#!/usr/bin/env bash
# The whole pipeline on Multi30k EN-DE: data, verifier, distillation, drafter, benchmark.
# `make demo` runs it; run with --help for the stages and the environment variables.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DATA="$CMASD_ROOT/data-bin/demo-multi30k"
DISTILLED="$CMASD_ROOT/data-bin/demo-multi30k-distill"
OUT="$CMASD_ROOT/checkpoints/demo"
LOGS="$OUT/logs"
STAGES_TSV="$OUT/stages.tsv"

usage() {
  cat <<'EOF'
Usage: bash data-prep/demo.sh      (or: make demo)

Five stages, each skipped when already done, so that a rerun resumes where the last one
stopped (paths relative to the repository root):
  1 data      data-prep/prepare-multi30k.sh -> data-bin/demo-multi30k (with VERIFIER set:
              the verifier's own spm.model and dict.txt, found beside it)
  2 verifier  VERIFIER if set; else data-prep/train-verifier.sh DATA compact, time-bounded
              -> checkpoints/demo/verifier/checkpoint_best.pt
  3 distill   data-prep/distill.sh: the verifier's greedy translations of the training
              sources, at most 1.5 x source length + 10 tokens (--max-len-a 1.5
              --max-len-b 10: fairseq's default of 200 lets one degenerate sentence hold
              its whole batch for 200 steps) -> data-bin/demo-multi30k-distill
  4 drafter   data-prep/train-drafter.sh on the distilled data, time-bounded, with a
              schedule for short runs (--lr 1e-3 --warmup-updates 100 --drafter-cuts 2:
              the recipe's 1,000 warm-up updates are about an hour on 2 CPU cores)
              -> checkpoints/demo/drafter/checkpoint_best.pt
  5 bench     cmasd-bench on the test split, default configurations -> checkpoints/demo/
              bench.md, bench.json, latency-throughput.png; the table is printed at the end

Environment:
  VERIFIER              a trained verifier checkpoint (.pt) with its spm.model and dict.txt
                        in the same directory, e.g. the shared compact Multi30k verifier
                        (default: train one in stage 2)
  DEMO_VERIFIER_HOURS   fairseq-train --stop-time-hours of the verifier (default 1.0)
  DEMO_DRAFTER_HOURS    fairseq-train --stop-time-hours of the drafter (default 1.0)
  DEMO_DRAFTER_UPDATES  fairseq-train --max-update of the drafter (default 30000)
  DEMO_BATCH_SIZES      cmasd-bench --batch-sizes (default 1,16)
  DEMO_REPEATS          cmasd-bench --repeats (default 2)
  DEMO_MAX_SENTENCES    cmasd-bench --max-sentences (default: the whole test split)
  CMASD_DATA_MIRROR     local mirror of the data (see prepare-multi30k.sh --help); default:
                        the shared/data folder beside the repository when it holds multi30k/
  CMASD_PYTHON          python with fairseq (default .venv/bin/python)

Skipping: data and distill are idempotent scripts; verifier: its checkpoint and the marker
checkpoints/demo/.verifier-done; drafter: its checkpoint and checkpoints/demo/.drafter-done
(which names the verifier it was trained for); bench: bench.json newer than the drafter.
Delete a marker (or bench.json) to redo its stage; a training stage then resumes from its
checkpoint_last.pt, and its time bound counts the hours already trained.
Each stage's output is also kept in checkpoints/demo/logs/STAGE.log (a skipped stage leaves
the log of the run that did the work; a stage that runs again keeps its previous log as
STAGE.log.1), and
checkpoints/demo/stages.tsv gets a row per stage and run: run start, stage, seconds,
ran|skipped|failed|interrupted.
EOF
}

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  "") ;;
  *) usage >&2; die "unexpected argument: $1 (the demo is set through environment variables)" ;;
esac

# ------------------------------------------------------------------ settings, checked up front

VERIFIER_HOURS="${DEMO_VERIFIER_HOURS:-1.0}"
DRAFTER_HOURS="${DEMO_DRAFTER_HOURS:-1.0}"
DRAFTER_UPDATES="${DEMO_DRAFTER_UPDATES:-30000}"
BATCH_SIZES="${DEMO_BATCH_SIZES:-1,16}"
REPEATS="${DEMO_REPEATS:-2}"
MAX_SENTENCES="${DEMO_MAX_SENTENCES:-}"

for setting in "DEMO_VERIFIER_HOURS=$VERIFIER_HOURS" "DEMO_DRAFTER_HOURS=$DRAFTER_HOURS"; do
  if ! [[ "${setting#*=}" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] || [[ "${setting#*=}" =~ ^[0.]+$ ]]; then
    die "bad $setting: expected a positive number of hours"
  fi
done
for setting in "DEMO_DRAFTER_UPDATES=$DRAFTER_UPDATES" "DEMO_REPEATS=$REPEATS" \
  ${MAX_SENTENCES:+"DEMO_MAX_SENTENCES=$MAX_SENTENCES"}; do
  [[ "${setting#*=}" =~ ^[1-9][0-9]*$ ]] || die "bad $setting: expected a positive integer"
done
[[ "$BATCH_SIZES" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] \
  || die "bad DEMO_BATCH_SIZES=$BATCH_SIZES: expected positive integers separated by commas, e.g. 1,16"

if [[ -z "${CMASD_DATA_MIRROR:-}" && -d "$CMASD_ROOT/../shared/data/multi30k" ]]; then
  CMASD_DATA_MIRROR="$(cd "$CMASD_ROOT/../shared/data" && pwd)"
  export CMASD_DATA_MIRROR
fi

SPM_MODEL=""
DICT_FILE=""
if [[ -n "${VERIFIER:-}" ]]; then
  [[ -f "$VERIFIER" ]] || die "VERIFIER=$VERIFIER: file not found (unset VERIFIER to train one)"
  VERIFIER="$(abs_path "$VERIFIER")"
  SPM_MODEL="$(dirname "$VERIFIER")/spm.model"
  DICT_FILE="$(dirname "$VERIFIER")/dict.txt"
  [[ -f "$SPM_MODEL" && -f "$DICT_FILE" ]] \
    || die "VERIFIER=$VERIFIER: expected its vocabulary beside it, $SPM_MODEL and $DICT_FILE" \
      "(the sentencepiece model and fairseq dictionary it was trained with)"
  VERIFIER_PT="$VERIFIER"
else
  VERIFIER_PT="$OUT/verifier/checkpoint_best.pt"
fi
DRAFTER_PT="$OUT/drafter/checkpoint_best.pt"

# ------------------------------------------------------------------ stage bookkeeping

mkdir -p "$LOGS"
[[ -f "$STAGES_TSV" ]] || printf 'run_started\tstage\tseconds\tstatus\n' > "$STAGES_TSV"
RUN_STARTED="$(date '+%Y-%m-%dT%H:%M:%S')"
STAGE=""
STAGE_START=0

# stage_begin NAME MESSAGE: the one log line of a stage, and its clock.
stage_begin() {
  STAGE="$1"
  STAGE_START="$SECONDS"
  # a run killed outright (no exit trap) leaves its .log.new: keep it as that run's log
  if [[ -f "$LOGS/$1.log.new" ]]; then
    if [[ -f "$LOGS/$1.log" ]]; then mv -f "$LOGS/$1.log" "$LOGS/$1.log.1"; fi
    mv -f "$LOGS/$1.log.new" "$LOGS/$1.log"
  fi
  log "stage $1: $2"
}

# stage_end ran|skipped|failed|interrupted: the stage's row in stages.tsv, and its log kept:
# this run's output becomes LOGS/<stage>.log (the previous one LOGS/<stage>.log.1) unless the
# stage was skipped, which leaves the log of the run that did the work
stage_end() {
  printf '%s\t%s\t%s\t%s\n' "$RUN_STARTED" "$STAGE" "$((SECONDS - STAGE_START))" "$1" >> "$STAGES_TSV"
  local new="$LOGS/$STAGE.log.new" kept="$LOGS/$STAGE.log"
  if [[ -f "$new" ]]; then
    if [[ "$1" == skipped && -f "$kept" ]]; then
      rm -f "$new"
    else
      if [[ -f "$kept" ]]; then mv -f "$kept" "$kept.1"; fi
      mv -f "$new" "$kept"
    fi
  fi
  STAGE=""
}

# on exit during a stage (an error, or Ctrl-C): its row says "failed" or "interrupted"
INTERRUPTED=""
on_exit() {
  local status=$? stage="$STAGE"
  if [[ -n "$stage" ]]; then
    if [[ -n "$INTERRUPTED" ]]; then
      stage_end interrupted
      log "stage $stage interrupted"
    else
      stage_end failed
      log "stage $stage failed (exit status $status)"
    fi
    if [[ -f "$LOGS/$stage.log" ]]; then log "its output is also in $LOGS/$stage.log"; fi
  fi
}
trap on_exit EXIT
trap 'INTERRUPTED=1; exit 130' INT
trap 'INTERRUPTED=1; exit 143' TERM

# logged CMD...: CMD, its stdout and stderr shown and written to LOGS/<current stage>.log.new
# (stage_end keeps it)
logged() {
  "$@" 2>&1 | tee "$LOGS/$STAGE.log.new"
}

# ------------------------------------------------------------------ 1 data

stage_begin data "Multi30k EN-DE -> $DATA${CMASD_DATA_MIRROR:+ (from the mirror $CMASD_DATA_MIRROR)}"
if [[ -n "$SPM_MODEL" ]]; then
  logged bash "$CMASD_ROOT/data-prep/prepare-multi30k.sh" --dest "$DATA" \
    --spm-model "$SPM_MODEL" --dict "$DICT_FILE"
else
  logged bash "$CMASD_ROOT/data-prep/prepare-multi30k.sh" --dest "$DATA"
fi
# the recipe announces every step it runs with "step: NAME"
if grep -q '^\[cmasd prep\] step: ' "$LOGS/data.log.new"; then stage_end ran; else stage_end skipped; fi

# ------------------------------------------------------------------ 2 verifier

if [[ -n "${VERIFIER:-}" ]]; then
  stage_begin verifier "using VERIFIER=$VERIFIER_PT"
  stage_end skipped
elif [[ -f "$VERIFIER_PT" && -f "$OUT/.verifier-done" ]]; then
  stage_begin verifier "skip: $VERIFIER_PT (done)"
  stage_end skipped
else
  stage_begin verifier "training a compact verifier for at most $VERIFIER_HOURS h -> $OUT/verifier"
  rm -f "$OUT/.verifier-done"
  logged bash "$CMASD_ROOT/data-prep/train-verifier.sh" "$DATA" compact \
    --save-dir "$OUT/verifier" --stop-time-hours "$VERIFIER_HOURS" --no-epoch-checkpoints
  [[ -f "$VERIFIER_PT" ]] || die "training ended without $VERIFIER_PT (see $LOGS/verifier.log)"
  touch "$OUT/.verifier-done"
  stage_end ran
fi

# ------------------------------------------------------------------ 3 distill

stage_begin distill "the verifier's translations of the training sources -> $DISTILLED"
logged bash "$CMASD_ROOT/data-prep/distill.sh" "$DATA" "$VERIFIER_PT" --dest "$DISTILLED" \
  -- --max-len-a 1.5 --max-len-b 10
# distill.sh checks the verifier's checksum and its options itself
if grep -q '^\[cmasd prep\] skip: binarize (done)' "$LOGS/distill.log.new"; then stage_end skipped; else stage_end ran; fi

# ------------------------------------------------------------------ 4 drafter

# The marker names the verifier (path and checksum) the drafter was trained for.
DRAFTER_FOR="$VERIFIER_PT $(file_id "$VERIFIER_PT")"
if [[ -f "$DRAFTER_PT" && -f "$OUT/.drafter-done" ]]; then
  if [[ "$(cat "$OUT/.drafter-done")" != "$DRAFTER_FOR" ]]; then
    stage_begin drafter "$DRAFTER_PT is for another verifier"
    die "$OUT/drafter was trained for another verifier ($(cat "$OUT/.drafter-done")," \
      "now $DRAFTER_FOR): remove $OUT/drafter and $OUT/.drafter-done to train a new one"
  fi
  stage_begin drafter "skip: $DRAFTER_PT (done)"
  stage_end skipped
else
  stage_begin drafter "training the drafter for at most $DRAFTER_HOURS h or $DRAFTER_UPDATES updates -> $OUT/drafter"
  rm -f "$OUT/.drafter-done"
  logged bash "$CMASD_ROOT/data-prep/train-drafter.sh" "$DISTILLED" "$VERIFIER_PT" \
    --lr 1e-3 --warmup-updates 100 --drafter-cuts 2 --save-dir "$OUT/drafter" --stop-time-hours "$DRAFTER_HOURS" --max-update "$DRAFTER_UPDATES" \
    --no-epoch-checkpoints
  [[ -f "$DRAFTER_PT" ]] || die "training ended without $DRAFTER_PT (see $LOGS/drafter.log)"
  printf '%s\n' "$DRAFTER_FOR" > "$OUT/.drafter-done"
  stage_end ran
fi

# ------------------------------------------------------------------ 5 bench

if [[ -f "$OUT/bench.json" && "$OUT/bench.json" -nt "$DRAFTER_PT" ]]; then
  stage_begin bench "skip: $OUT/bench.json (newer than the drafter)"
  stage_end skipped
else
  stage_begin bench "cmasd-bench on the test split, batch sizes $BATCH_SIZES, $REPEATS repeats -> $OUT"
  rm -f "$OUT/bench.json"
  logged env PYTHONPATH="$CMASD_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m cmasd.tools.bench "$DATA" \
    --path "$VERIFIER_PT" --drafter-path "$DRAFTER_PT" --gen-subset test \
    --batch-sizes "$BATCH_SIZES" --repeats "$REPEATS" \
    ${MAX_SENTENCES:+--max-sentences "$MAX_SENTENCES"} --out-dir "$OUT"
  [[ -f "$OUT/bench.json" ]] || die "cmasd-bench wrote no $OUT/bench.json (see $LOGS/bench.log)"
  stage_end ran
fi

log "done. Stage times: $STAGES_TSV; logs: $LOGS/"
log "  verifier  $VERIFIER_PT"
log "  drafter   $DRAFTER_PT"
log "  results   $OUT/bench.md, $OUT/bench.json, $OUT/latency-throughput.png"
if [[ -f "$OUT/bench.md" ]]; then cat "$OUT/bench.md"; fi
