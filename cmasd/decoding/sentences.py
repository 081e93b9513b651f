"""A batch decoded one sentence at a time (``--spec-per-sentence``): the same arithmetic
for a sentence at any ``--batch-size``.

The uniforms of speculative sampling are a hash of (seed, sentence id, the row's
iteration, position) (``cmasd.verification.sampling.RowRandom``): they never depend on the
batch. The probabilities they are compared with do. A linear layer over 5 rows and over
20 rows, an attention over a source padded to 9 or to 30 positions, sum in different
orders (the kernels choose their blocking from the shapes), so the verifier's p(x) and the
drafter's q(x) of the same sentence differ in their last bits between batch sizes, and a
ratio within that of its uniform falls on the other side (measured: 1 sentence of
Multi30k's 1,000 test sentences at batch 4 against batch 1, a tiny verifier, EARS;
docs/results/sampling.md). Decoding every sentence as a batch of its own, its source
without padding, gives it the same tensors, shapes and kernels as at batch 1, so its
sample is the same at any batch size by construction, at the cost of batching.

fairseq's maximum length (``--max-len-a``) is then each sentence's own, as at batch 1.
"""

from typing import Any, Dict, Iterator, List, Sequence

from torch import Tensor

from cmasd.decoding.stats import DecodeStats

PER_SENTENCE_CHOICES = ("auto", "always", "never")


def per_sentence(choice: str, sampling: bool) -> bool:
    """``--spec-per-sentence``: ``auto`` is one sentence at a time when sampling (the
    sample must not depend on the batch) and batched when decoding greedily (the output
    then equals ``fairseq-generate --beam 1`` at the same batch size)."""
    if choice not in PER_SENTENCE_CHOICES:
        raise ValueError(f"--spec-per-sentence: unknown {choice!r}; choose from {', '.join(PER_SENTENCE_CHOICES)}")
    return sampling if choice == "auto" else choice == "always"


def sentences(sample: Dict[str, Any], pad: int) -> Iterator[Dict[str, Any]]:
    """Each sentence of fairseq's batch ``sample`` as a batch of one: its id and its
    source tokens without padding (left or right)."""
    src_tokens, src_lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]  # (B, S), (B,)
    ids = sample["id"] if "id" in sample else None
    for row in range(src_tokens.size(0)):
        tokens = unpadded(src_tokens[row], int(src_lengths[row]), pad)  # (n,)
        one = {"net_input": {"src_tokens": tokens[None], "src_lengths": src_lengths[row : row + 1]}}
        if ids is not None:
            one["id"] = ids[row : row + 1]
        yield one


def unpadded(tokens: Tensor, length: int, pad: int) -> Tensor:
    """The ``length`` tokens (n,) of a padded source row (S,)."""
    kept = tokens[tokens.ne(pad)]  # (n,)
    if kept.numel() != length:
        raise ValueError(f"a source row has {kept.numel()} tokens other than padding, its length says {length}")
    return kept


def joined(hypotheses: Sequence[List[List[Dict[str, Tensor]]]], stats: Sequence[DecodeStats]):
    """The hypotheses of the batch, in order, and its statistics, from those of its
    sentences."""
    total = DecodeStats()
    for part in stats:
        total.add(part)
    return [hypos for part in hypotheses for hypos in part], total
