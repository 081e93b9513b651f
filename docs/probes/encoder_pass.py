"""The verifier's encoder (``DecodingEncoder``) on the test split's first batches, its layers in
one call of the fused C++ layers and layer by layer (``fused`` off), alternating over rounds:
median ms a batch, and the largest difference of the two outputs on the first batch
(docs/results/speculation-pays.md, "thirty-first session").

    .venv/bin/python docs/probes/encoder_pass.py DATA [--batch-size 1] [--batches 100] [--rounds 5] [--rows N]

``--rows N``: the encoder's row limit in the fused layers (``ENCODER_MAX_ROWS``) at N for this run.
"""

import argparse
import statistics
import time

import torch

from cmasd.tools.bench import configs, loading

MODEL = "/work/shared/models/multi30k-en-de-compact/verifier.pt"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("--path", default=MODEL)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, default=None)
    a = ap.parse_args()
    if a.rows is not None:
        from cmasd.layers import prepared

        prepared.ENCODER_MAX_ROWS = a.rows
    args = argparse.Namespace(data=a.data, path=a.path, drafter_path=None, ar_drafter_path=None, exit_heads_path=None,
                              blockwise_heads_path=None, source_lang=None, target_lang=None, gen_subset="test",
                              max_sentences=a.batches * a.batch_size, threads=2, cpu=True, fp16=False, bf16=False)
    setup = loading.load_setup(args, [])
    config = [c for c in configs.resolve_configs("loop-greedy") if c.name != "greedy"][0]
    encode = loading.build_generator(setup, config, {}, {}).encode
    batches = loading.build_batches(setup, a.batch_size)[: a.batches]
    fused = encode.fused
    if fused is None:
        raise SystemExit("the encoder has no fused layers here (gemv or bf16 kernels are needed)")
    whole = sum(encode.takes_whole(*b["net_input"]["src_tokens"].shape) for b in batches)
    ms = {True: [], False: []}
    with torch.no_grad():
        for _ in range(a.rounds):
            for on in (True, False):
                encode.fused = fused if on else None
                t0 = time.perf_counter()
                for b in batches:
                    encode(b["net_input"])
                ms[on].append((time.perf_counter() - t0) / len(batches) * 1e3)
        first = batches[0]["net_input"]
        encode.fused = fused
        got = encode(first)["encoder_out"][0]
        encode.fused = None
        layered = encode(first)["encoder_out"][0]
    print(f"batch {a.batch_size}, {len(batches)} batches ({whole} within the fused layers' limits): fused "
          f"{statistics.median(ms[True]):.3f} ms, layer by layer {statistics.median(ms[False]):.3f} ms a batch; "
          f"largest difference {(got - layered).abs().max():.2e}")


if __name__ == "__main__":
    main()
