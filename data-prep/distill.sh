#!/usr/bin/env bash
# Sequence-level distillation: the verifier's own translations of the training sources,
# binarized as a data-bin for drafter training. Run with --help for the options.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: bash data-prep/distill.sh DATASET VERIFIER [options] [-- fairseq-generate options...]

Translates the training sources of data-bin DATASET with VERIFIER (fairseq-generate
--gen-subset train, greedy by default) and binarizes source + translation as
data-bin/DATASET-distill, with the same dictionary; valid and test splits are copied from
DATASET unchanged. SpecDec trains its drafter on such verifier outputs, so that the
drafter imitates the verifier rather than the references:
  bash data-prep/train-drafter.sh DATASET-distill VERIFIER

DATASET   a data-bin directory, or the name of one under data-bin/
VERIFIER  the verifier checkpoint (.pt)

Options:
  --beam N            beam size (default 1: greedy, what the verifier does when verifying)
  --batch-size B      sentences per fairseq-generate batch (default 128)
  --shards N          split the work into N shards (default 1) ...
  --shard-id I        ... and run only shard I (0-based), e.g. one per GPU or machine; without
                      it every shard runs in turn. Binarization runs once all N are done.
  --dest DIR          output data-bin (default: DATASET's path with "-distill" appended)
  -h, --help          this help
Options after "--" go to fairseq-generate (e.g. --fp16, --max-len-b 250).

Resumable: each shard's output goes to DEST/generate/; a finished shard has a marker
(DEST/generate/shard-I-of-N.done, holding the verifier checksum, the batch size and the
options) and is not generated again; changing any of them regenerates. The batch size
decides which sentences each shard holds: keep it the same on every machine. fairseq-generate's own
progress is shown on stderr. Checks: per shard, one hypothesis per source and no id twice;
in all, ids 0..n-1 for the n training sentences of DATASET.
Uses --cpu when torch sees no CUDA device. Environment: CMASD_PYTHON.
EOF
}

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
if [[ -d "$DATASET" || "$DATASET" == */* ]]; then
  DATA="$(abs_path "$DATASET")"
else
  DATA="$CMASD_ROOT/data-bin/$DATASET"
fi
DATA="${DATA%/}"
[[ -d "$DATA" ]] || die "no data-bin at $DATA (make it with a data-prep/prepare-*.sh recipe)"
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
N_TRAIN="$("${PREP[@]}" count-bin "$DATA/train.$PAIR.$SRC.idx" | cut -f2)"
(( SHARDS <= N_TRAIN )) || die "--shards $SHARDS is more than the $N_TRAIN training sentences"
# fairseq shards whole batches and pads a shard left without one with an empty batch, on
# which fairseq-generate dies (ZeroDivisionError): make sure there are at least SHARDS batches.
if (( BATCH * SHARDS > N_TRAIN )); then
  BATCH=$(( N_TRAIN / SHARDS ))
  log "batch size lowered to $BATCH so that each of the $SHARDS shards gets at least one batch"
fi
log "distilling $N_TRAIN training sentences of $DATA ($SRC -> $TGT) with $VERIFIER, beam $BEAM, $SHARDS shard(s)"

DEVICE=()
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" || DEVICE=(--cpu)
SIGNATURE="verifier=$(file_id "$VERIFIER") beam=$BEAM batch=$BATCH data=$(file_id "$DATA/train.$PAIR.$SRC.idx") args=${GENERATE_ARGS[*]-}"
WORK="$DEST/generate"
mkdir -p "$WORK"

# check_shard FILE: one hypothesis per source line, no id twice; prints the count.
check_shard() {
  local file="$1" sources hypotheses distinct
  grep -q '^Generate train with beam=' "$file" || die "$file: fairseq-generate did not finish"
  sources="$(grep -c '^S-[0-9]*	' "$file" || true)"
  hypotheses="$(grep -c '^H-[0-9]*	' "$file" || true)"
  distinct="$(grep '^H-[0-9]*	' "$file" | cut -f1 | sort -u | wc -l | tr -d ' ')"
  [[ "$sources" == "$hypotheses" && "$hypotheses" == "$distinct" ]] \
    || die "$file: $sources sources, $hypotheses hypotheses, $distinct distinct ids"
  printf '%s\n' "$hypotheses"
}

# fairseq-generate 0.12 ignores its --num-shards/--shard-id and shards the batches by
# --distributed-world-size/--distributed-rank instead (without starting any process group).
generate_shard() {
  local id="$1" out="$WORK/shard-$1-of-$SHARDS.txt" marker="$WORK/shard-$1-of-$SHARDS.done" count
  if [[ -f "$marker" && "$(head -n1 "$marker")" == "$SIGNATURE" ]]; then
    log "skip: shard $id of $SHARDS (done, $(tail -n1 "$marker") sentences)"
    return 0
  fi
  rm -f "$marker"
  log "shard $id of $SHARDS -> $out"
  fairseq_tool generate
  "${FAIRSEQ_CMD[@]}" "$DATA" --user-dir "$CMASD_ROOT/fairseq_plugins" \
    --task translation --source-lang "$SRC" --target-lang "$TGT" \
    --gen-subset train --path "$VERIFIER" --beam "$BEAM" --nbest 1 \
    --batch-size "$BATCH" --required-batch-size-multiple 1 \
    --distributed-world-size "$SHARDS" --distributed-rank "$id" \
    ${DEVICE[@]+"${DEVICE[@]}"} ${GENERATE_ARGS[@]+"${GENERATE_ARGS[@]}"} > "$out.part"
  mv "$out.part" "$out"
  count="$(check_shard "$out")"
  printf '%s\n%s\n' "$SIGNATURE" "$count" > "$marker"
  log "shard $id of $SHARDS: $count sentences"
}

if [[ -n "$SHARD_ID" ]]; then
  generate_shard "$SHARD_ID"
else
  for (( id = 0; id < SHARDS; id++ )); do generate_shard "$id"; done
fi
for (( id = 0; id < SHARDS; id++ )); do
  marker="$WORK/shard-$id-of-$SHARDS.done"
  if [[ ! -f "$marker" || "$(head -n1 "$marker")" != "$SIGNATURE" ]]; then
    log "shard $id of $SHARDS is not done yet: binarize once every shard has run"
    exit 0
  fi
done

FINAL_SIGNATURE="$SIGNATURE shards=$SHARDS"
if [[ -f "$DEST/.distill-done" && "$(cat "$DEST/.distill-done")" == "$FINAL_SIGNATURE" ]]; then
  log "skip: binarize (done): $DEST"
  exit 0
fi
rm -f "$DEST/.distill-done"

# sources and hypotheses in id order; ids must be exactly 0 .. N_TRAIN-1
mkdir -p "$DEST/tok"
SHARD_FILES=()
for (( id = 0; id < SHARDS; id++ )); do SHARD_FILES+=("$WORK/shard-$id-of-$SHARDS.txt"); done
extract() {  # extract TAG FIELD OUT: "id<TAB>text" of TAG lines, sorted by id
  LC_ALL=C awk -F'\t' -v tag="$1" -v field="$2" \
    'index($0, tag "-") == 1 && $1 ~ ("^" tag "-[0-9]+$") { print substr($1, length(tag) + 2) "\t" $field }' \
    "${SHARD_FILES[@]}" | LC_ALL=C sort -n -k1,1 > "$3"
}
extract S 2 "$WORK/sources.tsv"
extract H 3 "$WORK/hypotheses.tsv"
for tsv in "$WORK/sources.tsv" "$WORK/hypotheses.tsv"; do
  cut -f1 "$tsv" | cmp -s - <(seq 0 $((N_TRAIN - 1))) \
    || die "$tsv: the ids are not exactly 0..$((N_TRAIN - 1)) ($(line_count "$tsv") lines for $N_TRAIN training sentences)"
done
cut -f2 "$WORK/sources.tsv" > "$DEST/tok/train.$SRC"
cut -f2 "$WORK/hypotheses.tsv" > "$DEST/tok/train.$TGT"
log "binarizing $N_TRAIN distilled pairs into $DEST"

fairseq_tool preprocess
rm -f "$DEST/dict.$SRC.txt" "$DEST/dict.$TGT.txt"
"${FAIRSEQ_CMD[@]}" --source-lang "$SRC" --target-lang "$TGT" --trainpref "$DEST/tok/train" \
  --destdir "$DEST" --srcdict "$DATA/dict.$SRC.txt" --joined-dictionary --workers 2
cmp -s "$DEST/dict.$TGT.txt" "$DATA/dict.$TGT.txt" || die "the distilled dictionary differs from $DATA/dict.$TGT.txt"
# everything but the training split comes from the original data-bin
for file in "$DATA"/*; do
  name="$(basename "$file")"
  [[ -f "$file" && "$name" != train.* && "$name" != dict.* && "$name" != preprocess.log ]] || continue
  cp "$file" "$DEST/$name"
done
if [[ -d "$DATA/raw" ]]; then
  mkdir -p "$DEST/raw"
  for file in "$DATA"/raw/*; do
    [[ "$(basename "$file")" == train.* ]] || cp "$file" "$DEST/raw/"
  done
fi
printf '%s\n' "$FINAL_SIGNATURE" > "$DEST/.distill-done"
summarize "$DEST"
log "done: $DEST (train on it with: bash data-prep/train-drafter.sh $DEST $VERIFIER)"
