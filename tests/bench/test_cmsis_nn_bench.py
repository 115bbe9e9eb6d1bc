"""Issue 50: the firmware beside Arm's CMSIS-NN, layer by layer, on the same counter.

CMSIS-NN is read from the shared peers folder ($TRICKLE_PEERS/cmsis-nn), never from the repository,
and the MLPerf Tiny models from $TRICKLE_DATA/mlperf-tiny; the tests say so and skip where they are
absent. TFLite Micro's own tensors (its interpreter keeping every one) are the oracle of every layer."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.tflite_models import BENCH_MODELS, int8_tflite
from edge.contract.bundle import read_bundle
from edge.core.files import REPO_ROOT, data_root
from tests.helpers import trickle

pytest.importorskip("tflite_micro")
pytest.importorskip("ai_edge_quantizer")

ARM = shutil.which("qemu-system-arm") is not None and shutil.which("arm-none-eabi-gcc") is not None
needs_arm = pytest.mark.skipif(not ARM, reason="apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm")
MLPERF = data_root() / "mlperf-tiny"
PEER = REPO_ROOT.parent / "shared" / "peers" / "cmsis-nn"
needs_peer = pytest.mark.skipif(not (PEER / "Include").is_dir() or not MLPERF.is_dir(),
                                reason=f"no {PEER} (CMSIS-NN) or {MLPERF} (the MLPerf Tiny models)")


@needs_arm
def test_every_layer_of_the_firmware_equals_tflite_micros_tensor_and_macs_count_only_conv_dw_fc(
        tmp_path: Path) -> None:
    """The host build's ``layers`` mode prints each layer's output; each equals the tensor TFLite Micro
    computed for that operator. And the firmware's MACs are the manifest's (conv, depthwise, fully
    connected): the average pool's additions, counted before issue 50, are not MACs."""
    from bench.cmsis_nn import _tensors
    from bench.firmware import layer_outputs
    from edge.classify.backends import quantize_tflite
    from export.firmware.tflite_import import _Graph, from_tflite, import_tflite, op_names, read_model

    net, shape = BENCH_MODELS["conv2d_strided_depthwise_avgpool"]
    torch.manual_seed(0)
    x = int8_tflite(net(), shape, tmp_path / "m.tflite")
    np.savez(tmp_path / "x.npz", x=x)
    bundle = read_bundle(import_tflite(tmp_path / "m.tflite", tmp_path / "x.npz", tmp_path / "bundle", vectors=2))
    data = (tmp_path / "m.tflite").read_bytes()
    model = from_tflite(data)
    assert model.macs == sum(layer.macs for layer in bundle.manifest.variants[0].layers)
    graph = _Graph(read_model(data), data)
    assert "AVERAGE_POOL_2D" in op_names(read_model(data))

    got = layer_outputs(bundle, x[:1], tmp_path / "host")
    tensors = _tensors(data, quantize_tflite(x[0], *graph.act(int(graph.g.inputs[0]))))
    # a depthwise convolution of one input channel is the firmware's conv
    kinds = {"CONV_2D": "conv", "DEPTHWISE_CONV_2D": "conv", "AVERAGE_POOL_2D": "avgpool", "FULLY_CONNECTED": "fc"}
    names = [kinds[k] for k in op_names(read_model(data)) if k in kinds]
    outs = [int(op.outputs[0]) for op, k in zip(graph.g.operators, op_names(read_model(data))) if k in kinds]
    assert [n.rstrip("0123456789").replace("dw", "") for n in got][:-1] == names[:-1] and list(got)[-1] == "classifier"
    for name, t in zip(got, outs):
        np.testing.assert_array_equal(got[name], tensors[t].reshape(-1), err_msg=name)


@needs_arm
@needs_peer
def test_str_ww_runs_layer_by_layer_beside_cmsis_nn_bit_exact_and_counted(tmp_path: Path) -> None:
    from bench.firmware import PLUMERAI_CYCLES, _cmsis_keys, bench_cmsis_nn, cmsis_markdown

    (m,) = bench_cmsis_nn(tmp_path, None, models=("str_ww_ref_model",), own=False)
    paired = [r for r in m["layers"] if "instructions" in r and "cmsis_nn_instructions" in r]
    assert len(paired) == 9 and m["every_layer_paired"]  # 4 dw, 4 conv, the classifier
    assert all(r["cmsis_nn_equals_firmware"] and r["cmsis_nn_bit_exact_with_tflm"] for r in paired)
    (softmax,) = [r for r in m["layers"] if "instructions" not in r]
    assert softmax["name"].startswith("softmax") and m["cmsis_nn_softmax_instructions"] == softmax["cmsis_nn_instructions"]
    assert m["cmsis_nn_instructions"] == sum(r["cmsis_nn_instructions"] for r in paired)
    assert m["instruction_ratio"] == m["instructions_per_inference"] / m["cmsis_nn_instructions"]
    # a 1x1 convolution of 128 channels: CMSIS-NN's fast path costs about 2 instructions per MAC
    conv2 = next(r for r in paired if r["name"] == "conv2")
    assert conv2["macs"] == 24 * 128 * 128 and 1.5 < conv2["cmsis_nn_instructions"] / conv2["macs"] < 2.5
    for r in paired:  # a cycle estimate beside each count, at least one cycle per instruction
        assert r["cmsis_nn_estimated_cycles"] >= r["cmsis_nn_instructions"] and r["estimated_cycles"] >= r["instructions"]
    keys = _cmsis_keys([m])
    assert keys["cmsis_nn_bit_exact_layers"] == keys["cmsis_nn_layers"] == 9 and not keys["cmsis_nn_bit_exact_exceptions"]
    assert "str_ww_ref_model" not in PLUMERAI_CYCLES and "estimated_cycles_vs_plumerai_max" not in keys
    table = cmsis_markdown([m], "test")
    assert "| conv2 | 1x1 128->128 over 24x1 |" in table and "(CMSIS-NN only)" in table


def test_an_absent_peer_is_one_line_naming_the_folder(tmp_path: Path) -> None:
    proc = trickle("bench", "firmware", "--peer", f"cmsis-nn={tmp_path / 'nowhere'}")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"{tmp_path / 'nowhere'}: no CMSIS-NN here" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = trickle("bench", "export", "--peer", "cmsis-nn")
    assert proc.returncode != 0 and "for trickle bench firmware" in proc.stderr
