"""Drafting from a row's own history (cmasd.drafters.ngram.HistoryNgram,
--spec-history-ngram): hand-made rows, the continuation of the latest earlier occurrence
of the suffix, continued periodically."""

from types import SimpleNamespace

import pytest
import torch

from cmasd.drafters.base import STATELESS, DraftRequest
from cmasd.drafters.ngram import HistoryNgram


def repeated_continuation(tokens, lengths, n, width):
    """The history drafter's tokens (B, width) and whether each row was served (B,)."""
    draft, _ = HistoryNgram(n).draft(STATELESS, tokens, lengths, DraftRequest(width))
    return SimpleNamespace(tokens=draft.tokens, found=draft.valid > 0)

BOS, PAD, A, B, C, D = 2, 1, 10, 11, 12, 13


def rows(*sequences):
    """Right-padded rows (BOS first) and their lengths."""
    width = max(len(s) for s in sequences) + 2
    tokens = torch.full((len(sequences), width), PAD)
    for i, s in enumerate(sequences):
        tokens[i, : len(s)] = torch.tensor(s)
    return tokens, torch.tensor([len(s) for s in sequences])


def test_a_loop_is_continued_periodically():
    tokens, lengths = rows([BOS, A, B, C, A, B, C, A, B])
    got = repeated_continuation(tokens, lengths, n=3, width=7)
    assert got.found.tolist() == [True]
    assert got.tokens.tolist() == [[C, A, B, C, A, B, C]]


def test_the_latest_occurrence_is_followed():
    # "A B" occurs at 1 (followed by C) and at 4 (followed by D); the suffix is the last "A B"
    tokens, lengths = rows([BOS, A, B, C, A, B, D, A, B])
    got = repeated_continuation(tokens, lengths, n=2, width=3)
    assert got.found.tolist() == [True]
    assert got.tokens.tolist() == [[D, A, B]]


def test_rows_without_a_repeat_or_too_short_find_nothing():
    tokens, lengths = rows([BOS, A, B, C, D], [BOS, A], [BOS, A, A], [BOS, C, D, C, D])
    got = repeated_continuation(tokens, lengths, n=2, width=2)
    # row 3: "A A" needs an earlier "A A"; row 4: "C D" occurred at 1
    assert got.found.tolist() == [False, False, False, True]
    assert got.tokens[3].tolist() == [C, D]


def test_padding_and_bos_never_match():
    # the suffix of a two-token row reaches BOS; padding after the row is never a match
    tokens, lengths = rows([BOS, A], [BOS, PAD, A, B])
    got = repeated_continuation(tokens, lengths, n=2, width=2)
    assert got.found.tolist() == [False, False]


def test_unigram_history():
    tokens, lengths = rows([BOS, A, B, A])
    got = repeated_continuation(tokens, lengths, n=1, width=4)
    assert got.found.tolist() == [True] and got.tokens.tolist() == [[B, A, B, A]]


def test_n_must_be_positive():
    with pytest.raises(ValueError, match="--spec-history-ngram"):
        HistoryNgram(0)


def test_an_occurrence_just_before_the_suffix_repeats_with_period_one():
    # "A A" ends the row and occurred one position earlier: the row repeats A
    tokens, lengths = rows([BOS, C, A, A, A])
    got = repeated_continuation(tokens, lengths, n=2, width=3)
    assert got.found.tolist() == [True] and got.tokens.tolist() == [[A, A, A]]
