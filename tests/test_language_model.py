"""Speculative decoding for a fairseq language model (``transformer_lm``) under the
``language_modeling_speculative`` task: prompts in, continuations out.

A tiny verifier LM and a tinier draft LM, trained for a few seconds through
``fairseq-train --task language_modeling`` on Multi30k's English sentences (the data
mirror); prompts are the first words of its test sentences, of different lengths in a
batch. Greedy speculative continuations equal fairseq's own (``SequenceGenerator``, beam 1,
through the same task's ``inference_step``) token for token, the prompt included, at batch
1, 7 and 16, for the draft model and for the history lookup (prompt lookup decoding); bad
prompts are refused in one line.
"""

from types import SimpleNamespace

import pytest
import torch

from helpers import BIN, LM_POSITIONS, PLUGINS, REPO, english, run

PROMPTS = 32


def train_heads(data, verifier, save, arch, *options):
    """Heads on the frozen verifier LM, trained through ``fairseq-train --task
    language_modeling_speculative`` (its next-token targets) for a few updates."""
    run([BIN / "fairseq-train", data / "bin", "--user-dir", PLUGINS, "--task", "language_modeling_speculative",
         "--arch", arch, "--verifier-path", verifier, "--criterion", f"{arch}_loss", *options,
         "--tokens-per-sample", str(LM_POSITIONS), "--sample-break-mode", "eos", "--optimizer", "adam",
         "--lr", "3e-3", "--max-tokens", "2048", "--max-update", "40", "--seed", "1", "--save-dir", save,
         "--no-epoch-checkpoints", "--no-progress-bar", "--cpu", "--num-workers", "0", "--disable-validation"])


def lm_task(data, verifier, *options):
    """The ``language_modeling_speculative`` task of fairseq-generate's ``options``, its
    verifier and its generator (fairseq's own without a drafter)."""
    from fairseq import checkpoint_utils, options as fairseq_options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = fairseq_options.get_generation_parser()
    argv = [str(data / "bin"), "--user-dir", PLUGINS, "--task", "language_modeling_speculative", "--path", str(verifier),
            "--cpu", "--beam", "1", "--tokens-per-sample", str(LM_POSITIONS), *map(str, options)]
    cfg = convert_namespace_to_omegaconf(fairseq_options.parse_args_and_arch(parser, argv))
    task = tasks.setup_task(cfg.task)
    task.log_stats = False  # no statistics at the test run's exit
    models, _ = checkpoint_utils.load_model_ensemble([str(verifier)], task=task)
    models = [model.eval() for model in models]
    return task, models, task.build_generator(models, cfg.generation)


def prompts(data, dictionary, count=PROMPTS):
    """The first 1 .. 8 words of Multi30k's first English test sentences, as fairseq-interactive
    encodes input lines (eos appended; the task's inference dataset strips it)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(data / "bin" / "spm.model"))
    lines = english("test_2016_flickr", count)
    words = [" ".join(line.split()[: 1 + i % 8]) for i, line in enumerate(lines)]
    return [dictionary.encode_line(" ".join(sp.encode(w, out_type=str)), add_if_not_exist=False).long()
            for w in words]


def continuations(task, models, generator, tokens, bsz):
    """Each prompt's hypothesis (tokens, positional scores), decoded ``bsz`` prompts a batch
    through the task's ``inference_step``, as fairseq-interactive batches its input lines."""
    dataset = task.build_dataset_for_inference(tokens, [t.numel() for t in tokens])
    found = []
    for first in range(0, len(tokens), bsz):
        sample = dataset.collater([dataset[i] for i in range(first, min(first + bsz, len(tokens)))])
        with torch.no_grad():
            hypos = task.inference_step(generator, models, sample)
        found += [(h[0]["tokens"], h[0]["positional_scores"]) for h in hypos]
    return found


def assert_same_continuations(got, expected):
    different = [i for i, (g, e) in enumerate(zip(got, expected)) if not torch.equal(g[0], e[0])]
    assert len(got) == len(expected) and not different, f"{len(different)} continuations differ, e.g. {different[:5]}"
    for (_, g), (_, e) in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-3)


@pytest.fixture(scope="module")
def fairseq_greedy(lm_data, lm):
    """fairseq's own greedy continuations of the prompts (SequenceGenerator, beam 1), per batch size."""
    from fairseq.sequence_generator import SequenceGenerator

    task, models, generator = lm_task(lm_data, lm)
    assert isinstance(generator, SequenceGenerator)
    tokens = prompts(lm_data, task.source_dictionary)
    return {bsz: continuations(task, models, generator, tokens, bsz) for bsz in (1, 7, 16)}


DRAFTERS = {
    "draft model": lambda draft_lm: ["--drafter-path", draft_lm, "--spec-k", "4"],
    "history lookup": lambda draft_lm: ["--spec-history-ngram", "2", "--spec-k", "4"],
}


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("bsz", [1, 7, 16])
def test_greedy_continuations_equal_fairseqs(lm_data, lm, draft_lm, fairseq_greedy, drafter, bsz):
    """Exact acceptance and the fixed controller: the prompt and its greedy continuation,
    token for token, as fairseq's generator gives them, in batches of prompts of 1 to 8
    words; the drafter proposed tokens and some were accepted."""
    from cmasd.decoding.generator import SpeculativeGenerator

    task, models, generator = lm_task(lm_data, lm, *DRAFTERS[drafter](draft_lm))
    assert isinstance(generator, SpeculativeGenerator)
    got = continuations(task, models, generator, prompts(lm_data, task.source_dictionary), bsz)
    assert_same_continuations(got, fairseq_greedy[bsz])
    assert generator.stats.accepted > 0


@pytest.mark.parametrize("controller", ["cmasd", "gammatune", "hf-heuristic", "goodput"])
def test_other_controllers_stay_lossless(lm_data, lm, draft_lm, fairseq_greedy, controller):
    """The controllers read no source: each keeps the draft model's continuations fairseq's
    (goodput with the costs calibrated for the language models when the generator is built)."""
    task, models, generator = lm_task(lm_data, lm, "--drafter-path", draft_lm, "--spec-controller", controller,
                                      "--spec-k", "4", "--spec-k-max", "8")
    got = continuations(task, models, generator, prompts(lm_data, task.source_dictionary), 7)
    assert_same_continuations(got, fairseq_greedy[7])


def test_graphed_passes_continue_prompts_as_fairseqs(lm_data, lm, draft_lm, fairseq_greedy):
    """``--spec-cuda-graphs`` without a GPU (``tests/test_graphs.py``): the language model's
    verify passes, its prompts' prefill up to k + 1 wide and the draft model's passes replayed
    by running again into the recordings' outputs (wider prompts eager, on the same arena);
    the continuations stay fairseq's."""
    from cmasd.layers.graphs import EagerGraphs, GraphedScorer

    task, models, generator = lm_task(lm_data, lm, "--drafter-path", draft_lm, "--spec-k", "4", "--spec-verify",
                                      "static")
    # (as --spec-cuda-graphs builds them: blocks wider than k + 1, the prompts', eager)
    generator.scorer = GraphedScorer(models[0].decoder, generator.kernels, EagerGraphs(), widest=5)
    drafter = generator.drafter
    drafter.scorer = GraphedScorer(drafter.model.decoder, drafter.scorer.decoder.kernels, EagerGraphs(), widest=5)
    got = continuations(task, models, generator, prompts(lm_data, task.source_dictionary), 7)
    assert_same_continuations(got, fairseq_greedy[7])
    assert generator.scorer.counts["replayed"] >= generator.stats.batch_iterations > 0
    assert drafter.scorer.counts["replayed"] > 0 and generator.stats.accepted > 0


HEADS = {
    "specbound": ("exit_heads", [], ["--drafter-kind", "specbound", "--specbound-tau", "0.3"]),
    "blockwise": ("blockwise_heads", ["--blockwise-k", "4", "--blockwise-ffn-dim", "64"],
                  ["--drafter-kind", "blockwise", "--spec-k", "3"]),
}


@pytest.mark.parametrize("kind", HEADS)
def test_heads_trained_on_a_language_model_draft_losslessly(lm_data, lm, fairseq_greedy, artifacts, kind):
    """SpecBound's exit heads and blockwise decoding's heads train on the verifier LM
    through fairseq-train (``--task language_modeling_speculative``), load without it, and
    draft continuations that stay fairseq's at batch 7."""
    arch, train_options, decode_options = HEADS[kind]
    heads = artifacts.get(f"lm-{arch}", lambda save: train_heads(lm_data, lm, save, arch, *train_options))
    task, models, generator = lm_task(lm_data, lm, *decode_options, "--drafter-path", heads / "checkpoint_last.pt")
    got = continuations(task, models, generator, prompts(lm_data, task.source_dictionary), 7)
    assert_same_continuations(got, fairseq_greedy[7])
    assert generator.stats.accepted > 0


def test_prompts_cut_by_the_maximum_length_end_as_fairseqs(lm_data, lm, draft_lm):
    """A maximum length shorter than some prompts (--max-len-b 4): fairseq forces the first
    max-len prompt tokens, then eos; so does the loop."""
    from fairseq.sequence_generator import SequenceGenerator

    task, models, reference = lm_task(lm_data, lm, "--max-len-b", "4")
    assert isinstance(reference, SequenceGenerator)
    tokens = prompts(lm_data, task.source_dictionary, 16)
    expected = continuations(task, models, reference, tokens, 16)
    _, _, generator = lm_task(lm_data, lm, "--max-len-b", "4", "--drafter-path", draft_lm)
    assert_same_continuations(continuations(task, models, generator, tokens, 16), expected)


def test_min_len_applies_after_the_prompts_as_fairseqs(lm_data, lm, draft_lm):
    """fairseq's --min-len holds only after the batch's longest prompt (its forced prefix):
    the same continuations with --min-len 12."""
    task, models, reference = lm_task(lm_data, lm, "--min-len", "12")
    tokens = prompts(lm_data, task.source_dictionary, 16)
    expected = continuations(task, models, reference, tokens, 16)
    _, _, generator = lm_task(lm_data, lm, "--min-len", "12", "--drafter-path", draft_lm)
    assert_same_continuations(continuations(task, models, generator, tokens, 16), expected)


def test_a_prompt_too_long_for_the_model_is_refused_in_one_message(lm_data, lm, draft_lm):
    """A prompt the model's positions cannot hold after the start token, handed to the
    generator: a UsageError naming the input, not a traceback from inside the model."""
    from cmasd.errors import UsageError

    task, models, generator = lm_task(lm_data, lm, "--drafter-path", draft_lm)
    eos = task.source_dictionary.eos()
    long = torch.tensor(list(range(4, 4 + LM_POSITIONS)) + [eos], dtype=torch.long)
    tokens = [prompts(lm_data, task.source_dictionary, 1)[0], long]
    message = f"input(s) 1 ({LM_POSITIONS} tokens): prompt longer than the {LM_POSITIONS - 1} tokens"
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        continuations(task, models, generator, tokens, 2)


def test_empty_prompts_are_continued_from_the_start_token_as_fairseqs(lm_data, lm, draft_lm, caplog):
    """An empty prompt (an empty input line) in a batch of others, and a batch of empty
    prompts alone: continued from the start token as fairseq's greedy continues them, with
    a warning naming them."""
    task, models, reference = lm_task(lm_data, lm)
    eos = task.source_dictionary.eos()
    tokens = prompts(lm_data, task.source_dictionary, 6)
    tokens[2] = tokens[4] = torch.tensor([eos])
    _, _, generator = lm_task(lm_data, lm, "--drafter-path", draft_lm)
    for bsz in (6, 1):
        expected = continuations(task, models, reference, tokens, bsz)
        with caplog.at_level("WARNING", logger="cmasd.decoding.generator"):
            assert_same_continuations(continuations(task, models, generator, tokens, bsz), expected)
    assert "empty prompt(s), sentence id(s) 2, 4: continued from the start token alone" in caplog.text


def test_a_prompt_with_an_eos_inside_ends_there_as_fairseqs(lm_data, lm, draft_lm):
    """A prompt of two lines (an eos inside, as fairseq-generate reads blocks of several
    lines): fairseq forces the eos and ends the hypothesis there; so does the loop, at
    batch 1 and beside other prompts."""
    task, models, reference = lm_task(lm_data, lm)
    eos = task.source_dictionary.eos()
    tokens = prompts(lm_data, task.source_dictionary, 5)
    tokens[1] = torch.cat([tokens[1][:-1], torch.tensor([eos]), tokens[3]])
    tokens[3] = torch.cat([tokens[0][:-1], torch.tensor([eos, eos])])  # ends with eos twice: once forced
    _, _, generator = lm_task(lm_data, lm, "--drafter-path", draft_lm)
    for bsz in (5, 1):
        expected = continuations(task, models, reference, tokens, bsz)
        assert expected[1][0][-1] == eos and expected[1][0].numel() < tokens[1].numel()  # it ended at the eos
        assert_same_continuations(continuations(task, models, generator, tokens, bsz), expected)


def test_batches_over_a_split_cover_every_line(lm_data, lm):
    """fairseq-generate over a split of a language model: at ``--batch-size 16`` and the
    default ``--required-batch-size-multiple`` 8, fairseq's own batches leave out the
    valid split's last lines (1,014: 6 after 63 batches of 16); the task's cover them all."""
    task, _, _ = lm_task(lm_data, lm, "--sample-break-mode", "eos", "--gen-subset", "valid")
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    indices = dataset.ordered_indices()
    lost = len(dataset) - sum(len(b) for b in dataset.batch_by_size(indices, None, 16, 8))
    assert lost > 0  # what the task must make up for
    batches = task.get_batch_iterator(dataset, max_sentences=16, required_batch_size_multiple=8,
                                      num_workers=0).next_epoch_itr(shuffle=False)
    ids = sorted(i for batch in batches for i in batch["id"].tolist())
    assert ids == list(range(len(dataset)))


def test_an_encoder_decoder_draft_model_is_refused_for_a_language_model(lm_data, lm):
    """A drafter must read what its verifier reads: an encoder-decoder model cannot draft for
    a language model (refused in one message naming --drafter-path)."""
    from fairseq.models.transformer import TransformerModel

    from cmasd.drafters.autoregressive import AutoregressiveDrafter
    from cmasd.errors import UsageError
    from helpers import tiny_task, tiny_verifier_args

    task, models, _ = lm_task(lm_data, lm)
    options = SimpleNamespace(drafter_path="seq2seq.pt", spec_draft_block=None)  # what it reads before refusing
    seq2seq = TransformerModel.build_model(tiny_verifier_args(), tiny_task(task.source_dictionary))
    with pytest.raises(UsageError, match="--drafter-path seq2seq.pt: an encoder-decoder model cannot draft"):
        AutoregressiveDrafter.from_model(seq2seq, models[0], options, "native", 4)


SAMPLED_COPIES = 1200  # copies of one prompt, each its own sentence id (its own uniforms)


def first_two_sampled(task, models, generator, prompt, copies, bsz):
    """(copies, 2): the first two continuation tokens of each copy of ``prompt`` (eos,
    eos where the continuation ends at once), ``bsz`` copies a batch."""
    found = continuations(task, models, generator, [prompt] * copies, bsz)
    start = prompt.numel() - 1  # the hypothesis begins with the prompt (its input line's eos stripped)
    pairs = []
    for tokens, _ in found:
        first = int(tokens[start])
        eos = task.source_dictionary.eos()
        pairs.append((first, eos if first == eos else int(tokens[start + 1])))
    return torch.tensor(pairs)


def exact_first_two(model, dictionary, prompt) -> torch.Tensor:
    """P(t1, t2) (V, V) of the verifier LM's sampling after ``prompt``: temperature 1, pad
    never drawn; a continuation ending at t1 = eos counts as (eos, eos)."""
    eos, pad, vocab = dictionary.eos(), dictionary.pad(), len(dictionary)
    prefix = torch.cat([torch.tensor([eos]), prompt[:-1]])  # BOS (eos), then the prompt
    with torch.no_grad():
        first = model(prefix[None])[0][:, -1]  # (1, V)
        both = torch.cat([prefix[None].expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)  # (V, P + 2)
        second = model(both)[0][:, -1]  # (V, V)

    def probs(logits):
        logits = logits.double()
        logits[:, pad] = -float("inf")
        return torch.softmax(logits, dim=-1)

    p1 = probs(first)[0]  # (V,)
    joint = p1[:, None] * probs(second)  # (V, V)
    joint[eos] = 0.0
    joint[eos, eos] = p1[eos]
    return joint


def test_speculative_sampling_continues_a_prompt_as_the_verifier_samples(lm_data, lm, draft_lm):
    """Speculative sampling (the rejection rule, the draft LM, k = 4) draws a prompt's first two
    continuation tokens from the verifier LM's own distribution (chi-square against the exact
    joint of ``SAMPLED_COPIES`` copies, each its own sentence id), and a copy gets the same
    continuation at batch 1 as at batch 16 (its uniforms are its sentence id's)."""
    from helpers import chi_square, threshold

    task, models, generator = lm_task(lm_data, lm, "--drafter-path", draft_lm, "--spec-k", "4", "--sampling",
                                      "--spec-acceptance", "rejection")
    prompt = prompts(lm_data, task.source_dictionary)[2]  # three words
    pairs = first_two_sampled(task, models, generator, prompt, SAMPLED_COPIES, 16)
    joint = exact_first_two(models[0], task.source_dictionary, prompt)
    vocab = joint.size(0)
    counts = torch.bincount(pairs[:, 0] * vocab + pairs[:, 1], minlength=vocab * vocab)
    stat, df = chi_square(counts, joint.flatten())
    assert df >= 20, f"{df} degrees of freedom: too few bins for the test to have power"
    assert stat < threshold(df), f"chi-square {stat:.1f} on {df} df (threshold {threshold(df):.1f})"
    assert generator.stats.accepted > 0  # drafts were kept, not only the verifier's draws
    alone = continuations(task, models, generator, [prompt] * 16, 1)
    together = continuations(task, models, generator, [prompt] * 16, 16)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(alone, together))
    assert len({tuple(a[0].tolist()) for a in alone}) > 1  # different ids, different samples


@pytest.mark.parametrize("rule", [["--spec-lenience", "0.3"], ["--ears-beta", "0.1"]], ids=["lenience", "ears"])
def test_lenient_sampling_rules_run_on_a_language_model(lm_data, lm, draft_lm, rule):
    """Lenience (seed 001) and EARS (seed 004) on the rejection rule, with the draft LM:
    each copy of a prompt gets the same continuation at batch 1 as at batch 7 (its uniforms
    are its sentence id's), and over the same copies the lenient rule accepts a larger share
    of its drafts than the strict one."""
    options = ["--drafter-path", draft_lm, "--spec-k", "4", "--sampling", "--spec-acceptance", "rejection"]
    task, models, strict = lm_task(lm_data, lm, *options)
    _, _, lenient = lm_task(lm_data, lm, *options, *rule)
    tokens = [prompts(lm_data, task.source_dictionary)[2]] * 28
    alone = continuations(task, models, lenient, tokens, 1)
    together = continuations(task, models, lenient, tokens, 7)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(alone, together))
    continuations(task, models, strict, tokens, 7)
    rates = [s.accepted / s.drafted for s in (lenient.stats, strict.stats)]
    assert rates[0] > rates[1] > 0, rates


def test_distillation_continues_training_prompts_greedily_in_the_verifiers_dictionary(lm_data, lm, tmp_path):
    """data-prep/distill-lm.sh on the verifier LM and 50 training prompts of 4 pieces: each
    line of the distilled data is its prompt and the verifier's greedy continuation (fairseq's
    generator, as the task continues the prompts in this process), binarized with the
    verifier's dictionary; valid is the data's own (--valid-prompts 0)."""
    from fairseq.data import Dictionary, data_utils

    dest = tmp_path / "distill"
    run(["bash", REPO / "data-prep" / "distill-lm.sh", lm_data / "bin", lm, "--prompt-tokens", "4",
         "--max-prompts", "50", "--valid-prompts", "0", "--continuation-tokens", "12", "--dest", dest])
    prompt_lines = (dest / "prompts" / "train.txt").read_text().splitlines()
    lines = (dest / "tok" / "train.txt").read_text().splitlines()
    assert len(prompt_lines) == len(lines) == 50
    assert all(len(p.split()) == 4 and (line == p or line.startswith(p + " ")) for p, line in zip(prompt_lines, lines))
    assert sum(len(line.split()) > 4 for line in lines) > 40  # continued, mostly

    assert (dest / "dict.txt").read_bytes() == (lm_data / "bin" / "dict.txt").read_bytes()
    dictionary = Dictionary.load(str(dest / "dict.txt"))
    binarized = data_utils.load_indexed_dataset(str(dest / "train"), dictionary)
    assert [dictionary.string(binarized[i]) for i in range(len(binarized))] == lines
    assert (dest / "valid.bin").read_bytes() == (lm_data / "bin" / "valid.bin").read_bytes()

    task, models, generator = lm_task(lm_data, lm, "--max-len-b", 4 + 12)
    tokens = [dictionary.encode_line(p, add_if_not_exist=False).long() for p in prompt_lines]
    expected = [dictionary.string(t) for t, _ in continuations(task, models, generator, tokens, 50)]
    assert lines == expected
