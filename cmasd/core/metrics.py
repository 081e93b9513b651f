"""How a drafter's own statistics are reported.

A drafter puts per-row counts in ``Draft.metrics`` (name -> (B,)); the loop's statistics
(``cmasd.decoding.stats.DecodeStats``) add them up by name over a run without knowing
what they mean. A ``MetricReport`` says what they mean: the figures of the summary and
the phrase of the log line that it makes of the totals. The reports are listed once, with
the drafters (``cmasd.drafters.registry.METRIC_REPORTS``), and are reported whether or not
the run drafted with their drafter (a lookup's rate is then 0).
"""

import abc
from typing import Dict, Mapping


class MetricReport(abc.ABC):
    """The figures some drafter's metrics make."""

    @abc.abstractmethod
    def summary(self, totals: Mapping[str, int], iterations: int) -> Dict[str, object]:
        """Figures (name -> value; None where there is nothing to report) of the metric
        ``totals`` (a missing name: 0) of a run of ``iterations`` row-iterations."""

    @abc.abstractmethod
    def phrase(self, totals: Mapping[str, int], iterations: int) -> str:
        """The same figures in words, for the statistics' log line ("" for none)."""
