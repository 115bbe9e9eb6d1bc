"""export.firmware.plan and the board policy: one arena per model, offsets from the tensors'
lifetimes (TFLite Micro's greedy rule), and where the live tensors must survive a power cut."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edge.core.errors import FlashError
from export.firmware.flash import choose_policy, state_bytes
from export.firmware.intmodel import AddLayer, ConcatLayer, FCLayer, IntModel, LutLayer
from export.firmware.plan import ALIGN, MemoryPlan, plan


def fc(n_in: int, n_out: int) -> FCLayer:
    ones = np.ones(n_out, np.int32)
    return FCLayer(weight=np.zeros((n_out, n_in), np.int8), bias=0 * ones, multiplier=ones << 30, shift=ones,
                   input_offset=0, output_offset=0, act_min=-128, act_max=127, output_scale=1.0)


def lut(n: int) -> LutLayer:
    return LutLayer(op="TANH", table=np.zeros((1, 256), np.int8), shape=(n,))


def add(n: int) -> AddLayer:
    return AddLayer(multiplier=(1 << 30, 1 << 30, 1 << 30), shift=(1, 1, 20), input_offset=0, input2_offset=0,
                    output_offset=0, act_min=-128, act_max=127, shape=(n,))


def assert_sound(p: MemoryPlan) -> None:
    """No two tensors live at once share a byte; every tensor lies inside the arena, aligned."""
    for t in p.tensors:
        assert t.offset % ALIGN == 0 and t.offset + t.bytes <= p.arena_bytes
        for u in p.tensors:
            if t is not u and t.live_with(u):
                assert t.offset + t.bytes <= u.offset or u.offset + u.bytes <= t.offset, (t, u)


def test_a_chain_reuses_the_bytes_of_dead_tensors() -> None:
    """An autoencoder's shape (640 in, 128 wide, 640 out, as MLPerf Tiny's ad01): two tensors live
    at a time, so the arena is the widest pair, not the sum; the last layer's 640 outputs are the
    logits, outside it."""
    model = IntModel(1.0, (640,), [fc(640, 128), fc(128, 128), fc(128, 8), fc(8, 128), fc(128, 640), fc(640, 640)])
    p = plan(model)
    assert_sound(p)
    assert p.arena_bytes == 640 + 128  # the largest pair live at once: 640 in, 128 out (the last 640 are logits)
    assert p.tensor_bytes == 640 + 128 + 128 + 8 + 128 + 640
    for src, _, dst in p.routes[:-1]:
        assert src != dst


def test_a_branch_keeps_its_tensor_until_its_last_reader() -> None:
    """x -> a -> b, then ADD(b, x): x stays live across a and b, so nothing written meanwhile
    overlaps it; then CONCATENATION writes one tensor from two layers."""
    layers = [lut(100), lut(100), add(100), ConcatLayer(channels=100, offset=0, out_channels=200, positions=(1, 1)),
              ConcatLayer(channels=100, offset=100, out_channels=200, positions=(1, 1)), fc(200, 3)]
    routes = [(0, -1, 1), (1, -1, 2), (2, 0, 3), (3, -1, 4), (1, -1, 4), (4, -1, 5)]
    p = plan(IntModel(1.0, (100,), layers, routes=routes))
    assert_sound(p)
    x = next(t for t in p.tensors if t.tensor == 0)
    assert (x.first, x.last) == (-1, 2)
    concat = next(t for t in p.tensors if t.tensor == 4)
    assert (concat.first, concat.bytes) == (3, 200)
    assert p.routes[3][2] == p.routes[4][2]  # both halves of the concatenation write one tensor


@pytest.mark.parametrize("seed", range(20))
def test_random_graphs_never_share_live_bytes(seed: int) -> None:
    """Random DAGs of tables and ADDs with random widths: the plan is sound, never below the
    bytes live at the busiest layer, and never above one buffer per tensor."""
    rng = random.Random(seed)
    n, widths, layers, routes = rng.randrange(3, 14), [rng.randrange(1, 300)], [], []
    for k in range(n):
        width = widths[-1] if rng.random() < 0.5 else None
        pick = [t for t, w in enumerate(widths) if width is None or w == width]
        a = rng.choice(pick)
        same = [t for t, w in enumerate(widths) if w == widths[a] and t != a]
        if same and rng.random() < 0.4 and k < n - 1:
            layers.append(add(widths[a]))
            routes.append((a, rng.choice(same), k + 1))
            widths.append(widths[a])
        elif k < n - 1:
            layers.append(lut(widths[a]) if rng.random() < 0.5 else fc(widths[a], rng.randrange(1, 300)))
            routes.append((a, -1, k + 1))
            widths.append(widths[a] if isinstance(layers[-1], LutLayer) else layers[-1].weight.shape[0])
        else:
            layers.append(fc(widths[a], 4))
            routes.append((a, -1, k + 1))
    p = plan(IntModel(1.0, (widths[0],), layers, routes=routes))
    assert_sound(p)
    assert max(p.live_bytes(k) for k in range(-1, n)) <= p.arena_bytes
    assert p.arena_bytes <= sum(-(-t.bytes // ALIGN) * ALIGN for t in p.tensors)


CONFIG = {"TN_ARENA_BYTES": 16000, "TN_MAX_CLASSES": 12, "TN_MAX_CHANNELS": 1, "TN_MAX_COLUMN": 288}


def test_the_stm32f405_runs_a_model_atomically_where_its_tensors_outgrow_the_backup_sram() -> None:
    """386fc45 refused a model whose activations outgrew the 4 KB backup SRAM (KWS: 8,000 B in one
    layer; "fewer --vectors", it said, which changed nothing). Now: tiles commit where the arena
    fits, atomic inference where it does not, with the input kept where it fits; refused only
    where the results themselves do not fit, in one line naming the memory and the bytes."""
    small = choose_policy("stm32f405", {**CONFIG, "TN_ARENA_BYTES": 768, "TN_MAX_CLASSES": 640}, 640)
    assert small.name == "tiles" and "backup SRAM" in small.why and small.non_volatile_bytes <= 4092
    kws = choose_policy("stm32f405", CONFIG, 490)
    assert kws.name == "atomic" and kws.keep_input and "16000 B arena" in kws.why
    assert kws.non_volatile_bytes == state_bytes(CONFIG, True, True, 490) < 4092
    vww = choose_policy("stm32f405", {**CONFIG, "TN_ARENA_BYTES": 64512, "TN_MAX_CLASSES": 2}, 27648)
    assert vww.name == "atomic" and not vww.keep_input and "the sample is taken again" in vww.why
    assert choose_policy("mps2-an386", CONFIG, 490).name == "tiles"
    assert choose_policy("mps2-an386", CONFIG, 490, "atomic").name == "atomic"
    with pytest.raises(FlashError, match=r"fits neither policy on the stm32f405: its 2000 outputs .* need \d+ B of "
                                         r"backup SRAM, which has 4092 B"):
        choose_policy("stm32f405", {**CONFIG, "TN_MAX_CLASSES": 2000}, 490)
    with pytest.raises(FlashError, match=r"--policy tiles: the live tensors need \d+ B of backup SRAM"):
        choose_policy("stm32f405", CONFIG, 490, "tiles")
    with pytest.raises(FlashError, match="--policy sometimes: must be one of auto, tiles, atomic"):
        choose_policy("stm32f405", CONFIG, 490, "sometimes")
