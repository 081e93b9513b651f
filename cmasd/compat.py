"""Stock fairseq 0.12.2 against the torch releases cmasd runs on.

fairseq 0.12.2 (the release for Python 3.10; ve-fairseq 0.12.3, for Python >= 3.11, does
not have this code) runs its Transformer encoder layers at inference through torch's
BetterTransformer kernel ``torch._transformer_encoder_layer_fwd``. From torch 1.13 on,
that call fails on any batch with padding ("Mask Type should be defined",
facebookresearch/fairseq#4858), and under bfloat16 autocast it mixes dtypes:
``fairseq-generate`` itself cannot translate. ``disable_encoder_fast_path`` makes every
encoder layer built afterwards take its ordinary path, the one training uses (the same
arithmetic). ``fairseq_plugins`` calls it, so ``--user-dir fairseq_plugins`` and
``cmasd-bench`` get it; plain fairseq without the user-dir is left as it is.

fairseq 0.12's ``--no-repeat-ngram-size`` bans nothing when its blocker runs in Python
(every CPU run; GPU runs without fairseq's CUDA extension): ``SequenceGenerator`` hands it
the whole tokens buffer and it reads the last n - 1 entries, padding
(facebookresearch/fairseq#5206). ``fix_ngram_blocker`` gives fairseq's generator the
documented rule, which the speculative generator applies too; the ``translation_speculative``
task uses it for fairseq's own generator, so that ``--beam 1`` and speculative decoding
with ``--no-repeat-ngram-size`` agree.

fairseq 0.12's ``TokenBlockDataset`` reads ``numpy.compat.long`` with one line a block
(``--sample-break-mode eos``, and every language model's inference dataset, which
``fairseq-interactive`` and ``LanguageModelingTask.inference_step`` decode), and numpy 2
removed ``numpy.compat``: ``restore_numpy_compat_long`` gives it back that one name
(numpy 1's: Python's ``int``); ``fairseq_plugins`` calls it.
"""

import functools
import logging
import types

import torch
from fairseq.ngram_repeat_block import NGramRepeatBlock

logger = logging.getLogger(__name__)


def disable_encoder_fast_path() -> bool:
    """Turn fairseq 0.12.2's BetterTransformer encoder fast path off for layers built
    from now on. True when it patched, False where there is nothing to patch (ve-fairseq,
    other fairseq versions) or it already did."""
    from fairseq.modules.transformer_layer import TransformerEncoderLayerBase as layer

    # the fast path's layers copy their weights into fused parameters on load
    if "_load_from_state_dict" not in vars(layer) or getattr(layer, "_cmasd_fast_path_off", False):
        return False
    build = layer.__init__

    @functools.wraps(build)
    def __init__(self, *args, **kwargs):
        build(self, *args, **kwargs)
        self.can_use_fastpath = False

    layer.__init__ = __init__
    layer._cmasd_fast_path_off = True
    logger.info("fairseq's BetterTransformer encoder fast path is off (it fails on torch >= 1.13, fairseq#4858)")
    return True


def restore_numpy_compat_long() -> bool:
    """Give numpy >= 2 the ``numpy.compat.long`` fairseq 0.12 reads (numpy 1's: ``int``).
    True when it added it, False where numpy has ``numpy.compat`` (numpy 1)."""
    import numpy

    try:
        numpy.compat
    except AttributeError:
        numpy.compat = types.SimpleNamespace(long=int)
        return True
    return False


def blocks_repeats(blocker) -> bool:
    """Whether fairseq's n-gram blocker bans a repeated n-gram when it is handed the
    whole tokens buffer, as ``SequenceGenerator`` hands it (padding after ``step``)."""
    size = blocker.no_repeat_ngram_size
    pattern = list(range(4, 4 + size - 1))  # an (n-1)-gram, then the n-gram's last token, then it again
    prefix = [2] + pattern + [3] + pattern  # eos, the n-gram, its first n - 1 tokens again
    tokens = torch.tensor([prefix + [1] * (size + 2)])  # (1, buffer), padding after the prefix
    lprobs = torch.zeros(1, 4 + size)
    banned = blocker(tokens, lprobs, 1, 1, len(prefix) - 1)
    return bool(torch.isinf(banned[0, 3]))


class PrefixNGramRepeatBlock(NGramRepeatBlock):
    """fairseq's ``NGramRepeatBlock`` given only the tokens up to ``step``: fairseq 0.12's
    Python rule reads its (n-1)-gram from the end of the buffer it receives, which
    ``SequenceGenerator`` passes whole, padding included, so it never bans anything
    (facebookresearch/fairseq#5206, #4709)."""

    def forward(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
        return super().forward(tokens[:, : step + 1], lprobs, bsz, beam_size, step)


def fix_ngram_blocker(generator):
    """``generator`` (fairseq's ``SequenceGenerator``) with an n-gram blocker that
    blocks: fairseq's own where it works, ``PrefixNGramRepeatBlock`` where it is fairseq
    0.12's (which bans nothing on the CPU path). Returns ``generator``."""
    blocker = getattr(generator, "repeat_ngram_blocker", None)
    if blocker is None or blocker.use_extension or blocks_repeats(blocker):
        return generator
    generator.repeat_ngram_blocker = PrefixNGramRepeatBlock(blocker.no_repeat_ngram_size, use_extension=False)
    logger.info(
        "--no-repeat-ngram-size: fairseq's blocker bans nothing on this path (fairseq#5206); "
        "using the rule on the tokens up to each step instead"
    )
    return generator


def pin_beam_size(generator, model) -> None:
    """Give ``model`` the beam size of fairseq ``generator`` before it decodes. fairseq's
    BART makes its encoder-decoder attention "beamable" when a ``SequenceGenerator`` with a
    beam above 1 is built on it (``BARTModel.set_beam_size``: the attention reads one copy of
    the encoder output per sentence, whose reordering becomes a no-op), and nothing undoes it:
    a greedy generator built or run later on the same model (cmasd-bench's beam and greedy
    rows) decodes with the beam's attention, mixing the encoder keys of different sentences
    or failing on a batch that is not a multiple of the beam. Other fairseq models have no
    beamable attention and are left as they are."""
    if not hasattr(model, "set_beam_size"):
        return
    beam = getattr(generator, "beam_size", 1)
    model.set_beam_size(beam)  # fairseq's own: each layer's attention gets the beam
    if beam == 1:  # set_beam_size leaves the no-op reordering: the encoder's class's own again
        model.encoder.__dict__.pop("reorder_encoder_out", None)
