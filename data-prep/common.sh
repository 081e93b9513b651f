# shellcheck shell=bash
# Helpers shared by the cmasd data-prep recipes.  Source it, do not run it:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
#
# Provides
#   CMASD_ROOT                repository root (resolved from this file's location)
#   PY                        python: $CMASD_PYTHON, else <root>/.venv/bin/python, else python3
#   PREP                      array: "$PY" -m cmasd.tools.prep, this checkout's (the cmasd-prep tool:
#                             standard library and sentencepiece, none of torch or fairseq)
#   log MSG...                progress on stderr, "[cmasd prep] MSG"
#   die MSG...                error on stderr, exit 1
#   fairseq_tool NAME         command (array FAIRSEQ_CMD) for fairseq-NAME (preprocess, train, ...)
#   fetch URL RELPATH DEST    DEST from $CMASD_DATA_MIRROR/RELPATH when the variable is set,
#                             else downloaded from URL (curl, else wget)
#   steps_init DIR SIGNATURE  markers for idempotent steps live in DIR/.done; when SIGNATURE
#                             (the options that shape the output) changed since the last run,
#                             every marker is dropped and all steps run again
#   done_step NAME [SIG]      true (and prints "skip: NAME (done)") if NAME finished before
#                             with the same SIG
#   mark_done NAME [SIG]      record that NAME finished
#   abs_path PATH             PATH made absolute (it need not exist)
#   resolve_data_bin DATASET  sets DATA: DATASET if it is a path (contains '/', or is an
#                             existing directory), else data-bin/DATASET; dies when missing
#   check_vocab_size N        die unless N is an integer >= 100
#   positive_int OPTION VALUE die unless VALUE is a positive integer ("bad OPTION 'VALUE': ...")
#   line_count FILE           number of lines
#   check_lines FILE N        die unless FILE has exactly N lines
#   check_parallel A B        die unless A and B have the same number of lines
#   prepare_vocab ...         train a joint sentencepiece model or copy a given one (see below)
#   binarizer WORKERS         BINARIZE_CMD: cmasd-prep binarize, or fairseq-preprocess (see below)
#   binarize ...              fairseq-preprocess's binarization with the joint dictionary (see below)
#   add_extra_test ...        binarize one more raw parallel test set under its own name
#   summarize DEST            print the sentence counts of every binarized split
#   parse_common_option ARGS  the options every translation recipe shares (see COMMON_OPTIONS_HELP)
#   finish_recipe             vocabulary, encoding, filtering, binarization, extra test sets
#   NEWS_*                    the WMT news test sets as OPUS-MT-testsets and the mirror keep them
#                             (prepare-wmt14-en-de.sh --news, prepare-lm.sh --corpus news-en)
#   train_recipe SAVE_PREFIX RECIPE_FN ARGS...
#                             a drafter training recipe: --help, its inputs checked, then
#                             fairseq-train with the shared options and the recipe's own
#   drafter_recipe_inputs DATASET VERIFIER
#                             the inputs of a drafter recipe, checked: sets DATA (the data-bin,
#                             with train and valid splits), NAME (its folder name), VERIFIER
#                             (absolute), WIDTH (the verifier's embedding width) and the array
#                             DEVICE_OPTIONS: --cpu without CUDA, and --drafter-bf16-autocast on
#                             a CPU with native bfloat16 (not with CMASD_DRAFTER_FP32=1)
#
# CMASD_LOW_MEMORY=1 makes every recipe's python run with glibc's malloc returning large
# blocks to the system (MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ at 1 MiB,
# MALLOC_ARENA_MAX=2). Measured on the demo's drafter (150 updates, oneDNN's cache already
# bounded by the task): peak 3.8 GB -> 1.7 GB, but 1.0 -> 0.65 updates/s (docs/RESULTS.md);
# hence off by default.

set -euo pipefail

if [[ "${CMASD_LOW_MEMORY:-0}" == 1 ]]; then
  export MALLOC_MMAP_THRESHOLD_=1048576 MALLOC_TRIM_THRESHOLD_=1048576 MALLOC_ARENA_MAX=2
fi

CMASD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The WMT news test sets (each NAME.en / NAME.de): the training, valid and test split of
# prepare-wmt14-en-de.sh --news and of prepare-lm.sh --corpus news-en (its English sides).
NEWS_URL="https://raw.githubusercontent.com/Helsinki-NLP/OPUS-MT-testsets/master/testsets/en-de"
NEWS_MIRROR_DIR="wmt-news-en-de"
NEWS_TRAIN=(news-test2008 newssyscomb2009 newstest2009 newstest2010 newstest2011 newstest2012
            newstest2015 newstest2016 newstest2017 newstest2018 newstest2019 newstest2020)
NEWS_VALID=newstest2013
NEWS_TEST=newstest2014
NEWS_TEST_LINES=3003

log() { printf '[cmasd prep] %s\n' "$*" >&2; }
die() { printf '[cmasd prep] error: %s\n' "$*" >&2; exit 1; }

# ------------------------------------------------------------------ tools

if [[ -n "${CMASD_PYTHON:-}" ]]; then
  PY="$CMASD_PYTHON"
elif [[ -x "$CMASD_ROOT/.venv/bin/python" ]]; then
  PY="$CMASD_ROOT/.venv/bin/python"
else
  PY="python3"
fi
command -v "$PY" >/dev/null 2>&1 || die "python not found: $PY (set CMASD_PYTHON)"
PREP=(env "PYTHONPATH=$CMASD_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m cmasd.tools.prep)

# fairseq_tool NAME: sets the array FAIRSEQ_CMD to run fairseq-NAME.  Looks next to the
# chosen python first (so CMASD_PYTHON=/some/env/bin/python picks that env's fairseq), then
# in the repository's .venv, then on PATH, and finally falls back to `python -m fairseq_cli.NAME`.
fairseq_tool() {
  local name="$1" pydir candidate
  pydir="$(dirname "$(command -v "$PY")")"
  for candidate in "$pydir/fairseq-$name" "$CMASD_ROOT/.venv/bin/fairseq-$name"; do
    if [[ -x "$candidate" ]]; then FAIRSEQ_CMD=("$candidate"); return 0; fi
  done
  if command -v "fairseq-$name" >/dev/null 2>&1; then
    FAIRSEQ_CMD=("$(command -v "fairseq-$name")"); return 0
  fi
  "$PY" -c "import fairseq_cli.$name" >/dev/null 2>&1 \
    || die "fairseq-$name not found (install fairseq into $PY's environment, or set CMASD_PYTHON)"
  FAIRSEQ_CMD=("$PY" -m "fairseq_cli.$name")
}

# binarizer WORKERS: BINARIZE_CMD, the command that binarizes tokenized text with a given
# dictionary, taking fairseq-preprocess's options (--source-lang/--target-lang or --only-source,
# --{train,valid,test}pref, --destdir, --srcdict, --joined-dictionary) and writing its files:
# `cmasd-prep binarize` (fairseq's files byte for byte, about 30x faster), or with
# CMASD_BINARIZER=fairseq-preprocess fairseq's own, with --workers WORKERS.
binarizer() {
  case "${CMASD_BINARIZER:-cmasd-prep}" in
    cmasd-prep) BINARIZE_CMD=("${PREP[@]}" binarize) ;;
    fairseq-preprocess) fairseq_tool preprocess; BINARIZE_CMD=("${FAIRSEQ_CMD[@]}" --workers "$1") ;;
    *) die "CMASD_BINARIZER=${CMASD_BINARIZER}: say cmasd-prep (the default) or fairseq-preprocess" ;;
  esac
}

# ------------------------------------------------------------------ drafter training

# train_recipe SAVE_PREFIX RECIPE_FN ARGS...: the body of the drafter training recipes
# (train-drafter.sh, train-ar-drafter.sh, train-exit-heads.sh, train-blockwise-heads.sh).
# ARGS are the recipe's own: -h/--help prints the caller's `usage`; else DATASET VERIFIER
# [fairseq-train options...], checked by drafter_recipe_inputs. Then RECIPE_FN (the
# caller's; it may read DATA, NAME, VERIFIER and WIDTH) sets the array RECIPE, the options
# after --task (drafter cuts, arch, criterion, optimizer, schedule, batch, best metric), and
# logs what it trains; fairseq-train replaces the shell with
#   DATA --user-dir fairseq_plugins --task translation_speculative RECIPE...
#   --skip-invalid-size-inputs-valid-test --save-dir checkpoints/SAVE_PREFIX-NAME
#   --log-format simple --log-interval 50 DEVICE_OPTIONS... [fairseq-train options...]
# so that the options given after VERIFIER come last and win.
train_recipe() {
  local save_prefix="$1" recipe_fn="$2"
  shift 2
  case "${1:-}" in
    -h|--help) usage; exit 0 ;;
  esac
  (( $# >= 2 )) || { usage >&2; die "expected DATASET and VERIFIER"; }
  drafter_recipe_inputs "$1" "$2"
  shift 2
  fairseq_tool train
  RECIPE=()
  "$recipe_fn"
  exec "${FAIRSEQ_CMD[@]}" "$DATA" \
    --user-dir "$CMASD_ROOT/fairseq_plugins" --task translation_speculative \
    ${RECIPE[@]+"${RECIPE[@]}"} \
    --skip-invalid-size-inputs-valid-test \
    --save-dir "$CMASD_ROOT/checkpoints/$save_prefix-$NAME" \
    --log-format simple --log-interval 50 \
    ${DEVICE_OPTIONS[@]+"${DEVICE_OPTIONS[@]}"} "$@"
}

drafter_recipe_inputs() {
  resolve_data_bin "$1"
  NAME="$(basename "$DATA")"
  compgen -G "$DATA/train.*.idx" >/dev/null || die "$DATA has no binarized train split (train.*.idx)"
  compgen -G "$DATA/valid*.idx" >/dev/null || die "$DATA has no binarized valid split (valid*.idx)"
  [[ -f "$2" ]] || die "verifier checkpoint not found: $2"
  VERIFIER="$(abs_path "$2")"
  WIDTH="$(PYTHONPATH="$CMASD_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$VERIFIER" <<'EOF'
import sys
import torch
from cmasd.checkpoint import allow_fairseq_checkpoints
allow_fairseq_checkpoints()
try:
    state = torch.load(sys.argv[1], map_location="cpu")
    print(state["model"]["decoder.embed_tokens.weight"].size(1))
except Exception as e:  # one message, not a traceback; the script adds its own line
    sys.exit(f"{type(e).__name__}: {e}")
EOF
)" || die "cannot read the verifier checkpoint $VERIFIER"
  DEVICE_OPTIONS=()
  "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" || DEVICE_OPTIONS=(--cpu)
  # mixed precision on a CPU with native bfloat16 (about twice the updates per hour)
  if [[ -n "${DEVICE_OPTIONS[*]-}" && "${CMASD_DRAFTER_FP32:-0}" != 1 ]] &&
    "$PY" -c "import sys, torch; sys.exit(0 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else 1)" 2>/dev/null; then
    DEVICE_OPTIONS+=(--drafter-bf16-autocast)
    log "this CPU has native bfloat16: training with --drafter-bf16-autocast (CMASD_DRAFTER_FP32=1 trains in float32)"
  fi
}

# save_dir_from DEFAULT [fairseq-train options...]: SAVE, the --save-dir among the options
# (the last one) or DEFAULT, as an absolute path, created
save_dir_from() {
  local prev="" arg
  SAVE="$1"
  shift
  for arg in "$@"; do
    [[ "$prev" == --save-dir ]] && SAVE="$arg"
    [[ "$arg" == --save-dir=* ]] && SAVE="${arg#--save-dir=}"
    prev="$arg"
  done
  SAVE="$(abs_path "$SAVE")"
  mkdir -p "$SAVE"
}

# training_device FP16 [fairseq-train options...]: where a training recipe runs, logged:
# DEVICE_KIND "given" (the options hold --cpu), "cuda" or "cpu" (torch sees no CUDA GPU),
# and DEVICE_ARGS for fairseq-train (--cpu on a CPU found here, --fp16 on a GPU when FP16 is 1)
training_device() {
  local fp16="$1" arg
  shift
  DEVICE_ARGS=()
  DEVICE_KIND=cpu
  for arg in "$@"; do [[ "$arg" == --cpu ]] && DEVICE_KIND=given; done
  if [[ "$DEVICE_KIND" == given ]]; then
    log "device: CPU (--cpu given)"
  elif "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    DEVICE_KIND=cuda
    log "device: CUDA GPU"
    (( fp16 )) && DEVICE_ARGS=(--fp16)
  else
    log "device: CPU (torch sees no CUDA GPU)"
    DEVICE_ARGS=(--cpu)
  fi
}

# ------------------------------------------------------------------ paths, checks

abs_path() {
  case "$1" in
    /*) printf '%s\n' "$1" ;;
    *) printf '%s/%s\n' "$PWD" "$1" ;;
  esac
}

resolve_data_bin() {
  local dataset="$1"
  if [[ "$dataset" == */* || -d "$dataset" ]]; then
    DATA="$(abs_path "$dataset")"
  else
    DATA="$CMASD_ROOT/data-bin/$dataset"
  fi
  DATA="${DATA%/}"
  [[ -d "$DATA" ]] || die "unknown dataset '$dataset': no directory $DATA (prepare it with a" \
    "data-prep/prepare-*.sh script, or give a path)"
}

check_vocab_size() {
  if ! [[ "$1" =~ ^[0-9]+$ ]] || (( 10#$1 < 100 )); then
    die "bad vocab size '$1': expected an integer >= 100"
  fi
}

line_count() { wc -l < "$1" | tr -d ' '; }

positive_int() {  # positive_int OPTION VALUE
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "bad $1 '$2': expected a positive integer"
}

check_lines() {
  local n
  n="$(line_count "$1")"
  [[ "$n" == "$2" ]] || die "$1 has $n lines, expected $2 (corrupt or different download?)"
}

check_parallel() {
  local a b
  a="$(line_count "$1")"; b="$(line_count "$2")"
  [[ "$a" == "$b" ]] || die "not parallel: $1 has $a lines but $2 has $b"
}

# ------------------------------------------------------------------ fetch

# fetch URL RELPATH DEST
# With CMASD_DATA_MIRROR set, copies $CMASD_DATA_MIRROR/RELPATH (the mirror keeps upstream file
# names); otherwise downloads URL.  An existing non-empty DEST is kept (reruns do not fetch again).
fetch() {
  local url="$1" rel="$2" dest="$3" src
  if [[ -s "$dest" ]]; then
    log "have $(basename "$dest")"
    return 0
  fi
  mkdir -p "$(dirname "$dest")"
  if [[ -n "${CMASD_DATA_MIRROR:-}" ]]; then
    src="$CMASD_DATA_MIRROR/$rel"
    [[ -f "$src" ]] || die "missing mirror file $src (CMASD_DATA_MIRROR=$CMASD_DATA_MIRROR;" \
      "unset CMASD_DATA_MIRROR to download $url instead)"
    log "copy $src"
    cp "$src" "$dest.part"
  else
    log "download $url"
    if command -v curl >/dev/null 2>&1; then
      curl -fL --retry 3 --connect-timeout 30 --progress-bar -o "$dest.part" "$url" \
        || { rm -f "$dest.part"; die "download failed: $url (no network? set CMASD_DATA_MIRROR to a local mirror)"; }
    elif command -v wget >/dev/null 2>&1; then
      wget -t 3 -T 30 -O "$dest.part" "$url" \
        || { rm -f "$dest.part"; die "download failed: $url (no network? set CMASD_DATA_MIRROR to a local mirror)"; }
    else
      die "neither curl nor wget is installed; cannot download $url"
    fi
  fi
  [[ -s "$dest.part" ]] || { rm -f "$dest.part"; die "fetched an empty file for $url"; }
  mv "$dest.part" "$dest"
}

# mirror_has RELPATH...: true when CMASD_DATA_MIRROR is set and holds every RELPATH.
mirror_has() {
  local rel
  [[ -n "${CMASD_DATA_MIRROR:-}" ]] || return 1
  for rel in "$@"; do [[ -f "$CMASD_DATA_MIRROR/$rel" ]] || return 1; done
}

# ------------------------------------------------------------------ idempotent steps

STEP_DIR=""

steps_init() {
  local dir="$1" signature="$2"
  STEP_DIR="$dir/.done"
  mkdir -p "$STEP_DIR"
  if [[ -f "$STEP_DIR/SIGNATURE" ]] && [[ "$(cat "$STEP_DIR/SIGNATURE")" != "$signature" ]]; then
    log "options differ from the previous run in $dir:"
    log "  was: $(cat "$STEP_DIR/SIGNATURE")"
    log "  now: $signature"
    log "redoing every step"
    find "$STEP_DIR" -mindepth 1 -maxdepth 1 -type f -delete
  fi
  printf '%s\n' "$signature" > "$STEP_DIR/SIGNATURE"
}

done_step() {
  local name="$1" sig="${2:-}"
  [[ -n "$STEP_DIR" ]] || die "internal: steps_init was not called"
  if [[ -f "$STEP_DIR/$name" ]] && [[ "$(cat "$STEP_DIR/$name")" == "$sig" ]]; then
    log "skip: $name (done)"
    return 0
  fi
  log "step: $name"
  return 1
}

mark_done() {
  local name="$1" sig="${2:-}"
  printf '%s\n' "$sig" > "$STEP_DIR/$name"
}

# ------------------------------------------------------------------ shared recipe steps

# prepare_vocab DEST VOCAB_SIZE SPM_MODEL DICT TRAIN_FILES(comma-separated) [spm-train options...]
# Leaves DEST/spm.model and DEST/dict.txt (and DEST/spm.vocab when trained here).
# SPM_MODEL and DICT empty: train a joint unigram model of VOCAB_SIZE pieces on TRAIN_FILES.
# Otherwise copy the given model and dictionary (reuse mode: the vocabulary of an existing model).
prepare_vocab() {
  local dest="$1" vocab="$2" model="$3" dict="$4" inputs="$5"
  shift 5
  if [[ -n "$model" ]]; then
    log "reusing sentencepiece model $model and dictionary $dict"
    cp "$model" "$dest/spm.model"
    cp "$dict" "$dest/dict.txt"
    rm -f "$dest/spm.vocab"
  else
    "${PREP[@]}" spm-train --input "$inputs" --prefix "$dest/spm" --vocab-size "$vocab" "$@"
    mv "$dest/spm.dict.txt" "$dest/dict.txt"
  fi
}

# check_reuse_options SPM_MODEL DICT: both or neither; the files must exist.
check_reuse_options() {
  local model="$1" dict="$2"
  if [[ -n "$model" || -n "$dict" ]]; then
    [[ -n "$model" && -n "$dict" ]] || die "--spm-model and --dict go together: give both or neither"
    [[ -f "$model" ]] || die "--spm-model: file not found: $model"
    [[ -f "$dict" ]] || die "--dict: file not found: $dict"
  fi
}

# binarize DEST SRC TGT WORKERS SPLITS...
# DEST/tok/SPLIT.{SRC,TGT} for SPLIT in SPLITS (train, valid, test; a missing split is left
# out) binarized into DEST (binarizer: fairseq-preprocess's files), with DEST/dict.txt as the
# joint dictionary.
binarize() {
  local dest="$1" src="$2" tgt="$3" workers="$4" split
  shift 4
  local -a prefs=()
  for split in "$@"; do
    prefs+=("--${split}pref" "$dest/tok/$split")
  done
  binarizer "$workers"
  rm -f "$dest/dict.$src.txt" "$dest/dict.$tgt.txt"
  "${BINARIZE_CMD[@]}" --source-lang "$src" --target-lang "$tgt" \
    "${prefs[@]}" --destdir "$dest" \
    --srcdict "$dest/dict.txt" --joined-dictionary
}

# add_extra_test DEST SRC TGT NAME SRC_FILE TGT_FILE
# Binarizes a raw parallel pair (plain or .gz) as split NAME with the vocabulary of DEST:
#   normalize -> DEST/raw/NAME.{SRC,TGT} (the target is the reference for sacreBLEU),
#   encode    -> DEST/tok/NAME.{SRC,TGT},
#   binarized (binarizer) as --testpref into a temporary directory, whose test.* files are then
#   renamed to DEST/NAME.SRC-TGT.{SRC,TGT}.{bin,idx}: fairseq loads them with --gen-subset NAME.
add_extra_test() {
  local dest="$1" src="$2" tgt="$3" name="$4" src_file="$5" tgt_file="$6" lang tmp
  for lang in "$src" "$tgt"; do
    local in="$src_file"
    [[ "$lang" == "$tgt" ]] && in="$tgt_file"
    "${PREP[@]}" normalize "$in" "$dest/raw/$name.$lang"
  done
  check_parallel "$dest/raw/$name.$src" "$dest/raw/$name.$tgt"
  for lang in "$src" "$tgt"; do
    "${PREP[@]}" spm-encode --model "$dest/spm.model" "$dest/raw/$name.$lang" "$dest/tok/$name.$lang"
  done
  tmp="$dest/.extra-$name"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  binarizer 1
  "${BINARIZE_CMD[@]}" --source-lang "$src" --target-lang "$tgt" --testpref "$dest/tok/$name" \
    --destdir "$tmp" --srcdict "$dest/dict.txt" --joined-dictionary
  for lang in "$src" "$tgt"; do
    mv "$tmp/test.$src-$tgt.$lang.bin" "$dest/$name.$src-$tgt.$lang.bin"
    mv "$tmp/test.$src-$tgt.$lang.idx" "$dest/$name.$src-$tgt.$lang.idx"
  done
  rm -rf "$tmp"
}

# check_extra_test_name NAME: a fairseq split name of its own.
check_extra_test_name() {
  local name="$1"
  [[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] \
    || die "--extra-test name '$name': use letters, digits, '_' and '-' only"
  [[ "$name" =~ ^(train|valid|test)[0-9]*$ ]] \
    && die "--extra-test name '$name' would clash with fairseq's own splits (train, valid, test, test1, ...): pick another, e.g. test_$name or flickr2017"
  return 0
}

# summarize DEST: one line per binarized split, from the .idx files.
summarize() {
  local dest="$1" idx
  local -a files=()
  for idx in "$dest"/*.idx; do [[ -f "$idx" ]] && files+=("$idx"); done
  (( ${#files[@]} )) || die "no binarized split in $dest"
  log "binarized splits in $dest (name, sentences, tokens incl. </s>):"
  "${PREP[@]}" count-bin "${files[@]}" | while IFS=$'\t' read -r name n tokens; do
    log "  $name: $n sentences, $tokens tokens"
  done
}

# ------------------------------------------------------------------ shared options
# (globals read by the recipes that source this file)
# shellcheck disable=SC2034

DEST=""              # output directory (absolute after parsing)
VOCAB=""             # sentencepiece vocabulary size ("" = the recipe's default)
SPM_MODEL=""         # reuse mode: an existing sentencepiece model ...
DICT_FILE=""         # ... and its fairseq dictionary
WORKERS=2            # fairseq-preprocess --workers (CMASD_BINARIZER=fairseq-preprocess)
EXTRA_NAMES=()       # --extra-test NAME SRC_FILE TGT_FILE, repeatable
EXTRA_SRCS=()
EXTRA_TGTS=()
CONSUMED=0           # set by parse_common_option: how many arguments it used
# --with-summary-denoising of the summarization recipes: the share of a summary's words deleted
SUMMARY_DENOISE_RATIO=0.3

# shellcheck disable=SC2034
COMMON_OPTIONS_HELP='  --dest DIR              output directory (relative paths are taken from the current directory)
  --vocab-size N          joint sentencepiece vocabulary size to train (integer >= 100)
  --spm-model PATH        reuse this sentencepiece model instead of training one ...
  --dict PATH             ... with this fairseq dictionary (both or neither; copied into DIR as
                          spm.model and dict.txt)
  --extra-test NAME SRC_FILE TGT_FILE
                          also binarize this raw parallel pair (plain text or .gz) as split NAME,
                          with the same vocabulary: DIR/NAME.<pair>.<lang>.{bin,idx}, raw text in
                          DIR/raw/NAME.<lang>; use with fairseq-generate --gen-subset NAME.
                          Repeatable.  NAME: letters, digits, _ and -, not train/valid/test[N].
  --workers N             fairseq-preprocess workers, with CMASD_BINARIZER=fairseq-preprocess (default 2)
  -h, --help              this help'

# _opt_value OPTION "$@": the value of an option given as "--opt VALUE" or "--opt=VALUE";
# sets OPT_VALUE and CONSUMED.
_opt_value() {
  local opt="$1"
  shift
  if [[ "$1" == *=* ]]; then
    OPT_VALUE="${1#*=}"; CONSUMED=1
  else
    (( $# >= 2 )) || die "option $opt needs a value (see --help)"
    OPT_VALUE="$2"; CONSUMED=2
  fi
}

# parse_common_option "$@": handles one shared option at the front of "$@", sets CONSUMED;
# dies on anything it does not know.
parse_common_option() {
  case "$1" in
    --dest|--dest=*) _opt_value --dest "$@"; DEST="$OPT_VALUE" ;;
    --vocab-size|--vocab-size=*) _opt_value --vocab-size "$@"; VOCAB="$OPT_VALUE"; check_vocab_size "$VOCAB" ;;
    --spm-model|--spm-model=*) _opt_value --spm-model "$@"; SPM_MODEL="$(abs_path "$OPT_VALUE")" ;;
    --dict|--dict=*) _opt_value --dict "$@"; DICT_FILE="$(abs_path "$OPT_VALUE")" ;;
    --workers|--workers=*)
      _opt_value --workers "$@"; WORKERS="$OPT_VALUE"
      positive_int --workers "$WORKERS" ;;
    --extra-test)
      (( $# >= 4 )) || die "--extra-test needs three values: NAME SRC_FILE TGT_FILE"
      check_extra_test_name "$2"
      [[ -f "$3" ]] || die "--extra-test $2: source file not found: $3"
      [[ -f "$4" ]] || die "--extra-test $2: target file not found: $4"
      local known
      for known in ${EXTRA_NAMES[@]+"${EXTRA_NAMES[@]}"}; do
        [[ "$known" != "$2" ]] || die "--extra-test name '$2' given twice"
      done
      EXTRA_NAMES+=("$2"); EXTRA_SRCS+=("$(abs_path "$3")"); EXTRA_TGTS+=("$(abs_path "$4")")
      # shellcheck disable=SC2034
      CONSUMED=4 ;;
    -*) die "unknown option: $1 (see --help)" ;;
    *) die "unexpected argument: $1 (see --help)" ;;
  esac
}

# file_id PATH: content checksum, for step signatures.
file_id() { cksum < "$1" | cut -d' ' -f1,2 | tr ' ' ':'; }

# vocab_signature: the part of a recipe's signature that describes its vocabulary.
vocab_signature() {
  if [[ -n "$SPM_MODEL" ]]; then
    printf 'spm-model=%s dict=%s' "$(file_id "$SPM_MODEL")" "$(file_id "$DICT_FILE")"
  else
    printf 'vocab-size=%s' "$VOCAB"
  fi
}

# ------------------------------------------------------------------ the shared tail of a recipe

# finish_recipe: from DEST/raw/{train,valid,test}.{SRC,TGT} (a split whose files are absent is
# skipped) to the binarized data set.  Globals it reads:
#   DEST SRC TGT VOCAB SPM_MODEL DICT_FILE WORKERS EXTRA_*   (see above)
#   CLEAN=1            filter the training pairs like clean-corpus-n (ratio 1.5, 1..250 pieces)
#   SRC_MAX_TOKENS=N   truncate every encoded source line to N pieces ("" = no truncation)
#   DENOISE_RATIO=R    add to train one pair per training target: the target with about R of
#                      its words deleted in spans -> the target (cmasd-prep denoise-pairs;
#                      "" = none).  Not to the vocabulary: it is trained on the plain pairs.
#   SPM_TRAIN_ARGS=()  extra cmasd-prep spm-train options
# Layout it leaves in DEST:
#   spm.model, dict.txt (+ spm.vocab when trained here), tok/SPLIT.LANG (pieces),
#   SPLIT.SRC-TGT.LANG.{bin,idx}, dict.SRC.txt, dict.TGT.txt, preprocess.log
finish_recipe() {
  local split lang
  local -a splits=()
  for split in train valid test; do
    [[ -f "$DEST/raw/$split.$SRC" ]] && splits+=("$split")
  done
  (( ${#splits[@]} )) || die "internal: no raw split in $DEST/raw"
  mkdir -p "$DEST/tok"

  if ! done_step vocab; then
    prepare_vocab "$DEST" "$VOCAB" "$SPM_MODEL" "$DICT_FILE" \
      "$DEST/raw/train.$SRC,$DEST/raw/train.$TGT" ${SPM_TRAIN_ARGS[@]+"${SPM_TRAIN_ARGS[@]}"}
    mark_done vocab
  fi

  if ! done_step encode; then
    rm -f "$DEST/tok/train.plain".*  # the pairs denoise-train starts from are encoded again
    for split in "${splits[@]}"; do
      for lang in "$SRC" "$TGT"; do
        local out="$DEST/tok/$split.$lang"
        [[ "$split" == train && "${CLEAN:-0}" == 1 ]] && out="$DEST/tok/train.unfiltered.$lang"
        local -a trunc=()
        [[ "$lang" == "$SRC" && -n "${SRC_MAX_TOKENS:-}" ]] && trunc=(--max-tokens "$SRC_MAX_TOKENS")
        "${PREP[@]}" spm-encode --model "$DEST/spm.model" ${trunc[@]+"${trunc[@]}"} \
          "$DEST/raw/$split.$lang" "$out"
      done
    done
    mark_done encode
  fi

  if [[ "${CLEAN:-0}" == 1 && -f "$DEST/raw/train.$SRC" ]] && ! done_step filter-train; then
    "${PREP[@]}" clean-corpus --ratio 1.5 --min-tokens 1 --max-tokens 250 \
      "$DEST/tok/train.unfiltered.$SRC" "$DEST/tok/train.unfiltered.$TGT" \
      "$DEST/tok/train.$SRC" "$DEST/tok/train.$TGT"
    rm -f "$DEST/tok/train.plain".*
    mark_done filter-train
  fi

  if [[ -n "${DENOISE_RATIO:-}" && -f "$DEST/raw/train.$SRC" ]] && ! done_step denoise-train; then
    # from the encoded pairs, kept as train.plain.* so that a rerun never adds them twice
    for lang in "$SRC" "$TGT"; do
      [[ -f "$DEST/tok/train.plain.$lang" ]] || mv "$DEST/tok/train.$lang" "$DEST/tok/train.plain.$lang"
    done
    "${PREP[@]}" denoise-pairs --ratio "$DENOISE_RATIO" \
      "$DEST/tok/train.plain.$SRC" "$DEST/tok/train.plain.$TGT" "$DEST/tok/train.$SRC" "$DEST/tok/train.$TGT"
    mark_done denoise-train
  fi

  if ! done_step binarize; then
    # Stale binaries (an earlier vocabulary) must not survive, extra test sets included.
    local marker
    for marker in "$STEP_DIR"/extra-*; do
      [[ -f "$marker" ]] || continue
      local old_name="${marker##*/extra-}"
      rm -f "$marker" "$DEST/raw/$old_name".* "$DEST/tok/$old_name".*
    done
    rm -f "$DEST"/*.bin "$DEST"/*.idx
    binarize "$DEST" "$SRC" "$TGT" "$WORKERS" "${splits[@]}"
    mark_done binarize
  fi

  local i sig
  for i in "${!EXTRA_NAMES[@]}"; do
    sig="${EXTRA_SRCS[$i]}:$(file_id "${EXTRA_SRCS[$i]}") ${EXTRA_TGTS[$i]}:$(file_id "${EXTRA_TGTS[$i]}")"
    if ! done_step "extra-${EXTRA_NAMES[$i]}" "$sig"; then
      add_extra_test "$DEST" "$SRC" "$TGT" "${EXTRA_NAMES[$i]}" "${EXTRA_SRCS[$i]}" "${EXTRA_TGTS[$i]}"
      mark_done "extra-${EXTRA_NAMES[$i]}" "$sig"
    fi
  done

  summarize "$DEST"
}
