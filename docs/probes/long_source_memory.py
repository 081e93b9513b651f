"""Resident memory of decoding long sources, fairseq's greedy against cmasd's loop, stage by stage.

    python docs/probes/long_source_memory.py CHECKPOINT DATA ARTICLES.jsonl {fairseq,cmasd}
        [--kernels auto] [--sentences 64] [--pieces 1000] [--batch-size 16] [--length 60] [--threads 1]

Run each mode in its own process (the peak is the process's). ARTICLES.jsonl: one JSON object
a line with an "article" (the CNN/DM sample of the data mirror) or "src" field; each is encoded
with DATA's vocabulary and cut to --pieces pieces (end of sentence included). Every output is
--length tokens (--min-len and --max-len-b both), so both decoders do the same work. cmasd runs
lossless with source lookups (k = 8, exact acceptance; --spec-kernels --kernels): no second model. Prints resident memory
(MB, /proc/self/status: VmRSS now, VmHWM the peak so far; glibc keeps freed memory, so run
with MALLOC_MMAP_THRESHOLD_=131072 to see live memory rather than the allocator's) after loading, after the first batch
and after all batches, the seconds the decoding of all of them took (after a first batch),
and cmasd's prepared weights by size.
"""

import argparse
import json
import os
import sys
import time


def rss():
    """(resident now, peak resident) in MB."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def report(stage):
    now, peak = rss()
    print(f"{stage:<28} resident {now:7.0f} MB   peak {peak:7.0f} MB", flush=True)


def tensor_mb(obj, exclude=()):
    """MB held by the distinct tensors reachable from obj (lists, tuples, dicts, attributes),
    leaving out those that share storage with a tensor of ``exclude``."""
    import torch

    storages = {t.untyped_storage().data_ptr() for t in exclude}
    visited = set()  # id() of the objects walked and of oneDNN's packed tensors counted
    total, stack = 0, [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.is_mkldnn:  # oneDNN's packed weights: no storage to share
                if id(item) not in visited:
                    visited.add(id(item))
                    total += item.numel() * item.element_size()
                continue
            storage = item.untyped_storage()
            if storage.data_ptr() not in storages:
                storages.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif hasattr(item, "__dict__") and not isinstance(item, type) and id(item) not in visited:
            visited.add(id(item))
            stack.extend(vars(item).values())
    return total / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("data")
    parser.add_argument("articles")
    parser.add_argument("mode", choices=["fairseq", "cmasd"])
    parser.add_argument("--kernels", default="auto", choices=["auto", "gemv", "packed", "native"])
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--pieces", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--length", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from cmasd import from_pretrained

    report("imported")
    options = dict(min_len=args.length, max_len_b=args.length, max_len_a=0.0)
    if args.mode != "fairseq":
        options.update(spec_source_ngram=1, spec_k=8, spec_acceptance="exact", spec_kernels=args.kernels)
    model = from_pretrained(args.checkpoint, data_name_or_path=args.data, batch_size=args.batch_size, **options)
    model.eval()
    own = list(model.models[0].state_dict().values())
    print(f"the model: {tensor_mb(own):.0f} MB of tensors")
    report("model loaded")

    sources = []
    with open(args.articles) as lines:
        for line in lines:
            record = json.loads(line)
            ids = model.encode(record.get("article") or record["src"])
            sources.append(torch.cat([ids[: args.pieces - 1], ids[-1:]]))
            if len(sources) == args.sentences:
                break
    print(f"{len(sources)} sources, pieces: median {sorted(map(len, sources))[len(sources) // 2]}, "
          f"longest {max(map(len, sources))}")

    with torch.inference_mode():
        outputs = model.generate(sources[: args.batch_size])
        report("first batch decoded")
        generator = getattr(model.task, "last_generator", None)
        if generator is not None:
            for name in ("scorer", "encode"):
                part = getattr(generator, name, None)
                if part is not None:
                    print(f"  cmasd {name}: {tensor_mb(part, own):.0f} MB of tensors besides the model's")
        start = time.perf_counter()
        outputs = model.generate(sources)
        seconds = time.perf_counter() - start
    report(f"all {len(sources)} decoded")
    print(f"decoding all {len(sources)} (after the first batch): {seconds:.1f} s")
    print("output lengths:", sorted({len(hypos[0]["tokens"]) for hypos in outputs}))


if __name__ == "__main__":
    main()
