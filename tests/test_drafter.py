"""Spec-Drafter unit tests on tiny in-process models (CPU, seconds): attention masks,
cache == recompute, ragged batches, dictionary and verifier-path errors, and the
training-data helpers (cut points, block labels, glancing, acceptance length)."""

import copy
import os
import subprocess
import sys
import types
from dataclasses import replace

import pytest
import torch
from helpers import (BLOCK, REPO, WORDS, encoded_source, random_tokens, sequences, source_batch,  # noqa: F401
                     tiny_dictionary, tiny_drafter, tiny_task, tiny_verifier_args)
from fairseq.data import LanguagePairDataset
from fairseq.models.transformer import TransformerModel

from cmasd.training.criterion import accepted_lengths, block_labels, glance_tokens, glat_ratio, parse_glat_schedule
from cmasd.drafters.spec_drafter import SpecDrafter
from cmasd.models.spec_drafter import SpecDrafterConfig, SpecDrafterModel
from cmasd.training.task import BlockCutDataset, fixed_cuts, random_cuts

FAST_PATH_COPIES = {f"{part}_{kind}" for part in ("in_proj", "out_proj", "fc1", "fc2") for kind in ("weight", "bias")}

ARCHS = [
    pytest.param(False, False, id="sinusoidal-postnorm"),
    pytest.param(True, True, id="learned-prenorm"),
]


@pytest.mark.parametrize("learned_pos,normalize_before", ARCHS)
def test_dimensions_and_initialisation_follow_the_verifier(learned_pos, normalize_before):
    drafter, verifier, _ = tiny_drafter(learned_pos, normalize_before)
    assert len(drafter.decoder.layers) == 2
    assert drafter.decoder.embed_dim == verifier.decoder.embed_dim
    assert type(drafter.decoder.embed_positions) is type(verifier.decoder.embed_positions)
    assert torch.equal(drafter.decoder.embed_tokens.weight, verifier.decoder.embed_tokens.weight)
    # tied output projection; the frozen encoder is the verifier's
    assert drafter.decoder.output_projection.weight is drafter.decoder.embed_tokens.weight
    theirs = verifier.encoder.state_dict()
    for name, mine in drafter.encoder.state_dict().items():
        # stock fairseq 0.12.2's fused copies of a layer's weights, filled when loaded
        if name.split(".")[-1] not in FAST_PATH_COPIES:
            assert torch.equal(mine, theirs[name]), name
    assert not any(p.requires_grad for p in drafter.encoder.parameters())
    drafter.train()
    assert not drafter.encoder.training and drafter.decoder.training


@pytest.mark.parametrize("learned_pos,normalize_before", ARCHS)
def test_blocks_never_see_tokens_at_or_after_their_cut(learned_pos, normalize_before):
    """Masks: prefix positions are causal and a slot group sees only the prefix below
    its cut, so changing tokens at index >= c leaves every block cut at <= c unchanged."""
    drafter, _, dictionary = tiny_drafter(learned_pos, normalize_before)
    gen = torch.Generator().manual_seed(1)
    src, src_lengths = source_batch(dictionary, gen)
    prev = sequences(dictionary, gen, 3, 9)  # (B, T)
    starts = torch.tensor([[1, 3, 5, 9]]).expand(3, 4)  # (B, G)
    changed = prev.clone()
    changed[:, 5:] = random_tokens(dictionary, (3, 4), gen)
    with torch.no_grad():
        before = drafter(src, src_lengths, prev, starts)  # (B, G, K, V)
        after = drafter(src, src_lengths, changed, starts)
    assert before.shape == (3, 4, BLOCK, len(dictionary))
    torch.testing.assert_close(before[:, :3], after[:, :3], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, 3], after[:, 3])


def test_slot_groups_are_independent():
    drafter, _, dictionary = tiny_drafter()
    gen = torch.Generator().manual_seed(2)
    src, src_lengths = source_batch(dictionary, gen)
    prev = sequences(dictionary, gen, 3, 8)
    starts = torch.tensor([[2, 2, 6]]).expand(3, 3)
    pad = dictionary.pad()
    glance = torch.full((3, 3, BLOCK), pad)
    glance[:, 1, 1] = random_tokens(dictionary, (3,), gen)  # gold input in group 1 only
    with torch.no_grad():
        plain = drafter(src, src_lengths, prev, starts)
        glanced = drafter(src, src_lengths, prev, starts, glance)
    torch.testing.assert_close(plain[:, 0], plain[:, 1])  # same cut, same output
    torch.testing.assert_close(plain[:, [0, 2]], glanced[:, [0, 2]], rtol=0, atol=1e-6)
    assert not torch.allclose(plain[:, 1], glanced[:, 1])


def draft_from_scratch(drafter, encoder_out, tokens, lengths):
    drafting = SpecDrafter(drafter)
    state = drafting.start_cache(encoder_out, tokens.size(1) + 1)
    return drafting.logits(state, tokens, lengths)[0]


@pytest.mark.parametrize("learned_pos,normalize_before", ARCHS)
def test_cached_drafting_equals_recompute_with_ragged_growth(learned_pos, normalize_before):
    drafter, verifier, dictionary = tiny_drafter(learned_pos, normalize_before)
    drafting = SpecDrafter(drafter)
    gen = torch.Generator().manual_seed(3)
    bsz, capacity = 3, 16
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, bsz)
    full = sequences(dictionary, gen, bsz, capacity)  # what the rows will have accepted
    lengths = torch.ones(bsz, dtype=torch.long)
    state = drafting.start_cache(encoder_out, capacity)
    growth = [[3, 1, 5], [0, 2, 1], [4, 4, 0], [1, 6, 2], [2, 0, 3]]  # ragged, some rows idle
    for step in range(len(growth) + 1):
        tokens = full.masked_fill(torch.arange(capacity)[None, :] >= lengths[:, None], dictionary.pad())
        logits, state = drafting.logits(state, tokens, lengths)  # (B, K, V)
        assert logits.shape == (bsz, BLOCK, len(dictionary))
        assert torch.equal(state.cached, lengths)
        fresh = draft_from_scratch(drafter, encoder_out, tokens, lengths)
        torch.testing.assert_close(logits, fresh, rtol=0, atol=1e-5)
        # the training pass (eval mode) sees the same blocks: cut point = length
        with torch.no_grad():
            trained = drafter(src, src_lengths, tokens[:, : int(lengths.max())], lengths[:, None])
        torch.testing.assert_close(logits, trained[:, 0], rtol=0, atol=1e-5)
        if step < len(growth):
            lengths = lengths + torch.tensor(growth[step])


@pytest.mark.needs_gemv
@pytest.mark.parametrize("kernels", ["gemv", "bf16"])
@pytest.mark.parametrize("learned_pos,normalize_before", ARCHS)
def test_fused_drafting_equals_layer_by_layer_with_ragged_growth(learned_pos, normalize_before, kernels, monkeypatch):
    """On gemv or bf16 kernels a pass runs in the fused C++ layers, the slots' keys written past
    each row's prefix (the next pass overwrites them): the logits are those of the same kernels
    layer by layer, pass after pass, rows growing raggedly or not at all, the cache grown where
    the slots would pass its end (started here with room for the prefixes alone)."""
    drafter, verifier, dictionary = tiny_drafter(learned_pos, normalize_before)
    fused, stepwise = SpecDrafter(drafter, kernels), SpecDrafter(drafter, kernels)
    assert fused.decoder.fused is not None
    monkeypatch.setattr(fused, "block_logits", None)  # a pass that is not fused fails
    monkeypatch.setattr(stepwise.decoder, "takes_whole", lambda batch, width: False)
    gen = torch.Generator().manual_seed(8)
    bsz, capacity = 3, 16
    _, _, encoder_out = encoded_source(verifier, dictionary, gen, bsz)
    full = sequences(dictionary, gen, bsz, capacity)
    lengths = torch.ones(bsz, dtype=torch.long)
    states = [drafting.start_cache(encoder_out, capacity) for drafting in (fused, stepwise)]
    growth = [[3, 1, 5], [0, 2, 1], [4, 4, 0], [1, 6, 2], [2, 0, 3]]
    for step in range(len(growth) + 1):
        tokens = full.masked_fill(torch.arange(capacity)[None, :] >= lengths[:, None], dictionary.pad())
        (logits, states[0]), (expected, states[1]) = (
            drafting.logits(state, tokens, lengths) for drafting, state in zip((fused, stepwise), states))
        assert torch.equal(states[0].cached, lengths)
        assert states[0].capacity >= int(lengths.max()) + BLOCK  # grown to hold the slots
        torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
        if step < len(growth):
            lengths = lengths + torch.tensor(growth[step])
    if kernels == "gemv":  # and the native layers' logits, as every kernel's
        torch.testing.assert_close(logits, draft_from_scratch(drafter, encoder_out, tokens, lengths), rtol=0, atol=1e-5)


@pytest.mark.needs_gemv
@pytest.mark.parametrize("learned_pos,normalize_before", ARCHS)
def test_the_fused_pass_inputs_in_one_call_equal_the_operators(learned_pos, normalize_before, monkeypatch):
    """``SpecDrafter.fused_inputs`` in one C++ call (``spec_block_inputs``) and on torch's
    operators: the same inputs, limits and cache indices, value for value, pass after pass, rows
    feeding different counts (none, and past the tokens' width), padding sent to the scratch
    column, slots past the decoder's last position sharing it."""
    from cmasd.layers import extension

    drafter, verifier, dictionary = tiny_drafter(learned_pos, normalize_before)
    drafting = SpecDrafter(drafter, "gemv")
    module = extension.load()[0]
    calls = []
    spy = type("Spy", (), {"spec_block_inputs": lambda self, *a: calls.append(1) or module.spec_block_inputs(*a),
                           "__getattr__": lambda self, name: getattr(module, name)})()
    gen = torch.Generator().manual_seed(5)
    bsz, capacity = 3, 16
    _, _, encoder_out = encoded_source(verifier, dictionary, gen, bsz)
    state = drafting.start_cache(encoder_out, capacity)
    full = sequences(dictionary, gen, bsz, capacity)
    last = drafting.embedding.last_position
    for cached, lengths, width in (([0, 0, 0], [1, 4, 2], 16), ([1, 4, 2], [5, 4, 3], 16), ([3, 2, 7], [9, 9, 8], 8),
                                   ([1, 1, 1], [last, last - 3, 2], 16)):
        cached, lengths = torch.tensor(cached), torch.tensor(lengths)
        step = replace(state, cached=cached)
        tokens = full[:, :width]
        most_new = int((lengths - cached).max())
        monkeypatch.setattr(drafting.decoder, "native", spy)
        got = drafting.fused_inputs(step, tokens, lengths, most_new, BLOCK)
        monkeypatch.setattr(drafting, "inputs_in_one_call", False)  # the operators
        expected = drafting.fused_inputs(step, tokens, lengths, most_new, BLOCK)
        monkeypatch.undo()
        for a, b in zip(got, expected):
            assert a.dtype == b.dtype and torch.equal(a, b)
    assert len(calls) == 4


@pytest.mark.needs_gemv
def test_query_limits_layer_by_layer_equal_the_fused_layers():
    """``DecodingDecoder.block_states`` with ``limits`` (each query sees the cache up to its own
    limit, past its own position where the limit says so): the fused C++ layers and the layers
    one by one (the mask built from the limits) give the same states and write the same keys."""
    drafter, verifier, dictionary = tiny_drafter()
    decoder = SpecDrafter(drafter, "gemv").decoder
    gen = torch.Generator().manual_seed(9)
    _, _, encoder_out = encoded_source(verifier, dictionary, gen, 2)
    cross, cross_bias = decoder.cross_keys(encoder_out["encoder_out"][0].transpose(0, 1),
                                           ~encoder_out["encoder_padding_mask"][0])
    index = torch.tensor([[3, 4, 5, 6], [1, 2, 3, 4]])
    limits = torch.tensor([[3, 6, 6, 6], [1, 4, 4, 4]])  # a prefix token, then three slots seeing each other
    x = torch.randn(2, 4, drafter.decoder.embed_dim, generator=gen)
    kv = [torch.randn(2, 2 * decoder.heads, 9, decoder.head_dim, generator=gen) for _ in decoder.layers]
    fused_kv = [t.clone() for t in kv]
    fused = decoder.block_states(x, fused_kv, index, 7, None, cross, cross_bias, limits=limits)
    decoder.takes_whole = lambda batch, width: False
    stepwise = decoder.block_states(x, kv, index, 7, None, cross, cross_bias, limits=limits)
    torch.testing.assert_close(fused, stepwise, rtol=0, atol=1e-5)
    for a, b in zip(fused_kv, kv):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    causal = decoder.block_states(x, [t.clone() for t in kv], index, 7, None, cross, cross_bias)
    assert not torch.allclose(causal[:, 1:3], stepwise[:, 1:3], atol=1e-4)  # the limits were heeded


def test_a_grown_cache_drafts_as_a_large_one():
    drafter, verifier, dictionary = tiny_drafter()
    drafting = SpecDrafter(drafter)
    gen = torch.Generator().manual_seed(6)
    _, _, encoder_out = encoded_source(verifier, dictionary, gen, 2)
    full = sequences(dictionary, gen, 2, 12)
    state = drafting.start_cache(encoder_out, 3)
    for lengths in ([2, 3], [6, 4], [7, 11]):
        lengths = torch.tensor(lengths)
        state = state.grow(int(lengths.max()))
        assert state.capacity == int(lengths.max()) and state.kv[0].size(2) == state.capacity + 1
        tokens = full.masked_fill(torch.arange(12)[None, :] >= lengths[:, None], dictionary.pad())
        logits, state = drafting.logits(state, tokens, lengths)
        torch.testing.assert_close(logits, draft_from_scratch(drafter, encoder_out, tokens, lengths), rtol=0, atol=1e-5)
    assert state.grow(5) is state  # never shrinks


def test_row_selection_keeps_rows_consistent():
    drafter, verifier, dictionary = tiny_drafter()
    drafting = SpecDrafter(drafter)
    gen = torch.Generator().manual_seed(4)
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, 3)
    tokens = sequences(dictionary, gen, 3, 10)
    lengths = torch.tensor([4, 2, 6])
    state = drafting.start_cache(encoder_out, 10)
    _, state = drafting.logits(state, tokens, lengths)
    keep = torch.tensor([2, 0])
    state = state.select(keep)
    assert state.cached.tolist() == [6, 4] and state.kv[0].size(0) == 2
    tokens, lengths = tokens[keep], torch.tensor([8, 5])
    logits, _ = drafting.logits(state, tokens, lengths)
    fresh = draft_from_scratch(drafter, {k: [v[0].index_select(1 if k == "encoder_out" else 0, keep)]
                                         for k, v in encoder_out.items() if k in ("encoder_out", "encoder_padding_mask")},
                               tokens, lengths)
    torch.testing.assert_close(logits, fresh, rtol=0, atol=1e-5)


def test_projecting_fewer_slots_keeps_their_logits():
    drafter, verifier, dictionary = tiny_drafter()
    drafting = SpecDrafter(drafter)
    gen = torch.Generator().manual_seed(5)
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, 2)
    tokens, lengths = sequences(dictionary, gen, 2, 8), torch.tensor([5, 3])
    full, _ = drafting.logits(drafting.start_cache(encoder_out, 12), tokens, lengths)  # (B, K, V)
    first, _ = drafting.logits(drafting.start_cache(encoder_out, 12), tokens, lengths, slots=2)  # (B, 2, V)
    assert first.shape == (2, 2, full.size(-1))
    torch.testing.assert_close(first, full[:, :2], rtol=0, atol=1e-6)


def test_a_shorter_block_drafts_as_a_drafter_of_that_block():
    """``block=3`` runs three mask slots, as a drafter built with block 3 would (same
    weights), and changes what they see: the slots attend to each other."""
    drafter, verifier, dictionary = tiny_drafter()
    drafting = SpecDrafter(drafter)
    gen = torch.Generator().manual_seed(6)
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, 2)
    tokens, lengths = sequences(dictionary, gen, 2, 8), torch.tensor([5, 3])
    short, _ = drafting.logits(drafting.start_cache(encoder_out, 12), tokens, lengths, slots=2, block=3)  # (B, 2, V)
    three = copy.deepcopy(drafter)
    three.decoder.block_size = 3
    three = SpecDrafter(three)
    expected, _ = three.logits(three.start_cache(encoder_out, 12), tokens, lengths)  # (B, 3, V)
    torch.testing.assert_close(short, expected[:, :2], rtol=0, atol=1e-6)
    full, _ = drafting.logits(drafting.start_cache(encoder_out, 12), tokens, lengths, slots=2)
    assert not torch.allclose(short, full, atol=1e-4)
    with pytest.raises(ValueError, match="slots"):
        drafting.logits(drafting.start_cache(encoder_out, 12), tokens, lengths, slots=3, block=2)
    with pytest.raises(ValueError, match="k_max"):
        drafting.logits(drafting.start_cache(encoder_out, 12), tokens, lengths, block=BLOCK + 1)


@pytest.mark.parametrize("kernels", ["packed", pytest.param("gemv", marks=pytest.mark.needs_gemv), "int8"])
def test_drafting_on_other_kernels_drafts_as_native(kernels):
    """Packed and gemv float32 kernels give the native logits to float tolerance; int8
    weights give logits close to them. The model keeps its own float32 nn.Linear layers."""
    from cmasd.layers.kernels import GemvLinear, Int8Linear, PackedLinear, packing_available

    if kernels == "packed" and not packing_available():
        pytest.skip("this torch build has no oneDNN packed linear")
    drafter, verifier, dictionary = tiny_drafter()
    gen = torch.Generator().manual_seed(7)
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, 2)
    tokens, lengths = sequences(dictionary, gen, 2, 8), torch.tensor([5, 3])
    other = SpecDrafter(drafter, kernels)
    kind = {"packed": PackedLinear, "gemv": GemvLinear, "int8": Int8Linear}[kernels]
    layer = other.decoder.layers[0]
    assert all(type(m) is kind for m in (layer.qkv, layer.self_out, layer.fc1, layer.fc2, other.decoder.output))
    assert type(drafter.decoder.layers[0].fc1) is torch.nn.Linear  # the model is untouched
    logits, _ = other.logits(other.start_cache(encoder_out, 12), tokens, lengths)
    native = SpecDrafter(drafter)
    reference, _ = native.logits(native.start_cache(encoder_out, 12), tokens, lengths)
    assert logits.shape == reference.shape and torch.isfinite(logits).all()
    if kernels in ("packed", "gemv"):
        torch.testing.assert_close(logits, reference, rtol=0, atol=1e-5)
    else:
        torch.testing.assert_close(logits, reference, rtol=0.1, atol=0.1)


def test_drafting_refuses_rollback_and_overflow():
    drafter, verifier, dictionary = tiny_drafter()
    drafting = SpecDrafter(drafter)
    gen = torch.Generator().manual_seed(5)
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, 2)
    tokens = sequences(dictionary, gen, 2, 8)
    state = drafting.start_cache(encoder_out, 6)
    _, state = drafting.logits(state, tokens, torch.tensor([4, 3]))
    with pytest.raises(ValueError, match="append-only"):
        drafting.logits(state, tokens, torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="capacity 6"):
        drafting.logits(state, tokens, torch.tensor([7, 3]))


@pytest.mark.parametrize("autocast", [False, True])
def test_bf16_autocast_covers_the_training_forward_pass(autocast):
    """``--drafter-bf16-autocast``: the criterion (the model's forward pass) runs under
    bfloat16 autocast; the weights and their gradients stay float32."""
    from cmasd.training.task import TranslationSpeculativeTask

    class Model(torch.nn.Linear):
        def set_num_updates(self, num_updates):
            pass

    class Optimizer:
        def backward(self, loss):
            loss.backward()

    seen = {}

    def criterion(model, sample):
        out = model(sample)  # (2, 4)
        seen["dtype"] = out.dtype
        return out.float().sum(), 1, {}

    task = TranslationSpeculativeTask.__new__(TranslationSpeculativeTask)  # train_step reads only cfg
    task.cfg = types.SimpleNamespace(drafter_bf16_autocast=autocast)
    model = Model(4, 4)
    task.train_step(torch.randn(2, 4), model, criterion, Optimizer(), update_num=0)
    assert seen["dtype"] == (torch.bfloat16 if autocast else torch.float32)
    assert model.weight.dtype == model.weight.grad.dtype == torch.float32


def test_bf16_training_bounds_onednn_primitive_cache(monkeypatch):
    """The task of a ``--drafter-bf16-autocast`` run bounds oneDNN's primitive cache unless
    the user set it."""
    from cmasd.training import task as task_module

    for name in task_module.ONEDNN_CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    dictionary = tiny_dictionary()
    task_module.TranslationSpeculativeTask(types.SimpleNamespace(drafter_bf16_autocast=False), dictionary, dictionary)
    assert not any(name in os.environ for name in task_module.ONEDNN_CACHE_VARIABLES)
    task_module.TranslationSpeculativeTask(types.SimpleNamespace(drafter_bf16_autocast=True), dictionary, dictionary)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(task_module.BF16_ONEDNN_CACHE_CAPACITY)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "300")  # the user's choice stays
    task_module.bound_onednn_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "300"


# The peak is this process's own (VmHWM), not getrusage's ru_maxrss: a process started
# with vfork, as subprocess starts it, inherits its parent's peak in ru_maxrss, and a test
# worker that has decoded in process is larger than the growth measured here.
SHAPES_UNDER_AUTOCAST = """
import re, sys, torch
from cmasd.training.task import bound_onednn_cache
def peak():  # KiB
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
if sys.argv[1] == "bounded":
    bound_onednn_cache()
torch.manual_seed(0)
weight = torch.randn(1024, 256, requires_grad=True)
for n in range(1, 300):  # a batch shape of its own each step, as in training
    if n == 51:
        start = peak()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.nn.functional.linear(torch.randn(n * 7 % 2000 + 1, 256), weight)
    out.float().sum().backward()
print(peak() - start)
"""


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no native bfloat16 on this CPU")
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak from /proc (Linux)")
def test_bounded_onednn_cache_keeps_bf16_training_memory_flat():
    """Under bfloat16 autocast each new shape leaves a oneDNN primitive and its memory in
    the cache; bounded, the peak grows far less over the same 249 new shapes (measured on the
    2-core machine: 250-290 MB bounded, 1,070-1,160 MB with oneDNN's default)."""
    from cmasd.training.task import ONEDNN_CACHE_VARIABLES

    growth = {}
    for mode in ("bounded", "default"):
        env = {k: v for k, v in os.environ.items() if k not in ONEDNN_CACHE_VARIABLES}
        proc = subprocess.run([sys.executable, "-c", SHAPES_UNDER_AUTOCAST, mode], capture_output=True, text=True,
                              env=env, cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-2000:]
        growth[mode] = int(proc.stdout.split()[-1])  # KiB
    assert growth["bounded"] < 0.5 * growth["default"], growth


def test_dictionary_mismatch_is_refused_clearly():
    drafter, _, dictionary = tiny_drafter()
    drafter.check_dictionary(dictionary)  # the training dictionary passes
    other = tiny_dictionary(prefix="v")  # same size, other symbols
    with pytest.raises(ValueError, match=r"drafter dictionary \(24 symbols, digest [0-9a-f]+\) differs from the verifier's \(24 symbols"):
        drafter.check_dictionary(other)
    with pytest.raises(ValueError, match=r"verifier's \(25 symbols"):
        drafter.check_dictionary(tiny_dictionary(WORDS + 1))


def test_missing_verifier_path_is_a_clear_error(tmp_path):
    dictionary = tiny_dictionary()
    missing = tmp_path / "nowhere.pt"
    with pytest.raises(FileNotFoundError, match="--verifier-path"):
        SpecDrafterModel.build_model(SpecDrafterConfig(verifier_path=str(missing)), tiny_task(dictionary))
    with pytest.raises(ValueError, match="--verifier-path is required"):
        SpecDrafterModel.build_model(SpecDrafterConfig(), tiny_task(dictionary))


def test_build_from_a_verifier_checkpoint_then_reload_without_it(tmp_path):
    """build_model reads a verifier checkpoint and records its architecture, so the
    drafter's own config rebuilds the same shapes once the verifier file is gone."""
    torch.manual_seed(0)
    dictionary = tiny_dictionary()
    args = tiny_verifier_args()
    verifier = TransformerModel.build_model(args, tiny_task(dictionary))
    path = tmp_path / "verifier.pt"
    torch.save(
        {
            "args": None,
            "cfg": {"model": args},
            "model": verifier.state_dict(),
            "optimizer_history": [{"criterion_name": "x", "optimizer_name": "x", "lr_scheduler_state": {}, "num_updates": 0}],
            "extra_state": {},
            "last_optimizer_state": None,
        },
        path,
    )
    cfg = SpecDrafterConfig(verifier_path=str(path), block_size=BLOCK, decoder_init="verifier")
    drafter = SpecDrafterModel.build_model(cfg, tiny_task(dictionary))
    assert cfg.verifier_arch  # recorded for the saved drafter config
    for mine, theirs in zip(drafter.decoder.layers[0].state_dict().values(), verifier.decoder.layers[0].state_dict().values()):
        assert torch.equal(mine, theirs)
    os.remove(path)
    again = SpecDrafterModel.build_model(cfg, tiny_task(dictionary))
    again.load_state_dict(drafter.state_dict())
    again.check_dictionary(dictionary)


def test_wrong_size_verifier_dictionary_is_refused(tmp_path):
    args = tiny_verifier_args()
    verifier = TransformerModel.build_model(args, tiny_task(tiny_dictionary()))
    path = tmp_path / "verifier.pt"
    torch.save({"cfg": {"model": args}, "model": verifier.state_dict(),
                "optimizer_history": [{"criterion_name": "x", "optimizer_name": "x", "lr_scheduler_state": {}}],
                "extra_state": {}, "last_optimizer_state": None}, path)
    with pytest.raises(ValueError, match="verifier has 24 target symbols but the data's dictionary has 27"):
        SpecDrafterModel.build_model(SpecDrafterConfig(verifier_path=str(path)), tiny_task(tiny_dictionary(WORDS + 3)))


# ----------------------------------------------------------------- training-data helpers


def test_cut_points():
    assert fixed_cuts(10, 4).tolist() == [1, 3, 6, 8]
    assert fixed_cuts(2, 4).tolist() == [1, 1, 2, 2]
    a, b = random_cuts(12, 4, 1, 3, 17), random_cuts(12, 4, 1, 3, 17)
    assert a.tolist() == b.tolist() and len(set(a.tolist())) == 4  # reproducible, distinct
    assert all(1 <= c <= 12 for c in a)
    assert random_cuts(12, 4, 1, 4, 17).tolist() != a.tolist() or random_cuts(12, 4, 1, 5, 17).tolist() != a.tolist()
    assert sorted(set(random_cuts(2, 6, 1, 1, 0).tolist())) <= [1, 2]


def test_cut_dataset_follows_the_batch_order():
    dictionary = tiny_dictionary()
    lengths = [3, 6, 2, 5]
    targets = [torch.tensor([4] * (n - 1) + [dictionary.eos()]) for n in lengths]
    sources = [torch.tensor([5] * (i + 2) + [dictionary.eos()]) for i in range(4)]
    pairs = LanguagePairDataset(sources, [len(s) for s in sources], dictionary, targets, lengths, dictionary)
    data = BlockCutDataset(pairs, cuts=2, seed=1, random=False)
    batch = data.collater([data[i] for i in range(4)])
    for row, example in enumerate(batch["id"].tolist()):  # rows are sorted by source length
        assert batch["block_starts"][row].tolist() == fixed_cuts(lengths[example], 2).tolist()
    train = BlockCutDataset(pairs, cuts=2, seed=1, random=True)
    train.set_epoch(3)
    assert train[1]["block_starts"].tolist() == random_cuts(6, 2, 1, 3, 1).tolist()


def test_block_labels_end_with_eos_then_pad():
    pad, eos = 1, 2
    target = torch.tensor([[7, 8, 9, eos], [7, eos, pad, pad]])  # y_1 .. y_n
    starts = torch.tensor([[1, 4], [2, 1]])
    labels = block_labels(target, starts, 3, pad)
    assert labels.tolist() == [[[7, 8, 9], [eos, pad, pad]], [[eos, pad, pad], [7, eos, pad]]]


def test_glancing_and_acceptance_counts():
    pad, eos = 1, 2
    labels = torch.tensor([[[5, 6, 7, eos, pad, pad]]])
    predicted = torch.tensor([[[5, 6, 9, 9, 9, 9]]])
    assert accepted_lengths(predicted, labels, pad).tolist() == [[2]]
    assert accepted_lengths(labels, labels, pad).tolist() == [[4]]  # stops after eos
    torch.manual_seed(0)
    glance = glance_tokens(predicted, labels, 0.5, pad)  # 2 wrong -> 1 gold input
    chosen = glance.ne(pad)
    assert int(chosen.sum()) == 1 and torch.equal(glance[chosen], labels[chosen])
    assert glance_tokens(predicted, labels, 0.0, pad).eq(pad).all()
    assert parse_glat_schedule("0.5:0.1@100") == (0.5, 0.1, 100)
    assert glat_ratio((0.5, 0.1, 100), 50) == pytest.approx(0.3)
    assert glat_ratio((0.5, 0.1, 100), 500) == pytest.approx(0.1)
    assert glat_ratio(parse_glat_schedule("0.3"), 7) == 0.3
    with pytest.raises(ValueError, match="START:END@UPDATES"):
        parse_glat_schedule("half")


def test_criterion_glances_in_training_and_counts_blocks_in_validation():
    from fairseq import metrics

    from cmasd.training.criterion import SpecDrafterLoss

    drafter, _, dictionary = tiny_drafter()
    pad, eos = dictionary.pad(), dictionary.eos()
    gen = torch.Generator().manual_seed(6)
    src, src_lengths = source_batch(dictionary, gen, 2)
    target = random_tokens(dictionary, (2, 6), gen)
    target[0, 5] = eos
    target[1, 3], target[1, 4:] = eos, pad  # a shorter target
    # teacher forcing as fairseq: eos moved to the front, pad where the target is pad
    prev = torch.cat([torch.full((2, 1), eos), target[:, :-1]], dim=1).masked_fill(target.eq(pad), pad)
    sample = {
        "net_input": {"src_tokens": src, "src_lengths": src_lengths, "prev_output_tokens": prev},
        "target": target,
        "block_starts": torch.tensor([[1, 4], [2, 4]]),
    }
    labelled = int(block_labels(target, sample["block_starts"], BLOCK, pad).ne(pad).sum())
    task = tiny_task(dictionary)

    plain = SpecDrafterLoss(task, label_smoothing=0.1, glat_schedule="0")
    drafter.train()
    _, sample_size, log = plain(drafter, sample)
    assert sample_size == labelled and "blocks" not in log

    drafter.set_num_updates(0)
    glancing = SpecDrafterLoss(task, label_smoothing=0.1, glat_schedule="1:0@10")
    loss, sample_size, log = glancing(drafter, sample)  # ratio 1: every wrong count glanced
    assert sample_size < labelled and log["glat_weighted"] == sample_size
    loss.backward()
    assert drafter.decoder.mask_embedding.grad is not None
    assert all(p.grad is None for p in drafter.encoder.parameters())  # frozen

    drafter.eval()
    with torch.no_grad():
        _, sample_size, log = glancing(drafter, sample)  # validation: no glancing
    assert sample_size == labelled
    assert log["blocks"] == 4 and log["labelled1"] == 4 and f"hit{BLOCK}" in log
    with metrics.aggregate() as agg:
        SpecDrafterLoss.reduce_metrics([log, log])
        figures = agg.get_smoothed_values()
    assert {"loss", "nll_loss", "exp_accept", "acc@1", f"acc@{BLOCK}"} <= set(figures)
    assert not any(name.startswith("_") for name in figures)
    assert figures["acc@1"] == pytest.approx(100 * log["hit1"] / 4, abs=0.01)
