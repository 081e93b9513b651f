"""fairseq user-dir of cmasd: ``--user-dir fairseq_plugins`` registers the
``translation_speculative`` and ``language_modeling_speculative`` tasks; the ``spec_drafter``,
``ar_drafter``, ``exit_heads`` and ``blockwise_heads`` models; the ``spec_drafter_loss``,
``exit_heads_loss`` and ``blockwise_heads_loss`` criteria. The algorithms live in the ``cmasd`` package.

Importing it also lets fairseq load checkpoints on torch >= 2.6 (``cmasd.checkpoint``) and
makes an error in cmasd's options or inputs end the program with one line,
``PROG: error: MESSAGE``, instead of a traceback (``cmasd.errors``)."""

from cmasd.checkpoint import allow_fairseq_checkpoints
from cmasd.compat import disable_encoder_fast_path, restore_numpy_compat_long
from cmasd.errors import report_usage_errors

allow_fairseq_checkpoints()
disable_encoder_fast_path()  # stock fairseq 0.12.2 only
restore_numpy_compat_long()  # numpy >= 2: fairseq's language modelling datasets read numpy.compat.long
report_usage_errors()

from . import criterions, models, tasks  # noqa: E402,F401
