"""``trickle export`` and ``trickle flash``: a checkpoint becomes a bundle; a bundle becomes firmware.

Both verbs import torch, onnx and the toolchains only when they run, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from edge.core.errors import ConfigError, DataError
from export.formats import BOARDS, FORMATS, TEST_VECTORS


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path,
                   help="checkpoint.pt written by trickle train (nexume: the classifier's variants; firmbound: an "
                        "early-decision bundle), a MoA draft folder (trickle train draft) with --target, "
                        "or your own classifier as MODEL.onnx or a fully-int8 MODEL.tflite, with --calibration")
    p.add_argument("--calibration", type=Path, metavar="NPZ",
                   help="MODEL.onnx / MODEL.tflite only: .npz of model inputs 'x' (and optionally labels 'y'): "
                        "onnxruntime's static int8 quantization calibrates on them; they become the bundle's test "
                        "vectors, and with labels the variants' accuracies are measured")
    p.add_argument("--labels", metavar="LIST",
                   help="MODEL.onnx / MODEL.tflite only: comma-separated class names (default 0, 1, ...)")
    p.add_argument("--target", type=Path, metavar="DIR",
                   help="a MoA draft's target LM folder: export the draft's device form (ONNX graphs, tokenizer)")
    p.add_argument("--out", type=Path, required=True, help="bundle folder (or .tar with --tar)")
    p.add_argument("--draft-precision", choices=["fp32", "int8"], default="int8",
                   help="with --target: int8 (default) quantizes the draft's weights after the float32 parity check "
                        "(its agreement with float32 goes into the manifest; verification keeps the text exact; "
                        "measured 0.98-1.12x the float32 draft's tokens/s over five links, bench client-server)")
    p.add_argument("--formats", default=",".join(FORMATS), metavar="LIST",
                   help=f"comma-separated, among {','.join(FORMATS)} (default: all)")
    p.add_argument("--key", type=Path, metavar="PRIVATE", help="Ed25519 private key file to sign the manifest with")
    p.add_argument("--tar", action="store_true", help="write one deterministic tar instead of a folder")
    p.add_argument("--bundle-version", type=int, default=1, help="monotonic version a device checks (default 1)")
    p.add_argument("--test-vectors", type=int, default=TEST_VECTORS, metavar="N",
                   help=f"test examples the bundle carries, with every variant's expected outputs (default {TEST_VECTORS})")
    p.add_argument("--data", type=Path, help="shared data folder, for the test split of the parity checks "
                                             "(default $TRICKLE_DATA, else shared/data beside the checkout)")
    p.add_argument("--dataset", metavar="PATH",
                   help="a trickle checkpoint trained on your data: where that data is now, if not at the path the "
                        "checkpoint recorded (its content must be the same)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run_export(args: argparse.Namespace) -> int:
    """Export a trained checkpoint as a bundle, every variant in every format, parity-checked.

        trickle export runs/train/digits-nexume/checkpoint.pt --out bundles/digits --key keys/signing.key
        trickle export CHECKPOINT --out bundles/digits.tar --tar --formats onnx-int8

    Formats: onnx (fp32), onnx-int8 (QDQ; brevitas' QCDQ export of the quantized variants),
    pte (ExecuTorch, XNNPACK-delegated and portable, of the float variants), tflite (litert-torch,
    of the float variants). The same checkpoint and options give byte-identical files. Export
    stops with one error line when a format's runtime misses parity with PyTorch (fp32: max abs
    diff <= 1e-4; int8: top-1 agreement >= 99% and accuracy within 1 point). The bundle carries
    --test-vectors examples of the test split with each variant's outputs: devices self-test on
    them and `trickle flash` checks firmware with them. Make a key pair with `trickle keygen`.

    Your own model: MODEL.onnx --calibration X.npz (fp32 as given, int8 by onnxruntime's static
    quantization), or a fully-int8 MODEL.tflite --calibration X.npz (as given; `trickle flash`
    runs it bit-exact with TFLite Micro).
    """
    if args.dataset is not None and (args.target is not None or (args.checkpoint / "draft.json").is_file()
                                     or args.checkpoint.suffix.lower() in (".onnx", ".tflite")):
        raise ConfigError("--dataset", args.dataset, "applies to a checkpoint of trickle train nexume only")
    if args.target is not None or (args.checkpoint / "draft.json").is_file():
        return run_export_draft(args)
    if args.checkpoint.suffix.lower() in (".onnx", ".tflite"):
        return run_export_onnx(args)
    for flag in ("calibration", "labels"):
        if getattr(args, flag) is not None:
            raise ConfigError(f"--{flag}", getattr(args, flag), "applies to MODEL.onnx or MODEL.tflite only")
    if not args.checkpoint.is_file():
        raise ConfigError("checkpoint", str(args.checkpoint), "no such file")
    if args.bundle_version < 1:
        raise ConfigError("--bundle-version", args.bundle_version, "must be >= 1")
    from models.firmbound.checkpoint import read_checkpoint

    if read_checkpoint(args.checkpoint) is not None:
        return run_export_early(args)
    if args.test_vectors < 1:
        raise ConfigError("--test-vectors", args.test_vectors, "must be >= 1")
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or not formats:
        raise ConfigError("--formats", args.formats, f"must be among {','.join(FORMATS)}")
    from export.bundle import export_bundle

    checked: list[str] = []

    def progress(name: str) -> None:
        checked.append(name)
        if not args.json:
            print(f"  {name}: parity ok")

    path = export_bundle(args.checkpoint, args.out, formats, args.key, args.tar, args.bundle_version, args.data,
                         progress=progress, vectors=args.test_vectors, dataset=args.dataset)
    if args.json:
        print(json.dumps({"bundle": str(path), "signed": args.key is not None, "parity_checked": checked}))
    else:
        print(f"wrote {path}" + (" (signed)" if args.key else " (unsigned)"))
    return 0


def run_export_early(args: argparse.Namespace) -> int:
    """``trickle export runs/train/coffee-firmbound/checkpoint.pt --out bundles/coffee-early``: a
    ``trickle train firmbound`` checkpoint as an early-decision bundle (``export.early``), its decisions
    on the checkpoint's test series checked against the trained classifier's."""
    for flag, value, default in (("--formats", args.formats, ",".join(FORMATS)), ("--dataset", args.dataset, None),
                                 ("--test-vectors", args.test_vectors, TEST_VECTORS)):
        if value != default:
            raise ConfigError(flag, value, "applies to a checkpoint of trickle train nexume, not to FIRMBOUND's")
    from export.early import export_checkpoint

    out = args.out.with_suffix(".tar") if args.tar and args.out.suffix != ".tar" else args.out
    path, alike, checked = export_checkpoint(args.checkpoint, out, args.key, args.bundle_version)
    if args.json:
        print(json.dumps({"bundle": str(path), "signed": args.key is not None, "early": True,
                          "decisions_alike": alike, "decisions_checked": checked}))
    else:
        print(f"  decisions on the checkpoint's {checked} test series: {alike} the same as the trained classifier's")
        print(f"wrote {path} (early-decision bundle, " + ("signed)" if args.key else "unsigned)"))
    return 0


def run_export_onnx(args: argparse.Namespace) -> int:
    """``trickle export model.onnx --calibration calib.npz --out B``: your own ONNX classifier as a bundle,
    fp32 as given and int8 by onnxruntime's static quantization (``export.onnx_import``); or a
    fully-int8 ``model.tflite`` as given, its example inputs the test vectors (``export.firmware.tflite_import``)."""
    if not args.checkpoint.is_file():
        raise ConfigError("model", str(args.checkpoint), "no such file")
    tflite = args.checkpoint.suffix.lower() == ".tflite"
    if args.calibration is None:
        raise ConfigError("--calibration", None, "a .tflite model needs example inputs (.npz with 'x') for its test "
                          "vectors" if tflite else "an ONNX model needs calibration data (.npz with 'x') for its int8 variant")
    if args.bundle_version < 1:
        raise ConfigError("--bundle-version", args.bundle_version, "must be >= 1")
    from export.firmware.tflite_import import import_tflite
    from export.onnx_import import import_onnx

    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    importer = import_tflite if tflite else import_onnx
    path = importer(args.checkpoint, args.calibration, args.out, labels, args.key, args.tar, args.bundle_version,
                    args.test_vectors, progress=None if args.json else lambda m: print(f"  {m}"))
    refusal = None
    if tflite:  # the firmware reads it at flash time: say now whether it can
        from export.firmware.cgen import flash_refusal

        refusal = flash_refusal(args.checkpoint.read_bytes())
        if not args.json:
            print("  trickle flash can run it (bit-exact with TFLite Micro)" if refusal is None
                  else f"  trickle flash cannot run it: {refusal}")
    if args.json:
        print(json.dumps({"bundle": str(path), "signed": args.key is not None}
                         | ({"flashable": refusal is None, "flash_refusal": refusal} if tflite else {})))
    else:
        print(f"wrote {path}" + (" (signed)" if args.key else " (unsigned)"))
    return 0


def run_export_draft(args: argparse.Namespace) -> int:
    """``trickle export runs/lm/draft-moa --target runs/lm/base --out drafts/moa --key K``: the
    device form of a MoA draft as a signed lm-draft bundle (``export.lm_draft``), parity-checked
    against torch."""
    if args.target is None:
        raise ConfigError("--target", None, "a draft folder needs its target LM folder")
    if not (args.checkpoint / "draft.json").is_file():
        raise ConfigError("checkpoint", str(args.checkpoint), "not a draft folder (no draft.json; trickle train draft)")
    if args.bundle_version < 1:
        raise ConfigError("--bundle-version", args.bundle_version, "must be >= 1")
    from export.lm_draft import export_lm_draft

    out = args.out.with_suffix(".tar") if args.tar and args.out.suffix != ".tar" else args.out
    manifest = export_lm_draft(args.checkpoint, args.target, out, key=args.key, bundle_version=args.bundle_version,
                               precision=args.draft_precision)
    agreement = "" if manifest.top1_agreement is None else f"; int8 agrees with float32 on {manifest.top1_agreement:.0%}"
    if args.json:
        print(json.dumps({"bundle": str(out), "signed": args.key is not None, "precision": manifest.precision,
                          "parity_max_abs_logit": manifest.parity_max_abs_logit, "top1_agreement": manifest.top1_agreement}))
    else:
        print(f"wrote {out} ({manifest.model} draft bundle, ONNX {manifest.precision}, "
              f"{'signed' if args.key else 'unsigned'}; parity with torch: {manifest.parity_max_abs_logit:.1e}{agreement})")
    return 0


def add_flash_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", type=Path, help="bundle folder or .tar with int8 (onnx-int8 or tflite-int8) variants")
    p.add_argument("--board", choices=BOARDS, default="mps2-an386", help="target (default mps2-an386)")
    p.add_argument("--out", type=Path, default=Path("build/flash"), help="build folder (default build/flash)")
    p.add_argument("--vectors", type=int, metavar="N", help="run only the first N of the bundle's test vectors")
    p.add_argument("--inputs", type=Path, metavar="X.npy",
                   help="model inputs (N, *input shape) to use as test vectors instead of the bundle's own "
                        "(for a bundle exported before bundles carried them)")
    p.add_argument("--labels", type=Path, metavar="Y.npy",
                   help="the classes of --inputs (N class indices, or N of the bundle's label names): each variant's "
                        "accuracy on the board (the bundle's own test vectors carry theirs)")
    p.add_argument("--power-cuts", type=int, default=0, metavar="N",
                   help="mps2-an386, stm32f405: after the run, N power cuts at random instructions inside an "
                        "inference (seeded), each followed by power-ons until it finishes; every one must give the "
                        "uncut run's outputs bit for bit")
    p.add_argument("--trust", type=Path, action="append", default=[], metavar="PUBKEY",
                   help="trusted public key file; with one, the bundle must be signed by it (repeatable)")
    p.add_argument("--record", type=Path, metavar="OUT",
                   help="mps2-an386: write a copy of the bundle to OUT (folder, or .tar) whose manifest carries the "
                        "instructions measured per variant and per layer, bundle_version + 1; the simulator's cost "
                        "model uses them (workload.bundle)")
    p.add_argument("--key", type=Path, metavar="PRIVATE", help="with --record: sign the copy with this key")
    p.add_argument("--program", action="store_true",
                   help="stm32f405, nrf52840: after the build (and, for the stm32f405, its bit-exact run under QEMU) "
                        "write firmware.elf to the board through a debug probe")
    p.add_argument("--programmer", choices=("openocd", "pyocd"), default="openocd",
                   help="with --program: OpenOCD (Debian's openocd; default) or pyOCD (pip install pyocd)")
    p.add_argument("--interface", choices=("stlink", "cmsis-dap"), default="stlink",
                   help="with --program --programmer openocd: the probe (ST-Link, default, or CMSIS-DAP/DAPLink)")
    p.add_argument("--policy", choices=("auto", "tiles", "atomic"), default="auto",
                   help="how an inference survives power cuts: tiles (the activation arena in non-volatile memory, "
                        "a commit per tile), atomic (the arena in RAM, progress and results in non-volatile memory, "
                        "an inference cut by power redone from its input), or auto (default: tiles where the "
                        "model's live tensors fit the board's non-volatile memory, else atomic)")
    p.add_argument("--json", action="store_true", help="print the measurements as one JSON object")


def run_flash(args: argparse.Namespace) -> int:
    """Build a bundle's int8 variants as C99 firmware, flash it to a board, run its test vectors.

        trickle flash bundles/digits.tar --board mps2-an386      # Cortex-M4 under QEMU
        trickle flash bundles/digits.tar --board stm32f405       # the STM32F405 under QEMU (netduinoplus2)
        trickle flash bundles/digits.tar --board host --vectors 20
        trickle flash bundles/digits.tar --record bundles/digits-m4.tar --key keys/signing.key

    Generates C (weights, TFLite-style requantization, descriptors, the bundle's own test
    vectors) into OUT/generated, builds it with firmware/Makefile for the board, runs every test
    vector of every 8-bit variant and checks the int32 logits bit for bit against onnxruntime's
    integer graph (for a bundle of an int8 .tflite, its int8 outputs against TFLite Micro's own
    interpreter). For mps2-an386 and stm32f405 it prints instructions per inference (counted by the
    project's QEMU plugin), the code size and the flash, RAM and non-volatile memory used against
    the board's, and leaves OUT/BOARD/firmware.elf and firmware.bin for a real board; an image that
    does not fit is refused. stm32f405: 168 MHz from the internal oscillator, the results on
    USART1 (PA9, 115200 8N1), the state in the 4 KB backup SRAM (kept by VBAT).
    Memory: one activation arena per model, each tensor at an offset planned from its lifetime
    (TFLite Micro's greedy rule). Where the arena fits the board's non-volatile memory, tiles commit
    and a power cut resumes mid-layer; where it does not (the stm32f405's backup SRAM for most
    models), the board runs each inference atomically: the arena in RAM, progress and results (and
    the input, where it fits) in the backup SRAM, an inference cut by power redone. The line
    "policy:" says which and why (--policy chooses). With --record, a
    profiling build also splits each variant's count into its layers, and a copy of the bundle
    with those counts in its manifest (bundle_version + 1, signed with --key) is written for the
    simulator's cost model (workload.bundle).
    A bundle with an early-decision rule in integers (FIRMBOUND, export.early with calibration
    series) builds its int8 frame model and the rule (tn_early_update), streams the bundle's test
    series (or --inputs SERIES.npy, (N, channels, T) raw) sample by sample and checks every decision
    (samples taken, class) against edge.classify.early's integer rule.
    Needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm for mps2-an386 and stm32f405.
    """
    if args.vectors is not None and args.vectors < 1:
        raise ConfigError("--vectors", args.vectors, "must be >= 1")
    if args.power_cuts < 0 or (args.power_cuts and args.board not in ("mps2-an386", "stm32f405")):
        raise ConfigError("--power-cuts", args.power_cuts, "is 0 or more, on --board mps2-an386 or stm32f405 (QEMU "
                          "counts the instructions it cuts at)")
    if args.labels is not None and args.inputs is None:
        raise ConfigError("--labels", str(args.labels), "labels --inputs X.npy (the bundle's own vectors carry theirs)")
    if args.record is not None and args.board != "mps2-an386":
        raise ConfigError("--record", str(args.record), "needs --board mps2-an386 (instructions are counted under QEMU)")
    if args.key is not None and args.record is None:
        raise ConfigError("--key", str(args.key), "signs the --record copy; give --record OUT")
    from export.firmware.flash import PROGRAMMABLE

    if args.program and args.board not in PROGRAMMABLE:
        raise ConfigError("--program", args.board, f"writes a real board: --board {' or '.join(PROGRAMMABLE)}")
    from edge.contract.bundle import load_private_key, read_trusted
    from export.firmware.flash import flash, program, record

    bundle = read_trusted(args.bundle, args.trust)
    private = load_private_key(args.key) if args.key is not None else None
    early = bundle.manifest.early
    if early is not None and args.record is not None:
        raise ConfigError("--record", str(args.record), "records a classifier's counts; an early-rule bundle has none")
    raw = bundle.manifest.preprocessing.raw
    channels = raw.shape[0] if raw is not None else 1
    shape = (0, channels, early.horizon) if early is not None else bundle.manifest.input_shape
    x_test = _inputs(args.inputs, shape) if args.inputs is not None else None
    labels = _labels(args.labels, len(x_test), bundle.manifest.labels) if args.labels is not None and x_test is not None else None
    if early is not None and (labels is not None or args.power_cuts):
        raise ConfigError("--labels/--power-cuts", str(args.labels or args.power_cuts), "apply to a classifier bundle")
    report = flash(bundle, args.board, args.out, args.vectors, profile=args.record is not None, x_test=x_test,
                   policy=args.policy, labels=labels, power_cuts=args.power_cuts)
    recorded = record(bundle, report, args.record, private) if args.record is not None and report["mismatches"] == 0 else None
    if args.json:
        print(json.dumps(_flash_json(report, recorded), default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    else:
        _print_flash(bundle.manifest.model, args.board, report, recorded)
    cuts = report.get("power_cuts")
    if report["mismatches"] or (cuts is not None and cuts["identical"] < cuts["trials"]):
        return 1
    if args.program:
        program(Path(report["binary"]), args.board, args.programmer, args.interface)
        if not args.json:
            print(f"  programmed the {args.board} with {report['binary']} ({args.programmer})")
    return 0


def _inputs(path: Path, shape: tuple[int, ...]) -> Any:
    import numpy as np

    try:
        x = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"--inputs {path}: not a readable .npy file ({e})") from None
    if x.ndim != len(shape) or tuple(x.shape[1:]) != shape[1:]:
        raise DataError(f"--inputs {path}: shape {x.shape}, the model takes (N, {', '.join(map(str, shape[1:]))})")
    return x.astype(np.float32)


def _labels(path: Path, n: int, names: list[str]) -> Any:
    """--labels: N class indices, or N of the bundle's label names, as class indices."""
    import numpy as np

    from edge.contract.manifest import label_indices

    try:
        y = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"--labels {path}: not a readable .npy file ({e})") from None
    if y.ndim != 1 or len(y) != n:
        raise DataError(f"--labels {path}: shape {y.shape}; --inputs has {n} examples, so ({n},) labels")
    return label_indices(names, y, f"--labels {path}")


def _flash_json(report: dict[str, Any], recorded: Path | None) -> dict[str, Any]:
    keep = ("board", "binary", "bin", "vectors", "mismatches", "size", "memory", "policy", "plan", "power_cuts")
    return {**{k: report[k] for k in keep if k in report}, "recorded": str(recorded) if recorded else None,
            "variants": report["variants"], "bit_exact": report["mismatches"] == 0 if report["mismatches"] is not None
            else None}


def _print_early(model: str, board: str, report: dict[str, Any]) -> None:
    print(f"{model} on {board}: the int8 frame model and the early rule on {report['series']} test series")
    for i, (got, want) in enumerate(zip(report["decisions"], report["expected_decisions"])):
        same = got is not None and tuple(got) == tuple(want)
        mark = "" if same else f"  (edge.classify.early: {want[0]} samples, class {want[1]})"
        print(f"  series {i}: " + (f"decided after {got[0]} samples, class {got[1]}" if got else "no decision") + mark)
    verdict = "the same as edge.classify.early's" if report["mismatches"] == 0 else f"{report['mismatches']} DIFFER"
    print(f"  decisions: {verdict}")


def _print_flash(model: str, board: str, report: dict[str, Any], recorded: Path | None) -> None:
    if "series" in report:  # an early-rule bundle
        _print_early(model, board, report)
        return
    if report["mismatches"] is None:
        print(f"{model} for {board}: built, not run (no emulator for this chip here); --program writes it to a board")
    else:
        n = len(report["variants"])
        print(f"{model} on {board}: {report['vectors']} test vectors x {n} variant{'s' if n != 1 else ''}")
    for k, v in enumerate(report["variants"]):
        first = report["outputs"].get((0, k))
        line = f"  {v['name']}: {v['macs']} MACs, vector 0 -> {first[:4]}..." if first else f"  {v['name']}"
        if v.get("instructions_per_inference"):
            line += f", {v['instructions_per_inference']} instructions ({v['instructions_per_mac']:.2f}/MAC)"
        if v.get("accuracy_on_board") is not None:
            line += f", accuracy on the board {v['accuracy_on_board']:.3f}"
        print(line)
    if "policy" in report:
        plan = report["plan"]
        print(f"  memory plan: a {plan['arena_bytes']} B arena for {plan['tensor_bytes']} B of activation tensors")
        print(f"  policy: {report['policy']['why']}")
        whole = [v for v in report["variants"] if v.get("energy_per_inference_j")]
        if report["policy"]["policy"] == "atomic" and whole:
            v = max(whole, key=lambda v: v["energy_per_inference_j"])
            print(f"  an inference must run whole: {v['instructions_per_inference']} instructions, "
                  f"{1e3 * v['time_per_inference_s']:.1f} ms and {1e6 * v['energy_per_inference_j']:.0f} uJ on the "
                  "cortex-m4 profile; whether a capacitor carries it: --record the counts on mps2-an386, then "
                  "trickle simulate --set workload.bundle=... --set workload.policy='\"restart\"'")
    if "size" in report:
        s = report["size"]
        print(f"  size: text {s['text']} B, data {s['data']} B, bss {s['bss']} B (text includes the test vectors)")
        for region, use in report.get("memory", {}).items():
            print(f"  {region}: {use['used']} of {use['size']} B ({100 * use['used'] / use['size']:.1f} %)")
        print(f"  wrote {report['binary']} and {report['bin']}")
    for v in report["variants"]:
        if "layers" in v:
            split = ", ".join(f"{layer['name']} {layer['instructions']}" for layer in v["layers"])
            print(f"  {v['name']} per layer (vector 0): {split}")
    if recorded is not None:
        print(f"  recorded the counts in {recorded}")
    if report["mismatches"] is not None:
        verdict = f"bit-exact with {report['oracle']}" if report["mismatches"] == 0 else f"{report['mismatches']} logits DIFFER"
        print(f"  outputs: {verdict}")
    if "power_cuts" in report:
        cuts = report["power_cuts"]
        print(f"  power cuts: {cuts['identical']} of {cuts['trials']} cut inferences gave the uncut outputs bit for bit "
              f"(at most {cuts['max_boots']} power-ons each)")
