"""The CTranslate2 process of cmasd-bench's ct2 rows (see ``cmasd.tools.bench.ct2``):
a Translator in a process that imports neither torch nor fairseq.

    python -m cmasd.tools.ct2_worker MODEL_DIR COMPUTE_TYPE THREADS

reads one JSON request per line on stdin, ``{"batch": [[symbol, ...], ...],
"max_len": N, "min_len": M, "no_repeat_ngram_size": R}``, and writes one JSON line per request on stdout: the
greedy output symbols of each row (an empty batch is answered with ``[]``, which
tells the caller that the model is loaded).
"""

import json
import sys


def serve(model_dir: str, compute_type: str, threads: int) -> None:
    """The worker: one JSON request per line on stdin, one JSON answer per line on stdout."""
    import ctranslate2

    translator = ctranslate2.Translator(model_dir, device="cpu", compute_type=compute_type,
                                        intra_threads=threads, inter_threads=1)
    for line in sys.stdin:
        request = json.loads(line)
        outputs = []
        if request["batch"]:
            results = translator.translate_batch(
                request["batch"], beam_size=1, max_decoding_length=request["max_len"],
                min_decoding_length=request["min_len"], return_scores=False,
                no_repeat_ngram_size=request.get("no_repeat_ngram_size", 0),
            )
            outputs = [r.hypotheses[0] for r in results]
        sys.stdout.write(json.dumps(outputs) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]))
