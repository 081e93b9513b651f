"""The loop's generic hooks, in process on a tiny random verifier (CPU, seconds): a drafter's
own statistics travel as ``Draft.metrics`` through composition (a lookup in front of
SpecBound keeps its exit statistics), and a self-speculative drafter sees the verifier
through its state's ``observe`` hook, so a lookup in front of it changes nothing it drafts."""

import argparse
import types

import torch
from fairseq.data import Dictionary
from fairseq.models.transformer import TransformerModel, base_architecture

from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.drafters.compose import Fallback
from cmasd.drafters.early_exit import EarlyExitDrafter, VerifierHeads
from cmasd.drafters.ngram import HistoryNgram
from cmasd.verification.acceptance import Exact
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification.controllers import Fixed

MAX_LEN = 20
TIMES = {"draft_ms_per_iteration", "verify_ms_per_iteration", "bookkeeping_ms_per_iteration"}


def tiny_verifier(seed=5):
    """A 3-decoder-layer random Transformer over 20 words that ends sentences at ragged times."""
    torch.manual_seed(seed)
    dictionary = Dictionary()
    for i in range(20):
        dictionary.add_symbol(f"w{i}")
    args = argparse.Namespace(
        arch="transformer", encoder_layers=2, decoder_layers=3, encoder_embed_dim=16, decoder_embed_dim=16,
        encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32, encoder_attention_heads=2, decoder_attention_heads=2,
        share_all_embeddings=True, max_source_positions=64, max_target_positions=64, dropout=0.0,
    )
    base_architecture(args)
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    verifier = TransformerModel.build_model(args, task).eval()
    with torch.no_grad():
        verifier.decoder.output_projection.weight[dictionary.eos()] *= 4.0
    return verifier, dictionary


def sample_of(dictionary, bsz=6, length=7, seed=3):
    """A left-padded source batch of ragged lengths, eos last, as fairseq batches it."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(dictionary.nspecial, len(dictionary), (bsz, length), generator=gen)
    lengths = torch.tensor([2 + row % (length - 1) for row in range(bsz)])
    for row, n in enumerate(lengths.tolist()):
        src[row, : length - n] = dictionary.pad()
        src[row, -1] = dictionary.eos()
    return {"id": torch.arange(bsz), "net_input": {"src_tokens": src, "src_lengths": lengths}}


def decoded(drafter, verifier, dictionary, sample):
    """The hypotheses' tokens and the statistics' summary (times left out) of one batch."""
    rules = LengthRules(max_len_b=MAX_LEN, max_positions=verifier.max_decoder_positions())
    generator = SpeculativeGenerator(verifier, drafter, dictionary, Fixed(3, None), Exact(), ConfidenceSpec(), rules)
    hypotheses, stats = generator.decode(sample)
    summary = {key: value for key, value in stats.summary().items() if key not in TIMES}
    return [h[0]["tokens"].tolist() for h in hypotheses], summary


def specbound(verifier, dictionary):
    return EarlyExitDrafter(VerifierHeads(), len(verifier.decoder.layers), dictionary.pad(), alpha=1.0, tau=0.05,
                            d_max=2, w_max=4)


def test_a_lookup_that_serves_nothing_changes_no_output_and_no_statistic():
    """A history lookup that never matches (n longer than any row) in front of SpecBound:
    the same tokens and the same statistics as SpecBound alone, its exit layers included
    (the composition used to drop them)."""
    verifier, dictionary = tiny_verifier()
    sample = sample_of(dictionary)
    alone_tokens, alone = decoded(specbound(verifier, dictionary), verifier, dictionary, sample)
    assert alone["mean_exit_layer"] is not None and alone["mean_k"] > 0  # something to carry
    behind_tokens, behind = decoded(Fallback(HistoryNgram(MAX_LEN + 5), specbound(verifier, dictionary)),
                                    verifier, dictionary, sample)
    assert behind_tokens == alone_tokens
    assert behind == alone


def test_a_lookup_that_serves_some_rows_keeps_the_exit_statistics_of_the_others():
    verifier, dictionary = tiny_verifier()
    sample = sample_of(dictionary, bsz=8)
    alone_tokens, _ = decoded(specbound(verifier, dictionary), verifier, dictionary, sample)
    tokens, summary = decoded(Fallback(HistoryNgram(1), specbound(verifier, dictionary)), verifier, dictionary, sample)
    assert tokens == alone_tokens  # exact acceptance: lossless whoever drafted
    assert summary["history_draft_rate"] > 0
    assert summary["mean_exit_layer"] is not None and 1 <= summary["mean_exit_layer"] <= 2
    assert summary["layers_skipped"] == 1 - summary["mean_exit_layer"] / 3
