"""The verifier's block scoring against fairseq's own incremental decoding."""

import argparse
import types
import weakref

import pytest
import torch
from helpers import TINY_DIMS, tiny_bart, tiny_transformer
from fairseq.data import Dictionary
from fairseq.models.transformer import TransformerModel, base_architecture

from cmasd.layers import extension
from cmasd.layers.kernels import packing_available
from cmasd.layers.cache import BlockScorer, VerifierCache


def tiny_dictionary(vocab: int = 50):
    dictionary = Dictionary()
    for i in range(vocab):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def tiny_untied():
    """A Transformer with separate source, target and output embeddings, pre-norm layers,
    learned positions, an embedding layer norm and GELU."""
    dictionary = tiny_dictionary()
    args = argparse.Namespace(
        **TINY_DIMS, encoder_normalize_before=True, decoder_normalize_before=True, encoder_learned_pos=True,
        decoder_learned_pos=True, layernorm_embedding=True, activation_fn="gelu",
    )
    base_architecture(args)
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(0)
    model = TransformerModel.build_model(args, task).eval()
    assert model.decoder.output_projection.weight is not model.decoder.embed_tokens.weight
    return model, dictionary


# Verifier variants beyond tiny_transformer's four: BART, mBART-style pre-norm BART, untied
VARIANTS = {"bart": tiny_bart, "bart-pre-norm": lambda: tiny_bart(pre_norm=True), "untied-gelu": tiny_untied}


def incremental_logits(model, encoder_out, tokens):
    """fairseq's incremental decoding, one token per step: (B, T, V)."""
    state = {}
    steps = []
    for t in range(tokens.size(1)):
        logits, _ = model.decoder(tokens[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
        steps.append(logits[:, -1])
    return torch.stack(steps, dim=1)


KERNELS = [
    "native",
    pytest.param("packed", marks=pytest.mark.skipif(not packing_available(), reason="no oneDNN packed linear")),
    pytest.param("gemv", marks=pytest.mark.needs_gemv),
]


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("learned_pos", [False, True])
def test_ragged_blocks_equal_incremental_decoding(normalize_before, learned_pos, kernels):
    assert_ragged_blocks_equal_incremental_decoding(*tiny_transformer(normalize_before, learned_pos), kernels)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_ragged_blocks_of_other_variants_equal_incremental_decoding(variant, kernels):
    assert_ragged_blocks_equal_incremental_decoding(*VARIANTS[variant](), kernels)


def assert_ragged_blocks_equal_incremental_decoding(model, dictionary, kernels):
    pad = dictionary.pad()
    torch.manual_seed(1)
    bsz, src_len, tgt_len = 3, 7, 10
    src = torch.randint(4, len(dictionary), (bsz, src_len))
    src[0, :3] = pad  # fairseq left-pads sources
    src_lengths = src.ne(pad).sum(1)
    tgt = torch.randint(4, len(dictionary), (bsz, tgt_len))
    tgt[:, 0] = dictionary.eos()
    chunks = [[2, 3, 5], [1, 1, 8], [6, 4, 0]]  # tokens fed per call, per row

    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=src_lengths)
        expected = incremental_logits(model, encoder_out, tgt)  # (B, T, V)
        scorer = BlockScorer(model.decoder, kernels)
        cache = scorer.start(encoder_out, capacity=tgt_len + 8)  # room for padded slots
        got = torch.zeros_like(expected)
        start = torch.zeros(bsz, dtype=torch.long)
        for call in range(3):
            sizes = torch.tensor([row[call] for row in chunks])
            width = int(sizes.max())
            block = torch.full((bsz, width), pad)
            for b in range(bsz):
                block[b, : sizes[b]] = tgt[b, start[b] : start[b] + sizes[b]]
            logits = scorer.score(cache, block, start)  # (B, width, V)
            for b in range(bsz):
                got[b, start[b] : start[b] + sizes[b]] = logits[b, : sizes[b]]
            start = start + sizes

    assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_rollback_is_setting_the_length():
    """Rejected tokens leave entries past the kept prefix; rescoring other tokens at
    those positions must give the scores of a cache that never saw them."""
    model, dictionary = tiny_transformer(False, False)
    torch.manual_seed(2)
    src = torch.randint(4, len(dictionary), (2, 5))
    prefix = torch.randint(4, len(dictionary), (2, 6))
    prefix[:, 0] = dictionary.eos()
    rejected = torch.randint(4, len(dictionary), (2, 4))
    kept = torch.randint(4, len(dictionary), (2, 4))
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=torch.tensor([5, 5]))
        scorer = BlockScorer(model.decoder)
        zero = torch.zeros(2, dtype=torch.long)

        cache = scorer.start(encoder_out, capacity=16)
        scorer.score(cache, prefix, zero)
        scorer.score(cache, rejected, zero + 6)  # then rolled back to length 6
        after_rollback = scorer.score(cache, kept, zero + 6)

        fresh = scorer.start(encoder_out, capacity=16)
        scorer.score(fresh, prefix, zero)
        expected = scorer.score(fresh, kept, zero + 6)
    assert torch.allclose(after_rollback, expected, atol=1e-5)


def test_a_grown_cache_scores_as_a_large_one():
    """A cache started small and grown before each block (as the generator grows it)
    scores as fairseq's incremental decoder does; a block past the capacity is refused."""
    model, dictionary = tiny_transformer(True, True)
    torch.manual_seed(3)
    src = torch.randint(4, len(dictionary), (2, 6))
    tgt = torch.randint(4, len(dictionary), (2, 12))
    tgt[:, 0] = dictionary.eos()
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=torch.tensor([6, 6]))
        expected = incremental_logits(model, encoder_out, tgt)  # (B, T, V)
        scorer = BlockScorer(model.decoder)
        cache = scorer.start(encoder_out, capacity=2)
        with pytest.raises(ValueError, match="past the cache's capacity 2"):
            scorer.score(cache, tgt[:, :3], torch.zeros(2, dtype=torch.long))
        got = []
        for start, end in ((0, 2), (2, 5), (5, 12)):
            cache = cache.grow(end)
            assert cache.capacity == end
            got.append(scorer.score(cache, tgt[:, start:end], torch.full((2,), start)))
        assert cache.grow(4) is cache  # never shrinks
    torch.testing.assert_close(torch.cat(got, dim=1), expected, rtol=0, atol=1e-4)


def test_dropping_rows_copies_one_layer_at_a_time():
    """Where the rows cannot move in place (here a swap), dropping finished rows replaces each
    layer's keys and values before copying the next, so the copy never holds two whole caches
    (at 16 rows of 1,000 source tokens the encoder keys alone are 197 MB); the rows kept are
    the rows asked for, in order."""
    layers, alive, old = 3, [], []

    class Watched(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.Tensor.index_select:
                alive.append(sum(ref() is not None for ref in old))
            return super().__torch_function__(func, types, args, kwargs or {})

    torch.manual_seed(5)
    cross = [tuple(torch.randn(4, 2, 7, 3).as_subclass(Watched) for _ in range(2)) for _ in range(layers)]
    expected = [tuple(t.as_subclass(torch.Tensor)[[1, 0]] for t in pair) for pair in cross]
    old.extend(weakref.ref(t) for pair in cross for t in pair)
    cache = VerifierCache(kv=[torch.zeros(4, 4, 5, 3) for _ in range(layers)], cross=cross, cross_bias=None)
    del cross
    kept = cache.select(torch.tensor([1, 0]))
    assert alive == [6, 6, 4, 4, 2, 2]  # before: 6 each time, the old cache's lists held every layer
    assert all(ref() is None for ref in old)
    for (k, v), (k0, v0) in zip(kept.cross, expected):
        assert torch.equal(k.as_subclass(torch.Tensor), k0) and torch.equal(v.as_subclass(torch.Tensor), v0)
    assert [kv.size(0) for kv in kept.kv] == [2] * layers


@pytest.mark.needs_extension
def test_dropping_rows_moves_the_kept_ones_down_in_place():
    """With the extension loaded and the rows ascending (the loop's), the kept rows move down
    in each tensor's own memory: the same values as index_select, no new tensor, rows before
    the first dropped one untouched, a tensor listed twice moved once."""
    torch.manual_seed(6)
    kv = [torch.randn(5, 4, 6, 3) for _ in range(2)]
    shared = torch.randn(5, 2, 0, 3)  # a language model's empty encoder keys, one tensor for both
    cross = [(torch.randn(5, 2, 7, 3), torch.randn(5, 2, 7, 3)), (shared, shared)]
    rows = torch.tensor([0, 2, 4])
    expected_kv = [t[rows] for t in kv]
    expected_cross = [tuple(t[rows] for t in pair) for pair in cross]
    memory = [t.data_ptr() for t in kv]
    kept = VerifierCache(kv=list(kv), cross=list(cross), cross_bias=torch.zeros(5, 1, 1, 7)).select(rows)
    assert [t.data_ptr() for t in kept.kv] == memory  # in place
    for got, want in zip(kept.kv, expected_kv):
        assert torch.equal(got, want) and got.is_contiguous()
    for got, want in zip(kept.cross, expected_cross):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert kept.cross_bias.shape == (3, 1, 1, 7)
    again = kept.select(torch.tensor([1]))  # and again, on the first rows
    assert torch.equal(again.kv[0], expected_kv[0][[1]])


@pytest.mark.needs_extension
def test_compact_rows_refuses_what_it_cannot_move_in_place():
    """Rows whose source an earlier move overwrote (a swap), repeated or out of range,
    non-contiguous or overlapping tensors: False and nothing moved (keep_rows then copies
    with index_select); every order whose moves read rows not yet written is done in place."""
    module = extension.load()[0]
    x = torch.arange(24.0).view(6, 4)
    before = x.clone()
    for rows in ([1, 0], [0, 2, 1], [1, 1], [0, 6], [-1, 2]):
        assert not module.compact_rows([x], torch.tensor(rows)), rows
    assert not module.compact_rows([x.t()], torch.tensor([0, 1]))
    assert not module.compact_rows([x, x[1:]], torch.tensor([0, 1]))
    assert not module.compact_rows([x], torch.tensor([0.0, 1.0]))
    assert torch.equal(x, before)
    assert module.compact_rows([x, x], torch.tensor([1, 3, 5])) and torch.equal(x[:3], before[[1, 3, 5]])
    x = before.clone()
    assert module.compact_rows([x], torch.tensor([0, 5, 2, 4])) and torch.equal(x[:4], before[[0, 5, 2, 4]])
    assert module.compact_rows([x], torch.tensor([], dtype=torch.long))  # nothing kept: nothing to move


@pytest.mark.parametrize("variant", ["pre-norm"] + sorted(VARIANTS))
def test_the_bench_floor_scores_as_fairseqs_teacher_forced_pass(variant):
    """cmasd-bench's floor (encoder, then the block scorer over the whole right-padded
    target at once) gives fairseq's teacher-forced logits at every real position."""
    from cmasd.tools.bench.floor import FloorScorer, teacher_forced_input

    model, dictionary = tiny_transformer(True, False) if variant == "pre-norm" else VARIANTS[variant]()
    eos, pad = dictionary.eos(), dictionary.pad()
    torch.manual_seed(4)
    src = torch.randint(4, len(dictionary), (3, 6))
    src[1, :2] = pad  # fairseq left-pads sources
    sample = {"id": torch.tensor([7, 8, 9]), "net_input": {"src_tokens": src, "src_lengths": src.ne(pad).sum(1)}}
    hypotheses = {  # outputs of different lengths, eos last
        i: torch.randint(4, len(dictionary), (n,)).tolist() + [eos] for i, n in ((7, 9), (8, 3), (9, 6))
    }
    net_input = teacher_forced_input(sample, hypotheses, eos, pad)
    with torch.no_grad():
        expected, _ = model(**net_input)  # (B, T, V)
        got = FloorScorer(model)(net_input)
    for b, n in enumerate((10, 4, 7)):  # eos + the hypothesis without its eos
        torch.testing.assert_close(got[b, :n], expected[b, :n], rtol=0, atol=1e-4)


@pytest.mark.needs_gemv
@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("bsz", [1, 2])
def test_fused_layers_score_as_fairseq_and_as_layer_by_layer(normalize_before, bsz):
    """gemv kernels at a block the fused layers take whole: the decoder's layers in one
    C++ call (FusedDecoder), against fairseq's incremental decoding and against the same
    layers run one by one from Python; ragged rows, rows without padding too."""

    model, dictionary = tiny_transformer(normalize_before, learned_pos=True)
    pad = dictionary.pad()
    torch.manual_seed(5)
    src = torch.randint(4, len(dictionary), (bsz, 7))
    if bsz > 1:
        src[0, :3] = pad  # left-padded source: a cross mask
    tgt = torch.randint(4, len(dictionary), (bsz, 9))
    tgt[:, 0] = dictionary.eos()
    chunks = [[1, 4, 3, 1], [2, 2, 4, 1]][:bsz]
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=src.ne(pad).sum(1))
        expected = incremental_logits(model, encoder_out, tgt)  # (B, T, V)
        scorers = [BlockScorer(model.decoder, "gemv") for _ in range(2)]
        assert scorers[0].decoder.fused is not None
        scorers[1].decoder.fused = None  # layer by layer
        results = []
        for scorer in scorers:
            cache = scorer.start(encoder_out, capacity=4)
            got = torch.zeros_like(expected)
            start = torch.zeros(bsz, dtype=torch.long)
            for call in range(4):
                sizes = torch.tensor([row[call] for row in chunks])
                width = int(sizes.max())
                assert scorers[0].decoder.takes_whole(bsz, width)
                cache = cache.grow(int((start + width).max()))
                block = torch.full((bsz, width), pad)
                for b in range(bsz):
                    block[b, : sizes[b]] = tgt[b, start[b]: start[b] + sizes[b]]
                logits = scorer.score(cache, block, start)
                for b in range(bsz):
                    got[b, start[b]: start[b] + sizes[b]] = logits[b, : sizes[b]]
                start = start + sizes
            results.append(got)
    fused, layered = results
    torch.testing.assert_close(fused, layered, rtol=0, atol=1e-5)
    torch.testing.assert_close(fused, expected, rtol=0, atol=1e-4)
    assert torch.equal(fused.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("learned_pos", [False, True])
def test_prepared_encoder_encodes_as_fairseq(kernels, normalize_before, learned_pos):
    assert_prepared_encoder_encodes_as_fairseq(*tiny_transformer(normalize_before, learned_pos), kernels)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prepared_encoder_of_other_variants_encodes_as_fairseq(variant, kernels):
    assert_prepared_encoder_encodes_as_fairseq(*VARIANTS[variant](), kernels)


def assert_prepared_encoder_encodes_as_fairseq(model, dictionary, kernels):
    """The encoder on prepared layers (DecodingEncoder) returns fairseq's encoder output
    to float tolerance, padded and unpadded batches alike."""
    from cmasd.layers.prepared import DecodingEncoder, encoder_of

    pad = dictionary.pad()
    torch.manual_seed(6)
    for padded in (False, True):
        src = torch.randint(4, len(dictionary), (3, 9))
        src[:, -1] = dictionary.eos()
        if padded:
            src[0, :4] = pad  # fairseq left-pads sources
            src[2, :1] = pad
        net_input = {"src_tokens": src, "src_lengths": src.ne(pad).sum(1)}
        with torch.no_grad():
            expected = model.encoder.forward_torchscript(net_input)
            encode = encoder_of(model.encoder, kernels)
            assert isinstance(encode, DecodingEncoder)
            # gemv and bf16 kernels: every layer in one C++ call (the fused layers), others layer by layer
            assert (encode.fused is not None and encode.takes_whole(3, 9)) == (kernels in ("gemv", "bf16"))
            got = encode(net_input)
        assert set(got) == set(expected)
        real = ~expected["encoder_padding_mask"][0].t()[..., None]  # (S, B, 1): padded positions are not read
        torch.testing.assert_close(got["encoder_out"][0] * real, expected["encoder_out"][0] * real, rtol=0, atol=1e-5)
        assert torch.equal(got["encoder_padding_mask"][0], expected["encoder_padding_mask"][0])
        assert torch.equal(got["src_lengths"][0], expected["src_lengths"][0])
        torch.testing.assert_close(got["encoder_embedding"][0], expected["encoder_embedding"][0])


@pytest.mark.needs_gemv
def test_a_batch_of_many_sources_encodes_in_the_fused_layers_as_fairseq():
    """A batch past the decoder's row limit (20 sources of 40 tokens: 800 rows, FUSED_MAX_ROWS 256),
    left-padded rows among them, in one fused call (ENCODER_MAX_ROWS)."""
    from cmasd.layers.prepared import FUSED_MAX_ROWS, encoder_of

    model, dictionary = tiny_transformer(True, True)
    pad = dictionary.pad()
    torch.manual_seed(8)
    src = torch.randint(4, len(dictionary), (20, 40))
    src[:, -1] = dictionary.eos()
    for row in range(0, 20, 3):
        src[row, : row + 1] = pad
    net_input = {"src_tokens": src, "src_lengths": src.ne(pad).sum(1)}
    encode = encoder_of(model.encoder, "gemv")
    assert src.numel() > FUSED_MAX_ROWS and encode.takes_whole(*src.shape)
    with torch.no_grad():
        expected = model.encoder.forward_torchscript(net_input)["encoder_out"][0]
        got = encode(net_input)["encoder_out"][0]
    real = src.ne(pad).t()[..., None]  # (S, B, 1)
    torch.testing.assert_close(got * real, expected * real, rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", ["post-norm", "bart"])
def test_a_long_source_encodes_and_decodes_as_fairseq(variant):
    """A source long enough for the fused attention kernel (FUSED_ATTENTION_MIN_PAIRS) in
    the encoder, left-padded rows too; the cross keys of every later block come from it."""
    from cmasd.layers.prepared import FUSED_ATTENTION_MIN_PAIRS, encoder_of

    model, dictionary = tiny_transformer(False, False) if variant == "post-norm" else VARIANTS[variant]()
    pad, length = dictionary.pad(), 300
    assert length * length >= FUSED_ATTENTION_MIN_PAIRS
    if variant == "bart":  # room for a long source in its learned positions (64 at build)
        model.encoder.embed_positions.weight.data = torch.randn(length + 2, 32)
        model.decoder.embed_positions.weight.data = torch.randn(length + 2, 32)
    torch.manual_seed(7)
    src = torch.randint(4, len(dictionary), (2, length))
    src[:, -1] = dictionary.eos()
    src[1, : length // 3] = pad
    net_input = {"src_tokens": src, "src_lengths": src.ne(pad).sum(1)}
    tgt = torch.randint(4, len(dictionary), (2, 6))
    tgt[:, 0] = dictionary.eos()
    with torch.no_grad():
        expected_enc = model.encoder.forward_torchscript(net_input)
        expected = incremental_logits(model, expected_enc, tgt)  # (B, T, V)
        got_enc = encoder_of(model.encoder, "native")(net_input)
        scorer = BlockScorer(model.decoder)
        cache = scorer.start(got_enc, capacity=8)
        got = torch.cat([scorer.score(cache, tgt[:, :2], torch.zeros(2, dtype=torch.long)),
                         scorer.score(cache, tgt[:, 2:], torch.full((2,), 2))], dim=1)
    real = ~expected_enc["encoder_padding_mask"][0].t()[..., None]  # (S, B, 1)
    torch.testing.assert_close(got_enc["encoder_out"][0] * real, expected_enc["encoder_out"][0] * real,
                               rtol=0, atol=1e-4)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


def tiny_decoder(normalize_before: bool, dim: int, heads: int, cross: bool, activation: str = "relu"):
    """A random 2-layer fairseq Transformer decoder of ``dim`` dimensions and ``heads`` heads
    (feed-forward 2 dim + 8: a partial last panel, ``activation`` between), with or without
    encoder attention, its layer norms' weights and biases random too."""
    from fairseq.models.transformer import TransformerDecoder

    dictionary = tiny_dictionary()
    args = argparse.Namespace(
        encoder_layers=1, decoder_layers=2, encoder_embed_dim=dim, decoder_embed_dim=dim,
        encoder_ffn_embed_dim=2 * dim, decoder_ffn_embed_dim=2 * dim + 8, encoder_attention_heads=heads,
        decoder_attention_heads=heads, decoder_normalize_before=normalize_before, max_target_positions=64,
        activation_fn=activation,
    )
    base_architecture(args)
    torch.manual_seed(8)
    embed = torch.nn.Embedding(len(dictionary), dim, dictionary.pad())
    decoder = TransformerDecoder(args, dictionary, embed, no_encoder_attn=not cross).eval()
    with torch.no_grad():
        for module in decoder.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.3)
                module.bias.normal_(0.0, 0.3)
    return decoder


# (B, n): one row of one and of a few positions, a few rows, 16 rows, 64 rows, 16 rows of 5
# positions (past 64, the limit until 2026-12-07), FUSED_MAX_ROWS rows
FUSED_SHAPES = [(1, 1), (1, 5), (3, 4), (16, 1), (8, 8), (16, 5), (32, 8)]


@pytest.mark.needs_gemv
@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("cross", [True, False])
# head dims 8, 9 (scalar tails), 64 (folded); fairseq's GELU (BART's layers) at one of them
@pytest.mark.parametrize("dim,heads,activation", [(32, 4, "relu"), (36, 4, "relu"), (128, 2, "relu"),
                                                  (32, 4, "gelu")])
def test_fused_layers_equal_the_python_layers(normalize_before, cross, dim, heads, activation):
    """The C++ FusedDecoder against the same prepared layers run one by one from Python
    (DecodingDecoder.block_states either way): post- and pre-norm, with and without encoder
    attention (a padded source: a cross mask), the causal rule applied in C++ (no self mask)
    and explicit self masks (per row, and broadcast over the rows), the positions as (B, n)
    or as the scatter index (B, 2H, n, d), all layers or the upper ones, 1 and 2 threads, at
    several B x n up to FUSED_MAX_ROWS: the same states and the same cache entries."""
    from cmasd.layers.prepared import FUSED_MAX_ROWS, DecodingDecoder, additive_mask

    decoder = tiny_decoder(normalize_before, dim, heads, cross, activation)
    fused, layered = DecodingDecoder(decoder, "gemv"), DecodingDecoder(decoder, "gemv")
    assert fused.fused is not None
    layered.fused = None
    layers, head_dim = len(fused.layers), dim // heads
    threads = torch.get_num_threads()
    torch.manual_seed(9)
    try:
        for bsz, n in FUSED_SHAPES:
            assert bsz * n <= FUSED_MAX_ROWS and fused.takes_whole(bsz, n)
            capacity = 10 + n
            start = torch.randint(0, 8, (bsz,))
            index = start[:, None] + torch.arange(n)  # (B, n)
            where = index[:, None, :, None].expand(bsz, 2 * heads, n, head_dim)
            used = int(index.max()) + 1
            kv = [torch.randn(bsz, 2 * heads, capacity, head_dim) for _ in range(layers)]  # a "cached prefix"
            x = torch.randn(bsz, n, dim)
            if cross:
                visible = torch.ones(bsz, 7, dtype=torch.bool)
                visible[0, :3] = bsz == 1  # a padded source where there are rows beside it
                keys, cross_bias = fused.cross_keys(torch.randn(bsz, 7, dim), visible)
            else:
                keys, cross_bias = [(torch.empty(0), torch.empty(0))] * layers, None
            key_pos = torch.arange(used)
            own = key_pos == index[:, :, None]  # (B, n, used)
            seen = ((key_pos <= index[:, :, None]) & (torch.rand(bsz, n, used) > 0.3)) | own
            masks = {"causal": None, "mask": additive_mask(seen[:, None], x),
                     "broadcast mask": additive_mask((seen[:1] | (key_pos == 0))[:, None], x)}  # (1, 1, n, used)
            for (name, bias), positions, first in [
                ((name, bias), positions, first) for name, bias in masks.items() for positions in (index, where)
                for first in (0, 1)
            ]:
                one_thread = None
                for count in (1, 2):
                    torch.set_num_threads(count)
                    caches = [[c.clone() for c in kv] for _ in range(2)]
                    got = fused.block_states(x, caches[0], positions, used, bias, keys, cross_bias, first)
                    want = layered.block_states(x, caches[1], positions, used, bias, keys, cross_bias, first)
                    case = f"B {bsz}, n {n}, {name}, positions {tuple(positions.shape)}, from layer {first}, {count} threads"
                    torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=lambda m: f"{case}: {m}")
                    for a, b in zip(*caches):
                        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=lambda m: f"{case}, cache: {m}")
                    if one_thread is None:
                        one_thread = got
                    else:  # the same items whatever the threads: the same results, bit for bit
                        assert torch.equal(got, one_thread), case
    finally:
        torch.set_num_threads(threads)


@pytest.mark.needs_gemv
def test_the_fused_layers_take_the_blocks_within_their_limits():
    """A block runs in the fused C++ call up to FUSED_MAX_ROWS rows of at most
    FUSED_MAX_WIDTH positions each (16 rows of 5 positions, past the 64 rows of before,
    included), layer by layer past either limit; on other kernels never."""
    from cmasd.layers.prepared import FUSED_MAX_ROWS, FUSED_MAX_WIDTH, DecodingDecoder

    decoder = tiny_decoder(True, 32, 4, True)
    fused, native = DecodingDecoder(decoder, "gemv"), DecodingDecoder(decoder, "native")
    calls = []

    class Counted:  # the C++ call, counted
        def __init__(self, inner):
            self.inner = inner

        def states(self, *args):
            calls.append(args[0].shape[:2])
            return self.inner.states(*args)

    fused.fused = Counted(fused.fused)
    widest = FUSED_MAX_ROWS // FUSED_MAX_WIDTH  # rows of the widest block taken whole
    for bsz, n, whole in [(1, 1, True), (16, 5, True), (widest, FUSED_MAX_WIDTH, True),
                          (1, FUSED_MAX_WIDTH + 1, False), (FUSED_MAX_ROWS // 4 + 1, 4, False)]:
        assert fused.takes_whole(bsz, n) == whole and not native.takes_whole(bsz, n)
        calls.clear()
        capacity = n + 2
        kv = [torch.zeros(bsz, 2 * fused.heads, capacity, fused.head_dim) for _ in fused.layers]
        keys, cross_bias = fused.cross_keys(torch.randn(bsz, 3, 32), torch.ones(bsz, 3, dtype=torch.bool))
        index = torch.arange(n)[None].expand(bsz, n)
        fused.block_states(torch.randn(bsz, n, 32), kv, index, n, None, keys, cross_bias)
        assert calls == ([(bsz, n)] if whole else []), (bsz, n)


@pytest.mark.needs_gemv
def test_fused_layers_refuse_what_they_cannot_run():
    """Positions past a cache's capacity, a mask that does not broadcast, caches of another
    shape: errors, not writes out of bounds."""
    from cmasd.layers.prepared import DecodingDecoder

    decoder = tiny_decoder(False, 32, 4, True)
    dec = DecodingDecoder(decoder, "gemv")
    fused = dec.fused
    x = torch.randn(1, 2, 32)
    kv = [torch.zeros(1, 8, 4, 8) for _ in range(2)]
    keys, _ = dec.cross_keys(torch.randn(1, 5, 32), torch.ones(1, 5, dtype=torch.bool))
    ks, vs = [k for k, _ in keys], [v for _, v in keys]
    fused.states(x, kv, torch.tensor([[2, 3]]), 4, None, ks, vs, None, True)  # fits
    with pytest.raises(RuntimeError, match="capacity"):
        fused.states(x, kv, torch.tensor([[3, 4]]), 5, None, ks, vs, None, True)
    with pytest.raises(RuntimeError, match="broadcast"):
        fused.states(x, kv, torch.tensor([[2, 3]]), 4, torch.zeros(1, 1, 2, 3), ks, vs, None, False)
    with pytest.raises(RuntimeError, match="caches"):
        fused.states(x, [torch.zeros(1, 8, 4, 4)] * 2, torch.tensor([[2, 3]]), 4, None, ks, vs, None, True)


@pytest.mark.parametrize("learned_pos", [False, True])
def test_a_plain_input_embeds_as_fairseqs_modules(learned_pos):
    """``DecodingDecoder.embed``'s tables read once give fairseq's input embedding bit for
    bit, at every position up to the decoder's last; an input with a layer norm goes
    through the modules."""
    from cmasd.layers.prepared import DecodingDecoder
    from cmasd.layers.transformer import embed

    model, dictionary = tiny_transformer(normalize_before=False, learned_pos=learned_pos)
    decoder = model.decoder
    prepared = DecodingDecoder(decoder, "native")
    last = decoder.padding_idx + decoder.max_positions()
    positions = torch.arange(decoder.padding_idx + 1, last + 1).view(4, -1)  # (4, 16)
    tokens = torch.randint(4, len(dictionary), positions.shape, generator=torch.Generator().manual_seed(2))
    assert prepared.input_tables is not None
    assert torch.equal(prepared.embed(tokens, positions), embed(decoder, tokens, positions))
    with torch.no_grad():  # fairseq's own forward: one row, positions from padding_idx + 1 on
        ours = prepared.embed(tokens[:1], positions[:1])
        x = decoder.embed_scale * decoder.embed_tokens(tokens[:1])
        x += decoder.embed_positions(tokens[:1])
    assert torch.equal(ours, x)
    decoder.layernorm_embedding = torch.nn.LayerNorm(decoder.embed_tokens.embedding_dim)
    assert DecodingDecoder(decoder, "native").input_tables is None


@pytest.mark.needs_extension
@pytest.mark.parametrize("learned_pos", [False, True])
def test_the_native_input_embeds_as_the_tables_do(learned_pos):
    """With the C++ layers, ``BlockScorer.embed`` is one ``embed_rows`` call: bit for bit
    the tables' sum at positions from each row's start, clamped at the decoder's last,
    and a token outside the table is refused."""
    model, dictionary = tiny_transformer(normalize_before=False, learned_pos=learned_pos)
    scorer = BlockScorer(model.decoder, "gemv")
    assert scorer.decoder.fused is not None
    tokens = torch.randint(4, len(dictionary), (3, 5), generator=torch.Generator().manual_seed(4))
    start = torch.tensor([0, 7, 62])  # the last row runs past the decoder's last position
    index = (start[:, None] + torch.arange(5)[None, :] + scorer.padding_idx + 1).clamp(max=scorer.last_position)
    assert torch.equal(scorer.embed(tokens, start), scorer.decoder.embed(tokens, index))
    with pytest.raises(RuntimeError, match="outside the table"):
        scorer.embed(torch.full((1, 1), len(dictionary) + 3), start[:1])
