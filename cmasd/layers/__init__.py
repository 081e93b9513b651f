"""The ground floor under the models and the decoding loop: what a Transformer layer
computes (``cmasd.layers.transformer``), on whichever linear layers a caller gives it.
Imports nothing from ``cmasd.models``, ``cmasd.decoding``, ``cmasd.drafters`` or
``cmasd.verification``."""
