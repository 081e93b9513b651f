"""cmasd-bench's named configurations (cmasd/tools/bench/configs.py): a row that ablates a
part of a method differs from the method's row in exactly that part's settings, and those
reach the drafter. In-process, no data."""

from types import SimpleNamespace

import pytest

from cmasd.drafters.registry import DRAFTER_KINDS
from cmasd.tools.bench.configs import CONFIGS, BenchError, options_dict, parse_assignments, resolve_configs, spec_options

# row -> (the row it ablates, the settings it changes)
ABLATIONS = {
    "specbound-act": ("specbound", {"specbound_alpha"}),
    "specbound-no-dmax": ("specbound", {"specbound_d_max"}),
    "specbound-no-wmax": ("specbound", {"specbound_w_max", "spec_k"}),
}
VERIFIER_LAYERS = 6


def resolved(name: str) -> dict:
    """The full options of a named row, as cmasd-bench decodes it."""
    return options_dict(spec_options(CONFIGS[name], {}, {}))


def changed(row: str, base: str) -> set:
    mine, theirs = resolved(row), resolved(base)
    return {key for key in mine if mine[key] != theirs[key]}


def drafter_of(name: str):
    """The model drafter a row builds (untrained heads on a stand-in verifier: SpecBound reads
    only its number of layers and its padding index here)."""
    cfg = spec_options(CONFIGS[name], {}, {})
    verifier = SimpleNamespace(decoder=SimpleNamespace(layers=[None] * VERIFIER_LAYERS, padding_idx=1))
    return DRAFTER_KINDS[cfg.drafter_kind].from_model(None, verifier, cfg, "native", cfg.spec_k)


@pytest.mark.parametrize("row", sorted(ABLATIONS))
def test_an_ablation_changes_exactly_its_settings(row):
    base, settings = ABLATIONS[row]
    assert changed(row, base) == settings
    assert CONFIGS[row].drafter == CONFIGS[base].drafter


def test_every_row_named_as_an_ablation_differs_from_its_method():
    """``NAME-no-PART`` (and ``NAME-act``) rows: none resolves to its method's options."""
    ablations = {name: name.partition("-no-")[0] if "-no-" in name else name[: -len("-act")]
                 for name in CONFIGS if "-no-" in name or name.endswith("-act")}
    for name, base in ablations.items():
        assert base in CONFIGS, f"{name}: no row {base} to ablate"
        if CONFIGS[name].speculative:
            assert changed(name, base), f"{name} decodes exactly as {base}: it ablates nothing"


def test_act_reaches_the_drafter():
    """specbound (the tuned point) runs every layer at temperature 1; specbound-act anneals
    them, T_l = 1 + alpha (1 - l / L) with alpha 1; the two differ in nothing else."""
    plain, act = drafter_of("specbound"), drafter_of("specbound-act")
    assert plain.temperatures == [1.0] * VERIFIER_LAYERS
    assert act.temperatures == pytest.approx([1.0 + (1.0 - layer / VERIFIER_LAYERS)
                                              for layer in range(1, VERIFIER_LAYERS + 1)])
    assert (plain.tau, plain.d_max, plain.max_horizon) == (act.tau, act.d_max, act.max_horizon)


def test_a_retired_configuration_is_refused_with_its_reason():
    with pytest.raises(BenchError, match="'specbound-no-act' was removed: .*specbound-act is the ACT ablation"):
        resolve_configs("greedy,specbound-no-act")


def test_set_values_take_their_options_types():
    """``--set KEY=VALUE`` converts to the option's type, optional ones included (none: unset)."""
    assert parse_assignments(["spec_k=3", "spec_tau=0.5", "spec_costs=costs.json", "spec_draft_block=none",
                              "spec_draft_shortlist_counts=counts.txt"]) == {
        "spec_k": 3, "spec_tau": 0.5, "spec_costs": "costs.json", "spec_draft_block": None,
        "spec_draft_shortlist_counts": "counts.txt"}
    with pytest.raises(BenchError, match="spec_draft_block=x: expected int"):
        parse_assignments(["spec_draft_block=x"])
