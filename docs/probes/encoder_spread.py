"""How far apart a fairseq encoder keeps its source positions, layer by layer.

The probe behind docs/RESULTS.md's "encoder collapse" table (2026-11-26): for each
checkpoint, the encoder runs (float32, fairseq's own forward, ``return_all_hiddens``) on
the first N sentences of a split, and each layer's states over every non-pad source
position of those sentences get their standard deviation per channel, averaged over
channels. An encoder that collapsed gives the decoder the same vector for every
position (a spread near 0); at initialisation it is about 1.

    python docs/probes/encoder_spread.py DATA CHECKPOINT [CHECKPOINT ...] [--subset valid] [--sentences 8]
"""

import torch

from probe_models import each_checkpoint, parse_args


def spread(states: torch.Tensor, keep: torch.Tensor) -> float:
    """Mean over channels of the std over kept positions: states (T, B, C), keep (T, B)."""
    return states[keep].std(0).mean().item()


def main() -> None:
    args = parse_args(__doc__)
    for path, model, task, dataset in each_checkpoint(args):
        batch = dataset.collater([dataset[i] for i in range(min(args.sentences, len(dataset)))])
        src = batch["net_input"]["src_tokens"]
        with torch.no_grad():
            out = model.encoder(src, src_lengths=batch["net_input"]["src_lengths"], return_all_hiddens=True)
        keep = src.ne(task.source_dictionary.pad()).t()
        layers = [spread(h, keep) for h in out["encoder_states"]]  # embeddings, then each layer's output
        print(f"{path}: embeddings {layers[0]:.2g}; layers 1..{len(layers) - 1} "
              + " ".join(f"{v:.2g}" for v in layers[1:])
              + f"; encoder output (after any final layer norm) {spread(out['encoder_out'][0], keep):.3g}", flush=True)


if __name__ == "__main__":
    main()
