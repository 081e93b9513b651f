"""Named and ad-hoc configurations of cmasd-bench: what each row decodes with."""

import enum
import re
import typing
from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from cmasd.drafters.registry import DRAFTER_KINDS

FLOOR = "floor"
GREEDY = "greedy"
BEAM5 = "beam5"
BEAM4 = "beam4"
CT2_GREEDY = "ct2-greedy"
# each that runs gets its speed-up column, "speedup_vs_" + its name with "_" for "-"
SPEED_REFERENCES = (BEAM5, BEAM4, CT2_GREEDY)
CTRANSLATE2 = "ctranslate2"

# The drafter a speculative configuration drafts with (its ``drafter=``, the kind's
# ``bench_role``), and the command-line option that gives its checkpoint (the kind's
# ``checkpoint_option``), one per drafter kind of the registry: the Spec-Drafter (spec,
# --drafter-path), an autoregressive draft model (ar, --ar-drafter-path), SpecBound's exit
# heads (exit, --exit-heads-path), blockwise parallel decoding's heads (blockwise,
# --blockwise-heads-path).
# A kind without a checkpoint option has no role here.
DRAFTER_OPTIONS = {kind.bench_role: kind.checkpoint_option for kind in DRAFTER_KINDS.values() if kind.checkpoint_option}
NO_DRAFTER = "none"  # lookups alone, or nothing drafted (loop-greedy)


def option_dest(option: str) -> str:
    """The attribute argparse stores ``option`` under: ``--ar-drafter-path`` -> ``ar_drafter_path``."""
    return option[2:].replace("-", "_")


def record_key(option: str) -> str:
    """The key of a checkpoint option in bench.json's environment: ``--ar-drafter-path`` -> ``ar_drafter``."""
    return option_dest(option).removesuffix("_path")


class BenchError(Exception):
    """A user-facing error: one line on stderr, exit status 2."""


# --------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class BenchConfig:
    """One decoder to measure: fairseq's SequenceGenerator with ``beam``; CTranslate2's
    greedy search with ``ct2_compute_type`` (float32, int8) on ``ct2_threads`` threads (None:
    the bench's ``--threads``), its worker's environment the bench's and ``ct2_environment``
    (NAME, VALUE) pairs; or, when both are None,
    the speculative generator with ``overrides`` applied to ``SpeculativeDecodingConfig``
    and the model drafter ``drafter`` (a key of ``DRAFTER_OPTIONS``, or ``none``)."""

    name: str
    description: str
    beam: Optional[int] = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    drafter: str = NO_DRAFTER
    ct2_compute_type: Optional[str] = None
    ct2_threads: Optional[int] = None
    ct2_environment: Tuple[Tuple[str, str], ...] = ()

    @property
    def speculative(self) -> bool:
        return self.beam is None and self.ct2_compute_type is None

    @property
    def kind(self) -> str:
        if self.ct2_compute_type is not None:
            return CTRANSLATE2
        return "speculative" if self.speculative else "fairseq"


# The building blocks of Table III of the CM-ASD paper (arXiv:2508.15371). "Fixed tau" is SpecDec's
# top-beta + gap rule with its own threshold --spec-tau (default 1.0, set it with
# --set spec_tau=...); "adaptive tau" is CM-ASD's tau_base + gamma * f(confidence).
FIXED_K10 = {"spec_controller": "fixed", "spec_k": 10}
ADAPTIVE_K = {"spec_controller": "cmasd"}
FIXED_TAU = {"spec_acceptance": "topk-gap"}
ADAPTIVE_TAU = {"spec_acceptance": "cmasd"}
EXACT = {"spec_acceptance": "exact"}
FULL_CMASD = {**ADAPTIVE_K, **ADAPTIVE_TAU, "cmasd_confidence": "ensemble"}
# On a CPU a verifier pass over k+1 positions costs more the longer the block (8 ms for 1,
# 15 ms for 11 with the compact verifier on 2 cores): cap k, and run only the slots sent.
SHORT_BLOCK = {"spec_k_max": 4, "spec_draft_block": 4}
EIGHT_BLOCK = {"spec_k_max": 8, "spec_draft_block": 8}
# The verifier's repetition loops, which the drafter does not predict, drafted from the row's history.
HISTORY = {"spec_history_ngram": 3}
# Names, numbers and punctuation runs copied from the source sentence.
SOURCE = {"spec_source_ngram": 2}
# An autoregressive draft model drafting gamma tokens one at a time.
AR = {"drafter_kind": "autoregressive", "spec_controller": "fixed"}
# The model drafter's output projection onto the 2,000 most frequent target pieces only (of the
# compact model's 8,001), and its linear layers on int8 weights: two ways to cheapen a draft step.
SHORTLIST = {"spec_draft_shortlist": 2000}
INT8 = {"spec_drafter_quantize": "int8"}
# The model drafter's linear layers on bfloat16 weights (computed in float32; the C++ extension's
# panels, CPU only): with the shortlist, the cheapest draft here (docs/results/speculation-pays.md).
BF16 = {"spec_drafter_quantize": "bf16"}
STATIC = {"spec_verify": "static"}  # every row's block the draft's horizon wide: one host read an iteration
GRAPHS = {"spec_cuda_graphs": True}  # the verify and draft-model passes replayed from CUDA graphs (GPU only)
# The cost-aware controller: per row the k in 0 .. 8 that maximises expected accepted tokens per
# second from this machine's measured costs (cmasd.verification.goodput), exact acceptance.
GOODPUT = {"spec_controller": "goodput", "spec_k_max": 8, **EXACT}
# Lookups with no model drafter behind them: rows without a match send nothing.
LOOKUPS_ALONE = {"spec_controller": "fixed", "spec_k": 8}
# SpecBound (seed 002): early exits from the verifier's own layers, lossless. The bounds are
# the best of a grid on Multi30k valid for the compact verifier and its adapter exit heads
# (docs/results/self-speculation.md): no annealing, exits at layer 1 only; an ad-hoc
# configuration (NAME:base=specbound;specbound_alpha=...) tries others. Without annealing
# the tuned point already runs without ACT, so its ACT row switches ACT on (ACT_ON: alpha 1,
# --specbound-alpha's default) where the other rows switch a bound off.
SPECBOUND = {"drafter_kind": "specbound", "spec_controller": "fixed", "spec_k": 8, "specbound_w_max": 8,
             "specbound_alpha": 0.0, "specbound_tau": 0.4, "specbound_d_max": 1, **EXACT}
ACT_ON = {"specbound_alpha": 1.0}
# Blockwise parallel decoding (Stern et al., 2018): heads 2 .. k of the verifier's last state.
BLOCKWISE = {"drafter_kind": "blockwise", "spec_controller": "fixed", **EXACT}
# With --sampling: speculative sampling (exact in distribution), lenience 0.5, EARS beta 0.1.
REJECTION = {"spec_acceptance": "rejection"}
LENIENT = {"spec_acceptance": "rejection", "spec_lenience": 0.5}
EARS = {"spec_acceptance": "rejection", "ears_beta": 0.1}


def speculative(name: str, description: str, *parts: Mapping[str, Any], drafter: str = "spec") -> BenchConfig:
    merged: Dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    return BenchConfig(name, description, overrides=merged, drafter=drafter)


def ar_configs(gamma: int) -> List[BenchConfig]:
    """The autoregressive draft model at draft length ``gamma``: lossless and lenient."""
    return [
        speculative(f"ar-g{gamma}-exact", f"autoregressive draft model, gamma={gamma}, exact acceptance (lossless)",
                    AR, {"spec_k": gamma}, EXACT, drafter="ar"),
        speculative(f"ar-g{gamma}", f"autoregressive draft model, gamma={gamma}, top-beta + fixed tau (lenient)",
                    AR, {"spec_k": gamma}, FIXED_TAU, drafter="ar"),
    ]


def history_configs(prefix: str, window: Mapping[str, Any], drafter: str, what: str) -> List[BenchConfig]:
    """The draft-length controllers of GammaTune's Table 2 and CM-ASD's, exact acceptance
    (lossless), drafting with ``drafter`` inside ``window`` (the clip gamma_max, and for the
    Spec-Drafter its block): GammaTune and GammaTune+ from gamma 4, Hugging Face's heuristic
    from 4 and threshold up to 8 (tau 0.4), CM-ASD's confidence-scaled k, and both combined."""
    return [
        speculative(f"{prefix}gammatune-exact", f"{what}: GammaTune from gamma 4 (eta 0.5, delta 1), exact acceptance",
                    window, {"spec_controller": "gammatune", "spec_k": 4}, EXACT, drafter=drafter),
        speculative(f"{prefix}gammatune-plus-exact", f"{what}: GammaTune+ from gamma 4, drafts end after the first "
                    "token below 0.4, exact acceptance", window, {"spec_controller": "gammatune-plus", "spec_k": 4},
                    EXACT, drafter=drafter),
        speculative(f"{prefix}hf-heuristic-exact", f"{what}: Hugging Face's heuristic schedule from gamma 4, exact "
                    "acceptance", window, {"spec_controller": "hf-heuristic", "spec_k": 4}, EXACT, drafter=drafter),
        speculative(f"{prefix}assistant-threshold-exact", f"{what}: Hugging Face's threshold 0.4, up to 8 drafts, "
                    "exact acceptance", window, {"spec_controller": "assistant-threshold", "spec_k": 8}, EXACT,
                    drafter=drafter),
        speculative(f"{prefix}cmasd-gammatune-exact", f"{what}: CM-ASD's confidence scaling inside GammaTune's "
                    "window from gamma 4, exact acceptance", window, {"spec_controller": "cmasd-gammatune", "spec_k": 4},
                    EXACT, drafter=drafter),
        speculative(f"{prefix}cmasd-k8-exact", f"{what}: CM-ASD's confidence-scaled k (k_max 8), exact acceptance",
                    window, ADAPTIVE_K, EXACT, drafter=drafter),
    ]


def sampling_configs(name: str, what: str, *parts: Mapping[str, Any], drafter: str) -> List[BenchConfig]:
    """Speculative sampling (needs --sampling) with ``parts``: exact, lenience 0.5, EARS 0.1."""
    return [
        speculative(name, f"{what}, speculative sampling (--sampling; distributed as fairseq's)", *parts, REJECTION,
                    drafter=drafter),
        speculative(f"{name}-l05", f"{what}, speculative sampling with lenience 0.5 (--sampling; not exact)", *parts,
                    LENIENT, drafter=drafter),
        speculative(f"{name}-ears", f"{what}, speculative sampling with EARS beta 0.1 (--sampling; not exact)", *parts,
                    EARS, drafter=drafter),
    ]


CONFIGS: Dict[str, BenchConfig] = {
    c.name: c
    for c in [
        BenchConfig(BEAM5, "fairseq SequenceGenerator, beam 5", beam=5),
        BenchConfig(BEAM4, "fairseq SequenceGenerator, beam 4 (fairseq's BART CNN/DM recipe)", beam=4),
        BenchConfig(GREEDY, "fairseq SequenceGenerator, beam 1 (greedy)", beam=1),
        BenchConfig("ct2-greedy", "CTranslate2 greedy search, float32, the verifier converted by CTranslate2's "
                    "fairseq converter (needs the ct2 extra)", ct2_compute_type="float32"),
        BenchConfig("ct2-greedy-1t", "ct2-greedy on one thread whatever --threads (CTranslate2's OpenMP threads "
                    "can cost more than they save: 6x slower on two threads than on one on the 2-vCPU development VM "
                    "at some hours)", ct2_compute_type="float32", ct2_threads=1),
        BenchConfig("ct2-greedy-onednn", "ct2-greedy with CT2_USE_MKL=0: oneDNN's GEMM, which CTranslate2 chooses "
                    "on a CPU not Intel's; on an Intel one it chooses MKL, whose second thread made the same decode "
                    "2x slower there, oneDNN's 2x faster (docs/results/ctranslate2.md)", ct2_compute_type="float32",
                    ct2_environment=(("CT2_USE_MKL", "0"),)),
        BenchConfig("ct2-greedy-int8", "CTranslate2 greedy search, int8 weights quantized on load (exact with "
                    "respect to the quantized model only; needs the ct2 extra)", ct2_compute_type="int8"),
        speculative("loop-greedy", "cmasd's loop with nothing drafted (--spec-k 0): the verifier alone, "
                    "greedy; what the loop and its kernels save over fairseq's, without a drafter",
                    {"spec_k": 0}, EXACT, drafter=NO_DRAFTER),
        speculative("loop-greedy-native", "loop-greedy on torch's default linear kernels (--spec-kernels "
                    "native, as fairseq runs them): what the loop alone saves", {"spec_k": 0, "spec_kernels": "native"},
                    EXACT, drafter=NO_DRAFTER),
        speculative("specdec-k10", "SpecDec: fixed k=10, top-beta + fixed tau", FIXED_K10, FIXED_TAU),
        speculative("specdec-k25", "SpecDec: fixed k=25, top-beta + fixed tau", FIXED_K10, {"spec_k": 25}, FIXED_TAU),
        speculative("specdec-k10-exact", "fixed k=10, exact acceptance (lossless)", FIXED_K10, EXACT),
        speculative("specdec-k5-exact", "fixed k=5 and a 5-slot drafter block, exact acceptance (lossless; "
                    "the fastest fixed k on a 2-core CPU)", FIXED_K10, {"spec_k": 5, "spec_draft_block": 5}, EXACT),
        speculative("specdec-k5-exact-sl2000", "specdec-k5-exact drafting among the 2,000 most frequent pieces only "
                    "(--spec-draft-shortlist 2000; lossless)", FIXED_K10, {"spec_k": 5, "spec_draft_block": 5}, EXACT,
                    SHORTLIST),
        speculative("specdec-k5-exact-sl2000-bf16", "specdec-k5-exact-sl2000 with the Spec-Drafter on bfloat16 "
                    "weights (--spec-drafter-quantize bf16, CPU; lossless)", FIXED_K10,
                    {"spec_k": 5, "spec_draft_block": 5}, EXACT, SHORTLIST, BF16),
        speculative("specdec-k25-exact", "fixed k=25, exact acceptance (lossless)", FIXED_K10, {"spec_k": 25}, EXACT),
        speculative("cmasd", "CM-ASD: adaptive k + adaptive tau, ensemble confidence", FULL_CMASD),
        speculative("cmasd-k4", "CM-ASD with k_max=4 and a 4-slot drafter block (the operating point "
                    "cmasd-tune found on a 2-core CPU)", FULL_CMASD, SHORT_BLOCK),
        speculative("cmasd-k8", "CM-ASD with k_max=8 and an 8-slot drafter block (the faster cap with a "
                    "one-hour drafter)", FULL_CMASD, EIGHT_BLOCK),
        speculative("cmasd-k8-sl2000-bf16", "cmasd-k8 drafting among the 2,000 most frequent pieces on bfloat16 "
                    "weights (--spec-draft-shortlist 2000 --spec-drafter-quantize bf16, CPU; its confidence is the "
                    "shortlist's)", FULL_CMASD, EIGHT_BLOCK, SHORTLIST, BF16),
        speculative("cmasd-k8-history", "cmasd-k8 with history drafts (--spec-history-ngram 3): a row that "
                    "repeats its last 3 tokens drafts their earlier continuation", FULL_CMASD, EIGHT_BLOCK, HISTORY),
        speculative("cmasd-k8-source", "cmasd-k8 with source drafts (--spec-source-ngram 2): a row whose last 2 "
                    "tokens occur in its source drafts what follows them there", FULL_CMASD, EIGHT_BLOCK, SOURCE),
        speculative("specdec-k5-exact-history", "specdec-k5-exact with history drafts (--spec-history-ngram 3; "
                    "lossless)", FIXED_K10, {"spec_k": 5, "spec_draft_block": 5}, EXACT, HISTORY),
        speculative("specdec-k5-exact-source", "specdec-k5-exact with source drafts (--spec-source-ngram 2; "
                    "lossless)", FIXED_K10, {"spec_k": 5, "spec_draft_block": 5}, EXACT, SOURCE),
        *ar_configs(2),
        *ar_configs(4),
        *ar_configs(6),
        speculative("ar-g4-exact-history", "ar-g4-exact with history drafts (--spec-history-ngram 3; lossless)",
                    AR, {"spec_k": 4}, EXACT, HISTORY, drafter="ar"),
        speculative("ar-g4-exact-source", "ar-g4-exact with source drafts (--spec-source-ngram 2; lossless)",
                    AR, {"spec_k": 4}, EXACT, SOURCE, drafter="ar"),
        speculative("ar-g4-exact-sl2000", "ar-g4-exact drafting among the 2,000 most frequent pieces only "
                    "(--spec-draft-shortlist 2000; lossless)", AR, {"spec_k": 4}, EXACT, SHORTLIST, drafter="ar"),
        speculative("ar-g4-exact-sl2000-bf16", "ar-g4-exact-sl2000 with the draft model on bfloat16 weights "
                    "(--spec-drafter-quantize bf16, CPU; lossless)", AR, {"spec_k": 4}, EXACT, SHORTLIST, BF16,
                    drafter="ar"),
        speculative("ar-g4-exact-int8", "ar-g4-exact with the draft model on int8 weights (--spec-drafter-quantize "
                    "int8, CPU; lossless)", AR, {"spec_k": 4}, EXACT, INT8, drafter="ar"),
        speculative("ar-g4-exact-int8-sl2000", "ar-g4-exact-int8 with the 2,000-piece shortlist (lossless)",
                    AR, {"spec_k": 4}, EXACT, INT8, SHORTLIST, drafter="ar"),
        speculative("goodput-spec", "the cost-aware controller (goodput: per row the k in 0..8 with the most "
                    "expected tokens per second, from measured costs) with the Spec-Drafter, an 8-slot block "
                    "(lossless)", GOODPUT, {"spec_draft_block": 8}),
        speculative("goodput-spec-sl2000", "goodput-spec with the 2,000-piece shortlist (lossless)", GOODPUT,
                    {"spec_draft_block": 8}, SHORTLIST),
        speculative("goodput-ar", "the cost-aware controller with the autoregressive draft model, k in 0..8 "
                    "(lossless)", AR, GOODPUT, drafter="ar"),
        speculative("goodput-ar-sl2000", "goodput-ar with the 2,000-piece shortlist (lossless)", AR, GOODPUT,
                    SHORTLIST, drafter="ar"),
        speculative("goodput-ar-sl2000-bf16", "goodput-ar-sl2000 with the draft model on bfloat16 weights "
                    "(--spec-drafter-quantize bf16, CPU; its costs measured so; lossless)", AR, GOODPUT, SHORTLIST,
                    BF16, drafter="ar"),
        speculative("goodput-ar-history", "goodput-ar with history drafts in front (--spec-history-ngram 3; "
                    "lossless)", AR, GOODPUT, HISTORY, drafter="ar"),
        speculative("ar-g4-exact-static", "ar-g4-exact with a static block (--spec-verify static: every row's "
                    "block 4 drafts wide, the shape known on the host; one host read an iteration, for a GPU; "
                    "lossless)", AR, {"spec_k": 4}, EXACT, STATIC, drafter="ar"),
        speculative("specdec-k5-exact-static", "specdec-k5-exact with a static block (--spec-verify static; "
                    "lossless)", FIXED_K10, {"spec_k": 5, "spec_draft_block": 5}, EXACT, STATIC),
        speculative("ar-g4-exact-graphs", "ar-g4-exact with its verify and draft-model passes replayed from CUDA "
                    "graphs (--spec-cuda-graphs, on a static block; GPU only; lossless)", AR, {"spec_k": 4}, EXACT,
                    STATIC, GRAPHS, drafter="ar"),
        speculative("specdec-k5-exact-graphs", "specdec-k5-exact with its verify pass replayed from CUDA graphs "
                    "(--spec-cuda-graphs; GPU only; lossless)", FIXED_K10, {"spec_k": 5, "spec_draft_block": 5},
                    EXACT, STATIC, GRAPHS),
        speculative("history-k8-exact", "history drafts alone (--spec-history-ngram 3, no model drafter), up to 8 "
                    "tokens, exact acceptance (lossless)", LOOKUPS_ALONE, HISTORY, EXACT, drafter=NO_DRAFTER),
        speculative("source-k8-exact", "source drafts alone (--spec-source-ngram 2, no model drafter), up to 8 "
                    "tokens, exact acceptance (lossless)", LOOKUPS_ALONE, SOURCE, EXACT, drafter=NO_DRAFTER),
        speculative("cmasd-exact", "CM-ASD's adaptive k, exact acceptance (lossless)", ADAPTIVE_K, EXACT),
        speculative("specbound", "SpecBound: early exits of the verifier's layers with trained exit heads, "
                    "alpha 0 (no ACT: every layer at temperature 1), tau 0.4, d_max 1, w_max 8 (lossless)", SPECBOUND,
                    drafter="exit"),
        speculative("specbound-act", "specbound with ACT, the annealed confidence threshold (alpha 1: layer l at "
                    "temperature 1 + (1 - l / L)); the ACT ablation of the tuned specbound, which runs without it",
                    SPECBOUND, ACT_ON, drafter="exit"),
        speculative("specbound-no-dmax", "specbound without d_max (a token that does not exit runs L - 1 layers)",
                    SPECBOUND, {"specbound_d_max": None}, drafter="exit"),
        speculative("specbound-no-wmax", "specbound without w_max (up to 32 drafts)", SPECBOUND,
                    {"specbound_w_max": 32, "spec_k": 32}, drafter="exit"),
        speculative("specbound-untrained", "specbound with the verifier's own output head at every layer (no "
                    "trained heads)", SPECBOUND, drafter=NO_DRAFTER),
        speculative("blockwise-k10", "blockwise parallel decoding, k=10: heads 2..10 of the verifier's last state, "
                    "exact match (lossless)", BLOCKWISE, {"spec_k": 9}, drafter="blockwise"),
        speculative("blockwise-k25", "blockwise parallel decoding, k=25: heads 2..25 (lossless)", BLOCKWISE,
                    {"spec_k": 24}, drafter="blockwise"),
        speculative("loop-sample", "cmasd's loop with nothing drafted: the verifier alone, sampling (--sampling)",
                    {"spec_k": 0}, REJECTION, drafter=NO_DRAFTER),
        *sampling_configs("spec-sample-k4", "Spec-Drafter, fixed k=4 and a 4-slot block", FIXED_K10,
                          {"spec_k": 4, "spec_draft_block": 4}, drafter="spec"),
        *sampling_configs("cmasd-k4-sample", "CM-ASD's adaptive k (k_max=4, 4-slot block)", ADAPTIVE_K, SHORT_BLOCK,
                          drafter="spec"),
        *sampling_configs("ar-g4-sample", "autoregressive draft model, gamma=4", AR, {"spec_k": 4}, drafter="ar"),
        *history_configs("", EIGHT_BLOCK, "spec", "Spec-Drafter, window 1..8 and an 8-slot block"),
        *history_configs("ar-", {**AR, "spec_k_max": 8}, "ar", "autoregressive draft model, window 1..8"),
        speculative("cmasd-text-tau", "CM-ASD with tau = tau_base + gamma*C (the paper's text)",
                    FULL_CMASD, {"cmasd_tau_schedule": "confidence"}),
        speculative("abl-fixedk-fixedtau", "Table III w/o confidence: fixed k=10, fixed tau (= specdec-k10)",
                    FIXED_K10, FIXED_TAU),
        speculative("abl-fixedk-adaptivetau", "Table III w/o adaptive drafting: fixed k=10, adaptive tau",
                    FIXED_K10, ADAPTIVE_TAU, {"cmasd_confidence": "ensemble"}),
        speculative("abl-adaptivek-fixedtau", "Table III w/o adaptive verification: adaptive k, fixed tau",
                    ADAPTIVE_K, FIXED_TAU, {"cmasd_confidence": "ensemble"}),
        speculative("abl-entropy", "Table III: full CM-ASD, entropy confidence only",
                    FULL_CMASD, {"cmasd_confidence": "entropy"}),
        speculative("abl-logit-margin", "Table III: full CM-ASD, logit-margin confidence only",
                    FULL_CMASD, {"cmasd_confidence": "logit-margin"}),
        speculative("abl-softmax-margin", "Table III: full CM-ASD, softmax-margin confidence only",
                    FULL_CMASD, {"cmasd_confidence": "softmax-margin"}),
        speculative("abl-full", "Table III: full CM-ASD (= cmasd)", FULL_CMASD),
    ]
}
# The defaults need only --drafter-path (the Spec-Drafter); the ar-* rows need --ar-drafter-path; the ct2
# rows are skipped, with a message, where CTranslate2 is not installed.
DEFAULT_CONFIGS = (
    "beam5,greedy,ct2-greedy,loop-greedy-native,loop-greedy,specdec-k10,specdec-k25,specdec-k10-exact,specdec-k25-exact,specdec-k5-exact,"
    "specdec-k5-exact-history,cmasd,cmasd-k4,cmasd-k8,cmasd-k8-history"
)

# With --sampling: fairseq's sampling (the greedy row), the loop alone and the Spec-Drafter's rows.
DEFAULT_SAMPLING_CONFIGS = "greedy,loop-sample,spec-sample-k4,spec-sample-k4-l05,spec-sample-k4-ears"

# A language model (a decoder-only verifier: ``transformer_lm``) has no source to encode: every
# drafter but the Spec-Drafter, which reads an encoder's output, drafts for it (the draft model: a
# smaller language model, --ar-drafter-path; SpecBound's exits and blockwise heads on the language
# model; the lookups).
NOT_FOR_LM = {"spec": "the Spec-Drafter, which reads an encoder's output"}  # drafter role or kind -> why not
# With a language model: fairseq's greedy, CTranslate2's, the loop alone, the draft model at two
# gammas, prompt lookup (history drafts) alone and in front of the draft model, two controllers.
DEFAULT_LM_CONFIGS = ("greedy,ct2-greedy,loop-greedy,ar-g2-exact,ar-g4-exact,ar-g4-exact-history,history-k8-exact,"
                      "goodput-ar,ar-gammatune-exact")


def language_model_misfits(configs: Sequence[BenchConfig], global_overrides: Mapping[str, Any]) -> Dict[str, str]:
    """The configurations of ``configs`` that cannot decode a language model: name -> what
    they draft with (``NOT_FOR_LM``)."""
    out: Dict[str, str] = {}
    for config in configs:
        if not config.speculative:
            continue
        kind = {**global_overrides, **config.overrides}.get("drafter_kind")
        for misfit in (config.drafter, kind):
            if misfit in NOT_FOR_LM:
                out[config.name] = NOT_FOR_LM[misfit]
    return out


def refuse_language_model_misfits(configs: Sequence[BenchConfig], global_overrides: Mapping[str, Any]) -> None:
    """One error naming every configuration of ``configs`` a language model cannot run."""
    misfits = language_model_misfits(configs, global_overrides)
    if not misfits:
        return
    by_drafter: Dict[str, List[str]] = {}
    for name, drafter in misfits.items():
        by_drafter.setdefault(drafter, []).append(name)
    named = "; ".join(f"{', '.join(names)} draft with {drafter}" for drafter, names in by_drafter.items())
    raise BenchError(f"the verifier is a language model (no encoder): {named}; leave them out of --configs (with a "
                     f"language model: fairseq's rows, ct2-greedy, loop-greedy, the ar-* rows with --ar-drafter-path, "
                     f"history-k8-exact, specbound with --exit-heads-path, blockwise with --blockwise-heads-path; "
                     f"default: {DEFAULT_LM_CONFIGS})")


# A comma starts a new configuration only where a name follows (so that values such as
# cmasd_weights=0.5,0.25,0.25 keep their commas).
CONFIG_SEPARATOR = re.compile(r",(?=\s*[A-Za-z][\w.-]*\s*(?::|,|$))")
CONFIG_NAME = re.compile(r"^[A-Za-z][\w.-]*$")


def distinct_positive_ints(option: str, text: str) -> List[int]:
    """The comma-separated values of ``option``: distinct positive integers, in order."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BenchError(f"{option}: expected comma-separated positive integers, got {text!r}") from None
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise BenchError(f"{option}: expected distinct positive integers, got {text!r}")
    return values


def spec_fields() -> Dict[str, Any]:
    """The settable ``SpeculativeDecodingConfig`` fields and their types
    (``drafter_path`` comes from the option of the configuration's drafter, ``DRAFTER_OPTIONS``)."""
    from cmasd.options import SpeculativeDecodingConfig

    return {f.name: f.type for f in fields(SpeculativeDecodingConfig) if f.name not in ("_name", "drafter_path")}


def parse_value(key: str, text: str) -> Any:
    """``text`` converted to the type of the option ``key``."""
    known = spec_fields()
    if key not in known:
        raise BenchError(f"unknown option {key!r}; known: {', '.join(known)}")
    kind = known[key]
    text = text.strip()
    if isinstance(kind, enum.EnumMeta):
        choices = [c.value for c in kind]
        if text not in choices:
            raise BenchError(f"{key}={text}: choose from {', '.join(choices)}")
        return text
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise BenchError(f"{key}={text}: expected true or false")
        return text.lower() in ("true", "1", "yes")
    optional = [a for a in typing.get_args(kind) if a is not type(None)] if typing.get_origin(kind) is Union else []
    if len(optional) == 1:  # Optional[X]: none, or an X
        if text.lower() == "none":
            return None
        kind = optional[0]
    try:
        return kind(text)
    except ValueError:
        raise BenchError(f"{key}={text}: expected {getattr(kind, '__name__', kind)}") from None


def parse_assignments(items: Sequence[str]) -> Dict[str, Any]:
    """``["key=value", ...]`` to a typed dictionary."""
    out: Dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise BenchError(f"expected KEY=VALUE, got {item!r}")
        out[key.strip()] = parse_value(key.strip(), value)
    return out


def parse_adhoc_config(item: str) -> BenchConfig:
    """``NAME:KEY=VALUE;KEY=VALUE``: ``base=NAMED`` starts from a named configuration,
    ``drafter=spec|ar|none`` names the model drafter (default: the base's, else spec)."""
    name, _, body = item.partition(":")
    name = name.strip()
    if not CONFIG_NAME.match(name) or name in CONFIGS or name == FLOOR:
        raise BenchError(f"ad-hoc configuration {item!r}: pick a new name of letters, digits, '_', '.', '-'")
    pairs = [(k.strip(), v.strip()) for k, _, v in (p.partition("=") for p in body.split(";") if p.strip())]
    overrides: Dict[str, Any] = {}
    drafter = "spec"
    for key, value in pairs:
        if key == "base":
            if value not in CONFIGS or not CONFIGS[value].speculative:
                raise BenchError(f"ad-hoc configuration {name}: base={value} is not a named speculative configuration")
            overrides.update(CONFIGS[value].overrides)
            drafter = CONFIGS[value].drafter
    for key, value in pairs:
        if key == "drafter":
            if value not in (*DRAFTER_OPTIONS, NO_DRAFTER):
                raise BenchError(f"ad-hoc configuration {name}: drafter={value}; choose from "
                                 f"{', '.join((*DRAFTER_OPTIONS, NO_DRAFTER))}")
            drafter = value
    overrides.update(parse_assignments([f"{k}={v}" for k, v in pairs if k not in ("base", "drafter")]))
    return BenchConfig(name, f"ad-hoc: {body.strip()}", overrides=overrides, drafter=drafter)


# configurations no longer measured, and why (--configs names them in its error)
RETIRED = {
    "specbound-no-act": "it decoded exactly as specbound, whose tuned alpha is already 0 (no ACT); "
                        "specbound-act is the ACT ablation (alpha 1)",
}


def resolve_configs(text: str) -> List[BenchConfig]:
    """The configurations of ``--configs``, greedy always included (it is the reference
    of the relative columns and of the floor)."""
    chosen: List[BenchConfig] = []
    for item in (i.strip() for i in CONFIG_SEPARATOR.split(text)):
        if ":" in item:
            chosen.append(parse_adhoc_config(item))
        elif item in CONFIGS:
            chosen.append(CONFIGS[item])
        elif item in RETIRED:
            raise BenchError(f"configuration {item!r} was removed: {RETIRED[item]}")
        else:
            raise BenchError(f"unknown configuration {item!r}; known: {', '.join(CONFIGS)} (or NAME:KEY=VALUE;...)")
    names = [c.name for c in chosen]
    if len(set(names)) != len(names):
        raise BenchError(f"a configuration is named twice in --configs: {', '.join(names)}")
    if GREEDY not in names:
        chosen.insert(0, CONFIGS[GREEDY])
    return chosen


def spec_options(config: BenchConfig, global_overrides: Mapping[str, Any], drafter_paths: Mapping[str, str]):
    """The full ``SpeculativeDecodingConfig`` of a speculative configuration, with the
    checkpoint of its drafter from ``drafter_paths`` (role -> path)."""
    from cmasd.options import SpeculativeDecodingConfig

    return replace(
        SpeculativeDecodingConfig(), drafter_path=drafter_paths.get(config.drafter),
        **{**global_overrides, **config.overrides}
    )


def options_dict(cfg) -> Dict[str, Any]:
    """A dataclass config as plain JSON values."""
    return {f.name: getattr(cfg, f.name) for f in fields(cfg) if not f.name.startswith("_")}
