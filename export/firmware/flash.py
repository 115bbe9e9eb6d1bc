"""Build a bundle's firmware, "flash" it to a board, run its test vectors, and cut its power.

    report = flash(read_bundle("bundles/digits.tar"), board="mps2-an386", out=Path("build/flash"))

Boards: ``host`` (gcc, the harness cuts power at progress points), ``mps2-an386`` and
``stm32f405`` (arm-none-eabi-gcc, Cortex-M4 under qemu-system-arm; the STM32F405 as QEMU's
``netduinoplus2``). mps2-an386's non-volatile region is a host file (QEMU's memory-backend-file,
share=on), so it survives QEMU being killed. The STM32F405 keeps its state in the 4 KB backup
SRAM, which QEMU does not model: under QEMU the firmware finds it missing and keeps the state in
RAM past the chip's 128 KB, which the harness restores at power-on (QEMU's generic loader) and
saves at a power cut (the plugin holds the CPU before the cut instruction, the monitor's
pmemsave writes the region, then QEMU is killed). The ``tncount`` TCG plugin (built here from
firmware/plugin/tncount.c) counts instructions, estimates their Cortex-M4 cycles and cuts power
before an exact instruction.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge.contract.bundle import Bundle
from edge.contract.manifest import Measured, MeasuredLayer
from edge.core.errors import FlashError
from export.formats import BOARDS
from simulator.devices import MCUS

FIRMWARE = Path(__file__).resolve().parents[2] / "firmware"

CUT_EXIT = 3  # the plugin's exit status for a power cut
NV_BYTES = 16 << 20
TILE_POSITIONS = 2  # firmware/include/tn.h TN_TILE_POSITIONS: conv output positions per tile


@dataclass(frozen=True)
class Board:
    """What the harness knows of a Cortex-M board (firmware/boards/NAME)."""

    machine: str | None  # QEMU's -M, or None: built and read, not run here
    memory: dict[str, int]  # flash, ram, non-volatile: bytes the linker script gives each region
    state_in_ram: tuple[int, int] | None = None  # (address, bytes) under QEMU, saved at a cut, loaded at power-on
    probe: tuple[str, str] | None = None  # --program: OpenOCD's target config, pyOCD's target
    small_state: bool = False  # a few KB of state, each result printed as it finishes (common/compact_main.c)
    cpu: str = "cortex-m4"  # the simulator's MCU profile its counts apply to
    nv_name: str = "non-volatile memory"  # how the policy line names it

    @property
    def nv_file_bytes(self) -> int:
        return self.state_in_ram[1] if self.state_in_ram else NV_BYTES


BOARD_SPECS = {
    "mps2-an386": Board("mps2-an386", {"flash": 4 << 20, "ram": 4 << 20, "non-volatile": 16 << 20}),
    # the backup SRAM less its probe word (link.ld); under QEMU the state sits past the chip's 128 KB
    "stm32f405": Board("netduinoplus2", {"flash": 1 << 20, "ram": 128 << 10, "non-volatile": (4 << 10) - 4},
                       state_in_ram=(0x20020000, 64 << 10), probe=("target/stm32f4x.cfg", "stm32f405rg"),
                       small_state=True, nv_name="backup SRAM"),
    "nrf52840": Board(None, {"flash": 1 << 20, "ram": 248 << 10, "non-volatile": 8 << 10},  # RAM's last 8 KB
                      probe=("target/nrf52.cfg", "nrf52840"), small_state=True, nv_name="retained RAM"),
}
PROGRAMMABLE = tuple(name for name, spec in BOARD_SPECS.items() if spec.probe)
POLICIES = ("auto", "tiles", "atomic")
STACK_BYTES = 4 << 10  # RAM left for the stack beside .data and .bss (the kernels' frames are small)


@dataclass(frozen=True)
class Policy:
    """How a board carries an inference across power cuts (firmware/include/tn.h): ``tiles``, the
    arena in non-volatile memory and a commit per tile; or ``atomic``, the arena in RAM and an
    inference cut by power redone from its input (kept in non-volatile memory where it fits,
    ``keep_input``; else taken again from the sensor)."""

    name: str
    keep_input: bool
    non_volatile_bytes: int  # what the state needs there (the linker has the last word)
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.name, "keep_input": self.keep_input, "non_volatile_bytes": self.non_volatile_bytes,
                "why": self.why}


def state_bytes(config: dict[str, int], atomic: bool, keep_input: bool, input_bytes: int) -> int:
    """Non-volatile bytes of a compact board's state (common/compact_main.c's board_state with its
    tn_nv): four board words, tn_nv's four, the outputs and pooled sums (int32), the arena unless
    ``atomic``, the kept input and its word."""
    n = 32 + 4 * config["TN_MAX_CLASSES"] + 4 * config["TN_MAX_CHANNELS"]
    if not atomic:
        n = -(-n // 16) * 16 + config["TN_ARENA_BYTES"]
    return n + (4 + input_bytes if keep_input else 0)


def choose_policy(board: str, config: dict[str, int], input_bytes: int, asked: str = "auto") -> Policy:
    """The policy for ``board``: tiles commit where the live tensors fit its non-volatile memory,
    else atomic inference; one FlashError naming the memory and the bytes where neither fits (or
    the one asked for does not)."""
    if asked not in POLICIES:
        raise FlashError(f"--policy {asked}: must be one of {', '.join(POLICIES)}")
    spec = BOARD_SPECS.get(board)
    arena = config["TN_ARENA_BYTES"]
    if spec is None or not spec.small_state:  # host, mps2-an386: megabytes of non-volatile memory
        if asked == "atomic":
            return Policy("atomic", False, 0, "atomic inference, as asked (--policy atomic): the arena in RAM, an "
                          "inference cut by power redone from its input")
        where = spec.nv_name if spec is not None else "non-volatile memory"
        return Policy("tiles", False, arena, f"tiles commit: the {arena} B arena lives in the board's {where}")
    nv, name = spec.memory["non-volatile"], spec.nv_name
    tiles = state_bytes(config, False, False, input_bytes)
    if asked in ("auto", "tiles") and tiles <= nv:
        return Policy("tiles", False, tiles, f"tiles commit: the {arena} B arena and the progress fit the {name} "
                      f"({tiles} of {nv} B)")
    if asked == "tiles":
        raise FlashError(f"--policy tiles: the live tensors need {tiles} B of {name} (a {arena} B arena, the "
                         f"outputs and progress); the {board} has {nv} B")
    keep = state_bytes(config, True, True, input_bytes) <= nv
    need = state_bytes(config, True, keep, input_bytes)
    if need > nv:
        raise FlashError(f"the model fits neither policy on the {board}: its {config['TN_MAX_CLASSES']} outputs and "
                         f"progress alone need {need} B of {name}, which has {nv} B")
    why = ("as asked (--policy atomic)" if asked == "atomic"
           else f"the {arena} B arena needs {tiles} B of {name}, which has {nv} B")
    input_note = (f"the {input_bytes} B input kept there too" if keep
                  else f"the {input_bytes} B input does not fit there: after a cut the sample is taken again")
    return Policy("atomic", keep, need, f"atomic inference ({why}): activations in RAM, progress and results "
                  f"({need} B) in {name}, {input_note}; an inference cut by power is redone from its input")


@dataclass
class BoardRun:
    """What one firmware run on a board gave: the logits per test vector and variant, mismatches,
    boots, instructions and progress marks, and the Cortex-M4 cycle estimate (firmware/plugin/tncount.c)."""

    outputs: dict[tuple[int, int], list[int]]  # (vector, variant) -> int32 logits
    mismatches: int
    boots: int = 1
    instructions: int | None = None
    marks: list[int] = field(default_factory=list)  # instructions executed before each call of tn_mark
    cycles: int | None = None  # estimated cycles of the whole run
    cycle_marks: list[int] = field(default_factory=list)  # estimated cycles before each call, parallel to marks
    stdout: str = ""
    decisions: dict[int, tuple[int, int]] = field(default_factory=dict)  # early rule: series -> (samples, class)


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise FlashError(f"{name} not found: apt-get install --no-install-recommends {package}")
    return path


def _run(cmd: list[str], what: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise FlashError(f"{what} failed ({proc.returncode}):\n{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def write_sources(sources: dict[str, str], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in sources.items():
        (folder / name).write_text(text)


def _make(what: str, *args: str) -> None:
    """``make -C firmware ARGS``: the flags live in firmware/Makefile, so C developers build without Python."""
    _run([_tool("make", "make"), "-s", "--no-print-directory", "-C", str(FIRMWARE), *args], what)


def build(sources: Path, board: str, out: Path, vectors: int | None = None, sanitize: bool = False,
          reference_kernel: bool = False, dyninfer: bool = False, no_progress: bool = False, profile: bool = False,
          atomic: bool = False, keep_input: bool = False) -> Path:
    """Compile firmware + generated model for ``board``; returns the executable / ELF. The arena and
    scratch come from the generated tn_config.h. ``atomic``: the arena in volatile RAM, an inference
    cut by power redone (``Policy``); ``keep_input``: the compact boards keep each sample in
    non-volatile memory until its inference is done."""
    if board not in BOARDS:
        raise FlashError(f"--board {board}: must be one of {', '.join(BOARDS)}")
    out.mkdir(parents=True, exist_ok=True)
    # absolute: make -C runs in firmware/
    args = [f"BOARD={board}", f"MODEL={sources.resolve()}", f"OUT={out.resolve()}"]
    args += ["REFERENCE_KERNEL=1"] if reference_kernel else []  # the plain kernel (the benchmark's baseline)
    args += ["NO_PROGRESS=1"] if no_progress else []  # straight loops, no commits: the overhead's baseline
    args += ["ATOMIC=1"] if atomic else []
    args += ["KEEP_INPUT=1"] if keep_input else []
    if board == "host":
        _tool("gcc", "gcc")
        _make("host build", *args, *(["SANITIZE=1"] if sanitize else []), "firmware")
        return out / ("host_fw_asan" if sanitize else "host_fw")
    _tool("arm-none-eabi-gcc", "gcc-arm-none-eabi libnewlib-arm-none-eabi")
    args += [f"VECTORS={vectors}"] if vectors is not None else []
    args += ["DYNINFER=1"] if dyninfer else []
    args += ["PROFILE=1"] if profile else []  # a mark per commit
    try:
        _make("Cortex-M4 build", *args, "firmware")
    except FlashError as e:
        overflow = re.search(r"region `(\w+)' overflowed by (\d+) bytes", str(e))
        if overflow is None:
            raise
        region, extra = overflow.groups()
        names = {"FLASH": "flash", "RAM": "RAM", "BKPSRAM": "backup SRAM (the non-volatile state)",
                 "NVRAM": "non-volatile region"}
        advice = {"FLASH": "fewer --vectors (the test vectors are in flash), or a smaller model: a conv layer's "
                           "weights take 2 bytes each, widened to int16 when the model is written, for speed",
                  "RAM": "a smaller model: the arena and scratch are in RAM"}.get(
            region, "--policy atomic keeps only the progress and results there")
        raise FlashError(f"the image does not fit the {board}: its {names.get(region, region)} overflows by {extra} "
                         f"bytes ({advice})") from None
    _tool("arm-none-eabi-objcopy", "binutils-arm-none-eabi")
    _make("objcopy", *args, "bin")
    return out / "firmware.elf"


def plugin(out: Path) -> Path:
    """Build the instruction-counting / power-cutting QEMU plugin (make rebuilds it only when tncount.c changed)."""
    out.mkdir(parents=True, exist_ok=True)
    _tool("gcc", "gcc")
    _make("plugin build", f"OUT={out.resolve()}", "plugin")
    return out / "libtncount.so"


def code_size(elf: Path) -> dict[str, int]:
    """Text, data and bss bytes, summed over the sections as binutils' ``size`` (Berkeley format) does."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.constants import SH_FLAGS
    from elftools.elf.elffile import ELFFile

    sizes = {"text": 0, "data": 0, "bss": 0}
    try:
        with open(elf, "rb") as fh:
            for section in ELFFile(fh).iter_sections():
                flags = section["sh_flags"]
                if not flags & SH_FLAGS.SHF_ALLOC:
                    continue
                if flags & SH_FLAGS.SHF_EXECINSTR or not flags & SH_FLAGS.SHF_WRITE:  # code or read-only
                    sizes["text"] += section["sh_size"]
                elif section["sh_type"] != "SHT_NOBITS":
                    sizes["data"] += section["sh_size"]
                else:
                    sizes["bss"] += section["sh_size"]
    except (OSError, ELFError) as exc:
        raise FlashError(f"size failed: {elf}: {exc}") from exc
    return sizes


# what OpenOCD (ST-Link, CMSIS-DAP) and pyOCD say when no probe is attached
NO_PROBE = ("Error: open failed", "unable to find a matching CMSIS-DAP device", "No connected debug probes",
            "No available debug probes")


def memory_use(elf: Path, board: str) -> dict[str, dict[str, int]]:
    """Flash (code, constants, initial data), RAM (data, bss, the stack's share is the rest) and
    non-volatile memory (.noinit) the image uses, against the board's sizes."""
    from elftools.elf.elffile import ELFFile

    size = code_size(elf)
    with open(elf, "rb") as fh:
        section = ELFFile(fh).get_section_by_name(".noinit")
        nv = int(section["sh_size"]) if section is not None else 0
    # .noinit is NOLOAD (counted in bss by code_size) but lies in the non-volatile region, not in RAM
    used = {"flash": size["text"] + size["data"], "ram": size["data"] + size["bss"] - nv, "non-volatile": nv}
    return {k: {"used": used[k], "size": BOARD_SPECS[board].memory[k]} for k in used}


def check_ram(elf: Path, board: str) -> None:
    """One FlashError where .data and .bss leave the stack less than STACK_BYTES of the board's RAM."""
    use = memory_use(elf, board)["ram"]
    if use["used"] + STACK_BYTES > use["size"]:
        raise FlashError(f"the image does not fit the {board}: {use['used']} B of RAM in data and bss (the arena, "
                         f"scratch and board state) leave less than {STACK_BYTES} B of its {use['size']} B for the stack")


def symbol(elf: Path, name: str) -> int:
    """The address of a symbol of the ELF (read with pyelftools, as code_size is)."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with open(elf, "rb") as fh:
        for section in ELFFile(fh).iter_sections():
            if isinstance(section, SymbolTableSection):
                for sym in section.get_symbol_by_name(name) or []:
                    # a Thumb function's value has bit 0 set (the interworking bit); the address
                    # its first instruction sits at, which the plugin matches, is without it
                    return int(sym["st_value"]) & ~1 if sym["st_info"]["type"] == "STT_FUNC" else int(sym["st_value"])
    raise FlashError(f"{elf}: no symbol {name}")


def parse_output(stdout: str) -> BoardRun:
    outputs: dict[tuple[int, int], list[int]] = {}
    decisions: dict[int, tuple[int, int]] = {}
    boots, mismatches = 1, -1
    for line in stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["OUT"]:
            outputs[(int(parts[1]), int(parts[2]))] = [int(v) for v in parts[3:]]
        elif parts[:1] == ["EARLY"]:
            decisions[int(parts[1])] = (int(parts[2]), int(parts[3]))
        elif parts[:1] == ["BOOTS"]:
            boots = int(parts[1])
        elif parts[:1] == ["MISMATCHES"]:
            mismatches = int(parts[1])
    if mismatches < 0:
        raise FlashError(f"the board did not finish; it printed:\n{stdout[-2000:]}")
    return BoardRun(outputs, mismatches, boots, stdout=stdout, decisions=decisions)


def fresh_nv(path: Path, voltage_mv: int = 0, board: str = "mps2-an386") -> None:
    """Erased non-volatile memory, with the voltage register (its first word) set."""
    with open(path, "wb") as fh:
        fh.truncate(BOARD_SPECS[board].nv_file_bytes)
        fh.write(int(voltage_mv).to_bytes(4, "little"))


@dataclass
class PluginCounts:
    """What the tncount plugin wrote: instructions and estimated Cortex-M4 cycles, in all and before
    each call of tn_mark. A run with a power cut counts no cycles (``cycles`` None, ``cycle_marks`` empty)."""

    instructions: int = 0
    cycles: int | None = None
    marks: list[int] = field(default_factory=list)
    cycle_marks: list[int] = field(default_factory=list)


def parse_counts(text: str) -> PluginCounts:
    """The plugin's out file: ``total INSNS``, ``cycles CYCLES``, a ``mark INSNS [CYCLES]`` per marker call."""
    counts = PluginCounts()
    for line in text.splitlines():
        key, *values = line.split()
        if key == "total":
            counts.instructions = int(values[0])
        elif key == "cycles":
            counts.cycles = int(values[0])
        elif key == "mark":
            counts.marks.append(int(values[0]))
            counts.cycle_marks.extend(int(v) for v in values[1:])
        else:
            raise FlashError(f"the QEMU plugin wrote {line!r}: expected total, cycles or mark lines")
    return counts


def qemu(elf: Path, nv: Path, work: Path, cut: int | None = None, timeout: float = 600, board: str = "mps2-an386"
         ) -> tuple[int, str, list[int], int]:
    """One power-on of the board: (exit status, console output, marker counts, instructions).
    ``power_on`` gives the cycle estimate too."""
    rc, out, counts = power_on(elf, nv, work, cut, timeout, board)
    return rc, out, counts.marks, counts.instructions


def power_on(elf: Path, nv: Path, work: Path, cut: int | None = None, timeout: float = 600,
             board: str = "mps2-an386") -> tuple[int, str, PluginCounts]:
    """One power-on of the board: (exit status, console output, the plugin's counts)."""
    counts = work / "counts.txt"
    counts.unlink(missing_ok=True)
    args = f"{plugin(work)},out={counts},mark={symbol(elf, 'tn_mark'):#x}" + (f",cut={cut}" if cut is not None else "")
    exe = _tool("qemu-system-arm", "qemu-system-arm")
    common = ["-nographic", "-semihosting-config", "enable=on,target=native", "-kernel", str(elf)]
    spec = BOARD_SPECS[board]
    if spec.state_in_ram is not None:
        proc = _ram_state_power_on(exe, spec, common, args, nv, work, cut, timeout)
    else:
        cmd = [exe, "-M", f"{spec.machine},memory-backend=nv", "-object",
               f"memory-backend-file,id=nv,size={NV_BYTES},mem-path={nv},share=on", "-monitor", "none",
               "-serial", "none", *common, "-plugin", args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    found = parse_counts(counts.read_text()) if counts.exists() else PluginCounts()
    return proc.returncode, proc.stdout + proc.stderr, found


def _ram_state_power_on(exe: str, spec: Board, common: list[str], plugin_args: str, nv: Path, work: Path,
                        cut: int | None, timeout: float) -> subprocess.CompletedProcess[str]:
    """The board with ``nv`` loaded where the firmware keeps its state under QEMU; at a cut the plugin
    holds the CPU, the monitor saves that RAM back to ``nv`` and QEMU is killed (exit status CUT_EXIT)."""
    import tempfile

    assert spec.state_in_ram is not None and spec.machine is not None
    hold = work / "cut.hold"
    hold.unlink(missing_ok=True)
    addr = spec.state_in_ram[0]
    # a UNIX socket's path must be below 108 bytes: in a short temporary folder, not the (deep) build folder
    with tempfile.TemporaryDirectory(prefix="tn-") as short:
        monitor = Path(short) / "monitor.sock"
        cmd = [exe, "-M", spec.machine, "-monitor", f"unix:{monitor},server=on,wait=off", "-serial", "stdio", *common,
               "-device", f"loader,file={nv},addr={addr:#x},force-raw=on",
               "-plugin", plugin_args + (f",hold={hold}" if cut is not None else "")]
        console = work / "console.txt"  # a file, not a pipe: a full pipe would stall QEMU
        with open(console, "w") as sink:
            code = _hold_or_finish(cmd, sink, hold, monitor, nv, spec.state_in_ram, cut is not None, timeout)
    return subprocess.CompletedProcess(cmd, code, console.read_text(errors="replace"), "")


def _hold_or_finish(cmd: list[str], sink: Any, hold: Path, monitor: Path, nv: Path, region: tuple[int, int],
                    cutting: bool, timeout: float) -> int:
    """Run QEMU to its end, or to the plugin's hold: then save ``region`` (address, bytes) through the
    monitor and kill it."""
    addr, size = region
    proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not hold.exists():
        if time.monotonic() > deadline:
            proc.kill()
            raise FlashError(f"QEMU ran past {timeout:g} s")
        time.sleep(0.005)
    if proc.poll() is None:  # held before the cut instruction: save the state, then cut
        saved = nv.with_suffix(".saving")
        with socket.socket(socket.AF_UNIX) as mon:
            mon.settimeout(60)
            mon.connect(str(monitor))
            mon.sendall(f'pmemsave {addr:#x} {size} "{saved}"\n'.encode())
            reply = b""
            while reply.count(b"(qemu)") < 2:  # the banner's prompt, then the one after pmemsave
                chunk = mon.recv(4096)
                if not chunk:
                    break
                reply += chunk
        proc.kill()
        proc.wait()
        if not saved.exists() or saved.stat().st_size != size:
            raise FlashError(f"the monitor did not save the board's memory: {reply.decode(errors='replace')[-500:]}")
        os.replace(saved, nv)
        return CUT_EXIT
    if cutting and proc.returncode == CUT_EXIT:
        raise FlashError("QEMU exited with the plugin's cut status without holding")
    return proc.returncode


def run_board(exe: Path, board: str, work: Path, voltage_mv: int = 0, mode: str = "run") -> BoardRun:
    """Run the firmware's checks: the host board's ``mode`` (run, early, ...), or one QEMU power-on."""
    if board == "host":
        proc = subprocess.run([str(exe), mode], capture_output=True, text=True, timeout=600)
        result = parse_output(proc.stdout)
        if proc.returncode not in (0, 1):
            raise FlashError(f"host firmware exited {proc.returncode}: {proc.stderr.strip()}")
        return result
    nv = work / "nv.bin"
    fresh_nv(nv, voltage_mv, board)
    rc, out, counts = power_on(exe, nv, work, board=board)
    if rc not in (0, 1):
        raise FlashError(f"QEMU exited {rc}: {out[-2000:]}")
    result = parse_output(out)
    result.instructions, result.marks = counts.instructions, counts.marks
    result.cycles, result.cycle_marks = counts.cycles, counts.cycle_marks
    return result


def run_with_cuts(elf: Path, work: Path, cuts: list[int], board: str = "mps2-an386") -> BoardRun:
    """Power the board on repeatedly, cutting power before each instruction count in ``cuts``
    (counted from each power-on), then once more without a cut, until it finishes. The console
    output of every power-on counts (the stm32f405 board prints each job as it finishes; the
    last line of a job is its result)."""
    nv = work / "nv.bin"
    fresh_nv(nv, board=board)
    boots, console = 0, []
    for cut in [*cuts, None]:
        boots += 1
        rc, out, _, _ = qemu(elf, nv, work, cut=cut, board=board)
        console.append(out)
        if rc == CUT_EXIT:
            continue
        if rc not in (0, 1):
            raise FlashError(f"QEMU exited {rc}: {out[-2000:]}")
        # finished (before this cut's instruction, if there was one); a cut boot's last line may be cut short
        result = parse_output("".join(o if not o or o.endswith("\n") else o + "\n" for o in console))
        result.boots = boots
        return result
    raise FlashError("the board never finished")


def power_cut_trials(elf: Path, board: str, cuts: int, seed: int = 0) -> dict[str, int]:
    """``cuts`` power cuts, each at a random instruction inside the first inference (seeded), each followed
    by as many power-ons as the board needs to finish: how many gave the uncut run's outputs bit for bit,
    and the most power-ons one took."""
    import random

    work = elf.parent
    nv = work / "nv.bin"
    fresh_nv(nv, board=board)
    _, out, marks, _ = qemu(elf, nv, work, board=board)
    reference = [line for line in out.splitlines() if line.startswith("OUT")]
    rng = random.Random(seed)
    identical = boots = 0
    for _ in range(cuts):
        run = run_with_cuts(elf, work, [rng.randrange(marks[0], marks[1])], board=board)
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith("OUT")]
        identical += int(lines[-len(reference):] == reference)  # stm32f405: a job cut before its commit prints again
        boots = max(boots, run.boots)
    return {"trials": cuts, "identical": identical, "max_boots": boots}


def board_accuracy(outputs: dict[tuple[int, int], list[int]], labels: np.ndarray, variants: int) -> list[float | None]:
    """Each variant's accuracy on the board: the share of test vectors whose largest output is the label."""
    accuracy: list[float | None] = []
    for k in range(variants):
        hits = [int(np.argmax(outputs[(i, k)])) == int(y) for i, y in enumerate(labels) if (i, k) in outputs]
        accuracy.append(sum(hits) / len(hits) if hits else None)
    return accuracy


def inference_instructions(marks: list[int]) -> list[int]:
    """Instructions of each inference, from the marker counts (one mark before and one after each)."""
    return [b - a for a, b in zip(marks[0::2], marks[1::2])]


def inference_cycles(cycle_marks: list[int]) -> list[int]:
    """Estimated Cortex-M4 cycles of each inference, from the cycle counts at the marks (``BoardRun.cycle_marks``)."""
    return inference_instructions(cycle_marks)


def layer_tiles(model: Any) -> list[tuple[str, int, int]]:
    """(name, tiles, output bytes) of each firmware layer, in the executor's order: the bytes it
    writes into the arena (``export.firmware.plan.output_bytes``), a concatenation's own channels,
    or the int32 pooled sums and logits."""
    from export.firmware.intmodel import (
        AddLayer,
        ConcatLayer,
        ConvLayer,
        DepthwiseLayer,
        LutLayer,
        PoolLayer,
        WindowPoolLayer,
    )
    from export.firmware.plan import output_bytes

    out: list[tuple[str, int, int]] = []
    counts: dict[str, int] = {}

    def name(kind: str) -> str:
        counts[kind] = counts.get(kind, 0) + 1
        return f"{kind}{counts[kind]}"

    for k, layer in enumerate(model.layers):
        nbytes = output_bytes(layer, last=False)
        if isinstance(layer, (ConvLayer, DepthwiseLayer)):
            positions = math.prod(layer.out_shape[1:])
            out.append((name("conv" if isinstance(layer, ConvLayer) else "dwconv"), -(-positions // TILE_POSITIONS),
                        nbytes))
        elif isinstance(layer, PoolLayer):
            out.append(("pool", 1, 4 * layer.in_shape[0]))
        elif k + 1 == len(model.layers):  # the classifier: int32 logits
            out.append(("classifier", 1, 4 * int(layer.weight.shape[0]) * getattr(layer, "rows", 1)))
        elif isinstance(layer, ConcatLayer):
            out.append((name("concat"), 1, layer.channels * math.prod(layer.positions)))
        else:
            if isinstance(layer, WindowPoolLayer):
                kind = f"{layer.kind}pool"
            elif isinstance(layer, LutLayer):
                kind = layer.op.lower()
            elif isinstance(layer, AddLayer):
                kind = "sub" if layer.subtract else "add"
            else:  # MeanLayer, MulLayer, FCLayer
                kind = type(layer).__name__.removesuffix("Layer").lower()
            out.append((name(kind), 1, nbytes))
    return out


def profile_layers(sources: Path, models: list[Any], plain: list[int], work: Path,
                   plain_cycles: list[int] | None = None) -> list[dict[str, Any]]:
    """Instructions of each layer of each variant on mps2-an386, for the first test vector; with
    ``plain_cycles`` their estimated Cortex-M4 cycles too (``estimated_cycles``).

    A profiling build marks every commit, so the counts between marks are the tiles; the
    marks' own cost (the same for every tile) is taken out using ``plain``, the unmarked
    build's instructions for that inference (``plain_cycles``: its cycles). A layer's first tile
    includes what precedes it (the first layer: starting the run, copying the input to non-volatile memory)."""
    elf = build(sources, "mps2-an386", work, vectors=1, profile=True)
    run = run_board(elf, "mps2-an386", work)
    at, result = 0, []
    for k, (model, total) in enumerate(zip(models, plain)):
        layers = layer_tiles(model)
        n_tiles = sum(t for _, t, _ in layers)
        job = run.marks[at : at + n_tiles + 2]  # start, a mark per commit, end
        if len(job) != n_tiles + 2:
            raise FlashError(f"profiling run: expected {n_tiles + 2} marks per inference, got {len(job)}")
        per_layer = [{"name": name, "instructions": n, "output_bytes": int(nbytes)}
                     for (name, _, nbytes), n in zip(layers, _layer_counts(job, total, layers))]
        measured: dict[str, Any] = {"instructions": int(total), "layers": per_layer}
        if plain_cycles is not None and run.cycle_marks:
            cycle_job = run.cycle_marks[at : at + n_tiles + 2]
            for layer, cycles in zip(per_layer, _layer_counts(cycle_job, plain_cycles[k], layers)):
                layer["estimated_cycles"] = cycles
            measured["estimated_cycles"] = int(plain_cycles[k])
        result.append(measured)
        at += n_tiles + 2
    return result


def _layer_counts(job: list[int], total: int, layers: list[tuple[str, int, int]]) -> list[int]:
    """Each layer's share of one profiled inference: ``job`` the counts at its marks (start, a mark per
    commit, end), ``total`` the unmarked build's count for it; the marks' own cost, the same for every
    tile, is what the marked inference has beyond ``total``, spread over the tiles."""
    n_tiles = len(job) - 2
    hook = (job[-1] - job[0] - total) / n_tiles
    tiles = np.diff(job[:-1]) - hook
    bounds = np.cumsum([0] + [t for _, t, _ in layers])
    return [round(float(tiles[a:b].sum())) for a, b in pairwise(bounds)]


def flash(bundle: Bundle, board: str, out: Path, vectors: int | None = None, profile: bool = False,
          x_test: np.ndarray | None = None, policy: str = "auto", labels: np.ndarray | None = None,
          power_cuts: int = 0) -> dict[str, Any]:
    """Generate, build and run the firmware of ``bundle`` on ``board``; returns what was measured.
    ``profile`` (mps2-an386): also split each variant's instructions into its layers. ``x_test``:
    model inputs to use as test vectors instead of the bundle's own. ``policy``: auto (tiles commit
    where the live tensors fit the board's non-volatile memory, else atomic inference), tiles or
    atomic (``choose_policy``). ``labels``: the test vectors' classes (by default the bundle's own
    vectors' labels): each variant's accuracy on the board. ``power_cuts`` (QEMU boards): that many
    seeded cuts at random instructions inside an inference, each run to the end (``power_cut_trials``)."""
    from export.firmware.cgen import generate, generate_early

    if board not in BOARDS:
        raise FlashError(f"--board {board}: must be one of {', '.join(BOARDS)}")
    early = bundle.manifest.early is not None
    spec = BOARD_SPECS.get(board)
    if early and spec is not None and spec.small_state:
        raise FlashError(f"--board {board} runs classifiers; an early-decision bundle runs on host and mps2-an386 "
                         "(its rule's state is not yet kept in the board's few KB of non-volatile memory)")
    if early:  # x_test: raw test series (n, channels, T); vectors: how many
        sources, info = generate_early(bundle, None if x_test is None else x_test[:vectors])
    else:
        sources, info = generate(bundle, x_test, max_vectors=vectors)
    gen = out / "generated"
    write_sources(sources, gen)
    chosen = choose_policy(board, info["config"], info["input_bytes"], policy)
    exe = build(gen, board, out / board, atomic=chosen.name == "atomic", keep_input=chosen.keep_input)
    plans = {"arena_bytes": info["arena_bytes"], "tensor_bytes": max(p.tensor_bytes for p in info["plans"]),
             "config": info["config"]}
    if board != "host":
        check_ram(exe, board)
    if spec is not None and spec.machine is None:  # built and read, not run: no emulator for this chip here
        return {"board": board, "binary": str(exe), "bin": str(exe.with_suffix(".bin")), "vectors": info["vectors"],
                "variants": info["variants"], "mismatches": None, "outputs": {}, "oracle": info["oracle"],
                "size": code_size(exe), "memory": memory_use(exe, board), "policy": chosen.as_dict(), "plan": plans}
    run = run_board(exe, board, out / board, mode="early" if early else "run")
    report: dict[str, Any] = {"board": board, "binary": str(exe), "vectors": info["vectors"], "variants": info["variants"],
                              "mismatches": run.mismatches, "outputs": run.outputs, "oracle": info["oracle"],
                              "policy": chosen.as_dict(), "plan": plans}
    if early:
        frames = run_board(exe, board, out / board) if board == "host" else None  # the frame model's own vectors
        report |= {"series": info["series"], "expected_decisions": info["decisions"],
                   "decisions": [run.decisions.get(i) for i in range(info["series"])],
                   "mismatches": run.mismatches + (frames.mismatches if frames else 0),
                   "outputs": frames.outputs if frames else {}}
        if board == "mps2-an386":
            report["instructions_per_series"] = inference_instructions(run.marks)
        return report
    if labels is None and x_test is None:
        labels = bundle_labels(bundle)
    if labels is not None:
        for v, acc in zip(report["variants"], board_accuracy(run.outputs, labels[: info["vectors"]], len(info["variants"]))):
            v["accuracy_on_board"] = acc
    if power_cuts:
        report["power_cuts"] = power_cut_trials(exe, board, power_cuts)
    if board != "host":
        _board_figures(report, run, info, board, exe, gen, out if profile else None)
    return report


def _board_figures(report: dict[str, Any], run: BoardRun, info: dict[str, Any], board: str, exe: Path, gen: Path,
                   profile: Path | None) -> None:
    """A QEMU board's counts in ``report``: instructions (per MAC, and time and energy on the board's
    CPU profile) per variant, code size, memory; with ``profile`` (the build folder) each variant's layers."""
    per = inference_instructions(run.marks)
    per_cycles = inference_cycles(run.cycle_marks)
    n_var = len(info["variants"])
    for k, v in enumerate(report["variants"]):
        counts = per[k::n_var]
        v["instructions_per_inference"] = int(np.median(counts)) if counts else None
        v["instructions_per_mac"] = v["instructions_per_inference"] / v["macs"] if counts else None
        # the plugin's Cortex-M4 estimate from the TRM's instruction timings (firmware/plugin/tncount.c)
        v["estimated_cycles_per_inference"] = int(np.median(per_cycles[k::n_var])) if per_cycles[k::n_var] else None
        if counts:  # what the storage must carry whole under the atomic policy (the cycle estimate, else
            mcu = MCUS[BOARD_SPECS[board].cpu]  # the instructions taken as cycles)
            cycles = v["estimated_cycles_per_inference"] or v["instructions_per_inference"]
            v["energy_per_inference_j"] = cycles * mcu.energy_per_cycle_j()
            v["time_per_inference_s"] = cycles / mcu.clock_hz
    report["size"] = code_size(exe)
    report["memory"] = memory_use(exe, board)
    report["bin"] = str(exe.with_suffix(".bin"))
    if profile is not None and per:
        measured_layers = profile_layers(gen, info["models"], per[:n_var], profile / "profile",
                                         per_cycles[:n_var] if per_cycles else None)
        for v, measured in zip(report["variants"], measured_layers):
            v["layers"] = measured["layers"]


def bundle_labels(bundle: Bundle) -> np.ndarray | None:
    """The classes of the bundle's own test vectors, where it carries them."""
    from edge.contract.vectors import TestVectors

    info = bundle.manifest.test_vectors
    return None if info is None else TestVectors.from_bytes(bundle.file(info.file), info.file).labels


def program(elf: Path, board: str, programmer: str = "openocd", interface: str = "stlink") -> str:
    """Write ``elf`` to a real board through a debug probe: OpenOCD (``interface``: stlink or
    cmsis-dap, its interface/*.cfg) or pyOCD. No probe attached is one FlashError saying so."""
    probe = BOARD_SPECS[board].probe if board in BOARD_SPECS else None
    if probe is None:
        raise FlashError(f"--program: the {board} is not a board to write ({', '.join(PROGRAMMABLE)} are)")
    config, target = probe
    if programmer == "openocd":
        cmd = [_tool("openocd", "openocd"), "-f", f"interface/{interface}.cfg", "-f", config,
               "-c", f"program {elf} verify reset exit"]
        via = f"openocd, interface/{interface}.cfg"
    else:
        cmd = [_tool("pyocd", "pyocd (pip install pyocd)"), "flash", "--target", target, str(elf)]
        via = "pyocd"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise FlashError(f"--program: {via} did not finish in 300 s") from None
    text = proc.stderr + proc.stdout
    if proc.returncode == 0:
        return text
    errors = [line.strip() for line in text.splitlines() if "error" in line.lower()] or text.strip().splitlines()[-1:]
    cause = errors[0] if errors else f"exit status {proc.returncode}"
    if any(s.lower() in text.lower() for s in NO_PROBE):
        raise FlashError(f"--program: no debug probe found ({via}: {cause}); connect an ST-Link or CMSIS-DAP probe to "
                         "the board's SWD pins (or choose another with --interface / --programmer)")
    raise FlashError(f"--program: {via} failed: {cause}")


def record(bundle: Bundle, report: dict[str, Any], out: Path, key: Ed25519PrivateKey | None) -> Path:
    """A copy of ``bundle`` at ``out`` whose variants carry the instructions ``report`` measured,
    with bundle_version + 1 (it is a new bundle to a device), signed with ``key``."""
    from edge.contract.bundle import pack, write_bundle

    if "size" not in report or any("layers" not in v for v in report["variants"]):
        raise FlashError("only a profiled mps2-an386 run has instruction counts to record")
    if bundle.signed_by is not None and key is None:
        raise FlashError("the bundle is signed: pass --key PRIVATE to sign the recorded copy (it would lose its signature)")
    measured = {v["name"]: v for v in report["variants"]}
    board = report["board"]
    variants = []
    for v in bundle.manifest.variants:
        if v.name in measured:
            m = measured[v.name]
            known = MeasuredLayer.model_fields  # the manifest records instructions, not the cycle estimate
            counts = Measured(cpu=BOARD_SPECS[board].cpu, instructions=m["instructions_per_inference"],
                              layers=[MeasuredLayer(**{k: layer[k] for k in known}) for layer in m["layers"]])
            v = v.model_copy(update={"measured": {**(v.measured or {}), board: counts}})
        variants.append(v)
    manifest = bundle.manifest.model_copy(update={"variants": variants, "bundle_version": bundle.manifest.bundle_version + 1})
    return write_bundle(pack(manifest, dict(bundle.files), key), out)

