"""The CTranslate2 process of cmasd-bench's ct2 rows (see ``cmasd.tools.bench.ct2``):
a Translator (or, for a language model, a Generator) in a process that imports neither
torch nor fairseq.

    python -m cmasd.tools.ct2_worker MODEL_DIR COMPUTE_TYPE THREADS [translator|generator]

reads one JSON request per line on stdin, ``{"batch": [[symbol, ...], ...],
"max_len": N, "min_len": M, "no_repeat_ngram_size": R}``, and writes one JSON line per request on stdout: the
greedy output symbols of each row (an empty batch is answered with ``[]``, which
tells the caller that the model is loaded). A Generator's rows are each a start token and
its prompt, and its output is the continuation alone (``max_len`` and ``min_len`` count
the continuation).
"""

import json
import sys


def serve(model_dir: str, compute_type: str, threads: int, kind: str = "translator") -> None:
    """The worker: one JSON request per line on stdin, one JSON answer per line on stdout."""
    import ctranslate2

    if kind not in ("translator", "generator"):
        raise SystemExit(f"ct2_worker: unknown kind {kind!r}: expected translator or generator")
    engine = (ctranslate2.Translator if kind == "translator" else ctranslate2.Generator)(
        model_dir, device="cpu", compute_type=compute_type, intra_threads=threads, inter_threads=1)
    for line in sys.stdin:
        request = json.loads(line)
        outputs = []
        repeats = request.get("no_repeat_ngram_size", 0)
        if request["batch"] and kind == "translator":
            results = engine.translate_batch(
                request["batch"], beam_size=1, max_decoding_length=request["max_len"],
                min_decoding_length=request["min_len"], return_scores=False, no_repeat_ngram_size=repeats,
            )
            outputs = [r.hypotheses[0] for r in results]
        elif request["batch"]:
            results = engine.generate_batch(
                request["batch"], beam_size=1, max_length=request["max_len"], min_length=request["min_len"],
                include_prompt_in_result=False, no_repeat_ngram_size=repeats,
            )
            outputs = [r.sequences[0] for r in results]
        sys.stdout.write(json.dumps(outputs) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:5])
