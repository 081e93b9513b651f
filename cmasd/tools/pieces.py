"""Sentencepiece's conventions that more than one tool reads (``cmasd-prep`` writes pieces
with them, ``cmasd-trace`` reads them back)."""

WORD_START = "\u2581"  # sentencepiece's word-start mark: the first piece of a word begins with it
