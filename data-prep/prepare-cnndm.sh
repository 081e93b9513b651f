#!/usr/bin/env bash
# CNN/DailyMail summarization (article -> highlights) for fairseq, joint sentencepiece vocabulary.
# Full data from a local directory in the fairseq/BART layout, --mirror-partial (39k training
# articles of the offline mirror) or --mirror-sample (443 test articles).
# Run with --help for the options and the output layout.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SRC=src
TGT=tgt
SAMPLE_REL="cnndm-sample/cnndm.jsonl"
PARTIAL_REL="cnndm-partial"
# fairseq split <- the partial mirror's file, and the articles each must hold
PARTIAL_SPLITS=(train valid test)
PARTIAL_NAMES=(train val test)
PARTIAL_EXPECTED=(39227 4368 4490)
DEFAULT_MAX_SOURCE_TOKENS=400
LEAD=3

usage() {
  cat <<EOF
Usage: bash data-prep/prepare-cnndm.sh --input-dir DIR [options]
       bash data-prep/prepare-cnndm.sh --mirror-partial [options]
       bash data-prep/prepare-cnndm.sh --mirror-sample --spm-model PATH --dict PATH [options]

CNN/DailyMail for fairseq: source language "src" (the article), target "tgt" (the highlights).
Every encoded source line is cut to --max-source-tokens pieces; targets are not cut.

Full data (--input-dir DIR): there is no stable single-file download of the untokenized data, so
this recipe reads the layout used by fairseq's BART example:
  DIR/{train,val,test}.source   one article per line      (287,113 / 13,368 / 11,490 lines)
  DIR/{train,val,test}.target   its highlights, one line  (same counts)
  mapped to raw/{train,valid,test}.{src,tgt} (val -> valid; whitespace normalized, every line
  kept, empty articles included, as fairseq's BART recipe keeps them); the references of
  valid/test are the .target lines cut into sentences by rule (cmasd-prep's split_sentences:
  after . ! or ?), since one line per article has lost the highlights' own line breaks.
Make it with https://github.com/abisee/cnn-dailymail (the BART README's instructions), or from the
Hugging Face dataset "abisee/cnn_dailymail" (config 3.0.0), e.g.:
  python -c "import datasets; d = datasets.load_dataset('abisee/cnn_dailymail', '3.0.0')
  for s, n in [('train','train'), ('validation','val'), ('test','test')]:
      with open(n + '.source', 'w') as a, open(n + '.target', 'w') as h:
          for r in d[s]: a.write(' '.join(r['article'].split()) + '\n'); h.write(' '.join(r['highlights'].split()) + '\n')"
  output $CMASD_ROOT/data-bin/cnndm, joint vocabulary of --vocab-size pieces (default 32000) trained
  on a 200,000-line sample of train.source + train.target, or reused with --spm-model/--dict.

--mirror-partial: \$CMASD_DATA_MIRROR/$PARTIAL_REL/{train,val,test}.jsonl.gz, a part of
  CNN/DM as See et al. (2017) processed it (lowercased, PTB-tokenized; fields id, src, tgt,
  tgt_sents): train 39,227 (the first articles of the standard order) / valid 4,368 / test 4,490
  (the first 4,000 and the last 490 of the 11,490 test articles: scores are not comparable with
  full-test figures; report the Lead-3 row, raw/test.lead3, beside a model).  Text is taken as
  it is but for whitespace; every record is kept (67 training articles are empty, kept as the
  full data keeps its own); references are the highlight sentences (tgt_sents), one per line.
  No upstream URL (the mirror decoded them from pointer-generator tf.Example files): needs
  CMASD_DATA_MIRROR.  Joint vocabulary of --vocab-size pieces (default 16000) trained on the
  train split (about 90 s on 2 cores), or reused with --spm-model/--dict.
  Output $CMASD_ROOT/data-bin/cnndm-partial.

--mirror-sample: \$CMASD_DATA_MIRROR/$SAMPLE_REL (443 CNN/DM test articles with 1 to 11
  references each; or --jsonl PATH, same fields: article, refs), all of it as the test split.
  Too small to train on, so --spm-model and --dict (the vocabulary of the model to evaluate)
  are required.  Output $CMASD_ROOT/data-bin/cnndm-sample (test split only).

Options:
  --input-dir DIR          full data, layout above
  --mirror-partial         the partial data above
  --mirror-sample          the sample above
  --jsonl PATH             with --mirror-sample: read this jsonl instead of the mirror's
  --max-source-tokens N    keep at most N source pieces (default $DEFAULT_MAX_SOURCE_TOKENS)
  --with-summary-denoising full or partial data: add to train one pair per training summary:
                           the highlights with about 30% of their words deleted in spans of
                           about 3 words -> the highlights (as prepare-samsum.sh's option: a
                           copy task for a model trained from scratch; docs/RESULTS.md).  valid
                           and test are unchanged; the vocabulary is trained on the plain pairs.
                           "-denoise" is appended to the default output directory.
  --dest DIR               output directory (relative paths are taken from the current directory)
  --vocab-size N           full or partial data: joint sentencepiece vocabulary size (integer
                           >= 100; default 32000 full, 16000 partial)
  --spm-model PATH         reuse this sentencepiece model ...
  --dict PATH              ... and fairseq dictionary (both or neither)
  --workers N              fairseq-preprocess workers, with CMASD_BINARIZER=fairseq-preprocess (default 2)
  -h, --help               this help

Output (DIR):
  {train,valid,}test.src-tgt.{src,tgt}.{bin,idx}, dict.src.txt, dict.tgt.txt   fairseq data set
  spm.model, dict.txt (spm.vocab when trained here)
  raw/SPLIT.src, raw/SPLIT.tgt    normalized article / first reference, one per line
  raw/test.refs.jsonl (and raw/valid.refs.jsonl)   all references of each article as a JSON
                                  list (several for the sample), each with its sentences
                                  separated by "\n" (as rouge-score's rougeLsum reads them)
  raw/test.lead3                  Lead-3: the first $LEAD sentences of each article (full text,
                                  before truncation), joined by spaces, one per line
  tok/SPLIT.{src,tgt}             pieces (sources already truncated; with --with-summary-denoising,
                                  tok/train.plain.{src,tgt} holds train without the added pairs)
Reruns skip finished steps; changed options redo them.
Environment: CMASD_DATA_MIRROR (local mirror), CMASD_PYTHON (python with fairseq+sentencepiece).
EOF
}

MODE=""
INPUT_DIR=""
JSONL=""
DENOISE_RATIO=""
SRC_MAX_TOKENS="$DEFAULT_MAX_SOURCE_TOKENS"
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --mirror-sample|--mirror-partial)
      mode="${1#--mirror-}"
      [[ -z "$MODE" || "$MODE" == "$mode" ]] || die "--mirror-sample and --mirror-partial exclude each other"
      MODE="$mode"; shift ;;
    --input-dir|--input-dir=*) _opt_value --input-dir "$@"; INPUT_DIR="$(abs_path "$OPT_VALUE")"; shift "$CONSUMED" ;;
    --with-summary-denoising) DENOISE_RATIO="$SUMMARY_DENOISE_RATIO"; shift ;;
    --jsonl|--jsonl=*) _opt_value --jsonl "$@"; JSONL="$(abs_path "$OPT_VALUE")"; shift "$CONSUMED" ;;
    --max-source-tokens|--max-source-tokens=*)
      _opt_value --max-source-tokens "$@"; SRC_MAX_TOKENS="$OPT_VALUE"; shift "$CONSUMED"
      positive_int --max-source-tokens "$SRC_MAX_TOKENS" ;;
    --extra-test) die "--extra-test is not supported by the CNN/DM recipe" ;;
    *) parse_common_option "$@"; shift "$CONSUMED" ;;
  esac
done
check_reuse_options "$SPM_MODEL" "$DICT_FILE"
[[ -n "$VOCAB" && -n "$SPM_MODEL" ]] && die "--vocab-size does not apply with --spm-model/--dict"

if [[ "$MODE" == sample ]]; then
  [[ -z "$INPUT_DIR" ]] || die "--input-dir and --mirror-sample exclude each other"
  [[ -z "$DENOISE_RATIO" ]] || die "--with-summary-denoising adds training pairs: the sample has" \
    "no training split (use it with --mirror-partial or --input-dir)"
  [[ -n "$SPM_MODEL" ]] || die "--mirror-sample needs --spm-model and --dict: the 443-article sample" \
    "is a test set, too small to train a vocabulary on"
  [[ -z "$VOCAB" ]] || die "--vocab-size does not apply to --mirror-sample"
  if [[ -z "$JSONL" ]]; then
    [[ -n "${CMASD_DATA_MIRROR:-}" ]] || die "--mirror-sample reads \$CMASD_DATA_MIRROR/$SAMPLE_REL:" \
      "set CMASD_DATA_MIRROR (the sample has no single upstream URL), or give --jsonl PATH"
    JSONL="$CMASD_DATA_MIRROR/$SAMPLE_REL"
    [[ -f "$JSONL" ]] || die "missing mirror file $JSONL (CMASD_DATA_MIRROR=$CMASD_DATA_MIRROR)"
  fi
  [[ -f "$JSONL" ]] || die "--jsonl: file not found: $JSONL"
  DEFAULT_DEST="$CMASD_ROOT/data-bin/cnndm-sample"
elif [[ "$MODE" == partial ]]; then
  [[ -z "$INPUT_DIR" ]] || die "--input-dir and --mirror-partial exclude each other"
  [[ -z "$JSONL" ]] || die "--jsonl goes with --mirror-sample"
  [[ -n "${CMASD_DATA_MIRROR:-}" ]] || die "--mirror-partial reads \$CMASD_DATA_MIRROR/$PARTIAL_REL:" \
    "set CMASD_DATA_MIRROR (the partial data has no upstream URL; for the full data see --input-dir)"
  for name in "${PARTIAL_NAMES[@]}"; do
    [[ -f "$CMASD_DATA_MIRROR/$PARTIAL_REL/$name.jsonl.gz" ]] \
      || die "missing mirror file $CMASD_DATA_MIRROR/$PARTIAL_REL/$name.jsonl.gz (CMASD_DATA_MIRROR=$CMASD_DATA_MIRROR)"
  done
  VOCAB="${VOCAB:-16000}"
  DEFAULT_DEST="$CMASD_ROOT/data-bin/cnndm-partial"
else
  [[ -z "$JSONL" ]] || die "--jsonl goes with --mirror-sample"
  [[ -n "$INPUT_DIR" ]] || die "give --input-dir DIR (train/val/test .source/.target files)," \
    "--mirror-partial or --mirror-sample; see --help"
  [[ -d "$INPUT_DIR" ]] || die "--input-dir: not a directory: $INPUT_DIR"
  for split in train val test; do
    for side in source target; do
      [[ -f "$INPUT_DIR/$split.$side" ]] || die "--input-dir: missing $INPUT_DIR/$split.$side"
    done
  done
  MODE=full
  VOCAB="${VOCAB:-32000}"
  DEFAULT_DEST="$CMASD_ROOT/data-bin/cnndm"
fi
[[ -n "$DENOISE_RATIO" ]] && DEFAULT_DEST+=-denoise
DEST="$(abs_path "${DEST:-$DEFAULT_DEST}")"
mkdir -p "$DEST/raw"
TITLE="CNN/DailyMail ($MODE)"
[[ -n "$DENOISE_RATIO" ]] && TITLE+=" + summary denoising pairs"
log "$TITLE -> $DEST"
# (denoise= only when asked: data sets made before the option keep their signature)
steps_init "$DEST" "cnndm $MODE${DENOISE_RATIO:+ denoise=$DENOISE_RATIO} max-source-tokens=$SRC_MAX_TOKENS $(vocab_signature)"

if [[ "$MODE" == sample ]]; then
  if ! done_step split; then
    "${PREP[@]}" cnndm-split "$JSONL" "$DEST/raw/test"
    check_parallel "$DEST/raw/test.$SRC" "$DEST/raw/test.$TGT"
    mark_done split
  fi
elif [[ "$MODE" == partial ]]; then
  if ! done_step split; then
    for i in "${!PARTIAL_SPLITS[@]}"; do
      split="${PARTIAL_SPLITS[$i]}"
      refs=(--refs)
      [[ "$split" == train ]] && refs=()
      "${PREP[@]}" summ-split ${refs[@]+"${refs[@]}"} --expect "${PARTIAL_EXPECTED[$i]}" \
        "$CMASD_DATA_MIRROR/$PARTIAL_REL/${PARTIAL_NAMES[$i]}.jsonl.gz" "$DEST/raw/$split"
      check_lines "$DEST/raw/$split.$SRC" "${PARTIAL_EXPECTED[$i]}"
      check_parallel "$DEST/raw/$split.$SRC" "$DEST/raw/$split.$TGT"
    done
    mark_done split
  fi
  # Articles are long: let sentencepiece see them whole (all 78,454 lines fit the sample).
  SPM_TRAIN_ARGS=(--max-sentence-length 20000 --input-sentence-size 200000)
else
  if ! done_step normalize; then
    for split in train val test; do
      name="$split"; [[ "$split" == val ]] && name=valid
      "${PREP[@]}" normalize "$INPUT_DIR/$split.source" "$DEST/raw/$name.$SRC"
      "${PREP[@]}" normalize "$INPUT_DIR/$split.target" "$DEST/raw/$name.$TGT"
      check_parallel "$DEST/raw/$name.$SRC" "$DEST/raw/$name.$TGT"
    done
    mark_done normalize
  fi
  # A step of its own: a data set made before references were split into sentences gets them.
  if ! done_step refs; then
    for name in valid test; do
      "${PREP[@]}" refs-jsonl --split-sentences "$DEST/raw/$name.$TGT" "$DEST/raw/$name.refs.jsonl"
    done
    mark_done refs
  fi
  # Articles are long: let sentencepiece see them whole, on a sample of lines.
  SPM_TRAIN_ARGS=(--max-sentence-length 20000 --input-sentence-size 200000)
fi

if ! done_step lead; then
  "${PREP[@]}" lead --sentences "$LEAD" "$DEST/raw/test.$SRC" "$DEST/raw/test.lead$LEAD"
  mark_done lead
fi

# No ratio or length filter (CLEAN=0): highlights are far shorter than their articles.
CLEAN=0
finish_recipe
log "done: $DEST (references for rouge-score: $DEST/raw/test.refs.jsonl; first reference:" \
  "$DEST/raw/test.$TGT; Lead-$LEAD: $DEST/raw/test.lead$LEAD)"
