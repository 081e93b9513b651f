"""Rows, the markdown table, the latency-throughput figure and bench.json."""

import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import sys
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from cmasd.decoding import calibration
from cmasd.tools.bench.configs import (
    DRAFTER_OPTIONS,
    FLOOR,
    GREEDY,
    SPEED_REFERENCES,
    BenchConfig,
    option_dest,
    record_key,
)
from cmasd.tools.bench.loading import Setup
from cmasd.tools.bench.measure import Measurements
from cmasd.tools.bench.scoring import ROUGE_KEYS, References, TextTools, bleu, quality_columns

# --------------------------------------------------------------------------- rows


COLUMNS: Dict[str, str] = {
    "config": "configuration name",
    "kind": "fairseq | ctranslate2 | speculative | floor",
    "batch_size": "sentences per batch",
    "sentences": "sentences decoded",
    "batches": "batches per pass",
    "bleu": "sacreBLEU of the detokenized output against the raw references (--metric bleu)",
    "rouge1": "ROUGE-1 F1 x 100 (--metric rouge)",
    "rouge2": "ROUGE-2 F1 x 100 (--metric rouge)",
    "rougeL": "ROUGE-L F1 x 100: longest common subsequence of the whole texts (--metric rouge)",
    "rougeLsum": "ROUGE-Lsum F1 x 100: summary-level LCS over the sentences, order-free (--metric rouge)",
    "quality_std": "standard deviation of the quality column(s) over the recorded passes (the seeds of --sampling; "
    "0 where every pass decodes the same)",
    "bleu_vs_greedy": "sacreBLEU of the output with greedy's output (same batch size) as reference",
    "exact_match_vs_greedy": "fraction of sentences with greedy's exact token sequence (same batch size); of a "
    "language model, of prompts whose continuation is greedy's token for token",
    "mean_accepted_tokens": "tokens a row gains per verifier iteration (1.0 for greedy; n/a for beam search)",
    "rollback_rate": "fraction of row-iterations that rejected a drafted token (speculative only)",
    "acceptance_rate": "fraction of the drafted tokens sent that were accepted (speculative only)",
    "pardon_rate": "fraction of the drafted tokens sent that only EARS's tolerance accepted (speculative only)",
    "mean_k": "drafted tokens sent per row-iteration (speculative only)",
    "mean_exit_layer": "mean decoder layer a self-speculative draft token exited at (SpecBound only)",
    "layers_skipped": "1 - mean exit layer / decoder layers: the share of layers a draft token skipped while "
    "drafting (SpecBound only; verification runs them)",
    "draft_ms_per_iteration": "drafting time per batched iteration, ms (speculative only)",
    "verify_ms_per_iteration": "verifier pass and fairseq's length/score rules per batched iteration, ms "
    "(speculative only)",
    "bookkeeping_ms_per_iteration": "acceptance, appending, statistics, dropping finished rows and growing the "
    "caches per batched iteration, ms (speculative only)",
    "tokens": "generated target tokens, eos included (the floor: greedy's, scored); of a language model, the "
    "continuations' (the prompts left out)",
    "seconds_mean": "wall seconds of the generate calls over the split, mean over repetitions",
    "seconds_std": "their standard deviation (0 with one repetition)",
    "tokens_per_second": "tokens / seconds_mean",
    "ms_per_sentence": "1000 * seconds_mean / sentences",
    "ms_per_batch": "1000 * seconds_mean / batches (the latency of Fig. 2)",
    "speedup_vs_beam5": "beam5 seconds / these seconds, mean of per-repetition ratios (n/a without beam5)",
    "speedup_vs_beam5_std": "its standard deviation",
    "speedup_vs_beam4": "beam4 seconds / these seconds, mean of per-repetition ratios (n/a without beam4: the "
    "beam of fairseq's BART CNN/DM recipe)",
    "speedup_vs_beam4_std": "its standard deviation",
    "speedup_vs_ct2_greedy": "ct2-greedy (CTranslate2) seconds / these seconds, mean of per-repetition ratios "
    "(n/a without ct2-greedy)",
    "speedup_vs_ct2_greedy_std": "its standard deviation",
    "speedup_vs_greedy": "greedy seconds / these seconds, mean of per-repetition ratios",
    "speedup_vs_greedy_std": "its standard deviation",
    "x_floor": "these seconds / the floor's seconds, mean of per-repetition ratios",
    "batch_seconds": "seconds of each batch in order, mean over repetitions (where the time of a pass goes)",
    "batch_longest_output": "tokens of the longest output of each batch, eos included (n/a for the floor)",
}
SPECULATIVE_STATS = [
    "mean_accepted_tokens", "rollback_rate", "acceptance_rate", "pardon_rate", "mean_k", "mean_exit_layer",
    "layers_skipped", "draft_ms_per_iteration", "verify_ms_per_iteration", "bookkeeping_ms_per_iteration",
]


# A language model's rows (metric None) are compared with fairseq greedy's output only.
NOT_SCORED = ("quality_std", "bleu_vs_greedy")


def columns(metric: Optional[str]) -> Dict[str, str]:
    """The columns of every row for ``metric`` (None: a language model's, no quality)."""
    drop = {"bleu", *ROUGE_KEYS} - set(quality_columns(metric))
    if metric is None:
        drop |= set(NOT_SCORED)
    return {k: v for k, v in COLUMNS.items() if k not in drop}


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0.0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> Tuple[float, float]:
    """Mean and std of per-repetition ratios."""
    return mean_std([a / b if b > 0 else math.nan for a, b in zip(numerators, denominators)])


def mean_stats(summaries: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The speculative statistics of several repetitions: the floats that differ (timings;
    with --sampling, the rates of each seed) averaged, the rest (counts, histograms) from
    the first."""
    out = dict(summaries[0])
    for key, value in out.items():
        values = [s[key] for s in summaries]
        if isinstance(value, float) and len(set(values)) > 1:
            out[key] = statistics.fmean(values)
    return out


def speedup_key(reference: str) -> str:
    """The speed-up column over ``reference`` (one of ``SPEED_REFERENCES``)."""
    return "speedup_vs_" + reference.replace("-", "_")


def timing_columns(m: Measurements, name: str, bs: int, tokens: int, sentences: int, batches: int,
                   beams: Sequence[str]) -> Dict[str, Any]:
    """Seconds, throughput, latency and speed-ups of one row (over each beam search of
    ``SPEED_REFERENCES`` that ran: ``beams``)."""
    secs = m.seconds(name, bs)
    mean, std = mean_std(secs)
    beam = {ref: ratios(m.seconds(ref, bs), secs) if ref in beams else (None, None) for ref in SPEED_REFERENCES}
    greedy = ratios(m.seconds(GREEDY, bs), secs)
    return {
        "tokens": tokens,
        "seconds_mean": mean,
        "seconds_std": std,
        "tokens_per_second": tokens / mean if mean > 0 else math.nan,
        "ms_per_sentence": 1000.0 * mean / sentences,
        "ms_per_batch": 1000.0 * mean / batches,
        **{f"{speedup_key(ref)}": beam[ref][0] for ref in SPEED_REFERENCES},
        **{f"{speedup_key(ref)}_std": beam[ref][1] for ref in SPEED_REFERENCES},
        "speedup_vs_greedy": greedy[0],
        "speedup_vs_greedy_std": greedy[1],
        "x_floor": ratios(secs, m.seconds(FLOOR, bs))[0],
    }


def decoder_row(config: BenchConfig, bs: int, m: Measurements, text: Optional[TextTools], refs: Optional[References],
                n_batches: int, beams: Sequence[str], lossless: bool = False) -> Dict[str, Any]:
    """Quality (none without ``text``: a language model's), agreement with greedy,
    speculative statistics and timing of one configuration at one batch size; a
    ``lossless`` configuration's row names the sentences it decoded otherwise than greedy
    (``differs_from_greedy``), where there are any."""
    ids = sorted(m.first(config.name, bs).hypotheses)
    hyps = m.first(config.name, bs).hypotheses
    greedy = m.first(GREEDY, bs).hypotheses
    stats = mean_stats([r.stats for r in m.runs[(config.name, bs)]]) if config.speculative else None
    row = {"config": config.name, "kind": config.kind, "batch_size": bs, "sentences": len(ids), "batches": n_batches}
    if text is not None:
        row.update(pass_quality(m.runs[(config.name, bs)], ids, text, refs))
        row["bleu_vs_greedy"] = bleu([text.detokenize(hyps[i]) for i in ids],
                                     [[text.detokenize(greedy[i])] for i in ids])
    row["exact_match_vs_greedy"] = statistics.fmean(hyps[i] == greedy[i] for i in ids)
    differ = [i for i in ids if hyps[i] != greedy[i]]
    if lossless and differ:
        row["differs_from_greedy"] = differ
    row.update({k: (stats[k] if stats else None) for k in SPECULATIVE_STATS})
    if config.name == GREEDY:
        row["mean_accepted_tokens"] = 1.0  # one token per verifier pass, by definition
    tokens = sum(len(hyps[i]) for i in ids)
    row.update(timing_columns(m, config.name, bs, tokens, len(ids), n_batches, beams))
    row["batch_seconds"] = m.batch_seconds(config.name, bs)
    row["batch_longest_output"] = m.first(config.name, bs).batch_longest
    if stats:
        row["decode_stats"] = stats
    return row


def pass_quality(runs, ids: List[int], text: TextTools, refs: References) -> Dict[str, float]:
    """The quality columns, mean over the recorded passes (each scored once per distinct
    output: sampled passes differ by seed), and ``quality_std``, the standard deviation
    of the first quality column over them."""
    scored: List[Dict[str, float]] = []
    for run in runs:
        same = next((q for r, q in zip(runs, scored) if r.hypotheses == run.hypotheses), None)
        scored.append(same or text.quality([text.detokenize(run.hypotheses[i]) for i in ids], [refs[i] for i in ids]))
    out = {key: statistics.fmean(q[key] for q in scored) for key in scored[0]}
    out["quality_std"] = mean_std([q[next(iter(q))] for q in scored])[1]
    return out


def floor_row(bs: int, m: Measurements, metric: Optional[str], n_batches: int, beams: Sequence[str]) -> Dict[str, Any]:
    """The floor at one batch size: timing only (it scores greedy's output)."""
    greedy = m.first(GREEDY, bs).hypotheses
    row = {"config": FLOOR, "kind": FLOOR, "batch_size": bs, "sentences": len(greedy), "batches": n_batches}
    agreement = ["exact_match_vs_greedy"] + ([] if metric is None else list(NOT_SCORED))
    row.update({k: None for k in quality_columns(metric) + agreement})
    row.update({k: None for k in SPECULATIVE_STATS})
    tokens = sum(len(t) for t in greedy.values())
    row.update(timing_columns(m, FLOOR, bs, tokens, len(greedy), n_batches, beams))
    row["batch_seconds"] = m.batch_seconds(FLOOR, bs)
    row["batch_longest_output"] = None
    return row


def make_rows(configs: Sequence[BenchConfig], m: Measurements, text: Optional[TextTools],
              refs: Optional[References], batch_counts: Mapping[int, int],
              lossless: Collection[str] = ()) -> List[Dict[str, Any]]:
    """Every configuration at every batch size, then the floor, in order (``text`` None: a
    language model's, without quality); the configurations named in ``lossless`` must
    decode as greedy (``differs_from_greedy``, ``lossless_warnings``)."""
    beams = [c.name for c in configs if c.name in SPEED_REFERENCES]
    rows = []
    for bs, n_batches in batch_counts.items():
        rows += [decoder_row(c, bs, m, text, refs, n_batches, beams, c.name in lossless) for c in configs]
        rows.append(floor_row(bs, m, None if text is None else text.metric, n_batches, beams))
    return rows


def lossless_warnings(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """A line for each row of a lossless configuration that decoded some sentences (prompts)
    otherwise than fairseq's greedy search at its batch size, naming them."""
    out = []
    for row in rows:
        differ = row.get("differs_from_greedy")
        if differ:
            shown = ", ".join(map(str, differ[:10])) + (", ..." if len(differ) > 10 else "")
            out.append(f"WARNING: {row['config']} is lossless but decoded {len(differ)} of {row['sentences']} "
                       f"sentences otherwise than greedy at batch size {row['batch_size']} (ids {shown})")
    return out


# --------------------------------------------------------------------------- reports


TABLE: List[Tuple[str, str, str]] = [  # (column, header, format)
    ("config", "config", "s"),
    ("batch_size", "bs", "d"),
    ("bleu", "BLEU", "q"),
    ("rouge1", "R-1", "q"),
    ("rouge2", "R-2", ".2f"),
    ("rougeL", "R-L", ".2f"),
    ("rougeLsum", "R-Lsum", ".2f"),
    ("bleu_vs_greedy", "BLEU vs greedy", ".2f"),
    ("exact_match_vs_greedy", "exact %", "%"),
    ("mean_accepted_tokens", "tok/iter", ".2f"),
    ("rollback_rate", "rollback %", "%"),
    ("acceptance_rate", "accept %", "%"),
    ("pardon_rate", "pardon %", "%"),
    ("mean_k", "mean k", ".2f"),
    ("mean_exit_layer", "exit layer", ".2f"),
    ("layers_skipped", "layers skipped %", "%"),
    ("draft_ms_per_iteration", "draft ms/iter", ".2f"),
    ("verify_ms_per_iteration", "verify ms/iter", ".2f"),
    ("bookkeeping_ms_per_iteration", "bookkeeping ms/iter", ".2f"),
    ("seconds_mean", "seconds", "±"),
    ("tokens_per_second", "tok/s", ".1f"),
    ("ms_per_batch", "ms/batch", ".1f"),
    ("speedup_vs_beam5", "× beam5", "×"),
    ("speedup_vs_beam4", "× beam4", "×"),
    ("speedup_vs_ct2_greedy", "× ct2-greedy", "×"),
    ("speedup_vs_greedy", "× greedy", "×"),
    ("x_floor", "× floor time", ".2f"),
]


def cell(row: Dict[str, Any], column: str, fmt: str) -> str:
    value = row.get(column)
    if value is None:
        return "n/a"
    if fmt == "%":
        return f"{100 * value:.1f}"
    if fmt == "q":  # a quality figure, with its spread over seeds where there is one
        spread = row.get("quality_std")
        return f"{value:.2f} ± {spread:.2f}" if spread else f"{value:.2f}"
    if fmt == "±":
        return f"{value:.3f} ± {row['seconds_std']:.3f}"
    if fmt == "×":
        return f"{value:.2f}× ± {row[column + '_std']:.2f}"
    return format(value, fmt)


def markdown_table(rows: Sequence[Dict[str, Any]], metric: str) -> str:
    """The rows as a markdown table; a speed-up over a beam search that did not run, and the
    exit columns where no row exits early, are left out."""
    absent = {speedup_key(ref) for ref in SPEED_REFERENCES if all(r.get(speedup_key(ref)) is None for r in rows)}
    absent |= {c for c in ("mean_exit_layer", "layers_skipped") if all(r.get(c) is None for r in rows)}
    shown = [(c, h, f) for c, h, f in TABLE if c in columns(metric) and c not in absent]
    lines = ["| " + " | ".join(h for _, h, _ in shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(cell(r, c, f) for c, _, f in shown) + " |" for r in rows]
    return "\n".join(lines)


def line_styles(names: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """A colour per configuration, none repeated and none the floor's (black, dashed):
    matplotlib's default cycle has 10 colours, one of them grey, and repeats after 10."""
    from matplotlib import colormaps

    configs = [name for name in names if name != FLOOR]
    palette = colormaps["tab10" if len(configs) <= 10 else "tab20"].colors
    if len(configs) > len(palette):
        palette = [colormaps["turbo"](i / max(len(configs) - 1, 1)) for i in range(len(configs))]
    styles: Dict[str, Dict[str, Any]] = {name: {"color": palette[i]} for i, name in enumerate(configs)}
    if FLOOR in names:
        styles[FLOOR] = {"color": "black", "linestyle": "--"}
    return styles


def plot_latency_throughput(rows: Sequence[Dict[str, Any]], path: str, title: str) -> None:
    """Fig. 2 of the paper: latency (ms per batch) against throughput (tokens/s),
    one line per configuration through its batch sizes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, ax = plt.subplots(figsize=(7, 5))
    ax.set_xscale("log")
    ax.set_yscale("log")
    names = list(dict.fromkeys(r["config"] for r in rows))
    styles = line_styles(names)
    for name in names:
        points = sorted((r["batch_size"], r["tokens_per_second"], r["ms_per_batch"]) for r in rows if r["config"] == name)
        ax.plot([p[1] for p in points], [p[2] for p in points], marker="o", label=name, **styles[name])
        for bs, x, y in points:
            ax.annotate(str(bs), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(ticker.ScalarFormatter())
        axis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("throughput (generated tokens / s); points labelled with the batch size")
    ax.set_ylabel("latency (ms per batch)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def versions() -> Dict[str, str]:
    import importlib.metadata as metadata

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name, dist in [("fairseq", "fairseq"), ("sacrebleu", "sacrebleu"), ("sentencepiece", "sentencepiece"),
                       ("rouge-score", "rouge-score"), ("matplotlib", "matplotlib"), ("ctranslate2", "ctranslate2"),
                       ("cmasd", "cmasd")]:
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            import fairseq

            out[name] = fairseq.__version__ if name == "fairseq" else "not installed"
    return out


def device_name(device: torch.device) -> str:
    """The device a run decoded on: the CUDA device's name, or the CPU's model name and threads."""
    name = calibration.device_name(device)
    return name if device.type == "cuda" else f"cpu ({platform.machine()}: {name})"


def checkpoint(path: Optional[str]) -> Optional[str]:
    return os.path.abspath(path) if path else None


# Environment variables that choose the CPU libraries' threads and kernels (CTranslate2's
# backend and instruction set, OpenMP's, MKL's and oneDNN's): on a 2-core Intel Xeon host
# CTranslate2's greedy search on two threads took 4.6 s with CT2_USE_MKL=0 (oneDNN) where its
# default MKL backend took 17.2 s on two threads and 8.4 s on one (docs/results/ctranslate2.md).
KERNEL_ENVIRONMENT = ("CT2_", "OMP_", "GOMP_", "KMP_", "MKL_", "DNNL_", "ONEDNN_")


def kernel_environment() -> Dict[str, str]:
    """The variables of KERNEL_ENVIRONMENT set in this process (the ct2 rows' worker inherits them)."""
    return {name: value for name, value in sorted(os.environ.items()) if name.startswith(KERNEL_ENVIRONMENT)}


def environment(args, setup: Setup) -> Dict[str, Any]:
    """Reproducibility record: command, versions, threads, the kernel libraries' environment
    variables, device, date."""
    return {
        "command": sys.argv,
        "versions": versions(),
        "threads": torch.get_num_threads(),
        "kernel_environment": kernel_environment(),
        "device": device_name(setup.device),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "data": os.path.abspath(args.data),
        "gen_subset": args.gen_subset,
        "verifier": os.path.abspath(args.path),
        **{record_key(option): checkpoint(getattr(args, option_dest(option))) for option in DRAFTER_OPTIONS.values()},
        "sentences": setup.size,
        "split_sentences": setup.split_size,
        "fp16": args.fp16,
        "bf16": args.bf16,
        "floor_kernels": setup.floor.kernels,
        "ct2_model": setup.ct2_model,
        "prompts": None if setup.prompts is None else dataclasses.asdict(setup.prompts),
    }


def write_json(path: str, record: Dict[str, Any]) -> None:
    """``record`` with NaN/inf written as null (strict JSON)."""

    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    with open(path, "w", encoding="utf-8") as f:
        json.dump(clean(record), f, indent=2, allow_nan=False)
        f.write("\n")
