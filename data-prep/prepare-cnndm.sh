#!/usr/bin/env bash
# CNN/DailyMail summarization (article -> highlights) for fairseq, joint sentencepiece vocabulary.
# Full data from a local directory in the fairseq/BART layout, or --mirror-sample (443 test articles).
# Run with --help for the options and the output layout.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SRC=src
TGT=tgt
SAMPLE_REL="cnndm-sample/cnndm.jsonl"
DEFAULT_MAX_SOURCE_TOKENS=400

usage() {
  cat <<EOF
Usage: bash data-prep/prepare-cnndm.sh --input-dir DIR [options]
       bash data-prep/prepare-cnndm.sh --mirror-sample --spm-model PATH --dict PATH [options]

CNN/DailyMail for fairseq: source language "src" (the article), target "tgt" (the highlights).
Every encoded source line is cut to --max-source-tokens pieces; targets are not cut.

Full data (--input-dir DIR): there is no stable single-file download of the untokenized data, so
this recipe reads the layout used by fairseq's BART example:
  DIR/{train,val,test}.source   one article per line      (287,113 / 13,368 / 11,490 lines)
  DIR/{train,val,test}.target   its highlights, one line  (same counts)
Make it with https://github.com/abisee/cnn-dailymail (the BART README's instructions), or from the
Hugging Face dataset "abisee/cnn_dailymail" (config 3.0.0), e.g.:
  python -c "import datasets; d = datasets.load_dataset('abisee/cnn_dailymail', '3.0.0')
  for s, n in [('train','train'), ('validation','val'), ('test','test')]:
      with open(n + '.source', 'w') as a, open(n + '.target', 'w') as h:
          for r in d[s]: a.write(' '.join(r['article'].split()) + '\n'); h.write(' '.join(r['highlights'].split()) + '\n')"
  output $CMASD_ROOT/data-bin/cnndm, joint vocabulary of --vocab-size pieces (default 32000) trained
  on a 200,000-line sample of train.source + train.target, or reused with --spm-model/--dict.

--mirror-sample: \$CMASD_DATA_MIRROR/$SAMPLE_REL (443 CNN/DM test articles with 1 to 11
  references each; or --jsonl PATH, same fields: article, refs), all of it as the test split.
  Too small to train on, so --spm-model and --dict (the vocabulary of the model to evaluate)
  are required.  Output $CMASD_ROOT/data-bin/cnndm-sample (test split only).

Options:
  --input-dir DIR          full data, layout above
  --mirror-sample          the sample above
  --jsonl PATH             with --mirror-sample: read this jsonl instead of the mirror's
  --max-source-tokens N    keep at most N source pieces (default $DEFAULT_MAX_SOURCE_TOKENS)
  --dest DIR               output directory (relative paths are taken from the current directory)
  --vocab-size N           full data: joint sentencepiece vocabulary size (integer >= 100)
  --spm-model PATH         reuse this sentencepiece model ...
  --dict PATH              ... and fairseq dictionary (both or neither)
  --workers N              fairseq-preprocess workers (default 2)
  -h, --help               this help

Output (DIR):
  {train,valid,}test.src-tgt.{src,tgt}.{bin,idx}, dict.src.txt, dict.tgt.txt   fairseq data set
  spm.model, dict.txt (spm.vocab when trained here)
  raw/SPLIT.src, raw/SPLIT.tgt    normalized article / first reference, one per line
  raw/test.refs.jsonl (and raw/valid.refs.jsonl)   all references of each article as a JSON
                                  list, as published: the references for rouge-score
  tok/SPLIT.{src,tgt}             pieces (sources already truncated)
Reruns skip finished steps; changed options redo them.
Environment: CMASD_DATA_MIRROR (local mirror), CMASD_PYTHON (python with fairseq+sentencepiece).
EOF
}

MODE=""
INPUT_DIR=""
JSONL=""
SRC_MAX_TOKENS="$DEFAULT_MAX_SOURCE_TOKENS"
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --mirror-sample) MODE=sample; shift ;;
    --input-dir|--input-dir=*) _opt_value --input-dir "$@"; INPUT_DIR="$(abs_path "$OPT_VALUE")"; shift "$CONSUMED" ;;
    --jsonl|--jsonl=*) _opt_value --jsonl "$@"; JSONL="$(abs_path "$OPT_VALUE")"; shift "$CONSUMED" ;;
    --max-source-tokens|--max-source-tokens=*)
      _opt_value --max-source-tokens "$@"; SRC_MAX_TOKENS="$OPT_VALUE"; shift "$CONSUMED"
      [[ "$SRC_MAX_TOKENS" =~ ^[1-9][0-9]*$ ]] \
        || die "bad --max-source-tokens '$SRC_MAX_TOKENS': expected a positive integer" ;;
    --extra-test) die "--extra-test is not supported by the CNN/DM recipe" ;;
    *) parse_common_option "$@"; shift "$CONSUMED" ;;
  esac
done
check_reuse_options "$SPM_MODEL" "$DICT_FILE"
[[ -n "$VOCAB" && -n "$SPM_MODEL" ]] && die "--vocab-size does not apply with --spm-model/--dict"

if [[ "$MODE" == sample ]]; then
  [[ -z "$INPUT_DIR" ]] || die "--input-dir and --mirror-sample exclude each other"
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
else
  [[ -z "$JSONL" ]] || die "--jsonl goes with --mirror-sample"
  [[ -n "$INPUT_DIR" ]] || die "give --input-dir DIR (train/val/test .source/.target files) or" \
    "--mirror-sample; see --help"
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
DEST="$(abs_path "${DEST:-$DEFAULT_DEST}")"
mkdir -p "$DEST/raw"
log "CNN/DailyMail ($MODE) -> $DEST"
steps_init "$DEST" "cnndm $MODE max-source-tokens=$SRC_MAX_TOKENS $(vocab_signature)"

if [[ "$MODE" == sample ]]; then
  if ! done_step split; then
    "${PREP[@]}" cnndm-split "$JSONL" "$DEST/raw/test"
    check_parallel "$DEST/raw/test.$SRC" "$DEST/raw/test.$TGT"
    mark_done split
  fi
else
  if ! done_step normalize; then
    for split in train val test; do
      name="$split"; [[ "$split" == val ]] && name=valid
      "${PREP[@]}" normalize "$INPUT_DIR/$split.source" "$DEST/raw/$name.$SRC"
      "${PREP[@]}" normalize "$INPUT_DIR/$split.target" "$DEST/raw/$name.$TGT"
      check_parallel "$DEST/raw/$name.$SRC" "$DEST/raw/$name.$TGT"
    done
    for name in valid test; do
      "${PREP[@]}" refs-jsonl "$DEST/raw/$name.$TGT" "$DEST/raw/$name.refs.jsonl"
    done
    mark_done normalize
  fi
  # Articles are long: let sentencepiece see them whole, on a sample of lines.
  SPM_TRAIN_ARGS=(--max-sentence-length 20000 --input-sentence-size 200000)
fi

CLEAN=0
finish_recipe
log "done: $DEST (references for rouge-score: $DEST/raw/test.refs.jsonl; first reference: $DEST/raw/test.$TGT)"
