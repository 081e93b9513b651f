#!/usr/bin/env bash
# Train SpecBound's exit heads (cmasd.models.exit_heads) for a verifier with stock fairseq-train.
# Run with --help for the recipe.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF_USAGE'
Usage: bash data-prep/train-exit-heads.sh DATASET VERIFIER [fairseq-train options...]

Trains the exit heads SpecBound drafts with (seed 002): one head per intermediate decoder
layer of the frozen VERIFIER (a layer norm of its own before the verifier's output
projection and a C x C linear map started from the identity), learning to predict the
verifier's own next token, with stock fairseq-train:
  --user-dir fairseq_plugins --task translation_speculative --drafter-cuts 0
  --arch exit_heads --criterion exit_heads_loss --verifier-path VERIFIER

DATASET   a data-bin directory, or the name of one under data-bin/ (best: the verifier's own
          outputs, data-prep/distill.sh, which decoding feeds the heads). It must be
          binarized with the verifier's dictionary.
VERIFIER  the verifier checkpoint (.pt); it never changes and is not saved with the heads,
          whose checkpoint keeps its fingerprint: decoding refuses another verifier.

Recipe (each can be overridden: options given after VERIFIER come last and win):
  --label-smoothing 0.1 --optimizer adam --adam-betas (0.9,0.98) --lr 1e-3
  --lr-scheduler inverse_sqrt --warmup-updates 200 --warmup-init-lr 1e-7
  --max-tokens 4096 --max-update 3000
  --best-checkpoint-metric agree --maximize-best-checkpoint-metric
  --save-dir checkpoints/exit-heads-NAME (NAME = the data-bin's folder name)
  --exit-adapter: each head's C x C map (CMASD_EXIT_ADAPTER=0 leaves it out: a layer norm
  alone, which agreed far less with the verifier; docs/RESULTS.md)
  --cpu when torch sees no CUDA device; --drafter-bf16-autocast on a CPU with native
  bfloat16 (CMASD_DRAFTER_FP32=1 leaves it out).
Time on 2 CPU cores (the compact 6+6-layer Multi30k verifier, its distilled data): about
0.3 updates/s, every update running the whole frozen verifier; 274 updates (15 minutes)
gave heads agreeing 39-87% with the verifier (docs/RESULTS.md).
Validation logs agree@1 .. agree@(L-1): the % of positions where each layer's head
predicts the verifier's own token, and their mean (agree).

Decode with: fairseq-generate ... --drafter-kind specbound --drafter-path HEADS.pt
Environment: CMASD_PYTHON (python with fairseq and torch; default .venv/bin/python).
EOF_USAGE
}

recipe() {
  local head_options=(--exit-adapter)
  if [[ "${CMASD_EXIT_ADAPTER:-1}" == 0 ]]; then head_options=(); fi
  RECIPE=(--drafter-cuts 0
    --arch exit_heads --verifier-path "$VERIFIER" ${head_options[@]+"${head_options[@]}"}
    --criterion exit_heads_loss --label-smoothing 0.1
    --optimizer adam --adam-betas '(0.9,0.98)' --lr 1e-3
    --lr-scheduler inverse_sqrt --warmup-updates 200 --warmup-init-lr 1e-7
    --max-tokens 4096 --max-update 3000
    --best-checkpoint-metric agree --maximize-best-checkpoint-metric)
  log "exit heads for $VERIFIER on $DATA"
}

train_recipe exit-heads recipe "$@"
