"""How much cost tables measured the same way disagree: saved tables (``cmasd-bench --calibrate``'s
``costs-NAME.json``) in groups, one group per way of measuring, e.g. tables of alternating
processes timed in rounds and in blocks (``--calibrate-schedule``):

    for i in 1 2 3 4; do for s in blocks rounds; do
        cmasd-bench DATA --path V --threads 2 --calibrate --calibrate-schedule $s \\
            --configs goodput-source --batch-sizes 1,16 --out-dir OUT/$s-$i; done; done
    python docs/probes/calibration_spread.py blocks=OUT/blocks-*/costs-goodput-source.json \\
        rounds=OUT/rounds-*/costs-goodput-source.json

For each group and row count it prints what goodput plans from: each width's verify pass as a
multiple of the 1-position pass (median over the tables, and the spread max / min - 1 across
them), the widths whose pass the table says costs less than the narrower one before it (noise:
a wider pass reads the same weights for more positions), and the acceptance drafting pays from
(``Costs.break_even``) in each table.
"""

import argparse
import statistics

from cmasd.core.costs import Costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("groups", nargs="+", help="LABEL=TABLE.json,TABLE.json,... or LABEL=TABLE.json repeated")
    args = ap.parse_args()
    groups = {}
    for item in args.groups:
        label, sep, paths = item.partition("=")
        if not sep or not paths:
            ap.error(f"expected LABEL=TABLE.json[,TABLE.json...], got {item!r}")
        groups.setdefault(label, []).extend(Costs.load(p) for p in paths.split(","))
    for label, tables in groups.items():
        rows = tables[0].rows
        if any(t.rows != rows or t.widths != tables[0].widths for t in tables):
            raise SystemExit(f"{label}: the tables measured different row counts or widths")
        print(f"{label}: {len(tables)} tables ({tables[0].device}; schedule {tables[0].schedule or 'blocks'})")
        for i, count in enumerate(rows):
            ratios = [[line / t.verify[i][0] for line in t.verify[i]] for t in tables]
            cells = []
            for j, width in enumerate(tables[0].widths[1:], start=1):
                column = [r[j] for r in ratios]
                cells.append(f"w{width} {statistics.median(column):.2f} ±{max(column) / min(column) - 1:.0%}")
            dips = sum(sum(t.verify[i][j] < t.verify[i][j - 1] for j in range(1, len(t.widths))) for t in tables)
            even = [t.break_even(count) for t in tables]
            shown = " ".join("never" if e is None else f"{e:.2f}" for e in even)
            print(f"  {count:>3} rows | {' | '.join(cells)}")
            print(f"          | 1-position pass {min(t.verify[i][0] for t in tables) * 1e3:.3f}-"
                  f"{max(t.verify[i][0] for t in tables) * 1e3:.3f} ms | wider pass cheaper: {dips} of "
                  f"{len(tables) * (len(tables[0].widths) - 1)} | pays from a = {shown}")


if __name__ == "__main__":
    main()
