"""Sampling's distribution, draws and per-sentence randomness live on the ground floor
(``cmasd.core.sampling``: the records of the contracts carry them); imported here too, where
the rules, the loop and outside code have always found them."""

from cmasd.core.sampling import (  # noqa: F401  (at their old address)
    ACCEPT,
    DRAFT,
    MASK32,
    RESAMPLE,
    STREAMS,
    RowRandom,
    Sampling,
    cell_keys,
    draw,
    draw_weights,
    hash32,
    mul32,
)
