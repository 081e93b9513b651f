"""Milliseconds a batch in the verifier's encoder and in its cache's start (every layer's
cross-attention keys and values) beside a whole decode, for a bench configuration at each
batch size (docs/results/speculation-pays.md, seventeenth session: the time outside the
iterations).

    /work/main/.venv/bin/python docs/probes/encoder_share.py DATA VERIFIER.pt --batch-sizes 1,16
"""

import argparse
import statistics
import time

import torch

from cmasd.tools.bench import configs, loading


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("path")
    ap.add_argument("--config", default="loop-greedy")
    ap.add_argument("--gen-subset", default="test")
    ap.add_argument("--batch-sizes", default="1,16")
    ap.add_argument("--sentences", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    args = argparse.Namespace(data=a.data, path=a.path, drafter_path=None, ar_drafter_path=None,
                              exit_heads_path=None, blockwise_heads_path=None, source_lang=None, target_lang=None,
                              gen_subset=a.gen_subset, max_sentences=a.sentences, threads=a.threads, cpu=True,
                              fp16=False, bf16=False, prompt_tokens=32, continuation_tokens=48)
    setup = loading.load_setup(args, [])
    config = [c for c in configs.resolve_configs(a.config) if c.name != "greedy"][0]
    generator = loading.build_generator(setup, config, {}, {})
    with torch.no_grad():
        for bs in map(int, a.batch_sizes.split(",")):
            batches = loading.build_batches(setup, bs)
            for batch in batches[:5]:
                generator.decode(batch)
            encoder, start, whole = [], [], []
            for batch in batches:
                net_input = batch["net_input"]
                t0 = time.perf_counter()
                out = generator.encode(net_input)
                t1 = time.perf_counter()
                generator.scorer.start(out, 40, net_input["src_tokens"].size(0))
                t2 = time.perf_counter()
                generator.decode(batch)
                t3 = time.perf_counter()
                encoder.append(t1 - t0)
                start.append(t2 - t1)
                whole.append(t3 - t2)
            length = statistics.mean(b["net_input"]["src_lengths"].float().mean().item() for b in batches)
            print(f"batch {bs}: ms a batch: encoder {1e3 * statistics.mean(encoder):.3f}, the cache's start "
                  f"(cross keys) {1e3 * statistics.mean(start):.3f}, a whole decode {1e3 * statistics.mean(whole):.3f}; "
                  f"{length:.1f} source pieces a sentence")


if __name__ == "__main__":
    main()
