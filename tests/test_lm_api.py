"""A language model from Python and from ``fairseq-interactive``: raw prompts in, each
prompt and its continuation out, one output per input line, in order, with the tiny
verifier and draft LMs of ``test_language_model`` (the same cached artifacts).

The hub interface (``cmasd.from_pretrained(...).sample``) continues prompts as fairseq's
own generator does when a draft model drafts; an empty prompt and one longer than the
model's positions each get one warning and one output; ``fairseq-interactive`` does the
same for a stream of lines.
"""

import os

import pytest

from helpers import BIN, LM_POSITIONS, PLUGINS, english, run

LONG_PROMPT = " ".join(["a man in a blue shirt"] * 20)  # far more pieces than the models' LM_POSITIONS (48)


@pytest.fixture(scope="module")
def lm_dir(lm_data, lm, tmp_path_factory):
    """The verifier LM as a model directory: its checkpoint, dict.txt and spm.model."""
    folder = tmp_path_factory.mktemp("lm-model")
    os.symlink(lm, folder / "checkpoint_best.pt")
    os.symlink(lm_data / "bin" / "dict.txt", folder / "dict.txt")
    os.symlink(lm_data / "bin" / "spm.model", folder / "spm.model")
    return folder


def test_sample_continues_prompts_as_fairseqs_generator(lm_dir, draft_lm, caplog):
    """``sample`` with a draft model equals ``sample`` through fairseq's own generator (no
    drafter), prompt for prompt, at two batch sizes; each output starts with its prompt;
    the empty prompt and the too-long one are named in a warning and still get an output."""
    from cmasd import from_pretrained

    prompts = [" ".join(line.split()[:3]) for line in english("test_2016_flickr", 9)]
    prompts[3], prompts[6] = "", LONG_PROMPT
    lm = from_pretrained(str(lm_dir), batch_size=4, max_len_b=12)
    with caplog.at_level("WARNING"):
        reference = lm.sample(prompts)
        assert lm.last_stats is None  # fairseq's own generator
        for bsz in (4, 9):
            lm.cfg.dataset.batch_size = bsz
            got = lm.sample(prompts, drafter_path=str(draft_lm), spec_k=4)
            assert got == reference
            assert lm.last_stats is not None and lm.last_stats.sentences == len(prompts)
    assert len(reference) == len(prompts)
    for i, (prompt, output) in enumerate(zip(prompts, reference)):
        if i not in (3, 6):
            assert output.startswith(prompt) and len(output) > len(prompt), (prompt, output)
    keep = LM_POSITIONS // 2
    assert "input 6 (" in caplog.text and f"continuing its last {keep} tokens" in caplog.text
    assert "empty prompt(s), sentence id(s) 3: continued from the start token alone" in caplog.text
    # the too-long prompt's last 24 pieces are whole repetitions of its phrase
    assert reference[6].startswith("a man in a blue shirt") and len(reference[6]) < len(LONG_PROMPT) / 2


def test_interactive_gives_one_continuation_per_line_in_order(lm_data, lm, draft_lm):
    """``fairseq-interactive`` with a draft model over lines among which an empty one and
    one too long for the model: one hypothesis per line, in input order, a warning for
    each of the two, no traceback."""
    lines = ["a man", "two dogs play in", "", LONG_PROMPT, "a woman is"]
    proc = run([BIN / "fairseq-interactive", lm_data / "bin", "--user-dir", PLUGINS,
                "--task", "language_modeling_speculative", "--path", lm, "--drafter-path", draft_lm, "--spec-k", "4",
                "--cpu", "--beam", "1", "--tokens-per-sample", str(LM_POSITIONS), "--max-len-b", "10",
                "--bpe", "sentencepiece", "--sentencepiece-model", lm_data / "bin" / "spm.model",
                "--batch-size", "2", "--buffer-size", "5"], input="\n".join(lines) + "\n")
    hypotheses = [line.split("\t") for line in proc.stdout.splitlines() if line.startswith("D-")]
    assert [int(h[0][2:]) for h in hypotheses] == list(range(len(lines)))
    for line, (_, _, text) in zip(lines, hypotheses):
        if line and line != LONG_PROMPT:
            assert text.startswith(line), (line, text)
    assert "continuing its last" in proc.stderr and "empty prompt(s)" in proc.stderr
    assert "Traceback" not in proc.stderr
