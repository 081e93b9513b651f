#!/usr/bin/env bash
# Multi30k task 1, English -> German, binarized for fairseq with a joint sentencepiece vocabulary.
# Run with --help for the options and the output layout.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

BASE_URL="https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
SRC=en
TGT=de
DEFAULT_VOCAB=8000
# upstream name -> our split name, and the sentence count every split must have
UPSTREAM=(train val test_2016_flickr)
SPLITS=(train valid test)
EXPECTED=(29000 1014 1000)

usage() {
  cat <<EOF
Usage: bash data-prep/prepare-multi30k.sh [options]

Multi30k task 1 EN-DE (train 29,000 / valid 1,014 / test_2016_flickr 1,000 pairs) for fairseq:
fetch, normalize whitespace, joint sentencepiece (trained here, or reused), fairseq-preprocess's
binarization (cmasd-prep binarize, byte for byte; CMASD_BINARIZER=fairseq-preprocess runs fairseq's).

Data source: $BASE_URL/{train,val,test_2016_flickr}.{en,de}.gz,
or, when CMASD_DATA_MIRROR is set, \$CMASD_DATA_MIRROR/multi30k/<same file names>.

Options:
$COMMON_OPTIONS_HELP
Defaults: --dest $CMASD_ROOT/data-bin/multi30k, --vocab-size $DEFAULT_VOCAB.

Output (DIR):
  train|valid|test.en-de.{en,de}.{bin,idx}, dict.en.txt, dict.de.txt   fairseq data set
  spm.model, dict.txt (spm.vocab when trained here)                   the vocabulary
  raw/{train,valid,test}.{en,de}    normalized text; raw/test.de and raw/valid.de are the
                                    untokenized sacreBLEU references
  tok/*.{en,de}                     sentencepiece pieces fed to fairseq-preprocess
  orig/                             the fetched .gz files;  .done/  step markers
Reruns skip finished steps; changed options redo them.
Environment: CMASD_DATA_MIRROR (local mirror), CMASD_PYTHON (python with fairseq+sentencepiece).
EOF
}

while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    *) parse_common_option "$@"; shift "$CONSUMED" ;;
  esac
done
check_reuse_options "$SPM_MODEL" "$DICT_FILE"
[[ -n "$VOCAB" && -n "$SPM_MODEL" ]] && die "--vocab-size does not apply with --spm-model/--dict"
VOCAB="${VOCAB:-$DEFAULT_VOCAB}"
DEST="$(abs_path "${DEST:-$CMASD_ROOT/data-bin/multi30k}")"
mkdir -p "$DEST/orig" "$DEST/raw"
log "Multi30k EN-DE -> $DEST"
steps_init "$DEST" "multi30k $(vocab_signature)"

if ! done_step fetch; then
  for name in "${UPSTREAM[@]}"; do
    for lang in "$SRC" "$TGT"; do
      fetch "$BASE_URL/$name.$lang.gz" "multi30k/$name.$lang.gz" "$DEST/orig/$name.$lang.gz"
    done
  done
  mark_done fetch
fi

if ! done_step normalize; then
  for i in "${!SPLITS[@]}"; do
    for lang in "$SRC" "$TGT"; do
      "${PREP[@]}" normalize "$DEST/orig/${UPSTREAM[$i]}.$lang.gz" "$DEST/raw/${SPLITS[$i]}.$lang"
      check_lines "$DEST/raw/${SPLITS[$i]}.$lang" "${EXPECTED[$i]}"
    done
  done
  mark_done normalize
fi

CLEAN=0
finish_recipe
log "done: $DEST (references: $DEST/raw/test.$TGT, $DEST/raw/valid.$TGT)"
