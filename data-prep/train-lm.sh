#!/usr/bin/env bash
# Train a fairseq language model (transformer_lm): the verifier of speculative decoding for a
# language model, or its draft model. Run with --help for the recipes.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

RECIPES=(cpu gpt draft)

usage() {
  cat <<EOF
Usage: bash data-prep/train-lm.sh DATA RECIPE [fairseq-train options...]

Trains a fairseq language model (--task language_modeling, --arch transformer_lm*) on DATA,
to continue prompts with --task language_modeling_speculative: the verifier (cpu, gpt) or
its draft model (draft, for --drafter-path).

DATA     a name under $CMASD_ROOT/data-bin/ (lm-cnndm, ...) or a path: a data-bin of
         fairseq-preprocess --only-source (train.{bin,idx}, valid.{bin,idx}, dict.txt), as
         data-prep/prepare-lm.sh and data-prep/distill-lm.sh make them
RECIPE   cpu: a transformer_lm for 2 CPU cores: 4 layers, 256 wide, ffn 1024, 4 heads,
           shared input/output embeddings (--share-decoder-input-output-embed), pre-norm
           (every transformer_lm), sinusoidal positions, ReLU; blocks of 256 tokens across
           line ends (--tokens-per-sample 256 --sample-break-mode none, fairseq's own LM
           recipe: no padding, every position trained), --max-tokens 4096 (16 blocks), adam
           (0.9, 0.98), lr 1e-3, inverse_sqrt, 200 warmup updates from 1e-7, clip-norm 1.0,
           dropout 0.1, attention-dropout 0.1, weight-decay 0.01, seed 1; it stops after one
           hour of training (--stop-time-hours 1), saves checkpoint_last.pt every 500 updates
           (--save-interval-updates 500 --keep-interval-updates 1) and validates then on the
           first 50 batches of valid (--max-valid-steps 50, about a minute).  Float32:
           fairseq's --bf16 needs an XLA device, and language_modeling has no bfloat16
           autocast.  The hour is a time limit.  Measured on a quiet 2-core VM (AMD EPYC,
           Zen 5): 525 updates in 10 minutes on 12,000 lm-cnndm articles (8,000 pieces; 0.84 updates/s,
           3,400 tokens/s), so the hour is about 3,000 updates (12M tokens); after 525
           the validation perplexity was 255 (docs/results/language-models.md).  Give
           --stop-time-hours N for longer.
         gpt: the paper's shape for a GPU: --arch transformer_lm_gpt (12 layers, 768 wide,
           ffn 3072, 12 heads, GELU, dropout 0.1, attention-dropout 0.1), shared embeddings,
           blocks of 512 tokens (--tokens-per-sample 512 --sample-break-mode none),
           --max-tokens 16384 (32 blocks), adam (0.9, 0.98, eps 1e-6), lr 5e-4, inverse_sqrt,
           4000 warmup updates from 1e-7, clip-norm 1.0, weight-decay 0.01, --max-update
           50000, seed 1, --fp16 on a CUDA GPU.  Not sized for a CPU (it runs there, slowly,
           in float32).
         draft: the draft model (seed 000's "3-layer Transformer"): a transformer_lm of 3
           layers, 128 wide, ffn 512, 4 heads, shared embeddings; blocks of 256 tokens
           (--sample-break-mode none), --max-tokens 4096, adam (0.9, 0.98), lr 1e-3,
           inverse_sqrt, 500 warmup updates, clip-norm 1.0, dropout 0.1, weight-decay 0.01,
           --max-update 20000, seed 1: with 8,000 pieces about a third of the cpu recipe's
           multiply-adds per token (the output projection dominates both).  DATA must hold
           the verifier's dictionary: best the verifier's own continuations
           (data-prep/distill-lm.sh: DATA-distill), else the verifier's data.  Give the
           verifier's --tokens-per-sample (512 for gpt) so that it has seen every position
           the verifier decodes; for a gpt verifier
           --decoder-embed-dim 256 --decoder-input-dim 256 --decoder-output-dim 256
           --decoder-ffn-embed-dim 1024 is a wider draft model still about 1/20 of its cost;
           on a CPU add --stop-time-hours.
         Width: cpu and draft give --decoder-input-dim and --decoder-output-dim with
           --decoder-embed-dim (fairseq 0.12's transformer_lm otherwise keeps 512-wide
           embeddings behind two projections); change all three together.
Further options go to fairseq-train unchanged and win over the recipe's, e.g.
  --max-update 200, --stop-time-hours 1.5, --no-epoch-checkpoints, --sample-break-mode eos
--cpu is added when torch sees no CUDA GPU, and every recipe skips validation lines longer
than its positions (--skip-invalid-size-inputs-valid-test; training skips them anyway).

Checkpoints and the training log: $CMASD_ROOT/checkpoints/lm-<DATA name>-<RECIPE>/, or the
--save-dir given (checkpoint_best.pt, checkpoint_last.pt, checkpoint<epoch>.pt, train.log).
A rerun resumes from checkpoint_last.pt (fairseq's own behaviour).  Every run gets
--user-dir fairseq_plugins (torch >= 2.6 loads fairseq checkpoints through it); continue
prompts with --task language_modeling_speculative --user-dir fairseq_plugins (README,
"Language models").
Environment: CMASD_PYTHON (python with fairseq).
EOF
}

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  "") usage >&2; die "missing DATA and RECIPE" ;;
esac
DATASET="$1"
shift
for arg in "$@"; do
  [[ "$arg" == -h || "$arg" == --help ]] && { usage; exit 0; }
done
(( $# )) && [[ "$1" != -* ]] || die "missing RECIPE after DATA: one of ${RECIPES[*]} (see --help)"
RECIPE_NAME="$1"
shift

ADAM=(--optimizer adam --adam-betas "(0.9,0.98)" --clip-norm 1.0 --lr-scheduler inverse_sqrt --warmup-init-lr 1e-07)
case "$RECIPE_NAME" in
  cpu)
    RECIPE=(
      --arch transformer_lm --share-decoder-input-output-embed
      --decoder-layers 4 --decoder-embed-dim 256 --decoder-ffn-embed-dim 1024 --decoder-attention-heads 4
      --decoder-input-dim 256 --decoder-output-dim 256
      --tokens-per-sample 256 --sample-break-mode none --max-tokens 4096
      "${ADAM[@]}" --lr 1e-3 --warmup-updates 200
      --dropout 0.1 --attention-dropout 0.1 --weight-decay 0.01
      --stop-time-hours 1 --save-interval-updates 500 --keep-interval-updates 1 --max-valid-steps 50
      --seed 1
    ) ;;
  gpt)
    RECIPE=(
      --arch transformer_lm_gpt --share-decoder-input-output-embed
      --tokens-per-sample 512 --sample-break-mode none --max-tokens 16384
      "${ADAM[@]}" --adam-eps 1e-06 --lr 5e-4 --warmup-updates 4000
      --weight-decay 0.01 --max-update 50000
      --seed 1
    ) ;;
  draft)
    RECIPE=(
      --arch transformer_lm --share-decoder-input-output-embed
      --decoder-layers 3 --decoder-embed-dim 128 --decoder-ffn-embed-dim 512 --decoder-attention-heads 4
      --decoder-input-dim 128 --decoder-output-dim 128
      --tokens-per-sample 256 --sample-break-mode none --max-tokens 4096
      "${ADAM[@]}" --lr 1e-3 --warmup-updates 500
      --dropout 0.1 --weight-decay 0.01 --max-update 20000
      --seed 1
    ) ;;
  *) die "unknown recipe '$RECIPE_NAME': use ${RECIPES[*]} (see --help)" ;;
esac

resolve_data_bin "$DATASET"
[[ -f "$DATA/train.idx" && -f "$DATA/dict.txt" ]] || die "$DATA is not a language model's data-bin" \
  "(train.idx and dict.txt of fairseq-preprocess --only-source): make one with data-prep/prepare-lm.sh"
validation=1
for arg in "$@"; do [[ "$arg" == --disable-validation ]] && validation=0; done
if (( validation )) && [[ ! -f "$DATA/valid.idx" ]]; then
  die "$DATA has no valid split (valid.idx): binarize one, or give --disable-validation"
fi
NAME="$(basename "$DATA")"
# a --save-dir of the caller moves the checkpoints, the log and the resume check there
save_dir_from "$CMASD_ROOT/checkpoints/lm-$NAME-$RECIPE_NAME" "$@"

training_device "$([[ "$RECIPE_NAME" == gpt ]] && echo 1 || echo 0)" "$@"
if [[ "$DEVICE_KIND" == cpu && "$RECIPE_NAME" == gpt ]]; then
  log "warning: the gpt recipe is sized for a GPU; on this CPU it trains in float32, slowly"
fi
[[ -f "$SAVE/checkpoint_last.pt" ]] && log "resuming from $SAVE/checkpoint_last.pt"

fairseq_tool train
log "training language model '$RECIPE_NAME' on $DATA -> $SAVE"
set -x
"${FAIRSEQ_CMD[@]}" "$DATA" --user-dir "$CMASD_ROOT/fairseq_plugins" --task language_modeling "${RECIPE[@]}" \
  --skip-invalid-size-inputs-valid-test \
  --save-dir "$SAVE" --log-format simple --log-interval 50 --log-file "$SAVE/train.log" \
  ${DEVICE_ARGS[@]+"${DEVICE_ARGS[@]}"} "$@"
