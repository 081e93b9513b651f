"""Drafters: everything that proposes tokens to the verifier, behind one contract
(``cmasd.drafters.base``).

Model drafters, loaded from ``--drafter-path`` and chosen by ``--drafter-kind`` (or by
the checkpoint's model class):

* ``spec``: the Spec-Drafter, non-autoregressive (``spec_drafter.SpecDrafter``);
* ``autoregressive``: any fairseq Transformer with the verifier's dictionary
  (``autoregressive.AutoregressiveDrafter``).

Lookups, in front of the model drafter or alone (``ngram``): ``history``
(``--spec-history-ngram``) and ``source`` (``--spec-source-ngram``).
"""

from typing import Dict

from cmasd.drafters.autoregressive import AutoregressiveDrafter
from cmasd.drafters.spec_drafter import SpecDrafter

# --drafter-kind: name -> drafter class; each declares the fairseq model class it drafts
# with (``model_class``), its ``horizon_limit(model)`` and ``from_model(...)``. The
# Spec-Drafter model is no Transformer, so inferring a kind from a model is unambiguous.
DRAFTER_KINDS: Dict[str, type] = {
    SpecDrafter.name: SpecDrafter,
    AutoregressiveDrafter.name: AutoregressiveDrafter,
}
