"""Registers the drafter models: the Spec-Drafter (``cmasd.models.spec_drafter``), the
autoregressive draft model (``cmasd.models.ar_drafter``), SpecBound's exit heads
(``cmasd.models.exit_heads``) and blockwise parallel decoding's heads
(``cmasd.models.blockwise_heads``), with their architectures."""

from fairseq.models import register_model, register_model_architecture

from cmasd.models.ar_drafter import ARDrafterConfig, ARDrafterModel
from cmasd.models.blockwise_heads import BlockwiseHeadsConfig, BlockwiseHeadsModel
from cmasd.models.exit_heads import ExitHeadsConfig, ExitHeadsModel
from cmasd.models.spec_drafter import SpecDrafterConfig, SpecDrafterModel

register_model("spec_drafter", dataclass=SpecDrafterConfig)(SpecDrafterModel)
register_model("ar_drafter", dataclass=ARDrafterConfig)(ARDrafterModel)
# --arch exit_heads (the model's own name): one head per intermediate decoder layer of the
# frozen verifier (--verifier-path), a layer norm (--exit-adapter: and a linear map) before
# the verifier's own output projection
register_model("exit_heads", dataclass=ExitHeadsConfig)(ExitHeadsModel)
# --arch blockwise_heads: blockwise parallel decoding's k - 1 heads (--blockwise-k) on the
# frozen verifier's last decoder state
register_model("blockwise_heads", dataclass=BlockwiseHeadsConfig)(BlockwiseHeadsModel)


@register_model_architecture("spec_drafter", "spec_drafter_base")
def spec_drafter_base(cfg):
    """The Spec-Drafter's one architecture, for any verifier (a base 512/2048 one as a
    compact 256/1024 one). Widths, heads and position embeddings always follow the verifier
    (``--verifier-path``); the dataclass defaults (2 decoder layers, block 25) apply unless
    given on the command line."""


# An older name of the same architecture (train-drafter.sh once chose it for verifiers of
# width <= 256): commands and checkpoints that name it still work.
register_model_architecture("spec_drafter", "spec_drafter_compact")(spec_drafter_base)


@register_model_architecture("ar_drafter", "ar_drafter_1l")
def ar_drafter_1l(cfg):
    """Autoregressive draft model with the verifier's frozen encoder and a 1-layer decoder
    at the verifier's width (the dataclass defaults); dimensions follow the verifier."""

