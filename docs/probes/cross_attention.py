"""Whether a fairseq decoder looks anywhere in particular in its source, layer by layer.

For each checkpoint, the model runs teacher-forced (float32, fairseq's own forward) on the
first N pairs of a split, one pair at a time, and each decoder layer's cross-attention
(averaged over heads, as fairseq returns it with ``alignment_layer``) gets its entropy over
the source positions, divided by the entropy of uniform attention over that source (log of
its length), and its largest weight, both averaged over target positions and pairs. A
decoder that reads its source has layers well below 1; at 1.00 in every layer it averages
the whole source whatever it writes, and its output cannot depend on the source's words.

    python docs/probes/cross_attention.py DATA CHECKPOINT [CHECKPOINT ...] [--subset valid] [--sentences 8]
"""

import math

import torch

from probe_models import each_checkpoint, parse_args


def main() -> None:
    args = parse_args(__doc__)
    for path, model, task, dataset in each_checkpoint(args):
        pairs = []  # (decoder input, encoder output): the encoder runs once a pair
        for i in range(min(args.sentences, len(dataset))):
            net_input = dataset.collater([dataset[i]])["net_input"]
            with torch.no_grad():
                encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
            pairs.append((net_input["prev_output_tokens"], encoder_out))
        rows = []
        for layer in range(len(model.decoder.layers)):
            entropy, peak = 0.0, 0.0
            for prev_output_tokens, encoder_out in pairs:
                with torch.no_grad():
                    _, extra = model.decoder(prev_output_tokens, encoder_out=encoder_out, alignment_layer=layer)
                attn = extra["attn"][0][0]  # target positions x source positions
                uniform = math.log(attn.size(1)) if attn.size(1) > 1 else 1.0
                entropy += (-(attn.clamp_min(1e-9).log() * attn).sum(-1).mean().item()) / uniform
                peak += attn.max(-1).values.mean().item()
            rows.append(f"layer {layer + 1} {entropy / len(pairs):.3f} / {peak / len(pairs):.3f}")
        print(f"{path}: entropy over uniform / largest weight: " + ", ".join(rows), flush=True)


if __name__ == "__main__":
    main()
