"""CTranslate2's greedy search on 1 and 2 threads, in a process without torch.

The probe behind docs/RESULTS.md's "CTranslate2's row is slow again" (2026-11-27): the
first N test sentences of a data-bin (its ``raw/test.en`` encoded with its ``spm.model``),
translated by a model that cmasd-bench converted (``VERIFIER.pt.ct2/``), one batch at a
time after a warm-up call; prints the seconds per thread count. OpenMP's variables
(``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) are read from the environment as usual.

    python docs/probes/ct2_threads.py DATA VERIFIER.pt.ct2 [--sentences 100] [--batch-size 1] [--threads 1,2]
"""

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="a data-bin with spm.model and raw/test.en")
    parser.add_argument("model", help="a CTranslate2 model directory")
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()

    import ctranslate2
    import sentencepiece

    pieces = sentencepiece.SentencePieceProcessor(model_file=os.path.join(args.data, "spm.model"))
    with open(os.path.join(args.data, "raw", "test.en"), encoding="utf-8") as f:
        lines = f.read().splitlines()[: args.sentences]
    sources = [pieces.encode(line.strip(), out_type=str) + ["</s>"] for line in lines]
    batches = [sources[i: i + args.batch_size] for i in range(0, len(sources), args.batch_size)]
    for threads in (int(t) for t in args.threads.split(",")):
        translator = ctranslate2.Translator(args.model, device="cpu", compute_type="float32",
                                            intra_threads=threads, inter_threads=1)
        translator.translate_batch(batches[0], beam_size=1)  # warm-up
        start = time.perf_counter()
        for batch in batches:
            translator.translate_batch(batch, beam_size=1, max_decoding_length=200)
        print(f"threads {threads}: {len(sources)} sentences at batch size {args.batch_size}: "
              f"{time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
