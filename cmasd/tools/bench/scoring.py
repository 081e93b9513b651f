"""Detokenizing and scoring the output: sacreBLEU or ROUGE against the raw references.

References are read per line of the split as a list of one or more (``References``): a
plain file holds one per line, a ``.jsonl`` file one JSON list per line. ROUGE
(``cmasd.tools.rouge``, shared with ``cmasd-rouge``) keeps each line's best F1 per
measure over its references; BLEU is sacreBLEU's multi-reference corpus BLEU, the lists
padded with ``None`` to the longest, as sacreBLEU takes a varying number of references.
"""

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from cmasd.tools.bench.configs import BenchError
from cmasd.tools.rouge import ROUGE_KEYS, References, ScoringError, read_reference_file, rouge

# --------------------------------------------------------------------------- scoring


@dataclass
class TextTools:
    """Turns token ids into detokenized text and scores it."""

    tgt_dict: Any
    spm: Any  # sentencepiece.SentencePieceProcessor or None
    metric: str

    def detokenize(self, tokens: List[int]) -> str:
        """The hypothesis as text: sentencepiece decoding of its pieces, or fairseq's
        ``--post-process sentencepiece`` rule without a model (eos stripped)."""
        pieces = self.tgt_dict.string(torch.tensor(tokens, dtype=torch.long))
        if self.spm is not None:
            return self.spm.decode(pieces.split())
        from fairseq.data.data_utils import post_process

        return post_process(pieces, "sentencepiece")

    def quality(self, hyps: List[str], refs: References) -> Dict[str, float]:
        """bleu: sacreBLEU (13a); rouge: ROUGE-1/2/L/Lsum F1 x 100, stemmed (``rouge``)."""
        if self.metric == "bleu":
            return {"bleu": bleu(hyps, refs)}
        return rouge(hyps, refs)


def bleu(hyps: Sequence[str], refs: References) -> float:
    """sacreBLEU (13a) with every reference of each line; lines with fewer references
    are padded with ``None``, and a reference's line breaks are spaces."""
    import sacrebleu

    streams = [[r[j].replace("\n", " ") if j < len(r) else None for r in refs]
               for j in range(max(map(len, refs), default=1))]
    return float(sacrebleu.corpus_bleu(list(hyps), streams).score)


def quality_columns(metric: Optional[str]) -> List[str]:
    """The quality columns of ``metric``; none for None (a language model's continuations,
    compared with fairseq greedy's only)."""
    if metric is None:
        return []
    return ["bleu"] if metric == "bleu" else list(ROUGE_KEYS)


def load_spm(args):
    """The sentencepiece model of ``--spm-model`` or DATA/spm.model, else None."""
    path = args.spm_model or os.path.join(args.data, "spm.model")
    if not os.path.isfile(path):
        return None, None
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=path), path


def references_path(args, target_lang: str) -> str:
    """``--references``; else, with ``--metric rouge``, DATA/raw/SUBSET.refs.jsonl where it
    exists (every reference, as ``cmasd-prep cnndm-split`` writes them); else
    DATA/raw/SUBSET.TGT as the data-prep scripts write it."""
    raw = os.path.join(args.data, "raw", args.gen_subset)
    path = args.references
    if path is None and args.metric == "rouge" and os.path.isfile(raw + ".refs.jsonl"):
        path = raw + ".refs.jsonl"
    path = path or f"{raw}.{target_lang}"
    if not os.path.isfile(path):
        raise BenchError(f"references not found: {path} (give the raw references with --references)")
    return path


def read_references(path: str, split_size: int) -> References:
    """The references of every sentence of the whole split (``read_reference_file``)."""
    try:
        refs = read_reference_file(path)
    except ScoringError as e:
        raise BenchError(str(e)) from None
    if len(refs) != split_size:
        raise BenchError(f"references {path} have {len(refs)} lines but the split has {split_size} sentences")
    return refs
