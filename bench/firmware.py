"""Firmware benchmark: instructions per MAC on the emulated Cortex-M4, against a plain C kernel,
the cost of keeping progress for power failures, and power cuts at random instructions.

    trickle bench firmware [--quick]

For digits (conv2d) and basic_motions (conv1d), a NExUME model (seed 0) is exported, run on the
STM32F405 under QEMU on every test vector, and built for mps2-an386 three ways: the shipped
kernels with progress keeping, the plain reference kernel (``tn_conv_tile_reference``) with
progress keeping, and the shipped kernels without progress keeping (straight loops). Instruction
counts come from the project's QEMU plugin, per inference between two markers (median over the
test vectors run; they are data-independent but for branches). MACs are the multiply-accumulates
of convolution, depthwise and fully connected layers only (the manifest's count); pooling and
elementwise work is counted in instructions, never as MACs (issue 50). Keys of
bench/results/firmware.json (goals in GOALS):

- instructions_per_mac: the largest over every 8-bit variant of both models
  (``dyninfer_instructions_per_mac``: of the variant DynInfer runs on a full capacitor).
- reference_kernel_ratio: shipped / plain instructions per inference (below 1 is faster).
- intermittency_overhead_ratio: with progress keeping / without; the largest.
- power_cut_trials_bit_exact: random cuts inside an inference, each followed by a restart;
  every result compared with the uncut run; the fewer of the two boards' (mps2-an386 and
  stm32f405, ``power_cut_trials_bit_exact_by_board``).
- stm32f405_bit_exact: 1 when every test vector of every 8-bit variant gives the expected logits
  on the STM32F405 under QEMU's netduinoplus2 (``trickle flash --board stm32f405``), else 0.
- tflite_instructions_per_mac_max: instructions per MAC on mps2-an386 of the imported int8
  TFLite models (``bench/tflite_models.py``: a stride-2 Conv1d net, a 2-D strided conv +
  depthwise + average-pool net, a dilated Conv1d net, the depthwise nets, and the graph that
  branches), the largest; each bit-exact with TFLite Micro (``tflite_models``).
- tflite_branching_instructions_per_mac (reported): that of the graph that branches (a residual
  ADD and a CONCATENATION along channels), which is in the maximum since issue 50.
- depthwise_multiplier2_vs_1 (issue 47, reported): a 3 x 3 depthwise layer of depth multiplier 2
  over one of multiplier 1, instructions per MAC at the same geometry (16 x 16, 16 outputs).

Each model's ``variants`` lists every 8-bit variant's instructions per MAC, with a per-layer
split from a profiling build (``trickle flash --record``'s numbers).

The MLPerf Tiny reference models (issue 47; read from $TRICKLE_DATA/mlperf-tiny, never copied into
the repository; the benchmark stops with a line naming the folder when they are absent), each
imported with test vectors spanning its int8 input and checked against TFLite Micro:

- mlperf_tiny_bit_exact_models / mlperf_tiny_stm32f405_bit_exact_models: how many of the five give
  TFLite Micro's outputs on every test vector on mps2-an386 / on the stm32f405 under QEMU (with the
  policy ``trickle flash`` chooses: tiles where the arena fits the backup SRAM, else atomic).
- mlperf_tiny_power_cut_trials_bit_exact: random cuts inside an inference, each followed by a
  restart, per model and board; the fewest identical to the uncut run.
- mlperf_tiny_instructions_per_mac: each model's on mps2-an386.
- arena_bytes_vs_tflm_planner_max: the memory plan's arena over the head of TFLite Micro's arena
  (its planner's tensors and scratch) for the same model; the largest. The int32 results, which the
  firmware keeps beside the progress word rather than in the arena, are listed per model
  (``outputs_bytes``).

Beside CMSIS-NN (issue 50; ``--part cmsis-nn``, or ``trickle bench firmware --peer cmsis-nn[=PATH]``;
bench/cmsis_nn.py runs Arm's kernels on the same counter, CMSIS-NN read from PATH, never part of the
project); each model profiled on mps2-an386 on its first test vector, each layer beside CMSIS-NN's
kernel on the same tensors (docs/results/firmware-cmsis-nn.md holds the per-layer table):

- cmsis_nn_instruction_ratio_max / _geomean: trickle's instructions per inference (the whole
  inference: executor, input copy, commits) over CMSIS-NN's (its kernels alone, no interpreter, the
  last SOFTMAX left out as the firmware stops at the logits), over the five models.
- cmsis_nn_bit_exact_layers (of cmsis_nn_layers): layers where CMSIS-NN's output equals TFLite
  Micro's tensor and the firmware's layer output (the host build's ``layers`` mode), byte for byte;
  ``cmsis_nn_bit_exact_exceptions`` names the others.
- estimated_cycles_per_inference: both sides' Cortex-M4 cycle estimate (the plugin weights each
  instruction by its class's cost in the Cortex-M4 TRM).
- estimated_cycles_vs_plumerai_max: trickle's estimated cycles over Plumerai's published ones
  (MLPerf Tiny v1.1, STM32L4R5 at 120 MHz: keyword spotting 20.93/s, ResNet-8 5.96/s), the larger.

``trickle bench firmware --part mlperf`` runs one part and keeps the others' keys from the
committed JSON; ``measured`` names the commit each part was measured at.
"""

from __future__ import annotations

import json
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from bench.measured import measured_commit
from edge.contract.bundle import read_bundle
from edge.core.files import write_atomic
from edge.core.tables import console_table
from export.bundle import export_bundle
from export.firmware.cgen import generate
from export.firmware.flash import (
    build,
    choose_policy,
    code_size,
    flash,
    inference_instructions,
    power_cut_trials,
    run_board,
    write_sources,
)
from models.data.datasets import load
from models.nexume.checkpoint import save_checkpoint
from models.nexume.train import TrainConfig, train

RESULTS = Path(__file__).parent / "results"
DOCS = Path(__file__).parent.parent / "docs" / "results"
GOALS = {
    "instructions_per_mac": ("<=", 2.0),  # issue 33 (was 4.0; 2.54 at 465309f)
    "intermittency_overhead_ratio": ("<=", 1.15),
    "power_cut_trials_bit_exact": (">=", 200),
    "stm32f405_bit_exact": (">=", 1),
    "tflite_instructions_per_mac_max": ("<=", 3.0),
    "mlperf_tiny_bit_exact_models": (">=", 5),  # issue 47: of the five, on mps2-an386
    "mlperf_tiny_stm32f405_bit_exact_models": (">=", 5),
    "mlperf_tiny_power_cut_trials_bit_exact": (">=", 100),  # the fewest over the five models and both boards
    "arena_bytes_vs_tflm_planner_max": ("<=", 1.0),
    # issue 50: trickle / CMSIS-NN instructions per inference over the five MLPerf Tiny models, and the
    # estimated Cortex-M4 cycles over Plumerai's published ones (keyword spotting, ResNet-8)
    "cmsis_nn_instruction_ratio_max": ("<=", 1.0),
    "cmsis_nn_instruction_ratio_geomean": ("<=", 0.6),
    "estimated_cycles_vs_plumerai_max": ("<=", 1.0),
}
BOARDS = ("mps2-an386", "stm32f405")


def _per_inference(elf: Path, work: Path) -> tuple[float, set[int]]:
    """Median instructions per inference, and the variants DynInfer ran."""
    run = run_board(elf, "mps2-an386", work)
    per = sorted(inference_instructions(run.marks))
    return float(per[len(per) // 2]), {variant for _, variant in run.outputs}


def bench_model(dataset: str, epochs: int, vectors: int, cuts: int, work: Path) -> dict[str, Any]:
    data = load(dataset)
    result = train(TrainConfig(dataset=dataset, method="nexume", epochs=epochs, seed=0), data)
    save_checkpoint(result, data, work / "ckpt")
    bundle = read_bundle(export_bundle(work / "ckpt" / "checkpoint.pt", work / "bundle", formats=("onnx-int8",)))
    sources, info = generate(bundle, data.x_test, max_vectors=vectors)
    write_sources(sources, work / "gen")
    builds = {name: build(work / "gen", "mps2-an386", work / name, vectors=vectors, dyninfer=True, **flags)
              for name, flags in (("shipped", {}), ("reference", {"reference_kernel": True}),
                                  ("no_progress", {"no_progress": True}))}
    measured = {name: _per_inference(elf, work / name) for name, elf in builds.items()}
    counts = {name: count for name, (count, _) in measured.items()}
    ran = measured["shipped"][1]  # DynInfer with a full capacitor runs the most accurate variant
    if len(ran) != 1:
        raise RuntimeError(f"DynInfer ran variants {sorted(ran)}; expected one")
    chosen = info["variants"][ran.pop()]
    policy = choose_policy("stm32f405", info["config"], info["input_bytes"])
    stm32 = build(work / "gen", "stm32f405", work / "stm32-cut", vectors=vectors, dyninfer=True,
                  atomic=policy.name == "atomic", keep_input=policy.keep_input)
    trials = {board: _power_cuts(elf, board, cuts) for board, elf in (("mps2-an386", builds["shipped"]),
                                                                        ("stm32f405", stm32))}
    on_stm32 = flash(bundle, "stm32f405", work / "stm32", x_test=data.x_test)  # every test vector, every variant
    every = flash(bundle, "mps2-an386", work / "all", vectors=vectors, profile=True, x_test=data.x_test)["variants"]
    variants = [{"name": v["name"], "macs": v["macs"], "instructions_per_inference": v["instructions_per_inference"],
                 "instructions_per_mac": v["instructions_per_mac"],
                 "layers": [{**layer, "instructions_per_mac": layer["instructions"] / macs if macs else None}
                            for layer, macs in zip(v["layers"], (la.macs for la in info["models"][k].layers))]}
                for k, v in enumerate(every)]
    return {"dataset": dataset, "variant": chosen["name"], "macs": chosen["macs"], "variants": variants,
            "instructions_per_inference": counts["shipped"], "instructions_per_mac": counts["shipped"] / chosen["macs"],
            "reference_instructions_per_inference": counts["reference"],
            "reference_kernel_ratio": counts["shipped"] / counts["reference"],
            "no_progress_instructions_per_inference": counts["no_progress"],
            "intermittency_overhead_ratio": counts["shipped"] / counts["no_progress"],
            "power_cut_trials": cuts, "power_cut_identical": {b: t[0] for b, t in trials.items()},
            "max_boots": {b: t[1] for b, t in trials.items()},
            "stm32f405": {"vectors": on_stm32["vectors"], "variants": len(on_stm32["variants"]),
                          "mismatches": on_stm32["mismatches"], "memory": on_stm32["memory"]},
            "size": code_size(builds["shipped"]),
            "test_vectors_in_text_bytes": vectors * (info["n_classes"] * 4 * len(info["variants"]))}


def _power_cuts(elf: Path, board: str, cuts: int) -> tuple[int, int]:
    """Cuts at random instructions inside the inference, each followed by a restart (what ``trickle flash
    --power-cuts`` runs): how many gave the uncut run's logits, and the most boots one took."""
    trials = power_cut_trials(elf, board, cuts)
    return trials["identical"], trials["max_boots"]


def bench_tflite(work: Path, vectors: int) -> list[dict[str, Any]]:
    """Each imported model of bench/tflite_models.py: made with litert-torch and ai-edge-quantizer,
    imported, run on mps2-an386 against TFLite Micro; its instructions per MAC, per layer too."""
    import numpy as np
    import torch

    from bench.tflite_models import BENCH_MODELS, BRANCHING_MODELS, DEPTHWISE_MODELS, int8_tflite
    from export.firmware.tflite_import import import_tflite

    out = []
    for name, (module, shape) in (BENCH_MODELS | BRANCHING_MODELS | DEPTHWISE_MODELS).items():
        torch.manual_seed(0)
        folder = work / name
        folder.mkdir(parents=True)
        x = int8_tflite(module(), shape, folder / f"{name}.tflite")
        np.savez(folder / "x.npz", x=x)
        bundle = read_bundle(import_tflite(folder / f"{name}.tflite", folder / "x.npz", folder / "bundle",
                                           vectors=vectors))
        report = flash(bundle, "mps2-an386", folder / "fw", profile=True)
        (v,) = report["variants"]
        out.append({"model": name, "macs": v["macs"], "instructions_per_inference": v["instructions_per_inference"],
                    "instructions_per_mac": v["instructions_per_mac"], "mismatches": report["mismatches"],
                    "vectors": report["vectors"], "layers": v["layers"],
                    "branches": name in BRANCHING_MODELS or name in DEPTHWISE_MODELS})
    return out


def depthwise_instructions_per_mac(imported: list[dict[str, Any]], name: str) -> float:
    """The depthwise layer's instructions per MAC in one of DEPTHWISE_MODELS (16 x 16 x 16 x 9 MACs)."""
    model = next(m for m in imported if m["model"] == name)
    return next(layer["instructions"] for layer in model["layers"] if layer["name"].startswith("dwconv")) / (16 * 16 * 16 * 9)


MLPERF_TINY = ("kws_ref_model", "pretrainedResnet_quant", "vww_96_int8", "ad01_int8", "str_ww_ref_model")


def mlperf_inputs(model: Path, n: int, seed: int = 0) -> Any:
    """``n`` model inputs spanning the int8 input's whole range (uniform codes, dequantized with the
    model's own scale): the test vectors bit-exactness is checked on (TFLite Micro's outputs are the
    oracle, so the inputs need not be the dataset's)."""
    import numpy as np

    from export.firmware.tflite_import import _Graph, read_model

    data = model.read_bytes()
    graph = _Graph(read_model(data), data)
    t = int(graph.g.inputs[0])
    scale, zp = graph.act(t)
    codes = np.random.default_rng(seed).integers(-128, 128, size=(n, *graph.shape(t)[1:]))
    return ((codes - zp) * scale).astype(np.float32)


def bench_mlperf(work: Path, vectors: int, cuts: int, folder: Path | None = None) -> list[dict[str, Any]]:
    """The five MLPerf Tiny reference models (``folder``: $TRICKLE_DATA/mlperf-tiny by default) as a
    user brings them: imported, flashed to mps2-an386 (profiled) and the stm32f405 (the policy
    ``trickle flash`` chooses), every test vector against TFLite Micro; ``cuts`` random power cuts
    inside an inference on each board; the memory plan's arena against TFLite Micro's planner."""
    import numpy as np

    from edge.core.files import data_root
    from export.firmware.tflite_import import import_tflite, tflm_planned_bytes

    folder = folder or data_root() / "mlperf-tiny"
    missing = [m for m in MLPERF_TINY if not (folder / f"{m}.tflite").exists()]
    if missing:
        raise FileNotFoundError(f"{folder}: no {', '.join(f'{m}.tflite' for m in missing)} (the MLPerf Tiny reference "
                                "models; give the data folder with TRICKLE_DATA)")
    out = []
    for name in MLPERF_TINY:
        print(f"  {name}: importing, flashing to mps2-an386 and stm32f405, {cuts} power cuts on each ...", flush=True)
        model, here = folder / f"{name}.tflite", work / name
        here.mkdir(parents=True)
        np.savez(here / "x.npz", x=mlperf_inputs(model, max(8, vectors)))
        bundle = read_bundle(import_tflite(model, here / "x.npz", here / "bundle", vectors=vectors))
        on = {board: flash(bundle, board, here / board, profile=board == "mps2-an386") for board in BOARDS}
        sources, info = generate(bundle, max_vectors=1)
        write_sources(sources, here / "gen")
        trials = {}
        for board in BOARDS:
            policy = choose_policy(board, info["config"], info["input_bytes"])
            elf = build(here / "gen", board, here / f"{board}-cut", vectors=1, atomic=policy.name == "atomic",
                        keep_input=policy.keep_input)
            trials[board] = _power_cuts(elf, board, cuts)
        (v,) = on["mps2-an386"]["variants"]
        tflm = tflm_planned_bytes(model.read_bytes())
        arena = info["arena_bytes"]
        out.append({"model": name, "macs": v["macs"], "instructions_per_inference": v["instructions_per_inference"],
                    "instructions_per_mac": v["instructions_per_mac"], "layers": v["layers"],
                    "vectors": on["mps2-an386"]["vectors"],
                    "mismatches": {b: on[b]["mismatches"] for b in BOARDS},
                    "policy": {b: on[b]["policy"] for b in BOARDS}, "memory": {b: on[b]["memory"] for b in BOARDS},
                    "power_cut_trials": cuts, "power_cut_identical": {b: t[0] for b, t in trials.items()},
                    "max_boots": {b: t[1] for b, t in trials.items()},
                    "arena_bytes": arena, "tensor_bytes": on["mps2-an386"]["plan"]["tensor_bytes"],
                    "outputs_bytes": 4 * info["n_classes"],  # the int32 results, kept beside the progress word
                    "tflm_planned_bytes": tflm, "arena_vs_tflm": arena / tflm})
    return out


# Plumerai's engine on an STM32L4R5 (Cortex-M4 at 120 MHz), MLPerf Tiny v1.1 closed division: cycles = clock /
# throughput (keyword spotting 20.93 inferences/s, image classification with ResNet-8 5.96/s)
PLUMERAI_CYCLES = {"kws_ref_model": 120e6 / 20.93, "pretrainedResnet_quant": 120e6 / 5.96}
# layer kinds that pair (a depthwise convolution of one input channel is the firmware's conv)
FAMILY = {"conv": "conv", "dwconv": "conv", "fc": "fc", "classifier": "fc", "avgpool": "avgpool", "maxpool": "maxpool",
          "add": "add"}


def _family(name: str) -> str:
    return FAMILY.get(name.rstrip("0123456789"), name.rstrip("0123456789"))


def pair_layers(firmware: list[dict[str, Any]], peer: list[dict[str, Any]]) -> list[tuple[dict[str, Any] | None,
                                                                                           dict[str, Any] | None]]:
    """The firmware's layers beside CMSIS-NN's, in the graph's order: a pair where both run the operator, a
    firmware layer alone where CMSIS-NN has no kernel in the comparison (MEAN, a table, a concatenation), a
    CMSIS-NN layer alone where the firmware runs nothing (the last SOFTMAX: the firmware stops at the logits)."""
    out: list[tuple[dict[str, Any] | None, dict[str, Any] | None]] = []
    j = 0
    for layer in firmware:
        k = next((i for i in range(j, len(peer)) if _family(peer[i]["name"]) == _family(layer["name"])), None)
        if k is None:
            out.append((layer, None))
            continue
        out.extend((None, la) for la in peer[j:k])
        out.append((layer, peer[k]))
        j = k + 1
    out.extend((None, la) for la in peer[j:])
    return out


def bench_cmsis_nn(work: Path, peer: str | None = None, folder: Path | None = None, vectors: int = 4,
                   models: tuple[str, ...] = MLPERF_TINY, own: bool = True) -> list[dict[str, Any]]:
    """Each MLPerf Tiny model (and with ``own`` the project's TFLite CNNs of bench/tflite_models.py) on
    mps2-an386 twice, layer by layer: the firmware (profiled) and CMSIS-NN's kernels (bench.cmsis_nn), on
    the same first test vector and the same counter; each CMSIS-NN output checked against TFLite Micro's
    tensor and the firmware's layer output."""

    from bench import cmsis_nn
    from edge.core.files import data_root

    peer_dir = cmsis_nn.peer_folder(peer)
    folder = folder or data_root() / "mlperf-tiny"
    libs = cmsis_nn.libraries(peer_dir, work / "cmsis-nn")
    out = []
    for name in models:
        print(f"  {name}: the firmware (profiled) and CMSIS-NN, layer by layer ...", flush=True)
        model = folder / f"{name}.tflite"
        out.append(_beside(name, model, mlperf_inputs(model, max(8, vectors)), work / name, peer_dir, libs, vectors))
    if own:
        import torch

        from bench.tflite_models import BENCH_MODELS, BRANCHING_MODELS, DEPTHWISE_MODELS, int8_tflite

        for name, (module, shape) in (BENCH_MODELS | BRANCHING_MODELS | DEPTHWISE_MODELS).items():
            print(f"  {name} (the project's): the firmware (profiled) and CMSIS-NN, layer by layer ...", flush=True)
            torch.manual_seed(0)
            (work / name).mkdir(parents=True)
            x = int8_tflite(module(), shape, work / name / f"{name}.tflite")
            side = _beside(name, work / name / f"{name}.tflite", x, work / name, peer_dir, libs, vectors)
            out.append({**side, "own": True})
    return out


def _beside(name: str, model: Path, x: Any, here: Path, peer_dir: Path, libs: dict[str, Path], vectors: int
            ) -> dict[str, Any]:
    """One TFLite model, the firmware's layers (profiled, and their outputs) beside CMSIS-NN's."""
    import numpy as np

    from bench import cmsis_nn
    from edge.classify.backends import quantize_tflite
    from export.firmware.tflite_import import _Graph, import_tflite, read_model

    here.mkdir(parents=True, exist_ok=True)
    np.savez(here / "x.npz", x=x)
    bundle = read_bundle(import_tflite(model, here / "x.npz", here / "bundle", vectors=vectors))
    report = flash(bundle, "mps2-an386", here / "fw", profile=True)
    (v,) = report["variants"]
    data = model.read_bytes()
    graph = _Graph(read_model(data), data)
    x_q = quantize_tflite(x[0], *graph.act(int(graph.g.inputs[0])))  # the profiled (first) test vector
    firmware_outputs = layer_outputs(bundle, x[:1], here / "host")
    peer_layers = cmsis_nn.measure_model(model, x_q, peer_dir, libs, here / "cmsis")["layers"]
    return _side_by_side(name, v, report["mismatches"], peer_layers, firmware_outputs, here)


def layer_outputs(bundle: Any, x: Any, work: Path) -> dict[str, Any]:
    """The firmware's output of every layer (its name, e.g. conv3, as the profile names it) for the model
    input ``x[0]``: the host build's ``layers`` mode, the same C kernels as the Cortex-M4's plain-C paths."""
    import subprocess

    import numpy as np

    from export.firmware.flash import layer_tiles

    sources, info = generate(bundle, x, max_vectors=1)
    write_sources(sources, work / "gen")
    exe = build(work / "gen", "host", work / "build")
    proc = subprocess.run([str(exe), "layers"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the host firmware's layers run failed ({proc.returncode}): {proc.stderr[-500:]}")
    names = [name for name, _, _ in layer_tiles(info["models"][0])]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("LAYER ")]
    return {names[int(r[1])]: np.array([int(v) for v in r[2:]], np.int64) for r in rows}


def _side_by_side(name: str, v: dict[str, Any], mismatches: int, peer: list[dict[str, Any]],
                  outputs: dict[str, Any], work: Path) -> dict[str, Any]:
    """One model's layers, the firmware's beside CMSIS-NN's, and its totals."""
    import numpy as np

    with np.load(work / "cmsis" / "tflm_outputs.npz") as saved:
        wants = {la["name"]: saved[la["name"]].astype(np.int64) for la in peer}
    rows, ours, theirs, paired_ours = [], 0, 0, 0
    for fw, cm in pair_layers(v["layers"], peer):
        row: dict[str, Any] = {"name": (fw or cm or {})["name"]}
        if cm is not None:
            row |= {"cmsis_nn_name": cm["name"], "shape": cm["shape"], "macs": cm["macs"],
                    "cmsis_nn_instructions": cm["instructions"], "cmsis_nn_estimated_cycles": cm["estimated_cycles"],
                    "cmsis_nn_opt": cm["opt"], "cmsis_nn_bit_exact_with_tflm": cm["bit_exact_with_tflm"]}
        if fw is not None:
            row |= {"instructions": fw["instructions"], "estimated_cycles": fw.get("estimated_cycles")}
        if fw is not None and cm is not None:
            got, want = outputs.get(fw["name"]), wants[cm["name"]]  # the firmware's output, TFLite Micro's tensor
            row["firmware_bit_exact_with_tflm"] = bool(got is not None and got.shape == want.shape
                                                      and np.array_equal(got, want))
            row["cmsis_nn_equals_firmware"] = row["firmware_bit_exact_with_tflm"] and cm["bit_exact_with_tflm"]
            row["ratio"] = fw["instructions"] / cm["instructions"]
            paired_ours += fw["instructions"]
            theirs += cm["instructions"]
        ours += fw["instructions"] if fw is not None else 0
        rows.append(row)
    whole = all(r.get("cmsis_nn_instructions") is not None for r in rows if "instructions" in r)
    cycles = v.get("estimated_cycles_per_inference")
    peer_cycles = [r["cmsis_nn_estimated_cycles"] for r in rows if "instructions" in r and "cmsis_nn_instructions" in r]
    return {"model": name, "mismatches": mismatches, "layers": rows,
            "instructions_per_inference": v["instructions_per_inference"], "estimated_cycles_per_inference": cycles,
            # the peer's kernels alone (no interpreter, no SOFTMAX: the firmware stops at the logits), against the
            # firmware's whole inference (executor, input copy and commits included) when every layer pairs
            "cmsis_nn_instructions": theirs,
            "cmsis_nn_estimated_cycles": sum(peer_cycles) if peer_cycles and None not in peer_cycles else None,
            "cmsis_nn_softmax_instructions": sum(r["cmsis_nn_instructions"] for r in rows
                                                 if "instructions" not in r and "cmsis_nn_instructions" in r),
            "compared_instructions": v["instructions_per_inference"] if whole else paired_ours,
            "instruction_ratio": (v["instructions_per_inference"] if whole else paired_ours) / theirs,
            "every_layer_paired": whole}


PARTS = ("trained", "tflite", "mlperf", "cmsis-nn")


def _trained_keys(per: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        # every 8-bit variant of every model (issue 50; before, only the variant DynInfer runs on a full capacitor)
        "instructions_per_mac": max(v["instructions_per_mac"] for m in per for v in m["variants"]),
        "dyninfer_instructions_per_mac": max(m["instructions_per_mac"] for m in per),
        "reference_kernel_ratio": max(m["reference_kernel_ratio"] for m in per),
        "intermittency_overhead_ratio": max(m["intermittency_overhead_ratio"] for m in per),
        "power_cut_trials_bit_exact_by_board": {b: sum(m["power_cut_identical"][b] for m in per) for b in BOARDS},
        "power_cut_trials_bit_exact": min(sum(m["power_cut_identical"][b] for m in per) for b in BOARDS),
        "power_cut_trials": sum(m["power_cut_trials"] for m in per),  # per board
        "stm32f405_bit_exact": int(all(m["stm32f405"]["mismatches"] == 0 for m in per)),
        "models": per,
    }


def _tflite_keys(imported: list[dict[str, Any]]) -> dict[str, Any]:
    mult1, mult2 = (depthwise_instructions_per_mac(imported, f"depthwise_mult{k}") for k in (1, 2))
    return {
        "tflite_instructions_per_mac_max": max(m["instructions_per_mac"] for m in imported),  # branching ones too
        "tflite_branching_instructions_per_mac": next(m["instructions_per_mac"] for m in imported
                                                      if m["model"] == "residual_concat2d"),
        "depthwise_multiplier2_vs_1": mult2 / mult1,  # the depthwise layers' instructions per MAC, same geometry
        "depthwise_multiplier_instructions_per_mac": {"1": mult1, "2": mult2},
        "tflite_bit_exact": int(all(m["mismatches"] == 0 for m in imported)),
        "tflite_models": imported,
    }


def _mlperf_keys(mlperf: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "mlperf_tiny_bit_exact_models": sum(m["mismatches"]["mps2-an386"] == 0 for m in mlperf),
        "mlperf_tiny_stm32f405_bit_exact_models": sum(m["mismatches"]["stm32f405"] == 0 for m in mlperf),
        "mlperf_tiny_power_cut_trials_bit_exact": min(t for m in mlperf for t in m["power_cut_identical"].values()),
        "mlperf_tiny_instructions_per_mac": {m["model"]: m["instructions_per_mac"] for m in mlperf},
        "arena_bytes_vs_tflm_planner_max": max(m["arena_vs_tflm"] for m in mlperf),
        "mlperf_tiny_models": mlperf,
    }


def _cmsis_keys(every: list[dict[str, Any]]) -> dict[str, Any]:
    import math

    per = [m for m in every if not m.get("own")]  # the keys: the five MLPerf Tiny models
    own = [m for m in every if m.get("own")]
    ratios = [m["instruction_ratio"] for m in per]
    layers = [(m["model"], r) for m in every for r in m["layers"] if "instructions" in r and "cmsis_nn_instructions" in r]
    plumerai = {m["model"]: m["estimated_cycles_per_inference"] / PLUMERAI_CYCLES[m["model"]] for m in per
                if m["model"] in PLUMERAI_CYCLES and m["estimated_cycles_per_inference"] is not None}
    return {
        "cmsis_nn_instruction_ratio_max": max(ratios),
        "cmsis_nn_instruction_ratio_geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)),
        "cmsis_nn_instruction_ratio": {m["model"]: m["instruction_ratio"] for m in per},
        "cmsis_nn_bit_exact_layers": sum(r["cmsis_nn_equals_firmware"] for _, r in layers),
        "cmsis_nn_layers": len(layers),
        "cmsis_nn_bit_exact_exceptions": [f"{name}/{r['name']}" for name, r in layers if not r["cmsis_nn_equals_firmware"]],
        "estimated_cycles_per_inference": {m["model"]: {"trickle": m["estimated_cycles_per_inference"],
                                                        "cmsis_nn": m["cmsis_nn_estimated_cycles"]} for m in per},
        **({"estimated_cycles_vs_plumerai_max": max(plumerai.values())} if plumerai else {}),
        "estimated_cycles_vs_plumerai": plumerai,
        "plumerai_cycles": PLUMERAI_CYCLES,
        "cmsis_nn_models": per,
        # the project's TFLite CNNs beside CMSIS-NN (reported; their layers in the bit-exact count too)
        "cmsis_nn_own_instruction_ratio": {m["model"]: m["instruction_ratio"] for m in own},
        "cmsis_nn_own_models": own,
    }


def _print_trained(per: list[dict[str, Any]]) -> None:
    header = ("model", "variant", "instr/inference", "instr/MAC", "vs plain", "overhead", "cuts ok (mps2, stm32)",
              "stm32 mismatches", "text B")
    table = [(m["dataset"], m["variant"], f"{m['instructions_per_inference']:.0f}", f"{m['instructions_per_mac']:.2f}",
              f"{m['reference_kernel_ratio']:.3f}", f"{m['intermittency_overhead_ratio']:.3f}",
              " ".join(f"{m['power_cut_identical'][b]}/{m['power_cut_trials']}" for b in BOARDS),
              f"{m['stm32f405']['mismatches']} of {m['stm32f405']['vectors']} x {m['stm32f405']['variants']}",
              m["size"]["text"]) for m in per]
    print("\n" + console_table(table, headers=header, align="llrrrrrrr"))
    print("\nevery 8-bit variant (instructions per MAC; per layer, first test vector):")
    layers = [(m["dataset"], v["name"], f"{v['instructions_per_mac']:.2f}",
               "  ".join(f"{layer['name']} {layer['instructions_per_mac']:.2f}" for layer in v["layers"]
                         if layer["instructions_per_mac"] is not None)) for m in per for v in m["variants"]]
    print(textwrap.indent(console_table(layers, align="llrl"), "  "))


def _print_tflite(imported: list[dict[str, Any]]) -> None:
    print("\nimported int8 TFLite models (mps2-an386, against TFLite Micro):")
    rows = [(m["model"], m["macs"], f"{m['instructions_per_mac']:.2f}", f"{m['mismatches']} of {m['vectors']}",
             "  ".join(f"{layer['name']} {layer['instructions']}" for layer in m["layers"])) for m in imported]
    print(textwrap.indent(console_table(rows, headers=("model", "MACs", "instr/MAC", "mismatches", "per layer"),
                                        align="lrrrl"), "  "))


def _print_mlperf(mlperf: list[dict[str, Any]]) -> None:
    print("\nMLPerf Tiny reference models (against TFLite Micro; stm32f405 under QEMU's netduinoplus2):")
    rows = [(m["model"], m["macs"], f"{m['instructions_per_mac']:.2f}",
             " ".join(f"{m['mismatches'][b]}" for b in BOARDS),
             " ".join(f"{m['power_cut_identical'][b]}/{m['power_cut_trials']}" for b in BOARDS),
             m["policy"]["stm32f405"]["policy"], m["arena_bytes"], m["tflm_planned_bytes"], f"{m['arena_vs_tflm']:.3f}")
            for m in mlperf]
    print(textwrap.indent(console_table(rows, headers=("model", "MACs", "instr/MAC", "mismatches (mps2, stm32)",
                                                       "cuts ok (mps2, stm32)", "stm32 policy", "arena B", "TFLM B",
                                                       "ratio"), align="lrrrrlrrr"), "  "))


def _print_cmsis(per: list[dict[str, Any]]) -> None:
    print("\nMLPerf Tiny reference models (then the project.s TFLite CNNs) beside CMSIS-NN (mps2-an386, instructions per "
          "inference; CMSIS-NN.s kernels "
          "alone):")
    rows = [(m["model"], m["instructions_per_inference"], m["cmsis_nn_instructions"], f"{m['instruction_ratio']:.3f}",
             _count(m["estimated_cycles_per_inference"]), _count(m["cmsis_nn_estimated_cycles"]),
             f"{sum(r.get('cmsis_nn_equals_firmware', False) for r in m['layers'])}/"
             f"{sum('instructions' in r and 'cmsis_nn_instructions' in r for r in m['layers'])}") for m in per]
    print(textwrap.indent(console_table(rows, headers=("model", "trickle", "CMSIS-NN", "ratio", "trickle cycles~",
                                                       "CMSIS-NN cycles~", "layers equal"), align="lrrrrrr"), "  "))


def _count(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def cmsis_markdown(per: list[dict[str, Any]], commit: str) -> str:
    """docs/results/firmware-cmsis-nn.md: every MLPerf Tiny model's layers, both sides and the ratio."""
    lines = ["# The firmware beside CMSIS-NN, layer by layer (issue 50)", "",
             f"Measured by `trickle bench firmware --part cmsis-nn` at {commit} on QEMU's mps2-an386 (Cortex-M4) with "
             "the project's counting plugin: executed instructions, and an estimate of Cortex-M4 cycles (each "
             "instruction weighted by its class's cost in the Cortex-M4 Technical Reference Manual; an estimate, not a "
             "measurement on silicon). CMSIS-NN (github.com/ARM-software/CMSIS-NN, built with arm-none-eabi-gcc at -O2 "
             "and -O3, each layer at the faster level) runs each operator through its own entry point on TFLite Micro's "
             "own input tensor, between two marks: its kernels alone, no interpreter. The firmware's figure per layer "
             "is its profile (tiles and commits included); its total is the whole inference. MACs count convolution, "
             "depthwise and fully connected multiply-accumulates only. *equal*: CMSIS-NN's output equals TFLite "
             "Micro's tensor and the firmware's layer output, byte for byte.", "",
             "| model | trickle instr | CMSIS-NN instr | ratio | trickle cycles~ | CMSIS-NN cycles~ | Plumerai cycles | "
             "layers equal |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in per:
        pairs = [r for r in m["layers"] if "cmsis_nn_equals_firmware" in r]
        lines.append(f"| {m['model']}{' (the project’s)' if m.get('own') else ''} | {m['compared_instructions']:,} | "
                     f"{m['cmsis_nn_instructions']:,} | {m['instruction_ratio']:.3f} | "
                     f"{_count(m['estimated_cycles_per_inference'] if m['every_layer_paired'] else None)} | "
                     f"{_count(m['cmsis_nn_estimated_cycles'])} | "
                     f"{_count(PLUMERAI_CYCLES.get(m['model']))} | "
                     f"{sum(r['cmsis_nn_equals_firmware'] for r in pairs)}/{len(pairs)} |")
    lines.append("")
    for m in per:
        if m["every_layer_paired"]:
            ours = f"trickle {m['instructions_per_inference']:,} instructions per inference"
        else:
            ours = (f"Over the layers both run (CMSIS-NN has no MEAN or CONCATENATION kernel here; the whole inference "
                    f"{m['instructions_per_inference']:,}): trickle {m['compared_instructions']:,}")
        lines += [f"## {m['model']}" + (" (the project's, bench/tflite_models.py)" if m.get("own") else ""), "",
                  f"{ours}, CMSIS-NN {m['cmsis_nn_instructions']:,} (its SOFTMAX, which the firmware does not run, "
                  f"another {m['cmsis_nn_softmax_instructions']:,}): ratio **{m['instruction_ratio']:.3f}**. Estimated "
                  f"cycles: trickle {_count(m['estimated_cycles_per_inference'])}, CMSIS-NN "
                  f"{_count(m['cmsis_nn_estimated_cycles'])}"
                  + (f"; Plumerai publishes {PLUMERAI_CYCLES[m['model']]:,.0f}." if m["model"] in PLUMERAI_CYCLES else "."),
                  "", "| layer | shape | MACs | trickle instr | CMSIS-NN instr | ratio | trickle instr/MAC | "
                  "CMSIS-NN instr/MAC | trickle cycles~ | CMSIS-NN cycles~ | equal |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in m["layers"]:
            macs = r.get("macs") or 0
            ours, theirs = r.get("instructions"), r.get("cmsis_nn_instructions")
            lines.append("| " + " | ".join([
                r["name"], r.get("shape", ""), f"{macs:,}" if macs else "-", _count(ours), _count(theirs),
                f"{r['ratio']:.2f}" if "ratio" in r else "-",
                f"{ours / macs:.2f}" if ours is not None and macs else "-",
                f"{theirs / macs:.2f}" if theirs is not None and macs else "-",
                _count(r.get("estimated_cycles")), _count(r.get("cmsis_nn_estimated_cycles")),
                ("yes" if r["cmsis_nn_equals_firmware"] else "**no**") if "cmsis_nn_equals_firmware" in r
                else "(CMSIS-NN only)" if ours is None else "(no CMSIS-NN kernel)"]) + " |")
        lines.append("")
    return "\n".join(lines)


def main(quick: bool = False, results_dir: Path = RESULTS, parts: tuple[str, ...] = PARTS, peer: str | None = None,
         docs_dir: Path = DOCS) -> dict[str, Any]:
    """Run the benchmark's ``parts`` (trained models, imported TFLite models, MLPerf Tiny). Running
    some of them keeps the others' keys from the committed JSON, and ``measured`` says which part
    each key set comes from (this run, or the one before)."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"parts {sorted(unknown)}: must be among {', '.join(PARTS)}")
    epochs, vectors, cuts = (2, 3, 20) if quick else (30, 20, 100)
    path = results_dir / ("firmware-quick.json" if quick else "firmware.json")
    previous = json.loads(path.read_text()) if path.exists() and set(parts) != set(PARTS) else {}
    commit = measured_commit("firmware", "export", "bench")
    out: dict[str, Any] = {**previous, "quick": quick, "goals": {k: f"{op} {goal:g}" for k, (op, goal) in GOALS.items()}}
    measured = dict(previous.get("measured", {}))
    with tempfile.TemporaryDirectory() as tmp:
        if "trained" in parts:
            per = []
            for dataset in ("digits", "basic_motions"):
                print(f"{dataset}: training, exporting, building four firmwares, {cuts} power cuts per board ...",
                      flush=True)
                per.append(bench_model(dataset, epochs, vectors, cuts, Path(tmp) / dataset))
            out |= _trained_keys(per)
            _print_trained(per)
        if "tflite" in parts:
            print("imported TFLite models: converting, quantizing, importing, flashing ...", flush=True)
            imported = bench_tflite(Path(tmp) / "tflite", vectors)
            out |= _tflite_keys(imported)
            _print_tflite(imported)
        if "mlperf" in parts:
            print("MLPerf Tiny reference models:", flush=True)
            mlperf = bench_mlperf(Path(tmp) / "mlperf", 4 if quick else 8, 10 if quick else 100)
            out |= _mlperf_keys(mlperf)
            _print_mlperf(mlperf)
        if "cmsis-nn" in parts:
            print("MLPerf Tiny reference models beside CMSIS-NN:", flush=True)
            side = bench_cmsis_nn(Path(tmp) / "cmsis-nn", peer, vectors=4)
            out |= _cmsis_keys(side)
            _print_cmsis(side)
            doc = docs_dir / ("firmware-cmsis-nn-quick.md" if quick else "firmware-cmsis-nn.md")
            write_atomic(doc, cmsis_markdown(side, commit) + "\n")
            print(f"wrote {doc}")
    measured |= dict.fromkeys(parts, commit)
    out["measured"] = measured
    goals = []
    for key, (op, goal) in GOALS.items():
        if key not in out:
            continue
        ok = out[key] <= goal if op == "<=" else out[key] >= goal
        goals.append((key, f"{out[key]:.4g}", f"{'✔' if ok else '✘'} (goal {op} {goal:g})"))
    if "reference_kernel_ratio" in out:
        goals.append(("reference_kernel_ratio", f"{out['reference_kernel_ratio']:.4g}", "(shipped / plain kernel)"))
    if "cmsis_nn_layers" in out:
        exceptions = out["cmsis_nn_bit_exact_exceptions"]
        goals.append(("cmsis_nn_bit_exact_layers", f"{out['cmsis_nn_bit_exact_layers']} of {out['cmsis_nn_layers']}",
                      "✔ (goal: all)" if not exceptions else f"✘ not equal: {', '.join(exceptions)}"))
    print(console_table(goals, align="lrl"))
    write_atomic(path, json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")
    return out
