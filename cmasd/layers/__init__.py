"""The Transformer layer, once, and its decoding backends.

* the ground floor under the models and the loop: what a Transformer layer computes
  (``cmasd.layers.transformer``), on whichever linear layers a caller gives it;
* above it, beside the models (``cmasd.core.FLOORS``): the layer prepared for decoding on
  linear-layer kernels (``kernels``: native, packed, gemv, int8; ``extension`` and ``csrc/``:
  the C++ gemv kernel and fused decoder layers), the prepared decoder and encoder
  (``prepared``), and the verifier's block scorer and key/value cache (``cache``).

Imports nothing from ``cmasd.models``, ``cmasd.decoding``, ``cmasd.drafters`` or
``cmasd.verification``."""
