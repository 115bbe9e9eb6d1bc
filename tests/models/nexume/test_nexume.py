"""NExUME: the configuration search and λ, the cost model by hand, switchable precision, a tiny training run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from edge.core.errors import ConfigError
from models.data.datasets import load
from models.nexume.switchable import SwitchableNet, arch_for, kept_channels
from models.nexume.train import ConfigSearch, EnergySampler, TrainConfig, train, variant_energy_j


def test_the_search_affords_only_what_the_energy_at_hand_pays_for() -> None:
    energy = {(8, 0.0): 10.0, (4, 0.0): 7.0, (2, 0.0): 5.0, (2, 0.5): 1.0}
    search = ConfigSearch(energy, lambda_q=0.0, lambda_d=0.0, n_layers=4, temperature=0.5)
    rng = np.random.default_rng(0)
    # E_b = 0 affords the cheapest only; the budget grows in proportion to E_max, which affords everything
    assert {search.choose(0.0, rng) for _ in range(20)} == {(2, 0.5)}
    seen = {search.choose(0.5, rng) for _ in range(50)}  # cap 1 + 0.5 x 9 = 5.5: the two 2-bit ones
    assert seen == {(2, 0.5), (2, 0.0)}
    for g in energy:
        search.update(g, 1.0)  # equal losses: λ decides
    picks = [ConfigSearch(energy, lq, 0.0, 4, 0.5, dict(search.loss)).choose(1.0, np.random.default_rng(1))
             for lq in (0.0, 2.0)]
    assert energy[picks[1]] <= energy[picks[0]] and picks[1][0] == 2


def test_raising_lambda_lowers_the_energy_of_what_training_chooses() -> None:
    data = load("digits")
    chosen = {}
    for lq in (0.0, 1.0):
        r = train(TrainConfig(dataset="digits", epochs=2, lambda_q=lq, finetune_epochs=0, schedule="search"), data)
        chosen[lq] = np.mean([h["chosen_energy_j"] for h in r.history])
    assert chosen[1.0] < 0.9 * chosen[0.0]


def test_cost_model_by_hand() -> None:
    net = SwitchableNet(arch_for("digits", (1, 8, 8), 10))
    # digits arch: conv 1→16 3x3 pad 1 on 8x8; conv 16→32 3x3 stride 2 → 4x4; conv 32→32 3x3 on 4x4; linear 32→10
    macs = 16 * 1 * 9 * 64 + 32 * 16 * 9 * 16 + 32 * 32 * 9 * 16 + 32 * 10
    assert sum(c.macs for c in net.layer_costs(0.0)) == macs
    # MSP430FR5994: 118 µA/MHz at 3.0 V = 0.354 nJ per cycle, 16 cycles per int8 MAC; 4 bit costs 0.7 of it
    assert variant_energy_j(net, 8, 0.0, "msp430fr5994") == pytest.approx(macs * 16 * 118e-12 * 3.0)
    assert variant_energy_j(net, 4, 0.0, "msp430fr5994") == pytest.approx(macs * 16 * 0.7 * 118e-12 * 3.0)
    # dropout 0.5 keeps 8, 16, 16 channels: every layer shrinks on both sides
    half = 8 * 1 * 9 * 64 + 16 * 8 * 9 * 16 + 16 * 16 * 9 * 16 + 16 * 10
    assert sum(c.macs for c in net.layer_costs(0.5)) == half
    assert kept_channels(32, 0.25) == 24


def test_switching_bits_changes_quantized_weights_not_float_ones() -> None:
    torch.manual_seed(0)
    net = SwitchableNet(arch_for("fsdd", (13, 63), 10))
    layer = net.convs[1]
    assert layer.quant["2"].weight is layer.quant["8"].weight  # one float weight, tied
    w2 = layer.quant["2"].quant_weight().value.detach()
    w4 = layer.quant["4"].quant_weight().value.detach()
    w8 = layer.quant["8"].quant_weight().value.detach()
    assert not torch.equal(w2, w8) and not torch.equal(w4, w8)
    assert len(torch.unique(w2)) <= 3 and len(torch.unique(w4)) <= 15 and len(torch.unique(w8)) > 15
    x = torch.randn(2, 13, 63)
    assert not torch.allclose(net.configure(2, 0.0)(x), net.configure(8, 0.0)(x))


@pytest.mark.parametrize(("drop", "kept"), [(0.25, (18, 24, 24)), (0.5, (12, 16, 16))])
def test_ordered_dropout_forward_equals_the_slim_network(drop: float, kept: tuple[int, ...]) -> None:
    # basic_motions arch: convs of 24, 32, 32 channels; at level d a layer keeps ceil((1 - d) C), by hand
    torch.manual_seed(0)
    net = SwitchableNet(arch_for("basic_motions", (6, 100), 4)).eval()
    x = torch.randn(3, 6, 100)
    with torch.no_grad():
        out = net.configure(32, drop)(x)
        # the oracle is the network a device runs at level d: each layer is cut to its first kept output
        # channels and the previous layer's kept inputs, and its activations are rescaled by C / kept
        h, k_in = x, 6
        for layer, spec, k in zip(net.convs, net.arch.convs, kept):
            h = F.conv1d(h, layer.weight[:k, :k_in], layer.bias[:k], stride=spec.stride, padding=spec.padding)
            h, k_in = F.relu(h) * (spec.out_channels / k), k
        reference = F.linear(h.mean(dim=2), net.classifier.weight[:, :k_in], net.classifier.bias)
        full = net.configure(32, 0.0)(x)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(out, full, atol=1e-3)  # the dropout level changes forward's output


@pytest.mark.parametrize("bits", [8, 32])
def test_channels_beyond_the_kept_count_do_not_influence_forward(bits: int) -> None:
    torch.manual_seed(1)
    net = SwitchableNet(arch_for("basic_motions", (6, 100), 4)).eval().configure(bits, 0.5)
    x = torch.randn(3, 6, 100)

    def with_negated(weight: torch.Tensor, bias: torch.Tensor | None, rows: slice, cols: slice = slice(None)) -> torch.Tensor:
        # negating keeps each tensor's largest magnitude, hence its per-tensor quantization scale
        weight[rows, cols].neg_()
        if bias is not None:
            bias[rows].neg_()
        try:
            return net(x)
        finally:
            weight[rows, cols].neg_()
            if bias is not None:
                bias[rows].neg_()

    with torch.no_grad():
        base = net(x)  # (also sets the activation quantizers' scales from a first batch)
        for layer, k in zip(net.convs, (12, 16, 16)):
            assert torch.equal(with_negated(layer.weight, layer.bias, slice(k, None)), base)
            assert not torch.allclose(with_negated(layer.weight, layer.bias, slice(k - 1, k)), base)
        classifier = net.classifier.weight
        assert torch.equal(with_negated(classifier, None, slice(None), slice(16, None)), base)
        assert not torch.allclose(with_negated(classifier, None, slice(None), slice(15, 16)), base)


def test_energy_sampler_from_a_simulated_node() -> None:
    s = EnergySampler.from_scenario("rf_powercast", n_draws=2000, seed=1)
    assert s.energies_j.min() >= 0.0 and s.energies_j.max() <= s.energy_max_j
    assert np.array_equal(s.energies_j, EnergySampler.from_scenario("rf_powercast", n_draws=2000, seed=1).energies_j)
    assert len(np.unique(s.energies_j)) > 10  # draws vary: the node's charge moves


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="mcu = 'z80'"):
        TrainConfig(mcu="z80")
    with pytest.raises(ConfigError, match="q_min = 8: must be <= q_max"):
        TrainConfig(q_min=8, q_max=4)


@pytest.mark.parametrize("method", ["nexume", "qat8"])
def test_tiny_training_beats_chance(method: str) -> None:
    data = load("digits")
    cfg = TrainConfig(dataset="digits", method=method, epochs=5, finetune_epochs=1, harvest_scenario="rf_powercast")
    result = train(cfg, data)
    best = max(v["accuracy"] for v in result.variants)
    assert best > 0.6  # chance is 0.1
    assert result.history[-1]["loss"] < result.history[0]["loss"]


def test_datasets_shapes_and_splits() -> None:
    digits = load("digits")
    assert digits.x_train.shape[1:] == (1, 8, 8) and len(digits.y_train) + len(digits.y_test) == 1797
    motions = load("basic_motions")
    assert motions.x_train.shape == (40, 6, 100) and motions.n_classes == 4


def test_fsdd_split_by_recording_index(shared_data: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    fsdd = load("fsdd", shared_data)
    # recordings 0-4 of each of 6 speakers x 10 digits are the test set
    assert (len(fsdd.y_train), len(fsdd.y_test)) == (2700, 300)
    assert fsdd.input_shape == (13, 63)
    assert np.bincount(fsdd.y_test).tolist() == [30] * 10


def test_missing_shared_data_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from models.data.base import DatasetError

    with pytest.raises(DatasetError, match="no WAV files in .*fsdd/recordings"):
        load("fsdd", tmp_path)
    with pytest.raises(DatasetError, match="no such file or folder"):
        load("mnist")


def test_the_deployment_schedule_is_what_dyninfer_runs_on_the_named_node() -> None:
    """Issue 30: train for the node the model will run on. On continuous power DynInfer always
    affords the full network, so the schedule is 8-bit QAT; on a scarce piezo node with a small
    capacitor it runs cheaper configurations too; the same scenario gives the same schedule."""
    from models.nexume.deployment import energy_ranked_model
    from models.nexume.train import deployment_schedule
    from simulator.config import load_scenario, scenario_path

    data = load("digits")
    model = SwitchableNet(arch_for("digits", data.input_shape, data.n_classes))
    cfg = TrainConfig(dataset="digits")
    steady = load_scenario(None, harvester={"kind": "constant", "power_w": 0.1}, run={"duration_s": 600, "workers": 1},
                           storage={"capacitance_f": 4.7e-3, "v_initial_v": 3.0}, workload={"sense_period_s": 10.0},
                           nodes={"count": 1, "record_traces": 0})
    assert deployment_schedule(cfg, model, steady) == {(8, 0.0): 1.0}
    scarce = load_scenario(scenario_path("piezo_machine"), storage={"capacitance_f": 1e-3},
                           run={"duration_s": 3 * 3600, "workers": 1}, workload={"sense_period_s": 10.0},
                           nodes={"count": 2, "record_traces": 0})
    mix = deployment_schedule(cfg, model, scarce)
    assert sum(mix.values()) == pytest.approx(1.0) and mix.get((8, 0.0), 0.0) < 0.99 and len(mix) > 1
    assert deployment_schedule(cfg, model, scarce) == mix
    # DynInfer's stand-in accuracies rise with a variant's work, so it runs the costliest it affords
    stand_in = energy_ranked_model(model, list(mix))
    work = [sum(layer.macs for layer in v.layers) * v.bits for v in stand_in.variants]
    assert np.argsort(work).tolist() == np.argsort([v.accuracy for v in stand_in.variants]).tolist()


def test_the_deployment_schedule_keeps_a_share_at_full_width() -> None:
    from models.nexume.train import _schedule

    cfg = TrainConfig(full_share=0.25)
    rng = np.random.default_rng(0)
    picks = [_schedule(cfg, None, None, rng, i, {(2, 0.5): 1.0}) for i in range(4000)]
    assert abs(np.mean([p == (8, 0.0) for p in picks]) - 0.25) < 0.03
    assert set(picks) == {(8, 0.0), (2, 0.5)}
    # the even spread: a configuration the node runs rarely still gets its share
    mix = {(2, 0.5): 0.9, (4, 0.5): 0.1}
    for spread, want in ((0.0, 0.1), (0.5, 0.3), (1.0, 0.5)):
        cfg = TrainConfig(full_share=0.0, spread=spread)
        rng = np.random.default_rng(1)
        picks = [_schedule(cfg, None, None, rng, i, mix) for i in range(4000)]
        assert abs(np.mean([p == (4, 0.5) for p in picks]) - want) < 0.03, spread
