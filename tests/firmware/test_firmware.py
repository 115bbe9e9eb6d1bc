"""Firmware: bit-exact with onnxruntime's integer graph on the host and on QEMU's Cortex-M4, and
identical after power cuts at every progress point (host) and at random instructions (QEMU)."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edge.contract.bundle import Bundle, read_bundle
from export.firmware.flash import build, fresh_nv, inference_instructions, qemu, run_board, run_with_cuts, write_sources
from tests.conftest import TrainedBundle
from tests.helpers import SUBPROCESS_TIMEOUT_S

ARM = shutil.which("arm-none-eabi-gcc") is not None and shutil.which("qemu-system-arm") is not None
needs_arm = pytest.mark.skipif(not ARM, reason="apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm")


def _bundle(dataset: str, root: Path, trained_bundle: TrainedBundle) -> tuple[Bundle, np.ndarray]:
    trained = trained_bundle(dataset, "nexume", epochs=2, formats=("onnx-int8",))  # shared by the session
    assert trained.bundle is not None
    shutil.copytree(trained.bundle, root / "bundle")
    return read_bundle(root / "bundle"), trained.data.x_test


@pytest.fixture(scope="module", params=["digits", "basic_motions"])  # conv2d and conv1d
def generated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
              trained_bundle: TrainedBundle) -> tuple[Path, dict]:
    from export.firmware.cgen import generate

    root = tmp_path_factory.mktemp(request.param)
    bundle, x_test = _bundle(request.param, root, trained_bundle)
    sources, info = generate(bundle, x_test)
    write_sources(sources, root / "gen")
    return root, info


def test_integer_graph_agrees_with_the_qdq_model(generated: tuple[Path, dict]) -> None:
    from export.bundle import ort_logits

    root, info = generated
    bundle = read_bundle(root / "bundle")
    for k, v in enumerate(info["variants"]):
        qdq = ort_logits(bundle.file(f"{v['name']}.onnx"), _x_test(bundle))
        mine, theirs = info["expected"][k].argmax(1), qdq.argmax(1)
        # the float QDQ graph and the integer one round differently: where the QDQ graph's two best
        # classes are within 1 % of its logits' spread, either answer is that graph's (a tie; one
        # of basic_motions' 40 test series has a margin of 0.07 % on some machines)
        rows = np.arange(len(qdq))
        tie = qdq[rows, theirs] - qdq[rows, mine] <= 0.01 * np.ptp(qdq, axis=1)
        assert float(((mine == theirs) | tie).mean()) >= 0.99, v["name"]
        assert float((mine == theirs).mean()) >= 0.95, v["name"]


def _x_test(bundle: Bundle) -> np.ndarray:
    from models.data.datasets import load

    return load(bundle.manifest.task).x_test


def test_host_build_is_bit_exact_and_sanitizer_clean(generated: tuple[Path, dict]) -> None:
    root, info = generated
    exe = build(root / "gen", "host", root / "asan", sanitize=True)  # -Wall -Wextra -Werror -Wconversion too
    run = run_board(exe, "host", root / "asan")
    assert run.mismatches == 0
    assert len(run.outputs) == info["vectors"] * len(info["variants"])
    assert run.outputs[(0, 0)] == info["expected"][0][0].tolist()


def test_host_power_cut_at_every_progress_point(generated: tuple[Path, dict]) -> None:
    root, _ = generated
    exe = build(root / "gen", "host", root / "host")
    proc = subprocess.run([str(exe), "cuts", "2"], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, trials, _, identical, _, reboots = proc.stdout.split()
    assert int(trials) == int(identical) == int(reboots) > 100


@needs_arm
def test_qemu_is_bit_exact_on_every_test_vector(generated: tuple[Path, dict]) -> None:
    root, info = generated
    elf = build(root / "gen", "mps2-an386", root / "m4")
    run = run_board(elf, "mps2-an386", root / "m4")
    assert run.mismatches == 0 and run.boots == 1
    assert len(run.outputs) == info["vectors"] * len(info["variants"])
    per = inference_instructions(run.marks)
    assert len(per) == len(run.outputs) and min(per) > info["variants"][-1]["macs"]


@needs_arm
def test_qemu_power_cuts_at_random_instructions(generated: tuple[Path, dict]) -> None:
    root, _ = generated
    elf = build(root / "gen", "mps2-an386", root / "cut", vectors=1, dyninfer=True)  # one inference, widest variant
    nv = root / "cut" / "nv.bin"
    fresh_nv(nv)
    rc, out, marks, total = qemu(elf, nv, root / "cut")
    assert rc == 0
    reference = out.splitlines()[0]
    rng = random.Random(0)
    trials = 100  # per model: 200 over the two
    for _ in range(trials):
        cut = rng.randrange(marks[0], marks[1])  # an instruction inside the inference
        result = run_with_cuts(elf, root / "cut", [cut])
        assert result.boots == 2 and result.mismatches == 0
        assert result.stdout.splitlines()[0] == reference
    many = sorted(rng.randrange(1, total) for _ in range(20))  # 20 failures in a row, each counted from power-on
    result = run_with_cuts(elf, root / "cut", many)
    assert result.mismatches == 0 and result.stdout.splitlines()[0] == reference and result.boots <= 21


def _firmware_boots(stdout: str) -> int:
    """The boots the firmware itself counted (kept in its non-volatile state): the last BOOTS line."""
    return [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("BOOTS")][-1]


@needs_arm
def test_stm32f405_is_bit_exact_on_every_test_vector(generated: tuple[Path, dict]) -> None:
    root, info = generated
    elf = build(root / "gen", "stm32f405", root / "stm32")
    run = run_board(elf, "stm32f405", root / "stm32")
    assert run.mismatches == 0 and run.boots == 1
    assert len(run.outputs) == info["vectors"] * len(info["variants"])
    for k in range(len(info["variants"])):
        assert [run.outputs[(i, k)] for i in range(info["vectors"])] == info["expected"][k].tolist()
    per = inference_instructions(run.marks)
    assert len(per) == len(run.outputs) and min(per) > info["variants"][-1]["macs"]


CHIPS = {  # the parts' own memory maps: flash, RAM, non-volatile state; the stack's top; where .noinit starts
    "stm32f405": ({"flash": (0x08000000, 1 << 20), "ram": (0x20000000, 128 << 10), "bkpsram": (0x40024000, 4 << 10)},
                  0x20020000, 0x40024000, r"backup SRAM \(the non-volatile state\)"),
    "nrf52840": ({"flash": (0x00000000, 1 << 20), "ram": (0x20000000, 256 << 10)}, 0x2003E000, 0x2003E000,
                 r"non-volatile region"),
}


@needs_arm
@pytest.mark.parametrize("board", sorted(CHIPS))
def test_the_image_is_the_chips(generated: tuple[Path, dict], board: str) -> None:
    """Read from the ELF: the vector table at the start of flash, every section inside the part's
    flash, SRAM or non-volatile region, and a state that does not fit is one clear refusal."""
    from elftools.elf.elffile import ELFFile

    from edge.core.errors import FlashError
    from export.firmware.flash import memory_use

    regions, stack_top, nv_at, nv_name = CHIPS[board]
    root, _ = generated
    elf = build(root / "gen", board, root / f"{board}-elf")
    flash_at, flash_size = regions["flash"]
    with open(elf, "rb") as fh:
        image = ELFFile(fh)
        vectors = image.get_section_by_name(".text")
        assert vectors["sh_addr"] == flash_at
        stack, reset = np.frombuffer(vectors.data()[:8], dtype="<u4")
        assert stack == stack_top and reset & 1 and flash_at < reset < flash_at + flash_size  # Thumb, in flash
        for section in image.iter_sections():
            if section["sh_flags"] & 2 and section["sh_size"]:  # SHF_ALLOC
                start, end = section["sh_addr"], section["sh_addr"] + section["sh_size"]
                assert any(a <= start and end <= a + n for a, n in regions.values()), section.name
        assert image.get_section_by_name(".noinit")["sh_addr"] == nv_at
    use = memory_use(elf, board)
    assert all(0 < u["used"] <= u["size"] for u in use.values())
    big = root / f"{board}-big-gen"  # the same model with an arena larger than the board's non-volatile memory
    shutil.copytree(root / "gen", big, dirs_exist_ok=True)
    config = (big / "tn_config.h").read_text()
    (big / "tn_config.h").write_text(re.sub(r"TN_ARENA_BYTES \d+", f"TN_ARENA_BYTES {use['non-volatile']['size']}", config))
    with pytest.raises(FlashError, match=rf"does not fit the {board}: its {nv_name} overflows by \d+ bytes "
                                         r"\(--policy atomic keeps only the progress and results there\)"):
        build(big, board, root / f"{board}-big")


@pytest.mark.skipif(shutil.which("openocd") is None, reason="apt-get install openocd")
@pytest.mark.parametrize(("board", "interface", "said"), [
    ("stm32f405", "stlink", "Error: open failed"),
    ("nrf52840", "cmsis-dap", "Error: unable to find a matching CMSIS-DAP"),
])
def test_program_without_a_probe_is_one_clear_error(generated: tuple[Path, dict], tmp_path: Path, board: str,
                                                    interface: str, said: str) -> None:
    import sys

    root, _ = generated
    if not ARM:
        pytest.skip("apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm")
    proc = subprocess.run([sys.executable, "-m", "trickle.cli", "flash", str(root / "bundle"), "--board", board,
                           "--out", str(tmp_path), "--vectors", "2", "--program", "--interface", interface],
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()
    assert len(last) == 1 and last[0].startswith("trickle flash: error: --program: no debug probe found")
    assert f"interface/{interface}.cfg: {said}" in last[0]
    assert (tmp_path / board / "firmware.elf").exists()  # built (and, for the stm32f405, checked) before


@needs_arm
def test_stm32f405_power_cuts_at_random_instructions(generated: tuple[Path, dict]) -> None:
    """The state in the backup SRAM (RAM under QEMU, saved at the cut) survives: the firmware's own
    boot count says so, and the logits are the uncut run's."""
    root, _ = generated
    elf = build(root / "gen", "stm32f405", root / "stm32-cut", vectors=1, dyninfer=True)
    nv = root / "stm32-cut" / "nv.bin"
    fresh_nv(nv, board="stm32f405")
    rc, out, marks, total = qemu(elf, nv, root / "stm32-cut", board="stm32f405")
    assert rc == 0
    reference = [line for line in out.splitlines() if line.startswith("OUT")]
    assert len(reference) == 1
    rng = random.Random(1)
    for _ in range(100):  # per model: 200 over the two
        cut = rng.randrange(marks[0], marks[1])
        result = run_with_cuts(elf, root / "stm32-cut", [cut], board="stm32f405")
        assert result.mismatches == 0 and _firmware_boots(result.stdout) == 2
        assert [line for line in result.stdout.splitlines() if line.startswith("OUT")][-1] == reference[0]
    many = sorted(rng.randrange(marks[0], total) for _ in range(20))
    result = run_with_cuts(elf, root / "stm32-cut", many, board="stm32f405")
    assert result.mismatches == 0 and 2 <= _firmware_boots(result.stdout) <= 21


def test_trickle_flash_host(generated: tuple[Path, dict], tmp_path: Path) -> None:
    import sys

    root, _ = generated
    proc = subprocess.run([sys.executable, "-m", "trickle.cli", "flash", str(root / "bundle"), "--board", "host",
                           "--out", str(tmp_path), "--vectors", "5"], capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert "bit-exact with onnxruntime" in proc.stdout


def _gemmlowp_requantize(acc: int, multiplier: int, shift: int) -> int:
    """SaturatingRoundingDoublingHighMul then RoundingDivideByPOT, as gemmlowp defines them."""
    if acc == multiplier == -(2**31):
        high = 2**31 - 1
    else:
        ab = acc * multiplier
        x = ab + ((1 << 30) if ab >= 0 else 1 - (1 << 30))
        high = abs(x) >> 31 if x >= 0 else -(abs(x) >> 31)  # divided by 2^31, truncated toward zero
    mask = (1 << shift) - 1
    threshold = (mask >> 1) + (1 if high < 0 else 0)
    return (high >> shift) + (1 if (high & mask) > threshold else 0)


def test_requantize_matches_gemmlowp_on_ties_and_extremes(tmp_path: Path) -> None:
    from export.firmware.flash import FIRMWARE

    # firmware/tests/requantize_main.c, with the firmware's warnings
    subprocess.run(["make", "-s", "-C", str(FIRMWARE), f"OUT={tmp_path}", "requantize"], check=True)
    exe = tmp_path / "tests" / "requantize"
    rng = random.Random(1)
    cases = [(acc, m, s) for acc in (0, 1, -1, 2**31 - 1, -(2**31), 2**30, -(2**30), 3 << 20, -(3 << 20))
             for m in (1 << 30, (1 << 31) - 1, 1518500250) for s in (0, 1, 2, 7, 20, 31)]
    cases += [(rng.randrange(-(2**31), 2**31), rng.randrange(1 << 30, 1 << 31), rng.randrange(0, 24))
              for _ in range(5000)]
    # accumulators whose product lands exactly on a rounding tie of either step
    cases += [(k << 1, 1 << 30, s) for k in range(-64, 64) for s in (1, 2, 3)]
    out = subprocess.run([str(exe)], input="".join(f"{a} {m} {s}\n" for a, m, s in cases), capture_output=True,
                         text=True, check=True).stdout.split()
    assert [int(v) for v in out] == [_gemmlowp_requantize(*c) for c in cases]


@needs_arm
def test_flash_record_writes_measured_counts_the_simulator_uses(generated: tuple[Path, dict], tmp_path: Path) -> None:
    import sys

    from simulator.devices import MCUS
    from simulator.workload import WorkloadConfig, build_plan

    root, info = generated
    out = tmp_path / "measured.tar"
    proc = subprocess.run([sys.executable, "-m", "trickle.cli", "flash", str(root / "bundle"), "--out", str(tmp_path),
                           "--vectors", "2", "--record", str(out)], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    before, after = read_bundle(root / "bundle"), read_bundle(out)
    assert after.manifest.bundle_version == before.manifest.bundle_version + 1
    assert after.files == before.files
    measured = {v.name: v.measured["mps2-an386"] for v in after.manifest.variants if v.measured}
    assert sorted(measured) == sorted(v["name"] for v in info["variants"])
    for counts in measured.values():
        names = [layer.name for layer in counts.layers]
        assert names[-2:] == ["pool", "classifier"] and all(n.startswith("conv") for n in names[:-2])
        split = sum(layer.instructions for layer in counts.layers)  # of the first vector; the total: the median
        assert counts.cpu == "cortex-m4" and 0.97 * counts.instructions < split <= 1.005 * counts.instructions
    widest = measured[info["variants"][0]["name"]]
    work = WorkloadConfig(mcu="cortex-m4", bundle=str(out), policy="per_layer")
    plan = build_plan(work, tx_time_s=0.0, tx_power_w=0.0)
    compute_s = sum(p.duration_s for p in plan if p.kind == "compute")
    clock_hz = MCUS["cortex-m4"].clock_hz
    assert compute_s == pytest.approx(sum(layer.instructions for layer in widest.layers) / clock_hz, rel=1e-12)


@needs_arm
def test_trickle_flash_reports_accuracy_on_the_board_and_survives_power_cuts(generated: tuple[Path, dict],
                                                                            tmp_path: Path) -> None:
    """Issue 48: `trickle flash` took no labels (no accuracy on the board) and no power-cut option (only the
    benchmark's private helper had one)."""
    import json
    import sys

    from edge.contract.vectors import TestVectors

    root, _ = generated
    bundle = read_bundle(root / "bundle")
    info = bundle.manifest.test_vectors
    assert info is not None
    vectors = TestVectors.from_bytes(bundle.file(info.file), info.file)
    n = 6

    def run(*extra: str) -> dict:
        proc = subprocess.run([sys.executable, "-m", "trickle.cli", "flash", str(root / "bundle"), "--board",
                               "mps2-an386", "--out", str(tmp_path / "fw"), "--vectors", str(n), "--json", *extra],
                              capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    report = run("--power-cuts", "3")
    assert report["power_cuts"]["trials"] == 3 and report["power_cuts"]["identical"] == 3
    assert report["power_cuts"]["max_boots"] >= 2  # each cut lands inside an inference: one more power-on at least
    for v in report["variants"]:  # the oracle: onnxruntime's outputs for the same vectors, bit-exact on the board
        expected = np.argmax(vectors.expected[v["name"]][:n], axis=1) == vectors.labels[:n]
        assert v["accuracy_on_board"] == pytest.approx(expected.mean())

    # the user's own inputs and their labels, by the bundle's label names
    np.save(tmp_path / "x.npy", vectors.features[:n])
    np.save(tmp_path / "y.npy", np.array(bundle.manifest.labels)[vectors.labels[:n]])
    named = run("--inputs", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"))
    assert [v["accuracy_on_board"] for v in named["variants"]] == [v["accuracy_on_board"] for v in report["variants"]]
    np.save(tmp_path / "bad.npy", np.arange(n - 1))
    proc = subprocess.run([sys.executable, "-m", "trickle.cli", "flash", str(root / "bundle"), "--board", "host",
                           "--inputs", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "bad.npy"), "--out",
                           str(tmp_path / "fw2")], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 1 and f"--inputs has {n} examples, so ({n},) labels" in proc.stderr
