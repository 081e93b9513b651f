"""The options the parts bring: ``fairseq-generate``'s speculative flags stay what they
were (names, order, defaults, choices, help: ``tests/snapshots/generate_flags.json``,
recorded from the flat config before the parts declared their own; issue 45 added the
shortlist, ragged verification and goodput's flags and goodput to --spec-controller's help,
then --spec-draft-shortlist-counts, --goodput-correction and bf16 for
--spec-drafter-quantize; --goodput-probe-every's help says how its period grows, and
--goodput-acceptance is new; issue 46 added --spec-cuda-graphs). In process, through the function fairseq builds a task's
flags with; no models: a second."""

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
    """Every recorded flag is still there, in its order, with its default, type and help;
    its choices start with the recorded ones. A new part may add flags after them (and a
    new drafter kind, controller or rule a choice)."""
    got = {f["flag"]: f for f in map(describe, flags(SpeculativeDecodingConfig))}
    recorded = [f["flag"] for f in SNAPSHOT["speculative"]]
    assert [flag for flag in got if flag in recorded] == recorded
    assert list(got)[: len(recorded)] == recorded
    for want in SNAPSHOT["speculative"]:
        flag = dict(got[want["flag"]])
        if want["choices"] is not None:
            assert flag["choices"][: len(want["choices"])] == want["choices"], want["flag"]
            flag["choices"] = want["choices"]
        assert flag == want


def test_task_flags_keep_their_order():
    got = [a.option_strings[0] if a.option_strings else a.dest for a in flags(TranslationSpeculativeConfig)]
    assert [flag for flag in got if flag in SNAPSHOT["task_order"]] == SNAPSHOT["task_order"]


def test_every_part_option_is_composed_once():
    """The config has each part's fields, none defined twice, none lost, none of its own."""
    from dataclasses import fields

    from cmasd.options import OPTION_PARTS, declared_options

    owners = {}
    for part in OPTION_PARTS:
        for f in fields(part):
            assert f.name not in owners, f"{f.name}: declared by {owners[f.name].__name__} and {part.__name__}"
            owners[f.name] = part
    composed = [f.name for f in fields(SpeculativeDecodingConfig) if f.name != "_name"]
    assert composed == list(owners)
    assert set(declared_options()) <= set(OPTION_PARTS)


def test_parts_declare_the_options_they_read():
    """Each registered part reads its options through ``options``: building it from a
    config of its declared dataclasses alone (nothing else) works or refuses in one line,
    but never misses an attribute."""
    from dataclasses import fields

    from cmasd.drafters.registry import DRAFTER_KINDS
    from cmasd.verification.acceptance import ACCEPTANCE_RULES
    from cmasd.verification.controllers import CONTROLLERS

    def only(parts):
        values = {f.name: f.default for part in parts for f in fields(part)}
        return argparse.Namespace(**values)

    for name, rule in ACCEPTANCE_RULES.items():
        rule.from_config(only(rule.options))
    for name, controller in CONTROLLERS.items():
        controller.from_config(only(controller.options), 16)
    for name, kind in DRAFTER_KINDS.items():
        assert kind.options == () or all(isinstance(o, type) for o in kind.options), name


def test_composition_refuses_a_field_declared_twice():
    from dataclasses import dataclass, field

    import pytest

    from cmasd.options import compose

    @dataclass
    class One:
        spec_k: int = field(default=1, metadata={"help": "one"})

    @dataclass
    class Two:
        spec_k: int = field(default=2, metadata={"help": "two"})

    with pytest.raises(TypeError, match="spec_k: declared by One and Two"):
        compose("Twice", (One, Two), "")


def test_bench_checkpoint_flags_are_the_registry_kinds():
    """cmasd-bench's checkpoint options are exactly the drafter kinds' (``checkpoint_option``),
    each a role its configurations name; the roles and flags are those bench.json has always
    recorded."""
    from cmasd.drafters.registry import DRAFTER_KINDS
    from cmasd.tools.bench.cli import build_parser
    from cmasd.tools.bench.configs import CONFIGS, DRAFTER_OPTIONS, NO_DRAFTER, option_dest, record_key
    from cmasd.tools.bench.loading import drafter_paths

    parser = build_parser()
    flags = {o for a in parser._actions for o in a.option_strings if o.endswith("-path") and o != "--path"}
    assert flags == {kind.checkpoint_option for kind in DRAFTER_KINDS.values() if kind.checkpoint_option}
    assert all(kind.checkpoint_option for kind in DRAFTER_KINDS.values() if not kind.model_optional)
    assert DRAFTER_OPTIONS == {"spec": "--drafter-path", "ar": "--ar-drafter-path", "exit": "--exit-heads-path",
                               "blockwise": "--blockwise-heads-path"}
    assert [record_key(o) for o in DRAFTER_OPTIONS.values()] == ["drafter", "ar_drafter", "exit_heads",
                                                                 "blockwise_heads"]
    assert {c.drafter for c in CONFIGS.values() if c.speculative} <= {*DRAFTER_OPTIONS, NO_DRAFTER}
    args = parser.parse_args(["DATA", "--path", "v.pt", "--ar-drafter-path", "ar.pt", "--exit-heads-path", "x.pt"])
    assert drafter_paths(args) == {"ar": "ar.pt", "exit": "x.pt"}
    assert all(hasattr(args, option_dest(o)) for o in DRAFTER_OPTIONS.values())
