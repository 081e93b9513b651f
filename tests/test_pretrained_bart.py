"""A BART of fairseq's model zoo as the verifier: ``model.pt`` + ``dict.txt`` + GPT-2 BPE
(``encoder.json``, ``vocab.bpe``), as ``bart.base`` and ``bart.large.cnn`` come.

No pretrained model is downloaded: a tiny BART (``--arch bart_base``) is trained for a few
updates on Multi30k text encoded with a small GPT-2 byte-level BPE the test learns itself,
and saved in the zoo's layout, with the extra ``<mask>`` embedding row of ``bart.base``. The
path a user takes: ``cmasd-prep gpt2-encode``, fairseq-preprocess with the model's
``dict.txt``, the drafter recipes (the Spec-Drafter and the draft model start from the BART's
encoder, embeddings and positions), then ``fairseq-generate --bpe gpt2``: every drafter kind
lossless at batch 1, 7 and 16, detokenized text out, and a missing BPE file named.

This is the end-to-end test of the BART architecture (``bart_base``: learned positions with
fairseq's offset, ``layernorm_embedding``, GELU, unscaled embeddings, post-norm, tied); the
arithmetic of the other variants (pre-norm BART, an untied pre-norm GELU Transformer),
ragged blocks at batch > 1, is checked against fairseq's incremental decoding in
test_block_scoring.py.
"""

import collections
import json

import pytest
import torch
from helpers import BIN, PLUGINS, REPO, console, hypotheses, run

from cmasd.tools.prep.cli import main as prep_main

SENTENCES = 48
MERGES = 200


def learn_gpt2_bpe(lines, merges: int):
    """(encoder.json mapping, merge list) of a byte-level BPE learned on ``lines`` with
    GPT-2's pre-tokenizer and byte-to-unicode alphabet."""
    import regex
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    byte_encoder = bytes_to_unicode()
    pat = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    words = collections.Counter(
        tuple(byte_encoder[b] for b in token.encode("utf-8")) for line in lines for token in pat.findall(line)
    )
    vocab = list(byte_encoder.values())
    learned = []
    for _ in range(merges):
        pairs = collections.Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        learned.append(best)
        vocab.append(best[0] + best[1])
        merged = collections.Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return {token: i for i, token in enumerate(vocab)}, learned


@pytest.fixture(scope="module")
def zoo_bart(multi30k, tmp_path_factory):
    """(model directory in the zoo's layout, data-bin of its test sentences, train data-bin)."""
    work = tmp_path_factory.mktemp("zoo-bart")
    raw = {(split, lang): (multi30k / "raw" / f"{split}.{lang}").read_text().splitlines()
           for split in ("train", "valid", "test") for lang in ("en", "de")}
    raw = {key: lines[:3000] if key[0] == "train" else lines[:SENTENCES] for key, lines in raw.items()}
    encoder, merges = learn_gpt2_bpe(raw["train", "en"][:1500] + raw["train", "de"][:1500], MERGES)
    model_dir = work / "bart.tiny"
    model_dir.mkdir()
    (model_dir / "encoder.json").write_text(json.dumps(encoder))
    (model_dir / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    # dict.txt lists the BPE ids, as BART's does
    (model_dir / "dict.txt").write_text("".join(f"{i} 1\n" for i in range(len(encoder))))

    text = work / "text"
    text.mkdir()
    # the first file through the program, the others through its entry point here (the same
    # command without 4 s of start-up each)
    for n, ((split, lang), lines) in enumerate(raw.items()):
        (text / f"{split}.raw.{lang}").write_text("".join(line + "\n" for line in lines))
        argv = ["gpt2-encode", "--encoder-json", model_dir / "encoder.json", "--vocab-bpe", model_dir / "vocab.bpe",
                text / f"{split}.raw.{lang}", text / f"{split}.{lang}"]
        if n == 0:
            run([BIN / "python", "-m", "cmasd.tools.prep", *argv])
        else:
            assert prep_main([str(a) for a in argv]) == 0
    data = work / "bin"
    run([BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", text / "train",
         "--validpref", text / "valid", "--testpref", text / "test", "--destdir", data,
         "--srcdict", model_dir / "dict.txt", "--joined-dictionary", "--workers", "1"])

    save = work / "train"
    run([BIN / "fairseq-train", data, "--user-dir", PLUGINS, "--arch", "bart_base",
         "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
         "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2",
         "--decoder-attention-heads", "2", "--optimizer", "adam", "--lr", "3e-3", "--max-update", "40",
         "--max-tokens", "4096", "--save-dir", save, "--no-epoch-checkpoints", "--no-progress-bar",
         "--disable-validation", "--cpu", "--num-workers", "0", "--seed", "1"])
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    model = state["model"]
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"):
        if key in model:  # bart.base: one more row, its denoising task's <mask>
            model[key] = torch.cat([model[key], torch.zeros(1, model[key].size(1))])
    state.pop("last_optimizer_state", None)  # the zoo's files come without it
    torch.save(state, model_dir / "model.pt")
    return model_dir, data


def generate(model_dir, data, *options, program=False):
    """fairseq-generate on the test split (batch 16 unless ``options`` say otherwise): its
    entry point in this process, or the program itself (``program``; helpers.console)."""
    argv = [data, "--user-dir", PLUGINS, "--task", "translation_speculative", "--path", model_dir / "model.pt",
            "--gen-subset", "test", "--cpu", "--beam", "1", "--max-len-b", "40", "--batch-size", "16",
            "--required-batch-size-multiple", "1", "--num-workers", "0", "--bpe", "gpt2",
            "--gpt2-encoder-json", model_dir / "encoder.json", "--gpt2-vocab-bpe", model_dir / "vocab.bpe", *options]
    return console("fairseq-generate", argv, program=program)


@pytest.fixture(scope="module")
def zoo_greedy(zoo_bart):
    """fairseq-generate --beam 1 (the program) on the zoo BART: the reference."""
    greedy = generate(*zoo_bart, program=True)
    assert greedy.returncode == 0, greedy.stderr[-3000:]
    return greedy


# every drafter kind on the BART, rows finishing at different times at batch 7 and 16
SETUPS = {
    "spec-drafter-source-b16": lambda d: ["--batch-size", "16", "--drafter-path", d["spec"], "--spec-k", "6",
                                          "--spec-source-ngram", "1"],
    "spec-drafter-cmasd-b1": lambda d: ["--batch-size", "1", "--drafter-path", d["spec"], "--spec-controller", "cmasd",
                                        "--spec-k-max", "8"],
    "draft-model-history-b7": lambda d: ["--batch-size", "7", "--drafter-path", d["ar"], "--spec-k", "4",
                                         "--spec-history-ngram", "2"],
    "nothing-drafted-b16": lambda d: ["--batch-size", "16", "--drafter-path", d["spec"], "--spec-k", "0"],
}


def test_a_zoo_bart_decodes_losslessly_with_gpt2_bpe_and_drafters_from_its_encoder(zoo_bart, zoo_greedy, tmp_path):
    """The first setup through the program, the others through its entry point here."""
    model_dir, data = zoo_bart
    drafters = {}
    for kind, script in (("spec", "train-drafter.sh"), ("ar", "train-ar-drafter.sh")):
        save = tmp_path / kind
        run(["bash", REPO / "data-prep" / script, data, model_dir / "model.pt", "--max-update", "2",
             "--save-dir", save, "--no-epoch-checkpoints", "--disable-validation"])
        drafters[kind] = save / "checkpoint_last.pt"
    expected = hypotheses(zoo_greedy.stdout)
    assert sorted(expected) == list(range(SENTENCES))
    for n, (setup, options) in enumerate(SETUPS.items()):
        spec = generate(model_dir, data, *options(drafters), "--spec-acceptance", "exact", program=n == 0)
        assert spec.returncode == 0, f"{setup}: {spec.stderr[-3000:]}"
        got = hypotheses(spec.stdout)
        assert sorted(got) == sorted(expected), setup
        assert all(got[i][1] == expected[i][1] for i in expected), setup
    # detokenized through GPT-2's byte decoder: text, not ids
    detok = [line.split("\t")[2] for line in spec.stdout.splitlines() if line.startswith("D-")]
    assert len(detok) == SENTENCES and any(any(c.isalpha() for c in line) for line in detok)


def test_a_missing_bpe_file_is_named(zoo_bart, tmp_path):
    model_dir, data = zoo_bart
    proc = generate(model_dir, data, "--gpt2-encoder-json", tmp_path / "missing.json", "--spec-source-ngram", "1")
    assert proc.returncode != 0
    assert f"--gpt2-encoder-json: file not found: {tmp_path / 'missing.json'}" in proc.stderr


def test_the_python_api_loads_a_zoo_bart_with_its_gpt2_bpe(zoo_bart, zoo_greedy):
    """``cmasd.from_pretrained`` on the zoo's layout (model.pt, dict.txt, encoder.json,
    vocab.bpe): raw text in, fairseq-generate's detokenized output out, with and without
    lookups drafting."""
    from cmasd import from_pretrained

    model_dir, data = zoo_bart
    sources = (data.parent / "text" / "test.raw.en").read_text().splitlines()
    expected = {int(line.split("\t")[0][2:]): line.split("\t")[2]
                for line in zoo_greedy.stdout.splitlines() if line.startswith("D-")}
    plain = from_pretrained(str(model_dir), max_len_b=40)
    speculative = from_pretrained(str(model_dir), max_len_b=40, spec_source_ngram=1, spec_k=4,
                                  spec_acceptance="exact")
    assert plain.translate(sources) == [expected[i] for i in range(SENTENCES)]
    assert speculative.translate(sources) == [expected[i] for i in range(SENTENCES)]
    assert speculative.last_stats.summary()["sentences"] == SENTENCES and plain.last_stats is None
