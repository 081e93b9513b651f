"""``cmasd-tune``: grid search of CM-ASD's knobs on a validation split.

    cmasd-tune DATA --path VERIFIER.pt --drafter-path DRAFTER.pt \\
        [--gen-subset valid] [--alpha 0.5,0.75,1.0] [--tau-base 0.0,0.1,0.3] \\
        [--gamma 0.0,0.5,1.0,2.0] [--k-min 1,2] [--k-max 10,25] \\
        [--batch-size 1] [--max-sentences N] [--out-dir checkpoints/tune]

Every grid point is full CM-ASD (adaptive k, adaptive tau, ensemble confidence; the
``cmasd`` configuration of ``cmasd-bench``) with ``cmasd_alpha``, ``cmasd_tau_base``,
``cmasd_gamma``, ``spec_k_min`` and ``spec_k_max`` set to the point's values (``--set``
fixes any other option for all points). One process loads the models and the split once
and measures greedy and every point exactly as ``cmasd-bench`` does (warm-up, then
interleaved repetitions, only ``generate`` timed). Points with k_min > k_max, or k_max
larger than the drafter's block, are left out with a note.

Writes ``tune.json`` (every point: options, quality, seconds, speed-up over greedy and
whether it is on the front), ``tune.md`` and ``tune.png`` (speed-up against quality, the
front highlighted) under ``--out-dir``, and prints the speed-versus-quality Pareto front:
the points no other point beats in both speed-up and quality. Quality is BLEU, or ROUGE-L
with ``--metric rouge`` (every point's row in ``tune.json`` also has ROUGE-1, ROUGE-2 and
ROUGE-Lsum).
"""

import itertools
import logging
import os
from typing import Any, Dict, List, Sequence

from cmasd.tools import bench
from cmasd.tools.bench.configs import BenchConfig, BenchError

PROG = "cmasd-tune"
logger = logging.getLogger("cmasd.tune")

# (SpeculativeDecodingConfig field, option, type, default values, short name)
GRID = [
    ("cmasd_alpha", "--alpha", float, "0.5,0.75,1.0", "a"),
    ("cmasd_tau_base", "--tau-base", float, "0.0,0.1,0.3", "tb"),
    ("cmasd_gamma", "--gamma", float, "0.0,0.5,1.0,2.0", "g"),
    ("spec_k_min", "--k-min", int, "1,2", "kmin"),
    ("spec_k_max", "--k-max", int, "10,25", "kmax"),
]
# The quality axis of the front, per --metric: named, not the last of the bench's quality
# columns (with --metric rouge those end in rougeLsum, which tune.json's rows keep beside it).
FRONT_QUALITY = {"bleu": "bleu", "rouge": "rougeL"}


def build_parser():
    parser = bench.Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    bench.add_common_args(parser, gen_subset="valid")
    for _, option, _, default, _ in GRID:
        parser.add_argument(option, default=default, help="comma-separated values (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=1, help="default: %(default)s")
    parser.add_argument("--out-dir", default=os.path.join("checkpoints", "tune"), help="default: %(default)s")
    parser.add_argument("--no-plot", action="store_true", help="do not write tune.png")
    parser.set_defaults(repeats=1)
    return parser


def parse_values(text: str, kind, option: str) -> List[Any]:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BenchError(f"{option}: expected comma-separated {kind.__name__} values, got {text!r}") from None
    if not values:
        raise BenchError(f"{option}: no values")
    return list(dict.fromkeys(values))


def grid_points(args, block: int) -> List[Dict[str, Any]]:
    """Every valid combination of the grid's values (field -> value)."""
    axes = [[(key, v) for v in parse_values(getattr(args, option[2:].replace("-", "_")), kind, option)]
            for key, option, kind, _, _ in GRID]
    points = []
    for combo in itertools.product(*axes):
        point = dict(combo)
        if point["spec_k_min"] > point["spec_k_max"]:
            continue
        if point["spec_k_max"] > block:
            logger.warning(f"leaving out k_max={point['spec_k_max']}: larger than the drafter's block ({block})")
            continue
        points.append(point)
    if not points:
        raise BenchError("no valid grid point (k_min <= k_max <= the drafter's block)")
    return points


def point_name(point: Dict[str, Any]) -> str:
    short = {key: name for key, _, _, _, name in GRID}
    return " ".join(f"{short[k]}={v:g}" for k, v in point.items())


def point_config(point: Dict[str, Any]) -> BenchConfig:
    """Full CM-ASD with the point's values."""
    return BenchConfig(point_name(point), "grid point of cmasd-tune", overrides={**bench.FULL_CMASD, **point},
                       drafter="spec")


def dominates(a: Dict[str, Any], b: Dict[str, Any], quality: str) -> bool:
    """``a`` is at least as fast and as good as ``b``, and better in one."""
    at_least = a["speedup_vs_greedy"] >= b["speedup_vs_greedy"] and a[quality] >= b[quality]
    better = a["speedup_vs_greedy"] > b["speedup_vs_greedy"] or a[quality] > b[quality]
    return at_least and better


def pareto_front(rows: Sequence[Dict[str, Any]], quality: str) -> List[Dict[str, Any]]:
    """The rows no other row dominates, fastest first."""
    front = [r for r in rows if not any(dominates(o, r, quality) for o in rows)]
    return sorted(front, key=lambda r: -r["speedup_vs_greedy"])


def front_table(rows: Sequence[Dict[str, Any]], quality: str) -> str:
    header = ["point", "alpha", "tau_base", "gamma", "k_min", "k_max", quality, "BLEU vs greedy",
              "tok/iter", "mean k", "seconds", "× greedy"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        o = r["options"]
        cells = [r["config"], f"{o['cmasd_alpha']:g}", f"{o['cmasd_tau_base']:g}", f"{o['cmasd_gamma']:g}",
                 str(o["spec_k_min"]), str(o["spec_k_max"]), f"{r[quality]:.2f}", f"{r['bleu_vs_greedy']:.2f}",
                 f"{r['mean_accepted_tokens']:.2f}", f"{r['mean_k']:.2f}",
                 f"{r['seconds_mean']:.3f} ± {r['seconds_std']:.3f}",
                 f"{r['speedup_vs_greedy']:.2f}× ± {r['speedup_vs_greedy_std']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_front(rows, front, greedy, quality: str, path: str) -> None:
    """Speed-up over greedy against quality; the front highlighted, greedy marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    ax.scatter([r["speedup_vs_greedy"] for r in rows], [r[quality] for r in rows], s=14, alpha=0.5, label="grid point")
    ax.plot([r["speedup_vs_greedy"] for r in front], [r[quality] for r in front], "o-", color="C3", label="Pareto front")
    ax.scatter([1.0], [greedy[quality]], marker="*", s=120, color="k", label="greedy", zorder=3)
    ax.set_xlabel("speed-up over greedy (same batch size)")
    ax.set_ylabel(quality)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args) -> None:
    global_overrides = bench.parse_assignments(args.overrides)
    if args.batch_size < 1:
        raise BenchError(f"--batch-size: must be >= 1, got {args.batch_size}")
    tuned = {key for key, *_ in GRID} & set(global_overrides)
    if tuned:
        raise BenchError(f"--set {', '.join(sorted(tuned))}: tuned by the grid; use the grid options instead")
    runner = bench.prepare(args, [bench.CONFIGS["cmasd"]])  # every grid point drafts with the Spec-Drafter
    points = grid_points(args, runner.setup.drafters["spec"].block_size)
    logger.info(f"{len(points)} grid points at batch size {args.batch_size}")
    configs = [bench.CONFIGS[bench.GREEDY]] + [point_config(p) for p in points]
    rows = bench.run_configs(runner, args, configs, [args.batch_size], global_overrides)

    quality = FRONT_QUALITY[args.metric]
    point_rows = [r for r in rows if r["kind"] == "speculative"]
    for r in point_rows:
        r["options"] = bench.options_dict(bench.spec_options(
            next(c for c in configs if c.name == r["config"]), global_overrides, bench.drafter_paths(args)))
    front = pareto_front(point_rows, quality)
    for r in point_rows:
        r["on_front"] = r in front
    greedy = next(r for r in rows if r["config"] == bench.GREEDY)

    os.makedirs(args.out_dir, exist_ok=True)
    table = front_table(front, quality)
    with open(os.path.join(args.out_dir, "tune.md"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    others = [r for r in rows if r["kind"] != "speculative"]  # greedy and the floor
    record = bench.report_record(args, runner, configs, global_overrides, others, {
        "batch_size": args.batch_size,
        "quality": quality,
        "greedy": greedy,
        "points": point_rows,
        "front": [r["config"] for r in front],
    })
    del record["configs"]  # the options are in each point
    bench.write_json(os.path.join(args.out_dir, "tune.json"), record)
    if not args.no_plot:
        plot_front(point_rows, front, greedy, quality, os.path.join(args.out_dir, "tune.png"))
    print(f"greedy: {quality} {greedy[quality]:.2f}, {greedy['seconds_mean']:.3f} s")
    print(f"Pareto front ({len(front)} of {len(point_rows)} points):")
    print(table)


def cli_main() -> None:
    bench.run_cli(build_parser(), main)


if __name__ == "__main__":
    cli_main()
