#!/usr/bin/env bash
# WMT14 English -> German for fairseq, with a joint sentencepiece vocabulary.
# Full recipe (statmt.org downloads, ~4.5M pairs) or --news (the WMT news test sets only).
# Run with --help for the options and the output layout.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SRC=en
TGT=de

# Full recipe: the corpora of fairseq's examples/translation/prepare-wmt14en2de.sh.
FULL_URLS=(
  "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz"
  "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz"
  "http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz"
  "http://data.statmt.org/wmt17/translation-task/dev.tgz"
  "http://statmt.org/wmt14/test-full.tgz"
)
FULL_MIRROR_DIR="wmt14-en-de"        # mirror layout for the archives: $CMASD_DATA_MIRROR/wmt14-en-de/<archive>
FULL_TRAIN=(                          # paths inside orig/ after extraction, without .LANG
  "training/europarl-v7.de-en"
  "commoncrawl.de-en"
  "training/news-commentary-v12.de-en"
)
FULL_VALID="dev/newstest2013"         # plain text, 3,000 lines
FULL_TEST_SRC="test-full/newstest2014-deen-src.en.sgm"   # newstest2014 "full", 3,003 lines
FULL_TEST_REF="test-full/newstest2014-deen-ref.de.sgm"

# --news: the WMT news test sets, as kept by OPUS-MT-testsets (and by the data mirror):
# NEWS_* in common.sh.
VALID_LINES=3000
TEST_LINES=3003

usage() {
  cat <<EOF
Usage: bash data-prep/prepare-wmt14-en-de.sh [--news] [options]

WMT14 EN-DE for fairseq with a joint sentencepiece vocabulary (no Moses tokenization, no BPE).

Full recipe (default; needs the internet, ~2.5 GB of downloads, hours of CPU):
  train  europarl v7 + commoncrawl + news-commentary v12 (4.5M pairs), filtered like
         clean-corpus-n: 1..250 pieces per side, length ratio <= 1.5
  valid  newstest2013 (3,000)      test  newstest2014 full (3,003, from test-full.tgz)
  from   ${FULL_URLS[*]}
  output $CMASD_ROOT/data-bin/wmt14-en-de, default --vocab-size 32000
  With CMASD_DATA_MIRROR set, the archives are read from \$CMASD_DATA_MIRROR/$FULL_MIRROR_DIR/.

--news: the WMT news test sets only (~28k training pairs; runs on a laptop):
  train  ${NEWS_TRAIN[*]}
         (same length filtering)
  valid  $NEWS_VALID               test  $NEWS_TEST (3,003: the paper's EN-DE test set)
  from   \$CMASD_DATA_MIRROR/$NEWS_MIRROR_DIR/NAME.{en,de}, else $NEWS_URL/NAME.{en,de}
  output $CMASD_ROOT/data-bin/wmt14-en-de-news, default --vocab-size 8000

Options:
  --news                  the news-only variant above
$COMMON_OPTIONS_HELP

Output (DIR):
  train|valid|test.en-de.{en,de}.{bin,idx}, dict.en.txt, dict.de.txt   fairseq data set
  spm.model, dict.txt (spm.vocab when trained here)                   the vocabulary
  raw/{train,valid,test}.{en,de}    normalized text; raw/test.de, raw/valid.de are the sacreBLEU
                                    references (raw/test.de = sacrebleu -t wmt14/full -l en-de)
  tok/*.{en,de}                     pieces (tok/train.unfiltered.* before length filtering)
  orig/                             downloads;  .done/  step markers
Reruns skip finished steps; changed options redo them.
Environment: CMASD_DATA_MIRROR (local mirror), CMASD_PYTHON (python with fairseq+sentencepiece).
EOF
}

NEWS=0
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --news) NEWS=1; shift ;;
    *) parse_common_option "$@"; shift "$CONSUMED" ;;
  esac
done
check_reuse_options "$SPM_MODEL" "$DICT_FILE"
[[ -n "$VOCAB" && -n "$SPM_MODEL" ]] && die "--vocab-size does not apply with --spm-model/--dict"
if (( NEWS )); then
  VARIANT=news; VOCAB="${VOCAB:-8000}"; DEFAULT_DEST="$CMASD_ROOT/data-bin/wmt14-en-de-news"
else
  VARIANT=full; VOCAB="${VOCAB:-32000}"; DEFAULT_DEST="$CMASD_ROOT/data-bin/wmt14-en-de"
  if [[ -n "${CMASD_DATA_MIRROR:-}" ]]; then
    rels=()
    for url in "${FULL_URLS[@]}"; do rels+=("$FULL_MIRROR_DIR/${url##*/}"); done
    mirror_has "${rels[@]}" || die "the full WMT14 recipe needs the statmt.org archives, and" \
      "CMASD_DATA_MIRROR=$CMASD_DATA_MIRROR does not hold them (expected ${rels[*]})." \
      "Use --news for the WMT news sets the mirror has, or unset CMASD_DATA_MIRROR to download."
  fi
fi
DEST="$(abs_path "${DEST:-$DEFAULT_DEST}")"
mkdir -p "$DEST/orig" "$DEST/raw"
log "WMT14 EN-DE ($VARIANT) -> $DEST"
steps_init "$DEST" "wmt14-en-de $VARIANT $(vocab_signature)"

# ------------------------------------------------------------------ full recipe

full_fetch() {
  local url file
  for url in "${FULL_URLS[@]}"; do
    file="${url##*/}"
    fetch "$url" "$FULL_MIRROR_DIR/$file" "$DEST/orig/$file"
  done
}

full_extract() {
  local url file corpus lang
  for url in "${FULL_URLS[@]}"; do
    file="${url##*/}"
    log "extract $file"
    tar -xzf "$DEST/orig/$file" -C "$DEST/orig"
  done
  for corpus in "${FULL_TRAIN[@]}" "$FULL_VALID"; do
    for lang in "$SRC" "$TGT"; do
      [[ -f "$DEST/orig/$corpus.$lang" ]] || die "archive layout changed? missing $DEST/orig/$corpus.$lang"
    done
  done
  for file in "$FULL_TEST_SRC" "$FULL_TEST_REF"; do
    [[ -f "$DEST/orig/$file" ]] || die "archive layout changed? missing $DEST/orig/$file"
  done
}

full_raw() {
  local corpus lang part
  mkdir -p "$DEST/raw/parts"
  for lang in "$SRC" "$TGT"; do : > "$DEST/raw/train.$lang.tmp"; done
  for corpus in "${FULL_TRAIN[@]}"; do
    part="$DEST/raw/parts/${corpus##*/}"
    for lang in "$SRC" "$TGT"; do
      # Web-crawled training text may hold a few invalid UTF-8 bytes: replaced, not fatal.
      "${PREP[@]}" normalize --errors replace "$DEST/orig/$corpus.$lang" "$part.$lang"
    done
    check_parallel "$part.$SRC" "$part.$TGT"
    for lang in "$SRC" "$TGT"; do cat "$part.$lang" >> "$DEST/raw/train.$lang.tmp"; done
  done
  for lang in "$SRC" "$TGT"; do mv "$DEST/raw/train.$lang.tmp" "$DEST/raw/train.$lang"; done
  rm -rf "$DEST/raw/parts"
  for lang in "$SRC" "$TGT"; do
    "${PREP[@]}" normalize "$DEST/orig/$FULL_VALID.$lang" "$DEST/raw/valid.$lang"
    check_lines "$DEST/raw/valid.$lang" "$VALID_LINES"
  done
  "${PREP[@]}" sgm-extract "$DEST/orig/$FULL_TEST_SRC" "$DEST/raw/test.$SRC"
  "${PREP[@]}" sgm-extract "$DEST/orig/$FULL_TEST_REF" "$DEST/raw/test.$TGT"
  check_lines "$DEST/raw/test.$SRC" "$TEST_LINES"
  check_lines "$DEST/raw/test.$TGT" "$TEST_LINES"
}

# ------------------------------------------------------------------ news variant

news_fetch() {
  local name lang
  for name in "${NEWS_TRAIN[@]}" "$NEWS_VALID" "$NEWS_TEST"; do
    for lang in "$SRC" "$TGT"; do
      fetch "$NEWS_URL/$name.$lang" "$NEWS_MIRROR_DIR/$name.$lang" "$DEST/orig/$name.$lang"
    done
  done
}

news_raw() {
  local name lang
  mkdir -p "$DEST/raw/parts"
  for lang in "$SRC" "$TGT"; do : > "$DEST/raw/train.$lang.tmp"; done
  for name in "${NEWS_TRAIN[@]}"; do
    for lang in "$SRC" "$TGT"; do
      "${PREP[@]}" normalize "$DEST/orig/$name.$lang" "$DEST/raw/parts/$name.$lang"
    done
    check_parallel "$DEST/raw/parts/$name.$SRC" "$DEST/raw/parts/$name.$TGT"
    for lang in "$SRC" "$TGT"; do cat "$DEST/raw/parts/$name.$lang" >> "$DEST/raw/train.$lang.tmp"; done
  done
  for lang in "$SRC" "$TGT"; do mv "$DEST/raw/train.$lang.tmp" "$DEST/raw/train.$lang"; done
  rm -rf "$DEST/raw/parts"
  for lang in "$SRC" "$TGT"; do
    "${PREP[@]}" normalize "$DEST/orig/$NEWS_VALID.$lang" "$DEST/raw/valid.$lang"
    check_lines "$DEST/raw/valid.$lang" "$VALID_LINES"
    "${PREP[@]}" normalize "$DEST/orig/$NEWS_TEST.$lang" "$DEST/raw/test.$lang"
    check_lines "$DEST/raw/test.$lang" "$TEST_LINES"
  done
}

# ------------------------------------------------------------------ run

if (( NEWS )); then
  if ! done_step fetch; then news_fetch; mark_done fetch; fi
  if ! done_step normalize; then news_raw; mark_done normalize; fi
else
  if ! done_step fetch; then full_fetch; mark_done fetch; fi
  if ! done_step extract; then full_extract; mark_done extract; fi
  if ! done_step normalize; then full_raw; mark_done normalize; fi
fi
log "training pairs before length filtering: $(line_count "$DEST/raw/train.$SRC")"

CLEAN=1
finish_recipe
log "done: $DEST (references: $DEST/raw/test.$TGT, $DEST/raw/valid.$TGT)"
