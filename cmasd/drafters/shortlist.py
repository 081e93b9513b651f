"""A vocabulary shortlist for the model drafters' output projection (``--spec-draft-shortlist N``).

At batch 1 a small draft model spends most of a step in its output projection over the whole
vocabulary (the compact model's 8,001 pieces at width 256: 8 MB of weights read per step). As
FR-Spec does for LLM drafters (Zhao et al., "FR-Spec: Accelerating Large-Vocabulary Language
Models via Frequency-Ranked Speculative Sampling", arXiv:2502.14856), the drafter here computes
logits for the N most frequent target pieces only and drafts among them. It stays lossless
because the verifier checks every draft against its full vocabulary: a token outside the
shortlist is never drafted, and the verifier supplies it where greedy decoding wants it.

* ``Shortlist``: the pieces, ranked by the counts of the verifier's fairseq target dictionary
  (``Dictionary.count``, fairseq-preprocess's training-data counts), or by those of a counts
  file (``--spec-draft-shortlist-counts``, a fairseq dictionary file such as ``cmasd-prep
  piece-counts`` writes from a binarized split), ties in dictionary order; eos always among
  them, pad, bos and unk never. A dictionary written from a sentencepiece vocabulary
  (``cmasd-prep spm-train``: every count 100) lists its pieces by their unigram score, so
  without a counts file the order there is the sentencepiece model's, a frequency estimate
  over the joint source and target training text (on Multi30k EN-DE, 2,000 such pieces cover
  93.7% of the verifier's German output, the 2,000 most frequent German ones 97.9%). The
  ids are kept in vocabulary order, so that the shortlist's argmax breaks ties as the full
  vocabulary's does.
* ``narrow``: a drafter's prepared decoder (``cmasd.layers.prepared.DecodingDecoder``) with
  its output projection onto the shortlisted rows only, a prepared linear of them on the
  decoder's own kernels (``cmasd.layers.kernels.prepared_linear``).

What a drafter on a shortlist returns (``cmasd.drafters.base.choose``): token ids of the
vocabulary (shortlist indices mapped back); where a part asks for the draft's
log-probabilities (B, H, V), the distribution the drafts were really drawn from, the softmax
over the shortlist, -inf outside it (rejection sampling reads it as q); and its confidence
scores (``cmasd.verification.confidence``) computed over the shortlist's logits: the
probability of its token is the shortlist softmax's, and the entropy score is normalised by
log N, not log V.
"""

import functools
import logging
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from cmasd.errors import UsageError
from cmasd.layers.kernels import prepared_linear
from cmasd.layers.prepared import DecodingDecoder

logger = logging.getLogger(__name__)

OPTION = "--spec-draft-shortlist"
COUNTS_OPTION = "--spec-draft-shortlist-counts"
# Fewer pieces than this cannot hold even a sentence's punctuation, articles and eos: a
# typing error rather than a setting.
MIN_SHORTLIST = 16


@dataclass(frozen=True, eq=False)
class Shortlist:
    """The ``ids`` (N,) of the vocabulary pieces a drafter drafts among (vocabulary order),
    out of a vocabulary of ``vocab`` pieces."""

    ids: Tensor  # (N,) ascending vocabulary ids
    vocab: int  # V

    @classmethod
    def of(cls, dictionary, size: int, counts: Optional[Sequence[int]] = None) -> Optional["Shortlist"]:
        """The ``size`` most frequent pieces of the fairseq ``dictionary`` by its own counts or
        by ``counts`` (one per id, ``read_counts``) (eos always, pad, bos and unk never), or None
        for the full vocabulary: ``size`` 0, or at least every piece but pad, bos and unk.
        Refuses a negative size, one larger than the vocabulary, and one below
        ``MIN_SHORTLIST``."""
        vocab = len(dictionary)
        if size < 0:
            raise UsageError(f"{OPTION}: must be >= 0 (0: the full vocabulary), got {size}")
        if size > vocab:
            raise UsageError(f"{OPTION} {size}: larger than the vocabulary ({vocab} pieces); use at most {vocab}, "
                             "or 0 for the full vocabulary")
        if 0 < size < MIN_SHORTLIST:
            raise UsageError(f"{OPTION} {size}: too few pieces to draft from; use at least {MIN_SHORTLIST} "
                             "(or 0 for the full vocabulary)")
        never = {dictionary.pad(), dictionary.bos(), dictionary.unk()}
        if size == 0 or size >= vocab - len(never):
            return None
        eos = dictionary.eos()
        pieces = [i for i in range(vocab) if i not in never and i != eos]
        if counts is not None and len(counts) != vocab:
            raise ValueError(f"Shortlist.of: {len(counts)} counts for a vocabulary of {vocab} pieces")
        counts = dictionary.count if counts is None else counts
        if len({counts[i] for i in pieces if counts[i] > 0}) == 1:
            warn_once(f"{OPTION}: every piece of the verifier's dictionary has the count {counts[pieces[0]]}, no "
                      "training counts (a dictionary written from a sentencepiece vocabulary): the shortlist follows "
                      f"the dictionary's order; the target side's counts would cover more of the output ({COUNTS_OPTION} "
                      "FILE, written by cmasd-prep piece-counts)")
        ranked = sorted(pieces, key=lambda i: -counts[i])  # most frequent first, ties in dictionary order (stable)
        ids = torch.tensor(sorted([eos, *ranked[: size - 1]]), dtype=torch.long)
        return cls(ids, vocab)

    def to(self, device: torch.device) -> "Shortlist":
        """The same shortlist with its ids on ``device`` (the drafter's)."""
        return Shortlist(self.ids.to(device), self.vocab)

    def tokens(self, index: Tensor) -> Tensor:
        """Vocabulary ids (...,) of shortlist indices ``index`` (...,)."""
        return self.ids.to(index.device)[index]

    def widen(self, values: Tensor) -> Tensor:
        """``values`` (..., N) over the shortlist as (..., V) over the vocabulary: -inf
        elsewhere (logits or log-probabilities of pieces never drafted)."""
        out = values.new_full(values.shape[:-1] + (self.vocab,), float("-inf"))  # (..., V)
        return out.index_copy_(-1, self.ids.to(values.device), values)


def read_counts(path: str, dictionary) -> List[int]:
    """Counts (V,) of the verifier's ``dictionary``'s pieces from the fairseq dictionary file
    ``path`` (``piece count [#fairseq:overwrite]`` lines: fairseq-preprocess's dict.TGT.txt of
    a corpus, or ``cmasd-prep piece-counts``); pieces it does not list count 0. Refuses a file
    that is missing, malformed, or lists a piece the dictionary lacks (counts of another
    vocabulary)."""
    counts = [0] * len(dictionary)
    foreign = []
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                fields = line.rstrip("\n").rsplit(" ", 2)
                if fields[-1] == "#fairseq:overwrite":
                    fields = fields[:-1]
                if len(fields) < 2 or not fields[-1].isdigit():
                    raise UsageError(f"{COUNTS_OPTION} {path}:{number}: not a 'piece count' line")
                symbol = " ".join(fields[:-1])
                index = dictionary.indices.get(symbol)
                if index is None:
                    foreign.append(symbol)
                else:
                    counts[index] = int(fields[-1])
    except OSError as e:
        raise UsageError(f"{COUNTS_OPTION} {path}: {e.strerror or e}") from None
    if foreign:
        shown = ", ".join(repr(s) for s in foreign[:5])
        raise UsageError(f"{COUNTS_OPTION} {path}: {len(foreign)} pieces are not in the verifier's dictionary "
                         f"({shown}{', ...' if len(foreign) > 5 else ''}): counts of another vocabulary")
    return counts


def shortlist_of(dictionary, cfg) -> Optional[Shortlist]:
    """The shortlist of a drafter's options (``--spec-draft-shortlist`` N, ranked by
    ``--spec-draft-shortlist-counts`` where given), or None. Counts without a shortlist
    change nothing (as fairseq's ``--sampling-topk`` without ``--sampling``), so that one
    setting serves every configuration of a bench."""
    counts = None
    if cfg.spec_draft_shortlist_counts and cfg.spec_draft_shortlist:
        counts = read_counts(cfg.spec_draft_shortlist_counts, dictionary)
    return Shortlist.of(dictionary, cfg.spec_draft_shortlist, counts)


@functools.lru_cache(maxsize=None)
def warn_once(message: str) -> None:
    logger.warning(message)


def narrow(decoder: DecodingDecoder, shortlist: Shortlist) -> DecodingDecoder:
    """``decoder`` with its output projection replaced by a prepared linear of the rows of
    ``shortlist`` only, on the decoder's kernels: its ``logits`` then give (..., N) over the
    shortlist, its layers unchanged. In place: the decoder must be the caller's own (a
    drafter's, built for it), and is returned."""
    projection = decoder.decoder.output_projection  # fairseq's nn.Linear (V, C)
    ids = shortlist.ids.to(projection.weight.device)
    bias = None if projection.bias is None else projection.bias.index_select(0, ids)  # (N,)
    decoder.output = prepared_linear(projection.weight.index_select(0, ids), bias, decoder.kernels)  # (N, C)
    return decoder
