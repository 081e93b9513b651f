#!/usr/bin/env bash
# Seed 000's Table I setting in one call on one GPU: a transformer-base verifier trained on
# Multi30k, its distillation, three drafters, and cmasd-bench at batch 1, 16 and 64.
# Run with --help for the modes, the stages and the options.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: bash data-prep/gpu-run.sh --prepare DIR
       bash data-prep/gpu-run.sh --out DIR [--from DIR] [options]
       bash data-prep/gpu-run.sh --smoke --out DIR [--data DATA-BIN] [options]

--prepare DIR   here, with the internet or a package index: gather into DIR what a bare GPU
                machine with Python 3.12 and a CUDA torch lacks, to carry there:
                  DIR/wheels    ve-fairseq 0.12.3 (cp312) and the dependencies such a
                                machine lacks (hydra-core, omegaconf, antlr4, bitarray, cffi)
                  DIR/multi30k  Multi30k EN-DE binarized (prepare-multi30k.sh, 8,000 pieces;
                                with --data DATA-BIN, a copy of that one instead)
                The folder must stay under 60 MiB (what one carry may hold, less the repo).
--out DIR       run every stage, writing into DIR:
                  stages.tsv    stage, seconds, ran|failed
                  env.txt       the GPU, torch, CUDA, fairseq and the options of the run
                  bench.md      the two benches' tables (batch 16 and 64 on the whole test
                                split, then batch 1 on its first --b1-sentences)
                  bench-b16/, bench-b1/   each bench's bench.md, bench.json and plot
                  logs/         each stage's whole output
                and the checkpoints into --work (default DIR/work).
--smoke         the same stages on the CPU in a few minutes: a 1+1-layer 64-wide "base",
                a few updates of each drafter, 500 training sentences, 8 test sentences,
                outputs of at most 24 tokens in the bench (the barely trained verifier
                would run each one to fairseq's 200)
--bench-only    the setup, data and bench stages alone, on the checkpoints an earlier call
                left in --work (a second call on a machine still warm: other --configs)

Stages:
  setup      when fairseq does not import: pip install --no-index --no-deps FROM/wheels/*.whl
             into WORK/site (on PYTHONPATH for the stages after it)
  data       FROM/multi30k or --data; --train-sentences N re-binarizes the first N training
             (and --valid-sentences M validation) sentences into WORK/data
  verifier   train-verifier.sh DATA base (fp16 on a GPU) with a schedule for minutes:
             --lr 1e-3 --warmup-updates 400 --max-tokens 8192 --dropout 0.3, validated and
             saved once, when --verifier-minutes are up
  distill    distill.sh: the verifier's greedy translations of train and valid
  drafters   at the same time: the Spec-Drafter (train-drafter.sh), the autoregressive draft
             model (train-ar-drafter.sh) and blockwise decoding's heads
             (train-blockwise-heads.sh), each for --drafter-minutes
  bench      cmasd-bench --configs CONFIGS at batch 16 and 64 on the test split, then at
             batch 1 on its first --b1-sentences sentences (fairseq's beam search at batch 1
             is what costs the minutes), with --fp16 / --bf16 as --precision says

Options:
  --from DIR              the prepared folder (default: the repository's .gpu-carry)
  --data DIR              a data-bin to use instead of FROM/multi30k (with dict.txt,
                          spm.model and raw/test.* beside it, as prepare-multi30k.sh writes)
  --work DIR              checkpoints and data made on the way (default: OUT/work)
  --precision P           fp16 (default on a GPU), bf16 or fp32 (the CPU's default): the
                          models' precision while benchmarking
  --verifier-minutes M    default 1.5 (smoke: 20 updates)
  --drafter-minutes M     default 1.0 (smoke: 3 updates each)
  --train-sentences N     default: all (smoke: 500)
  --valid-sentences N     default: all (smoke: 50)
  --b1-sentences N        default 60 (smoke: 4)
  --bench-sentences N     default 400 (smoke: 8)
  --configs LIST          default: beam5,greedy,loop-greedy,blockwise-k10,specdec-k10,
                          specdec-k25,cmasd,specdec-k5-exact,ar-g4-exact,goodput-ar
  -h, --help              this help
Environment: CMASD_PYTHON (python with torch; default .venv/bin/python, else python3).
EOF
}

CONFIGS="beam5,greedy,loop-greedy,blockwise-k10,specdec-k10,specdec-k25,cmasd,specdec-k5-exact,ar-g4-exact,goodput-ar"
PREPARE=""
OUT=""
FROM="$CMASD_ROOT/.gpu-carry"
DATA_ARG=""
WORK=""
PRECISION=""
SMOKE=0
BENCH_ONLY=0
VERIFIER_MINUTES=1.5
DRAFTER_MINUTES=1.0
TRAIN_SENTENCES=""
VALID_SENTENCES=""
B1_SENTENCES=60
BENCH_SENTENCES=400
set_smoke_defaults=()

while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --prepare|--out|--from|--data|--work|--precision|--verifier-minutes|--drafter-minutes| \
    --train-sentences|--valid-sentences|--b1-sentences|--bench-sentences|--configs)
      (( $# >= 2 )) || die "$1 needs a value (see --help)"
      case "$1" in
        --prepare) PREPARE="$2" ;;
        --out) OUT="$2" ;;
        --from) FROM="$2" ;;
        --data) DATA_ARG="$2" ;;
        --work) WORK="$2" ;;
        --precision) PRECISION="$2" ;;
        --verifier-minutes) VERIFIER_MINUTES="$2" ;;
        --drafter-minutes) DRAFTER_MINUTES="$2" ;;
        --train-sentences) TRAIN_SENTENCES="$2"; set_smoke_defaults+=(train) ;;
        --valid-sentences) VALID_SENTENCES="$2"; set_smoke_defaults+=(valid) ;;
        --b1-sentences) B1_SENTENCES="$2"; set_smoke_defaults+=(b1) ;;
        --bench-sentences) BENCH_SENTENCES="$2"; set_smoke_defaults+=(bench) ;;
        --configs) CONFIGS="$2" ;;
      esac
      shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    --bench-only) BENCH_ONLY=1; shift ;;
    *) usage >&2; die "unexpected argument: $1" ;;
  esac
done

given() { [[ " ${set_smoke_defaults[*]-} " == *" $1 "* ]]; }
positive_int() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "bad $1 $2: expected a positive integer"; }
positive_number() {
  [[ "$2" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ && ! "$2" =~ ^[0.]+$ ]] || die "bad $1 $2: expected a positive number"
}

# ------------------------------------------------------------------ --prepare

WHEELS=(ve-fairseq==0.12.3 hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3 cffi==2.1.1 pycparser==2.22)
CARRY_LIMIT_MB=60

prepare() {
  local dir
  dir="$(abs_path "$1")"
  mkdir -p "$dir/wheels"
  log "wheels for Python 3.12 (manylinux x86-64) -> $dir/wheels"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dir/wheels" "${WHEELS[@]}"
  # hydra-core 1.3 needs antlr4-python3-runtime 4.9.*, published as a source archive only
  # (pure Python): built into a wheel here
  "$PY" -m pip wheel --quiet --no-deps -w "$dir/wheels" antlr4-python3-runtime==4.9.3
  rm -rf "$dir/multi30k"
  if [[ -n "$DATA_ARG" ]]; then
    [[ -f "$DATA_ARG/dict.txt" && -f "$DATA_ARG/test.en-de.en.idx" ]] \
      || die "--data $DATA_ARG: not a Multi30k data-bin from prepare-multi30k.sh"
    log "copying $DATA_ARG -> $dir/multi30k"
    mkdir -p "$dir/multi30k"
    cp -r "$DATA_ARG"/. "$dir/multi30k/"
  else
    log "Multi30k EN-DE -> $dir/multi30k"
    bash "$CMASD_ROOT/data-prep/prepare-multi30k.sh" --dest "$dir/multi30k"
  fi
  rm -rf "$dir/multi30k/orig"  # the fetched archives; raw/ and tok/ hold their text
  local mb
  mb="$(du -sm "$dir" | cut -f1)"
  (( mb < CARRY_LIMIT_MB )) || die "$dir holds $mb MiB, over the $CARRY_LIMIT_MB MiB a carry can take"
  log "done: $dir ($mb MiB). On the GPU machine: bash data-prep/gpu-run.sh --from $dir --out OUT"
}

if [[ -n "$PREPARE" ]]; then
  [[ -z "$OUT" ]] || die "--prepare and --out are separate calls"
  prepare "$PREPARE"
  exit 0
fi

# ------------------------------------------------------------------ settings, checked up front

[[ -n "$OUT" ]] || { usage >&2; die "missing --out DIR (or --prepare DIR)"; }
if (( SMOKE )); then
  given train || TRAIN_SENTENCES=500
  given valid || VALID_SENTENCES=50
  given b1 || B1_SENTENCES=4
  given bench || BENCH_SENTENCES=8
fi
case "$PRECISION" in
  ""|fp16|bf16|fp32) ;;
  *) die "bad --precision $PRECISION: expected fp16, bf16 or fp32" ;;
esac
positive_number --verifier-minutes "$VERIFIER_MINUTES"
positive_number --drafter-minutes "$DRAFTER_MINUTES"
positive_int --b1-sentences "$B1_SENTENCES"
for setting in "--train-sentences:$TRAIN_SENTENCES" "--valid-sentences:$VALID_SENTENCES" \
  "--bench-sentences:$BENCH_SENTENCES"; do
  [[ -z "${setting#*:}" ]] || positive_int "${setting%%:*}" "${setting#*:}"
done

OUT="$(abs_path "$OUT")"
WORK="$(abs_path "${WORK:-$OUT/work}")"
TRAINED=(verifier/checkpoint_best.pt drafter/checkpoint_best.pt ar-drafter/checkpoint_best.pt
  blockwise/checkpoint_best.pt)
if (( BENCH_ONLY )); then
  for checkpoint in "${TRAINED[@]}"; do
    [[ -f "$WORK/$checkpoint" ]] || die "--bench-only: no $WORK/$checkpoint (give the --work of a finished call)"
  done
fi
LOGS="$OUT/logs"
mkdir -p "$OUT" "$LOGS" "$WORK"
STAGES_TSV="$OUT/stages.tsv"
printf 'stage\tseconds\tstatus\n' > "$STAGES_TSV"
export PYTHONPATH="$CMASD_ROOT${PYTHONPATH:+:$PYTHONPATH}"

STAGE=""
STAGE_START=0
stage_begin() { STAGE="$1"; STAGE_START="$SECONDS"; log "stage $1: $2"; }
# skipped NAME: with --bench-only, record stage NAME as skipped (true); else false
skipped() {
  (( BENCH_ONLY )) || return 1
  printf '%s\t0\tskipped\n' "$1" >> "$STAGES_TSV"
  log "stage $1: skipped (--bench-only: the checkpoints in $WORK)"
}
stage_end() {
  printf '%s\t%s\t%s\n' "$STAGE" "$((SECONDS - STAGE_START))" "$1" >> "$STAGES_TSV"
  log "stage $STAGE: $1 in $((SECONDS - STAGE_START)) s"
  STAGE=""
}
on_exit() {
  local status=$?
  if [[ -n "$STAGE" ]]; then
    log "stage $STAGE failed (exit status $status); its output: $LOGS/"
    stage_end failed
  fi
}
trap on_exit EXIT

# logged NAME CMD...: CMD with its whole output in LOGS/NAME.log, each line after the
# seconds since the stage began; the end shown if it fails
stamped() { while IFS= read -r line; do printf '%5ss %s\n' "$((SECONDS - STAGE_START))" "$line"; done; }
logged() {
  local name="$1"
  shift
  if ! "$@" 2>&1 | stamped > "$LOGS/$name.log"; then
    log "$name failed; the end of $LOGS/$name.log:"
    tail -n 25 "$LOGS/$name.log" >&2
    return 1
  fi
}

# ------------------------------------------------------------------ setup

stage_begin setup "python, fairseq and the device"
# versions_and_device: what env.txt records of python, torch, fairseq and the device, then
# "torch-device: cuda|cpu"; one interpreter (each start imports torch and fairseq, 3-5 s)
versions_and_device() {
  "$PY" -W ignore - <<'PY'
import platform, torch, fairseq
print(f"python {platform.python_version()}, torch {torch.__version__}, fairseq {fairseq.__version__}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, CUDA {torch.version.cuda}")
else:
    print("device: CPU, " + (platform.processor() or platform.machine()))
print("torch-device: " + ("cuda" if torch.cuda.is_available() else "cpu"))
PY
}
if ! VERSIONS="$(versions_and_device 2>&1)"; then
  [[ -d "$FROM/wheels" ]] || die "fairseq does not import with $PY and there is no $FROM/wheels to install" \
    "(make one with --prepare DIR here, carry it, and give --from DIR)"
  logged setup "$PY" -m pip install --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
    "$FROM"/wheels/*.whl
  # byte-compiled once, on every core, rather than by each of the dozen processes that import it
  logged compile "$PY" -m compileall -q -j 0 "$WORK/site" || log "some files did not compile (not needed)"
  export PYTHONPATH="$PYTHONPATH:$WORK/site"
  VERSIONS="$(versions_and_device 2>&1)" || { printf '%s\n' "$VERSIONS" >&2; die "python, torch or fairseq does not start"; }
fi
VERSIONS="$(printf '%s\n' "$VERSIONS" | grep -v tensorboardX)"
DEVICE="$(printf '%s\n' "$VERSIONS" | sed -n 's/^torch-device: //p')"
[[ "$DEVICE" == cuda || "$DEVICE" == cpu ]] || { printf '%s\n' "$VERSIONS" >&2; die "could not tell the device"; }
if (( SMOKE )) || [[ "$DEVICE" == cpu ]]; then
  PRECISION="${PRECISION:-fp32}"
else
  PRECISION="${PRECISION:-fp16}"
fi
case "$PRECISION" in
  fp16) BENCH_PRECISION=(--fp16) GENERATE_PRECISION=(--fp16) ;;
  bf16) BENCH_PRECISION=(--bf16) GENERATE_PRECISION=(--bf16) ;;
  fp32) BENCH_PRECISION=() GENERATE_PRECISION=() ;;
  *) die "bad --precision $PRECISION: expected fp16, bf16 or fp32" ;;
esac
[[ "$DEVICE" == cuda || "$PRECISION" != fp16 ]] || die "--precision fp16 needs a CUDA GPU (torch sees none)"
{
  printf 'date: %s\nhost: %s\n' "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "$(uname -n)"
  printf '%s\n' "$VERSIONS" | grep -v '^torch-device: '
  grep -m1 'model name' /proc/cpuinfo 2>/dev/null || true
  printf 'precision: %s; smoke: %s; verifier minutes %s, drafter minutes %s; configs %s\n' \
    "$PRECISION" "$SMOKE" "$VERIFIER_MINUTES" "$DRAFTER_MINUTES" "$CONFIGS"
} > "$OUT/env.txt"
cat "$OUT/env.txt" >&2
stage_end ran

# ------------------------------------------------------------------ data

stage_begin data "Multi30k EN-DE"
if [[ -n "$DATA_ARG" ]]; then
  DATA="$(abs_path "$DATA_ARG")"
else
  DATA="$FROM/multi30k"
fi
for file in dict.txt spm.model raw/test.de test.en-de.en.idx; do
  [[ -f "$DATA/$file" ]] || die "$DATA: expected $file in it (a data-bin from prepare-multi30k.sh; see --help)"
done
if [[ -n "$TRAIN_SENTENCES$VALID_SENTENCES" ]]; then
  cut_data="$WORK/data"
  rm -rf "$cut_data"
  mkdir -p "$cut_data/tok" "$cut_data/raw"
  cp "$DATA/dict.txt" "$DATA/spm.model" "$cut_data/"
  cp "$DATA"/raw/test.* "$cut_data/raw/"
  for lang in en de; do
    head -n "${TRAIN_SENTENCES:-999999999}" "$DATA/tok/train.$lang" > "$cut_data/tok/train.$lang"
    head -n "${VALID_SENTENCES:-999999999}" "$DATA/tok/valid.$lang" > "$cut_data/tok/valid.$lang"
    cp "$DATA/tok/test.$lang" "$cut_data/tok/"
  done
  logged data binarize "$cut_data" en de 4 train valid test
  DATA="$cut_data"
fi
stage_end ran

# ------------------------------------------------------------------ verifier

hours() { awk -v m="$1" 'BEGIN { printf "%.5f", m / 60 }'; }
# validated and saved once, at the end; no optimizer state (a base checkpoint is 3x smaller
# without it, and every later stage loads it)
BOUNDED=(--validate-interval 1000 --save-interval 1000 --no-epoch-checkpoints --no-save-optimizer-state)
if (( SMOKE )); then
  TINY=(--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 64 --decoder-embed-dim 64
    --encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128
    --encoder-attention-heads 2 --decoder-attention-heads 2)
  VERIFIER_BOUND=(--max-update 20 --warmup-updates 10 "${TINY[@]}")
  DRAFTER_BOUND=(--max-update 3 --warmup-updates 3)
  SPEC_BATCH=(--max-tokens 2048) AR_BATCH=(--max-tokens 2048)
  # blockwise-k10 needs 10 heads; 25 heads of a 1,024-wide layer are minutes on a CPU
  BLOCKWISE_BATCH=(--max-tokens 1024 --blockwise-k 10 --blockwise-ffn-dim 64)
  BENCH_CAP=(--max-len-b 24)
else
  VERIFIER_BOUND=(--stop-time-hours "$(hours "$VERIFIER_MINUTES")" --warmup-updates 400)
  DRAFTER_BOUND=(--stop-time-hours "$(hours "$DRAFTER_MINUTES")" --warmup-updates 200)
  SPEC_BATCH=(--max-tokens 8192) AR_BATCH=(--max-tokens 8192) BLOCKWISE_BATCH=(--max-tokens 4096)
  BENCH_CAP=()
fi
VERIFIER="$WORK/verifier/checkpoint_best.pt"
DISTILLED="$WORK/distill"
if ! skipped verifier; then
stage_begin verifier "transformer-base -> $WORK/verifier"
rm -rf "$WORK/verifier"
logged verifier bash "$CMASD_ROOT/data-prep/train-verifier.sh" "$DATA" base --save-dir "$WORK/verifier" \
  --lr 1e-3 --max-tokens 8192 --dropout 0.3 --num-workers 2 "${BOUNDED[@]}" "${VERIFIER_BOUND[@]}"
[[ -f "$VERIFIER" ]] || die "training ended without $VERIFIER"
grep -E '\| (valid|train) \|' "$LOGS/verifier.log" | tail -n 2 >&2 || true
stage_end ran
fi

# ------------------------------------------------------------------ distill

if ! skipped distill; then
stage_begin distill "the verifier's greedy translations of train and valid -> $DISTILLED"
rm -rf "$DISTILLED"
DISTILL_PRECISION=()
DISTILL_BATCH=128
if [[ "$DEVICE" == cuda ]]; then DISTILL_PRECISION=(--fp16) DISTILL_BATCH=512; fi
logged distill bash "$CMASD_ROOT/data-prep/distill.sh" "$DATA" "$VERIFIER" --dest "$DISTILLED" --batch-size "$DISTILL_BATCH" \
  -- --max-len-a 1.5 --max-len-b 10 ${DISTILL_PRECISION[@]+"${DISTILL_PRECISION[@]}"}
stage_end ran
fi

# ------------------------------------------------------------------ drafters

if ! skipped drafters; then
stage_begin drafters "Spec-Drafter, draft model and blockwise heads, at the same time"
rm -rf "$WORK/drafter" "$WORK/ar-drafter" "$WORK/blockwise"
COMMON=(--lr 1e-3 --no-epoch-checkpoints --num-workers 1 "${BOUNDED[@]}" "${DRAFTER_BOUND[@]}")
logged drafter bash "$CMASD_ROOT/data-prep/train-drafter.sh" "$DISTILLED" "$VERIFIER" --save-dir "$WORK/drafter" \
  "${SPEC_BATCH[@]}" "${COMMON[@]}" &
spec_pid=$!
logged ar-drafter bash "$CMASD_ROOT/data-prep/train-ar-drafter.sh" "$DISTILLED" "$VERIFIER" \
  --save-dir "$WORK/ar-drafter" "${AR_BATCH[@]}" "${COMMON[@]}" &
ar_pid=$!
logged blockwise bash "$CMASD_ROOT/data-prep/train-blockwise-heads.sh" "$DISTILLED" "$VERIFIER" \
  --save-dir "$WORK/blockwise" "${BLOCKWISE_BATCH[@]}" "${COMMON[@]}" &
blockwise_pid=$!
failed=()
wait "$spec_pid" || failed+=(drafter)
wait "$ar_pid" || failed+=(ar-drafter)
wait "$blockwise_pid" || failed+=(blockwise)
(( ${#failed[@]} == 0 )) || die "drafter training failed: ${failed[*]} (see $LOGS/)"
stage_end ran
fi

# ------------------------------------------------------------------ bench

stage_begin bench "$CONFIGS; batch 16 and 64 on ${BENCH_SENTENCES:-all} test sentences, batch 1 on $B1_SENTENCES"
BENCH=("$PY" -m cmasd.tools.bench "$DATA" --path "$VERIFIER" --gen-subset test
  --drafter-path "$WORK/drafter/checkpoint_best.pt" --ar-drafter-path "$WORK/ar-drafter/checkpoint_best.pt"
  --blockwise-heads-path "$WORK/blockwise/checkpoint_best.pt" --configs "$CONFIGS"
  --repeats 1 --warmup 1 --warmup-batches 2 ${BENCH_PRECISION[@]+"${BENCH_PRECISION[@]}"}
  ${BENCH_CAP[@]+"${BENCH_CAP[@]}"})
logged bench-b16 "${BENCH[@]}" --batch-sizes 16,64 ${BENCH_SENTENCES:+--max-sentences "$BENCH_SENTENCES"} \
  --out-dir "$OUT/bench-b16"
logged bench-b1 "${BENCH[@]}" --batch-sizes 1 --max-sentences "$B1_SENTENCES" --out-dir "$OUT/bench-b1"
{
  printf '## batch 16 and 64, %s test sentences\n\n' "${BENCH_SENTENCES:-all}"
  cat "$OUT/bench-b16/bench.md"
  printf '\n## batch 1, the first %s test sentences\n\n' "$B1_SENTENCES"
  cat "$OUT/bench-b1/bench.md"
  printf '\n%s\n' "$(cat "$OUT/env.txt")"
} > "$OUT/bench.md"
stage_end ran

log "done: $OUT/bench.md ($OUT/stages.tsv, $OUT/env.txt, $LOGS/)"
cat "$OUT/bench.md"
