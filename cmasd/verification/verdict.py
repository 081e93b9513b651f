"""Measured goodput: whether the iterations that drafted have gained more tokens per second
than the iterations that did not, for each power of two of rows active.

A cost-aware controller plans from a model of an iteration: a cost table, a timing
correction, each row's acceptance. What the model leaves out shows only in the clock and
in the tokens rows gain: a draft model that first catches up on the tokens accepted while it
idled, the two models' weights evicting each other from the caches, plans made again as
rows finish. At batch 16 on Multi30k ``goodput`` drafted now and then and ran at 0.91-0.95x
``loop-greedy``, slower than drafting nothing (about 0.98x) and than drafting one token
every iteration (0.93-0.98x): the switching costs what neither pure plan pays
(docs/results/speculation-pays.md). A ``Verdict`` keeps, for idle and for drafting
iterations of each row count, moving averages of the tokens an iteration gained and of its
seconds, and says "idle" where drafting iterations' tokens per second (a ratio of the
averages: the average of per-iteration rates would undervalue the iterations that gain
many tokens) fall below idle ones', once each kind has been seen ``minimum`` times. A
controller that heeds it plans nothing there but its probes, whose iterations keep the
drafting average current: a probe that gains more tokens per second than idling restarts it,
and drafting resumes.
"""

from typing import List

# the newest iteration's weight in each moving average: at 0.1 (until the twenty-ninth session)
# a hard sentence's few drafting iterations could stop drafting at batch 1 where it paid (two
# identical controllers drafted k 3.95 and 2.98 a row-iteration on Multi30k); paired against
# 0.03 on seven splits and batch sizes, 0.03 was never slower, 2.8% faster there
# (docs/results/speculation-pays.md, twenty-ninth session)
WEIGHT = 0.03
MINIMUM = 8  # iterations of each kind at a row count before a verdict is given there
BUCKETS = 8  # row counts: 1, 2-3, 4-7, ..., 128 and more (goodput's timing corrections' too)


def bucket(rows: int) -> int:
    """The row bucket of ``rows`` rows (the verdict's and goodput's timing corrections'):
    floor(log2(rows)), at most ``BUCKETS`` - 1."""
    return min(max(rows, 1).bit_length() - 1, BUCKETS - 1)


class Verdict:
    """Tokens per second of idle and drafting iterations, by row count (see the module)."""

    def __init__(self, weight: float = WEIGHT, minimum: int = MINIMUM):
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"weight: must be in (0, 1], got {weight:g}")
        self.weight, self.minimum = weight, minimum
        # per bucket, [idle, drafting]: moving averages of tokens and of seconds, and counts
        # (plain lists: read and written every iteration)
        self.tokens: List[List[float]] = [[0.0, 0.0] for _ in range(BUCKETS)]
        self.seconds: List[List[float]] = [[0.0, 0.0] for _ in range(BUCKETS)]
        self.seen: List[List[int]] = [[0, 0] for _ in range(BUCKETS)]

    def record(self, rows: int, drafted: bool, tokens: float, seconds: float, n: int = 1) -> None:
        """One iteration of ``rows`` rows that gained ``tokens`` tokens in ``seconds``
        (``drafted``: whether a draft pass ran); with ``n`` > 1, the mean of n such
        iterations, weighed as n iterations alike would be. The first of each kind sets the averages,
        and so does a drafting iteration that gained more tokens per second than the idle
        average where the verdict idles (a probe that paid): drafting resumes at once, where
        averaging it in would take a dozen probes at doubling periods, and if it was luck
        the drafting iterations after it bring the verdict back within two or three."""
        if seconds <= 0.0:
            return
        b, kind = bucket(rows), int(drafted)
        w = 1.0 if self.seen[b][kind] == 0 else self.weight if n == 1 else 1.0 - (1.0 - self.weight) ** n
        if drafted and self.idles(rows) and tokens * self.seconds[b][0] > self.tokens[b][0] * seconds:
            w = 1.0  # a probe that beat the idle iterations restarts the drafting averages (``record``)
        self.tokens[b][kind] += w * (tokens - self.tokens[b][kind])
        self.seconds[b][kind] += w * (seconds - self.seconds[b][kind])
        self.seen[b][kind] += n

    def rate(self, rows: int, drafted: bool) -> float:
        """Tokens per second of such iterations (0 where none was seen)."""
        b, kind = bucket(rows), int(drafted)
        return self.tokens[b][kind] / self.seconds[b][kind] if self.seen[b][kind] else 0.0

    def idles(self, rows: int) -> bool:
        """Whether drafting iterations of ``rows`` rows have gained fewer tokens per second
        than idle ones (False until each kind was seen ``minimum`` times)."""
        b = bucket(rows)
        if min(self.seen[b]) < self.minimum:
            return False
        # tokens_1 / seconds_1 < tokens_0 / seconds_0, without the divisions
        return self.tokens[b][1] * self.seconds[b][0] < self.tokens[b][0] * self.seconds[b][1]
