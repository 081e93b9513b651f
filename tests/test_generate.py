"""Speculative generation through fairseq's own door: ``fairseq-generate --user-dir
fairseq_plugins --task translation_speculative --drafter-path ...``.

The proof of the generator: with ``--spec-acceptance exact`` it prints the same
hypotheses as ``fairseq-generate --beam 1`` with the same verifier, token for token, at
batch sizes 1, 7 and 16, with a trained and with an untrained Spec-Drafter, both
draft-length controllers, and every other drafter kind alone and composed (the
autoregressive draft model, history and source lookups). Then bad input: refused options,
missing and mismatched drafters, empty and over-long source lines.

Most runs go through fairseq-generate's own ``cli_main`` in the test's process
(helpers.generate); the references (conftest.py), the trained drafter's runs, a few
refusals and the over-long source start the program itself.

The probe set is real Multi30k test text (the first sentences of test_2016_flickr, with
one empty source line added), encoded with the data-bin's sentencepiece model and
binarized with its dictionary. A decode at batch 1 runs on its head (``probe_at``: the
first HEAD_SENTENCES and the empty line): a sentence at a time, the same paths for fewer
sentences; batches of 7 and 16 decode the whole set.
"""

import re
import subprocess

import pytest
import torch
from helpers import (BIN, CAP_LEN, EMPTY_AT, LENGTH_CAP, LONG, PROBE_SENTENCES, REPO, VERY_LONG, assert_same_hypotheses, binarize, generate, hypotheses,
                     last_line, raw_pairs, run, tool_env)

def test_greedy_reference_is_complete(greedy):
    assert sorted(greedy) == list(range(PROBE_SENTENCES + 1))
    assert sum(1 for _, tokens in greedy.values() if tokens.strip()) > PROBE_SENTENCES // 2


@pytest.mark.parametrize("batch_size", [1, 7, 16])
def test_lossless_equals_beam1_with_trained_drafter(probe_at, verifier, drafter, greedy, batch_size):
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", drafter,
                    "--spec-controller", "fixed", "--spec-k", "10", "--spec-acceptance", "exact", cli=True)
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)
    # statistics are logged at the end of the run; fixed k and exact acceptance never
    # read the drafter's confidence, so it is not computed
    assert "mean accepted tokens/iteration" in proc.stderr
    assert "mean confidence n/a" in proc.stderr


@pytest.mark.parametrize("batch_size", [1, 7, 16])
def test_lossless_equals_beam1_with_untrained_drafter(probe_at, verifier, untrained_drafter, greedy, batch_size):
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", untrained_drafter,
                    "--spec-k", "25", "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)


@pytest.mark.parametrize("batch_size", [1, 16])
def test_cmasd_controller_with_exact_acceptance_is_lossless(probe_at, verifier, drafter, greedy, batch_size):
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", drafter,
                    "--spec-controller", "cmasd", "--spec-k-min", "2", "--cmasd-alpha", "0.8",
                    "--cmasd-confidence", "ensemble", "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)
    assert re.search(r"mean confidence 0\.\d{3}", proc.stderr)


@pytest.mark.parametrize("batch_size", [1, 16])
def test_cheaper_drafter_options_stay_lossless(probe_at, verifier, drafter, greedy, batch_size):
    """An int8 drafter running a shorter block drafts differently, never wrongly."""
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", drafter,
                    "--spec-k", "6", "--spec-draft-block", "6", "--spec-drafter-quantize", "int8",
                    "--spec-acceptance", "exact", cli=True)
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)
    assert "quantized tensor creation" not in proc.stderr  # the deprecation note is kept out of the log


@pytest.mark.parametrize("batch_size", [1, 16])
@pytest.mark.parametrize("kernels", ["native", "packed"])
def test_other_kernels_stay_lossless(probe_at, verifier, drafter, greedy, batch_size, kernels):
    """``--spec-kernels native``: the linear layers on torch's default kernels, as fairseq
    runs them; ``packed``: oneDNN's alone (the default on a CPU with AVX2 is gemv at a few
    rows and packed above; the tests above)."""
    probe, sentences = probe_at(batch_size)
    from cmasd.layers.kernels import packing_available

    if kernels == "packed" and not packing_available():
        pytest.skip("this torch build has no oneDNN packed linear")
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", drafter,
                    "--spec-kernels", kernels, "--spec-k", "5", "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)


@pytest.mark.parametrize("batch_size", [1, 16])
def test_history_drafts_stay_lossless(probe_at, verifier, drafter, greedy, batch_size):
    """``--spec-history-ngram 2``: rows that repeat a bigram draft its earlier continuation;
    the tiny verifier repeats itself often enough for some iterations to do so."""
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", drafter,
                    "--spec-history-ngram", "2", "--spec-k", "6", "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)
    rate = float(re.search(r"drafted from history ([0-9.]+)% of iterations", proc.stderr).group(1))
    assert rate > 0


def repeated_ngrams(hypothesis: str, size: int):
    """The n-grams of ``size`` tokens that occur twice in a hypothesis (eos first, as
    fairseq's rule sees it)."""
    tokens = ["</s>"] + hypothesis.split()
    grams = [tuple(tokens[i:i + size]) for i in range(len(tokens) - size + 1)]
    return {gram for gram in grams if grams.count(gram) > 1}


def test_no_repeat_ngram_greedy_reference_blocks_repeats(greedy, greedy_no_repeat):
    changed = [i for i in greedy if greedy[i][1] != greedy_no_repeat[i][1]]
    assert changed, "the rule changed nothing: the probe set does not exercise it"
    assert any(repeated_ngrams(tokens, 3) for _, tokens in greedy.values())
    assert not any(repeated_ngrams(tokens, 3) for _, tokens in greedy_no_repeat.values())


@pytest.mark.parametrize("batch_size", [1, 16])
@pytest.mark.parametrize("setup", ["spec-drafter", "history"])
def test_no_repeat_ngram_with_exact_acceptance_equals_beam1(probe_at, verifier, drafter, greedy_no_repeat, setup,
                                                            batch_size):
    """The history drafter proposes continuations of n-grams the hypothesis already holds:
    drafts that complete a banned n-gram, inside the block too."""
    probe, sentences = probe_at(batch_size)
    extra = ["--spec-k", "10"] if setup == "spec-drafter" else ["--spec-history-ngram", "2", "--spec-k", "6"]
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", drafter, *extra,
                    "--spec-acceptance", "exact", "--no-repeat-ngram-size", "3")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy_no_repeat, sentences)


# Every drafter kind, alone and composed, through fairseq-generate: lossless at batch 1,
# 7 and 16 (rows finishing at different times, dropped rows, caches growing).
DRAFTER_SETUPS = {
    "autoregressive": lambda d: ["--drafter-path", d["ar"], "--spec-k", "4"],
    "history": lambda d: ["--spec-history-ngram", "1", "--spec-k", "6"],
    "source": lambda d: ["--spec-source-ngram", "1", "--spec-k", "6"],
    "history+source+autoregressive": lambda d: ["--drafter-path", d["ar"], "--spec-history-ngram", "2",
                                                "--spec-source-ngram", "1", "--spec-k", "3"],
    # a static block: every row's block the draft's horizon wide (one host read an iteration)
    "source+spec-static": lambda d: ["--drafter-path", d["spec"], "--spec-source-ngram", "1", "--spec-k", "5",
                                     "--spec-verify", "static"],
}


@pytest.fixture(scope="module")
def drafters(drafter, ar_drafter):
    return {"spec": drafter, "ar": ar_drafter}


@pytest.mark.parametrize("batch_size", [1, 7, 16])
@pytest.mark.parametrize("setup", sorted(DRAFTER_SETUPS))
def test_every_drafter_kind_is_lossless(probe_at, verifier, drafters, greedy, setup, batch_size):
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), *DRAFTER_SETUPS[setup](drafters),
                    "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)
    mean_k = float(re.search(r"mean k ([0-9.]+)", proc.stderr).group(1))
    assert mean_k > 0  # something was drafted (and verified)
    for lookup in ("history", "source"):
        rate = float(re.search(rf"drafted from {lookup} ([0-9.]+)% of iterations", proc.stderr).group(1))
        assert (rate > 0) == (lookup in setup), (lookup, rate)


HISTORY_CONTROLLERS = {
    "gammatune-spec": lambda d: ["--drafter-path", d["spec"], "--spec-controller", "gammatune", "--spec-k", "4"],
    "gammatune-plus-autoregressive": lambda d: ["--drafter-path", d["ar"], "--spec-controller", "gammatune-plus",
                                                "--spec-k", "3", "--spec-k-max", "6"],
    "hf-heuristic-spec": lambda d: ["--drafter-path", d["spec"], "--spec-controller", "hf-heuristic", "--spec-k", "2",
                                    "--spec-k-max", "10"],
    "assistant-threshold-autoregressive": lambda d: ["--drafter-path", d["ar"], "--spec-controller",
                                                     "assistant-threshold", "--spec-k", "5"],
    "cmasd-gammatune-spec": lambda d: ["--drafter-path", d["spec"], "--spec-controller", "cmasd-gammatune",
                                       "--spec-k", "4", "--spec-k-max", "8", "--spec-draft-block", "8"],
    # rows that idle (draft nothing) for a while, then probe
    "gammatune-idle-spec": lambda d: ["--drafter-path", d["spec"], "--spec-controller", "gammatune", "--spec-k", "6",
                                      "--spec-idle-below", "2", "--spec-probe-every", "3"],
    "cmasd-idle-autoregressive": lambda d: ["--drafter-path", d["ar"], "--spec-controller", "cmasd", "--spec-k-max",
                                            "5", "--spec-idle-below", "2.5", "--spec-probe-every", "2"],
    "cmasd-idle-autoregressive-static": lambda d: ["--drafter-path", d["ar"], "--spec-controller", "cmasd",
                                                   "--spec-k-max", "5", "--spec-idle-below", "2.5",
                                                   "--spec-probe-every", "2", "--spec-verify", "static"],
}


@pytest.mark.parametrize("batch_size", [1, 16])
@pytest.mark.parametrize("setup", sorted(HISTORY_CONTROLLERS))
def test_history_controllers_are_lossless(probe_at, verifier, drafters, greedy, setup, batch_size):
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), *HISTORY_CONTROLLERS[setup](drafters),
                    "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)
    histogram = re.search(r"k histogram \{([^}]*)\}", proc.stderr).group(1)
    assert len(histogram.split(",")) > 1  # the draft length changed along the way


@pytest.mark.parametrize("batch_size", [1, 16])
def test_autoregressive_drafts_past_the_first_cache_stay_lossless(probe_at, verifier, ar_drafter, very_long_greedy,
                                                                  batch_size):
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", ar_drafter,
                    "--drafter-kind", "autoregressive", "--spec-k", "5", "--spec-history-ngram", "3", *VERY_LONG)
    assert_same_hypotheses(hypotheses(proc.stdout), very_long_greedy, sentences)


def test_lenient_autoregressive_and_cmasd_decode_every_line(probe, verifier, ar_drafter):
    for rule in (["--spec-acceptance", "topk-gap", "--spec-k", "4"],
                 ["--spec-controller", "cmasd", "--spec-k-max", "6", "--spec-acceptance", "cmasd"]):
        proc = generate(probe, verifier, "--batch-size", "16", "--drafter-path", ar_drafter, *rule)
        assert sorted(hypotheses(proc.stdout)) == list(range(PROBE_SENTENCES + 1))


def test_check_lossless_script_passes_on_an_untrained_drafter(probe_at, verifier, untrained_drafter, tmp_path):
    """On the probe set's head (25 lines, several of which reach the cap), with --generation:
    both runs under the suite's length cap (LENGTH_CAP)."""
    head, sentences = probe_at(1)
    proc = run(["bash", REPO / "data-prep" / "check-lossless.sh", head, verifier, untrained_drafter,
                "--batch-sizes", "7,16", "--out", tmp_path, "--generation", " ".join(LENGTH_CAP)])
    n = sentences + 1
    assert proc.stderr.count(f"{n} sentences, 0 different") == 2
    assert f"both runs: {' '.join(LENGTH_CAP)};" in proc.stderr
    assert "lossless: the same hypotheses as fairseq-generate --beam 1 at batch size(s) 7,16" in proc.stderr
    for batch_size in (7, 16):
        for run_ in ("greedy", "speculative"):
            outputs = hypotheses((tmp_path / f"{run_}-{batch_size}.txt").read_text())
            assert len(outputs) == n
            assert max(len(tokens.split()) for _, tokens in outputs.values()) == CAP_LEN  # some reach it, none pass it


def compare_hyps(tmp_path, first, second, sentences):
    """cmasd-prep compare-hyps on two hand-written fairseq-generate outputs."""
    (tmp_path / "a.txt").write_text(first)
    (tmp_path / "b.txt").write_text(second)
    return subprocess.run(
        [str(BIN / "python"), "-m", "cmasd.tools.prep", "compare-hyps", "--sentences", str(sentences),
         str(tmp_path / "a.txt"), str(tmp_path / "b.txt")],
        capture_output=True, text=True, cwd=REPO, env=tool_env())


def test_compare_hyps_names_the_sentences_that_differ(tmp_path):
    same = "S-1\tb\nH-1\t-0.5\tx y\nS-0\ta\nH-0\t-0.1\tu v\n"
    assert compare_hyps(tmp_path, same, "H-0\t-0.2\tu v\nH-1\t-0.4\tx y\n", 2).returncode == 0
    proc = compare_hyps(tmp_path, same, "H-0\t-0.1\tu v\nH-1\t-0.5\tx z\n", 2)
    assert proc.returncode == 1
    assert "2 sentences, 1 different (ids 1)" in proc.stdout


@pytest.mark.parametrize("second, message", [
    ("H-0\t-0.1\tu\n", "1 hypotheses for 2 sentences (missing ids 1, ids twice none, ids out of range none)"),
    ("H-0\t-0.1\tu\nH-1\t-0.1\tu\nH-1\t-0.1\tu\n", "ids twice 1,"),
    ("H-0\t-0.1\tu\nH-1\t-0.1\tu\nH-2\t-0.1\tu\n", "ids out of range 2"),
    ("H-0\tu\n", "b.txt:1: not an H-ID<TAB>SCORE<TAB>TOKENS line"),
])
def test_compare_hyps_refuses_incomplete_outputs(tmp_path, second, message):
    proc = compare_hyps(tmp_path, "H-0\t-0.1\tu\nH-1\t-0.1\tu\n", second, 2)
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.startswith("cmasd-prep: error:")


def test_lenient_acceptance_decodes_every_line(probe, verifier, drafter):
    for rule in (["--spec-acceptance", "topk-gap", "--spec-beta", "5", "--spec-tau", "3"],
                 ["--spec-controller", "cmasd", "--spec-acceptance", "cmasd", "--cmasd-gamma", "2"]):
        proc = generate(probe, verifier, "--batch-size", "16", "--drafter-path", drafter, *rule)
        assert sorted(hypotheses(proc.stdout)) == list(range(PROBE_SENTENCES + 1))


def test_empty_source_line_is_decoded_and_named(probe, verifier, drafter):
    proc = generate(probe, verifier, "--batch-size", "16", "--drafter-path", drafter)
    assert re.search(rf"^S-{EMPTY_AT}\t$", proc.stdout, re.M)
    assert EMPTY_AT in hypotheses(proc.stdout)
    assert re.search(rf"empty source.*\b{EMPTY_AT}\b", proc.stderr)


@pytest.mark.parametrize("batch_size", [1, 16])
def test_nothing_drafted_equals_beam1(probe_at, verifier, drafter, greedy, batch_size):
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", drafter,
                    "--spec-k", "0", "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)
    assert "mean accepted tokens/iteration 1.000" in proc.stderr
    assert "mean k 0.00" in proc.stderr


@pytest.mark.parametrize("batch_size", [1, 16])
def test_outputs_longer_than_the_first_cache_stay_lossless(probe_at, verifier, drafter, long_greedy, batch_size):
    """The caches start with room for about the source length plus two blocks and grow
    while rows run on; ``--min-len 100`` makes every hypothesis outgrow them."""
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", drafter,
                    "--spec-k", "10", "--spec-acceptance", "exact", *LONG)
    assert_same_hypotheses(hypotheses(proc.stdout), long_greedy, sentences)


@pytest.mark.parametrize(
    "options, message",
    [
        (["--beam", "5"], "--beam 5"),
        (["--spec-k", "-1"], "--spec-k: must be in [0, 25]"),
        (["--spec-k", "26"], "--spec-k: must be in [0, 25]"),
        (["--spec-cuda-graphs"], "--spec-cuda-graphs: the verifier is on the cpu; CUDA graphs need it on a GPU"),
        (["--spec-controller", "cmasd", "--spec-k-min", "9", "--spec-k-max", "4"], "--spec-k-min"),
        (["--spec-controller", "cmasd", "--cmasd-alpha", "1.5"], "--cmasd-alpha"),
        (["--spec-acceptance", "cmasd", "--cmasd-gamma", "-1"], "--cmasd-gamma"),
        (["--cmasd-weights", "0.5,0.5,0.5"], "--cmasd-weights"),
        (["--sampling", "--spec-acceptance", "exact"], "--spec-acceptance exact: verifies greedy decoding"),
        (["--spec-k", "10", "--spec-draft-block", "9"], "--spec-draft-block: must be in [10, 25]"),
        (["--spec-controller", "cmasd", "--spec-draft-block", "24"], "--spec-draft-block: must be in [25, 25]"),
        (["--spec-history-ngram", "-1"], "--spec-history-ngram: must be >= 0"),
        (["--spec-source-ngram", "-2"], "--spec-source-ngram: must be >= 0"),
        (["--drafter-kind", "autoregressive"], "--drafter-kind autoregressive: "),
        (["--spec-controller", "gammatune", "--gammatune-eta", "0"], "--gammatune-eta: must be in (0, 1]"),
        (["--spec-controller", "gammatune", "--spec-k-min", "5", "--spec-k-max", "4", "--spec-k", "4"],
         "--spec-k-min: must be in [1, 4]"),
        (["--spec-controller", "gammatune", "--gammatune-delta", "-1"], "--gammatune-delta: must be >= 0"),
        (["--spec-controller", "assistant-threshold", "--draft-stop-threshold", "1.2"],
         "--draft-stop-threshold: must be in [0, 1]"),
    ],
)
def test_unsupported_options_are_refused(probe, verifier, drafter, options, message):
    """In this process, through fairseq-generate's own parser and error path
    (helpers.in_process); the program itself prints the same line (the next test)."""
    proc = generate(probe, verifier, "--batch-size", "16", "--drafter-path", drafter, *options, check=False)
    assert proc.returncode != 0
    assert message in last_line(proc)


@pytest.mark.parametrize("options, message", [
    (["--beam", "5"], "--beam 5"),
    (["--spec-k", "26"], "--spec-k: must be in [0, 25]"),
    (["--spec-controller", "gammatune", "--gammatune-eta", "0"], "--gammatune-eta: must be in (0, 1]"),
])
def test_the_program_refuses_options_in_one_line(probe, verifier, drafter, options, message):
    proc = generate(probe, verifier, "--batch-size", "16", "--drafter-path", drafter, *options, check=False, cli=True)
    assert proc.returncode != 0
    assert message in last_line(proc)


def test_a_drafter_kind_without_a_drafter_is_refused(probe, verifier):
    proc = generate(probe, verifier, "--drafter-kind", "spec", check=False)
    assert proc.returncode != 0
    assert "--drafter-kind spec: needs --drafter-path" in last_line(proc)


def test_missing_drafter_checkpoint(probe, verifier, tmp_path):
    proc = generate(probe, verifier, "--drafter-path", tmp_path / "none.pt", check=False, cli=True)
    assert proc.returncode != 0
    assert "--drafter-path" in last_line(proc) and "none.pt" in last_line(proc)


def test_drafter_of_another_dictionary_is_refused(probe, verifier, drafter, tmp_path):
    import fairseq_plugins  # noqa: F401  allow-lists fairseq's checkpoint classes

    state = torch.load(drafter, map_location="cpu")
    state["model"]["dictionary_digest"] = torch.zeros_like(state["model"]["dictionary_digest"])
    other = tmp_path / "other-dictionary.pt"
    torch.save(state, other)
    proc = generate(probe, verifier, "--drafter-path", other, check=False)
    assert proc.returncode != 0
    assert "drafter dictionary" in last_line(proc) and "differs from the verifier's" in last_line(proc)


@pytest.mark.parametrize(
    "options, message",
    [
        (["--spec-draft-block", "4"], "--spec-draft-block: applies to the Spec-Drafter only"),
        (["--spec-controller", "cmasd"], "--spec-k-max: required with --spec-controller cmasd"),
        (["--drafter-kind", "spec"], "--drafter-kind spec: "),
    ],
)
def test_autoregressive_drafter_options_are_checked(probe, verifier, ar_drafter, options, message):
    proc = generate(probe, verifier, "--drafter-path", ar_drafter, *options, check=False)
    assert proc.returncode != 0
    assert message in last_line(proc)


def test_autoregressive_drafter_of_another_dictionary_is_refused(probe, verifier, ar_drafter, tmp_path):
    import fairseq_plugins  # noqa: F401  allow-lists fairseq's checkpoint classes

    state = torch.load(ar_drafter, map_location="cpu")
    state["model"]["dictionary_digest"] = torch.zeros_like(state["model"]["dictionary_digest"])
    torch.save(state, tmp_path / "other-digest.pt")
    proc = generate(probe, verifier, "--drafter-path", tmp_path / "other-digest.pt", check=False)
    assert proc.returncode != 0
    assert "drafter dictionary" in last_line(proc) and "differs from the verifier's" in last_line(proc)
    # a vocabulary of another size: refused before the weights are loaded, naming both sizes
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"):
        if key in state["model"]:
            state["model"][key] = state["model"][key][:-8]
    torch.save(state, tmp_path / "other-size.pt")
    proc = generate(probe, verifier, "--drafter-path", tmp_path / "other-size.pt", check=False)
    assert proc.returncode != 0
    assert re.search(r"--drafter-path .*other-size.pt: drafter dictionary \(\d+ symbols\) differs from the verifier's "
                     r"\(\d+ symbols\)", last_line(proc))


@pytest.fixture(scope="session")
def with_long_source(multi30k, artifacts):
    """Four real pairs and, at index 2, a source of about 1,300 tokens: longer than the
    verifier's 1,024 source positions."""

    def build(dest):
        pairs = raw_pairs(multi30k, 4)
        pairs.insert(2, (" ".join([pairs[0][0]] * 100), pairs[0][1]))
        binarize(multi30k, dest / "bin", pairs)

    return artifacts.get("with-long-source", build) / "bin"


def test_over_long_source_raises_as_fairseq_does(with_long_source, verifier, drafter):
    proc = generate(with_long_source, verifier, "--drafter-path", drafter, check=False, cli=True)
    assert proc.returncode != 0
    assert "--skip-invalid-size-inputs-valid-test" in proc.stderr


def test_over_long_source_is_skipped_on_request(with_long_source, verifier, drafter):
    proc = generate(with_long_source, verifier, "--drafter-path", drafter, "--batch-size", "2",
                    "--skip-invalid-size-inputs-valid-test")
    assert sorted(hypotheses(proc.stdout)) == [0, 1, 3, 4]
    assert "skipped" in proc.stderr
