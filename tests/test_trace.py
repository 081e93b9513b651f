"""``cmasd-trace`` and the generator's observer: the iterations it records rebuild the
hypotheses exactly (and, with exact acceptance, fairseq's ``--beam 1`` output) at batch 1
and in batches whose rows finish at different times; the program prints one block per
sentence and writes an HTML page with the legend and every source; its option errors are
one line.
"""

import html
import subprocess
import sys

import pytest
from fairseq.tasks.translation import TranslationTask
from helpers import PLUGINS, REPO, console, tool_env

from cmasd.decoding.generator import SpeculativeGenerator
from cmasd.tools import trace as tr

SENTENCES = 8
SPEC = ["--spec-k", "4", "--spec-acceptance", "exact"]


def generation_args(multi30k, verifier, *options):
    return [str(multi30k), "--user-dir", PLUGINS, "--task", "translation_speculative", "--path", str(verifier),
            "--gen-subset", "test", "--cpu", "--beam", "1", *map(str, options)]


@pytest.fixture(scope="module")
def loaded(multi30k, verifier, drafter):
    """The task, models and config of ``cmasd-trace``'s own parser and loader."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = generation_args(multi30k, verifier, "--drafter-path", drafter, *SPEC)
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(tr.build_parser(), input_args=argv))
    task, models = tr.load(cfg)
    return task, models, cfg


def greedy_tokens(task, models, cfg, samples):
    """Sentence id -> fairseq's own ``--beam 1`` output (its SequenceGenerator, built by
    fairseq's translation task from the same generation options)."""
    greedy = TranslationTask.build_generator(task, models, cfg.generation)
    assert not isinstance(greedy, SpeculativeGenerator)
    out = {}
    for sample in samples:
        hypotheses = task.inference_step(greedy, models, sample)
        for row, sid in enumerate(sample["id"].tolist()):
            out[sid] = tuple(hypotheses[row][0]["tokens"].tolist())
    return out


@pytest.mark.parametrize("batch_size", [1, 5])
def test_traces_rebuild_the_hypotheses_and_fairseq_greedy(loaded, batch_size):
    task, models, cfg = loaded
    generator = task.build_generator(models, cfg.generation)
    assert isinstance(generator, SpeculativeGenerator) and generator.observer is None
    ids = list(range(SENTENCES))
    samples = tr.sentence_batches(task, models, cfg, ids, batch_size)
    assert max(s["id"].numel() for s in samples) == batch_size
    traces = tr.trace_batches(generator, samples)
    assert generator.observer is None  # restored
    assert sorted(t.id for t in traces) == ids
    # trace_batches checked each against the generator's hypothesis; fairseq's greedy is independent
    greedy = greedy_tokens(task, models, cfg, samples)
    for t in traces:
        assert t.tokens == t.hypothesis == greedy[t.id], t.id
        assert t.tokens[-1] == task.target_dictionary.eos()
    iterations = [it for t in traces for it in t.iterations]
    assert any(it.accepted > 0 for it in iterations) and any(it.accepted < len(it.drafted) for it in iterations)
    # the same tokens in fewer iterations than tokens: drafts were kept
    assert sum(len(t.iterations) for t in traces) < sum(len(t.tokens) for t in traces)
    if batch_size > 1:  # rows of one batch finished at different iterations
        assert len({len(t.iterations) for t in traces[:batch_size]}) > 1


def test_a_trace_that_does_not_rebuild_its_hypothesis_is_refused():
    eos = 2
    ends = tr.Iteration(drafted=(5, eos, 7), accepted=3, next_token=9, kept=2)  # an accepted eos ends the row
    assert ends.appended == (5, eos)
    assert [part for _, part in tr.chips(ends)] == [tr.ACCEPTED, tr.ACCEPTED, tr.DROPPED, tr.DROPPED]
    first = tr.Iteration(drafted=(4, 6), accepted=1, next_token=8, kept=2)
    assert [part for _, part in tr.chips(first)] == [tr.ACCEPTED, tr.REJECTED, tr.CORRECTION]
    assert tr.check(tr.SentenceTrace(0, (first, ends), (4, 8, 5, eos))).tokens == (4, 8, 5, eos)
    with pytest.raises(tr.TraceMismatch, match="sentence 0"):
        tr.check(tr.SentenceTrace(0, (first, ends), (4, 8, 5, 7, eos)))


@pytest.mark.parametrize("argv, tty, no_color, expected", [
    ([], True, False, True), ([], False, False, False), ([], True, True, False),
    (["--color", "always"], False, True, True), (["--color", "never"], True, False, False),
    (["--no-color"], True, False, False),
])
def test_colours_follow_the_terminal_unless_told(monkeypatch, argv, tty, no_color, expected):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty)
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    args, _ = tr.build_parser().parse_known_args(argv)
    assert tr.use_color(args) is expected


def test_cli_prints_a_block_per_sentence_and_writes_the_page(multi30k, verifier, drafter, tmp_path):
    page = tmp_path / "trace.html"
    argv = generation_args(multi30k, verifier, "--drafter-path", drafter, *SPEC,
                           "--trace-sentences", "3", "--trace-html", page)
    env = tool_env(PYTHONPATH=str(REPO))
    env.pop("NO_COLOR", None)
    proc = subprocess.run([sys.executable, "-m", "cmasd.tools.trace", *argv], capture_output=True, text=True,
                          env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "\033[" not in out  # not a terminal: plain text
    blocks = [line for line in out.splitlines() if line.startswith("sentence ")]
    assert [b.split(":")[0] for b in blocks] == ["sentence 0", "sentence 1", "sentence 2"]
    assert out.count("      output: ") == 3 and out.startswith("legend: ")
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "<script" not in text and "<link" not in text
    sources = (multi30k / "raw" / "test.en").read_text(encoding="utf-8").splitlines()[:3]
    for source in sources:
        assert html.escape(source.strip()) in text, source
    for name in tr.LEGEND.values():
        assert html.escape(name) in text
    assert text.count('<section id="sentence-') == 3


@pytest.mark.parametrize("extra, message", [
    (["--drafter-path", "DRAFTER", "--trace-sentences", "0"], "--trace-sentences: must be >= 1"),
    (["--drafter-path", "DRAFTER", "--trace-sentences", "x"], "--trace-sentences: invalid int value"),
    (["--drafter-path", "DRAFTER", "--trace-ids", "1,a"], "--trace-ids: comma-separated sentence ids"),
    ([], "nothing to trace"),
])
def test_option_errors_are_one_line(multi30k, verifier, drafter, extra, message):
    """The program itself for the last; its entry point in this process for the others (the
    same parser and report, without 4 s of start-up each)."""
    extra = [str(drafter) if e == "DRAFTER" else e for e in extra]
    # (the program for the last case, which names no drafter)
    proc = console("cmasd-trace", generation_args(multi30k, verifier, *extra), program=not extra)
    assert proc.returncode == 2
    # fairseq logs one notice on import when tensorboardX is missing, and in a process that
    # imported the plugins before, that --user-dir has been imported; nothing else may print
    lines = [line for line in proc.stderr.splitlines()
             if "tensorboardX" not in line and "fairseq_plugins has already been imported" not in line]
    assert len(lines) == 1 and lines[0].startswith("cmasd-trace: error: ") and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
