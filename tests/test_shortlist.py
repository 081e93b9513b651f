"""The model drafters' vocabulary shortlist (cmasd/drafters/shortlist.py, --spec-draft-shortlist):
which pieces it holds (the most frequent of the verifier's dictionary, eos always, pad, bos and
unk never); drafts confined to them, with the distribution they were drawn from (the softmax
over the shortlist, -inf elsewhere) and their confidence over the shortlist; speculative
sampling from a shortlisted drafter still follows the verifier (chi-square, at the rule); the
refusals; and lossless decoding: in process on tiny random models at batch 1, 7 and 16, and
through fairseq-generate with tiny models trained on Multi30k against fairseq's greedy output."""

import logging

import pytest
import torch
from helpers import (MAX_LEN, PROBE_SENTENCES, assert_same_hypotheses, chi_square, decodes_as_greedy, draft_model,
                     encoded_source, generate, hypotheses, last_line, sequences, threshold, tiny_drafter)

from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.drafters.autoregressive import AutoregressiveDrafter
from cmasd.drafters.base import DraftRequest, Source, choose
from cmasd.drafters.shortlist import MIN_SHORTLIST, Shortlist, read_counts, shortlist_of, warn_once
from cmasd.drafters.spec_drafter import SpecDrafter
from cmasd.errors import UsageError
from cmasd.options import SpeculativeDecodingConfig
from cmasd.tools.bench.configs import CONFIGS, spec_options
from cmasd.verification.acceptance import Exact
from cmasd.verification.base import Proposal
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification.controllers import Fixed
from cmasd.verification.rejection import SpeculativeSampling
from cmasd.verification.sampling import RowRandom, Sampling

HORIZON = 3


def counted_dictionary(counts):
    """A fairseq dictionary of words w0, w1, ... with the training counts ``counts``."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for i, count in enumerate(counts):
        dictionary.add_symbol(f"w{i}", n=count)
    return dictionary


# ------------------------------------------------------------------------ which pieces


def test_the_shortlist_holds_the_most_frequent_pieces_and_eos():
    counts = [5, 50, 7, 50, 1, 9, 30, 30, 2, 8, 40, 3, 6, 20, 4, 10, 11, 12, 1, 1]
    dictionary = counted_dictionary(counts)
    size = MIN_SHORTLIST
    shortlist = Shortlist.of(dictionary, size)
    words = [dictionary.index(f"w{i}") for i in range(len(counts))]
    # most frequent first, ties (50, 50 and 30, 30) in dictionary order
    ranked = sorted(words, key=lambda i: -dictionary.count[i])
    assert shortlist.ids.tolist() == sorted([dictionary.eos(), *ranked[: size - 1]])
    assert shortlist.vocab == len(dictionary)
    assert not {dictionary.pad(), dictionary.bos(), dictionary.unk()} & set(shortlist.ids.tolist())


def test_a_dictionary_without_counts_gives_its_first_pieces_and_says_so(caplog):
    """Every count equal (a dictionary written from a sentencepiece vocabulary, cmasd-prep's):
    the pieces in dictionary order, with a warning."""
    dictionary = counted_dictionary([100] * 30)
    words = [dictionary.index(f"w{i}") for i in range(30)]
    warn_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="cmasd.drafters.shortlist"):
        shortlist = Shortlist.of(dictionary, MIN_SHORTLIST)
    assert shortlist.ids.tolist() == sorted([dictionary.eos(), *words[: MIN_SHORTLIST - 1]])
    assert "every piece of the verifier's dictionary has the count 100" in caplog.text


def test_the_full_vocabulary_needs_no_shortlist():
    dictionary = counted_dictionary([1] * 30)
    vocab = len(dictionary)
    assert Shortlist.of(dictionary, 0) is None
    assert Shortlist.of(dictionary, vocab) is None
    assert Shortlist.of(dictionary, vocab - 3) is None  # every piece but pad, bos and unk
    assert len(Shortlist.of(dictionary, vocab - 4).ids) == vocab - 4


@pytest.mark.parametrize("size, message", [
    (-1, "--spec-draft-shortlist: must be >= 0 (0: the full vocabulary), got -1"),
    (25, "--spec-draft-shortlist 25: larger than the vocabulary (24 pieces)"),
    (MIN_SHORTLIST - 1, f"--spec-draft-shortlist {MIN_SHORTLIST - 1}: too few pieces to draft from"),
    (1, "--spec-draft-shortlist 1: too few pieces to draft from"),
])
def test_nonsense_sizes_are_refused(size, message):
    spec_model, verifier, dictionary = tiny_drafter()
    assert len(dictionary) == 24
    cfg = SpeculativeDecodingConfig(spec_draft_shortlist=size)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Shortlist.of(dictionary, size)
    with pytest.raises(UsageError, match="--spec-draft-shortlist"):
        AutoregressiveDrafter.from_model(draft_model(verifier, dictionary), verifier, cfg, "native", HORIZON)
    with pytest.raises(UsageError, match="--spec-draft-shortlist"):
        SpecDrafter.from_model(spec_model, verifier, cfg, "native", HORIZON)


# ------------------------------------------------------------------------ counts from a file


def write_split(prefix, dictionary, sentences):
    """A binarized split of ``sentences`` (lists of ids) as fairseq-preprocess writes one."""
    from fairseq.data import indexed_dataset

    builder = indexed_dataset.make_builder(f"{prefix}.bin", impl="mmap", vocab_size=len(dictionary))
    for ids in sentences:
        builder.add_item(torch.tensor(ids, dtype=torch.int32))
    builder.finalize(f"{prefix}.idx")


def test_piece_counts_counts_a_binarized_split_and_ranks_the_shortlist(tmp_path):
    """cmasd-prep piece-counts writes each piece's occurrences in the splits as a fairseq
    dictionary, most frequent first; read back, they rank the shortlist over the dictionary's
    own counts (all equal here, as a sentencepiece vocabulary's are)."""
    from collections import Counter

    from cmasd.tools.prep.cli import main as prep_main

    dictionary = counted_dictionary([100] * 30)
    dictionary.save(str(tmp_path / "dict.de.txt"))
    first = [[4 + (i * 7 + j * 3) % 30 for j in range(5)] + [dictionary.eos()] for i in range(40)]
    second = [[33, 33, 32, dictionary.eos()]] * 9
    write_split(tmp_path / "train.en-de.de", dictionary, first)
    write_split(tmp_path / "valid.en-de.de", dictionary, second)
    out = tmp_path / "counts.txt"
    assert prep_main(["piece-counts", "--dict", str(tmp_path / "dict.de.txt"), str(tmp_path / "train.en-de.de"),
                      str(tmp_path / "valid.en-de.de.idx"), "-o", str(out)]) == 0
    expected = Counter(i for ids in first + second for i in ids)
    lines = [line.split() for line in out.read_text().splitlines()]
    assert [symbol for symbol, _ in lines] == sorted((f"w{i}" for i in range(30)),
                                                     key=lambda w: (-expected[dictionary.index(w)], dictionary.index(w)))
    assert {symbol: int(n) for symbol, n in lines} == {f"w{i}": expected[dictionary.index(f"w{i}")] for i in range(30)}
    counts = read_counts(str(out), dictionary)
    shortlist = Shortlist.of(dictionary, MIN_SHORTLIST, counts)
    pieces = [i for i in range(len(dictionary)) if i >= dictionary.nspecial]
    ranked = sorted(pieces, key=lambda i: -counts[i])
    assert shortlist.ids.tolist() == sorted([dictionary.eos(), *ranked[: MIN_SHORTLIST - 1]])
    assert set(shortlist.ids.tolist()) >= {dictionary.index("w29"), dictionary.index("w28")}  # the second split's
    cfg = SpeculativeDecodingConfig(spec_draft_shortlist=MIN_SHORTLIST, spec_draft_shortlist_counts=str(out))
    assert torch.equal(shortlist_of(dictionary, cfg).ids, shortlist.ids)


@pytest.mark.parametrize("content, message", [
    (None, "--spec-draft-shortlist-counts {path}: No such file or directory"),
    ("w1 5\nw2 five\n", "--spec-draft-shortlist-counts {path}:2: not a 'piece count' line"),
    ("w1 5\nzz 3\nyy 1\n", "--spec-draft-shortlist-counts {path}: 2 pieces are not in the verifier's dictionary "
                           "('zz', 'yy'): counts of another vocabulary"),
])
def test_a_bad_counts_file_is_refused_in_one_line(tmp_path, content, message):
    dictionary = counted_dictionary([100] * 30)
    path = tmp_path / "counts.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError) as error:
        read_counts(str(path), dictionary)
    assert str(error.value) == message.format(path=path)


def test_counts_without_a_shortlist_change_nothing():
    """One --set serves a bench's every row: without a shortlist the file is not even read."""
    cfg = SpeculativeDecodingConfig(spec_draft_shortlist_counts="no-such-file.txt")
    assert shortlist_of(counted_dictionary([100] * 30), cfg) is None


def test_a_counts_file_overwrite_flag_and_absent_pieces(tmp_path):
    """fairseq's ``#fairseq:overwrite`` flag is read past; pieces the file omits count 0."""
    dictionary = counted_dictionary([100] * 30)
    path = tmp_path / "counts.txt"
    path.write_text("w3 7 #fairseq:overwrite\nw5 2\n")
    counts = read_counts(str(path), dictionary)
    assert counts[dictionary.index("w3")] == 7 and counts[dictionary.index("w5")] == 2
    assert sum(counts) == 9


def test_both_model_drafters_take_the_option():
    spec_model, verifier, dictionary = tiny_drafter()
    cfg = SpeculativeDecodingConfig(spec_draft_shortlist=MIN_SHORTLIST)
    ar = AutoregressiveDrafter.from_model(draft_model(verifier, dictionary), verifier, cfg, "native", HORIZON)
    spec = SpecDrafter.from_model(spec_model, verifier, cfg, "native", HORIZON)
    expected = Shortlist.of(dictionary, MIN_SHORTLIST).ids
    assert torch.equal(ar.shortlist.ids, expected) and torch.equal(spec.shortlist.ids, expected)
    plain = SpeculativeDecodingConfig()
    assert AutoregressiveDrafter.from_model(draft_model(verifier, dictionary), verifier, plain, "native",
                                            HORIZON).shortlist is None


def test_the_bench_rows_reach_the_options():
    assert spec_options(CONFIGS["ar-g4-exact-sl2000"], {}, {}).spec_draft_shortlist == 2000
    assert spec_options(CONFIGS["specdec-k5-exact-sl2000"], {}, {}).spec_draft_shortlist == 2000
    assert spec_options(CONFIGS["ar-g4-exact-int8"], {}, {}).spec_drafter_quantize == "int8"
    both = spec_options(CONFIGS["ar-g4-exact-int8-sl2000"], {}, {})
    assert (both.spec_drafter_quantize, both.spec_draft_shortlist) == ("int8", 2000)
    for name, plain in (("ar-g4-exact-sl2000", "ar-g4-exact"), ("ar-g4-exact-int8", "ar-g4-exact"),
                        ("ar-g4-exact-int8-sl2000", "ar-g4-exact"), ("ar-g4-exact-sl2000-bf16", "ar-g4-exact"),
                        ("specdec-k5-exact-sl2000-bf16", "specdec-k5-exact"), ("cmasd-k8-sl2000-bf16", "cmasd-k8"),
                        ("goodput-ar-sl2000-bf16", "goodput-ar")):
        mine, base = spec_options(CONFIGS[name], {}, {}), spec_options(CONFIGS[plain], {}, {})
        changed = {k for k in vars(mine) if getattr(mine, k) != getattr(base, k)}
        assert changed <= {"spec_draft_shortlist", "spec_drafter_quantize"}, name
        if name.endswith("-bf16"):
            assert (mine.spec_drafter_quantize, mine.spec_draft_shortlist) == ("bf16", 2000), name


# ------------------------------------------------------------------------ drafts


def drafters_of(kind, shortlist):
    """The full-vocabulary drafter of ``kind`` on tiny random models and the same drafter on
    ``shortlist``; the verifier and dictionary."""
    spec_model, verifier, dictionary = tiny_drafter()
    if kind == "spec":
        return (SpecDrafter(spec_model, "native"), SpecDrafter(spec_model, "native", None, shortlist), verifier,
                dictionary)
    model = draft_model(verifier, dictionary)
    return (AutoregressiveDrafter(model, "native", True), AutoregressiveDrafter(model, "native", True, shortlist),
            verifier, dictionary)


def batch(verifier, dictionary, bsz=4):
    gen = torch.Generator().manual_seed(11)
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, bsz)
    tokens = sequences(dictionary, gen, bsz, 24)
    return Source(src, src_lengths, encoder_out), tokens, torch.tensor([7, 5, 9, 2])[:bsz]


def drafted(drafter, source, tokens, lengths, request):
    with torch.no_grad():
        return drafter.draft(drafter.start(source, 24), tokens, lengths, request)[0]


def unfavoured(full, source, tokens, lengths, dictionary):
    """A shortlist (of MIN_SHORTLIST pieces, eos among them) without the tokens other than
    eos the full-vocabulary drafter drafts greedily (returned): the shortlisted drafter must
    draft others."""
    favoured = set(drafted(full, source, tokens, lengths, DraftRequest(HORIZON)).tokens.flatten().tolist())
    favoured -= {dictionary.eos()}
    assert favoured
    never = {dictionary.pad(), dictionary.bos(), dictionary.unk(), *favoured}
    ids = [i for i in range(len(dictionary)) if i not in never][:MIN_SHORTLIST]
    return Shortlist(torch.tensor(ids), len(dictionary)), favoured


def assert_distribution_over(logprobs, ids):
    """``logprobs`` (..., V): -inf outside ``ids``, normalised over them."""
    outside = torch.ones(logprobs.size(-1), dtype=torch.bool)
    outside[ids] = False
    assert torch.isneginf(logprobs[..., outside]).all()
    assert torch.isfinite(logprobs[..., ids]).any(-1).all()
    torch.testing.assert_close(logprobs[..., ids].exp().sum(-1), torch.ones(logprobs.shape[:-1]))


@pytest.mark.parametrize("kind", ["spec", "autoregressive"])
def test_greedy_drafts_are_the_shortlists_argmax(kind):
    full, _, verifier, dictionary = drafters_of(kind, None)
    source, tokens, lengths = batch(verifier, dictionary)
    shortlist, favoured = unfavoured(full, source, tokens, lengths, dictionary)
    _, short, _, _ = drafters_of(kind, shortlist)
    request = DraftRequest(HORIZON, ConfidenceSpec(), logprobs=True)
    draft = drafted(short, source, tokens, lengths, request)
    ids = shortlist.ids
    assert torch.isin(draft.tokens, ids).all() and not torch.isin(draft.tokens, torch.tensor(sorted(favoured))).any()
    assert draft.logprobs.shape == (len(lengths), HORIZON, len(dictionary))
    assert_distribution_over(draft.logprobs, ids)
    assert torch.equal(draft.logprobs.argmax(-1), draft.tokens)
    # the first position (the others follow different drafts in an autoregressive drafter):
    # the full drafter's distribution restricted to the shortlist and renormalised, and the
    # confidence of its logits over the shortlist
    reference = drafted(full, source, tokens, lengths, DraftRequest(HORIZON, logprobs=True)).logprobs[:, 0]  # (B, V)
    torch.testing.assert_close(draft.logprobs[:, 0, ids], torch.log_softmax(reference[:, ids], -1), rtol=0, atol=1e-5)
    torch.testing.assert_close(draft.confidence[:, 0], ConfidenceSpec()(reference[:, ids]), rtol=0, atol=1e-5)
    # the shortlist's own confidence, not the full vocabulary's
    assert not torch.allclose(draft.confidence[:, 0], ConfidenceSpec()(reference), rtol=0, atol=1e-3)
    plain = drafted(short, source, tokens, lengths, DraftRequest(HORIZON))
    assert plain.logprobs is None and torch.equal(plain.tokens, draft.tokens)


@pytest.mark.parametrize("kind", ["spec", "autoregressive"])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.7, topk=4), Sampling(topp=0.8)],
                         ids=["t1", "t0.7-topk4", "topp0.8"])
def test_sampled_drafts_come_from_the_shortlists_distribution(kind, sampling):
    full, _, verifier, dictionary = drafters_of(kind, None)
    source, tokens, lengths = batch(verifier, dictionary)
    shortlist, _ = unfavoured(full, source, tokens, lengths, dictionary)
    _, short, _, _ = drafters_of(kind, shortlist)
    for seed in range(5):
        random = RowRandom.of(seed, torch.arange(len(lengths)), torch.zeros(len(lengths), dtype=torch.long), HORIZON)
        draft = drafted(short, source, tokens, lengths, DraftRequest(HORIZON, logprobs=True, sampling=sampling,
                                                                     random=random))
        assert torch.isin(draft.tokens, shortlist.ids).all()
        assert_distribution_over(draft.logprobs, shortlist.ids)
        drawn = draft.logprobs.gather(-1, draft.tokens[..., None])  # (B, H, 1)
        assert torch.isfinite(drawn).all()  # each token from its own distribution
        if sampling.topk > 0:
            assert (torch.isfinite(draft.logprobs).sum(-1) <= sampling.topk).all()


def test_speculative_sampling_from_a_shortlist_follows_the_verifier():
    """A drafter on 4 of 10 pieces, the verifier spread over all of them: the tokens emitted
    at the first position (an accepted draft, or the verifier's correction) follow the
    verifier's distribution, the pieces outside the shortlist included."""
    vocab, pad, rows = 10, 0, 40_000
    gen = torch.Generator().manual_seed(3)
    shortlist = Shortlist(torch.tensor([2, 3, 5, 8]), vocab)
    drafter_logits = torch.randn(len(shortlist.ids), generator=gen).expand(rows, -1) * 2.0  # (N, 4)
    sampling = Sampling()
    verifier = sampling.tempered(torch.randn(vocab, generator=gen) * 1.5)
    verifier[pad] = float("-inf")
    verifier = torch.log_softmax(verifier, -1)  # (V,)
    random = RowRandom.of(9, torch.arange(rows), torch.zeros(rows, dtype=torch.long), 1)
    request = DraftRequest(1, logprobs=True, sampling=sampling, random=random)
    token, logprobs = choose(drafter_logits, request, pad, request.uniforms()[:, 0], shortlist)  # (N,), (N, V)
    assert torch.isin(token, shortlist.ids).all()
    proposal = Proposal(token[:, None], torch.ones(rows, dtype=torch.long), None, logprobs[:, None], random)
    verdict = SpeculativeSampling().accept(proposal, verifier.expand(rows, 2, vocab))
    emitted = torch.where(verdict.accepted >= 1, token, verdict.next_token)  # (N,)
    counts = torch.bincount(emitted, minlength=vocab)
    outside = torch.ones(vocab, dtype=torch.bool)
    outside[shortlist.ids] = False
    assert counts[outside].sum() > 0.1 * rows  # the verifier's own pieces came through
    stat, df = chi_square(counts, verifier.exp())
    assert stat < threshold(df), (stat, df)


# ------------------------------------------------------------------------ lossless


@pytest.mark.parametrize("kind", ["spec", "autoregressive"])
def test_shortlisted_drafters_decode_as_fairseq_greedy(kind):
    """Tiny random models whose verifier ends sentences at different times: a drafter on 16 of
    the 24 pieces, exact acceptance, batch sizes 1, 7 and 16."""
    spec_model, verifier, dictionary = tiny_drafter(seed=7)
    with torch.no_grad():
        verifier.decoder.output_projection.weight[dictionary.eos()] *= 4.0
    shortlist = Shortlist.of(dictionary, MIN_SHORTLIST)
    drafter = (SpecDrafter(spec_model, "native", None, shortlist) if kind == "spec"
               else AutoregressiveDrafter(draft_model(verifier, dictionary, seed=8), "native", True, shortlist))
    rules = LengthRules(max_len_b=MAX_LEN, max_positions=verifier.max_decoder_positions())
    decoder = SpeculativeGenerator(verifier, drafter, dictionary, Fixed(3, None), Exact(), ConfidenceSpec(), rules)
    outside = torch.ones(len(dictionary), dtype=torch.bool)
    outside[shortlist.ids] = False
    emitted_outside = 0
    for _, _, got, _ in decodes_as_greedy(decoder, verifier, dictionary):
        emitted_outside += sum(int(outside[hypos[0]["tokens"]].sum()) for hypos in got)
    assert emitted_outside > 0  # the verifier wrote pieces the drafter cannot draft


@pytest.mark.parametrize("batch_size", [1, 16])
def test_a_shortlisted_draft_model_is_lossless(probe_at, verifier, ar_drafter, greedy, batch_size):
    """The tiny draft model trained on Multi30k, drafting among 100 of its 1,000 pieces:
    fairseq's greedy output, token for token."""
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", ar_drafter,
                    "--drafter-kind", "autoregressive", "--spec-k", "4", "--spec-acceptance", "exact",
                    "--spec-draft-shortlist", "100")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)


def test_a_shortlisted_spec_drafter_is_lossless(probe, verifier, drafter, greedy):
    proc = generate(probe, verifier, "--batch-size", "16", "--drafter-path", drafter, "--spec-k", "4",
                    "--spec-acceptance", "exact", "--spec-draft-shortlist", "100")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy)


def test_fairseq_generate_refuses_a_shortlist_larger_than_the_vocabulary(probe, verifier, ar_drafter):
    proc = generate(probe, verifier, "--drafter-path", ar_drafter, "--spec-draft-shortlist", "100000", check=False)
    assert proc.returncode != 0
    assert "--spec-draft-shortlist 100000: larger than the vocabulary (" in last_line(proc)
    assert len(hypotheses(proc.stdout)) < PROBE_SENTENCES
