"""Registers the criteria: ``spec_drafter_loss`` (``cmasd.training.criterion``),
``exit_heads_loss`` (``cmasd.training.exit_heads_loss``) and ``blockwise_heads_loss``
(``cmasd.training.blockwise_heads_loss``)."""

from fairseq.criterions import register_criterion

from cmasd.training.criterion import SpecDrafterLoss, SpecDrafterLossConfig
from cmasd.training.blockwise_heads_loss import BlockwiseHeadsLoss, BlockwiseHeadsLossConfig
from cmasd.training.exit_heads_loss import ExitHeadsLoss, ExitHeadsLossConfig

register_criterion("spec_drafter_loss", dataclass=SpecDrafterLossConfig)(SpecDrafterLoss)
register_criterion("exit_heads_loss", dataclass=ExitHeadsLossConfig)(ExitHeadsLoss)
register_criterion("blockwise_heads_loss", dataclass=BlockwiseHeadsLossConfig)(BlockwiseHeadsLoss)
