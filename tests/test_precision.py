"""Half precision: ``--fp16`` and ``--bf16`` verifiers and drafters, as fairseq-generate
takes them, decode losslessly: with ``--spec-acceptance exact`` the output equals
fairseq's own greedy output (``--beam 1``) in the same precision, token for token, at
batch 1 and 16, with the Spec-Drafter (float and int8) and the autoregressive draft model.

What fairseq 0.12 does with the flags when it generates: ``--fp16`` casts the models with
``model.half()`` and decodes on the CPU too; ``--bf16`` only sets ``--tpu`` and leaves them
float32. The drafter follows the verifier's dtype (``cmasd.options.load_drafter_model``).
bfloat16 arithmetic is checked in this process instead, on ``model.bfloat16()`` against
fairseq's ``SequenceGenerator`` on the same model.

In half precision the two best logits often tie, and fairseq's arithmetic rounds
differently from close variants of it, so the checks are exact: fairseq's tie-breaking
(``cmasd.verification.acceptance.top1``), its encoder (``cmasd.layers.prepared.encoder_of``),
its layout of the encoder states (``cmasd.layers.transformer.on_contiguous``), contiguous
keys in attention (``attend_biased``). What is left: a verify pass over a block of
positions still rounds their self-attention otherwise than fairseq's one-token steps do
(log-probabilities up to about one unit in the last place of a logit apart, at a few
positions); on the probe set no token changes for it, at any batch size or drafter kind.

The generation runs use the first 16 probe sentences and the empty line (``small_probe``):
half precision runs slowly on a CPU.
"""

import itertools

import pytest
import torch
from helpers import (LENGTH_CAP, PLUGINS, assert_same_hypotheses, generate, hypotheses, probe_set, tiny_dictionary,
                     tiny_transformer)

SMALL = 16  # probe sentences decoded here (and the empty line)
# fairseq-generate's data loader in this process (a worker process of its own costs a 5 s
# wait when a later run collects the loader)
NO_WORKERS = ("--num-workers", "0")
DRAFTERS = {
    "spec": lambda d: ["--drafter-path", d["spec"], "--spec-k", "10"],
    "autoregressive": lambda d: ["--drafter-path", d["ar"], "--spec-k", "4"],
    "spec-int8": lambda d: ["--drafter-path", d["spec"], "--spec-k", "6", "--spec-drafter-quantize", "int8"],
}


def half_support(dtype):
    """None where torch runs ``dtype`` linear layers on this CPU, else why not."""
    try:
        torch.nn.functional.linear(torch.ones(2, 4, dtype=dtype), torch.ones(3, 4, dtype=dtype))
    except RuntimeError as error:
        return f"torch {torch.__version__} has no {dtype} matmul on this CPU: {error}"
    return None


def needs(dtype):
    reason = half_support(dtype)
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def small_probe(multi30k, artifacts):
    """The first SMALL probe pairs with the empty source line at EMPTY_AT, binarized."""

    return artifacts.get("probe-small", probe_set(multi30k, SMALL)) / "bin"


@pytest.fixture(scope="module")
def drafters(drafter, ar_drafter):
    return {"spec": drafter, "ar": ar_drafter}


# ------------------------------------------------------------------ through fairseq-generate


@pytest.mark.parametrize("flag", ["--fp16", "--bf16"])
def test_half_precision_flags_decode_as_fairseq(small_probe, verifier, drafters, flag):
    """fairseq-generate --fp16 (float16 on the CPU) and --bf16 (float32: fairseq casts for
    --fp16 only), speculative against stock, each batch size against its own stock run:
    fairseq's float16 output depends on the batch (its encoder pads)."""
    if flag == "--fp16":
        needs(torch.float16)
    for batch_size in ("1", "16"):
        run = ("--batch-size", batch_size, flag, *NO_WORKERS)
        stock = hypotheses(generate(small_probe, verifier, *run).stdout)
        for name, options in DRAFTERS.items():
            proc = generate(small_probe, verifier, *run, *options(drafters), "--spec-acceptance", "exact")
            assert "mean accepted tokens/iteration" in proc.stderr, name
            assert_same_hypotheses(hypotheses(proc.stdout), stock, SMALL)


# ------------------------------------------------------------------ bfloat16 models, in this process


def bf16_task(data, verifier, drafter_path):
    """fairseq-generate's task, models and generation options for ``--drafter-path``, with
    the verifier cast as fairseq casts for --fp16, but to bfloat16."""
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, [
        str(data), "--user-dir", PLUGINS, "--task", "translation_speculative", "--path", str(verifier), "--cpu",
        "--beam", "1", *LENGTH_CAP, "--drafter-path", str(drafter_path), "--spec-k", "6", "--spec-acceptance", "exact"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.log_stats = False  # no statistics at the test run's exit
    models, _ = checkpoint_utils.load_model_ensemble([str(verifier)], task=task)
    model = models[0].bfloat16().eval()
    task.load_dataset("test", task_cfg=cfg.task)
    return task, model, cfg.generation


@pytest.mark.parametrize("role", ["spec", "ar"])
def test_bfloat16_models_decode_as_fairseq_greedy(probe, verifier, drafters, role):
    """A bfloat16 verifier through the task's ``build_generator`` (the drafter loaded in
    bfloat16 too) against fairseq's SequenceGenerator on the same model: the first 16 probe
    sentences (the empty line among them) one at a time and as one batch."""
    from fairseq.sequence_generator import SequenceGenerator

    needs(torch.bfloat16)
    task, model, gen_cfg = bf16_task(probe, verifier, drafters[role])
    spec = task.build_generator([model], gen_cfg)
    assert spec.drafter is not None and spec.kernels == "native"
    assert {p.dtype for p in spec.drafter.model.parameters()} == {torch.bfloat16}
    stock = SequenceGenerator([model], task.target_dictionary, beam_size=1, max_len_a=gen_cfg.max_len_a,
                              max_len_b=gen_cfg.max_len_b)  # the suite's cap (LENGTH_CAP), as the task's
    dataset = task.dataset("test")
    ids = list(range(SMALL))
    for batch in [[i] for i in ids] + [ids]:
        sample = dataset.collater([dataset[i] for i in batch])
        with torch.no_grad():
            expected, got = stock.generate([model], sample), spec.generate([model], sample)
        for row, sid in enumerate(sample["id"].tolist()):
            assert torch.equal(got[row][0]["tokens"], expected[row][0]["tokens"]), (len(batch), sid)


# ------------------------------------------------------------------ the parts that make it exact


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_block_scores_equal_fairseq_in_half_precision(dtype):
    """16 sentences, some left-padded: blocks of 1, 4 and 34 positions, in a cache with
    room to spare, score what fairseq's incremental decoder scores one token at a time, on
    the encoder output it computes: bit for bit where a block is one position (the shapes
    of fairseq's own steps), and within a few units of the dtype's rounding in longer
    blocks. There the attention product multiplies several query rows at once, and
    torch's half-precision matmul on a CPU takes another path for several rows than for
    one on some hosts (an AMD EPYC with AVX2 only: float16 probabilities times values
    differ in the last bit at 34 rows, and never at one; docs/results/tests.md): the sum's
    order, not the arithmetic, differs, so no exact promise holds there by construction."""
    from cmasd.layers.cache import BlockScorer
    from cmasd.layers.prepared import encoder_of

    needs(dtype)
    model, dictionary = tiny_transformer(False, False)
    model = model.to(dtype)
    gen = torch.Generator().manual_seed(5)
    bsz, blocks = 16, (1, 4, 1, 34)
    src = torch.randint(4, len(dictionary), (bsz, 9), generator=gen)  # (B, S)
    src[:, -1] = dictionary.eos()
    src[0, :4], src[2, :1], src[9, :7] = dictionary.pad(), dictionary.pad(), dictionary.pad()
    net_input = {"src_tokens": src, "src_lengths": src.ne(dictionary.pad()).sum(1)}
    tokens = torch.randint(4, len(dictionary), (bsz, sum(blocks)), generator=gen)  # (B, T)
    tokens[:, 0] = dictionary.eos()
    with torch.no_grad():
        encoder_out = model.encoder.forward_torchscript(net_input)
        state, expected = {}, []
        for t in range(tokens.size(1)):
            expected.append(model.decoder(tokens[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0][:, -1])
        got_encoder = encoder_of(model.encoder, "native")(net_input)
        scorer = BlockScorer(model.decoder)
        cache, got, start = scorer.start(got_encoder, capacity=48), [], 0
        for n in blocks:
            got.append(scorer.score(cache, tokens[:, start : start + n], torch.full((bsz,), start)))  # (B, n, V)
            start += n
    assert torch.equal(got_encoder["encoder_out"][0], encoder_out["encoder_out"][0])
    got, expected = torch.cat(got, dim=1), torch.stack(expected, dim=1)  # (B, T, V) each
    singles = [start for start, n in zip(itertools.accumulate((0,) + blocks), blocks) if n == 1]  # [0, 5]
    assert torch.equal(got[:, singles], expected[:, singles])
    units = 8 * torch.finfo(dtype).eps  # a wrong mask or position moves the logits by whole units, not by these
    torch.testing.assert_close(got, expected, rtol=units, atol=units)


def test_exact_acceptance_breaks_ties_as_fairseq_beam_search():
    """Rows whose two best log-probabilities tie: the next token is the one fairseq's
    ``BeamSearch`` (``--beam 1``) takes, after a running score, at any position."""
    from fairseq.search import BeamSearch

    from cmasd.core.verifying import Proposal
    from cmasd.verification.acceptance import Exact

    gen = torch.Generator().manual_seed(2)
    rows, vocab = 64, 50
    lprobs = torch.log_softmax(torch.randn(rows, vocab, generator=gen), dim=-1)
    first, second = torch.randint(0, vocab, (2, rows), generator=gen)
    second = torch.where(second == first, (first + 1) % vocab, second)
    top = lprobs.max(dim=-1).values + 0.5
    lprobs[torch.arange(rows), first] = top
    lprobs[torch.arange(rows), second] = top  # (B, V): ties at the top
    search = BeamSearch(tiny_dictionary(vocab - 4))
    running = torch.full((rows, 1, 3), -7.25)  # (B, beam, step): the hypothesis's score so far
    _, fairseq_choice, _ = search.step(3, lprobs[:, None].clone(), running)  # (B, 2 x beam)
    empty = Proposal(torch.zeros(rows, 0, dtype=torch.long), torch.zeros(rows, dtype=torch.long))
    verdict = Exact().accept(empty, lprobs[:, None])
    assert torch.equal(verdict.next_token, fairseq_choice[:, 0])
    assert not torch.equal(lprobs.argmax(dim=-1), fairseq_choice[:, 0])  # argmax breaks some ties otherwise
