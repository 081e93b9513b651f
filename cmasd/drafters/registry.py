"""``--drafter-kind``: the model drafters by name; the reports of the drafters' own metrics."""

from typing import Dict, Tuple

from cmasd.core.metrics import MetricReport
from cmasd.drafters.autoregressive import AutoregressiveDrafter
from cmasd.drafters.blockwise import BlockwiseDrafter
from cmasd.drafters.early_exit import EarlyExitDrafter, ExitDepths
from cmasd.drafters.ngram import HistoryNgram, LookupRates, SourceNgram
from cmasd.drafters.spec_drafter import SpecDrafter

# --drafter-kind: name -> drafter class; each declares the fairseq model class it drafts
# with (``model_class``), its ``horizon_limit(model)`` and ``from_model(...)``. The
# Spec-Drafter model is no Transformer, so inferring a kind from a model is unambiguous.
DRAFTER_KINDS: Dict[str, type] = {
    SpecDrafter.name: SpecDrafter,
    AutoregressiveDrafter.name: AutoregressiveDrafter,
    EarlyExitDrafter.name: EarlyExitDrafter,
    BlockwiseDrafter.name: BlockwiseDrafter,
}

# What the statistics make of the drafters' ``Draft.metrics``, in the order of their log
# line: the lookups' rates, SpecBound's exit layers.
METRIC_REPORTS: Tuple[MetricReport, ...] = (LookupRates([HistoryNgram.name, SourceNgram.name]), ExitDepths())
