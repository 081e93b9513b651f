"""Registers cmasd's drafter models with fairseq, by the names ``cmasd.models.registry``
gives them: the Spec-Drafter, the autoregressive draft model, SpecBound's exit heads and
blockwise parallel decoding's heads, and their architectures."""

from fairseq.models import register_model, register_model_architecture

from cmasd.models.registry import ARCHITECTURES, MODELS

for name, (model, config) in MODELS.items():
    register_model(name, dataclass=config)(model)


def dataclass_defaults(cfg):
    """An architecture of cmasd's sets nothing: the model's dataclass defaults apply, and
    widths, heads and positions follow the verifier (``--verifier-path``)."""


for arch, name in ARCHITECTURES.items():
    register_model_architecture(name, arch)(dataclass_defaults)
