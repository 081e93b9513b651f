#!/usr/bin/env bash
# Train a Spec-Drafter (cmasd.models.spec_drafter) for a verifier with stock fairseq-train.
# Run with --help for the recipe.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: bash data-prep/train-drafter.sh DATASET VERIFIER [fairseq-train options...]

Trains the Spec-Drafter of the CM-ASD / SpecDec setup (2 decoder layers at the verifier's
width, the verifier's frozen encoder, k_max = 25 mask slots) with stock fairseq-train:
  --user-dir fairseq_plugins --task translation_speculative --criterion spec_drafter_loss
  --arch spec_drafter_base --verifier-path VERIFIER
(one architecture for every verifier: widths, heads and positions follow the verifier;
spec_drafter_compact is another name for it, kept for older commands and checkpoints)

DATASET   a data-bin directory, or the name of one under data-bin/ (e.g. multi30k, or
          multi30k-distill made by data-prep/distill.sh: SpecDec trains the drafter on the
          verifier's own greedy outputs). It must be binarized with the verifier's dictionary.
VERIFIER  the verifier checkpoint (.pt).

Recipe (each can be overridden: options given after VERIFIER come last and win):
  --block-size 25 --decoder-layers 2 --drafter-cuts 4
  --optimizer adam --adam-betas (0.9,0.98) --clip-norm 1.0 --weight-decay 0.0001
  --lr 7e-4 --lr-scheduler inverse_sqrt --warmup-updates 1000 --warmup-init-lr 1e-7
  --dropout 0.1 --label-smoothing 0.1 --glat-schedule 0 (e.g. 0.5:0.1@20000 for glancing)
  --max-tokens 4096 --max-update 30000
  --best-checkpoint-metric exp_accept --maximize-best-checkpoint-metric
  --save-dir checkpoints/drafter-NAME (NAME = the data-bin's folder name)
  --cpu when torch sees no CUDA device; otherwise fairseq uses every visible GPU
  (data-parallel; choose them with CUDA_VISIBLE_DEVICES; --update-freq N keeps the
  effective batch when using fewer GPUs). Add --fp16 on GPUs that support it.
  --drafter-bf16-autocast on a CPU with native bfloat16 (AVX512-BF16 or AMX): the forward
  pass under torch.autocast(bfloat16), float32 weights and optimizer; about twice the
  updates per hour on the 2-core development machine. CMASD_DRAFTER_FP32=1 leaves it out.
Validation logs acc@1..acc@5, acc@25 and exp_accept (mean tokens accepted per block
under exact matching).

Environment: CMASD_PYTHON (python with fairseq and torch; default .venv/bin/python);
CMASD_DRAFTER_FP32=1 (train in float32 on a CPU with native bfloat16).
EOF
}

recipe() {
  RECIPE=(--drafter-cuts 4
    --arch spec_drafter_base --verifier-path "$VERIFIER" --block-size 25 --decoder-layers 2
    --criterion spec_drafter_loss --label-smoothing 0.1 --glat-schedule 0
    --optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 1.0 --weight-decay 0.0001
    --lr 7e-4 --lr-scheduler inverse_sqrt --warmup-updates 1000 --warmup-init-lr 1e-7
    --dropout 0.1 --max-tokens 4096 --max-update 30000
    --best-checkpoint-metric exp_accept --maximize-best-checkpoint-metric)
  log "drafter for $VERIFIER (width $WIDTH) on $DATA"
}

train_recipe drafter recipe "$@"
