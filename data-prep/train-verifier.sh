#!/usr/bin/env bash
# Train a plain fairseq Transformer (the "verifier" of speculative decoding) on a binarized data set.
# Run with --help for the recipes.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF
Usage: bash data-prep/train-verifier.sh DATASET [base|base-small|compact|compact-short|bart-compact] [fairseq-train options...]

DATASET   a name under $CMASD_ROOT/data-bin/ (multi30k, wmt14-en-de, ...) or a path to a
          fairseq-preprocess output directory with a train split and a joined dictionary
SIZE      base (default): --arch transformer_wmt_en_de --share-all-embeddings (6+6 layers,
            512/2048, 8 heads), adam (0.9, 0.98), lr 5e-4, inverse_sqrt, 4000 warmup updates
            from 1e-7, dropout 0.1, label smoothing 0.1, max-tokens 4096, clip-norm 0,
            weight-decay 0, --fp16 when a CUDA GPU is present
          base-small: the same model (the size fairseq and CTranslate2 users deploy) with a
            schedule for a small corpus such as Multi30k (about 136 updates an epoch at
            max-tokens 4096): dropout 0.3, attention-dropout 0.1, activation-dropout 0.1,
            weight-decay 1e-4, 800 warmup updates from 1e-7 (about 6 Multi30k epochs), lr 5e-4,
            seed 1; through cmasd's task with bfloat16 autocast where the CPU has it (as
            compact-short; decoding it needs --user-dir fairseq_plugins), --fp16 on a GPU. On a
            2-core AMD EPYC Zen 1 (float32) an update takes 26.5 s, an epoch an hour; on a 2-core
            Intel Xeon with AMX (bfloat16 autocast) 3.4 s, an epoch 8 minutes (--stop-time-hours
            1.15: 1,214 updates, valid perplexity 13.0); on a 2-core AMD EPYC Zen 4 (bfloat16
            autocast on AVX512-BF16) 6.2 s. Time it first with --max-update 20
            --no-save --disable-validation ("done training in N seconds")
          compact: the recipe of the shared compact Multi30k verifier
            (models/multi30k-en-de-compact/README.md): 6+6 layers, 256/1024, 4 heads, shared
            embeddings, dropout 0.3, attention-dropout 0.1, weight-decay 1e-4, adam (0.9, 0.98),
            lr 1e-3, inverse_sqrt, 400 warmup updates from 1e-7, label smoothing 0.1,
            max-tokens 4096, seed 1 (fp32; add --fp16 yourself on a GPU)
          compact-short: compact for runs under an hour (make demo): dropout 0.1, 200 warmup
            updates, through cmasd's task with bfloat16 autocast where the CPU has it (as
            bart-compact; decoding it needs --user-dir fairseq_plugins)
          bart-compact: fairseq's BART architecture (--arch bart_base: learned positions,
            layernorm_embedding, GELU, shared embeddings) at 6+6 layers, 256/1024, 4 heads,
            pre-norm (--encoder-normalize-before --decoder-normalize-before, as mBART; trained
            from scratch, post-norm BART's encoder collapses: every source position gives the
            same state within 1,000 updates, docs/RESULTS.md), for summarization: dropout 0.1,
            attention-dropout 0.1, weight-decay 0.01, adam (0.9, 0.98), lr 1e-3, inverse_sqrt,
            500 warmup updates from 1e-7, no gradient clipping, label smoothing 0.1, max-tokens
            4096, sources and targets up to 1024 positions (longer sources are cut:
            --truncate-source), seed 1; through cmasd's task (--user-dir fairseq_plugins --task
            translation_speculative --drafter-cuts 0, so decoding it needs --user-dir too), with
            the forward pass under bfloat16 autocast on a CPU with native bfloat16
            (--drafter-bf16-autocast; CMASD_DRAFTER_FP32=1 trains in float32).  On SAMSum, train
            it on prepare-samsum.sh --with-summary-denoising's data (samsum-denoise): without
            its copy pairs, two hours on 2 cores left the model ignoring its dialogue
Further options go to fairseq-train unchanged and win over the recipe's, e.g.
  --max-update 200, --max-epoch 30, --stop-time-hours 1.5, --no-epoch-checkpoints, --patience 5
--cpu is added when torch sees no CUDA GPU.

Checkpoints and the training log: $CMASD_ROOT/checkpoints/verifier-<DATASET name>-<SIZE>/,
or the --save-dir given (checkpoint_best.pt, checkpoint_last.pt, checkpoint<epoch>.pt,
train.log).  A rerun resumes from checkpoint_last.pt (fairseq's own behaviour); then
--user-dir fairseq_plugins is added, whose import lets torch >= 2.6 load fairseq checkpoints.
Environment: CMASD_PYTHON (python with fairseq).
EOF
}

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  "") usage >&2; die "missing DATASET" ;;
esac
DATASET="$1"
shift
SIZE=base
if (( $# )) && [[ "$1" != -* ]]; then
  SIZE="$1"
  shift
fi
for arg in "$@"; do
  [[ "$arg" == -h || "$arg" == --help ]] && { usage; exit 0; }
done

VIA_TASK=0
case "$SIZE" in
  base|base-small)
    # base-small: the same model with a schedule and regularisation for a small corpus
    if [[ "$SIZE" == base ]]; then
      warmup=4000 regularisation=(--dropout 0.1 --weight-decay 0.0)
    else
      warmup=800 VIA_TASK=1
      regularisation=(--dropout 0.3 --attention-dropout 0.1 --activation-dropout 0.1 --weight-decay 0.0001)
    fi
    RECIPE=(
      --arch transformer_wmt_en_de --share-all-embeddings
      --optimizer adam --adam-betas "(0.9, 0.98)" --clip-norm 0.0
      --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates "$warmup" --warmup-init-lr 1e-07
      "${regularisation[@]}"
      --criterion label_smoothed_cross_entropy --label-smoothing 0.1
      --max-tokens 4096 --seed 1
    ) ;;
  compact|compact-short)
    # compact-short: the same model with a schedule for runs under an hour
    if [[ "$SIZE" == compact ]]; then dropout=0.3 warmup=400; else dropout=0.1 warmup=200 VIA_TASK=1; fi
    RECIPE=(
      --arch transformer --share-all-embeddings
      --encoder-layers 6 --decoder-layers 6
      --encoder-embed-dim 256 --decoder-embed-dim 256
      --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024
      --encoder-attention-heads 4 --decoder-attention-heads 4
      --dropout "$dropout" --attention-dropout 0.1 --weight-decay 0.0001
      --optimizer adam --adam-betas "(0.9,0.98)" --lr 1e-3
      --lr-scheduler inverse_sqrt --warmup-updates "$warmup" --warmup-init-lr 1e-7
      --max-tokens 4096 --criterion label_smoothed_cross_entropy --label-smoothing 0.1
      --seed 1
    ) ;;
  bart-compact)
    VIA_TASK=1
    RECIPE=(
      --arch bart_base --encoder-normalize-before --decoder-normalize-before
      --encoder-layers 6 --decoder-layers 6
      --encoder-embed-dim 256 --decoder-embed-dim 256
      --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024
      --encoder-attention-heads 4 --decoder-attention-heads 4
      --dropout 0.1 --attention-dropout 0.1 --weight-decay 0.01
      --optimizer adam --adam-betas "(0.9,0.98)" --clip-norm 0.0 --lr 1e-3
      --lr-scheduler inverse_sqrt --warmup-updates 500 --warmup-init-lr 1e-7
      --max-tokens 4096 --criterion label_smoothed_cross_entropy --label-smoothing 0.1
      --max-source-positions 1024 --max-target-positions 1024 --truncate-source
      --seed 1
    ) ;;
  *) die "unknown size '$SIZE': use base, base-small, compact, compact-short or bart-compact (see --help)" ;;
esac
# the recipes that train through cmasd's task (decoding them needs --user-dir too)
if (( VIA_TASK )); then
  RECIPE=(--user-dir "$CMASD_ROOT/fairseq_plugins" --task translation_speculative --drafter-cuts 0 "${RECIPE[@]}")
fi

resolve_data_bin "$DATASET"
shopt -s nullglob
train_idx=("$DATA"/train.*-*.*.idx)
shopt -u nullglob
(( ${#train_idx[@]} )) || die "dataset $DATA has no binarized train split (train.SRC-TGT.LANG.idx):" \
  "a test-only set (such as cnndm-sample) cannot be trained on"
NAME="$(basename "$DATA")"
# a --save-dir of the caller moves the checkpoints, the log and the resume check there
save_dir_from "$CMASD_ROOT/checkpoints/verifier-$NAME-$SIZE" "$@"

training_device "$([[ "$SIZE" == base* ]] && echo 1 || echo 0)" "$@"
# the recipe that trains through cmasd's task: mixed precision where the CPU has bfloat16
if [[ "$DEVICE_KIND" == cpu ]] && (( VIA_TASK )) && [[ "${CMASD_DRAFTER_FP32:-0}" != 1 ]] &&
  "$PY" -c "import sys, torch; sys.exit(0 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else 1)" 2>/dev/null; then
  DEVICE_ARGS+=(--drafter-bf16-autocast)
  log "this CPU has native bfloat16: training with --drafter-bf16-autocast (CMASD_DRAFTER_FP32=1 trains in float32)"
fi

RESUME_ARGS=()
if [[ -f "$SAVE/checkpoint_last.pt" ]]; then
  user_dir_given=0
  for arg in "$@"; do [[ "$arg" == --user-dir || "$arg" == --user-dir=* ]] && user_dir_given=1; done
  if (( ! user_dir_given && ! VIA_TASK )) && [[ -f "$CMASD_ROOT/fairseq_plugins/__init__.py" ]]; then
    RESUME_ARGS=(--user-dir "$CMASD_ROOT/fairseq_plugins")
  fi
  log "resuming from $SAVE/checkpoint_last.pt"
fi

fairseq_tool train
log "training verifier '$SIZE' on $DATA -> $SAVE"
set -x
"${FAIRSEQ_CMD[@]}" "$DATA" "${RECIPE[@]}" \
  --save-dir "$SAVE" --log-format simple --log-interval 50 --log-file "$SAVE/train.log" \
  ${DEVICE_ARGS[@]+"${DEVICE_ARGS[@]}"} ${RESUME_ARGS[@]+"${RESUME_ARGS[@]}"} "$@"
