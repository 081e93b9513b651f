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
"""

import functools
import logging

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
