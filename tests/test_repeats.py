"""``--no-repeat-ngram-size`` inside a verified block: every position bans what fairseq's
rule bans after that position's own prefix (accepted tokens and the drafts before it)."""

import math

import pytest
import torch
from fairseq.ngram_repeat_block import NGramRepeatBlock

from cmasd.compat import PrefixNGramRepeatBlock, blocks_repeats
from cmasd.decoding.repeats import ban_repeated_ngrams

PAD, EOS = 1, 2


def fairseq_bans(prefix, size, vocab):
    """The tokens fairseq's rule bans after ``prefix`` (eos first), given only the prefix."""
    blocker = PrefixNGramRepeatBlock(size, use_extension=False)
    tokens = torch.tensor([prefix + [PAD] * 4])
    banned = blocker(tokens, torch.zeros(1, vocab), 1, 1, len(prefix) - 1)
    return set(torch.isinf(banned[0]).nonzero().flatten().tolist())


@pytest.mark.parametrize("size", [2, 3, 4])
def test_each_position_bans_what_fairseq_bans_after_its_prefix(size):
    gen = torch.Generator().manual_seed(size)
    vocab, bsz, width = 8, 6, 7
    lengths = torch.randint(1, 12, (bsz,), generator=gen)  # eos included
    capacity = int(lengths.max()) + width + 3
    tokens = torch.full((bsz, capacity), PAD)
    for row, length in enumerate(lengths.tolist()):
        tokens[row, 0] = EOS
        tokens[row, 1:length] = torch.randint(3, vocab, (length - 1,), generator=gen)  # few symbols: many repeats
    drafts = torch.randint(3, vocab, (bsz, width), generator=gen)
    drafts[0, 5:] = PAD  # a row that sent 5 drafts
    lprobs = ban_repeated_ngrams(torch.zeros(bsz, width + 1, vocab), tokens, lengths, drafts, size)

    for row, length in enumerate(lengths.tolist()):
        for j in range(width + 1):
            if row == 0 and j > 5:
                continue  # past the row's k: never read
            prefix = tokens[row, :length].tolist() + drafts[row, :j].tolist()
            ours = set(torch.isinf(lprobs[row, j]).nonzero().flatten().tolist())
            expected = fairseq_bans(prefix, size, vocab)
            assert ours == expected, (row, j, prefix)


def test_a_draft_completing_an_ngram_begun_by_earlier_drafts_is_banned_at_its_position():
    # accepted: eos 5 6; drafts 7 5 6 7: the 3-gram (5, 6, 7) is complete after the first draft,
    # so after "eos 5 6 7 5 6" token 7 is banned (block position 3), and after "eos 5 6 7 5 6 7"
    # token 5 (the 3-gram (6, 7, 5) of drafts 1-2)
    tokens = torch.tensor([[EOS, 5, 6, PAD, PAD, PAD, PAD, PAD, PAD]])
    drafts = torch.tensor([[7, 5, 6, 7]])
    lprobs = ban_repeated_ngrams(torch.zeros(1, 5, 9), tokens, torch.tensor([3]), drafts, 3)
    banned = [torch.isinf(lprobs[0, j]).nonzero().flatten().tolist() for j in range(5)]
    assert banned == [[], [], [], [7], [5]]


def test_fairseq_012s_own_blocker_bans_nothing_and_the_fixed_one_does():
    # SequenceGenerator hands the blocker its whole buffer; fairseq 0.12 reads the (n-1)-gram
    # from the buffer's end (padding): facebookresearch/fairseq#5206
    stock = NGramRepeatBlock(3, use_extension=False)
    if blocks_repeats(stock):
        pytest.skip("this fairseq's blocker works on the whole buffer")
    assert blocks_repeats(PrefixNGramRepeatBlock(3, use_extension=False))
    lprobs = torch.zeros(1, 9)
    assert not math.isinf(stock(torch.tensor([[EOS, 5, 6, 7, 5, 6, PAD, PAD]]), lprobs, 1, 1, 5)[0, 7])
