"""cmasd: confidence-modulated adaptive speculative decoding for fairseq models.

``from cmasd import from_pretrained``: a verifier (and a drafter) behind fairseq's hub
interface (``cmasd.hub``)."""

__version__ = "0.1.0"


def from_pretrained(model_name_or_path, *args, **kwargs):
    """``cmasd.hub.from_pretrained`` (imported on first use: ``import cmasd`` stays light)."""
    from cmasd.hub import from_pretrained as load

    return load(model_name_or_path, *args, **kwargs)
