"""Drafters: everything that proposes tokens to the verifier, behind one contract
(``cmasd.drafters.base``).

Model drafters, loaded from ``--drafter-path`` and chosen by ``--drafter-kind`` (``registry``; or by
the checkpoint's model class):

* ``spec``: the Spec-Drafter, non-autoregressive (``spec_drafter.SpecDrafter``);
* ``autoregressive``: any fairseq Transformer with the verifier's dictionary
  (``autoregressive.AutoregressiveDrafter``);
* ``specbound``: early exits from the verifier's own decoder layers, with trained exit
  heads or without (``early_exit.EarlyExitDrafter``; self-speculative);
* ``blockwise``: k - 1 extra heads on the verifier's last decoder state
  (``blockwise.BlockwiseDrafter``; blockwise parallel decoding, self-speculative).

Lookups, in front of the model drafter or alone (``ngram``): ``history``
(``--spec-history-ngram``) and ``source`` (``--spec-source-ngram``).
"""
