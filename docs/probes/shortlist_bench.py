"""Micro-benchmark of --spec-draft-shortlist (issue 45, item 2): one autoregressive draft-model
step at batch 1 (the scorer's pass over one token and the argmax, as the drafter's loop runs
it), and its output projection alone, with the full vocabulary and with shortlists of several
sizes; the variants interleaved round by round, medians reported.

Then the coverage: how often the verifier's greedy token (and the reference token) of the test
split lies within each shortlist, for the shortlist the option builds (the dictionary's
counts, ties in dictionary order) and for one ranked by the target side's training counts.

    python shortlist_bench.py --repo /path/to/checkout --verifier V.pt --drafter AR.pt --data DATA-BIN \
        [--greedy generate.txt]
"""

import argparse
import os
import statistics
import sys
import time
from collections import Counter


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--repo", required=True, help="the cmasd checkout to import")
    p.add_argument("--verifier", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--sizes", default="500,1000,2000,4000")
    p.add_argument("--kernels", default="auto", help="--spec-kernels of the float32 rows")
    p.add_argument("--int8", action="store_true", help="also time the int8 draft model (full, 2000)")
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--steps", type=int, default=200, help="timed calls per variant per round")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prefix", type=int, default=12, help="cached target positions before the timed step")
    p.add_argument("--greedy", help="fairseq-generate output of the verifier (H- lines) for the coverage")
    return p.parse_args()


def main():
    args = parse()
    sys.path.insert(0, os.path.abspath(args.repo))
    sys.path.insert(0, os.path.join(os.path.abspath(args.repo), "tests"))
    import torch
    from fairseq import checkpoint_utils

    import fairseq_plugins  # noqa: F401  allow-lists fairseq's checkpoint classes
    from cmasd.drafters.autoregressive import AutoregressiveDrafter
    from cmasd.drafters.shortlist import Shortlist
    from cmasd.layers.kernels import resolve_kernels
    from cmasd.options import load_drafter_model

    torch.set_num_threads(args.threads)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([args.verifier], arg_overrides={"data": args.data})
    verifier = models[0].eval()
    dictionary = task.target_dictionary
    model = load_drafter_model(args.drafter, task, like=next(verifier.parameters()))
    kernels = resolve_kernels(args.kernels, next(verifier.parameters()))
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"vocabulary {len(dictionary)} pieces; drafter decoder layers {len(model.decoder.layers)}, "
          f"width {model.decoder.embed_dim}; kernels {kernels}; threads {args.threads}", flush=True)

    variants = {f"full ({kernels})": AutoregressiveDrafter(model, kernels, True)}
    for n in sizes:
        variants[f"{n} ({kernels})"] = AutoregressiveDrafter(model, kernels, True, Shortlist.of(dictionary, n))
    if args.int8:
        variants["full (int8)"] = AutoregressiveDrafter(model, "int8", True)
        variants["2000 (int8)"] = AutoregressiveDrafter(model, "int8", True, Shortlist.of(dictionary, 2000))

    # one source sentence of the test split, its encoder output, a cached prefix
    task.load_dataset("test")
    sample = task.dataset("test")[0]
    src = sample["source"][None]
    lengths = torch.tensor([src.size(1)])
    with torch.no_grad():
        encoder_out = verifier.encoder(src, src_lengths=lengths)
    prefix = torch.cat([torch.tensor([dictionary.eos()]), sample["target"][: args.prefix - 1]])[None]  # (1, P)
    position = torch.tensor([prefix.size(1)])
    token = sample["target"][args.prefix - 1: args.prefix]  # (1,)

    setups = {}
    for name, drafter in variants.items():
        cache = drafter.scorer.start(encoder_out, prefix.size(1) + 8)
        with torch.no_grad():
            drafter.scorer.score(cache, prefix, torch.zeros(1, dtype=torch.long))
            states = drafter.scorer.states(cache, token[None], position)[:, 0]  # (1, C)
        setups[name] = (drafter, cache, states)

    def step(drafter, cache):  # one drafting step: the pass over one token, the argmax (mapped back)
        logits = drafter.scorer.score(cache, token[None], position)[:, 0]  # (1, V or N)
        best = logits.argmax(-1)
        return best if drafter.shortlist is None else drafter.shortlist.tokens(best)

    def head(drafter, states):  # the final layer norm and the output projection alone
        return drafter.scorer.decoder.logits(states)

    timings = {(name, what): [] for name in variants for what in ("step", "head")}
    with torch.no_grad():
        for name, (drafter, cache, states) in setups.items():  # warm-up
            for _ in range(50):
                step(drafter, cache)
                head(drafter, states)
        for _ in range(args.rounds):
            for name, (drafter, cache, states) in setups.items():
                for what, call, arg in (("step", step, cache), ("head", head, states)):
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        call(drafter, arg)
                    timings[name, what].append((time.perf_counter() - t0) / args.steps * 1e3)

    print("\n| vocabulary of the draft | draft step, ms (median) | IQR | output head alone, ms | step vs full |")
    print("|---|---|---|---|---|")
    full_step = {}
    for name in variants:
        kind = name.split("(")[1]
        s = sorted(timings[name, "step"])
        h = statistics.median(timings[name, "head"])
        med = statistics.median(s)
        if name.startswith("full"):
            full_step[kind] = med
        q1, q3 = s[len(s) // 4], s[3 * len(s) // 4]
        print(f"| {name} | {med:.4f} | {q1:.4f}-{q3:.4f} | {h:.4f} | {med / full_step[kind]:.2f}x |")

    coverage(args, task, dictionary, sizes)


def coverage(args, task, dictionary, sizes):
    import torch

    from cmasd.drafters.shortlist import Shortlist

    eos = dictionary.eos()
    refs = [task.dataset("test")[i]["target"].tolist() for i in range(len(task.dataset("test")))]
    train = Counter()
    task.load_dataset("train")
    data = task.dataset("train")
    for i in range(len(data)):
        train.update(data.tgt[i].tolist())
    never = {dictionary.pad(), dictionary.bos(), dictionary.unk()}
    by_train = sorted((i for i in range(len(dictionary)) if i not in never and i != eos), key=lambda i: -train[i])
    streams = {"references": refs}
    if args.greedy:
        hyps = {}
        for line in open(args.greedy, encoding="utf-8"):
            if line.startswith("H-"):
                key, _, text = line.rstrip("\n").split("\t")
                hyps[int(key[2:])] = [dictionary.index(p) for p in text.split()] + [eos]
        streams["verifier greedy"] = [hyps[i] for i in sorted(hyps)]
    print(f"\ncoverage: tokens (eos included) of the test split inside each shortlist; "
          f"{len(refs)} sentences")
    print("| shortlist | ranked by | " + " | ".join(f"{s}: tokens | {s}: non-eos tokens | {s}: whole sentences"
                                                     for s in streams) + " |")
    print("|---|---|" + "---|---|---|" * len(streams))
    for n in sizes:
        option = set(Shortlist.of(dictionary, n).ids.tolist())
        counted = {eos, *by_train[: n - 1]}
        for label, ids in (("the option (dict.txt: counts all equal, so sentencepiece's order)", option),
                           ("target-side training counts", counted)):
            cells = []
            for seqs in streams.values():
                tokens = [t for s in seqs for t in s]
                inside = sum(t in ids for t in tokens)
                words = [t for t in tokens if t != eos]
                cells += [f"{100 * inside / len(tokens):.2f}%",
                          f"{100 * sum(t in ids for t in words) / len(words):.2f}%",
                          f"{100 * sum(all(t in ids for t in s) for s in seqs) / len(seqs):.1f}%"]
            print(f"| {n} | {label} | " + " | ".join(cells) + " |")
    counts = set(dictionary.count[dictionary.nspecial:])
    print(f"\ndistinct counts in the dictionary (past the specials): {sorted(counts)[:5]}")
    seen = len([i for i in train if train[i] > 0])
    print(f"target pieces seen in training: {seen} of {len(dictionary)}")


if __name__ == "__main__":
    main()
