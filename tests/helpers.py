"""What the test modules share: paths and the environment of the commands they run,
fairseq-generate (as a process, or in this process through its own ``cli_main``),
reading its output, the shared probe set's layout, and the tiny in-process models.

No test module imports another; they import from here (and the fixtures come from
conftest.py).
"""

import argparse
import contextlib
import io
import logging
import math
import os
import re
import subprocess
import sys
import traceback
import types
import unittest.mock
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PLUGINS = str(REPO / "fairseq_plugins")


# ------------------------------------------------------------------ the data mirror


def mirror_dir():
    path = os.environ.get("CMASD_DATA_MIRROR") or str(REPO.parent / "shared" / "data")
    return Path(path)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def mirror_missing(reason: str):
    """A test that needs a part of the data mirror the mirror lacks: skipped with
    ``reason``, or failed under ``CI=true`` (a CI run without the mirror would be green and
    nearly empty)."""
    import pytest

    if in_ci():
        pytest.fail(f"{reason}: under CI=true the tests that need the data mirror fail instead of skipping", pytrace=False)
    pytest.skip(reason)


# ------------------------------------------------------------------ commands


def tool_env(**extra):
    """The environment of the commands tests run: the venv's tools first, and one
    torch/OpenMP thread (tiny models; two spinning threads per process on a shared
    two-core machine made fairseq-generate about 40x slower)."""
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def run(cmd, **kwargs):
    """Run a command, failing the test with its output when it fails."""
    env = tool_env(**kwargs.pop("env", {}))
    proc = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=kwargs.pop("cwd", REPO), **kwargs
    )
    return succeeded(proc)


def succeeded(proc):
    """``proc``, or a failure with its output when its exit status is not 0."""
    if proc.returncode != 0:
        raise AssertionError(
            f"command failed ({proc.returncode}): {' '.join(map(str, proc.args))}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
        )
    return proc


# ------------------------------------------------------------------ fairseq-generate

PROBE_SENTENCES = 96
EMPTY_AT = 5  # index of the empty source line in the probe set
# Sentences of the probe set's head (conftest.probe_at): what a decode at batch 1 runs on.
# Batch 1 runs a sentence at a time, so fewer sentences take the same paths; the whole set
# at batch 1 took 841 of the suite's 4,948 worker-seconds on the Zen 1 host (docs/results/tests.md).
HEAD_SENTENCES = 24
# The length cap of every test decode: a flat CAP_LEN tokens where fairseq's default is 200. The
# tiny verifier runs on to the cap in about one sentence of eight, and at 200 those rows were
# half of the tokens decoded (a batch of 16 with one such row ran 200 iterations); they still
# reach it, and stop sooner. Flat, not --max-len-a: fairseq scales that by the batch's padded
# source width, so its greedy output would change with the batch size.
CAP_LEN = 60
LENGTH_CAP = ("--max-len-a", "0", "--max-len-b", str(CAP_LEN))
# every hypothesis outgrows the first caches (about its source's length plus two blocks):
# between 100 and 120 tokens
LONG = ("--min-len", "100", "--max-len-a", "0", "--max-len-b", "120")
VERY_LONG = ("--min-len", "150", "--max-len-a", "0", "--max-len-b", "170")  # past the autoregressive drafter's first caches too


def generation_argv(data, verifier, *options):
    """fairseq-generate's arguments for the test split of ``data``.

    ``--required-batch-size-multiple 1``: with fairseq's default of 8, fairseq 0.12's
    batching silently drops sentences whenever the batch size is not a multiple of 8 or
    the split does not divide evenly (97 sentences at --batch-size 16 give 96
    hypotheses), for its own generator as for ours. ``--num-workers 0``: batches are
    loaded in this process; with fairseq's one worker, a run in this process often waits
    about 5 s for the previous run's worker to shut down. LENGTH_CAP unless ``options``
    set the cap again (the last one counts, as in fairseq's parser)."""
    return [str(c) for c in (data, "--user-dir", PLUGINS, "--task", "translation_speculative", "--path", verifier,
                             "--gen-subset", "test", "--cpu", "--beam", "1", "--required-batch-size-multiple", "1",
                             "--num-workers", "0", *LENGTH_CAP, *options)]


def generate(data, verifier, *options, check=True, cli=False):
    """fairseq-generate on the test split of ``data``; returns a completed process
    (arguments, exit status, stdout, stderr).

    By default in this process (``in_process``: fairseq-generate's own ``cli_main``,
    parser and error path, without 3-4 s of interpreter start-up per run); ``cli=True``
    starts the program itself."""
    proc = console("fairseq-generate", generation_argv(data, verifier, *options), program=cli)
    return succeeded(proc) if check else proc


def console(prog, argv, program=False):
    """Console script ``prog`` with ``argv``: the program itself (``program``), or its entry
    point in this process (``in_process``); a completed process."""
    argv = [str(a) for a in argv]
    if program:
        return subprocess.run([str(BIN / prog), *argv], capture_output=True, text=True, cwd=REPO, env=tool_env())
    return in_process(prog, argv)


LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq_cli's


def console_script(prog):
    """The entry point of console script ``prog``."""
    if prog == "fairseq-generate":
        from fairseq_cli.generate import cli_main
    elif prog == "cmasd-bench":
        from cmasd.tools.bench.cli import cli_main
    elif prog == "cmasd-trace":
        from cmasd.tools.trace import cli_main
    else:
        raise KeyError(prog)
    return cli_main


def in_process(prog, argv):
    """Run console script ``prog`` (``fairseq-generate``, ``cmasd-bench``, ``cmasd-trace``)
    in this process as its entry point runs it: ``sys.argv`` set, stdout and the INFO log
    (fairseq's format) and stderr captured; what the program leaves to its exit (``atexit``:
    cmasd's statistics line) run when it returns, as at its exit; a ``UsageError`` reported
    in one line as ``cmasd.errors``' hook does for the program, any other exception with its
    traceback, exit status 1; argparse's exits keep their status. The logging the program
    set up (cmasd's tools configure the root logger) is undone. Returns a
    ``subprocess.CompletedProcess``."""
    from cmasd.errors import UsageError, one_line

    entry = console_script(prog)
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.setLevel(logging.INFO)
    root, fairseq_logger = logging.getLogger(), logging.getLogger("fairseq")
    level, handlers, fairseq_level, argv_before = root.level, root.handlers[:], fairseq_logger.level, sys.argv
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    sys.argv = [prog, *argv]
    status, at_exit = 0, []
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                with unittest.mock.patch("atexit.register", lambda function, *a, **k: at_exit.append((function, a, k))):
                    entry()
            finally:
                for function, a, k in reversed(at_exit):
                    function(*a, **k)
    except UsageError as error:
        err.write(one_line(prog, error) + "\n")
        status = 1
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
    except Exception:  # noqa: BLE001  (a bug: its traceback, as the interpreter prints it)
        err.write(traceback.format_exc())
        status = 1
    finally:
        sys.argv = argv_before
        root.handlers[:] = handlers
        root.setLevel(level)
        fairseq_logger.setLevel(fairseq_level)
    return subprocess.CompletedProcess([prog, *argv], status, out.getvalue(), err.getvalue())


def hypotheses(stdout):
    """{sentence id: (score, hypothesis tokens)} of fairseq-generate's H lines; fails
    on an id printed twice."""
    found = {}
    for line in stdout.splitlines():
        match = re.match(r"H-(\d+)\t(\S+)\t(.*)$", line)
        if match:
            index = int(match.group(1))
            assert index not in found, f"sentence {index} has two hypotheses"
            found[index] = (float(match.group(2)), match.group(3))
    return found


def assert_same_hypotheses(spec, greedy, sentences=PROBE_SENTENCES):
    """The same hypotheses for ids 0 .. ``sentences`` (the probe set, or its head, and its
    empty line), token for token, scores within 1e-3; ``greedy`` may hold more (the whole
    probe set's reference for a run on its head)."""
    ids = list(range(sentences + 1))
    assert sorted(spec) == ids, f"hypotheses for {len(spec)} of {len(ids)} sentences"
    assert set(ids) <= set(greedy), "the reference lacks sentences"
    different = [i for i in ids if spec[i][1] != greedy[i][1]]
    assert not different, f"{len(different)} hypotheses differ, e.g. {different[:5]}"
    worst = max(abs(spec[i][0] - greedy[i][0]) for i in ids)
    assert worst < 1e-3, f"scores differ by up to {worst}"


def last_line(proc, prog="fairseq-generate"):
    """The one-line error of a refused run: ``PROG: error: MESSAGE`` as the last line of
    stderr, exit status non-zero, and no traceback (cmasd.errors)."""
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{prog}: error: "), line
    return line


def probe_set(data, sentences):
    """``build(dest)`` for an artifact: the first ``sentences`` pairs of data-bin ``data``'s
    test text with an empty source line inserted at EMPTY_AT, binarized in ``dest``/bin
    (the probe set and its heads share their ids)."""

    def build(dest):
        pairs = raw_pairs(data, sentences)
        pairs.insert(EMPTY_AT, ("", pairs[EMPTY_AT][1]))
        binarize(data, dest / "bin", pairs)

    return build


def binarize(data, dest, pairs):
    """Binarize (source, target) raw text pairs as the ``test`` split of ``dest`` with
    the sentencepiece model and dictionary of data-bin ``data``."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    dest.mkdir(parents=True)
    for side, lang in ((0, "en"), (1, "de")):
        lines = [" ".join(sp.encode(pair[side].strip(), out_type=str)) for pair in pairs]
        (dest / f"test.{lang}").write_text("".join(line + "\n" for line in lines))
    run(
        [BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
         "--testpref", dest / "test", "--destdir", dest, "--srcdict", data / "dict.en.txt",
         "--joined-dictionary", "--workers", "1"]
    )
    return dest


def raw_pairs(data, count):
    sources = (data / "raw" / "test.en").read_text().splitlines()[:count]
    targets = (data / "raw" / "test.de").read_text().splitlines()[:count]
    return list(zip(sources, targets))


def another_verifier(verifier, tmp_path):
    """``verifier`` with one weight matrix changed by 1%: another verifier, same shapes."""
    from cmasd.checkpoint import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    state = torch.load(verifier, map_location="cpu", weights_only=False)
    weight = next(name for name in state["model"] if name.endswith("fc1.weight"))
    state["model"][weight] = state["model"][weight] * 1.01
    other = tmp_path / "other.pt"
    torch.save(state, other)
    return other


# ------------------------------------------------------------------ tiny in-process models

BLOCK = 4
WORDS = 20


def tiny_dictionary(words=WORDS, prefix="w"):
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for i in range(words):
        dictionary.add_symbol(f"{prefix}{i}")
    return dictionary


def tiny_verifier_args(learned_pos=False, normalize_before=False):
    from fairseq.models.transformer import base_architecture

    args = argparse.Namespace(
        arch="transformer",
        encoder_layers=2,
        decoder_layers=3,
        encoder_embed_dim=16,
        decoder_embed_dim=16,
        encoder_ffn_embed_dim=32,
        decoder_ffn_embed_dim=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        share_all_embeddings=True,
        encoder_learned_pos=learned_pos,
        decoder_learned_pos=learned_pos,
        encoder_normalize_before=normalize_before,
        decoder_normalize_before=normalize_before,
        max_source_positions=64,
        max_target_positions=64,
        dropout=0.0,
    )
    base_architecture(args)
    return args


def tiny_task(dictionary):
    return types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)


def tiny_drafter(learned_pos=False, normalize_before=False, seed=0):
    """A tiny fairseq verifier and a drafter initialised from it, in eval mode."""
    from fairseq.models.transformer import TransformerModel

    from cmasd.models.spec_drafter import SpecDrafterConfig, SpecDrafterModel
    from cmasd.models.verifier import verifier_arch

    torch.manual_seed(seed)
    dictionary = tiny_dictionary()
    args = tiny_verifier_args(learned_pos, normalize_before)
    verifier = TransformerModel.build_model(args, tiny_task(dictionary))
    cfg = SpecDrafterConfig(block_size=BLOCK, dropout=0.0, decoder_init="random")
    drafter = SpecDrafterModel.build(cfg, verifier_arch(args), dictionary, dictionary)
    drafter.init_from_verifier(verifier)
    return drafter.eval(), verifier.eval(), dictionary


def random_tokens(dictionary, shape, generator):
    """Word tokens (never pad/eos/unk/bos)."""
    return torch.randint(dictionary.nspecial, len(dictionary), shape, generator=generator)


def source_batch(dictionary, generator, bsz=3, length=7):
    src = random_tokens(dictionary, (bsz, length), generator)
    src_lengths = torch.tensor([length - i for i in range(bsz)])
    for row, n in enumerate(src_lengths.tolist()):  # left padding, as fairseq
        src[row, : length - n] = dictionary.pad()
        src[row, -1] = dictionary.eos()
    return src, src_lengths


def encoded_source(verifier, dictionary, generator, bsz):
    """A source batch and the verifier's encoder output for it."""
    src, src_lengths = source_batch(dictionary, generator, bsz)
    with torch.no_grad():
        encoder_out = verifier.encoder(src, src_lengths=src_lengths)
    return src, src_lengths, encoder_out


def sequences(dictionary, generator, bsz, length):
    """BOS (eos) followed by words: (B, length)."""
    tokens = random_tokens(dictionary, (bsz, length), generator)
    tokens[:, 0] = dictionary.eos()
    return tokens


def draft_model(verifier, dictionary, layers=1, share_encoder=True, seed=1):
    """A tiny fairseq Transformer draft model; with ``share_encoder`` its encoder is the
    verifier's (weights copied), as ar_drafter trains it."""
    from fairseq.models.transformer import TransformerModel

    torch.manual_seed(seed)
    args = tiny_verifier_args()
    args.decoder_layers = layers
    model = TransformerModel.build_model(args, tiny_task(dictionary))
    if share_encoder:
        model.encoder.load_state_dict(verifier.encoder.state_dict())
    return model.eval()


def tiny_transformer(normalize_before: bool, learned_pos: bool, vocab: int = 50):
    """A tiny random 2+2-layer fairseq Transformer (4 heads, 32 dims) in eval mode, and
    its dictionary of ``vocab`` words."""
    from fairseq.models.transformer import TransformerModel, base_architecture

    dictionary = tiny_dictionary(vocab)
    args = argparse.Namespace(
        encoder_layers=2, decoder_layers=2, encoder_embed_dim=32, decoder_embed_dim=32,
        encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64,
        encoder_attention_heads=4, decoder_attention_heads=4,
        share_all_embeddings=True, encoder_normalize_before=normalize_before,
        decoder_normalize_before=normalize_before, encoder_learned_pos=learned_pos,
        decoder_learned_pos=learned_pos, max_source_positions=64, max_target_positions=64,
    )
    base_architecture(args)
    torch.manual_seed(0)
    return TransformerModel.build_model(args, tiny_task(dictionary)).eval(), dictionary


TINY_DIMS = dict(
    encoder_layers=2, decoder_layers=2, encoder_embed_dim=32, decoder_embed_dim=32,
    encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64, encoder_attention_heads=4, decoder_attention_heads=4,
    max_source_positions=64, max_target_positions=64,
)


def tiny_bart(pre_norm: bool = False):
    """fairseq's BART architecture (``bart_base``: learned positions with fairseq's offset,
    ``layernorm_embedding``, GELU, unscaled embeddings, tied embeddings, post-norm) at a
    tiny size; ``pre_norm`` as mBART's layers are."""
    from fairseq.models.bart import BARTModel
    from fairseq.models.bart.model import bart_base_architecture

    dictionary = tiny_dictionary(50)
    args = argparse.Namespace(**TINY_DIMS, encoder_normalize_before=pre_norm, decoder_normalize_before=pre_norm)
    bart_base_architecture(args)
    task = tiny_task(dictionary)
    torch.manual_seed(0)
    return BARTModel.build_model(args, task).eval(), dictionary


def random_heads(verifier, seed=4, k=5):
    """Blockwise heads (k - 1 of them) for ``verifier`` with large random weights: drafts
    that are often wrong."""
    from cmasd.models.blockwise_heads import BlockwiseHeadsConfig, BlockwiseHeadsModel

    torch.manual_seed(seed)
    cfg = BlockwiseHeadsConfig(blockwise_k=k, blockwise_ffn_dim=32)
    model = BlockwiseHeadsModel(cfg, BlockwiseHeadsModel.shape(verifier), verifier)
    with torch.no_grad():
        for layer in model.down:
            layer.weight.normal_(0.0, 3.0)
    return model.eval()


# ------------------------------------------------------------------ lossless in process

MAX_LEN = 24


def gemv_obstacle():
    """Why the gemv kernel cannot run here (it needs the C++ extension and oneDNN's packed
    linear), or None. Builds the extension on a fresh machine: call it as a test starts
    (the ``needs_gemv`` mark, conftest.py), never at collection."""
    from cmasd.layers import extension
    from cmasd.layers.kernels import packing_available

    return extension.load()[1] or (None if packing_available() else "no oneDNN packed linear")


def kernel_params():
    """The kernels to decode on, as pytest parameters (skipped where unavailable)."""
    import pytest

    from cmasd.layers.kernels import packing_available

    return [
        "native",
        pytest.param("packed", marks=pytest.mark.skipif(not packing_available(), reason="no oneDNN packed linear")),
        pytest.param("gemv", marks=pytest.mark.needs_gemv),
    ]


def ragged_source(dictionary, gen, bsz, longest=6):
    """Sources of 2 .. ``longest`` tokens, eos last, left-padded as fairseq pads them."""
    src, _ = source_batch(dictionary, gen, 1, longest)
    src = src.repeat(bsz, 1)
    lengths = torch.tensor([2 + row % (longest - 1) for row in range(bsz)])
    for row, n in enumerate(lengths.tolist()):
        src[row, : longest - n] = dictionary.pad()
    return src, lengths


def decodes_as_greedy(decoder, verifier, dictionary, batch_sizes=(1, 7, 16)):
    """Decode ragged batches of ``batch_sizes`` sentences with ``decoder`` and assert each
    hypothesis equals fairseq's greedy SequenceGenerator's; yields, per batch, its size,
    sources, hypotheses and statistics."""
    from fairseq.sequence_generator import SequenceGenerator

    reference = SequenceGenerator([verifier], dictionary, beam_size=1, max_len_b=MAX_LEN)
    gen = torch.Generator().manual_seed(3)
    for bsz in batch_sizes:
        src, src_lengths = ragged_source(dictionary, gen, bsz)
        sample = {"id": torch.arange(bsz), "net_input": {"src_tokens": src, "src_lengths": src_lengths}}
        with torch.no_grad():
            expected = reference.generate([verifier], sample)
            got, stats = decoder.decode(sample)
        for row in range(bsz):
            assert torch.equal(got[row][0]["tokens"], expected[row][0]["tokens"]), (bsz, row)
        yield bsz, src, got, stats


# ------------------------------------------------------------------ statistics


def chi_square(observed: torch.Tensor, expected_probs: torch.Tensor):
    """The chi-square statistic of counts ``observed`` (n,) against probabilities
    ``expected_probs`` (n,), bins with expected count < 5 merged into one; and its
    degrees of freedom."""
    total = float(observed.sum())
    expected = expected_probs.double() * total
    small = expected < 5
    obs = observed.double()
    if small.any():
        obs = torch.cat([obs[~small], obs[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    assert float(obs[~keep].sum()) == 0, "a token of probability 0 was emitted"
    stat = float(((obs[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return stat, int(keep.sum()) - 1


def threshold(df: int) -> float:
    """The rejection threshold of the fit: df + 10 sqrt(2 df), about 10 standard deviations."""
    return df + 10 * math.sqrt(2 * df)


def rows_of(record, name):
    """cmasd-bench's bench.json rows of configuration ``name``, by batch size."""
    return {r["batch_size"]: r for r in record["rows"] if r["config"] == name}


# ------------------------------------------------------------------ tiny language models
# (the fixtures lm_data, lm and draft_lm in conftest.py)

LM_TRAIN_LINES = 6000  # Multi30k English training sentences the tiny language models learn from
LM_POSITIONS = 48  # the tiny language models' positions (--tokens-per-sample)

# (input and output dims given with the width: fairseq 0.12's transformer_lm keeps them at 512 otherwise)
TINY_LM = ["--decoder-layers", "2", "--decoder-embed-dim", "64", "--decoder-input-dim", "64",
           "--decoder-output-dim", "64", "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "2"]
TINIER_LM = ["--decoder-layers", "1", "--decoder-embed-dim", "32", "--decoder-input-dim", "32",
             "--decoder-output-dim", "32", "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2"]


def english(name, count):
    """The first ``count`` English sentences of the mirror's Multi30k split ``name``."""
    import gzip

    with gzip.open(mirror_dir() / "multi30k" / f"{name}.en.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for _, line in zip(range(count), f)]


def train_lm(data, save, arch, updates):
    """``data-prep/train-lm.sh``'s cpu recipe at the width ``arch`` for ``updates`` updates
    on lines of up to ``LM_POSITIONS`` positions."""
    run(["bash", REPO / "data-prep" / "train-lm.sh", data / "bin", "cpu", *arch,
         "--tokens-per-sample", str(LM_POSITIONS), "--sample-break-mode", "eos",
         "--lr", "5e-3", "--warmup-updates", "20", "--warmup-init-lr", "-1", "--clip-norm", "0.0",
         "--weight-decay", "0.0", "--dropout", "0.0", "--attention-dropout", "0.0", "--max-tokens", "2048",
         "--max-update", str(updates), "--save-dir", save, "--no-epoch-checkpoints", "--no-progress-bar", "--cpu",
         "--num-workers", "0", "--disable-validation"])
