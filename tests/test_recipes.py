"""The periphery: cmasd-prep's subcommand table, and the drafter training recipes
(data-prep/train-*.sh) with their shared fairseq-train call in common.sh, run against a
stub fairseq-train that prints its arguments (no data mirror, no training)."""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY

import fairseq_plugins  # noqa: F401  (registers the architectures, as --user-dir does)
from cmasd.tools import pieces, prep
from cmasd.tools.prep import binarize, cli, fairseq_files, normalize, parallel, sentences, subwords, summaries

REPO = Path(__file__).resolve().parents[1]

SUBCOMMANDS = [
    "normalize", "spm-train", "spm-encode", "spm-decode", "gpt2-encode", "cnndm-split",
    "refs-jsonl", "lead", "summ-convert", "summ-split", "clean-corpus", "denoise-pairs",
    "sgm-extract", "count-bin", "compare-hyps", "piece-counts", "binarize",
]
MODULES = (normalize, subwords, sentences, summaries, parallel, fairseq_files, binarize)


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


# ------------------------------------------------------------------ the Spec-Drafter's architecture


def test_spec_drafter_compact_is_another_name_of_spec_drafter_base():
    """The two names were two identical architectures; one is now the other's alias, so
    older commands and checkpoints naming spec_drafter_compact build the same model."""
    assert ARCH_MODEL_NAME_REGISTRY["spec_drafter_base"] == "spec_drafter"
    assert ARCH_MODEL_NAME_REGISTRY["spec_drafter_compact"] == "spec_drafter"
    assert ARCH_CONFIG_REGISTRY["spec_drafter_compact"] is ARCH_CONFIG_REGISTRY["spec_drafter_base"]


# ------------------------------------------------------------------ the training recipes

# recipe -> (--arch it trains, its checkpoint folder's prefix)
RECIPES = {
    "train-drafter": ("spec_drafter_base", "drafter"),
    "train-ar-drafter": ("ar_drafter_1l", "ar-drafter"),
    "train-exit-heads": ("exit_heads", "exit-heads"),
    "train-blockwise-heads": ("blockwise_heads", "blockwise-heads"),
}
USER_OPTIONS = ["--max-update", "7", "--save-dir", "my dir"]
VERIFIER_SIZES = ("base", "base-small")


@pytest.fixture(scope="module")
def recipe_commands(tmp_path_factory):
    """{(recipe, verifier width): fairseq-train's argument list} of every recipe, run with a
    stub fairseq-train beside a stub python (common.sh looks there first); all at once."""
    root = tmp_path_factory.mktemp("recipes")
    stub = root / "bin"
    stub.mkdir()
    (stub / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (stub / "fairseq-train").write_text(textwrap.dedent("""\
        #!/bin/sh
        for a in "$@"; do printf '%s\\n' "$a"; done
        """))
    for tool in stub.iterdir():
        tool.chmod(0o755)
    data = root / "data-bin" / "toy"
    data.mkdir(parents=True)
    for split in ("train.en-de.en.idx", "valid.en-de.en.idx"):
        (data / split).touch()
    for width in (256, 512):
        torch.save({"model": {"decoder.embed_tokens.weight": torch.zeros(4, width)}}, root / f"v{width}.pt")
    # drafter recipes: (recipe, verifier width); train-verifier.sh: (recipe, size)
    runs = {(recipe, 512): [root / "v512.pt"] for recipe in RECIPES}
    runs[("train-drafter", 256)] = [root / "v256.pt"]
    runs.update({("train-verifier", size): [size] for size in VERIFIER_SIZES})
    env = dict(os.environ, CMASD_PYTHON=str(stub / "python"), OMP_NUM_THREADS="1")
    procs = {
        run: subprocess.Popen(["bash", REPO / "data-prep" / f"{run[0]}.sh", data, *args, *USER_OPTIONS],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root)
        for run, args in runs.items()
    }
    commands = {}
    for run, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{run}: {err}"
        commands[run] = (out.splitlines(), str(data), str(runs[run][0]))
    return commands


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipes_share_one_fairseq_train_call(recipe, recipe_commands):
    """Each recipe's own options sit between the shared head (data, plugins, task) and the
    shared tail (checkpoint folder, log format, device options), and the options given
    after VERIFIER come last."""
    argv, data, verifier = recipe_commands[(recipe, 512)]
    arch, prefix = RECIPES[recipe]
    assert argv[:5] == [data, "--user-dir", str(REPO / "fairseq_plugins"), "--task", "translation_speculative"]
    assert argv[argv.index("--arch") + 1] == arch
    assert argv[argv.index("--verifier-path") + 1] == verifier
    tail = argv.index("--skip-invalid-size-inputs-valid-test")
    assert argv[tail + 1:tail + 7] == ["--save-dir", str(REPO / "checkpoints" / f"{prefix}-toy"),
                                      "--log-format", "simple", "--log-interval", "50"]
    assert argv[-len(USER_OPTIONS):] == USER_OPTIONS
    assert set(argv[tail + 7:-len(USER_OPTIONS)]) <= {"--cpu", "--drafter-bf16-autocast"}


def test_train_drafter_trains_one_architecture_at_every_width(recipe_commands):
    """train-drafter.sh chose spec_drafter_compact up to width 256 and spec_drafter_base above,
    two names of one architecture; it now names one, whatever the verifier."""
    compact, _, small = recipe_commands[("train-drafter", 256)]
    base, _, large = recipe_commands[("train-drafter", 512)]
    assert compact[compact.index("--arch") + 1] == "spec_drafter_base"
    assert [small if a == small else a for a in compact] == [small if a == large else a for a in base]


def option(argv, name):
    """The value after ``name`` in ``argv``."""
    return argv[argv.index(name) + 1]


def test_base_small_trains_transformer_base_on_a_small_corpus(recipe_commands):
    """train-verifier.sh's base-small: the model of base (transformer_wmt_en_de, shared
    embeddings), with a schedule for a corpus of Multi30k's size, through cmasd's task
    (bfloat16 autocast where this CPU has it, as the drafter recipes decide)."""
    base, data, _ = recipe_commands[("train-verifier", "base")]
    small, _, _ = recipe_commands[("train-verifier", "base-small")]
    assert small[:5] == [data, "--user-dir", str(REPO / "fairseq_plugins"), "--task", "translation_speculative"]
    assert "--task" not in base
    for argv in (base, small):
        assert option(argv, "--arch") == "transformer_wmt_en_de" and "--share-all-embeddings" in argv
        assert option(argv, "--lr") == "5e-4" and option(argv, "--max-tokens") == "4096"
        assert argv[-len(USER_OPTIONS):] == USER_OPTIONS
    assert option(base, "--warmup-updates") == "4000" and option(base, "--dropout") == "0.1"
    assert option(small, "--warmup-updates") == "800" and option(small, "--dropout") == "0.3"
    assert option(small, "--drafter-cuts") == "0"
    assert option(small, "--save-dir").endswith("my dir")  # the caller's, made absolute
    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert ("--drafter-bf16-autocast" in small) == bf16 and "--drafter-bf16-autocast" not in base
    assert "--cpu" in small or torch.cuda.is_available()


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_help_and_missing_arguments(recipe):
    script = REPO / "data-prep" / f"{recipe}.sh"
    proc = subprocess.run(["bash", script, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith(f"Usage: bash data-prep/{recipe}.sh DATASET VERIFIER")
    proc = subprocess.run(["bash", script, "only-one"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"Usage: bash data-prep/{recipe}.sh")
    assert proc.stderr.endswith("[cmasd prep] error: expected DATASET and VERIFIER\n")
