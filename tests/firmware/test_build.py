"""firmware/Makefile: the C unit tests (`make -C firmware check`), and export.firmware.flash building through
make on a model written here by hand, so none of this trains anything."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from export.firmware.flash import FIRMWARE, FlashError, build, code_size, run_board, write_sources
from tests.helpers import SUBPROCESS_TIMEOUT_S

HOST = shutil.which("make") is not None and shutil.which("gcc") is not None
needs_host = pytest.mark.skipif(not HOST, reason="apt-get install make gcc")
needs_arm = pytest.mark.skipif(
    not HOST or shutil.which("arm-none-eabi-gcc") is None or shutil.which("arm-none-eabi-size") is None,
    reason="apt-get install make gcc-arm-none-eabi libnewlib-arm-none-eabi binutils-arm-none-eabi")
needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-arm") is None, reason="apt-get install qemu-system-arm")

# One variant: a 1x1 conv halving its input (multiplier 0.5, half rounded up), a sum pool, and a
# dense layer to two classes. Input 3, -5, 8, 0 -> 2, -2, 4, 0 -> 4 -> logits 10 + 4, 20 - 4. The
# plan: the input at 0, the conv's output at 16, in a 32-byte arena (TN_CONFIG: tn_config.h).
MODEL_H = """#ifndef TN_MODEL_H
#define TN_MODEL_H
#include "tn.h"
#define TN_N_VARIANTS 1
#define TN_N_VECTORS 1
#define TN_INPUT_BYTES 4
#define TN_N_CLASSES 2
extern const tn_model *const tn_variants[TN_N_VARIANTS];
extern const int8_t tn_inputs_flat[];
extern const int32_t tn_expected_flat[];
#endif
"""
MODEL_C = """#include "model.h"
static const int16_t w0[4] __attribute__((aligned(4))) = {1, 0, 0, 0}; /* a conv's weights are int16 */
static const int32_t b0[1] = {0}, m0[1] = {1073741824}, s0[1] = {0};
static const int8_t w2[2] = {1, -1};
static const int32_t b2[2] = {10, 20};
static const tn_layer layers[3] = {
    {TN_CONV, 1, 1, 4, 1, 1, 4, 1, 1, 1, 0, 0, 0, 0, -128, 127, (const int8_t *)w0, b0, m0, s0, 0, 0, 0, 0, 0, 0, 16, 0, 0},
    {TN_POOL, 1, 1, 4, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0},
    {TN_DENSE, 1, 1, 1, 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, w2, b2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};
const tn_model tn_variant_0 = {"tiny", 3, layers, 4, 2, 4, 1, 1000, 32, 0};
const tn_model *const tn_variants[TN_N_VARIANTS] = {&tn_variant_0};
const int8_t tn_inputs_flat[] = {3, -5, 8, 0};
const int32_t tn_expected_flat[] = {14, 16};
"""
TN_CONFIG = """#define TN_ARENA_BYTES 32
#define TN_MAX_CLASSES 2
#define TN_MAX_CHANNELS 1
#define TN_MAX_COLUMN 8
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    write_sources({"model.c": MODEL_C, "model.h": MODEL_H, "tn_config.h": TN_CONFIG}, tmp_path / "gen")
    return tmp_path / "gen"


@needs_host
def test_make_check_runs_the_c_unit_tests(tmp_path: Path) -> None:
    proc = subprocess.run(["make", "-s", "-C", str(FIRMWARE), f"OUT={tmp_path}", "check"], capture_output=True,
                          text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check: all 6 test programs passed" in proc.stdout
    assert "FAIL" not in proc.stdout


@needs_arm
@needs_qemu
def test_make_check_m4_runs_the_c_unit_tests_on_the_cortex_m4(tmp_path: Path) -> None:
    """The written-out Thumb-2 loops (the host runs their C twins) against the references on seeded random
    layers, under QEMU's mps2-an386."""
    proc = subprocess.run(["make", "-s", "-C", str(FIRMWARE), f"OUT={tmp_path}", "check-m4"], capture_output=True,
                          text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check-m4: all 6 test programs passed on mps2-an386" in proc.stdout
    assert "test_kernels: 0 failed" in proc.stdout and "FAIL" not in proc.stdout


@needs_host
def test_host_build_through_make(tiny: Path, tmp_path: Path) -> None:
    for sanitize in (False, True):
        exe = build(tiny, "host", tmp_path / "host", sanitize=sanitize)
        assert exe == tmp_path / "host" / ("host_fw_asan" if sanitize else "host_fw")
        run = run_board(exe, "host", tmp_path / "host")
        assert run.mismatches == 0 and run.outputs == {(0, 0): [14, 16]}
    # the harness cuts after each of the 4 commits: two conv tiles (4 positions), the pool, the classifier
    cuts = subprocess.run([str(tmp_path / "host" / "host_fw"), "cuts", "1"], capture_output=True, text=True, timeout=60)
    assert cuts.returncode == 0 and cuts.stdout.split() == ["CUTS", "4", "IDENTICAL", "4", "REBOOTS", "4"], cuts.stdout


@needs_host
def test_an_option_change_rebuilds_the_same_out(tiny: Path, tmp_path: Path) -> None:
    """Without progress keeping there are no commits to cut at, so `cuts` fails; the same OUT
    built again with progress keeping must be a new binary, not make's up-to-date old one."""
    exe = build(tiny, "host", tmp_path, no_progress=True)
    assert subprocess.run([str(exe), "cuts", "1"], capture_output=True, timeout=60).returncode == 1
    exe = build(tiny, "host", tmp_path)
    assert subprocess.run([str(exe), "cuts", "1"], capture_output=True, timeout=60).returncode == 0


@needs_host
def test_a_failed_build_is_a_flash_error(tiny: Path, tmp_path: Path) -> None:
    (tiny / "model.c").write_text(MODEL_C.replace("static const int8_t w2[2] = {1, -1};", "int8_t w2 = 300;"))
    with pytest.raises(FlashError, match="host build failed"):
        build(tiny, "host", tmp_path / "host")
    with pytest.raises(FlashError, match="must be one of"):
        build(tiny, "esp32", tmp_path / "esp32")


@needs_host
def test_make_says_what_is_missing() -> None:
    proc = subprocess.run(["make", "-C", str(FIRMWARE), "BOARD=host"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "MODEL=dir is required" in proc.stderr
    proc = subprocess.run(["make", "-C", str(FIRMWARE), "BOARD=host", "MODEL=x", "VECTORS=3"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "Cortex-M board options" in proc.stderr


def _arm_size(elf: Path) -> dict[str, int]:
    out = subprocess.run(["arm-none-eabi-size", str(elf)], capture_output=True, text=True, check=True).stdout
    text, data, bss = (int(v) for v in out.splitlines()[1].split()[:3])
    return {"text": text, "data": data, "bss": bss}


@needs_arm
def test_code_size_equals_arm_none_eabi_size(tiny: Path, tmp_path: Path) -> None:
    builds: dict[str, dict[str, Any]] = {"plain": {}, "profile": {"vectors": 1, "dyninfer": True, "profile": True},
                                         "reference": {"reference_kernel": True, "no_progress": True}}
    for name, options in builds.items():
        elf = build(tiny, "mps2-an386", tmp_path / name, **options)
        assert elf == tmp_path / name / "firmware.elf" and (tmp_path / name / "firmware.bin").stat().st_size > 0
        size = code_size(elf)
        assert size == _arm_size(elf), name
        assert size["text"] > 1000 and size["bss"] >= 32  # kernels; tn_nv with the model's 32-byte arena
    with pytest.raises(FlashError, match="size failed"):
        code_size(tiny / "model.c")


@pytest.mark.skipif(not HOST or shutil.which("size") is None, reason="apt-get install make gcc binutils")
def test_code_size_equals_size_on_a_host_binary(tiny: Path, tmp_path: Path) -> None:
    """A host executable has initialised writable data, which the Cortex-M4 firmware has none of."""
    exe = build(tiny, "host", tmp_path, sanitize=True)
    out = subprocess.run(["size", str(exe)], capture_output=True, text=True, check=True).stdout
    text, data, bss = (int(v) for v in out.splitlines()[1].split()[:3])
    assert data > 0 and code_size(exe) == {"text": text, "data": data, "bss": bss}


@needs_arm
@needs_qemu
def test_mps2_build_through_make_runs_on_qemu(tiny: Path, tmp_path: Path) -> None:
    elf = build(tiny, "mps2-an386", tmp_path)
    run = run_board(elf, "mps2-an386", tmp_path)
    assert run.mismatches == 0 and run.outputs == {(0, 0): [14, 16]} and len(run.marks) == 2
