"""Timing: decoding the split with every configuration, the floor, warm-up and interleaved repetitions."""

import json
import logging
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from cmasd.compat import pin_beam_size
from cmasd.decoding.generator import SpeculativeGenerator
from cmasd.decoding.stats import DecodeStats
from cmasd.tools.bench.configs import FLOOR, GREEDY
from cmasd.tools.bench.floor import teacher_forced_input
from cmasd.tools.bench.loading import PROMPT_BATCH, Setup

logger = logging.getLogger("cmasd.bench")


# --------------------------------------------------------------------------- timing


def clock(device: torch.device) -> float:
    """``perf_counter`` after the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def best_tokens(sample, hypos) -> Dict[int, List[int]]:
    """Sentence id -> token ids of the best hypothesis (eos included; [] if none); of a
    language model's, the continuation: the hypothesis after its prompt."""
    prompts = sample.get(PROMPT_BATCH)
    skip = prompts.lengths if prompts is not None else [0] * len(hypos)
    return {
        int(sid): (hypos[b][0]["tokens"][skip[b]:].tolist() if hypos[b] else [])
        for b, sid in enumerate(sample["id"].tolist())
    }


@dataclass
class Run:
    """One recorded or unrecorded pass of one configuration at one batch size."""

    batch_seconds: List[float]  # of each batch, in order
    hypotheses: Optional[Dict[int, List[int]]] = None  # None for the floor
    batch_longest: Optional[List[int]] = None  # longest output of each batch; None for the floor
    stats: Optional[Dict[str, Any]] = None  # the speculative generator's summary

    @property
    def seconds(self) -> float:
        return sum(self.batch_seconds)


def decode_split(generator, setup: Setup, batches) -> Run:
    """Decode every batch; only the ``generate`` (fairseq) or ``decode`` (speculative)
    calls are timed, with a language model's prompts as fairseq's ``inference_step`` hands
    them over (``PromptBatch``). A speculative generator's statistics are those of these calls."""
    speculative = isinstance(generator, SpeculativeGenerator)
    stats = DecodeStats()
    batch_seconds, hypotheses, longest = [], {}, []
    if not speculative:
        pin_beam_size(generator, setup.model)  # fairseq's: the beam of the last generator built
    for sample in batches:
        kwargs = sample[PROMPT_BATCH].kwargs if PROMPT_BATCH in sample else {}
        start = clock(setup.device)
        if speculative:
            hypos, batch_stats = generator.decode(sample, **kwargs)
        else:
            hypos = generator.generate([setup.model], sample, **kwargs)
        batch_seconds.append(clock(setup.device) - start)
        if speculative:
            stats.add(batch_stats)
        best = best_tokens(sample, hypos)
        hypotheses.update(best)
        longest.append(max(len(tokens) for tokens in best.values()))
    return Run(batch_seconds, hypotheses, longest, stats.summary() if speculative else None)


def score_split(setup: Setup, inputs: Sequence[Dict[str, Any]]) -> Run:
    """The floor: one teacher-forced verifier pass per batch, timed."""
    batch_seconds = []
    for net_input in inputs:
        start = clock(setup.device)
        setup.floor(net_input)
        batch_seconds.append(clock(setup.device) - start)
    return Run(batch_seconds)


@dataclass
class Measurements:
    """Every recorded run: (name, batch size) -> one Run per repetition."""

    runs: Dict[Tuple[str, int], List[Run]] = field(default_factory=lambda: defaultdict(list))

    def seconds(self, name: str, bs: int) -> List[float]:
        return [r.seconds for r in self.runs[(name, bs)]]

    def first(self, name: str, bs: int) -> Run:
        return self.runs[(name, bs)][0]

    def batch_seconds(self, name: str, bs: int) -> List[float]:
        """Seconds of each batch, mean over repetitions."""
        return [statistics.fmean(batch) for batch in zip(*(r.batch_seconds for r in self.runs[(name, bs)]))]


def reseed(generator, seed: int) -> None:
    """Seed the draws of ``generator``'s next pass: the speculative generator's per-sentence
    uniforms, and torch's global generator, which fairseq's sampling draws from (as
    fairseq-generate seeds it with ``--seed``)."""
    torch.manual_seed(seed)
    if isinstance(generator, SpeculativeGenerator):
        generator.seed = seed


def measure_all(setup: Setup, generators: Mapping[str, Any], batches: Mapping[int, list], warmup: int,
                repeats: int, warmup_batches: int = 0, seeds: Optional[Sequence[int]] = None,
                journal: Optional[str] = None) -> Measurements:
    """``warmup`` unrecorded passes (over the first ``warmup_batches`` batches of each
    batch size; 0: all), then ``repeats`` recorded passes; each pass runs every
    configuration and the floor at every batch size. ``seeds`` (sampling): the seed of
    each recorded pass (the warm-up uses the first). ``journal``: a file that gets one JSON
    line per recorded run as it ends, so that a bench stopped midway keeps what it measured."""
    tgt_dict = setup.task.target_dictionary
    floor_inputs: Dict[int, list] = {}
    out = Measurements()

    def whole(n: int) -> bool:  # pass n decodes every batch
        return n >= warmup or not warmup_batches

    def passed(n: int, bs: int) -> list:
        return batches[bs] if whole(n) else batches[bs][:warmup_batches]

    # the progress bar counts the sentences of every run, the floor's included (it follows a
    # whole pass of greedy's)
    if journal is not None:
        open(journal, "w").close()
    progress = Progress(sum(sentences(passed(n, bs)) * (len(generators) + (GREEDY in generators and whole(n)))
                            for n in range(warmup + repeats) for bs in batches))
    for n in range(warmup + repeats):
        recorded = n >= warmup
        label = f"rep {n - warmup + 1}/{repeats}" if recorded else f"warm-up {n + 1}/{warmup}"
        for bs, all_batches in batches.items():
            bs_batches = passed(n, bs)
            for name, generator in generators.items():
                if seeds is not None:
                    reseed(generator, seeds[max(n - warmup, 0)])
                run = decode_split(generator, setup, bs_batches)
                if bs not in floor_inputs and name == GREEDY and bs_batches is all_batches:
                    floor_inputs[bs] = [
                        teacher_forced_input(s, run.hypotheses, tgt_dict.eos(), tgt_dict.pad(), PROMPT_BATCH in s)
                        for s in bs_batches
                    ]
                log_run(label, name, bs, run, recorded, out, progress.advance(sentences(bs_batches)), journal)
            if bs in floor_inputs:
                floor_batches = floor_inputs[bs][: len(bs_batches)]
                log_run(label, FLOOR, bs, score_split(setup, floor_batches), recorded, out,
                        progress.advance(sentences(bs_batches)), journal)
    return out


def write_journal(path: str, repetition: int, name: str, bs: int, run: Run) -> None:
    """One recorded run as a JSON line: its seconds, sentences and (decoders) output tokens."""
    line = {"config": name, "batch_size": bs, "repetition": repetition, "seconds": run.seconds,
            "batches": len(run.batch_seconds)}
    if run.hypotheses is not None:
        line["sentences"] = len(run.hypotheses)
        line["tokens"] = sum(len(tokens) for tokens in run.hypotheses.values())
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def sentences(batches) -> int:
    return sum(len(sample["id"]) for sample in batches)


class Progress:
    """Sentences decoded of all the bench's passes, drawn as ``cmasd.tools.progress``'s bar."""

    def __init__(self, total: int):
        self.total, self.done, self.started = total, 0, time.monotonic()

    def advance(self, n: int) -> str:
        from cmasd.tools.progress import bar

        self.done += n
        return bar(self.done, self.total, self.started, "sentences")


def log_run(label: str, name: str, bs: int, run: Run, recorded: bool, out: Measurements, progress: str = "",
            journal: Optional[str] = None) -> None:
    """Log a run; a recorded one is kept in ``out`` and, with a ``journal``, written to it."""
    logger.info(f"{label}: {name} at batch size {bs}: {run.seconds:.3f} s" + (f"; {progress}" if progress else ""))
    if recorded:
        out.runs[(name, bs)].append(run)
        if journal is not None:
            write_journal(journal, len(out.runs[(name, bs)]), name, bs, run)
