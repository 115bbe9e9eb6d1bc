"""The QEMU plugin's Cortex-M4 cycle estimate (firmware/plugin/tncount.c): exact on hand-written Thumb-2
against the cycles worked out by hand from the Cortex-M4 TRM's instruction timings (DDI 0439, Table 3-1,
P = 2); its decoder against binutils' disassembler on a whole firmware; and 1x to 3x the instructions
of a trained model, per inference and per layer."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edge.contract.bundle import read_bundle
from export.firmware.flash import (
    FIRMWARE,
    FlashError,
    build,
    fresh_nv,
    inference_cycles,
    inference_instructions,
    parse_counts,
    power_on,
    run_board,
    write_sources,
)
from tests.conftest import TrainedBundle
from tests.helpers import SUBPROCESS_TIMEOUT_S

needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None or shutil.which("make") is None,
    reason="apt-get install make gcc gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm")

P = 2  # the pipeline refill the plugin takes

# Four stretches between tn_mark calls. Each starts with tn_mark's own BX LR (1 + P) and ends with the
# BL to it (1 + P); the cycles of each instruction are on its line, from the TRM's table.
PROGRAM = """
    .syntax unified
    .cpu cortex-m4
    .thumb
    .section .vectors, "a"
    .word _stack_top
    .word reset_handler

    .text
    .global tn_mark
    .type tn_mark, %function
    .thumb_func
tn_mark:
    bx lr                           @ 1 + P

    .global reset_handler
    .type reset_handler, %function
    .thumb_func
reset_handler:
    ldr r4, =words                  @ 2
    ldr r6, =scratch                @ 1: behind a load
    movs r5, #100                   @ 1
    movs r2, #0                     @ 1
    bl tn_mark                      @ 1 + P                           mark 0
loop:
    ldr r0, [r4]                    @ 2
    ldr r1, [r4, #4]                @ 1: behind a load whose destination is not its base
    smlad r2, r0, r1, r2            @ 1
    subs r5, #1                     @ 1
    bne loop                        @ 1, + P the 99 times it is taken
    bl tn_mark                      @ 1 + P                           mark 1
    ldm r4, {r0-r3}                 @ 1 + 4 (LDM.W)
    stmia r6!, {r0-r3}              @ 1 + 4
    udiv r0, r1, r2                 @ 12, the TRM's worst case
    cmp r0, r0                      @ 1
    bne far                         @ 1: not taken
    ldrd r0, r1, [r4]               @ 1 + 2
    strd r0, r1, [r6]               @ 1 + 2
    muls r0, r1, r0                 @ 1
    mla r0, r1, r2, r3              @ 1
    smull r0, r1, r2, r3            @ 1
    push {r4, r5}                   @ 1 + 2
    pop {r4, r5}                    @ 1 + 2
    cmp r0, r0                      @ 1
    it eq                           @ 0: folded onto the 16-bit CMP
    addeq r0, #1                    @ 1
    add.w r0, r0, #1                @ 1
    it ne                           @ 1: behind a 32-bit instruction
    movne r0, r1                    @ 1: skipped
    str r6, [r6]                    @ 2
    str r1, [r6, #4]                @ 2: nothing pipelines behind a store
    ldr r0, [r6]                    @ 2
    ldr r1, [r0]                    @ 2: its base is the load's destination
    ldr r2, [r6, #4]                @ 1
    str r2, [r6, #8]                @ 1: a store pipelines behind a load
    ldr.w r3, [r6, #12]             @ 2
    bl tn_mark                      @ 1 + P                           mark 2
    bl leaf                         @ 1 + P: PUSH {r4, lr} 1 + 2, POP {r4, pc} 1 + 2 + P
    movs r7, #0                     @ 1
    cbz r7, 2f                      @ 1 + P: taken
    nop
2:  adr.w r0, 3f                    @ 1
    adds r0, #1                     @ 1
    str r0, [r6]                    @ 2
    ldr pc, [r6]                    @ 2 + P
    nop
3:  bl tn_mark                      @ 1 + P                           mark 3
    movs r0, #1                     @ 1
    tbb [pc, r0]                    @ 2 + P
1:  .byte (4f - 1b) / 2, (5f - 1b) / 2
4:  nop
5:  cmp r0, #1                      @ 1
    beq.w 6f                        @ 1 + P: taken
    nop
6:  ldr.w r2, [r4, r0, lsl #2]      @ 2
    ldrh.w r3, [r4, r0, lsl #1]     @ 1
    ldrex r1, [r6]                  @ 1
    strex r2, r1, [r6]              @ 1
    cmp r0, r0                      @ 1
    it ne                           @ 0
    bxne lr                         @ 1: not taken
    movs r7, #0                     @ 1
    cbnz r7, 7f                     @ 1: not taken
    ldr r1, =leaf2                  @ 2
    blx r1                          @ 1 + P: STMDB 1 + 4, LDMIA.W with PC 1 + 4 + P
    b 8f                            @ 1 + P
7:  nop
8:  bl leaf3                        @ 1 + P: MOV PC, LR 1 + P
    b.w 9f                          @ 1 + P
    nop
9:  bl tn_mark                      @ 1 + P                           mark 4
far:
    movs r0, #0x18                  @ 1: semihosting SYS_EXIT
    ldr r1, =0x20026                @ 2
    bkpt 0xab                       @ 1

    .type leaf, %function
    .thumb_func
leaf:
    push {r4, lr}
    pop {r4, pc}

    .type leaf2, %function
    .thumb_func
leaf2:
    stmdb sp!, {r4, r5, r8, lr}
    ldmia.w sp!, {r4, r5, r8, pc}

    .type leaf3, %function
    .thumb_func
leaf3:
    mov pc, lr

    .ltorg
    .align 2
words:
    .word 0x00030002, 0x00050004, 7, 3
    .bss
    .align 3
scratch:
    .space 64
"""

# (instructions, cycles) of each stretch, summed by hand from the lines above
STRETCHES = [
    (1 + 100 * 5 + 1,
     (1 + P) + 100 * (2 + 1 + 1 + 1 + 1) + 99 * P + (1 + P)),
    (1 + 26,
     (1 + P) + 5 + 5 + 12 + 1 + 1 + 3 + 3 + 1 + 1 + 1 + 3 + 3 + 1 + 0 + 1 + 1 + 1 + 1 + 2 + 2 + 2 + 2 + 1 + 1 + 2
     + (1 + P)),
    (1 + 10,
     (1 + P) + (1 + P) + 3 + (3 + P) + 1 + (1 + P) + 1 + 1 + 2 + (2 + P) + (1 + P)),
    (1 + 22,
     (1 + P) + 1 + (2 + P) + 1 + (1 + P) + 2 + 1 + 1 + 1 + 1 + 0 + 1 + 1 + 1 + 2 + (1 + P) + 5 + (5 + P) + (1 + P)
     + (1 + P) + (1 + P) + (1 + P) + (1 + P)),
]
BEFORE = (5, 2 + 1 + 1 + 1 + (1 + P))  # reset_handler up to the first mark
AFTER = (4, (1 + P) + 1 + 2 + 1)  # the last mark's BX LR, then the exit


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cycles")
    (folder / "program.S").write_text(PROGRAM)
    proc = subprocess.run(["arm-none-eabi-gcc", "-mcpu=cortex-m4", "-mthumb", "-nostdlib", "-nostartfiles",
                           "-T", str(FIRMWARE / "boards" / "mps2-an386" / "link.ld"), str(folder / "program.S"),
                           "-o", str(folder / "program.elf")], capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return folder / "program.elf"


@needs_arm
def test_cycles_between_marks_are_the_trm_timings_worked_by_hand(program: Path) -> None:
    nv = program.parent / "nv.bin"
    fresh_nv(nv)
    rc, out, counts = power_on(program, nv, program.parent)
    assert rc == 0, out
    assert list(np.diff(counts.marks)) == [insns for insns, _ in STRETCHES]
    assert list(np.diff(counts.cycle_marks)) == [cycles for _, cycles in STRETCHES]
    assert counts.instructions == BEFORE[0] + sum(i for i, _ in STRETCHES) + AFTER[0]
    assert counts.cycles == BEFORE[1] + sum(c for _, c in STRETCHES) + AFTER[1]
    assert counts.marks[0] == BEFORE[0] and counts.cycle_marks[0] == BEFORE[1]


@needs_arm
def test_a_run_with_a_power_cut_counts_instructions_only(program: Path) -> None:
    nv = program.parent / "nv-cut.bin"
    fresh_nv(nv)
    rc, _, counts = power_on(program, nv, program.parent, cut=BEFORE[0] + STRETCHES[0][0] + 3)
    assert rc == 3  # the plugin's power cut
    assert counts.marks == [BEFORE[0], BEFORE[0] + STRETCHES[0][0]] and counts.instructions == counts.marks[1] + 3
    assert counts.cycles is None and counts.cycle_marks == []


def test_parse_counts_reads_marks_with_and_without_cycles() -> None:
    counts = parse_counts("total 90\ncycles 150\nmark 10 12\nmark 40 70\n")
    assert (counts.instructions, counts.cycles, counts.marks, counts.cycle_marks) == (90, 150, [10, 40], [12, 70])
    assert inference_instructions(counts.marks) == [30] and inference_cycles(counts.cycle_marks) == [58]
    cut = parse_counts("total 33\nmark 10\n")
    assert (cut.instructions, cut.cycles, cut.marks, cut.cycle_marks) == (33, None, [10], [])
    with pytest.raises(FlashError, match="'instructions 3'"):
        parse_counts("instructions 3\n")


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory, trained_bundle: TrainedBundle) -> Path:
    """A trained digits model's bundle (the training test_firmware shares)."""
    trained = trained_bundle("digits", "nexume", epochs=2, formats=("onnx-int8",))
    assert trained.bundle is not None
    folder = tmp_path_factory.mktemp("digits")
    shutil.copytree(trained.bundle, folder / "bundle")
    return folder / "bundle"


@pytest.fixture(scope="module")
def firmware(digits: Path) -> Path:
    """Its firmware for mps2-an386, two test vectors."""
    from export.firmware.cgen import generate

    sources, _ = generate(read_bundle(digits), max_vectors=2)
    write_sources(sources, digits.parent / "gen")
    return build(digits.parent / "gen", "mps2-an386", digits.parent / "m4")


@needs_arm
def test_a_firmware_run_reports_cycles_beside_its_instructions(firmware: Path) -> None:
    """Every marked stretch of a firmware run costs between one and three cycles an instruction."""
    run = run_board(firmware, "mps2-an386", firmware.parent)
    assert run.mismatches == 0 and len(run.cycle_marks) == len(run.marks) == 2 * len(run.outputs)
    insns, cycles = inference_instructions(run.marks), inference_cycles(run.cycle_marks)
    assert run.instructions is not None and run.cycles is not None
    assert all(i < c < 3 * i for i, c in zip(insns, cycles)) and run.instructions < run.cycles < 3 * run.instructions


# The decoder alone: tncount.c compiled into a filter that reads an instruction's halfwords and writes its
# cost, never calling QEMU (the API it declares is stubbed in a second file).
HARNESS = """#include "tncount.c"
int main(void) {
    unsigned hw1, hw2;
    char line[64];
    while (fgets(line, sizeof line, stdin) != NULL) {
        int n = sscanf(line, "%x %x", &hw1, &hw2);
        uint8_t bytes[4] = {(uint8_t)hw1, (uint8_t)(hw1 >> 8), (uint8_t)hw2, (uint8_t)(hw2 >> 8)};
        insn_cost c = decode(bytes, n == 2 ? 4u : 2u);
        printf("%u %u %u %u\\n", c.cycles, c.writes_pc, c.conditional, c.it_mask);
    }
    return 0;
}
"""
STUBS = """#include <stddef.h>
#include <stdint.h>
void qemu_plugin_register_vcpu_tb_trans_cb(void) {}
void qemu_plugin_register_vcpu_tb_exec_cb(void) {}
void qemu_plugin_register_vcpu_insn_exec_cb(void) {}
void qemu_plugin_register_atexit_cb(void) {}
size_t qemu_plugin_tb_n_insns(void) { return 0; }
uint64_t qemu_plugin_tb_vaddr(void) { return 0; }
void *qemu_plugin_tb_get_insn(void) { return NULL; }
const void *qemu_plugin_insn_data(void) { return NULL; }
size_t qemu_plugin_insn_size(void) { return 0; }
uint64_t qemu_plugin_insn_vaddr(void) { return 0; }
"""
COND = "(eq|ne|cs|cc|hs|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le)?"


def _by_mnemonic(mnemonic: str, operands: str) -> tuple[int, int, int] | None:
    """(cycles before P and pipelining, writes the PC, conditional by itself) from the disassembler's text,
    by the TRM's table; None for IT."""
    base = re.sub(r"\.[wn]$", "", mnemonic)
    listed = operands[operands.find("{") + 1 : operands.find("}")].split(",") if "{" in operands else []
    n = sum(int(r.split("-")[1][1:]) - int(r.split("-")[0].strip()[1:]) + 1 if "-" in r else 1 for r in listed)
    if re.fullmatch(r"it[te]*", base):
        return None
    if re.fullmatch(f"b{COND}", base):
        return 1, 1, int(base != "b")
    if base in ("cbz", "cbnz"):
        return 1, 1, 1
    if re.fullmatch(f"(bl|bx|blx){COND}", base) or (re.fullmatch(f"(mov|add){COND}", base) and operands[:2] == "pc"):
        return 1, 1, 0
    if base in ("tbb", "tbh"):
        return 2, 1, 0
    if re.fullmatch(f"(ldrd|strd){COND}", base):
        return 1 + 2, 0, 0
    if re.fullmatch(f"(ldm|ldmia|ldmdb|stm|stmia|stmdb|push|pop){COND}", base):
        return 1 + n, int(base.startswith(("ld", "pop")) and "pc" in listed[-1]), 0
    if re.fullmatch(f"(ldr|str)(b|h|sb|sh|ex|exb|exh)?{COND}", base):
        return 2, int(operands[:2] == "pc"), 0
    if re.fullmatch(f"[su]div{COND}", base):
        return 12, 0, 0
    return 1, 0, 0


@needs_arm
@pytest.mark.skipif(shutil.which("arm-none-eabi-objdump") is None or shutil.which("gcc") is None,
                    reason="apt-get install gcc binutils-arm-none-eabi")
def test_the_decoder_agrees_with_the_disassembler_on_a_whole_firmware(firmware: Path, tmp_path: Path) -> None:
    """Every instruction of a firmware (the executor, the kernels, newlib): the class the plugin decodes from
    its bits against the one its mnemonic, as binutils disassembles it, has in the TRM's table."""
    (tmp_path / "harness.c").write_text(HARNESS)
    (tmp_path / "stubs.c").write_text(STUBS)
    subprocess.run(["gcc", "-O1", "-I", str(FIRMWARE / "plugin"), str(tmp_path / "harness.c"), str(tmp_path / "stubs.c"),
                    "-o", str(tmp_path / "decode")], check=True, timeout=SUBPROCESS_TIMEOUT_S)
    listing = subprocess.run(["arm-none-eabi-objdump", "-d", str(firmware)], capture_output=True, text=True,
                             check=True, timeout=SUBPROCESS_TIMEOUT_S).stdout
    insns = [m.groups() for m in re.finditer(r"^\s*[0-9a-f]+:\t([0-9a-f]{4})(?: ([0-9a-f]{4}))?\s*\t([a-z][\w.]*)[ \t]*(.*)$",
                                              listing, re.MULTILINE)]
    decoded = subprocess.run([str(tmp_path / "decode")], input="".join(f"{a} {b or ''}\n" for a, b, _, _ in insns),
                             capture_output=True, text=True, check=True, timeout=SUBPROCESS_TIMEOUT_S).stdout.splitlines()
    assert len(decoded) == len(insns)
    wrong = []
    for (hw1, hw2, mnemonic, operands), line in zip(insns, decoded):
        cycles, writes_pc, conditional, it_mask = (int(v) for v in line.split())
        want = _by_mnemonic(mnemonic, operands)
        if (it_mask != 0) != (want is None) or (want is not None and (cycles, writes_pc, conditional) != want):
            wrong.append(f"{hw1} {hw2 or ''} {mnemonic} {operands}: {cycles, writes_pc, conditional}, not {want}")
    assert len(insns) > 1000 and len({i[2] for i in insns}) > 40  # a real mix: the code and its mnemonics
    assert wrong == []


@needs_arm
def test_a_trained_model_profiles_its_layers_in_estimated_cycles(digits: Path, tmp_path: Path) -> None:
    """flash() on the trained model: an estimate per variant between 1x and 3x its instructions, and per
    layer, taken apart exactly as the layers' instructions are."""
    from export.firmware.flash import flash

    report = flash(read_bundle(digits), "mps2-an386", tmp_path / "fw", vectors=2, profile=True)
    assert report["mismatches"] == 0
    for v in report["variants"]:
        insns, cycles = v["instructions_per_inference"], v["estimated_cycles_per_inference"]
        assert insns < cycles < 3 * insns, v["name"]
        layers = v["layers"]
        assert all({"instructions", "estimated_cycles", "output_bytes"} <= set(layer) for layer in layers)
        # the layers share out the inference but for what follows its last commit
        assert 0.99 * cycles < sum(layer["estimated_cycles"] for layer in layers) <= cycles
        assert sum(layer["estimated_cycles"] for layer in layers) > sum(layer["instructions"] for layer in layers)
