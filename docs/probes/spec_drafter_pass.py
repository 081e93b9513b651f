"""One Spec-Drafter pass as decoding runs it (``SpecDrafter.logits``: the tokens accepted since
the last pass fed, then the block's slots), in the fused C++ layers and layer by layer on the
same kernels, interleaved in rounds. Median ms of the rounds' means
(docs/results/speculation-pays.md, "thirtieth session"). ``--parts`` then times the fused pass
alone (2,000 calls) with its two calls into the prepared decoder wrapped: the layers
(``block_states``) and the final norm and output projection (``logits``); the rest of the pass is
the whole less both.

    .venv/bin/python docs/probes/spec_drafter_pass.py DATA DRAFTER.pt [--configs specdec-k5-exact,...]
        [--batch-sizes 1,16] [--prefix 12] [--new 2] [--rounds 21] [--calls 50] [--parts]
"""

import argparse
import statistics
import time

import torch

from cmasd.drafters.base import Source
from cmasd.tools.bench import configs, loading

MODEL = "/work/shared/models/multi30k-en-de-compact/verifier.pt"


def drafter_pass(drafter, source, prefix, new, block):
    """A call of ``drafter.logits`` on a cache holding ``prefix`` tokens of each row, feeding
    ``new`` more: each call starts from the same cached count (the cache is append-only, so
    the count is put back; the keys it wrote are the same each time)."""
    bsz = source.tokens.size(0)
    state = drafter.built(drafter.start(source, prefix + new + block + 1))
    tokens = torch.randint(4, 100, (bsz, prefix + new))
    tokens[:, 0] = 2
    lengths = torch.full((bsz,), prefix + new)
    _, warm = drafter.logits(state, tokens, torch.full((bsz,), prefix), slots=block, block=block)
    cached = warm.cached.clone()

    def call():
        warm.cached.copy_(cached)
        drafter.logits(warm, tokens, lengths, slots=block, block=block)
    return call


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("drafter")
    parser.add_argument("--path", default=MODEL)
    parser.add_argument("--configs", default="specdec-k5-exact,specdec-k5-exact-bf16:base=specdec-k5-exact;"
                        "spec_drafter_quantize=bf16")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--prefix", type=int, default=12)
    parser.add_argument("--new", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parts", action="store_true", help="also time the fused pass's layers and projection")
    a = parser.parse_args()
    args = argparse.Namespace(data=a.data, path=a.path, drafter_path=a.drafter, ar_drafter_path=None,
                              exit_heads_path=None, blockwise_heads_path=None, source_lang=None, target_lang=None,
                              gen_subset="test", max_sentences=64, threads=a.threads, cpu=True, fp16=False, bf16=False)
    setup = loading.load_setup(args, ["spec"])
    torch.set_num_threads(a.threads)
    for config in [c for c in configs.resolve_configs(a.configs) if c.name != "greedy"]:
        generator = loading.build_generator(setup, config, {}, loading.drafter_paths(args))
        drafter = generator.drafter
        block = drafter.block
        for bsz in [int(b) for b in a.batch_sizes.split(",")]:
            batch = loading.build_batches(setup, bsz)[0]
            net_input = batch["net_input"]
            with torch.no_grad():
                source = Source(net_input["src_tokens"], net_input["src_lengths"], generator.encode(net_input))
                fused = drafter_pass(drafter, source, a.prefix, a.new, block)
                takes_whole = drafter.decoder.takes_whole
                drafter.decoder.takes_whole = lambda batch, width: False
                stepwise = drafter_pass(drafter, source, a.prefix, a.new, block)
                calls = {"fused": (fused, takes_whole), "layer by layer": (stepwise, drafter.decoder.takes_whole)}
                times = {name: [] for name in calls}
                for _ in range(a.rounds):
                    for name, (call, rule) in calls.items():
                        drafter.decoder.takes_whole = rule
                        for _ in range(5):
                            call()
                        t0 = time.perf_counter()
                        for _ in range(a.calls):
                            call()
                        times[name].append((time.perf_counter() - t0) / a.calls * 1e3)
                drafter.decoder.takes_whole = takes_whole
                parts = ", ".join(f"{name} {statistics.median(t):.3f} ms" for name, t in times.items())
                print(f"{config.name} rows {bsz} block {block} prefix {a.prefix} new {a.new}: {parts}", flush=True)
                if a.parts:
                    print(f"  fused, {timed_parts(drafter.decoder, fused)}", flush=True)


def timed_parts(decoder, call, calls=2000):
    """``call`` run ``calls`` times with ``decoder``'s ``block_states`` and ``logits`` wrapped
    (restored after): ms a call of the whole and of each."""
    spent = {"block_states": 0.0, "logits": 0.0}
    originals = {name: getattr(decoder, name) for name in spent}  # bound methods of the class

    def wrapped(name):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            result = originals[name](*args, **kwargs)
            spent[name] += time.perf_counter() - t0
            return result
        return timed

    for name in spent:
        setattr(decoder, name, wrapped(name))
    try:
        for _ in range(50):
            call()
        for name in spent:
            spent[name] = 0.0
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        whole = time.perf_counter() - t0
    finally:
        for name in originals:
            delattr(decoder, name)  # the class's methods again
    parts = ", ".join(f"{name} {seconds / calls * 1e3:.3f} ms" for name, seconds in spent.items())
    return f"whole {whole / calls * 1e3:.3f} ms: {parts}"


if __name__ == "__main__":
    main()
