#!/usr/bin/env bash
# Monolingual English text for a fairseq language model (transformer_lm): CNN/DailyMail articles,
# Multi30k's English side or the WMT news test sets, a sentencepiece vocabulary, fairseq-preprocess
# --only-source, and held-out prompts. Run with --help for the options and the output layout.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

CORPORA=(cnndm multi30k-en news-en)
# cnndm: the mirror's partial CNN/DM (no upstream URL), field "src" (the article)
CNNDM_REL="cnndm-partial"
CNNDM_NAMES=(train val test)
CNNDM_EXPECTED=(39227 4368 4490)
# multi30k-en: Multi30k task 1's English side
MULTI30K_URL="https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
MULTI30K_NAMES=(train val test_2016_flickr)
MULTI30K_EXPECTED=(29000 1014 1000)
# news-en: the English side of the WMT news test sets (NEWS_* in common.sh, as
# prepare-wmt14-en-de.sh --news splits them)

SPLITS=(train valid test)
DEFAULT_MAX_TOKENS_PER_LINE=512
DEFAULT_PROMPT_WORDS=16
DEFAULT_MAX_PROMPTS=500

usage() {
  cat <<EOF
Usage: bash data-prep/prepare-lm.sh [--corpus cnndm|multi30k-en|news-en] [options]

Monolingual data for a fairseq language model (--task language_modeling, --arch transformer_lm):
one document or sentence a line, a sentencepiece vocabulary (trained on the train split, or
reused), fairseq-preprocess --only-source's binarization (cmasd-prep binarize, byte for byte;
CMASD_BINARIZER=fairseq-preprocess runs fairseq's), and prompts held out from the test split for
continuing (fairseq-interactive, cmasd-bench).  Train on it with data-prep/train-lm.sh.

Corpora (--corpus):
  cnndm (default)  CNN/DailyMail articles, one a line (the "src" field; lowercased and
                   PTB-tokenized, See et al. 2017): train 39,227 / valid 4,368 / test 4,490
                   articles (67 empty training articles dropped).  Reads
                   \$CMASD_DATA_MIRROR/$CNNDM_REL/{train,val,test}.jsonl.gz; there is no upstream
                   URL (the mirror decoded them from tf.Example files): needs CMASD_DATA_MIRROR.
                   Default --vocab-size 8000.
  multi30k-en      Multi30k task 1's English captions, one a line: train 29,000 / valid
                   (val) 1,014 / test (test_2016_flickr) 1,000: small, for tests and quick
                   runs.  From $MULTI30K_URL/NAME.en.gz
                   or \$CMASD_DATA_MIRROR/multi30k/NAME.en.gz.  Default --vocab-size 4000.
  news-en          the English side of the WMT news test sets, one sentence a line: train
                   ${NEWS_TRAIN[*]}
                   (about 28k sentences), valid $NEWS_VALID, test $NEWS_TEST (3,003).  From
                   $NEWS_URL/NAME.en
                   or \$CMASD_DATA_MIRROR/$NEWS_MIRROR_DIR/NAME.en.  Default --vocab-size 8000.

Options:
  --corpus NAME            cnndm, multi30k-en or news-en (above; default cnndm)
  --dest DIR               output directory (default $CMASD_ROOT/data-bin/lm-CORPUS;
                           relative paths are taken from the current directory)
  --max-lines N            keep the first N (non-empty) lines of each split: tests, quick runs
  --max-tokens-per-line N  cut every encoded line to its first N pieces (default
                           $DEFAULT_MAX_TOKENS_PER_LINE; in an 8,000-piece vocabulary CNN/DM's first 2,000
                           training articles average 930 pieces, 81% more than 512); the raw
                           text in DIR/raw/ stays whole
  --vocab-size N           sentencepiece (unigram) vocabulary trained on the train split
                           (integer >= 100; default per corpus, above)
  --spm-model PATH         reuse this sentencepiece model ...
  --dict PATH              ... with this fairseq dictionary (both or neither; copied into DIR
                           as spm.model and dict.txt): the vocabulary of an existing model
  --prompt-words N         a prompt is the first N words of a test document (default
                           $DEFAULT_PROMPT_WORDS); documents of at most N words give none
  --max-prompts N          at most N prompts, from the first test documents (default $DEFAULT_MAX_PROMPTS)
  --workers N              fairseq-preprocess workers, with CMASD_BINARIZER=fairseq-preprocess (default 2)
  -h, --help               this help

Output (DIR):
  {train,valid,test}.{bin,idx}, dict.txt    fairseq-preprocess --only-source (dict.txt is the
                                            vocabulary's, with every piece)
  spm.model (spm.vocab when trained here)   the sentencepiece model
  raw/{train,valid,test}.txt    the text, whitespace normalized, one document or sentence a line
  tok/{train,valid,test}.txt    its pieces, at most --max-tokens-per-line a line
  prompts/test.txt              the prompts, raw text, one a line (first --prompt-words words)
  prompts/test.tok              the same prompts in pieces (fairseq-interactive input without
                                --bpe; or with --bpe sentencepiece, give prompts/test.txt)
  prompts/test.lines            the test line (1-based, in raw/test.txt) each prompt comes from
  orig/                         the fetched files (not for cnndm, read in the mirror);  .done/  step markers
Reruns skip finished steps; changed options redo them (the prompt options redo the prompts only).
Environment: CMASD_DATA_MIRROR (local mirror), CMASD_PYTHON (python with fairseq+sentencepiece).
EOF
}

CORPUS=cnndm
MAX_LINES=""
MAX_TOKENS_PER_LINE="$DEFAULT_MAX_TOKENS_PER_LINE"
PROMPT_WORDS="$DEFAULT_PROMPT_WORDS"
MAX_PROMPTS="$DEFAULT_MAX_PROMPTS"
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --corpus|--corpus=*) _opt_value --corpus "$@"; CORPUS="$OPT_VALUE"; shift "$CONSUMED" ;;
    --max-lines|--max-lines=*)
      _opt_value --max-lines "$@"; MAX_LINES="$OPT_VALUE"; shift "$CONSUMED"; positive_int --max-lines "$MAX_LINES" ;;
    --max-tokens-per-line|--max-tokens-per-line=*)
      _opt_value --max-tokens-per-line "$@"; MAX_TOKENS_PER_LINE="$OPT_VALUE"; shift "$CONSUMED"
      positive_int --max-tokens-per-line "$MAX_TOKENS_PER_LINE" ;;
    --prompt-words|--prompt-words=*)
      _opt_value --prompt-words "$@"; PROMPT_WORDS="$OPT_VALUE"; shift "$CONSUMED"
      positive_int --prompt-words "$PROMPT_WORDS" ;;
    --max-prompts|--max-prompts=*)
      _opt_value --max-prompts "$@"; MAX_PROMPTS="$OPT_VALUE"; shift "$CONSUMED"
      positive_int --max-prompts "$MAX_PROMPTS" ;;
    --extra-test) die "--extra-test is for parallel data; a language model's test split is --corpus's own" ;;
    *) parse_common_option "$@"; shift "$CONSUMED" ;;
  esac
done
case "$CORPUS" in
  cnndm|news-en) DEFAULT_VOCAB=8000 ;;
  multi30k-en) DEFAULT_VOCAB=4000 ;;
  *) die "unknown --corpus '$CORPUS': use ${CORPORA[*]} (see --help)" ;;
esac
check_reuse_options "$SPM_MODEL" "$DICT_FILE"
[[ -n "$VOCAB" && -n "$SPM_MODEL" ]] && die "--vocab-size does not apply with --spm-model/--dict"
VOCAB="${VOCAB:-$DEFAULT_VOCAB}"
if [[ "$CORPUS" == cnndm ]]; then
  [[ -n "${CMASD_DATA_MIRROR:-}" ]] || die "--corpus cnndm reads \$CMASD_DATA_MIRROR/$CNNDM_REL:" \
    "set CMASD_DATA_MIRROR (the partial CNN/DM has no upstream URL)"
  for name in "${CNNDM_NAMES[@]}"; do
    [[ -f "$CMASD_DATA_MIRROR/$CNNDM_REL/$name.jsonl.gz" ]] \
      || die "missing mirror file $CMASD_DATA_MIRROR/$CNNDM_REL/$name.jsonl.gz (CMASD_DATA_MIRROR=$CMASD_DATA_MIRROR)"
  done
fi
DEST="$(abs_path "${DEST:-$CMASD_ROOT/data-bin/lm-$CORPUS}")"
DEST="${DEST%/}"
mkdir -p "$DEST/orig" "$DEST/raw" "$DEST/tok" "$DEST/prompts"
log "language-model data, $CORPUS -> $DEST"
steps_init "$DEST" "lm $CORPUS max-lines=${MAX_LINES:-all} max-tokens-per-line=$MAX_TOKENS_PER_LINE $(vocab_signature)"

# ------------------------------------------------------------------ fetch: DEST/orig

if ! done_step fetch; then
  case "$CORPUS" in
    cnndm) ;;  # read from the mirror where it lies (checked above), as prepare-cnndm.sh reads it
    multi30k-en)
      for name in "${MULTI30K_NAMES[@]}"; do
        fetch "$MULTI30K_URL/$name.en.gz" "multi30k/$name.en.gz" "$DEST/orig/$name.en.gz"
      done ;;
    news-en)
      for name in "${NEWS_TRAIN[@]}" "$NEWS_VALID" "$NEWS_TEST"; do
        fetch "$NEWS_URL/$name.en" "$NEWS_MIRROR_DIR/$name.en" "$DEST/orig/$name.en"
      done ;;
  esac
  mark_done fetch
fi

# ------------------------------------------------------------------ raw text: DEST/raw/SPLIT.txt

# keep_lines IN OUT: the non-empty lines of IN, at most --max-lines of them, to OUT
# (grep's "|| true": it finds no line, or head stops reading before grep has written all)
keep_lines() {
  local in="$1" out="$2"
  if [[ -n "$MAX_LINES" ]]; then
    { grep -v '^$' "$in" || true; } | head -n "$MAX_LINES" > "$out.part"
  else
    { grep -v '^$' "$in" || true; } > "$out.part"
  fi
  [[ -s "$out.part" ]] || { rm -f "$out.part"; die "no text in $in"; }
  mv "$out.part" "$out"
}

if ! done_step raw; then
  work="$DEST/raw/.work"
  rm -rf "$work"
  mkdir -p "$work"
  for i in "${!SPLITS[@]}"; do
    split="${SPLITS[$i]}"
    case "$CORPUS" in
      cnndm)
        # the article ("src"), whitespace normalized; the highlights are not used
        "${PREP[@]}" summ-split --expect "${CNNDM_EXPECTED[$i]}" \
          "$CMASD_DATA_MIRROR/$CNNDM_REL/${CNNDM_NAMES[$i]}.jsonl.gz" "$work/$split"
        keep_lines "$work/$split.src" "$DEST/raw/$split.txt" ;;
      multi30k-en)
        "${PREP[@]}" normalize "$DEST/orig/${MULTI30K_NAMES[$i]}.en.gz" "$work/$split.txt"
        check_lines "$work/$split.txt" "${MULTI30K_EXPECTED[$i]}"
        keep_lines "$work/$split.txt" "$DEST/raw/$split.txt" ;;
      news-en)
        case "$split" in
          train) names=("${NEWS_TRAIN[@]}") ;;
          valid) names=("$NEWS_VALID") ;;
          test) names=("$NEWS_TEST") ;;
        esac
        : > "$work/$split.txt"
        for name in "${names[@]}"; do
          "${PREP[@]}" normalize "$DEST/orig/$name.en" "$work/$name.en"
          cat "$work/$name.en" >> "$work/$split.txt"
        done
        [[ "$split" == test ]] && check_lines "$work/$split.txt" "$NEWS_TEST_LINES"
        keep_lines "$work/$split.txt" "$DEST/raw/$split.txt" ;;
    esac
    log "$split: $(line_count "$DEST/raw/$split.txt") lines"
  done
  rm -rf "$work"
  mark_done raw
fi

# ------------------------------------------------------------------ vocabulary, pieces, binaries

if ! done_step vocab; then
  # CNN/DM articles are long: let sentencepiece see them whole, on a sample of lines
  prepare_vocab "$DEST" "$VOCAB" "$SPM_MODEL" "$DICT_FILE" "$DEST/raw/train.txt" \
    --max-sentence-length 20000 --input-sentence-size 200000
  mark_done vocab
fi

if ! done_step encode; then
  for split in "${SPLITS[@]}"; do
    "${PREP[@]}" spm-encode --model "$DEST/spm.model" --max-tokens "$MAX_TOKENS_PER_LINE" \
      "$DEST/raw/$split.txt" "$DEST/tok/$split.txt"
  done
  mark_done encode
fi

if ! done_step binarize; then
  rm -f "$DEST"/*.bin "$DEST"/*.idx
  binarizer "$WORKERS"
  # --srcdict is DEST/dict.txt itself: the binarizer reads it, then writes it back unchanged
  "${BINARIZE_CMD[@]}" --only-source --trainpref "$DEST/tok/train.txt" --validpref "$DEST/tok/valid.txt" \
    --testpref "$DEST/tok/test.txt" --destdir "$DEST" --srcdict "$DEST/dict.txt"
  mark_done binarize
fi

# ------------------------------------------------------------------ prompts: DEST/prompts

PROMPT_SIG="prompt-words=$PROMPT_WORDS max-prompts=$MAX_PROMPTS"
if ! done_step prompts "$PROMPT_SIG"; then
  # the first PROMPT_WORDS words of each test document that has more, and its line number
  LC_ALL=C awk -v words="$PROMPT_WORDS" -v most="$MAX_PROMPTS" \
    -v lines="$DEST/prompts/test.lines.part" '
    NF > words {
      out = $1
      for (i = 2; i <= words; i++) out = out " " $i
      print out
      print NR > lines
      if (++n >= most) exit
    }' "$DEST/raw/test.txt" > "$DEST/prompts/test.txt.part"
  [[ -s "$DEST/prompts/test.txt.part" ]] \
    || die "no test document of $DEST/raw/test.txt has more than $PROMPT_WORDS words: give a smaller --prompt-words"
  mv "$DEST/prompts/test.lines.part" "$DEST/prompts/test.lines"
  mv "$DEST/prompts/test.txt.part" "$DEST/prompts/test.txt"
  "${PREP[@]}" spm-encode --model "$DEST/spm.model" "$DEST/prompts/test.txt" "$DEST/prompts/test.tok"
  check_parallel "$DEST/prompts/test.txt" "$DEST/prompts/test.tok"
  mark_done prompts "$PROMPT_SIG"
fi
log "prompts: $(line_count "$DEST/prompts/test.txt") from the test split ($PROMPT_SIG)"

summarize "$DEST"
log "done: $DEST (train a language model on it: bash data-prep/train-lm.sh $DEST cpu)"
