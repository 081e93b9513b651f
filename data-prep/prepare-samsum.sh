#!/usr/bin/env bash
# SAMSum dialogue summarization (dialogue -> summary) for fairseq, joint sentencepiece vocabulary;
# --with-dialogsum adds DialogSum's training dialogues, --with-summary-denoising a copy task.
# Run with --help for the options and the output layout.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SRC=src
TGT=tgt
DEFAULT_VOCAB=8000
SAMSUM_URL="https://arxiv.org/src/1911.12237v2/anc/corpus.7z"
DIALOGSUM_URL="https://raw.githubusercontent.com/cylnlp/dialogsum/main/DialogSum_Data/dialogsum.train.jsonl"
# The dialogue's line breaks become " <br> "; trained here, the vocabulary holds the piece
# "▁<br>" (the separator with its leading space) as a user-defined symbol: always one piece.
TURN="<br>"
TURN_PIECE="▁$TURN"
# fairseq split <- SAMSum's split (mirror file name / upstream file name), records expected
SPLITS=(train valid test)
MIRROR_NAMES=(train validation test)
UPSTREAM_NAMES=(train val test)
EXPECTED_MIRROR=(14731 818 819)
EXPECTED_UPSTREAM=(14732 818 819)  # upstream train holds one record with an empty dialogue
DIALOGSUM_EXPECTED=12460
DEFAULT_MAX_SOURCE_TOKENS=1000

usage() {
  cat <<EOF
Usage: bash data-prep/prepare-samsum.sh [options]

SAMSum dialogue summarization for fairseq: source language "src" (the dialogue), target "tgt"
(its summary); train 14,731 / valid 818 (SAMSum's validation split) / test 819 pairs.
Joint sentencepiece vocabulary (trained here, or reused), fairseq-preprocess's binarization
(cmasd-prep binarize, byte for byte; CMASD_BINARIZER=fairseq-preprocess runs fairseq's).

Dialogues: each line break becomes the turn separator " $TURN " (whitespace inside a turn is
collapsed, empty lines are dropped), so that raw/SPLIT.src holds one dialogue a line and the
model still sees where turns end.  A vocabulary trained here holds "$TURN_PIECE" (the separator
with its leading space) as a user-defined symbol: one piece, always.  A reused vocabulary
(--spm-model) may cut it into several pieces (the recipe says so).
Summaries: whitespace collapsed to one line; no length-ratio filter (a summary is about a fifth
of its dialogue) and no length cut on targets.
Empty records: a record whose dialogue or summary is empty is dropped from train (counted in the
log; SAMSum's published train split has one empty dialogue), but kept as an empty line in valid
and test, so that line i of a decoder's output stays aligned with line i of the references.

Data sources:
  with CMASD_DATA_MIRROR set: \$CMASD_DATA_MIRROR/samsum/{train,validation,test}.jsonl.gz and,
    with --with-dialogsum, \$CMASD_DATA_MIRROR/dialogsum/train.jsonl.gz (one JSON object a line:
    id, src, tgt);
  otherwise downloaded and converted to the same records under DIR/orig/:
    SAMSum   $SAMSUM_URL
             (the corpus published with arXiv:1911.12237: {train,val,test}.json, fields id,
             dialogue, summary); extracting it needs 7z/7za/7zr (p7zip) or the Python package
             py7zr.  If arXiv refuses the download, fetch the file by hand into
             DIR/orig/corpus.7z (or its three .json files into DIR/orig/samsum/) and rerun.
    DialogSum $DIALOGSUM_URL
             (fields fname, dialogue, summary).

Options:
  --with-dialogsum         add DialogSum's 12,460 training dialogues to train (14,731 + 12,460
                           pairs).  Only train grows: DialogSum's dev split is NOT added to
                           valid, which stays SAMSum's, so scores remain SAMSum scores.
  --with-summary-denoising add to train one pair per training summary: the summary with about
                           30% of its words deleted in spans of about 3 words -> the summary
                           (BART's text infilling, deletion variant; seeded), so that a model
                           trained from scratch learns early to read and copy from its source
                           (docs/RESULTS.md).  valid and test are unchanged; the vocabulary is
                           trained on the plain pairs, so it equals the recipe's without it.
  --max-source-tokens N    keep at most N pieces of each encoded dialogue (default
                           $DEFAULT_MAX_SOURCE_TOKENS, within fairseq's default of 1,024 source positions;
                           SAMSum dialogues are short, about 94 words: with the default
                           vocabulary this cuts 3 training dialogues and nothing else)
  --dest DIR               output directory (relative paths are taken from the current
                           directory; default $CMASD_ROOT/data-bin/samsum, or
                           data-bin/samsum-dialogsum with --with-dialogsum; "-denoise"
                           appended with --with-summary-denoising)
  --vocab-size N           joint sentencepiece vocabulary size to train (integer >= 100;
                           default $DEFAULT_VOCAB)
  --spm-model PATH         reuse this sentencepiece model instead of training one ...
  --dict PATH              ... with this fairseq dictionary (both or neither; copied into DIR
                           as spm.model and dict.txt)
  --workers N              fairseq-preprocess workers, with CMASD_BINARIZER=fairseq-preprocess (default 2)
  -h, --help               this help

Output (DIR):
  {train,valid,test}.src-tgt.{src,tgt}.{bin,idx}, dict.src.txt, dict.tgt.txt   fairseq data set
  spm.model, dict.txt (spm.vocab when trained here)                           the vocabulary
  raw/SPLIT.src            one dialogue a line, turns separated by " $TURN "
  raw/SPLIT.tgt            one summary a line (whitespace normalized): the reference
  raw/{valid,test}.refs.jsonl
                           one JSON list a line holding the one reference, its sentences
                           separated by "\n" (for ROUGE-Lsum)
  tok/SPLIT.{src,tgt}      pieces fed to fairseq-preprocess (with --with-summary-denoising,
                           tok/train.plain.{src,tgt} holds train without the added pairs)
  orig/                    downloads and their conversion (not in mirror mode);  .done/  markers
Reruns skip finished steps; changed options redo them.
Environment: CMASD_DATA_MIRROR (local mirror), CMASD_PYTHON (python with fairseq+sentencepiece).
EOF
}

WITH_DIALOGSUM=0
DENOISE_RATIO=""
SRC_MAX_TOKENS="$DEFAULT_MAX_SOURCE_TOKENS"
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --with-dialogsum) WITH_DIALOGSUM=1; shift ;;
    --with-summary-denoising) DENOISE_RATIO="$SUMMARY_DENOISE_RATIO"; shift ;;
    --max-source-tokens|--max-source-tokens=*)
      _opt_value --max-source-tokens "$@"; SRC_MAX_TOKENS="$OPT_VALUE"; shift "$CONSUMED"
      positive_int --max-source-tokens "$SRC_MAX_TOKENS" ;;
    --extra-test) die "--extra-test is not supported by the SAMSum recipe" ;;
    *) parse_common_option "$@"; shift "$CONSUMED" ;;
  esac
done
check_reuse_options "$SPM_MODEL" "$DICT_FILE"
[[ -n "$VOCAB" && -n "$SPM_MODEL" ]] && die "--vocab-size does not apply with --spm-model/--dict"
VOCAB="${VOCAB:-$DEFAULT_VOCAB}"
NAME=samsum
(( WITH_DIALOGSUM )) && NAME=samsum-dialogsum
[[ -n "$DENOISE_RATIO" ]] && NAME+=-denoise
DEST="$(abs_path "${DEST:-$CMASD_ROOT/data-bin/$NAME}")"

# Where the id/src/tgt records are read from, checked before any work.
if [[ -n "${CMASD_DATA_MIRROR:-}" ]]; then
  MODE=mirror
  DATA_DIR="$CMASD_DATA_MIRROR"
  EXT=jsonl.gz
  EXPECTED=("${EXPECTED_MIRROR[@]}")
  needed=()
  for name in "${MIRROR_NAMES[@]}"; do needed+=("samsum/$name.$EXT"); done
  (( WITH_DIALOGSUM )) && needed+=("dialogsum/train.$EXT")
  for rel in "${needed[@]}"; do
    [[ -f "$DATA_DIR/$rel" ]] || die "missing mirror file $DATA_DIR/$rel (CMASD_DATA_MIRROR=$CMASD_DATA_MIRROR;" \
      "unset CMASD_DATA_MIRROR to download from upstream instead)"
  done
else
  MODE=upstream
  DATA_DIR="$DEST/orig"
  EXT=jsonl
  EXPECTED=("${EXPECTED_UPSTREAM[@]}")
fi

mkdir -p "$DEST/raw"
TITLE="SAMSum"
(( WITH_DIALOGSUM )) && TITLE+=" + DialogSum train"
[[ -n "$DENOISE_RATIO" ]] && TITLE+=" + summary denoising pairs"
log "$TITLE ($MODE) -> $DEST"
steps_init "$DEST" "samsum dialogsum=$WITH_DIALOGSUM denoise=${DENOISE_RATIO:-0} max-source-tokens=$SRC_MAX_TOKENS $(vocab_signature)"

# extract_7z ARCHIVE DIR: with 7z, 7za or 7zr, else the Python package py7zr.
extract_7z() {
  local archive="$1" dir="$2" tool
  for tool in 7z 7za 7zr; do
    if command -v "$tool" >/dev/null 2>&1; then
      "$tool" x -y -o"$dir" "$archive" >/dev/null || die "$tool could not extract $archive"
      return 0
    fi
  done
  "$PY" - "$archive" "$dir" <<'EOF' || die "py7zr could not extract $archive"
import sys
import py7zr
with py7zr.SevenZipFile(sys.argv[1], mode="r") as archive:
    archive.extractall(path=sys.argv[2])
EOF
}

have_7z_extractor() {
  command -v 7z >/dev/null 2>&1 || command -v 7za >/dev/null 2>&1 || command -v 7zr >/dev/null 2>&1 \
    || "$PY" -c "import py7zr" >/dev/null 2>&1
}

if [[ "$MODE" == upstream ]] && ! done_step fetch; then
  mkdir -p "$DEST/orig/samsum"
  missing=0
  for name in "${UPSTREAM_NAMES[@]}"; do
    [[ -n "$(find "$DEST/orig/samsum" -name "$name.json" -print -quit)" ]] || missing=1
  done
  if (( missing )); then
    have_7z_extractor || die "SAMSum's corpus.7z needs an extractor: install p7zip (7z, 7za or 7zr;" \
      "e.g. apt-get install p7zip-full) or the Python package py7zr into $PY's environment" \
      "(pip install py7zr), or set CMASD_DATA_MIRROR to a local mirror"
    fetch "$SAMSUM_URL" "samsum/corpus.7z" "$DEST/orig/corpus.7z"
    extract_7z "$DEST/orig/corpus.7z" "$DEST/orig/samsum"
  fi
  for i in "${!SPLITS[@]}"; do
    json="$(find "$DEST/orig/samsum" -name "${UPSTREAM_NAMES[$i]}.json" -print -quit)"
    [[ -n "$json" ]] || die "$DEST/orig/corpus.7z holds no ${UPSTREAM_NAMES[$i]}.json (a different archive?)"
    "${PREP[@]}" summ-convert --id id --src dialogue --tgt summary \
      "$json" "$DEST/orig/samsum/${MIRROR_NAMES[$i]}.jsonl"
  done
  if (( WITH_DIALOGSUM )); then
    fetch "$DIALOGSUM_URL" "dialogsum/dialogsum.train.jsonl" "$DEST/orig/dialogsum.train.jsonl"
    mkdir -p "$DEST/orig/dialogsum"
    "${PREP[@]}" summ-convert --id fname --src dialogue --tgt summary \
      "$DEST/orig/dialogsum.train.jsonl" "$DEST/orig/dialogsum/train.jsonl"
  fi
  mark_done fetch
fi

if ! done_step split; then
  for i in "${!SPLITS[@]}"; do
    split="${SPLITS[$i]}"
    options=(--turn-separator "$TURN" --expect "${EXPECTED[$i]}")
    if [[ "$split" == train ]]; then options+=(--drop-empty); else options+=(--refs); fi
    "${PREP[@]}" summ-split "${options[@]}" "$DATA_DIR/samsum/${MIRROR_NAMES[$i]}.$EXT" "$DEST/raw/$split"
    check_parallel "$DEST/raw/$split.$SRC" "$DEST/raw/$split.$TGT"
  done
  check_lines "$DEST/raw/valid.$SRC" "${EXPECTED[1]}"
  check_lines "$DEST/raw/test.$SRC" "${EXPECTED[2]}"
  log "SAMSum train: $(line_count "$DEST/raw/train.$SRC") pairs"
  if (( WITH_DIALOGSUM )); then
    "${PREP[@]}" summ-split --turn-separator "$TURN" --drop-empty --expect "$DIALOGSUM_EXPECTED" \
      "$DATA_DIR/dialogsum/train.$EXT" "$DEST/raw/dialogsum-train"
    for lang in "$SRC" "$TGT"; do
      cat "$DEST/raw/dialogsum-train.$lang" >> "$DEST/raw/train.$lang"
      rm -f "$DEST/raw/dialogsum-train.$lang"
    done
    check_parallel "$DEST/raw/train.$SRC" "$DEST/raw/train.$TGT"
    log "SAMSum + DialogSum train: $(line_count "$DEST/raw/train.$SRC") pairs"
  fi
  mark_done split
fi

# No ratio or length filter (CLEAN=0): summaries are far shorter than their dialogues.
CLEAN=0
# Dialogues can be long lines: let sentencepiece see them whole.
SPM_TRAIN_ARGS=(--user-defined-symbols "$TURN_PIECE" --max-sentence-length 20000)
finish_recipe
grep -q "^$TURN_PIECE " "$DEST/dict.txt" \
  || log "note: the vocabulary has no piece $TURN_PIECE: the turn separator is cut into several pieces"
log "done: $DEST (references: $DEST/raw/test.$TGT; for ROUGE-Lsum: $DEST/raw/test.refs.jsonl)"
