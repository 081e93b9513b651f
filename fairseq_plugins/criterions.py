"""Registers the ``spec_drafter_loss`` criterion (``cmasd.training.criterion``)."""

from fairseq.criterions import register_criterion

from cmasd.training.criterion import SpecDrafterLoss, SpecDrafterLossConfig

register_criterion("spec_drafter_loss", dataclass=SpecDrafterLossConfig)(SpecDrafterLoss)
