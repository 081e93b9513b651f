"""Detokenizing and scoring the output: sacreBLEU or ROUGE against the raw references."""

import os
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List

import torch

from cmasd.tools.bench.configs import BenchError

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

    def quality(self, hyps: List[str], refs: List[str]) -> Dict[str, float]:
        """bleu: sacreBLEU (13a); rouge: ROUGE-1/2/L F1 x 100, stemmed."""
        if self.metric == "bleu":
            return {"bleu": bleu(hyps, refs)}
        return rouge(hyps, refs)


def bleu(hyps: List[str], refs: List[str]) -> float:
    import sacrebleu

    return float(sacrebleu.corpus_bleu(hyps, [refs]).score)


def rouge(hyps: List[str], refs: List[str]) -> Dict[str, float]:
    from rouge_score import rouge_scorer

    keys = ["rouge1", "rouge2", "rougeL"]
    scorer = rouge_scorer.RougeScorer(keys, use_stemmer=True)
    scores = [scorer.score(ref, hyp) for hyp, ref in zip(hyps, refs)]
    return {k: 100.0 * statistics.fmean(s[k].fmeasure for s in scores) for k in keys}


def quality_columns(metric: str) -> List[str]:
    return ["bleu"] if metric == "bleu" else ["rouge1", "rouge2", "rougeL"]


def load_spm(args):
    """The sentencepiece model of ``--spm-model`` or DATA/spm.model, else None."""
    path = args.spm_model or os.path.join(args.data, "spm.model")
    if not os.path.isfile(path):
        return None, None
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=path), path


def references_path(args, target_lang: str) -> str:
    """``--references``, else DATA/raw/SUBSET.TGT as the data-prep scripts write it."""
    path = args.references or os.path.join(args.data, "raw", f"{args.gen_subset}.{target_lang}")
    if not os.path.isfile(path):
        raise BenchError(f"references not found: {path} (give the raw references with --references)")
    return path


def read_references(path: str, split_size: int) -> List[str]:
    """One raw reference per sentence of the whole split."""
    with open(path, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    if len(refs) != split_size:
        raise BenchError(f"references {path} have {len(refs)} lines but the split has {split_size} sentences")
    return refs
