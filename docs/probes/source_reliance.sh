#!/usr/bin/env bash
# How much a summarizer (or any verifier) reads its source: fairseq-validate's loss on one split
# with each example's own source, and again with every source moved one example on (target i
# paired with source i+1).  A model that ignores its source scores the same on both; the gap,
# in bits per target token, is what the source is worth to it.
#   bash docs/probes/source_reliance.sh DATA CHECKPOINT [SPLIT (default valid)]
# DATA is a fairseq-preprocess directory with tok/SPLIT.src and tok/SPLIT.tgt (the sentencepiece
# pieces of prepare-samsum.sh / prepare-cnndm.sh) and dict.txt.
set -euo pipefail
DATA="$1" CKPT="$2" SPLIT="${3:-valid}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
awk 'NR == 1 { first = $0; next } { print } END { print first }' "$DATA/tok/$SPLIT.src" > "$WORK/rot.src"
cp "$DATA/tok/$SPLIT.tgt" "$WORK/rot.tgt"
fairseq-preprocess --source-lang src --target-lang tgt --validpref "$WORK/rot" \
  --srcdict "$DATA/dict.txt" --tgtdict "$DATA/dict.txt" --destdir "$WORK/bin" --workers 1 \
  > "$WORK/preprocess.log" 2>&1 || { tail -5 "$WORK/preprocess.log" >&2; echo "fairseq-preprocess failed" >&2; exit 1; }
cp "$DATA/dict.txt" "$WORK/bin/dict.txt"
# validate DATA SUBSET NAME: prints "NAME | loss L | nll_loss N", or stops with fairseq's last lines
validate() {
  fairseq-validate "$1" --user-dir "$ROOT/fairseq_plugins" --task translation_speculative \
    --path "$CKPT" --valid-subset "$2" --max-tokens 8192 --cpu > "$WORK/validate.log" 2>&1 || true
  local scores
  scores="$(grep -o '| loss [0-9.]* | nll_loss [0-9.]*' "$WORK/validate.log" | tail -1 || true)"
  [[ -n "$scores" ]] || { tail -5 "$WORK/validate.log" >&2; echo "fairseq-validate failed" >&2; exit 1; }
  echo "$3 $scores"
}
validate "$DATA" "$SPLIT" "own sources:    "
validate "$WORK/bin" valid "shifted sources:"
