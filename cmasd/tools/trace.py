"""``cmasd-trace``: a picture of speculative decoding at work.

    cmasd-trace DATA --user-dir fairseq_plugins --task translation_speculative \\
        --path VERIFIER.pt --drafter-path DRAFTER.pt [--spec-* ...] [--gen-subset test] \\
        [--trace-sentences 3 | --trace-ids 0,7,12] [--trace-html trace.html] [--color auto|always|never]

Decodes a few sentences of a split one at a time with the speculative generator that
``fairseq-generate`` would build from the same options, and shows every iteration of each:
the drafts sent, which the verifier accepted (green) and rejected (red, struck through),
and the verifier's own token after them (bold: yellow a correction, cyan a bonus after a
fully accepted draft). Printed to stdout: in colour on a terminal or with ``--color
always``, as plain text with markers otherwise (and with ``--color never``, ``--no-color``
or ``NO_COLOR``); ``--trace-html`` also writes a self-contained HTML page.

The library side: ``trace_batches`` decodes fairseq samples with the generator's
``observer`` set and returns one ``SentenceTrace`` per sentence, checked against the
generator's hypothesis; ``to_ansi`` and ``to_html`` draw them.
"""

import argparse
import html
import logging
import os
import sys
import typing
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

from cmasd.decoding.generator import SpeculativeGenerator, StepRecord
from cmasd.errors import one_line
from cmasd.tools.pieces import WORD_START

PROG = "cmasd-trace"
logger = logging.getLogger("cmasd.trace")

DEFAULT_SENTENCES = 3

# --------------------------------------------------------------------------- traces


@dataclass(frozen=True)
class Iteration:
    """One iteration of one sentence."""

    drafted: Tuple[int, ...]  # the k drafts sent
    accepted: int  # how many of them the verifier accepted
    next_token: int  # the verifier's token after them: correction, or bonus when all k were accepted
    kept: int  # tokens appended: accepted + 1, fewer where an accepted draft was eos

    @property
    def appended(self) -> Tuple[int, ...]:
        """The tokens this iteration added to the sentence."""
        return (self.drafted[: self.accepted] + (self.next_token,))[: self.kept]

    @property
    def bonus(self) -> bool:
        """Whether every draft was accepted (the verifier's token is then a bonus)."""
        return self.accepted == len(self.drafted)


@dataclass(frozen=True)
class SentenceTrace:
    """Every iteration of one sentence, and the hypothesis the generator returned."""

    id: int  # sentence id in the split
    iterations: Tuple[Iteration, ...]
    hypothesis: Tuple[int, ...]  # the generator's tokens (eos last)

    @property
    def tokens(self) -> Tuple[int, ...]:
        """The sentence the iterations built: their appended tokens, in order."""
        return tuple(t for it in self.iterations for t in it.appended)

    @property
    def tokens_per_iteration(self) -> float:
        return len(self.tokens) / max(len(self.iterations), 1)


class TraceMismatch(RuntimeError):
    """The iterations do not rebuild the generator's hypothesis: a bug in the loop or
    in the observer's record, never a property of the models."""


def iterations_by_sentence(records: Iterable[StepRecord]) -> Dict[int, List[Iteration]]:
    """Sentence id -> its iterations, in order, from the observer's records."""
    by_id: Dict[int, List[Iteration]] = {}
    for record in records:
        for row, sid in enumerate(record.ids.tolist()):
            k = int(record.k[row])
            by_id.setdefault(sid, []).append(Iteration(
                tuple(record.tokens[row, :k].tolist()), int(record.accepted[row]),
                int(record.next_token[row]), int(record.kept[row]),
            ))
    return by_id


def check(trace: SentenceTrace) -> SentenceTrace:
    """``trace``, when its iterations rebuild its hypothesis; else ``TraceMismatch``."""
    if trace.tokens != trace.hypothesis:
        raise TraceMismatch(
            f"sentence {trace.id}: the {len(trace.iterations)} iterations rebuild {list(trace.tokens)}, "
            f"the generator returned {list(trace.hypothesis)}"
        )
    return trace


def trace_batches(generator: SpeculativeGenerator, samples: Iterable[Mapping[str, Any]]) -> List[SentenceTrace]:
    """Decode fairseq ``samples`` (batches of ``task.get_batch_iterator``) with
    ``generator``, recording every iteration; one checked trace per sentence, in the
    samples' order. The generator's ``observer`` is restored afterwards."""
    records: List[StepRecord] = []
    previous, generator.observer = generator.observer, records.append
    traces = []
    try:
        for sample in samples:
            records.clear()
            hypotheses = generator.decode(sample).hypotheses
            by_id = iterations_by_sentence(records)
            for row, sid in enumerate(sample["id"].tolist()):
                hypothesis = tuple(hypotheses[row][0]["tokens"].tolist())
                traces.append(check(SentenceTrace(sid, tuple(by_id.get(sid, ())), hypothesis)))
    finally:
        generator.observer = previous
    return traces


# --------------------------------------------------------------------------- pieces


class Pieces:
    """How a dictionary's tokens read: a sentencepiece piece's word mark becomes a
    space; a dictionary without word marks (words, BPE) is read word by word."""

    def __init__(self, dictionary):
        self.dictionary = dictionary
        self.marked = any(symbol.startswith(WORD_START) for symbol in dictionary.symbols)
        self.hidden = {dictionary.eos(), dictionary.pad()}

    def show(self, token: int) -> Tuple[str, bool]:
        """A token's text and whether it starts a word."""
        symbol = self.dictionary[token]
        if not self.marked or token < self.dictionary.nspecial:  # eos, unk: a word of their own
            return symbol, True
        starts = symbol.startswith(WORD_START)
        text = symbol[1:] if starts else symbol
        return (text or "\u2423"), starts  # a lone word mark: an open box

    def text(self, tokens: Sequence[int]) -> str:
        """Detokenized text of ``tokens`` (eos and pad left out)."""
        symbols = [self.dictionary[t] for t in tokens if t not in self.hidden]
        if not self.marked:
            return " ".join(symbols)
        return "".join(symbols).replace(WORD_START, " ").strip()


# A token's part in its iteration.
ACCEPTED, REJECTED, CORRECTION, BONUS, DROPPED = "accepted", "rejected", "correction", "bonus", "dropped"
LEGEND = {  # part -> what it means
    ACCEPTED: "a draft the verifier accepted",
    REJECTED: "a draft it rejected",
    CORRECTION: "the verifier's own token in place of the first rejected draft",
    BONUS: "the verifier's own token after every draft was accepted (or none sent)",
    DROPPED: "not kept: after an accepted eos",
}


def chips(iteration: Iteration) -> List[Tuple[int, str]]:
    """(token, part) of every token an iteration shows: its drafts, then the verifier's."""
    kept_drafts = min(iteration.accepted, iteration.kept)
    shown = []
    for i, token in enumerate(iteration.drafted):
        part = ACCEPTED if i < kept_drafts else DROPPED if i < iteration.accepted else REJECTED
        shown.append((token, part))
    if iteration.kept > iteration.accepted:
        shown.append((iteration.next_token, BONUS if iteration.bonus else CORRECTION))
    else:
        shown.append((iteration.next_token, DROPPED))
    return shown


# --------------------------------------------------------------------------- terminal

ANSI = {  # SGR codes
    ACCEPTED: "32",  # green
    REJECTED: "31;9",  # red, struck through
    CORRECTION: "1;33",  # bold yellow
    BONUS: "1;36",  # bold cyan
    DROPPED: "2",  # dim
}
PLAIN = {  # markers without colours
    ACCEPTED: "{}",
    REJECTED: "~{}~",
    CORRECTION: "[{}]",
    BONUS: "[+{}]",
    DROPPED: "({})",
}
JOIN = "\u00b7"  # between the pieces of one word


def paint(text: str, part: str, color: bool) -> str:
    return f"\033[{ANSI[part]}m{text}\033[0m" if color else PLAIN[part].format(text)


def ansi_legend(color: bool = True) -> str:
    """One line naming the marks ``to_ansi`` uses."""
    return "legend: " + "  ".join(paint(part, part, color) for part in LEGEND) + \
        f"  ({JOIN} joins the pieces of a word; each line: iteration, drafts accepted/sent, tokens)"


def ansi_tokens(shown: Sequence[Tuple[int, str]], pieces: Pieces, color: bool) -> str:
    """The chips of one iteration on one line."""
    out = []
    for i, (token, part) in enumerate(shown):
        text, starts = pieces.show(token)
        if i:
            out.append(" " if starts else paint(JOIN, DROPPED, True) if color else JOIN)
        out.append(paint(text, part, color))
    return "".join(out)


def to_ansi(trace: SentenceTrace, tgt_dict, source_text: str, color: bool = True) -> str:
    """One sentence as a block of lines: its source, one line per iteration (number,
    drafts accepted / sent, the tokens), its output and tokens per iteration. ANSI
    colours, or with ``color=False`` the plain markers of ``PLAIN``."""
    pieces = Pieces(tgt_dict)
    lines = [f"sentence {trace.id}: {source_text}"]
    for n, iteration in enumerate(trace.iterations, 1):
        tally = f"{iteration.accepted}/{len(iteration.drafted)}"
        lines.append(f"{n:>5} {tally:>5}  {ansi_tokens(chips(iteration), pieces, color)}")
    lines.append(f"      output: {pieces.text(trace.hypothesis)}")
    lines.append(f"      {summary(trace)}")
    return "\n".join(lines)


def summary(trace: SentenceTrace) -> str:
    n, tokens = len(trace.iterations), len(trace.tokens)
    return f"{tokens} tokens in {n} iterations: {trace.tokens_per_iteration:.2f} tokens per iteration"


# --------------------------------------------------------------------------- HTML

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
.cmd { font-family: monospace; font-size: 0.85em; color: #555; word-break: break-all; }
.source, .output { margin: 0.3em 0; } .label { color: #777; display: inline-block; width: 5em; }
table { border-collapse: collapse; margin: 0.5em 0; }
td { padding: 0.2em 0.5em; vertical-align: middle; } td.n, td.tally { color: #777; text-align: right;
  font-family: monospace; }
.chip { display: inline-block; font-family: monospace; padding: 0.1em 0.3em; border-radius: 0.3em;
  margin: 0.1em 0 0.1em 1px; border: 1px solid transparent; }
.chip.w { margin-left: 0.6em; } td .chip:first-child { margin-left: 0; }
.accepted { background: #d8f5d8; border-color: #7cc47c; }
.rejected { background: #fbe0e0; border-color: #e08a8a; color: #a33; text-decoration: line-through; }
.correction { background: #fff1b8; border-color: #d8b400; font-weight: bold; }
.bonus { background: #d6f1f7; border-color: #3aa8c1; font-weight: bold; }
.dropped { color: #999; border-color: #ccc; border-style: dashed; }
.legend { list-style: none; padding: 0; } .legend li { margin: 0.2em 0; }
.legend .chip { display: inline-block; min-width: 6em; text-align: center; margin-right: 0.5em; }
.stats { color: #555; }
"""


def html_chip(token: int, part: str, pieces: Pieces) -> str:
    text, starts = pieces.show(token)
    classes = f"chip {part}" + (" w" if starts else "")
    return (f'<span class="{classes}" title="{html.escape(pieces.dictionary[token])} ({part})">'
            f"{html.escape(text)}</span>")


def html_sentence(trace: SentenceTrace, pieces: Pieces, source_text: str) -> str:
    rows = []
    for n, iteration in enumerate(trace.iterations, 1):
        tokens = "".join(html_chip(t, part, pieces) for t, part in chips(iteration))
        rows.append(f'<tr><td class="n">{n}</td><td class="tally" title="drafts accepted / sent">'
                    f"{iteration.accepted}/{len(iteration.drafted)}</td><td>{tokens}</td></tr>")
    return "\n".join([
        f'<section id="sentence-{trace.id}">',
        f"<h2>sentence {trace.id}</h2>",
        f'<p class="source"><span class="label">source</span>{html.escape(source_text)}</p>',
        '<table><tr><th>#</th><th title="drafts accepted / sent">acc/k</th><th>tokens</th></tr>',
        *rows,
        "</table>",
        f'<p class="output"><span class="label">output</span>{html.escape(pieces.text(trace.hypothesis))}</p>',
        f'<p class="stats">{html.escape(summary(trace))}</p>',
        "</section>",
    ])


def to_html(traces: Sequence[SentenceTrace], tgt_dict, sources: Mapping[int, str], title: str = PROG,
            command: str = "") -> str:
    """A self-contained HTML page (inline CSS, no scripts): a legend, then per sentence its
    source (``sources``: sentence id -> text), one row of token chips per iteration, its
    output and tokens per iteration."""
    pieces = Pieces(tgt_dict)
    legend = "".join(f'<li><span class="chip {part}">{part}</span> {html.escape(meaning)}</li>'
                     for part, meaning in LEGEND.items())
    iterations = sum(len(t.iterations) for t in traces)
    tokens = sum(len(t.tokens) for t in traces)
    overall = f"{len(traces)} sentences, {tokens} tokens in {iterations} iterations: " \
              f"{tokens / max(iterations, 1):.2f} tokens per iteration"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="cmd">{html.escape(command)}</p>' if command else "",
        f'<ul class="legend">{legend}</ul>',
        '<p class="stats">Each row is one iteration: the drafts sent (accepted, then rejected) and the '
        "verifier's token after the accepted ones. A gap starts a word; hover a chip for its piece.</p>",
        f'<p class="stats">{html.escape(overall)}</p>',
        *(html_sentence(t, pieces, sources.get(t.id, "")) for t in traces),
        "</body></html>",
        "",
    ])


# --------------------------------------------------------------------------- the program


class TraceError(Exception):
    """A user-facing error: one line on stderr, exit status 2."""


def fail(message: str) -> typing.NoReturn:
    print(one_line(PROG, message), file=sys.stderr)
    sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    """fairseq's generation parser (every ``fairseq-generate`` option, cmasd's through
    ``--user-dir``) with the trace's own options; errors are one line."""
    from fairseq import options

    parser = options.get_generation_parser()
    parser.prog = PROG
    parser.set_defaults(beam=1)  # what speculative decoding verifies (fairseq-generate's default is 5)
    parser.error = fail  # argparse's errors too: one line, exit 2
    group = parser.add_argument_group("cmasd-trace")
    group.add_argument("--trace-sentences", metavar="N", type=int, default=DEFAULT_SENTENCES,
                       help="trace the first N sentences of --gen-subset (default: %(default)s)")
    group.add_argument("--trace-ids", metavar="IDS",
                       help="comma-separated sentence ids of --gen-subset to trace instead")
    group.add_argument("--trace-html", metavar="PATH", help="also write the picture as a self-contained HTML page")
    group.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                       help="ANSI colours: on a terminal (auto, the default; NO_COLOR turns them off), "
                            "always (e.g. into a file for `less -R`), or never (plain text with markers)")
    group.add_argument("--no-color", dest="color", action="store_const", const="never",
                       help="the same as --color never")
    return parser


def parse_ids(text: str) -> List[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise TraceError(f"--trace-ids: comma-separated sentence ids expected, got {text!r}") from None
    if not ids or min(ids) < 0:
        raise TraceError(f"--trace-ids: sentence ids >= 0 expected, got {text!r}")
    return ids


def chosen_ids(args, split_size: int) -> List[int]:
    """The sentence ids to trace, checked against the split's size."""
    if args.trace_ids is not None:
        ids = parse_ids(args.trace_ids)
        beyond = [i for i in ids if i >= split_size]
        if beyond:
            raise TraceError(f"--trace-ids: {beyond} beyond the split ({split_size} sentences)")
        return ids
    return list(range(min(args.trace_sentences, split_size)))


def check_own_options(args) -> None:
    """The trace's own options, before anything loads."""
    if args.trace_sentences < 1:
        raise TraceError(f"--trace-sentences: must be >= 1, got {args.trace_sentences}")
    if args.trace_ids is not None:
        parse_ids(args.trace_ids)
    if args.trace_html:
        folder = os.path.dirname(os.path.abspath(args.trace_html))
        if not os.path.isdir(folder):
            raise TraceError(f"--trace-html: no folder {folder}")


def check_speculative(args) -> None:
    """Refuse options under which fairseq's own generator would decode: nothing to trace."""
    from cmasd.options import is_speculative

    if args.task != "translation_speculative" or not is_speculative(args):
        raise TraceError("nothing to trace: give --task translation_speculative and a drafter (--drafter-path, "
                         "or lookups: --spec-history-ngram / --spec-source-ngram); without one fairseq's own "
                         "generator decodes")


def load(cfg):
    """The task, the verifier and the split, as ``fairseq_cli/generate.py`` loads them."""
    import ast

    import torch
    from fairseq import checkpoint_utils, tasks, utils

    try:
        task = tasks.setup_task(cfg.task)
        models, saved_cfg = checkpoint_utils.load_model_ensemble(
            utils.split_paths(cfg.common_eval.path), arg_overrides=ast.literal_eval(cfg.common_eval.model_overrides),
            task=task, suffix=cfg.checkpoint.checkpoint_suffix,
        )
    except OSError as e:  # a missing data directory, dictionary or checkpoint
        raise TraceError(f"loading {cfg.common_eval.path} with data {cfg.task.data}: {e}") from None
    try:
        task.load_dataset(cfg.dataset.gen_subset, task_cfg=saved_cfg.task)
    except FileNotFoundError as e:
        raise TraceError(f"--gen-subset {cfg.dataset.gen_subset}: {e}") from None
    use_cuda = torch.cuda.is_available() and not cfg.common.cpu
    for model in models:
        if cfg.common.fp16:
            model.half()
        if use_cuda:
            model.cuda()
        model.prepare_for_inference_(cfg)
    return task, models


def sentence_batches(task, models, cfg, ids: Sequence[int], batch_size: int = 1) -> List[Dict[str, Any]]:
    """Sentences ``ids`` of the ``--gen-subset`` split, in that order, ``batch_size`` to a
    batch, through the task's batch iterator (on the GPU unless ``--cpu``)."""
    import numpy as np
    import torch
    from fairseq import utils
    from fairseq.data import BaseWrapperDataset

    class Chosen(BaseWrapperDataset):
        def ordered_indices(self):
            return np.array(ids, dtype=np.int64)

    iterator = task.get_batch_iterator(
        dataset=Chosen(task.dataset(cfg.dataset.gen_subset)), max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), *[m.max_positions() for m in models]),
        ignore_invalid_inputs=cfg.dataset.skip_invalid_size_inputs_valid_test, required_batch_size_multiple=1,
        seed=cfg.common.seed, disable_iterator_cache=True,
    ).next_epoch_itr(shuffle=False)
    use_cuda = torch.cuda.is_available() and not cfg.common.cpu
    return [utils.move_to_cuda(s) if use_cuda else s for s in iterator]


def use_color(args) -> bool:
    if args.color != "auto":
        return args.color == "always"
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def run(args, command: str = PROG) -> List[SentenceTrace]:
    """Trace the chosen sentences; print the picture and write the page (``command``: the
    command line it names). Returns the traces."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    check_own_options(args)
    check_speculative(args)
    cfg = convert_namespace_to_omegaconf(args)
    task, models = load(cfg)
    dataset = task.dataset(cfg.dataset.gen_subset)
    ids = chosen_ids(args, len(dataset))
    try:
        generator = task.build_generator(models, cfg.generation)
    except (ValueError, OSError) as e:  # refused options, a missing or mismatched drafter
        raise TraceError(str(e)) from None
    if not isinstance(generator, SpeculativeGenerator):
        raise TraceError(f"nothing to trace: the task built {type(generator).__name__}, not the speculative generator")
    traces = trace_batches(generator, sentence_batches(task, models, cfg, ids))
    missing = sorted(set(ids) - {t.id for t in traces})
    if missing:
        logger.warning("sentence(s) %s skipped by fairseq's size filter", missing)
    pieces = Pieces(task.source_dictionary)
    sources = {t.id: pieces.text(dataset[t.id]["source"].tolist()) for t in traces}
    color = use_color(args)
    print(ansi_legend(color))
    for trace in traces:
        print()
        print(to_ansi(trace, task.target_dictionary, sources[trace.id], color))
    if args.trace_html:
        with open(args.trace_html, "w", encoding="utf-8") as f:
            f.write(to_html(traces, task.target_dictionary, sources, command=command))
        logger.info("wrote %s", args.trace_html)
    return traces


def main(argv: Sequence[str] = None) -> None:
    from fairseq import options

    argv = sys.argv[1:] if argv is None else list(argv)
    args = options.parse_args_and_arch(build_parser(), input_args=argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                        level=logging.INFO, stream=sys.stderr, force=True)
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    try:
        run(args, " ".join([PROG, *argv]))
    except TraceError as e:
        fail(str(e))


def cli_main() -> None:
    main()


if __name__ == "__main__":
    cli_main()
