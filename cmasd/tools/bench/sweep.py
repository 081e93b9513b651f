"""cmasd-bench --sweep-gamma: the protocol of GammaTune's Table 2 (Gautam et al., Sec. 5-6).

Every speculative configuration of ``--configs`` that drafts with a model runs once per
initial draft length gamma of the list, as ``NAME@gG``: the option that sets its
controller's initial length (``Controller.initial_length_option``: ``--spec-k``, or
``--spec-k-max`` for CM-ASD's controller, which keeps no history) is gamma; a clip
``--spec-k-max`` below gamma rises to it (a window cannot start above its clip); with
the Spec-Drafter the block is the controller's horizon, the most it can send (a fixed
gamma runs only the slots it sends). A gamma above the drafter's block is left out for
that drafter. Configurations without a model drafter (fairseq's greedy, ``loop-greedy``,
CTranslate2) run once.

The summary compares, per drafter and batch size, every swept configuration with the
fixed-length one of the same drafter at the same gamma (its *reference*: seconds of the
reference / seconds of the row), as mean ± standard deviation over the gammas; and
beside it the mean over gamma of its speed-up over fairseq's greedy search, over
``loop-greedy`` (where measured) and over the fastest fixed gamma, with its tokens per
iteration and the drafts it sent per row-iteration. The reference's own spread is that
of its speed over gamma around its mean (Table 2's "1.00 ± 0.23").
"""

import statistics
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence

from cmasd.tools.bench.configs import GREEDY, BenchConfig, BenchError, distinct_positive_ints, spec_options
from cmasd.tools.bench.report import mean_std

# GammaTune's initial gammas (Sec. 5)
PAPER_GAMMAS = "1,2,3,4,5,6,7,8,12,16,20,24"
LOOP = "loop-greedy"


@dataclass(frozen=True)
class Sweep:
    """The expanded configurations and what the summary needs to read them."""

    configs: List[BenchConfig]  # what to measure, the swept ones as NAME@gG
    gammas: List[int]
    runs: Dict[str, Dict[int, str]]  # swept configuration -> gamma -> the name it runs under
    drafter: Dict[str, str]  # swept configuration -> its model drafter (configs.DRAFTER_OPTIONS)
    reference: Dict[str, str]  # drafter -> its fixed-length configuration
    notes: List[str]  # gammas left out


def parse_gammas(text: str) -> List[int]:
    """``--sweep-gamma``: distinct positive integers, or ``paper`` for GammaTune's list."""
    return sorted(distinct_positive_ints("--sweep-gamma", PAPER_GAMMAS if text.strip() == "paper" else text))


def drafter_limit(setup, role: str, options) -> Optional[int]:
    """The most tokens the drafter of ``role`` drafts in one pass with ``options`` (None:
    no limit)."""
    from cmasd.options import drafter_kind

    model = setup.drafters[role]
    try:
        return drafter_kind(model, options.drafter_kind, options.drafter_path).horizon_limit(model)
    except ValueError as e:
        raise BenchError(str(e)) from None


def at_gamma(config: BenchConfig, gamma: int, options, limit: Optional[int]) -> BenchConfig:
    """``config`` with the initial draft length ``gamma`` (see the module docstring)."""
    from cmasd.verification.controllers import CONTROLLERS

    controller = CONTROLLERS[options.spec_controller]
    overrides: Dict[str, Any] = dict(config.overrides)
    overrides[controller.initial_length_option] = gamma
    if options.spec_k_max is not None and options.spec_k_max < gamma:
        overrides["spec_k_max"] = gamma
    if limit is not None:  # a drafter with a block: run the slots the controller can send
        cfg = replace(options, **{**overrides, "spec_draft_block": None})
        try:
            overrides["spec_draft_block"] = controller.from_config(cfg, limit).horizon
        except ValueError as e:
            raise BenchError(f"--sweep-gamma {gamma}: configuration {config.name}: {e}") from None
    return replace(config, name=f"{config.name}@g{gamma}", description=f"{config.description}; initial gamma {gamma}",
                   overrides=overrides)


def expand(configs: Sequence[BenchConfig], gammas: Sequence[int], setup, global_overrides: Mapping[str, Any],
           paths: Mapping[str, str]) -> Sweep:
    """Each configuration that drafts with a model at each gamma its drafter can draft."""
    out: List[BenchConfig] = []
    runs: Dict[str, Dict[int, str]] = {}
    drafter: Dict[str, str] = {}
    reference: Dict[str, str] = {}
    notes: List[str] = []
    for config in configs:
        if not (config.speculative and config.drafter in setup.drafters):
            out.append(config)
            continue
        options = spec_options(config, global_overrides, paths)
        limit = drafter_limit(setup, config.drafter, options)
        kept = [g for g in gammas if limit is None or g <= limit]
        if len(kept) < len(gammas):
            notes.append(f"{config.name}: gamma {', '.join(str(g) for g in gammas if g not in kept)} left out (the "
                         f"drafter drafts at most {limit} tokens per pass)")
        swept = [at_gamma(config, g, options, limit) for g in kept]
        out.extend(swept)
        runs[config.name] = {g: c.name for g, c in zip(kept, swept)}
        drafter[config.name] = config.drafter
        if options.spec_controller == "fixed":
            if config.drafter in reference:
                raise BenchError(f"--sweep-gamma: {reference[config.drafter]} and {config.name} both draft a fixed "
                                 f"length with the same drafter; keep one as the reference")
            reference[config.drafter] = config.name
    for role in sorted(set(drafter.values()) - set(reference)):
        users = ", ".join(name for name, r in drafter.items() if r == role)
        raise BenchError(f"--sweep-gamma: {users} need a fixed-length configuration with the same drafter to compare "
                         f"with (--spec-controller fixed, e.g. {'specdec-k5-exact' if role == 'spec' else 'ar-g4-exact'})")
    return Sweep(out, list(gammas), runs, drafter, reference, notes)


def summarize(sweep: Sweep, rows: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """One record per swept configuration and batch size (see the module docstring)."""
    by_name = {(r["config"], r["batch_size"]): r for r in rows}
    seconds = {key: r["seconds_mean"] for key, r in by_name.items()}
    out: List[Dict[str, Any]] = []
    for bs in sorted({r["batch_size"] for r in rows}):
        for name, runs in sweep.runs.items():
            reference = sweep.runs[sweep.reference[sweep.drafter[name]]]
            gammas = [g for g in runs if g in reference]
            ref = {g: seconds[(reference[g], bs)] for g in gammas}
            mine = {g: seconds[(runs[g], bs)] for g in gammas}
            if name == sweep.reference[sweep.drafter[name]]:  # its speed over gamma around its mean
                speed = [1.0 / mine[g] for g in gammas]
                vs_fixed = mean_std([s / statistics.fmean(speed) for s in speed])
            else:
                vs_fixed = mean_std([ref[g] / mine[g] for g in gammas])
            best = min(ref.values())
            record = {
                "config": name,
                "drafter": sweep.drafter[name],
                "batch_size": bs,
                "gammas": gammas,
                "speedup_vs_fixed": vs_fixed[0],
                "speedup_vs_fixed_std": vs_fixed[1],
                "speedup_vs_best_fixed": statistics.fmean(best / mine[g] for g in gammas),
                "best_fixed_gamma": min(gammas, key=lambda g: ref[g]),
                "speedup_vs_greedy": statistics.fmean(seconds[(GREEDY, bs)] / mine[g] for g in gammas),
                "speedup_vs_loop_greedy": (statistics.fmean(seconds[(LOOP, bs)] / mine[g] for g in gammas)
                                           if (LOOP, bs) in seconds else None),
                "mean_accepted_tokens": statistics.fmean(by_name[(runs[g], bs)]["mean_accepted_tokens"] for g in gammas),
                "mean_k": statistics.fmean(by_name[(runs[g], bs)]["mean_k"] for g in gammas),
                "speedup_vs_greedy_by_gamma": {g: seconds[(GREEDY, bs)] / mine[g] for g in gammas},
            }
            out.append(record)
    return out


def summary_table(summary: Sequence[Mapping[str, Any]]) -> str:
    """The markdown tables of the summary: one per batch size, then speed-up over greedy by gamma."""
    parts = []
    for bs in sorted({r["batch_size"] for r in summary}):
        chosen = [r for r in summary if r["batch_size"] == bs]
        lines = [f"Batch size {bs}: speed-up over the fixed length at the same initial gamma (mean ± sd over gamma), "
                 "and means over gamma",
                 "",
                 "| configuration | drafter | × fixed γ | × best fixed γ | × fairseq greedy | × loop-greedy | "
                 "tokens/iter | k sent |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in chosen:
            loop = "n/a" if r["speedup_vs_loop_greedy"] is None else f"{r['speedup_vs_loop_greedy']:.2f}×"
            lines.append(f"| {r['config']} | {r['drafter']} | {r['speedup_vs_fixed']:.2f} ± {r['speedup_vs_fixed_std']:.2f}× | "
                         f"{r['speedup_vs_best_fixed']:.2f}× (γ {r['best_fixed_gamma']}) | {r['speedup_vs_greedy']:.2f}× | "
                         f"{loop} | {r['mean_accepted_tokens']:.2f} | {r['mean_k']:.2f} |")
        gammas = sorted({g for r in chosen for g in r["gammas"]})
        lines += ["", f"Batch size {bs}: speed-up over fairseq greedy at each initial gamma", "",
                  "| configuration | " + " | ".join(f"γ {g}" for g in gammas) + " |",
                  "|---|" + "---|" * len(gammas)]
        for r in chosen:
            cells = [f"{r['speedup_vs_greedy_by_gamma'][g]:.2f}" if g in r["speedup_vs_greedy_by_gamma"] else ""
                     for g in gammas]
            lines.append(f"| {r['config']} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
