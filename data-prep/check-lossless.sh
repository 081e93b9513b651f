#!/usr/bin/env bash
# The lossless proof on your own models: speculative decoding with exact acceptance against
# fairseq-generate --beam 1, token for token. Run with --help for the options.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: bash data-prep/check-lossless.sh DATASET VERIFIER DRAFTER [options] [-- speculative options...]

Decodes split SUBSET of data-bin DATASET twice at each batch size with fairseq-generate:
once with fairseq's own greedy search (--beam 1), once with the speculative generator
(--drafter-path DRAFTER, --spec-acceptance exact), and compares the hypotheses sentence by
sentence, token for token. Exact acceptance is lossless by construction: any difference is
a bug worth reporting, with the ids this prints.

DATASET   a data-bin directory, or the name of one under data-bin/
VERIFIER  the verifier checkpoint (.pt)
DRAFTER   its drafter checkpoint (.pt): a Spec-Drafter or an autoregressive draft model (the
          kind is read from the checkpoint); an untrained one must pass too

Options:
  --batch-sizes LIST  comma-separated batch sizes (default 1,7,16)
  --subset NAME       the split to decode (default test)
  --out DIR           keep both outputs per batch size there (default: a temporary folder,
                      removed at the end)
  --generation OPTS   fairseq-generate options for both runs, in one argument: the rules
                      that change what greedy search outputs, e.g. --generation
                      "--max-len-b 60 --no-repeat-ngram-size 3" (default: fairseq's)
  -h, --help          this help
Options after "--" go to the speculative run only (default: --spec-controller fixed
--spec-k 10; e.g. -- --spec-controller cmasd); --spec-acceptance exact always comes last.

Both runs use --required-batch-size-multiple 1: with fairseq's default of 8, batching
silently leaves sentences out at small batch sizes. Every sentence of SUBSET must get one
hypothesis in each run. Exit status 0 when every hypothesis is equal, 1 otherwise.
Uses --cpu when torch sees no CUDA device. Environment: CMASD_PYTHON.
EOF
}

BATCH_SIZES="1,7,16"
SUBSET="test"
OUT=""
POSITIONAL=()
SPEC_ARGS=()
GENERATION=()
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --batch-sizes|--batch-sizes=*) _opt_value --batch-sizes "$@"; BATCH_SIZES="$OPT_VALUE"; shift "$CONSUMED" ;;
    --subset|--subset=*) _opt_value --subset "$@"; SUBSET="$OPT_VALUE"; shift "$CONSUMED" ;;
    --out|--out=*) _opt_value --out "$@"; OUT="$OPT_VALUE"; shift "$CONSUMED" ;;
    --generation|--generation=*) _opt_value --generation "$@"; read -r -a GENERATION <<< "$OPT_VALUE"
      shift "$CONSUMED" ;;
    --) shift; SPEC_ARGS=("$@"); break ;;
    -*) die "unknown option: $1 (see --help)" ;;
    *) POSITIONAL+=("$1"); shift ;;
  esac
done
(( ${#POSITIONAL[@]} == 3 )) || { usage >&2; die "expected DATASET, VERIFIER and DRAFTER"; }
[[ "$BATCH_SIZES" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] \
  || die "bad --batch-sizes '$BATCH_SIZES': expected positive integers separated by commas, e.g. 1,7,16"
(( ${#SPEC_ARGS[@]} )) || SPEC_ARGS=(--spec-controller fixed --spec-k 10)

resolve_data_bin "${POSITIONAL[0]}"
SOURCE_IDX=("$DATA/$SUBSET".*-*.*.idx)
[[ -f "${SOURCE_IDX[0]}" ]] || die "$DATA has no binarized split '$SUBSET' ($SUBSET.SRC-TGT.LANG.idx)"
PAIR="$(basename "${SOURCE_IDX[0]}")"; PAIR="${PAIR#"$SUBSET".}"; PAIR="${PAIR%%.*}"
SRC="${PAIR%-*}"; TGT="${PAIR#*-}"
VERIFIER="${POSITIONAL[1]}"
DRAFTER="${POSITIONAL[2]}"
[[ -f "$VERIFIER" ]] || die "verifier checkpoint not found: $VERIFIER"
[[ -f "$DRAFTER" ]] || die "drafter checkpoint not found: $DRAFTER"
N="$("${PREP[@]}" count-bin "$DATA/$SUBSET.$PAIR.$SRC.idx" | cut -f2)"

if [[ -n "$OUT" ]]; then
  mkdir -p "$OUT"
else
  OUT="$(mktemp -d)"
  trap '[[ -n "${KEEP_OUT:-}" ]] || rm -rf "$OUT"' EXIT
fi
# fail MSG...: die, keeping the outputs for a look
fail() { KEEP_OUT=1; die "$@" "(outputs and logs kept in $OUT)"; }
DEVICE=()
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" || DEVICE=(--cpu)
fairseq_tool generate

log "$N sentences of $DATA ($SUBSET, $SRC -> $TGT); both runs: ${GENERATION[*]:-fairseq defaults};" \
  "speculative options: ${SPEC_ARGS[*]} --spec-acceptance exact"
FAILED=()
IFS=, read -r -a SIZES <<< "$BATCH_SIZES"
for bs in "${SIZES[@]}"; do
  common=("$DATA" --user-dir "$CMASD_ROOT/fairseq_plugins" --task translation_speculative
    --source-lang "$SRC" --target-lang "$TGT" --gen-subset "$SUBSET" --path "$VERIFIER"
    --beam 1 --batch-size "$bs" --required-batch-size-multiple 1 ${DEVICE[@]+"${DEVICE[@]}"}
    ${GENERATION[@]+"${GENERATION[@]}"})
  log "batch size $bs: fairseq-generate --beam 1"
  "${FAIRSEQ_CMD[@]}" "${common[@]}" > "$OUT/greedy-$bs.txt" 2> "$OUT/greedy-$bs.log" \
    || { tail -n 20 "$OUT/greedy-$bs.log" >&2; fail "fairseq-generate --beam 1 failed at batch size $bs"; }
  log "batch size $bs: speculative, exact acceptance"
  "${FAIRSEQ_CMD[@]}" "${common[@]}" --drafter-path "$DRAFTER" "${SPEC_ARGS[@]}" --spec-acceptance exact \
    > "$OUT/speculative-$bs.txt" 2> "$OUT/speculative-$bs.log" \
    || { tail -n 20 "$OUT/speculative-$bs.log" >&2; fail "speculative fairseq-generate failed at batch size $bs"; }
  grep -h '^INFO:fairseq_cli.generate:Translated\|speculative decoding:' "$OUT/greedy-$bs.log" "$OUT/speculative-$bs.log" \
    | sed 's/^INFO:[a-z_.]*://' | cut -c1-300 >&2 || true
  status=0
  result="$("${PREP[@]}" compare-hyps --sentences "$N" "$OUT/greedy-$bs.txt" "$OUT/speculative-$bs.txt")" \
    || status=$?
  case "$status" in
    0) log "batch size $bs: $result" ;;
    1) log "batch size $bs: NOT LOSSLESS: $result"; FAILED+=("$bs") ;;
    *) fail "batch size $bs: the outputs cannot be compared (see the error above)" ;;
  esac
done
(( ${#FAILED[@]} == 0 )) || fail "speculative decoding differs from fairseq-generate --beam 1 at batch size(s) ${FAILED[*]}"
log "lossless: the same hypotheses as fairseq-generate --beam 1 at batch size(s) $BATCH_SIZES"
