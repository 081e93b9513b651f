"""What an iteration costs on this machine: the record a cost-aware controller plans with.

An iteration of the loop drafts (the drafter's pass, or its steps, for the longest draft
any row sends), verifies (one verifier pass over every row's last token and its drafts)
and keeps its books. ``Costs`` holds those seconds as measured for the loaded models
(``cmasd.decoding.calibration`` measures them; ``cmasd-bench --calibrate`` prints and saves
them; ``--spec-costs FILE`` reads a saved table):

* ``verify[i][j]``: a verify pass of ``rows[i]`` rows sending ``widths[j]`` positions each
  (the last accepted token and ``widths[j] - 1`` drafts);
* ``draft[i][k]``: drafting ``k`` positions for ``rows[i]`` rows (``k`` = 0 .. horizon;
  ``draft[i][0]`` is 0: the loop does not call a drafter nobody asked for anything);
* ``overhead[i]``: the rest of an iteration of ``rows[i]`` rows (acceptance, appending,
  statistics).

``order`` says how the parts were timed: ``apart`` (each after a run of the same model: its
weights in the CPU's caches; the default) or ``loop`` (each after the part the loop runs before
it: a verify pass after the draft it checks, a draft after a verify pass; the other model's
weights have then left the CPU's caches); empty in a table saved before the order was recorded.
``schedule`` says in what sequence the runs were timed: ``rounds`` (every part once in turn,
repeated, so that a slow spell of the machine lands on all parts alike) or ``blocks`` (each
part's runs together; every table before 2026-12-06, whose ``schedule`` is empty).

``speedup``, ``best_k`` and ``break_even`` read the table for the question a user asks before
training a drafter: what could drafting gain on this machine at all? A row sending k
drafts, each accepted with probability a independently (the model of Leviathan et al.,
"Fast Inference from Transformers via Speculative Decoding", arXiv:2211.17192, Sec. 3.1),
gains 1 + a + ... + a^k tokens in expectation; every row sending k, an iteration of ``rows``
rows then gains that many times ``rows`` tokens in the seconds of its draft, its verify pass
over ``rows`` x (k + 1) positions and its overhead. Against an iteration drafting nothing,
at a = 1 with drafts that cost nothing, that is the most any drafter could gain here (the
*ceiling*): where a verify pass of k + 1 positions a row costs k + 1 times one position (the
machine bound by arithmetic, as two CPU cores are at 16 rows), no drafter gains anything.
``format`` prints them under the table. They are per iteration of a full batch: in decoding
rows finish, and passes of fewer rows cost less a position.

Between the measured grid points the table interpolates linearly, and beyond the largest
row count or width it extrapolates from the last two points (a pass costs at least as much
as the largest one measured). A verify pass whose rows send different widths is costed
as the number of positions it scores: ``ragged`` says whether the verifier scores only the
positions rows send (``cmasd.layers.cache``'s ragged blocks) or the widest row's block for
every row.
"""

import bisect
import json
import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence, Tuple

from cmasd.errors import UsageError

FORMAT = "cmasd-costs-v1"  # the "format" field of a saved table
ORDERS = ("loop", "apart")  # how a table's parts were timed (see the module)
SCHEDULES = ("rounds", "blocks")  # in what sequence their runs were timed (see the module)
SHOWN_ACCEPTANCES = (1.0, 0.9, 0.8, 0.7)  # the acceptances ``format`` gives the drafter's gain at
BREAK_EVEN_TOLERANCE = 1e-3  # ``break_even`` finds the acceptance to within this


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """y at x, piecewise linear through (xs, ys) (xs increasing); beyond the ends, the line
    through the nearest two points, never below the nearest point's y."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if x > xs[-1]:
        return max(y, ys[-1])
    if x < xs[0]:
        return max(y, 0.0)
    return y


@dataclass(frozen=True)
class Costs:
    """Seconds of an iteration's parts, measured on a grid of row counts (see the module)."""

    rows: Tuple[int, ...]  # row counts measured, increasing
    widths: Tuple[int, ...]  # positions per row of the verify passes measured, increasing from 1
    verify: Tuple[Tuple[float, ...], ...]  # (rows, widths) seconds per verify pass
    draft: Tuple[Tuple[float, ...], ...]  # (rows, horizon + 1) seconds to draft k = 0 .. horizon positions
    overhead: Tuple[float, ...]  # (rows,) seconds of an iteration besides drafting and verifying
    ragged: bool = False  # a verify pass costs the positions rows send, not rows x the widest block
    device: str = ""  # what measured it (the CPU's model name, threads), for the reader
    order: str = ""  # how the parts were timed: one of ORDERS ("": not recorded)
    schedule: str = ""  # in what sequence: one of SCHEDULES ("": not recorded, blocks)

    def __post_init__(self):
        check(self)

    @property
    def horizon(self) -> int:
        """The longest draft measured."""
        return len(self.draft[0]) - 1

    def verify_seconds(self, rows: int, positions: float) -> float:
        """A verify pass of ``rows`` rows scoring ``positions`` positions in all (at least
        one per row)."""
        return self._by_rows(rows, lambda i: interpolate(self.widths, self.verify[i], positions / rows))

    def draft_seconds(self, rows: int, k: int) -> float:
        """Drafting ``k`` positions (the longest draft of the iteration) for ``rows`` rows."""
        if k <= 0:
            return 0.0
        return self._by_rows(rows, lambda i: interpolate(range(len(self.draft[i])), self.draft[i], k))

    def overhead_seconds(self, rows: int) -> float:
        return self._by_rows(rows, lambda i: self.overhead[i])

    def _by_rows(self, rows: int, at) -> float:
        """``at(i)`` for the measured row counts, interpolated over them at ``rows``."""
        return interpolate(self.rows, [at(i) for i in range(len(self.rows))], rows)

    def speedup(self, rows: int, k: int, acceptance: float = 1.0, drafts: bool = True) -> float:
        """How many times the tokens per second of an iteration drafting nothing an
        iteration of ``rows`` rows gains where every row sends ``k`` drafts, each accepted
        with probability ``acceptance`` (see the module); ``drafts`` False: drafting costs
        nothing (the ceiling of any drafter)."""
        if not 0.0 <= acceptance <= 1.0:
            raise UsageError(f"acceptance must be in [0, 1], got {acceptance:g}")
        if not 0 <= k <= self.horizon:
            raise UsageError(f"draft length must be in 0 .. {self.horizon} (the table's horizon), got {k}")
        tokens = sum(acceptance ** j for j in range(k + 1))  # expected tokens a row gains
        overhead = self.overhead_seconds(rows)
        idle = self.verify_seconds(rows, rows) + overhead
        seconds = self.verify_seconds(rows, rows * (k + 1)) + overhead
        if drafts:
            seconds += self.draft_seconds(rows, k)
        return tokens * idle / seconds

    def best_k(self, rows: int, acceptance: float = 1.0, drafts: bool = True) -> Tuple[int, float]:
        """The k in 0 .. horizon with the largest ``speedup`` and that speed-up (the
        shortest of equals; k = 0, 1.0 where no draft length gains)."""
        best = (0, 1.0)
        for k in range(1, self.horizon + 1):
            gain = self.speedup(rows, k, acceptance, drafts)
            if gain > best[1]:
                best = (k, gain)
        return best

    def break_even(self, rows: int, drafts: bool = True) -> Optional[float]:
        """The lowest acceptance at which some draft length gains over drafting nothing for
        ``rows`` rows, to ``BREAK_EVEN_TOLERANCE`` (the gain grows with the acceptance at
        every k, so bisection finds it); None where none gains even at acceptance 1."""
        if self.best_k(rows, 1.0, drafts)[0] == 0:
            return None
        low, high = 0.0, 1.0  # no k gains at low; some k gains at high
        while high - low > BREAK_EVEN_TOLERANCE:
            middle = (low + high) / 2
            low, high = (low, middle) if self.best_k(rows, middle, drafts)[0] else (middle, high)
        return high

    def format_gains(self) -> str:
        """``best_k`` and ``break_even`` for each row count measured, as text (see the module)."""
        cell = 11  # "12.34x k=8" and a space
        shown = "".join(f"{f'a={a:g}':<{cell}}" for a in SHOWN_ACCEPTANCES)
        lines = ["what drafting can gain here, x the tokens per second of drafting nothing (every row sending its "
                 "best k drafts, each accepted with probability a; a full batch, no row finished):",
                 f"{'rows':>5} | {'any drafter, free, a=1':<{cell * 2}} | this drafter: {shown}| pays from a ="]
        for rows in self.rows:
            ceiling = self.best_k(rows, 1.0, drafts=False)
            gains = "".join(f"{f'{g:.2f}x k={k}':<{cell}}" for k, g in (self.best_k(rows, a) for a in SHOWN_ACCEPTANCES))
            even = self.break_even(rows)
            lines.append(f"{rows:>5} | {f'{ceiling[1]:.2f}x k={ceiling[0]}':<{cell * 2}} | {'':14}{gains}| "
                         f"{'never' if even is None else f'{even:.3f}'}")
        return "\n".join(lines)

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT, **asdict(self)}, f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str) -> "Costs":
        """A table ``save`` wrote; anything else is refused, naming the file and the problem."""
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise UsageError(f"--spec-costs {path}: no such file (write one with cmasd-bench --calibrate)") from None
        except (OSError, ValueError) as e:
            raise UsageError(f"--spec-costs {path}: not a cost table: {e}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise UsageError(f"--spec-costs {path}: not a cost table of this cmasd (format {FORMAT!r}; write one "
                             "with cmasd-bench --calibrate)")
        try:
            return cls(tuple(data["rows"]), tuple(data["widths"]), tuple(map(tuple, data["verify"])),
                       tuple(map(tuple, data["draft"])), tuple(data["overhead"]), bool(data.get("ragged", False)),
                       str(data.get("device", "")), str(data.get("order", "")), str(data.get("schedule", "")))
        except (KeyError, TypeError) as e:
            raise UsageError(f"--spec-costs {path}: malformed cost table ({type(e).__name__}: {e})") from None
        except UsageError as e:
            raise UsageError(f"--spec-costs {path}: {e}") from None

    def format(self) -> str:
        """The table as text, milliseconds: one line per row count."""
        timed = f"; parts timed {'in the loop' if self.order == 'loop' else 'apart'}" if self.order else ""
        timed += f", in {self.schedule}" if self.schedule else ""
        lines = [f"costs ({self.device or 'this machine'}; verify {'ragged' if self.ragged else 'padded'}{timed}), ms"]
        head = " ".join(f"w={w:<5d}" for w in self.widths)
        lines.append(f"{'rows':>5} | verify pass: {head} | draft k=1..{self.horizon} | overhead")
        for i, rows in enumerate(self.rows):
            verify = " ".join(f"{1e3 * s:7.3f}" for s in self.verify[i])
            draft = " ".join(f"{1e3 * s:.3f}" for s in self.draft[i][1:])
            lines.append(f"{rows:>5} | {'':13}{verify} | {draft} | {1e3 * self.overhead[i]:.3f}")
        return "\n".join(lines) + "\n" + self.format_gains()


def check(costs: Costs) -> None:
    """Refuse a table that cannot describe a machine: empty or unordered grids, shapes
    that do not match, negative, infinite or NaN seconds, a verify pass that costs nothing."""
    def increasing(name, values, low):
        if not values or any(not isinstance(v, int) or v < low for v in values) or list(values) != sorted(set(values)):
            raise UsageError(f"cost table: {name} must be increasing integers >= {low}, got {list(values)}")

    if costs.order not in ("", *ORDERS):
        raise UsageError(f"cost table: order must be one of {', '.join(ORDERS)}, got {costs.order!r}")
    if costs.schedule not in ("", *SCHEDULES):
        raise UsageError(f"cost table: schedule must be one of {', '.join(SCHEDULES)}, got {costs.schedule!r}")
    increasing("rows", costs.rows, 1)
    increasing("widths", costs.widths, 1)
    if costs.widths[0] != 1:
        raise UsageError(f"cost table: widths must start at 1 (a pass of the last tokens alone), got {list(costs.widths)}")
    shapes = (("verify", costs.verify, len(costs.widths)), ("draft", costs.draft, None))
    for name, table, width in shapes:
        if len(table) != len(costs.rows):
            raise UsageError(f"cost table: {name} has {len(table)} lines for {len(costs.rows)} row counts")
        lengths = {len(line) for line in table}
        if len(lengths) != 1 or (width is not None and lengths != {width}) or min(lengths) < 1:
            raise UsageError(f"cost table: {name} lines must all have {width or 'the same number of'} entries")
    if len(costs.overhead) != len(costs.rows):
        raise UsageError(f"cost table: overhead has {len(costs.overhead)} entries for {len(costs.rows)} row counts")
    values = [s for line in costs.verify + costs.draft for s in line] + list(costs.overhead)
    if any(not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0 for s in values):
        raise UsageError("cost table: every cost must be a finite number of seconds >= 0")
    if any(s <= 0 for line in costs.verify for s in line):
        raise UsageError("cost table: a verify pass cannot cost 0 seconds")
