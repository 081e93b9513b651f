"""Progress for long shell pipelines (``data-prep/demo.sh``, ``data-prep/distill.sh``).

::

    fairseq-train ... 2>&1 | python -m cmasd.tools.progress train --log train.log --hours 0.4
    fairseq-generate ... | python -m cmasd.tools.progress count --total 29000 --out gen.txt --label train
    python -m cmasd.tools.progress run --peak-file peak.txt -- COMMAND ARGS...

``train`` keeps fairseq-train's whole output in ``--log`` and prints one line per epoch:
updates, training loss, the validation figures that matter (loss, perplexity, a drafter's
``exp_accept``), elapsed time and the time left under ``--hours`` / ``--max-update``;
fairseq's warnings, errors and stopping messages pass through. ``count`` copies its input to
``--out`` and draws a progress bar of the lines that match ``--pattern`` (fairseq-generate's
hypotheses) on stderr. ``run`` runs a command and writes the peak resident memory of its
largest process (MB, from the kernel's accounting of waited-for descendants) to
``--peak-file``, or leaves the file's larger figure there (a stage of several commands keeps
its largest); it exits with the command's status.
"""

import argparse
import re
import resource
import subprocess
import sys
import time
from typing import Dict, Optional, TextIO

LOG_LINE = re.compile(r"\| (train|valid) \| epoch (\d+) \| (.*)$")
PASS_THROUGH = re.compile(r"\| (WARNING|ERROR|CRITICAL) \||Stopping training|done training|^Traceback|Error: ")


def fields(text: str) -> Dict[str, str]:
    """fairseq's ``key value | key value`` log fields."""
    found = {}
    for part in text.split(" | "):
        key, _, value = part.strip().partition(" ")
        if value:
            found[key] = value
    return found


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def epoch_line(epoch: int, train: Dict[str, str], valid: Dict[str, str], hours: Optional[float],
               max_update: Optional[int]) -> str:
    """One line for one epoch of fairseq-train."""
    updates = int(float(train.get("num_updates", "0")))
    wall = float(train.get("wall", "0"))
    parts = [f"epoch {epoch}: {updates:,} updates", f"train loss {train.get('loss', '?')}"]
    if valid:
        parts.append(f"valid loss {valid.get('loss', '?')}" + (f" (ppl {valid['ppl']})" if "ppl" in valid else ""))
        if "exp_accept" in valid:
            parts.append(f"exp_accept {valid['exp_accept']}")
    parts.append(f"{minutes(wall)} elapsed")
    left = []
    if hours:
        left.append(max(hours * 3600 - wall, 0.0))
    ups = float(train.get("ups", "0") or 0)
    if max_update and ups > 0:
        left.append(max(max_update - updates, 0) / ups)
    if left:
        parts.append(f"about {minutes(min(left))} left")
    return ", ".join(parts)


def summarize_training(lines: TextIO, log: TextIO, out: TextIO, hours: Optional[float],
                       max_update: Optional[int]) -> None:
    valid: Dict[int, Dict[str, str]] = {}
    for line in lines:
        log.write(line)
        log.flush()
        match = LOG_LINE.search(line)
        if match:
            kind, epoch, rest = match.group(1), int(match.group(2)), match.group(3)
            if kind == "valid":
                valid[epoch] = fields(rest)
            else:
                print(epoch_line(epoch, fields(rest), valid.get(epoch, {}), hours, max_update), file=out, flush=True)
        elif PASS_THROUGH.search(line):
            print(line.rstrip("\n"), file=out, flush=True)


def bar(done: int, total: int, started: float, label: str) -> str:
    share = min(done / total, 1.0) if total else 0.0
    elapsed = time.monotonic() - started
    left = f", about {minutes(elapsed * (1 - share) / share)} left" if 0.05 <= share < 1 else ""
    filled = int(30 * share)
    return f"{label} [{'#' * filled}{'.' * (30 - filled)}] {done:,}/{total:,} ({minutes(elapsed)}{left})"


def count_lines(lines: TextIO, out: TextIO, err: TextIO, pattern: str, total: int, label: str) -> int:
    """Copy ``lines`` to ``out``; draw the bar of matching lines on ``err``: redrawn in place
    on a terminal, else a line at every tenth."""
    matcher, done, started = re.compile(pattern), 0, time.monotonic()
    tty, shown, last = err.isatty(), -1, 0.0
    for line in lines:
        out.write(line)
        if matcher.search(line):
            done += 1
            if tty and time.monotonic() - last > 0.5:
                err.write("\r" + bar(done, total, started, label))
                err.flush()
                last = time.monotonic()
            elif not tty and total and done * 10 // total != shown:
                shown = done * 10 // total
                print(bar(done, total, started, label), file=err, flush=True)
    out.flush()
    if tty or shown != 10:  # the final bar, unless the last tenth was just drawn
        err.write(("\r" if tty else "") + bar(done, total, started, label) + "\n")
        err.flush()
    return done


def run_measured(command, peak_file: str) -> int:
    """Run ``command``; write its largest process's peak resident memory (MB) to ``peak_file``
    unless the file already holds a larger figure (an earlier command of the same stage)."""
    try:
        status = subprocess.call(command)
    except KeyboardInterrupt:
        status = 130
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    try:
        with open(peak_file) as f:
            peak_mb = max(peak_mb, float(f.read().strip() or 0))
    except (FileNotFoundError, ValueError):
        pass
    with open(peak_file, "w") as f:
        f.write(f"{peak_mb:.0f}\n")
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cmasd.tools.progress", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="one line per epoch of fairseq-train's output (stdin)")
    train.add_argument("--log", required=True, help="where the whole output goes")
    train.add_argument("--hours", type=float, help="the run's --stop-time-hours (for the time left)")
    train.add_argument("--max-update", type=int, help="the run's --max-update (for the time left)")
    count = commands.add_parser("count", help="a progress bar of the stdin lines that match")
    count.add_argument("--total", type=int, required=True)
    count.add_argument("--out", required=True, help="where stdin is copied")
    count.add_argument("--pattern", default=r"^H-\d+\t")
    count.add_argument("--label", default="decoding")
    run = commands.add_parser("run", help="run a command and record its peak memory")
    run.add_argument("--peak-file", required=True)
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "train":
        with open(args.log, "w") as log:
            summarize_training(sys.stdin, log, sys.stdout, args.hours, args.max_update)
        return 0
    if args.command == "count":
        with open(args.out, "w") as out:
            count_lines(sys.stdin, out, sys.stderr, args.pattern, args.total, args.label)
        return 0
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        build_parser().error("run: no command given")
    return run_measured(command, args.peak_file)


if __name__ == "__main__":
    sys.exit(main())
