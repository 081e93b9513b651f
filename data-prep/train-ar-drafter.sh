#!/usr/bin/env bash
# Train an autoregressive draft model (cmasd.models.ar_drafter) for a verifier with
# fairseq-train. Run with --help for the recipe.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'USAGE'
Usage: bash data-prep/train-ar-drafter.sh DATASET VERIFIER [fairseq-train options...]

Trains a small autoregressive draft model for speculative decoding with
--drafter-kind autoregressive: the verifier's encoder (copied and frozen: decoding then
reuses the verifier's encoder output) and a 1-layer decoder at the verifier's width, started
from the verifier's bottom decoder layer, target embeddings (tied input/output) and
positions, trained with fairseq's own label-smoothed cross-entropy:
  --user-dir fairseq_plugins --task translation_speculative --drafter-cuts 0
  --arch ar_drafter_1l --verifier-path VERIFIER --criterion label_smoothed_cross_entropy

DATASET   a data-bin directory, or the name of one under data-bin/; best the verifier's own
          outputs (data-prep/distill.sh: DATASET-distill), so that the draft model imitates
          the verifier rather than the references. It must be binarized with the verifier's
          dictionary.
VERIFIER  the verifier checkpoint (.pt).

Recipe (each can be overridden: options given after VERIFIER come last and win):
  --decoder-layers 1 --dropout 0.1 --label-smoothing 0.1
  --optimizer adam --adam-betas (0.9,0.98) --clip-norm 1.0 --weight-decay 0.0001
  --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 200 --warmup-init-lr 1e-7
  --max-tokens 4096 --max-update 30000
  --save-dir checkpoints/ar-drafter-NAME (NAME = the data-bin's folder name)
  --cpu when torch sees no CUDA device, and --drafter-bf16-autocast on a CPU with native
  bfloat16 (the forward pass under torch.autocast(bfloat16), float32 weights and optimizer;
  CMASD_DRAFTER_FP32=1 leaves it out). Add --fp16 on GPUs that support it.
  --train-encoder trains the encoder copy too (then the draft model runs its own encoder at
  decoding time); --decoder-layers 2 for a deeper draft model.
Validation logs loss and nll_loss on the valid split; the best checkpoint has the lowest loss.
Any fairseq Transformer with the verifier's dictionary also drafts (--arch transformer with
--share-all-embeddings, trained on the same data): this recipe is the cheap one on a CPU.

Environment: CMASD_PYTHON (python with fairseq and torch; default .venv/bin/python);
CMASD_DRAFTER_FP32=1 (train in float32 on a CPU with native bfloat16).
USAGE
}

recipe() {
  RECIPE=(--drafter-cuts 0
    --arch ar_drafter_1l --verifier-path "$VERIFIER" --decoder-layers 1
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 1.0 --weight-decay 0.0001
    --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 200 --warmup-init-lr 1e-7
    --dropout 0.1 --max-tokens 4096 --max-update 30000)
  log "autoregressive draft model for $VERIFIER (width $WIDTH) on $DATA"
}

train_recipe ar-drafter recipe "$@"
