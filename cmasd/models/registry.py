"""The models cmasd trains, by the names ``fairseq_plugins/models.py`` registers them under
with fairseq, and how to build one from its checkpoint's config without that registration
(``cmasd.from_pretrained`` loads drafters without importing the plugins)."""

from typing import Dict, Tuple

from fairseq.dataclass.utils import merge_with_parent

from cmasd.models.ar_drafter import ARDrafterConfig, ARDrafterModel
from cmasd.models.blockwise_heads import BlockwiseHeadsConfig, BlockwiseHeadsModel
from cmasd.models.exit_heads import ExitHeadsConfig, ExitHeadsModel
from cmasd.models.spec_drafter import SpecDrafterConfig, SpecDrafterModel

# registered name -> (model class, its config dataclass)
MODELS: Dict[str, Tuple[type, type]] = {
    "spec_drafter": (SpecDrafterModel, SpecDrafterConfig),
    "ar_drafter": (ARDrafterModel, ARDrafterConfig),
    "exit_heads": (ExitHeadsModel, ExitHeadsConfig),
    "blockwise_heads": (BlockwiseHeadsModel, BlockwiseHeadsConfig),
}
# architecture name (a checkpoint's ``_name`` when trained with ``--arch NAME``) -> model
# name; each sets nothing: the dataclass defaults apply (2 decoder layers and a 25-slot block
# for the Spec-Drafter, the verifier's frozen encoder and 1 decoder layer for the draft model),
# and the widths follow the verifier
ARCHITECTURES: Dict[str, str] = {
    "spec_drafter_base": "spec_drafter",
    "spec_drafter_compact": "spec_drafter",  # an older name of spec_drafter_base: old commands and checkpoints
    "ar_drafter_1l": "ar_drafter",
}


def build_model(cfg, task):
    """The model of a checkpoint's model config ``cfg`` for ``task``: one of ``MODELS`` as
    fairseq builds a registered dataclass model (the dataclass's defaults under ``cfg``),
    one of ``ARCHITECTURES`` as fairseq builds an architecture of one, any other through
    fairseq's registry (``task.build_model``)."""
    name = cfg.get("_name") or cfg.get("arch")
    if name in ARCHITECTURES:  # fairseq applies the architecture's function, which sets nothing
        return MODELS[ARCHITECTURES[name]][0].build_model(cfg, task)
    if name not in MODELS:
        return task.build_model(cfg, from_checkpoint=True)
    model, config = MODELS[name]
    return model.build_model(merge_with_parent(config(), cfg, True), task)
