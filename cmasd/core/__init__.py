"""The ground floor: the records and written contracts every other part of cmasd meets.

* ``drafting``: what the loop asks of a drafter (``Drafter``, ``ModelDrafter``) and the
  records that pass between them (``Source``, ``DraftRequest``, ``Draft``, ``VerifierView``,
  ``LowerLayers``, ``DrafterState``);
* ``verifying``: the contracts of acceptance rules and draft-length controllers
  (``AcceptanceRule``, ``Controller``) and their records (``Needs``, ``Proposal``,
  ``Verdict``, ``RowState``);
* ``metrics``: how a drafter's own statistics (``Draft.metrics``) are reported
  (``MetricReport``);
* ``sampling``: fairseq's sampling transform (``Sampling``), draws from it (``draw``) and
  per-sentence randomness (``RowRandom``), which the records carry
  (``cmasd.verification.sampling`` re-exports them at their old address).

Nothing here imports the loop, the drafters or the rules: they import this. The floors
above it, and which may import which, are declared in ``FLOORS`` (``tests/test_layers.py``
holds the package to them).
"""

# The floors of the package, lowest first: a module may import from its own room (a module
# prefix) and from any floor below its own, never from above or from another room of its
# floor. The longest prefix that names a module places it. ``cmasd.tools`` are programs:
# they may also import ``fairseq_plugins`` (as ``fairseq-generate --user-dir`` does); the
# library never does.
FLOORS = (
    ("cmasd.errors",),
    ("cmasd.compat", "cmasd.checkpoint"),
    ("cmasd.core",),  # the contracts and their records; sampling and per-sentence randomness
    ("cmasd.layers",),  # the Transformer layer's arithmetic (cmasd.layers.transformer)
    # above it in the same folder, the layer's decoding backends: the prepared decoder and
    # encoder, their kernels, the C++ extension, the verifier's block scorer and cache, the
    # passes replayed from CUDA graphs; beside them the models fairseq-train trains
    (("cmasd.layers.kernels", "cmasd.layers.extension", "cmasd.layers.prepared", "cmasd.layers.cache",
      "cmasd.layers.graphs"), "cmasd.models"),
    ("cmasd.drafters", "cmasd.verification"),
    ("cmasd.decoding",),  # the loop: generator, statistics, fairseq's repeat ban
    ("cmasd.options",),
    ("cmasd.training",),
    ("cmasd.hub",),
    ("cmasd.tools",),
    ("cmasd",),
)
