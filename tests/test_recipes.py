"""The periphery: cmasd-prep's subcommand table."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cmasd.tools import pieces, prep
from cmasd.tools.prep import cli, fairseq_files, normalize, parallel, sentences, subwords, summaries

REPO = Path(__file__).resolve().parents[1]

SUBCOMMANDS = [
    "normalize", "spm-train", "spm-encode", "spm-decode", "gpt2-encode", "cnndm-split",
    "refs-jsonl", "lead", "summ-convert", "summ-split", "clean-corpus", "denoise-pairs",
    "sgm-extract", "count-bin", "compare-hyps",
]
MODULES = (normalize, subwords, sentences, summaries, parallel, fairseq_files)


# ------------------------------------------------------------------ cmasd-prep's table


def test_every_subcommand_is_declared_once_by_one_module():
    declared = [command.name for module in MODULES for command in module.COMMANDS]
    assert declared == SUBCOMMANDS
    assert [command.name for command in cli.COMMANDS] == SUBCOMMANDS
    for command in cli.COMMANDS:
        assert isinstance(command, prep.Command)
        assert command.help and callable(command.add_arguments) and callable(command.run)


def test_the_parser_is_built_from_the_table(capsys):
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert list(subparsers.choices) == SUBCOMMANDS
    with pytest.raises(SystemExit) as stop:
        prep.main(["--help"])
    assert stop.value.code == 0
    listing = capsys.readouterr().out
    assert listing.startswith("usage: cmasd-prep [-h] SUBCOMMAND ...")
    for command in cli.COMMANDS:
        assert command.name in listing and command.help in listing


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as stop:
        prep.main([name, "--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: cmasd-prep {name} [-h]")


def test_usage_errors_are_one_line_with_status_2(capsys):
    with pytest.raises(SystemExit) as stop:
        prep.main(["lead", "--sentences", "x", "in", "out"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        "cmasd-prep: error: lead: argument --sentences: not an integer: 'x' (see cmasd-prep lead --help)\n"
    )


def test_refusals_and_exit_codes_come_from_run(tmp_path, capsys):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("H-0\t-1\tx y\nH-1\t-1\tz\n")
    second.write_text("H-1\t-1\tz\nH-0\t-1\tx w\n")
    assert prep.main(["compare-hyps", "--sentences", "2", str(first), str(first)]) == 0
    assert prep.main(["compare-hyps", "--sentences", "2", str(first), str(second)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "2 sentences, 1 different (ids 0)"
    assert prep.main(["normalize", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"cmasd-prep: error: input file not found: {tmp_path / 'missing'}\n"


def test_module_and_common_sh_run_the_package(tmp_path):
    """``python -m cmasd.tools.prep`` and the recipes' PREP array (common.sh) reach the same
    parser, from any working directory."""
    proc = subprocess.run([sys.executable, "-m", "cmasd.tools.prep", "count-bin", "--help"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: cmasd-prep count-bin")
    script = f'source {REPO / "data-prep" / "common.sh"}; "${{PREP[@]}}" lead --help'
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, CMASD_PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: cmasd-prep lead")


def test_trace_reads_the_word_mark_without_importing_prep():
    tree = ast.parse((REPO / "cmasd" / "tools" / "trace.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not any(name.startswith("cmasd.tools.prep") for name in imported)
    assert "cmasd.tools.pieces" in imported
    assert prep.WORD_START is pieces.WORD_START == "\u2581"
