"""Registers the criteria: ``spec_drafter_loss`` (``cmasd.training.criterion``) and
``exit_heads_loss`` (``cmasd.training.exit_heads_loss``)."""

from fairseq.criterions import register_criterion

from cmasd.training.criterion import SpecDrafterLoss, SpecDrafterLossConfig
from cmasd.training.exit_heads_loss import ExitHeadsLoss, ExitHeadsLossConfig

register_criterion("spec_drafter_loss", dataclass=SpecDrafterLossConfig)(SpecDrafterLoss)
register_criterion("exit_heads_loss", dataclass=ExitHeadsLossConfig)(ExitHeadsLoss)
