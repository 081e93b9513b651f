#!/usr/bin/env bash
# Sequence-level distillation: the verifier's own translations of the training sources,
# binarized as a data-bin for drafter training. Run with --help for the options.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: bash data-prep/distill.sh DATASET VERIFIER [options] [-- fairseq-generate options...]

Translates the training and validation sources of data-bin DATASET with VERIFIER
(fairseq-generate, greedy by default) and binarizes each source with its translation as
data-bin/DATASET-distill, with the same dictionary; the other splits and the raw
references (raw/, what sacreBLEU scores against) are copied from DATASET unchanged. SpecDec
trains its drafter on such verifier outputs, so that the drafter imitates the verifier
rather than the references, and a distilled valid split makes the drafter's validation
acc@k and exp_accept measure agreement with the verifier, the numbers that predict speed:
  bash data-prep/train-drafter.sh DATASET-distill VERIFIER

DATASET   a data-bin directory, or the name of one under data-bin/
VERIFIER  the verifier checkpoint (.pt)

Options:
  --subsets LIST      the splits to distill, among train, valid and test (default
                      train,valid; the others are copied). --subsets test --dest DIR gives
                      a test split to measure a trained drafter's agreement with the
                      verifier: fairseq-validate DIR --valid-subset test ...
  --beam N            beam size (default 1: greedy, what the verifier does when verifying)
  --batch-size B      sentences per fairseq-generate batch (default 128)
  --shards N          split the work into N shards (default 1) ...
  --shard-id I        ... and run only shard I (0-based) of each split, e.g. one per GPU or
                      machine; without it every shard runs in turn. Binarization runs once
                      all N are done.
  --dest DIR          output data-bin (default: DATASET's path with "-distill" appended)
  -h, --help          this help
Options after "--" go to fairseq-generate (e.g. --fp16, --max-len-b 250, or the rules the
verifier will decode with: --min-len 10 --no-repeat-ngram-size 3). fairseq-generate runs
fairseq's own generator under cmasd's task (--task translation_speculative), whose
--no-repeat-ngram-size works on a CPU, where fairseq 0.12's bans nothing.

Resumable: each shard's output goes to DEST/generate/SPLIT-shard-I-of-N.txt; a finished
shard has a marker (.done beside it, holding the verifier checksum, the batch size and
the options) and is not generated again; changing any of them regenerates. The batch
size decides which sentences each shard holds: keep it the same on every machine (it is
lowered automatically for a split with fewer than N batches). fairseq-generate's own
progress is shown on stderr. Checks: per shard, one hypothesis per source and no id
twice; per split, ids 0..n-1 for its n sentences.
Uses --cpu when torch sees no CUDA device. Environment: CMASD_PYTHON.
EOF
}

SUBSETS="train,valid"
BEAM=1
BATCH=128
SHARDS=1
SHARD_ID=""
DEST=""
POSITIONAL=()
GENERATE_ARGS=()
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --subsets|--subsets=*) _opt_value --subsets "$@"; SUBSETS="$OPT_VALUE"; shift "$CONSUMED" ;;
    --beam|--beam=*) _opt_value --beam "$@"; BEAM="$OPT_VALUE"; shift "$CONSUMED" ;;
    --batch-size|--batch-size=*) _opt_value --batch-size "$@"; BATCH="$OPT_VALUE"; shift "$CONSUMED" ;;
    --shards|--shards=*) _opt_value --shards "$@"; SHARDS="$OPT_VALUE"; shift "$CONSUMED" ;;
    --shard-id|--shard-id=*) _opt_value --shard-id "$@"; SHARD_ID="$OPT_VALUE"; shift "$CONSUMED" ;;
    --dest|--dest=*) _opt_value --dest "$@"; DEST="$OPT_VALUE"; shift "$CONSUMED" ;;
    --) shift; GENERATE_ARGS=("$@"); break ;;
    -*) die "unknown option: $1 (see --help)" ;;
    *) POSITIONAL+=("$1"); shift ;;
  esac
done
(( ${#POSITIONAL[@]} == 2 )) || { usage >&2; die "expected DATASET and VERIFIER"; }
for value in "$BEAM" "$BATCH" "$SHARDS"; do
  [[ "$value" =~ ^[1-9][0-9]*$ ]] || die "bad value '$value': --beam, --batch-size and --shards take positive integers"
done
if [[ -n "$SHARD_ID" ]]; then
  [[ "$SHARD_ID" =~ ^[0-9]+$ ]] && (( SHARD_ID < SHARDS )) || die "--shard-id must lie in 0..$((SHARDS - 1))"
fi

DATASET="${POSITIONAL[0]}"
VERIFIER="${POSITIONAL[1]}"
resolve_data_bin "$DATASET"
[[ -f "$VERIFIER" ]] || die "verifier checkpoint not found: $VERIFIER"
VERIFIER="$(abs_path "$VERIFIER")"
DEST="$(abs_path "${DEST:-$DATA-distill}")"
DEST="${DEST%/}"
[[ "$DEST" != "$DATA" ]] || die "--dest must differ from the data set itself"

# language pair from the binarized train split: train.SRC-TGT.SRC.idx
TRAIN_IDX=("$DATA"/train.*-*.*.idx)
[[ -f "${TRAIN_IDX[0]}" ]] || die "$DATA has no binarized train split (train.SRC-TGT.LANG.idx)"
PAIR="$(basename "${TRAIN_IDX[0]}")"; PAIR="${PAIR#train.}"; PAIR="${PAIR%%.*}"
SRC="${PAIR%-*}"; TGT="${PAIR#*-}"
[[ -f "$DATA/dict.$SRC.txt" ]] || die "missing $DATA/dict.$SRC.txt"

# per split: its sentence count, batch size and signature
declare -A COUNT BATCH_OF SIGNATURE
IFS=, read -r -a SPLITS <<< "$SUBSETS"
for split in "${SPLITS[@]}"; do
  [[ "$split" =~ ^(train|valid|test)$ ]] || die "bad --subsets entry '$split': expected train, valid or test"
  [[ -z "${COUNT[$split]:-}" ]] || die "--subsets names $split twice"
  [[ -f "$DATA/$split.$PAIR.$SRC.idx" ]] || die "$DATA has no binarized $split split ($split.$PAIR.$SRC.idx)"
  COUNT[$split]="$("${PREP[@]}" count-bin "$DATA/$split.$PAIR.$SRC.idx" | cut -f2)"
  (( SHARDS <= COUNT[$split] )) || die "--shards $SHARDS is more than the ${COUNT[$split]} sentences of $split"
  # fairseq shards whole batches and pads a shard left without one with an empty batch, on
  # which fairseq-generate dies (ZeroDivisionError): make sure there are at least SHARDS batches.
  BATCH_OF[$split]="$BATCH"
  if (( BATCH * SHARDS > COUNT[$split] )); then
    BATCH_OF[$split]=$(( COUNT[$split] / SHARDS ))
    log "$split: batch size lowered to ${BATCH_OF[$split]} so that each of the $SHARDS shards gets at least one batch"
  fi
done
log "distilling $SUBSETS of $DATA ($SRC -> $TGT) with $VERIFIER, beam $BEAM, $SHARDS shard(s)"

DEVICE=()
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" || DEVICE=(--cpu)
for split in "${SPLITS[@]}"; do
  SIGNATURE[$split]="verifier=$(file_id "$VERIFIER") beam=$BEAM batch=${BATCH_OF[$split]} data=$(file_id "$DATA/$split.$PAIR.$SRC.idx") args=${GENERATE_ARGS[*]-}"
done
WORK="$DEST/generate"
mkdir -p "$WORK"

# check_shard SPLIT FILE: one hypothesis per source line, no id twice; prints the count.
check_shard() {
  local split="$1" file="$2" sources hypotheses distinct
  grep -q "^Generate $split with beam=" "$file" || die "$file: fairseq-generate did not finish"
  sources="$(grep -c '^S-[0-9]*	' "$file" || true)"
  hypotheses="$(grep -c '^H-[0-9]*	' "$file" || true)"
  distinct="$(grep '^H-[0-9]*	' "$file" | cut -f1 | sort -u | wc -l | tr -d ' ')"
  [[ "$sources" == "$hypotheses" && "$hypotheses" == "$distinct" ]] \
    || die "$file: $sources sources, $hypotheses hypotheses, $distinct distinct ids"
  printf '%s\n' "$hypotheses"
}

shard_done() {  # shard_done SPLIT ID: its marker exists with the current signature
  local marker="$WORK/$1-shard-$2-of-$SHARDS.done"
  [[ -f "$marker" && "$(head -n1 "$marker")" == "${SIGNATURE[$1]}" ]]
}

# fairseq-generate 0.12 ignores its --num-shards/--shard-id and shards the batches by
# --distributed-world-size/--distributed-rank instead (without starting any process group).
generate_shard() {  # generate_shard SPLIT ID
  local split="$1" id="$2" out="$WORK/$1-shard-$2-of-$SHARDS.txt" marker="$WORK/$1-shard-$2-of-$SHARDS.done" count
  if shard_done "$split" "$id"; then
    log "skip: $split shard $id of $SHARDS (done, $(tail -n1 "$marker") sentences)"
    return 0
  fi
  rm -f "$marker"
  log "$split shard $id of $SHARDS -> $out"
  fairseq_tool generate
  "${FAIRSEQ_CMD[@]}" "$DATA" --user-dir "$CMASD_ROOT/fairseq_plugins" \
    --task translation_speculative --source-lang "$SRC" --target-lang "$TGT" \
    --gen-subset "$split" --path "$VERIFIER" --beam "$BEAM" --nbest 1 \
    --batch-size "${BATCH_OF[$split]}" --required-batch-size-multiple 1 \
    --distributed-world-size "$SHARDS" --distributed-rank "$id" \
    ${DEVICE[@]+"${DEVICE[@]}"} ${GENERATE_ARGS[@]+"${GENERATE_ARGS[@]}"} \
    | "$PY" "$CMASD_ROOT/cmasd/tools/progress.py" count --out "$out.part" --label "$split shard $id" \
      --total "$(( (COUNT[$split] + SHARDS - 1) / SHARDS ))"
  mv "$out.part" "$out"
  count="$(check_shard "$split" "$out")"
  printf '%s\n%s\n' "${SIGNATURE[$split]}" "$count" > "$marker"
  log "$split shard $id of $SHARDS: $count sentences"
}

for split in "${SPLITS[@]}"; do
  if [[ -n "$SHARD_ID" ]]; then
    generate_shard "$split" "$SHARD_ID"
  else
    for (( id = 0; id < SHARDS; id++ )); do generate_shard "$split" "$id"; done
  fi
done
FINAL_SIGNATURE="shards=$SHARDS"
for split in "${SPLITS[@]}"; do
  for (( id = 0; id < SHARDS; id++ )); do
    if ! shard_done "$split" "$id"; then
      log "$split shard $id of $SHARDS is not done yet: binarize once every shard has run"
      exit 0
    fi
  done
  FINAL_SIGNATURE+=" $split: ${SIGNATURE[$split]}"
done

if [[ -f "$DEST/.distill-done" && "$(cat "$DEST/.distill-done")" == "$FINAL_SIGNATURE" ]]; then
  log "skip: binarize (done): $DEST"
  exit 0
fi
rm -f "$DEST/.distill-done"

# per split, sources and hypotheses in id order; the ids must be exactly 0 .. n-1
mkdir -p "$DEST/tok"
PREFIXES=()
for split in "${SPLITS[@]}"; do
  n="${COUNT[$split]}"
  shard_files=()
  for (( id = 0; id < SHARDS; id++ )); do shard_files+=("$WORK/$split-shard-$id-of-$SHARDS.txt"); done
  for field in S:2:sources H:3:hypotheses; do
    IFS=: read -r tag column name <<< "$field"
    tsv="$WORK/$split-$name.tsv"
    LC_ALL=C awk -F'\t' -v tag="$tag" -v column="$column" \
      'index($0, tag "-") == 1 && $1 ~ ("^" tag "-[0-9]+$") { print substr($1, length(tag) + 2) "\t" $column }' \
      "${shard_files[@]}" | LC_ALL=C sort -n -k1,1 > "$tsv"
    cut -f1 "$tsv" | cmp -s - <(seq 0 $((n - 1))) \
      || die "$tsv: the ids are not exactly 0..$((n - 1)) ($(line_count "$tsv") lines for $n $split sentences)"
  done
  cut -f2 "$WORK/$split-sources.tsv" > "$DEST/tok/$split.$SRC"
  cut -f2 "$WORK/$split-hypotheses.tsv" > "$DEST/tok/$split.$TGT"
  PREFIXES+=("--${split}pref" "$DEST/tok/$split")
  log "$split: $n distilled pairs"
done
log "binarizing into $DEST"

binarizer 2
rm -f "$DEST/dict.$SRC.txt" "$DEST/dict.$TGT.txt"
"${BINARIZE_CMD[@]}" --source-lang "$SRC" --target-lang "$TGT" "${PREFIXES[@]}" \
  --destdir "$DEST" --srcdict "$DATA/dict.$SRC.txt" --joined-dictionary
cmp -s "$DEST/dict.$TGT.txt" "$DATA/dict.$TGT.txt" || die "the distilled dictionary differs from $DATA/dict.$TGT.txt"
# the splits not distilled come from the original data-bin, as do the raw references
# (raw/: what sacreBLEU scores against, also for a distilled valid or test split)
distilled() { local split; for split in "${SPLITS[@]}"; do [[ "$1" != "$split.$PAIR".* ]] || return 0; done; return 1; }
for file in "$DATA"/*; do
  name="$(basename "$file")"
  [[ -f "$file" && "$name" != dict.* && "$name" != preprocess.log ]] || continue
  distilled "$name" || cp "$file" "$DEST/$name"
done
if [[ -d "$DATA/raw" ]]; then
  mkdir -p "$DEST/raw"
  for file in "$DATA"/raw/*; do
    [[ "$(basename "$file")" == train.* ]] || cp "$file" "$DEST/raw/"
  done
fi
printf '%s\n' "$FINAL_SIGNATURE" > "$DEST/.distill-done"
summarize "$DEST"
if [[ -n "${COUNT[train]:-}" ]]; then
  log "done: $DEST (train on it with: bash data-prep/train-drafter.sh $DEST $VERIFIER)"
else
  log "done: $DEST ($SUBSETS distilled; train copied from $DATA)"
fi
