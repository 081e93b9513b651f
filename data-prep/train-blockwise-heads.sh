#!/usr/bin/env bash
# Train blockwise parallel decoding's heads (cmasd.models.blockwise_heads) for a verifier with
# stock fairseq-train. Run with --help for the recipe.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF_USAGE'
Usage: bash data-prep/train-blockwise-heads.sh DATASET VERIFIER [fairseq-train options...]

Trains the k - 1 extra heads of blockwise parallel decoding (Stern et al., 2018; the
Blockwise rows of seed 000) on the frozen VERIFIER's last decoder state, head i predicting
the token i positions ahead, with stock fairseq-train:
  --user-dir fairseq_plugins --task translation_speculative --drafter-cuts 0
  --arch blockwise_heads --criterion blockwise_heads_loss --verifier-path VERIFIER

DATASET   a data-bin directory, or the name of one under data-bin/ (best: the verifier's own
          outputs, data-prep/distill.sh: what exact verification accepts). It must be
          binarized with the verifier's dictionary.
VERIFIER  the verifier checkpoint (.pt); it never changes and is not saved with the heads,
          whose checkpoint keeps its fingerprint: decoding refuses another verifier.

Recipe (each can be overridden: options given after VERIFIER come last and win):
  --blockwise-k 25 (decoding may send fewer: --spec-k 9 uses heads 2..10, the k = 10 row)
  --blockwise-ffn-dim 1024 --label-smoothing 0.1 --optimizer adam --adam-betas (0.9,0.98)
  --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 100 --warmup-init-lr 1e-7
  --max-tokens 1024 --max-update 3000 (small batches: the same compute makes 4x the updates)
  --best-checkpoint-metric acc --maximize-best-checkpoint-metric
  --save-dir checkpoints/blockwise-heads-NAME (NAME = the data-bin's folder name)
  --cpu when torch sees no CUDA device; --drafter-bf16-autocast on a CPU with native
  bfloat16 (CMASD_DRAFTER_FP32=1 leaves it out).
Time on 2 CPU cores (the compact 6+6-layer Multi30k verifier, its distilled data): about
125 target tokens/s at k = 25 (each token through 24 output projections): 253 updates in
28 minutes gave head 2 51% and head 3 32% valid accuracy (docs/RESULTS.md).
Validation logs acc@2 .. acc@5 and acc@k (% of positions each head predicts right) and
their mean over the heads (acc).

Decode with: fairseq-generate ... --drafter-path HEADS.pt --spec-k K-1 --spec-acceptance exact
Environment: CMASD_PYTHON (python with fairseq and torch; default .venv/bin/python).
EOF_USAGE
}

recipe() {
  RECIPE=(--drafter-cuts 0
    --arch blockwise_heads --verifier-path "$VERIFIER" --blockwise-k 25 --blockwise-ffn-dim 1024
    --criterion blockwise_heads_loss --label-smoothing 0.1
    --optimizer adam --adam-betas '(0.9,0.98)' --lr 1e-3
    --lr-scheduler inverse_sqrt --warmup-updates 100 --warmup-init-lr 1e-7
    --max-tokens 1024 --max-update 3000
    --best-checkpoint-metric acc --maximize-best-checkpoint-metric)
  log "blockwise heads for $VERIFIER on $DATA"
}

train_recipe blockwise-heads recipe "$@"
