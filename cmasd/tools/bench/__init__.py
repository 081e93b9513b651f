"""``cmasd-bench``: speed and quality of fairseq's decoders and cmasd's speculative
decoders on one data split, measured the same way in one process.

    cmasd-bench DATA --path VERIFIER.pt [--drafter-path DRAFTER.pt] [--ar-drafter-path AR.pt] \\
        [--gen-subset test] [--configs beam5,greedy,specdec-k10,cmasd] \\
        [--batch-sizes 1,16] [--repeats 3] [--warmup 1] [--threads N] \\
        [--max-sentences N] [--references RAW.txt|REFS.jsonl] [--metric bleu|rouge] \\
        [--sampling [--temperature T] [--sampling-topk K] [--sampling-topp P] [--seeds 1,2,3]] \\
        [--set KEY=VALUE ...] [--out-dir checkpoints/bench]

What it does, in order:

1. loads the verifier (a fairseq ``translation`` checkpoint, or a language model: below; for the ct2 rows also its
   CTranslate2 conversion, cached, see ``ct2``), the drafters the
   configurations draft with (``--drafter-path``: the Spec-Drafter; ``--ar-drafter-path``:
   an autoregressive draft model) and the split once, and builds every batch of every batch size up front, so data
   loading and collation stay outside the timed region;
2. runs ``--warmup`` unrecorded passes over the first ``--warmup-batches`` batches of
   each batch size, then ``--repeats`` recorded passes; each recorded pass
   decodes the whole split with every configuration at every batch size, so the
   repetitions are interleaved across configurations (rep 1: all, rep 2: all, ...);
   only the decoding calls are timed (``time.perf_counter``, after a CUDA
   synchronize on GPU);
3. also times the *floor*: one teacher-forced verifier pass per batch over greedy's
   output, the cost of merely scoring the answer with the verifier (``FloorScorer``:
   the encoder and the decoding loops' own block scorer, on the layers and kernels
   ``--spec-kernels auto`` gives the decoders);
4. scores every recorded pass of every configuration (once per distinct output: greedy
   decoding gives the same output every pass) and writes ``bench.md``, ``bench.json`` and
   ``latency-throughput.png`` under ``--out-dir``.

Quality is measured on the detokenized output against the raw references of the whole split
(``--references``): one per line, or a ``.jsonl`` file with one JSON list of one or more
references per line; with ``--metric rouge`` the default is DATA/raw/SUBSET.refs.jsonl
where it exists (``cmasd-prep cnndm-split`` writes it), else DATA/raw/SUBSET.TGT.
``--metric bleu`` is sacreBLEU (13a), multi-reference with a ``.jsonl``; ``--metric
rouge`` gives ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum F1 x 100 as ``cmasd-rouge`` scores
them (``cmasd.tools.rouge``: stemmed; Lsum over the sentences of
``cmasd.tools.prep.split_sentences``; each line's best F1 per measure over its references).

With ``--sampling`` every decoder samples with fairseq's sampling options: the greedy row
is fairseq's sampling (``--beam 1``), the speculative rows use ``--spec-acceptance
rejection``, beam search and CTranslate2 rows are refused; recorded pass i uses seed i of
``--seeds`` (default 1 .. ``--repeats``; torch's global seed for fairseq's sampler, the
per-sentence seed of the speculative ones), and the quality columns are the mean over
the passes with ``quality_std`` their spread.

A language model (a ``transformer_lm`` checkpoint of fairseq's ``language_modeling`` task or
``language_modeling_speculative``; any verifier without an encoder) is measured on prompts:

    cmasd-bench DATA --path LM.pt --ar-drafter-path DRAFT_LM.pt [--prompt-tokens 16] \
        [--continuation-tokens L] [--gen-subset test] [--max-sentences N] ...

each prompt is the first ``--prompt-tokens`` tokens of a line of the split (lines of at most
that many tokens are skipped, and counted in the report; ``--max-sentences`` counts
prompts), handed to every decoder as fairseq's ``LanguageModelingTask.inference_step``
hands them (``prefix_tokens``, ``bos_token``). A continuation ends at its eos or at
fairseq's length limit, which counts the prompt (``--max-len-a/b``); ``--continuation-tokens
L`` makes every one L tokens long (``--max-len-b`` and ``--min-len`` = prompt + L). The
rows: fairseq's (greedy is the reference), ``ct2-greedy`` (CTranslate2's ``Generator``,
see ``ct2``), ``loop-greedy``, and the speculative rows of every drafter but the
Spec-Drafter: the draft language model (``--ar-drafter-path``: the ``ar-*`` and
``goodput-ar`` rows), lookups (``history-k8-exact``: prompt lookup), SpecBound's exits and
blockwise heads trained on the language model (``--exit-heads-path``,
``--blockwise-heads-path``); a row of the Spec-Drafter, which reads an encoder's output,
is refused in one line. No BLEU: tokens, tokens per second and the share of prompts
continued exactly as fairseq's greedy search continues them (``exact %``) count the
continuations alone; a lossless row (exact acceptance) that differs is flagged under the
table and in ``bench.json`` (``lossless_warnings``), as it is for a translation model.
``--sweep-gamma`` works as for translation.

Configurations are named in ``CONFIGS`` (``--configs help`` lists them) or defined on
the command line as ``NAME:KEY=VALUE;KEY=VALUE``, KEY a ``SpeculativeDecodingConfig``
field (``spec_k``, ``cmasd_alpha``, ...); ``base=NAMED`` starts from a named
speculative configuration, ``drafter=spec|ar|none`` names its model drafter (default:
the base's, else the Spec-Drafter). Example::

    --configs "greedy,cmasd,a05:base=cmasd;cmasd_alpha=0.5,k4:spec_k=4;spec_acceptance=exact"

A comma separates configurations only where a name follows, so
``cmasd_weights=0.5,0.25,0.25`` stays one value. Settings apply in this order:
the option defaults, then ``--set`` (for every speculative configuration), then the
configuration's own settings, which win.

Errors in the command line, the files or the configurations are one line on stderr,
``cmasd-bench: error: ...``, with exit status 2.

The package: ``configs`` (named and ad-hoc configurations), ``loading`` (models, split,
batches, generators), ``measure`` (timing), ``floor`` (the teacher-forced floor),
``scoring`` (detokenizing, BLEU, ROUGE through ``cmasd.tools.rouge``, the references), ``report`` (rows, table, figure, JSON), ``ct2``
(the CTranslate2 rows), ``cli``.
"""

from cmasd.tools.bench.cli import (  # noqa: F401  (the package's interface, used by cmasd-tune and the tests)
    Parser,
    add_common_args,
    cli_main,
    main,
    prepare,
    report_record,
    run_cli,
    run_configs,
)
from cmasd.tools.bench.configs import (  # noqa: F401
    CONFIGS,
    FULL_CMASD,
    GREEDY,
    BenchConfig,
    BenchError,
    options_dict,
    parse_assignments,
    resolve_configs,
    spec_options,
)
from cmasd.tools.bench.loading import drafter_paths  # noqa: F401
from cmasd.tools.bench.report import line_styles, write_json  # noqa: F401
from cmasd.tools.bench.scoring import quality_columns  # noqa: F401
