"""The options the parts bring: ``fairseq-generate``'s speculative flags stay what they
were (names, order, defaults, choices, help: ``tests/snapshots/generate_flags.json``,
recorded from the flat config before the parts declared their own). In process, through
the function fairseq builds a task's flags with; no models: a second."""

import argparse
import json
from pathlib import Path

from fairseq.dataclass.utils import gen_parser_from_dataclass

from cmasd.options import SpeculativeDecodingConfig
from cmasd.training.task import TranslationSpeculativeConfig

SNAPSHOT = json.loads((Path(__file__).parent / "snapshots" / "generate_flags.json").read_text())


def flags(config: type):
    """The argparse actions fairseq makes of ``config`` (as ``FairseqTask.add_args`` does)."""
    parser = argparse.ArgumentParser(add_help=False)
    gen_parser_from_dataclass(parser, config())
    return parser._actions


def describe(action) -> dict:
    kind = getattr(action, "type", None)
    return {
        "flag": action.option_strings[0],
        "default": action.default,
        "choices": None if action.choices is None else list(action.choices),
        "type": None if kind is None else kind.__name__,
        "action": type(action).__name__,
        "help": action.help,
    }


def test_speculative_flags_are_unchanged():
    got = [describe(a) for a in flags(SpeculativeDecodingConfig)]
    assert [f["flag"] for f in got] == [f["flag"] for f in SNAPSHOT["speculative"]]
    for flag, want in zip(got, SNAPSHOT["speculative"]):
        assert flag == want


def test_task_flags_keep_their_order():
    got = [a.option_strings[0] if a.option_strings else a.dest for a in flags(TranslationSpeculativeConfig)]
    assert got == SNAPSHOT["task_order"]
