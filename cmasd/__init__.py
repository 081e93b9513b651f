"""cmasd: confidence-modulated adaptive speculative decoding for fairseq models."""

__version__ = "0.1.0"
