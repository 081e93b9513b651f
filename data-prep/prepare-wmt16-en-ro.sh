#!/usr/bin/env bash
# WMT16 English -> Romanian for fairseq, with a joint sentencepiece vocabulary.
# Full recipe (statmt.org + OPUS downloads) or --mirror-test (what the offline data mirror has).
# Run with --help for the options and the output layout.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SRC=en
TGT=ro

# Full recipe: the WMT16 constrained EN-RO parallel data.
EP_URL="http://data.statmt.org/wmt16/translation-task/training-parallel-ep-v8.tgz"
SETIMES_URL="https://object.pouta.csc.fi/OPUS-SETIMES/v2/moses/en-ro.txt.zip"
SETIMES_FILE="SETIMES2.en-ro.txt.zip"
DEV_URL="http://data.statmt.org/wmt16/translation-task/dev.tgz"
TEST_URL="http://data.statmt.org/wmt16/translation-task/test.tgz"
FULL_MIRROR_DIR="wmt16-en-ro"        # mirror layout for the archives: $CMASD_DATA_MIRROR/wmt16-en-ro/<archive>
EP_CORPUS="training-parallel-ep-v8/europarl-v8.ro-en"
VALID_SRC="dev/newsdev2016-enro-src.en.sgm"
VALID_REF="dev/newsdev2016-enro-ref.ro.sgm"
TEST_SRC="test/newstest2016-enro-src.en.sgm"
TEST_REF="test/newstest2016-enro-ref.ro.sgm"
VALID_LINES=1999
TEST_LINES=1999

# --mirror-test: newstest2016 and the Tatoeba eng-ron test set (OPUS-MT-testsets file names).
MT_URL="https://raw.githubusercontent.com/Helsinki-NLP/OPUS-MT-testsets/master/testsets/en-ro"
MT_MIRROR_DIR="wmt16-en-ro"
MT_TEST=newstest2016
MT_TRAIN=tatoeba-v2021-03-30
MT_VALID_LINES=500

usage() {
  cat <<EOF
Usage: bash data-prep/prepare-wmt16-en-ro.sh [--mirror-test] [options]

WMT16 EN-RO for fairseq with a joint sentencepiece vocabulary (text kept as published: no
Romanian diacritic removal, no Moses tokenization).

Full recipe (default; needs the internet):
  train  Europarl v8 ($EP_URL)
         + SETIMES2 ($SETIMES_URL),
         filtered like clean-corpus-n: 1..250 pieces per side, length ratio <= 1.5
  valid  newsdev2016 (1,999, $DEV_URL)
  test   newstest2016 (1,999, $TEST_URL)
  output $CMASD_ROOT/data-bin/wmt16-en-ro, default --vocab-size 32000
  With CMASD_DATA_MIRROR set, the archives are read from \$CMASD_DATA_MIRROR/$FULL_MIRROR_DIR/
  ($(basename "$EP_URL"), $SETIMES_FILE, dev.tgz, test.tgz).

--mirror-test: for the offline mirror, which has only newstest2016 and Tatoeba:
  train  $MT_TRAIN.{en,ro} without its last $MT_VALID_LINES lines (short sentences)
  valid  the last $MT_VALID_LINES Tatoeba lines      test  $MT_TEST.{en,ro} (1,999)
  from   \$CMASD_DATA_MIRROR/$MT_MIRROR_DIR/, else $MT_URL/
  output $CMASD_ROOT/data-bin/wmt16-en-ro-mirror, default --vocab-size 8000
  The point of this variant is the test set: use --spm-model/--dict of a model trained elsewhere
  to evaluate it on newstest2016.

Options:
  --mirror-test           the variant above
$COMMON_OPTIONS_HELP

Output (DIR):
  train|valid|test.en-ro.{en,ro}.{bin,idx}, dict.en.txt, dict.ro.txt   fairseq data set
  spm.model, dict.txt (spm.vocab when trained here)                   the vocabulary
  raw/{train,valid,test}.{en,ro}    normalized text; raw/test.ro and raw/valid.ro are the
                                    sacreBLEU references
  tok/*.{en,ro}                     pieces;  orig/  downloads;  .done/  step markers
Reruns skip finished steps; changed options redo them.
Environment: CMASD_DATA_MIRROR (local mirror), CMASD_PYTHON (python with fairseq+sentencepiece).
EOF
}

MIRROR_TEST=0
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --mirror-test) MIRROR_TEST=1; shift ;;
    *) parse_common_option "$@"; shift "$CONSUMED" ;;
  esac
done
check_reuse_options "$SPM_MODEL" "$DICT_FILE"
[[ -n "$VOCAB" && -n "$SPM_MODEL" ]] && die "--vocab-size does not apply with --spm-model/--dict"
FULL_FILES=("$(basename "$EP_URL")" "$SETIMES_FILE" dev.tgz test.tgz)
if (( MIRROR_TEST )); then
  VARIANT=mirror-test; VOCAB="${VOCAB:-8000}"; DEFAULT_DEST="$CMASD_ROOT/data-bin/wmt16-en-ro-mirror"
else
  VARIANT=full; VOCAB="${VOCAB:-32000}"; DEFAULT_DEST="$CMASD_ROOT/data-bin/wmt16-en-ro"
  if [[ -n "${CMASD_DATA_MIRROR:-}" ]]; then
    rels=()
    for file in "${FULL_FILES[@]}"; do rels+=("$FULL_MIRROR_DIR/$file"); done
    mirror_has "${rels[@]}" || die "the full WMT16 EN-RO recipe needs the training archives, and" \
      "CMASD_DATA_MIRROR=$CMASD_DATA_MIRROR does not hold them (expected ${rels[*]})." \
      "The mirror has only newstest2016 and Tatoeba: use --mirror-test," \
      "or unset CMASD_DATA_MIRROR to download the full data."
  fi
fi
DEST="$(abs_path "${DEST:-$DEFAULT_DEST}")"
mkdir -p "$DEST/orig" "$DEST/raw"
log "WMT16 EN-RO ($VARIANT) -> $DEST"
steps_init "$DEST" "wmt16-en-ro $VARIANT $(vocab_signature)"

# ------------------------------------------------------------------ full recipe

full_fetch() {
  fetch "$EP_URL" "$FULL_MIRROR_DIR/${FULL_FILES[0]}" "$DEST/orig/${FULL_FILES[0]}"
  fetch "$SETIMES_URL" "$FULL_MIRROR_DIR/$SETIMES_FILE" "$DEST/orig/$SETIMES_FILE"
  fetch "$DEV_URL" "$FULL_MIRROR_DIR/dev.tgz" "$DEST/orig/dev.tgz"
  fetch "$TEST_URL" "$FULL_MIRROR_DIR/test.tgz" "$DEST/orig/test.tgz"
}

full_extract() {
  local file lang
  for file in "${FULL_FILES[0]}" dev.tgz test.tgz; do
    log "extract $file"
    tar -xzf "$DEST/orig/$file" -C "$DEST/orig"
  done
  log "extract $SETIMES_FILE"
  mkdir -p "$DEST/orig/setimes"
  "$PY" -m zipfile -e "$DEST/orig/$SETIMES_FILE" "$DEST/orig/setimes"
  # OPUS has named the files SETIMES.en-ro.* and SETIMES2.en-ro.*: accept either.
  for lang in "$SRC" "$TGT"; do
    file="$(find "$DEST/orig/setimes" -name "SETIMES*.en-ro.$lang" | head -n 1)"
    [[ -n "$file" ]] || die "no SETIMES*.en-ro.$lang in $SETIMES_FILE (archive layout changed?)"
    mv "$file" "$DEST/orig/setimes.en-ro.$lang"
  done
  for file in "$EP_CORPUS.$SRC" "$EP_CORPUS.$TGT" "$VALID_SRC" "$VALID_REF" "$TEST_SRC" "$TEST_REF"; do
    [[ -f "$DEST/orig/$file" ]] || die "archive layout changed? missing $DEST/orig/$file"
  done
}

full_raw() {
  local corpus lang
  mkdir -p "$DEST/raw/parts"
  for lang in "$SRC" "$TGT"; do : > "$DEST/raw/train.$lang.tmp"; done
  for corpus in "$EP_CORPUS" setimes.en-ro; do
    for lang in "$SRC" "$TGT"; do
      "${PREP[@]}" normalize --errors replace "$DEST/orig/$corpus.$lang" "$DEST/raw/parts/${corpus##*/}.$lang"
    done
    check_parallel "$DEST/raw/parts/${corpus##*/}.$SRC" "$DEST/raw/parts/${corpus##*/}.$TGT"
    for lang in "$SRC" "$TGT"; do
      cat "$DEST/raw/parts/${corpus##*/}.$lang" >> "$DEST/raw/train.$lang.tmp"
    done
  done
  for lang in "$SRC" "$TGT"; do mv "$DEST/raw/train.$lang.tmp" "$DEST/raw/train.$lang"; done
  rm -rf "$DEST/raw/parts"
  "${PREP[@]}" sgm-extract "$DEST/orig/$VALID_SRC" "$DEST/raw/valid.$SRC"
  "${PREP[@]}" sgm-extract "$DEST/orig/$VALID_REF" "$DEST/raw/valid.$TGT"
  "${PREP[@]}" sgm-extract "$DEST/orig/$TEST_SRC" "$DEST/raw/test.$SRC"
  "${PREP[@]}" sgm-extract "$DEST/orig/$TEST_REF" "$DEST/raw/test.$TGT"
  for lang in "$SRC" "$TGT"; do
    check_lines "$DEST/raw/valid.$lang" "$VALID_LINES"
    check_lines "$DEST/raw/test.$lang" "$TEST_LINES"
  done
}

# ------------------------------------------------------------------ mirror-test variant

mt_fetch() {
  local name lang
  for name in "$MT_TRAIN" "$MT_TEST"; do
    for lang in "$SRC" "$TGT"; do
      fetch "$MT_URL/$name.$lang" "$MT_MIRROR_DIR/$name.$lang" "$DEST/orig/$name.$lang"
    done
  done
}

mt_raw() {
  local lang n
  for lang in "$SRC" "$TGT"; do
    "${PREP[@]}" normalize "$DEST/orig/$MT_TRAIN.$lang" "$DEST/raw/tatoeba.$lang"
    "${PREP[@]}" normalize "$DEST/orig/$MT_TEST.$lang" "$DEST/raw/test.$lang"
    check_lines "$DEST/raw/test.$lang" "$TEST_LINES"
  done
  check_parallel "$DEST/raw/tatoeba.$SRC" "$DEST/raw/tatoeba.$TGT"
  n="$(line_count "$DEST/raw/tatoeba.$SRC")"
  (( n > 2 * MT_VALID_LINES )) || die "$MT_TRAIN has only $n lines: too few to split"
  for lang in "$SRC" "$TGT"; do
    head -n "$(( n - MT_VALID_LINES ))" "$DEST/raw/tatoeba.$lang" > "$DEST/raw/train.$lang"
    tail -n "$MT_VALID_LINES" "$DEST/raw/tatoeba.$lang" > "$DEST/raw/valid.$lang"
    rm "$DEST/raw/tatoeba.$lang"
  done
}

# ------------------------------------------------------------------ run

if (( MIRROR_TEST )); then
  if ! done_step fetch; then mt_fetch; mark_done fetch; fi
  if ! done_step normalize; then mt_raw; mark_done normalize; fi
  CLEAN=0
else
  if ! done_step fetch; then full_fetch; mark_done fetch; fi
  if ! done_step extract; then full_extract; mark_done extract; fi
  if ! done_step normalize; then full_raw; mark_done normalize; fi
  CLEAN=1
fi
if (( CLEAN )); then
  log "training pairs before length filtering: $(line_count "$DEST/raw/train.$SRC")"
else
  log "training pairs: $(line_count "$DEST/raw/train.$SRC")"
fi
finish_recipe
log "done: $DEST (references: $DEST/raw/test.$TGT, $DEST/raw/valid.$TGT)"
