"""``--drafter-kind``: the model drafters by name."""

from typing import Dict

from cmasd.drafters.autoregressive import AutoregressiveDrafter
from cmasd.drafters.blockwise import BlockwiseDrafter
from cmasd.drafters.early_exit import EarlyExitDrafter
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
