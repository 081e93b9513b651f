"""Ragged verification (``--spec-verify ragged``, the default): a batch's verify pass runs
its position-wise layers and output projection on the positions rows send, not on the
widest row's block for every row. Lossless by construction, checked here in process on a
tiny random verifier, every kernel, batch 1, 7 and 16, rows sending different k (k = 0
included): the same hypotheses as the verifier decoding alone through the same loop, and
as padded and static verification (``--spec-verify static``: every row's block the draft's
horizon wide). (Through ``fairseq-generate`` against ``--beam 1``: the goodput
tests, whose rows send their own k.)"""

from dataclasses import dataclass

import pytest
import torch
from helpers import draft_model, source_batch, tiny_drafter

from cmasd.core.verifying import Controller, RowState
from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.drafters.autoregressive import AutoregressiveDrafter
from cmasd.layers import prepared
from cmasd.layers.transformer import Ragged
from cmasd.verification.acceptance import Exact
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification.controllers import Fixed

KERNELS = ["native", "packed", pytest.param("gemv", marks=pytest.mark.needs_extension)]


@dataclass(frozen=True)
class Steps(RowState):
    ids: torch.Tensor  # (B,) the row's index in its batch
    steps: torch.Tensor  # (B,) its iterations


class Staggered(Controller):
    """Row r sends (r + its iteration) % 4 drafts: 0 to 3, different rows different k."""

    horizon = 3

    @classmethod
    def from_config(cls, cfg, limit):
        return cls()

    def start(self, rows, device):
        return Steps(torch.arange(rows, device=device), torch.zeros(rows, dtype=torch.long, device=device))

    def budget(self, state):
        return (state.ids + state.steps) % 4

    def propose(self, state, draft):
        return self.budget(state).clamp(max=draft.tokens.size(1))

    def observe(self, state, proposed, accepted):
        return Steps(state.ids, state.steps + 1)


def decode(verifier, drafter, dictionary, controller, kernels, batch, layout="ragged"):
    rules = LengthRules(max_len_b=20, max_positions=verifier.max_decoder_positions())
    generator = SpeculativeGenerator(verifier, drafter, dictionary, controller, Exact(), ConfidenceSpec(), rules,
                                     kernels=kernels, ragged=layout == "ragged", static=layout == "static")
    src, src_lengths = batch
    out, stats = generator.decode({"id": torch.arange(src.size(0)),
                                   "net_input": {"src_tokens": src, "src_lengths": src_lengths}})
    return [h[0]["tokens"].tolist() for h in out], stats


@pytest.fixture(scope="module")
def models():
    spec_model, verifier, dictionary = tiny_drafter(seed=7)
    return verifier, dictionary


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("bsz", [1, 7, 16])
@pytest.mark.parametrize("drafter", ["itself", "random"])
def test_ragged_verification_is_lossless(models, kernels, bsz, drafter, monkeypatch):
    verifier, dictionary = models
    # the verifier as its own draft model (every draft accepted) or a random one (most rejected)
    model = verifier if drafter == "itself" else draft_model(verifier, dictionary)
    batch = source_batch(dictionary, torch.Generator().manual_seed(bsz), bsz=bsz, length=18)
    alone, _ = decode(verifier, AutoregressiveDrafter(verifier, kernels, True), dictionary, Fixed(0, None), kernels,
                      batch)
    packs = []
    monkeypatch.setattr(Ragged, "pack", lambda self, x, pack=Ragged.pack: packs.append(1) or pack(self, x))
    # gemv runs blocks of up to FUSED_MAX_ROWS rows whole, in the fused C++ layers: held to a
    # block of one position a row here, so that its wider blocks verify ragged too
    monkeypatch.setattr(prepared, "FUSED_MAX_ROWS", bsz)
    for layout in ("ragged", "padded", "static"):
        packs.clear()
        hypotheses, stats = decode(verifier, AutoregressiveDrafter(model, kernels, drafter == "itself"), dictionary,
                                   Staggered(), kernels, batch, layout)
        assert hypotheses == alone, (layout, kernels)
        assert {0, 1, 2, 3} <= set(stats.k_histogram) or bsz == 1
        assert stats.drafted > 0 and (drafter != "itself" or stats.accepted == stats.drafted)
        assert bool(packs) == (layout == "ragged" and bsz > 1)


def test_a_ragged_layout_packs_the_positions_rows_send():
    valid = torch.tensor([[True, True, False], [True, False, False], [True, True, True]])
    ragged = Ragged.of(valid)
    x = torch.arange(9 * 2, dtype=torch.float).view(3, 3, 2)
    packed = ragged.pack(x)
    assert packed.shape == (6, 2) and packed[2].tolist() == x[1, 0].tolist()
    back = ragged.unpack(packed)
    assert torch.equal(back[valid], x[valid]) and not back[~valid].any()
    assert Ragged.of(torch.ones(2, 3, dtype=torch.bool)) is None
