"""A verifier of another fairseq architecture, decoded losslessly through fairseq-generate.

fairseq's BART (``--arch bart_base``: learned positions with fairseq's offset,
``layernorm_embedding``, GELU, unscaled embeddings, post-norm, tied), where the other tests
use a post-norm Transformer with sinusoidal positions and ReLU. Trained for 100 updates on
real Multi30k text, then decoded with every drafter kind built for it: an untrained
Spec-Drafter and draft model (the recipes of data-prep/, which start the drafters from its
encoder, embeddings and positions), history and source lookups, and nothing drafted. Exact
acceptance must print fairseq's ``--beam 1`` hypotheses.

So little training gives a weak model: the tiny BART does not read its source yet (300
updates did not change that) and writes the same 30 tokens for every sentence. The
arithmetic of each variant (BART, pre-norm BART, an untied pre-norm GELU Transformer),
ragged blocks at batch > 1, is checked against fairseq's incremental decoding in
test_block_scoring.py.
"""

import pytest
from conftest import BIN, PLUGINS, REPO, run
from test_generate import assert_same_hypotheses, generate, hypotheses, probe  # noqa: F401 (fixture)

SMALL = [
    "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]
VARIANTS = {"bart": ["--arch", "bart_base", *SMALL]}
MAX_LEN = ["--max-len-b", "30"]  # a half-trained model may not stop: keep its outputs short


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, multi30k, tmp_path_factory):
    """(name, verifier, Spec-Drafter, draft model) of one architecture."""
    name = request.param
    save = tmp_path_factory.mktemp(f"verifier-{name}")
    run([BIN / "fairseq-train", multi30k, "--user-dir", PLUGINS, *VARIANTS[name],
         "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
         "--max-tokens", "4096", "--max-update", "100", "--seed", "1", "--save-dir", save,
         "--no-epoch-checkpoints", "--no-progress-bar", "--disable-validation", "--cpu", "--num-workers", "0"])
    verifier = save / "checkpoint_last.pt"
    drafters = {}
    for kind, script in (("spec", "train-drafter.sh"), ("ar", "train-ar-drafter.sh")):
        out = tmp_path_factory.mktemp(f"{kind}-{name}")
        extra = ["--decoder-init", "random"] if kind == "spec" else []
        run(["bash", REPO / "data-prep" / script, multi30k, verifier, *extra, "--max-update", "1", "--lr", "1e-9",
             "--warmup-updates", "1", "--save-dir", out, "--no-epoch-checkpoints", "--disable-validation"])
        drafters[kind] = out / "checkpoint_last.pt"
    return name, verifier, drafters


SETUPS = {
    "spec-drafter-b1": lambda d: ["--batch-size", "1", "--drafter-path", d["spec"], "--spec-k", "8"],
    "spec-drafter-cmasd-b16": lambda d: ["--batch-size", "16", "--drafter-path", d["spec"], "--spec-controller",
                                         "cmasd", "--spec-k-max", "8"],
    "draft-model-lookups-b7": lambda d: ["--batch-size", "7", "--drafter-path", d["ar"], "--spec-k", "4",
                                         "--spec-history-ngram", "2", "--spec-source-ngram", "1"],
    "nothing-drafted-b16": lambda d: ["--batch-size", "16", "--drafter-path", d["spec"], "--spec-k", "0"],
}


def test_every_drafter_is_lossless_on_each_variant(probe, variant):  # noqa: F811 (fixture)
    name, verifier, drafters = variant
    greedy = hypotheses(generate(probe, verifier, "--batch-size", "16", *MAX_LEN).stdout)
    assert all(tokens.strip() for _, tokens in greedy.values()), f"{name}: empty outputs"
    for setup, options in SETUPS.items():
        proc = generate(probe, verifier, *MAX_LEN, *options(drafters), "--spec-acceptance", "exact")
        try:
            assert_same_hypotheses(hypotheses(proc.stdout), greedy)
        except AssertionError as error:
            raise AssertionError(f"{name}, {setup}: {error}") from None
