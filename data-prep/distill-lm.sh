#!/usr/bin/env bash
# Distillation for a language model's draft model: the verifier's own greedy continuations of
# prompts cut from the training lines, binarized with its dictionary. Run with --help.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DEFAULT_PROMPT_TOKENS=16
DEFAULT_CONTINUATION_TOKENS=128
DEFAULT_MAX_PROMPTS=20000
DEFAULT_VALID_PROMPTS=500
DEFAULT_BATCH=64

usage() {
  cat <<EOF
Usage: bash data-prep/distill-lm.sh DATA VERIFIER [options] [-- fairseq-generate options...]

Continues prompts cut from the lines of DATA with VERIFIER, a language model (transformer_lm),
greedily (fairseq-generate --beam 1: fairseq's own generator under --task
language_modeling_speculative without a drafter), and binarizes each prompt with its
continuation, one a line, with DATA's dictionary (the verifier's) as DATA-distill: the data
to train the draft model on, so that it imitates the verifier rather than the text (as
data-prep/distill.sh does for a translation model's drafters):
  bash data-prep/train-lm.sh DATA-distill draft

DATA      a language model's data-bin (data-prep/prepare-lm.sh: train.{bin,idx},
          valid.{bin,idx}, dict.txt), or its name under data-bin/; the verifier's own
VERIFIER  the verifier checkpoint (.pt), a language model with DATA's dictionary

Options:
  --prompt-tokens N        a prompt is the first N pieces of a line; lines of at most N pieces
                           give none (as cmasd-bench's prompts; default $DEFAULT_PROMPT_TOKENS)
  --continuation-tokens L  continue each prompt by at most L pieces (fairseq-generate --max-len-a 0
                           --max-len-b N+L: for a language model fairseq's length counts the
                           prompt; at most the verifier's positions - 1), or to its eos
                           (default $DEFAULT_CONTINUATION_TOKENS)
  --max-prompts N          training prompts: from the first N train lines long enough (default
                           $DEFAULT_MAX_PROMPTS); the cost grows with N times L
  --valid-prompts N        validation prompts, the same way from DATA's valid split (default
                           $DEFAULT_VALID_PROMPTS): the draft model's validation loss then measures
                           how well it imitates the verifier.  0: DATA's valid split is copied
                           instead (the text itself)
  --batch-size B           prompts per fairseq-generate batch (default $DEFAULT_BATCH)
  --dest DIR               output data-bin (default: DATA's path with "-distill" appended)
  -h, --help               this help
Options after "--" go to fairseq-generate (e.g. --fp16, or the rules the verifier will decode
with: --no-repeat-ngram-size 3; --sampling would distil samples, not greedy continuations).

Output (DIR):
  train.{bin,idx}, valid.{bin,idx}, dict.txt   prompt + continuation a line, DATA's dictionary
  test.{bin,idx}, spm.model                    copied from DATA when there
  prompts/SPLIT.txt, prompts/SPLIT.lines       the prompts (pieces) and the line of DATA's split
                                               (0-based, fairseq's sample id) each comes from
  tok/SPLIT.txt                                prompt + continuation in pieces (what is binarized)
  generate/SPLIT.txt                           fairseq-generate's output
  prompts-bin/                                 the prompts, binarized for fairseq-generate
Resumable: each step has a marker (DIR/.done) holding what shaped it (the verifier's checksum,
DATA's split, the options); a rerun skips what is done and redoes what changed.  Checks: one
hypothesis per prompt, ids 0..n-1, every line begins with its prompt, the dictionary is DATA's.
Uses --cpu when torch sees no CUDA device. Environment: CMASD_PYTHON.
EOF
}

PROMPT_TOKENS="$DEFAULT_PROMPT_TOKENS"
CONTINUATION_TOKENS="$DEFAULT_CONTINUATION_TOKENS"
MAX_PROMPTS="$DEFAULT_MAX_PROMPTS"
VALID_PROMPTS="$DEFAULT_VALID_PROMPTS"
BATCH="$DEFAULT_BATCH"
DEST=""
POSITIONAL=()
GENERATE_ARGS=()
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --prompt-tokens|--prompt-tokens=*) _opt_value --prompt-tokens "$@"; PROMPT_TOKENS="$OPT_VALUE"; shift "$CONSUMED" ;;
    --continuation-tokens|--continuation-tokens=*)
      _opt_value --continuation-tokens "$@"; CONTINUATION_TOKENS="$OPT_VALUE"; shift "$CONSUMED" ;;
    --max-prompts|--max-prompts=*) _opt_value --max-prompts "$@"; MAX_PROMPTS="$OPT_VALUE"; shift "$CONSUMED" ;;
    --valid-prompts|--valid-prompts=*) _opt_value --valid-prompts "$@"; VALID_PROMPTS="$OPT_VALUE"; shift "$CONSUMED" ;;
    --batch-size|--batch-size=*) _opt_value --batch-size "$@"; BATCH="$OPT_VALUE"; shift "$CONSUMED" ;;
    --dest|--dest=*) _opt_value --dest "$@"; DEST="$OPT_VALUE"; shift "$CONSUMED" ;;
    --) shift; GENERATE_ARGS=("$@"); break ;;
    -*) die "unknown option: $1 (see --help)" ;;
    *) POSITIONAL+=("$1"); shift ;;
  esac
done
(( ${#POSITIONAL[@]} == 2 )) || { usage >&2; die "expected DATA and VERIFIER"; }
positive_int --prompt-tokens "$PROMPT_TOKENS"
positive_int --continuation-tokens "$CONTINUATION_TOKENS"
positive_int --max-prompts "$MAX_PROMPTS"
positive_int --batch-size "$BATCH"
[[ "$VALID_PROMPTS" =~ ^[0-9]+$ ]] || die "bad --valid-prompts '$VALID_PROMPTS': expected an integer >= 0"

resolve_data_bin "${POSITIONAL[0]}"
VERIFIER="${POSITIONAL[1]}"
[[ -f "$DATA/train.idx" && -f "$DATA/dict.txt" ]] || die "$DATA is not a language model's data-bin" \
  "(train.idx and dict.txt of fairseq-preprocess --only-source): make one with data-prep/prepare-lm.sh"
[[ -f "$DATA/valid.idx" ]] || die "$DATA has no valid split (valid.idx)"
[[ -f "$VERIFIER" ]] || die "verifier checkpoint not found: $VERIFIER"
VERIFIER="$(abs_path "$VERIFIER")"
DEST="$(abs_path "${DEST:-$DATA-distill}")"
DEST="${DEST%/}"
[[ "$DEST" != "$DATA" ]] || die "--dest must differ from the data set itself"

# The verifier: a language model (no encoder) whose embeddings have a row per symbol of DATA's
# dictionary; its positions bound prompt + continuation. (And whether torch sees CUDA.)
read -r ROWS POSITIONS CUDA < <(PYTHONPATH="$CMASD_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$VERIFIER" <<'EOF'
import sys
import torch
from cmasd.checkpoint import allow_fairseq_checkpoints
allow_fairseq_checkpoints()
try:
    state = torch.load(sys.argv[1], map_location="cpu")
    weights, cfg = state["model"], state["cfg"]
except Exception as e:  # one line, not a traceback; the script adds its own
    sys.exit(f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}")
if any(name.startswith("encoder.") for name in weights) or "decoder.embed_tokens.weight" not in weights:
    sys.exit("not a language model (it has an encoder, or no decoder.embed_tokens): give a transformer_lm")
positions = cfg["model"].get("max_target_positions") or cfg["task"].get("tokens_per_sample")
print(weights["decoder.embed_tokens.weight"].size(0), positions, int(torch.cuda.is_available()))
EOF
) || die "cannot use the verifier checkpoint $VERIFIER"
SYMBOLS=$(( 4 + $(line_count "$DATA/dict.txt") ))  # fairseq's <s> <pad> </s> <unk>, then a line each
(( ROWS == SYMBOLS )) || die "the verifier has $ROWS embeddings but $DATA/dict.txt gives $SYMBOLS symbols:" \
  "DATA is not binarized with the verifier's dictionary"
ROOM=$(( POSITIONS - 1 ))  # the start token takes a position
(( PROMPT_TOKENS < ROOM )) || die "--prompt-tokens $PROMPT_TOKENS: the verifier's $POSITIONS positions hold" \
  "the start token and $ROOM tokens, prompt and continuation; give at most $(( ROOM - 1 ))"
MAX_LEN=$(( PROMPT_TOKENS + CONTINUATION_TOKENS ))
if (( MAX_LEN > ROOM )); then
  log "continuations cut to $(( ROOM - PROMPT_TOKENS )) tokens: the verifier's $POSITIONS positions" \
    "hold $ROOM after the start token"
  MAX_LEN="$ROOM"
fi

SPLITS=(train)
declare -A MOST=([train]="$MAX_PROMPTS" [valid]="$VALID_PROMPTS")
(( VALID_PROMPTS > 0 )) && SPLITS+=(valid)
DEVICE=()
(( CUDA )) || DEVICE=(--cpu)
mkdir -p "$DEST/prompts" "$DEST/prompts-bin" "$DEST/generate" "$DEST/tok"
log "distilling $VERIFIER on ${SPLITS[*]} of $DATA -> $DEST"
steps_init "$DEST" "distill-lm data=$DATA"

# prompts SIGNATURE: DEST/prompts/SPLIT.{txt,lines} from DATA's binarized splits, binarized
# again (with DATA's dictionary) as DEST/prompts-bin/SPLIT for fairseq-generate
prompts() {
  local sig="$1" split
  local -a args=() prefs=()
  done_step prompts "$sig" && return 0
  for split in "${SPLITS[@]}"; do
    args+=("$DATA/$split" "${MOST[$split]}" "$DEST/prompts/$split.txt" "$DEST/prompts/$split.lines")
    prefs+=("--${split}pref" "$DEST/prompts/$split.txt")
  done
  PYTHONPATH="$CMASD_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$DATA/dict.txt" "$PROMPT_TOKENS" "${args[@]}" <<'EOF' \
    || die "no prompts from $DATA"
import sys
from fairseq.data import Dictionary, data_utils
dictionary, n = Dictionary.load(sys.argv[1]), int(sys.argv[2])
for prefix, most, out, lines in zip(*[iter(sys.argv[3:])] * 4):
    dataset = data_utils.load_indexed_dataset(prefix, dictionary)
    if dataset is None:
        sys.exit(f"cannot read {prefix}.idx and {prefix}.bin")
    kept = seen = 0
    with open(out, "w", encoding="utf-8") as text, open(lines, "w") as ids:
        for i, size in enumerate(dataset.sizes):
            seen = i + 1
            if size - 1 > n:  # its eos aside
                text.write(" ".join(dictionary[t] for t in dataset[i][:n].tolist()) + "\n")
                ids.write(f"{i}\n")
                kept += 1
                if kept == int(most):
                    break
    if kept == 0:
        sys.exit(f"--prompt-tokens {n}: no line of {prefix} ({len(dataset):,} lines, the longest "
                 f"{int(dataset.sizes.max(initial=1)) - 1} pieces) has more than {n} pieces; give fewer")
    print(f"[cmasd prep] {prefix}: {kept:,} prompts of {n} pieces from its first {seen:,} of {len(dataset):,} lines",
          file=sys.stderr)
EOF
  rm -f "$DEST/prompts-bin"/*
  binarizer 1
  "${BINARIZE_CMD[@]}" --only-source "${prefs[@]}" --destdir "$DEST/prompts-bin" --srcdict "$DATA/dict.txt"
  mark_done prompts "$sig"
}

# generate SPLIT: fairseq-generate's greedy continuations -> DEST/generate/SPLIT.txt, then the
# hypotheses in id order -> DEST/tok/SPLIT.txt, each checked to begin with its prompt
generate() {
  local split="$1" sig="$2" out="$DEST/generate/$1.txt" n hyps bad
  done_step "generate-$split" "$sig" && return 0
  n="$(line_count "$DEST/prompts/$split.txt")"
  fairseq_tool generate
  "${FAIRSEQ_CMD[@]}" "$DEST/prompts-bin" --user-dir "$CMASD_ROOT/fairseq_plugins" \
    --task language_modeling_speculative --sample-break-mode eos --tokens-per-sample "$POSITIONS" \
    --gen-subset "$split" --path "$VERIFIER" --beam 1 --nbest 1 --max-len-a 0 --max-len-b "$MAX_LEN" \
    --batch-size "$BATCH" --required-batch-size-multiple 1 --num-workers 0 \
    ${DEVICE[@]+"${DEVICE[@]}"} ${GENERATE_ARGS[@]+"${GENERATE_ARGS[@]}"} \
    | "$PY" "$CMASD_ROOT/cmasd/tools/progress.py" count --out "$out.part" --label "$split" --total "$n"
  mv "$out.part" "$out"
  grep -q "^Generate $split with beam=" "$out" || die "$out: fairseq-generate did not finish"
  hyps="$DEST/generate/$split.hypotheses.tsv"
  LC_ALL=C awk -F'\t' '$1 ~ /^H-[0-9]+$/ { print substr($1, 3) "\t" $3 }' "$out" | LC_ALL=C sort -n -k1,1 > "$hyps"
  cut -f1 "$hyps" | cmp -s - <(seq 0 $((n - 1))) \
    || die "$out: the hypothesis ids are not exactly 0..$((n - 1)) ($(line_count "$hyps") for $n prompts)"
  cut -f2 "$hyps" > "$DEST/tok/$split.txt"
  bad="$(paste -d '\t' "$DEST/prompts/$split.txt" "$DEST/tok/$split.txt" | LC_ALL=C awk -F'\t' '
    { p = length($1) }
    !first && (substr($2, 1, p) != $1 || (length($2) > p && substr($2, p + 1, 1) != " ")) { first = NR }
    END { if (first) print first - 1 }')"
  [[ -z "$bad" ]] || die "$out: the continuation of prompt $bad does not begin with the prompt"
  log "$split: $n continuations, $(LC_ALL=C awk -v n="$n" -v p="$PROMPT_TOKENS" \
    '{ t += NF } END { printf "%.1f", t / n - p }' "$DEST/tok/$split.txt") pieces after the prompt on average"
  mark_done "generate-$split" "$sig"
}

# what shapes each split's prompts, and all of them
declare -A SPLIT_SIG
PROMPT_SIG=""
for split in "${SPLITS[@]}"; do
  SPLIT_SIG[$split]="dict=$(file_id "$DATA/dict.txt") prompt-tokens=$PROMPT_TOKENS"
  SPLIT_SIG[$split]+=" $split=$(file_id "$DATA/$split.idx"):${MOST[$split]}"
  PROMPT_SIG+="${SPLIT_SIG[$split]}; "
done
prompts "$PROMPT_SIG"
ALL_SIG=""
for split in "${SPLITS[@]}"; do
  gen_sig="${SPLIT_SIG[$split]} verifier=$(file_id "$VERIFIER") max-len=$MAX_LEN batch=$BATCH"
  gen_sig+=" device=${DEVICE[*]-cuda} args=${GENERATE_ARGS[*]-}"
  generate "$split" "$gen_sig"
  ALL_SIG+="$split: $gen_sig; "
done
(( VALID_PROMPTS > 0 )) || ALL_SIG+="valid: copied $(file_id "$DATA/valid.idx")"

if ! done_step binarize "$ALL_SIG"; then
  rm -f "$DEST"/*.bin "$DEST"/*.idx
  prefs=(--trainpref "$DEST/tok/train.txt")
  (( VALID_PROMPTS > 0 )) && prefs+=(--validpref "$DEST/tok/valid.txt")
  binarizer 2
  "${BINARIZE_CMD[@]}" --only-source "${prefs[@]}" --destdir "$DEST" --srcdict "$DATA/dict.txt"
  cmp -s "$DEST/dict.txt" "$DATA/dict.txt" || die "the distilled dictionary differs from $DATA/dict.txt"
  copied=(test.bin test.idx spm.model)
  (( VALID_PROMPTS > 0 )) || copied+=(valid.bin valid.idx)
  for name in "${copied[@]}"; do
    [[ -f "$DATA/$name" ]] && cp "$DATA/$name" "$DEST/$name"
  done
  mark_done binarize "$ALL_SIG"
fi
summarize "$DEST"
log "done: $DEST (train the draft model on it: bash data-prep/train-lm.sh $DEST draft)"
