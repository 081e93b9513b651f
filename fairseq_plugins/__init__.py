"""fairseq user-dir of cmasd: ``--user-dir fairseq_plugins`` registers the
``translation_speculative`` task, the ``spec_drafter`` models and the
``spec_drafter_loss`` criterion. The algorithms live in the ``cmasd`` package."""

from cmasd.checkpoint import allow_fairseq_checkpoints

allow_fairseq_checkpoints()

from . import criterions, models, tasks  # noqa: E402,F401
