"""The ways in: the Python API (``cmasd.from_pretrained``), ``fairseq-interactive``, batches
that lose no sentence, and one-line errors in every program."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import BIN, CAP_LEN, EMPTY_AT, LENGTH_CAP, PLUGINS, PROBE_SENTENCES, REPO, generate, hypotheses, last_line, raw_pairs, run, tool_env


# The suite's length cap (helpers.LENGTH_CAP), as the API's keyword arguments
CAP = {"max_len_a": 0.0, "max_len_b": CAP_LEN}


def detokenized(pieces: str) -> str:
    """fairseq-generate's H-line pieces as sentencepiece detokenizes them."""
    return pieces.replace(" ", "").replace("\u2581", " ").strip()


@pytest.fixture(scope="module")
def probe_sources(multi30k):
    """The raw sources of ``probe`` (test_generate.py), its empty line included."""
    sources = [source for source, _ in raw_pairs(multi30k, PROBE_SENTENCES)]
    sources.insert(EMPTY_AT, "")
    return sources


@pytest.fixture(scope="module")
def hub(multi30k, verifier, drafter):
    from cmasd import from_pretrained

    torch.set_num_threads(1)
    return from_pretrained(str(verifier), data_name_or_path=str(multi30k), drafter_path=str(drafter), batch_size=7,
                           spec_k=4, spec_acceptance="exact", **CAP)


# --------------------------------------------------------------------------- the Python API


def test_api_translates_losslessly_one_string_per_input_in_order(hub, probe_sources, greedy):
    outputs = hub.translate(probe_sources)
    assert len(outputs) == len(probe_sources) == PROBE_SENTENCES + 1
    expected = [detokenized(greedy[i][1]) for i in range(len(probe_sources))]
    different = [i for i, (got, want) in enumerate(zip(outputs, expected)) if got != want]
    assert not different, f"{len(different)} outputs differ from fairseq-generate --beam 1, e.g. {different[:5]}"
    stats = hub.last_stats.summary()
    assert stats["sentences"] == len(probe_sources)
    assert stats["mean_accepted_tokens"] >= 1.0 and stats["verifier_passes"] > 0


def test_api_options_per_call_and_fairseq_generator_without_a_drafter(hub, probe_sources, multi30k, verifier):
    from cmasd import from_pretrained

    sources = probe_sources[:20]
    lenient = hub.translate(sources, spec_k=8, spec_acceptance="topk-gap", spec_beta=5, spec_tau=10.0)
    assert len(lenient) == len(sources)
    assert hub.task.cfg.spec_k == 4 and hub.task.cfg.spec_acceptance == "exact"  # restored after the call
    exact = hub.translate(sources, spec_k=2)
    plain = from_pretrained(str(verifier), data_name_or_path=str(multi30k), batch_size=5, **CAP)
    assert plain.translate(sources) == exact
    assert plain.last_stats is None  # fairseq's own generator ran
    assert hub.translate(sources[3]) == exact[3]  # one string in, one string out


def test_api_cuts_a_source_too_long_and_keeps_every_line(hub, probe_sources, caplog):
    sources = [probe_sources[0], " ".join([probe_sources[1]] * 120), probe_sources[2]]
    with caplog.at_level("WARNING"):
        outputs = hub.translate(sources)
    assert len(outputs) == 3
    assert outputs[0] == hub.translate(probe_sources[0]) and outputs[2] == hub.translate(probe_sources[2])
    assert any("more than the model's 1024 source positions" in r.getMessage() for r in caplog.records)


def test_api_refuses_bad_options_and_missing_files(hub, multi30k, verifier, tmp_path):
    from cmasd import from_pretrained
    from cmasd.errors import MissingFileError, UsageError

    with pytest.raises(UsageError, match="unknown option"):
        hub.translate(["A dog."], spec_kk=3)
    with pytest.raises(UsageError, match="--spec-k: must be in"):
        hub.translate(["A dog."], spec_k=99)
    assert hub.task.cfg.spec_k == 4
    with pytest.raises(UsageError, match="skip_invalid_size_inputs"):
        hub.generate([hub.encode("A dog.")], skip_invalid_size_inputs=True)
    with pytest.raises(MissingFileError, match="no checkpoint"):
        from_pretrained(str(tmp_path))
    with pytest.raises(MissingFileError, match="no dictionary"):
        from_pretrained(str(verifier), data_name_or_path=str(tmp_path))
    with pytest.raises(MissingFileError, match="--drafter-path"):
        from_pretrained(str(verifier), data_name_or_path=str(multi30k),
                        drafter_path=str(tmp_path / "none.pt")).translate(["A dog."])


# --------------------------------------------------------------------------- fairseq-interactive


def test_interactive_answers_piped_lines_losslessly_and_survives_a_long_line(multi30k, verifier, drafter,
                                                                             probe_sources, greedy):
    sources = probe_sources[:8]
    lines = sources[:5] + [" ".join([sources[0]] * 30)] + sources[5:]  # index 5: over 64 positions
    proc = run(
        [BIN / "fairseq-interactive", multi30k, "--user-dir", PLUGINS, "--task", "translation_speculative",
         "--path", verifier, "--drafter-path", drafter, "--spec-k", "4", "--spec-acceptance", "exact",
         "--source-lang", "en", "--target-lang", "de", "--bpe", "sentencepiece",
         "--sentencepiece-model", multi30k / "spm.model", "--buffer-size", "4", "--batch-size", "4",
         "--max-source-positions", "64", "--beam", "1", "--cpu", *LENGTH_CAP],
        input="".join(line + "\n" for line in lines),
    )
    outputs = {}
    for line in proc.stdout.splitlines():
        if line.startswith("D-"):
            index, _, text = line[2:].split("\t", 2)
            assert int(index) not in outputs
            outputs[int(index)] = text
    assert sorted(outputs) == list(range(len(lines)))
    expected = [detokenized(greedy[i][1]) for i in range(len(sources))]
    assert [outputs[i] for i in range(len(lines)) if i != 5] == expected
    assert "more than the model's 64 source positions" in proc.stderr


# --------------------------------------------------------------------------- no sentence lost


@pytest.mark.parametrize("drafting", [[], ["--spec-source-ngram", "1", "--spec-k", "4"]], ids=["fairseq", "cmasd"])
def test_no_sentence_lost_with_fairseqs_default_batch_multiple(probe, verifier, drafting):
    """97 sentences at --batch-size 16 with --required-batch-size-multiple 8 (fairseq's
    default; the later flag wins): fairseq 0.12 alone prints 96."""
    proc = generate(probe, verifier, "--batch-size", "16", "--required-batch-size-multiple", "8", "--max-len-a", "0",
                    "--max-len-b", "8", *drafting)
    assert sorted(hypotheses(proc.stdout)) == list(range(PROBE_SENTENCES + 1))


@pytest.mark.parametrize("count, max_sentences, max_tokens, multiple", [
    (100, 16, None, 8), (200, 1, None, 8), (97, 7, None, 8), (100, None, 300, 8), (64, 16, None, 8), (5, 3, 40, 1),
])
def test_complete_batches_cover_every_index_within_the_limits(count, max_sentences, max_tokens, multiple):
    from fairseq.data import Dictionary, LanguagePairDataset

    from cmasd.training.task import CompleteBatches

    lengths = np.random.default_rng(count).integers(3, 30, count)
    dataset = LanguagePairDataset([torch.full((int(n),), 4) for n in lengths], lengths, Dictionary())
    indices = dataset.ordered_indices()
    batches = CompleteBatches(dataset).batch_by_size(indices, max_tokens, max_sentences, multiple)
    covered = np.concatenate(batches)
    assert sorted(covered.tolist()) == list(range(count))  # each index once
    for batch in batches:
        assert max_sentences is None or len(batch) <= max_sentences
        assert max_tokens is None or len(batch) * lengths[batch].max() <= max_tokens


# --------------------------------------------------------------------------- one-line errors


def test_usage_errors_print_one_line_and_other_errors_their_traceback():
    script = ("import sys; from cmasd.errors import UsageError, report_usage_errors; report_usage_errors(); "
              "raise (UsageError if sys.argv[1] == 'usage' else RuntimeError)('--spec-k: must be in [0, 25], got 99')")
    usage = subprocess.run([sys.executable, "-c", script, "usage"], capture_output=True, text=True, cwd=REPO)
    assert usage.returncode == 1
    assert usage.stderr.strip().splitlines() == ["-c: error: --spec-k: must be in [0, 25], got 99"]
    bug = subprocess.run([sys.executable, "-c", script, "bug"], capture_output=True, text=True, cwd=REPO)
    assert bug.returncode == 1 and "Traceback" in bug.stderr and "RuntimeError" in bug.stderr


def one_line_error(cmd, prog, **kwargs):
    """The one error line of a refused command (fails on a traceback or a zero exit)."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=REPO, env=tool_env(), **kwargs)
    return last_line(proc, prog)


def test_interactive_option_error_is_one_line(multi30k, verifier, drafter):
    line = one_line_error(
        [BIN / "fairseq-interactive", multi30k, "--user-dir", PLUGINS, "--task", "translation_speculative",
         "--path", verifier, "--drafter-path", drafter, "--spec-k", "99", "--beam", "1", "--cpu"],
        "fairseq-interactive", input="A dog.\n")
    assert "--spec-k: must be in [0, 25]" in line and "got 99" in line


def test_train_option_error_is_one_line(multi30k, tmp_path):
    line = one_line_error(
        [BIN / "fairseq-train", multi30k, "--user-dir", PLUGINS, "--task", "translation_speculative",
         "--arch", "spec_drafter_compact", "--criterion", "spec_drafter_loss", "--verifier-path", tmp_path / "none.pt",
         "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1024", "--max-update", "1", "--cpu",
         "--save-dir", tmp_path / "save"],
        "fairseq-train")
    assert "none.pt" in line


def test_bench_option_error_from_the_library_is_one_line(multi30k, verifier, drafter, tmp_path):
    line = one_line_error(
        [BIN / "cmasd-bench", multi30k, "--path", verifier, "--drafter-path", drafter, "--configs", "cmasd-k4",
         "--set", "cmasd_weights=0.5,0.5,0.5", "--batch-sizes", "1", "--repeats", "1", "--max-sentences", "2",
         "--out-dir", tmp_path],
        "cmasd-bench")
    assert "--cmasd-weights" in line
