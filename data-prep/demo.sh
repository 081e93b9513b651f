#!/usr/bin/env bash
# The whole pipeline on Multi30k EN-DE: data, verifier, distillation, drafter, benchmark, trace.
# `make demo` runs it; run with --help for the stages and the environment variables.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DATA="$CMASD_ROOT/data-bin/demo-multi30k"
DISTILLED="$CMASD_ROOT/data-bin/demo-multi30k-distill"
OUT="$(abs_path "${DEMO_OUT:-$CMASD_ROOT/checkpoints/demo}")"
LOGS="$OUT/logs"
STAGES_TSV="$OUT/stages.tsv"
STAGES_HEADER="run_started	stage	seconds	status	peak_rss_mb"

usage() {
  cat <<'EOF'
Usage: bash data-prep/demo.sh [--plan]      (or: make demo)

Seven stages, each skipped when already done, so that a rerun resumes where the last one
stopped (paths relative to the repository root):
  1 data      data-prep/prepare-multi30k.sh -> data-bin/demo-multi30k (with VERIFIER set:
              the verifier's own spm.model and dict.txt, found beside it)
  2 verifier  VERIFIER if set; else data-prep/train-verifier.sh DATA compact-short (short
              profile) or compact (full), time-bounded -> checkpoints/demo/verifier/checkpoint_best.pt
  3 distill   data-prep/distill.sh: the verifier's greedy translations of the training
              sources, at most 1.5 x source length + 10 tokens (--max-len-a 1.5
              --max-len-b 10: fairseq's default of 200 lets one degenerate sentence hold
              its whole batch for 200 steps) -> data-bin/demo-multi30k-distill
  4 drafter   data-prep/train-drafter.sh on the distilled data, time-bounded, with a
              schedule for short runs (--lr 1e-3 --warmup-updates 100 --drafter-cuts 2:
              the recipe's 1,000 warm-up updates are about an hour on 2 CPU cores) and,
              in the short profile, a block of 8 mask slots (--block-size 8: the most its
              rows send; the full profile keeps the paper's 25 for its k = 10 and 25 rows)
              -> checkpoints/demo/drafter/checkpoint_best.pt
  5 draft-model
              data-prep/train-ar-drafter.sh on the distilled data, time-bounded: the
              1-layer autoregressive draft model (it learns in minutes what the Spec-Drafter
              learns in hours), and the distilled targets' piece counts for its 2,000-piece
              shortlist (cmasd-prep piece-counts) -> checkpoints/demo/draft-model/
  6 bench     cmasd-bench on the test split -> checkpoints/demo/bench.md, bench.json,
              latency-throughput.png; the table is printed at the end
  7 trace     cmasd-trace on a few test sentences: each iteration's drafts, which were
              accepted and where the verifier corrected -> checkpoints/demo/trace.html
              and trace.ansi (the terminal's picture, printed at the end)

Profiles (DEMO_PROFILE):
  short (default)  under an hour on 2 CPU cores, setup included (--plan prints the estimate of
                   each stage): a 24-minute verifier (compact-short: bfloat16 autocast where the
                   CPU has it), a 12-minute drafter of 8 slots, a 7-minute draft model, a bench of 9
                   configurations on 300 test sentences at batch 1 and 16, one recorded pass
  full             about 3.5 hours: a one-hour verifier (compact), a one-hour drafter of 25
                   slots, a half-hour draft model,
                   cmasd-bench's default configurations on the whole test split, 2 passes

Environment (each wins over the profile):
  VERIFIER              a trained verifier checkpoint (.pt) with its spm.model and dict.txt
                        in the same directory, e.g. the shared compact Multi30k verifier
                        (default: train one in stage 2)
  DEMO_DATA             a data-bin to use instead of preparing Multi30k (train, valid and test
                        splits; dict.txt, spm.model and raw/test.* beside them)
  DEMO_OUT              where checkpoints, results and logs go (default checkpoints/demo)
  DEMO_VERIFIER_HOURS   fairseq-train --stop-time-hours of the verifier (short 0.4, full 1.0)
  DEMO_DRAFTER_HOURS    fairseq-train --stop-time-hours of the drafter (short 0.2, full 1.0)
  DEMO_DRAFTER_UPDATES  fairseq-train --max-update of the drafter (default 30000)
  DEMO_DRAFT_MODEL_HOURS
                        fairseq-train --stop-time-hours of the draft model (short 0.12, full 0.5)
  DEMO_VERIFIER_ARGS, DEMO_DRAFTER_ARGS, DEMO_DRAFT_MODEL_ARGS
                        more fairseq-train options for the verifier, the drafter and the draft
                        model (split at spaces; they win over the recipe's)
  DEMO_BATCH_SIZES      cmasd-bench --batch-sizes (default 1,16)
  DEMO_REPEATS          cmasd-bench --repeats (short 1, full 2)
  DEMO_MAX_SENTENCES    cmasd-bench --max-sentences (short 300; full: the whole test split)
  DEMO_CONFIGS          cmasd-bench --configs (short: beam5,greedy,ct2-greedy,ct2-greedy-1t,
                        loop-greedy,specdec-k5-exact-sl2000-bf16,cmasd-k8-sl2000-bf16,
                        ar-g4-exact-sl2000-bf16,goodput-ar-sl2000-bf16; full: cmasd-bench's
                        default and those two)
  DEMO_TRACE_SENTENCES  test sentences cmasd-trace shows (default 3)
  CMASD_DATA_MIRROR     local mirror of the data (see prepare-multi30k.sh --help); default:
                        the shared/data folder beside the repository when it holds multi30k/
  CMASD_PYTHON          python with fairseq (default .venv/bin/python)
  CMASD_LOW_MEMORY=1    glibc's malloc returns freed memory (data-prep/common.sh): over 150
                        updates of the drafter, 1.7 GB peak instead of 3.8, at two thirds
                        of the updates per second

Skipping: data and distill are idempotent scripts; verifier: its checkpoint and the marker
checkpoints/demo/.verifier-done; drafter: its checkpoint and checkpoints/demo/.drafter-done
(which names the verifier it was trained for); draft-model: the same with
checkpoints/demo/.draft-model-done; bench: bench.json newer than both drafters;
trace: trace.html newer than bench.json. Delete a marker (or bench.json) to redo its stage;
a training stage then resumes from its checkpoint_last.pt, and its time bound counts the
hours already trained.
The terminal shows one line per training epoch (updates, losses, time left) and a
progress bar while distilling and benchmarking; each stage's whole output is kept in
checkpoints/demo/logs/STAGE.log (a skipped stage leaves the log of the run that did the
work; a stage that runs again keeps its previous log as STAGE.log.1), and
checkpoints/demo/stages.tsv gets a row per stage and run: run start, stage, seconds,
ran|skipped|failed|interrupted, and the peak resident memory of the stage's largest
process in MB.
EOF
}

PLAN_ONLY=0
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --plan) PLAN_ONLY=1 ;;
  "") ;;
  *) usage >&2; die "unexpected argument: $1 (the demo is set through environment variables)" ;;
esac

# ------------------------------------------------------------------ settings, checked up front

PROFILE="${DEMO_PROFILE:-short}"
# the rows of the draft model: lossless, its 2,000-piece shortlist on bfloat16 weights, gamma 4
# and the cost-aware controller (cmasd-bench --configs help); the short profile's drafters draft
# the same way, among the 2,000 pieces on bfloat16 weights: the cheapest drafts on a CPU
# (docs/results/demo.md, docs/results/speculation-pays.md's thirty-fifth session: goodput on
# bfloat16 weights 1.04-1.11x its float32 row at batch 1, paired; where the C++ kernels cannot
# run, the bench skips those rows and says so)
DRAFT_MODEL_ROWS="ar-g4-exact-sl2000-bf16,goodput-ar-sl2000-bf16"
case "$PROFILE" in
  # verifier hours, drafter hours, repeats, sentences, configurations, verifier recipe,
  # draft model hours, the drafter's block (its mask slots: the most tokens a pass drafts; 8
  # trains about twice the updates of 25 in the same minutes, docs/results/demo.md)
  short) DEFAULTS=(0.4 0.2 1 300 "beam5,greedy,ct2-greedy,ct2-greedy-1t,loop-greedy,specdec-k5-exact-sl2000-bf16,cmasd-k8-sl2000-bf16,$DRAFT_MODEL_ROWS" compact-short 0.12 8) ;;
  full) DEFAULTS=(1.0 1.0 2 "" "+$DRAFT_MODEL_ROWS" compact 0.5 25) ;;  # + : after the bench's defaults
  *) die "bad DEMO_PROFILE=$PROFILE: expected short or full" ;;
esac
VERIFIER_HOURS="${DEMO_VERIFIER_HOURS:-${DEFAULTS[0]}}"
DRAFTER_HOURS="${DEMO_DRAFTER_HOURS:-${DEFAULTS[1]}}"
DRAFTER_UPDATES="${DEMO_DRAFTER_UPDATES:-30000}"
DRAFT_MODEL_HOURS="${DEMO_DRAFT_MODEL_HOURS:-${DEFAULTS[6]}}"
DRAFTER_BLOCK="${DEFAULTS[7]}"
BATCH_SIZES="${DEMO_BATCH_SIZES:-1,16}"
REPEATS="${DEMO_REPEATS:-${DEFAULTS[2]}}"
MAX_SENTENCES="${DEMO_MAX_SENTENCES:-${DEFAULTS[3]}}"
CONFIGS="${DEMO_CONFIGS:-${DEFAULTS[4]}}"
VERIFIER_SIZE="${DEFAULTS[5]}"
TRACE_SENTENCES="${DEMO_TRACE_SENTENCES:-3}"
VERIFIER_ARGS=()
DRAFTER_ARGS=()
DRAFT_MODEL_ARGS=()
read -r -a VERIFIER_ARGS <<< "${DEMO_VERIFIER_ARGS:-}"
read -r -a DRAFTER_ARGS <<< "${DEMO_DRAFTER_ARGS:-}"
read -r -a DRAFT_MODEL_ARGS <<< "${DEMO_DRAFT_MODEL_ARGS:-}"

for setting in "DEMO_VERIFIER_HOURS=$VERIFIER_HOURS" "DEMO_DRAFTER_HOURS=$DRAFTER_HOURS" \
  "DEMO_DRAFT_MODEL_HOURS=$DRAFT_MODEL_HOURS"; do
  if ! [[ "${setting#*=}" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] || [[ "${setting#*=}" =~ ^[0.]+$ ]]; then
    die "bad $setting: expected a positive number of hours"
  fi
done
for setting in "DEMO_DRAFTER_UPDATES=$DRAFTER_UPDATES" "DEMO_REPEATS=$REPEATS" \
  "DEMO_TRACE_SENTENCES=$TRACE_SENTENCES" ${MAX_SENTENCES:+"DEMO_MAX_SENTENCES=$MAX_SENTENCES"}; do
  [[ "${setting#*=}" =~ ^[1-9][0-9]*$ ]] || die "bad $setting: expected a positive integer"
done
[[ "$BATCH_SIZES" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] \
  || die "bad DEMO_BATCH_SIZES=$BATCH_SIZES: expected positive integers separated by commas, e.g. 1,16"

if [[ -z "${CMASD_DATA_MIRROR:-}" && -d "$CMASD_ROOT/../shared/data/multi30k" ]]; then
  CMASD_DATA_MIRROR="$(cd "$CMASD_ROOT/../shared/data" && pwd)"
  export CMASD_DATA_MIRROR
fi

if [[ -n "${DEMO_DATA:-}" ]]; then
  [[ -d "$DEMO_DATA" ]] || die "DEMO_DATA=$DEMO_DATA: no such directory"
  DATA="$(abs_path "$DEMO_DATA")"
  DATA="${DATA%/}"
  for file in dict.txt spm.model raw/test.en; do
    [[ -f "$DATA/$file" ]] || die "DEMO_DATA=$DATA: expected $file in it (see --help)"
  done
  DISTILLED="$DATA-distill"
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
DRAFT_MODEL_PT="$OUT/draft-model/checkpoint_best.pt"
PIECE_COUNTS="$OUT/draft-model/piece-counts.txt"

# ------------------------------------------------------------------ the plan

# Minutes of each stage on a 2-core machine (measured: docs/RESULTS.md, "make demo"); the
# training stages are bounded by their hours (plus their last validation and save).
STAGES=(data verifier distill drafter draft-model bench trace)
declare -A ESTIMATE=([data]=2 [distill]=5 [trace]=1)
ESTIMATE[verifier]="$(awk -v h="$VERIFIER_HOURS" 'BEGIN { printf "%.0f", h * 60 + 1 }')"
ESTIMATE[drafter]="$(awk -v h="$DRAFTER_HOURS" 'BEGIN { printf "%.0f", h * 60 + 1 }')"
ESTIMATE[draft-model]="$(awk -v h="$DRAFT_MODEL_HOURS" 'BEGIN { printf "%.0f", h * 60 + 1 }')"
if [[ "$PROFILE" == short ]]; then ESTIMATE[bench]=8; else ESTIMATE[bench]=50; fi
[[ -z "${DEMO_DATA:-}" ]] || ESTIMATE[data]=0
[[ -z "${VERIFIER:-}" ]] || ESTIMATE[verifier]=0

minutes_from() {  # minutes_from STAGE: the estimates of STAGE and the stages after it
  local stage total=0 counting=0
  for stage in "${STAGES[@]}"; do
    [[ "$stage" == "$1" ]] && counting=1
    (( counting )) && total=$(( total + ESTIMATE[$stage] ))
  done
  printf '%s' "$total"
}

plan() {
  local stage line=""
  for stage in "${STAGES[@]}"; do line+=" $stage ${ESTIMATE[$stage]},"; done
  printf 'about %s minutes on 2 CPU cores (profile %s; minutes per stage:%s)' \
    "$(minutes_from data)" "$PROFILE" "${line%,}"
}

if (( PLAN_ONLY )); then
  log "make demo: setting up .venv (about 2 minutes, once), then $(plan)"
  exit 0
fi

# ------------------------------------------------------------------ stage bookkeeping

mkdir -p "$LOGS"
if [[ -f "$STAGES_TSV" && "$(head -n1 "$STAGES_TSV")" != "$STAGES_HEADER" ]]; then
  mv -f "$STAGES_TSV" "$STAGES_TSV.old"  # an older layout
fi
[[ -f "$STAGES_TSV" ]] || printf '%s\n' "$STAGES_HEADER" > "$STAGES_TSV"
RUN_STARTED="$(date '+%Y-%m-%dT%H:%M:%S')"
STAGE=""
STAGE_START=0
PEAK_FILE="$LOGS/.peak-rss"

# stage_begin NAME MESSAGE: the one log line of a stage, and its clock.
stage_begin() {
  STAGE="$1"
  STAGE_START="$SECONDS"
  rm -f "$PEAK_FILE"
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
  local seconds=$((SECONDS - STAGE_START)) peak="n/a"
  [[ -f "$PEAK_FILE" ]] && peak="$(cat "$PEAK_FILE")"
  printf '%s\t%s\t%s\t%s\t%s\n' "$RUN_STARTED" "$STAGE" "$seconds" "$1" "$peak" >> "$STAGES_TSV"
  local new="$LOGS/$STAGE.log.new" kept="$LOGS/$STAGE.log"
  if [[ -f "$new" ]]; then
    if [[ "$1" == skipped && -f "$kept" ]]; then
      rm -f "$new"
    else
      if [[ -f "$kept" ]]; then mv -f "$kept" "$kept.1"; fi
      mv -f "$new" "$kept"
    fi
  fi
  if [[ "$1" == ran ]]; then
    log "stage $STAGE: $(awk -v s="$seconds" 'BEGIN { printf "%.1f", s / 60 }') minutes (planned" \
      "${ESTIMATE[$STAGE]}), peak memory $peak MB"
  fi
  ESTIMATE[$STAGE]=0
  local next="" stage
  for stage in "${STAGES[@]}"; do (( ESTIMATE[$stage] > 0 )) && { next="$stage"; break; }; done
  [[ -z "$next" ]] || log "about $(minutes_from "$next") minutes to go"
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
    if [[ -f "$LOGS/$stage.log" ]]; then
      log "the end of its output ($LOGS/$stage.log):"
      tail -n 15 "$LOGS/$stage.log" >&2
    fi
  fi
}
trap on_exit EXIT
trap 'INTERRUPTED=1; exit 130' INT
trap 'INTERRUPTED=1; exit 143' TERM

export PYTHONPATH="$CMASD_ROOT${PYTHONPATH:+:$PYTHONPATH}"
PROGRESS=("$PY" -m cmasd.tools.progress)

# measured CMD...: CMD, with the peak memory of its largest process kept for stage_end
measured() {
  "${PROGRESS[@]}" run --peak-file "$PEAK_FILE" -- "$@"
}

# logged CMD...: CMD (measured), its stdout and stderr written to LOGS/<current stage>.log.new
# (stage_end keeps it); shown: cmasd's own lines and progress bars (fairseq's log stays in the file)
SHOWN='^\[cmasd prep\]|\] [0-9,]+/[0-9,]+ \(|\| cmasd\.'
logged() {
  measured "$@" 2>&1 | tee -a "$LOGS/$STAGE.log.new" | { grep --line-buffered -E "$SHOWN" || true; }
}

# trained HOURS UPDATES CMD...: a training CMD (measured), its whole output in the stage's
# log and one line per epoch on the terminal
trained() {
  local hours="$1" updates="$2"
  shift 2
  measured "$@" 2>&1 | "${PROGRESS[@]}" train --log "$LOGS/$STAGE.log.new" --hours "$hours" \
    ${updates:+--max-update "$updates"}
}

log "make demo: $(plan)"

# ------------------------------------------------------------------ 1 data

if [[ -n "${DEMO_DATA:-}" ]]; then
  stage_begin data "using DEMO_DATA=$DATA"
  stage_end skipped
else
  stage_begin data "Multi30k EN-DE -> $DATA${CMASD_DATA_MIRROR:+ (from the mirror $CMASD_DATA_MIRROR)}"
  if [[ -n "$SPM_MODEL" ]]; then
    logged bash "$CMASD_ROOT/data-prep/prepare-multi30k.sh" --dest "$DATA" \
      --spm-model "$SPM_MODEL" --dict "$DICT_FILE"
  else
    logged bash "$CMASD_ROOT/data-prep/prepare-multi30k.sh" --dest "$DATA"
  fi
  # the recipe announces every step it runs with "step: NAME"
  if grep -q '^\[cmasd prep\] step: ' "$LOGS/data.log.new"; then stage_end ran; else stage_end skipped; fi
fi

# ------------------------------------------------------------------ 2 verifier

if [[ -n "${VERIFIER:-}" ]]; then
  stage_begin verifier "using VERIFIER=$VERIFIER_PT"
  stage_end skipped
elif [[ -f "$VERIFIER_PT" && -f "$OUT/.verifier-done" ]]; then
  stage_begin verifier "skip: $VERIFIER_PT (done)"
  stage_end skipped
else
  stage_begin verifier "training a $VERIFIER_SIZE verifier for at most $VERIFIER_HOURS h -> $OUT/verifier"
  rm -f "$OUT/.verifier-done"
  trained "$VERIFIER_HOURS" "" bash "$CMASD_ROOT/data-prep/train-verifier.sh" "$DATA" "$VERIFIER_SIZE" \
    --save-dir "$OUT/verifier" --stop-time-hours "$VERIFIER_HOURS" --no-epoch-checkpoints \
    ${VERIFIER_ARGS[@]+"${VERIFIER_ARGS[@]}"}
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
  trained "$DRAFTER_HOURS" "$DRAFTER_UPDATES" bash "$CMASD_ROOT/data-prep/train-drafter.sh" "$DISTILLED" "$VERIFIER_PT" \
    --lr 1e-3 --warmup-updates 100 --drafter-cuts 2 --block-size "$DRAFTER_BLOCK" --save-dir "$OUT/drafter" \
    --stop-time-hours "$DRAFTER_HOURS" \
    --max-update "$DRAFTER_UPDATES" --no-epoch-checkpoints ${DRAFTER_ARGS[@]+"${DRAFTER_ARGS[@]}"}
  [[ -f "$DRAFTER_PT" ]] || die "training ended without $DRAFTER_PT (see $LOGS/drafter.log)"
  printf '%s\n' "$DRAFTER_FOR" > "$OUT/.drafter-done"
  stage_end ran
fi

# ------------------------------------------------------------------ 5 draft model

if [[ -f "$DRAFT_MODEL_PT" && -f "$PIECE_COUNTS" && -f "$OUT/.draft-model-done" ]]; then
  if [[ "$(cat "$OUT/.draft-model-done")" != "$DRAFTER_FOR" ]]; then
    stage_begin draft-model "$DRAFT_MODEL_PT is for another verifier"
    die "$OUT/draft-model was trained for another verifier ($(cat "$OUT/.draft-model-done")," \
      "now $DRAFTER_FOR): remove $OUT/draft-model and $OUT/.draft-model-done to train a new one"
  fi
  stage_begin draft-model "skip: $DRAFT_MODEL_PT (done)"
  stage_end skipped
else
  stage_begin draft-model "training the draft model for at most $DRAFT_MODEL_HOURS h -> $OUT/draft-model"
  rm -f "$OUT/.draft-model-done"
  trained "$DRAFT_MODEL_HOURS" "" bash "$CMASD_ROOT/data-prep/train-ar-drafter.sh" "$DISTILLED" "$VERIFIER_PT" \
    --save-dir "$OUT/draft-model" --stop-time-hours "$DRAFT_MODEL_HOURS" --no-epoch-checkpoints \
    ${DRAFT_MODEL_ARGS[@]+"${DRAFT_MODEL_ARGS[@]}"}
  [[ -f "$DRAFT_MODEL_PT" ]] || die "training ended without $DRAFT_MODEL_PT (see $LOGS/draft-model.log)"
  # the shortlist's order: the distilled training targets' piece counts (train.SRC-TGT.TGT)
  targets=("$DISTILLED"/train.*-*.idx)
  target="" pair="" prefix=""
  for prefix in "${targets[@]}"; do
    prefix="${prefix%.idx}"
    pair="${prefix##*/train.}"
    target="${pair#*.}"
    [[ "${pair%%.*}" == *-"$target" ]] && break
    target=""
  done
  [[ -n "$target" ]] || die "no binarized training targets (train.SRC-TGT.TGT.idx) in $DISTILLED"
  logged "$PY" -m cmasd.tools.prep piece-counts --dict "$DISTILLED/dict.$target.txt" -o "$PIECE_COUNTS" "$prefix"
  printf '%s\n' "$DRAFTER_FOR" > "$OUT/.draft-model-done"
  stage_end ran
fi

# ------------------------------------------------------------------ 6 bench

if [[ -f "$OUT/bench.json" && "$OUT/bench.json" -nt "$DRAFTER_PT" && "$OUT/bench.json" -nt "$DRAFT_MODEL_PT" ]]; then
  stage_begin bench "skip: $OUT/bench.json (newer than both drafters)"
  stage_end skipped
else
  stage_begin bench "cmasd-bench on ${MAX_SENTENCES:-all} test sentences, batch sizes $BATCH_SIZES, $REPEATS repeat(s) -> $OUT"
  rm -f "$OUT/bench.json"
  if [[ "$CONFIGS" == +* ]]; then
    CONFIGS="$("$PY" -c 'from cmasd.tools.bench.configs import DEFAULT_CONFIGS; print(DEFAULT_CONFIGS)'),${CONFIGS#+}"
  fi
  logged "$PY" -m cmasd.tools.bench "$DATA" \
    --path "$VERIFIER_PT" --drafter-path "$DRAFTER_PT" --ar-drafter-path "$DRAFT_MODEL_PT" \
    --set "spec_draft_shortlist_counts=$PIECE_COUNTS" --gen-subset test \
    --batch-sizes "$BATCH_SIZES" --repeats "$REPEATS" ${CONFIGS:+--configs "$CONFIGS"} \
    ${MAX_SENTENCES:+--max-sentences "$MAX_SENTENCES"} --out-dir "$OUT"
  [[ -f "$OUT/bench.json" ]] || die "cmasd-bench wrote no $OUT/bench.json (see $LOGS/bench.log)"
  stage_end ran
fi

# ------------------------------------------------------------------ 7 trace

if [[ -f "$OUT/trace.html" && -f "$OUT/trace.ansi" && "$OUT/trace.html" -nt "$OUT/bench.json" ]]; then
  stage_begin trace "skip: $OUT/trace.html (newer than bench.json)"
  stage_end skipped
else
  stage_begin trace "speculative decoding at work on $TRACE_SENTENCES test sentences -> $OUT/trace.html, $OUT/trace.ansi"
  # lossless SpecDec (k = 5, exact acceptance): every correction is the verifier's own choice;
  # the terminal's picture (ANSI colours) goes to trace.ansi, shown at the end
  measured "$PY" -m cmasd.tools.trace "$DATA" --user-dir "$CMASD_ROOT/fairseq_plugins" \
    --task translation_speculative --path "$VERIFIER_PT" --drafter-path "$DRAFTER_PT" --gen-subset test \
    --beam 1 --spec-k 5 --spec-acceptance exact --trace-sentences "$TRACE_SENTENCES" \
    --trace-html "$OUT/trace.html" --color always > "$OUT/trace.ansi" 2> "$LOGS/trace.log.new"
  [[ -f "$OUT/trace.html" ]] || die "cmasd-trace wrote no $OUT/trace.html (see $LOGS/trace.log)"
  stage_end ran
fi

log "done. Stage times and memory: $STAGES_TSV; logs: $LOGS/"
log "  verifier  $VERIFIER_PT"
log "  drafter   $DRAFTER_PT"
log "  draft model $DRAFT_MODEL_PT (shortlist order: $PIECE_COUNTS)"
log "  results   $OUT/bench.md, $OUT/bench.json, $OUT/latency-throughput.png, $OUT/trace.html, $OUT/trace.ansi"
if [[ -f "$OUT/bench.md" ]]; then cat "$OUT/bench.md"; fi
# the picture, in colour on a terminal (the same in trace.html)
if [[ -t 1 ]]; then
  cat "$OUT/trace.ansi"
else
  log "the picture: $OUT/trace.html (in colour in a terminal: less -R $OUT/trace.ansi)"
fi
