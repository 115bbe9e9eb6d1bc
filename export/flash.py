"""Build a bundle's firmware, "flash" it to a board, run its test vectors, and cut its power.

    result = flash(Path("bundles/digits.tar"), board="mps2-an386", out=Path("build/flash"))

Boards: ``host`` (gcc, the harness cuts power at progress points) and ``mps2-an386``
(arm-none-eabi-gcc, Cortex-M4 under qemu-system-arm). The board's non-volatile region is a
host file (QEMU's memory-backend-file, share=on), so it survives QEMU being killed; the
``tncount`` TCG plugin (built here from firmware/plugin/tncount.c) counts instructions and cuts
power before an exact instruction.
"""

from __future__ import annotations

import copy
import math
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge.bundle import Bundle

FIRMWARE = Path(__file__).resolve().parent.parent / "firmware"
BOARDS = ("host", "mps2-an386")
BOARD_CPU = {"mps2-an386": "cortex-m4"}  # the simulator's MCU profile its counts apply to
WARNINGS = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-Wconversion"]
CUT_EXIT = 3  # the plugin's exit status for a power cut
NV_BYTES = 16 << 20
TILE_POSITIONS = 2  # firmware/include/tn.h TN_TILE_POSITIONS: conv output positions per tile


class FlashError(RuntimeError):
    """A missing toolchain, a failed build, or a board that did not finish."""


@dataclass
class BoardRun:
    outputs: dict[tuple[int, int], list[int]]  # (vector, variant) -> int32 logits
    mismatches: int
    boots: int = 1
    instructions: int | None = None
    marks: list[int] = field(default_factory=list)
    stdout: str = ""


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


def build(sources: Path, board: str, out: Path, vectors: int | None = None, sanitize: bool = False,
          reference_kernel: bool = False, dyninfer: bool = False, no_progress: bool = False, profile: bool = False
          ) -> Path:
    """Compile firmware + generated model for ``board``; returns the executable / ELF."""
    common = [*WARNINGS, f"-I{FIRMWARE / 'include'}", f"-I{sources}"]
    if reference_kernel:
        common.append("-DTN_REFERENCE_KERNEL")  # the executor calls the plain kernel (the benchmark's baseline)
    if no_progress:
        common.append("-DTN_NO_PROGRESS")  # straight loops, no commits: the intermittency overhead's baseline
    src = [str(p) for p in sorted((FIRMWARE / "src").glob("*.c"))] + [str(sources / "model.c")]
    out.mkdir(parents=True, exist_ok=True)
    if board == "host":
        exe = out / ("host_fw_asan" if sanitize else "host_fw")
        flags = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"] if sanitize else ["-O2"]
        _run([_tool("gcc", "gcc"), *common, *flags, "-DTN_PROGRESS_HOOK=tn_progress_hook", *src,
              str(FIRMWARE / "boards" / "host" / "main.c"), "-o", str(exe)], "host build")
        return exe
    if board != "mps2-an386":
        raise FlashError(f"--board {board}: must be one of {', '.join(BOARDS)}")
    cc = _tool("arm-none-eabi-gcc", "gcc-arm-none-eabi libnewlib-arm-none-eabi")
    elf = out / "firmware.elf"
    defines = [f"-DTN_BOARD_VECTORS={vectors}"] if vectors is not None else []
    defines += ["-DTN_DYNINFER"] if dyninfer else []
    defines += ["-DTN_PROFILE", "-DTN_PROGRESS_HOOK=tn_progress_mark"] if profile else []  # a mark per commit
    board_dir = FIRMWARE / "boards" / "mps2-an386"
    # -fno-tree-loop-distribute-patterns: short zero fills stay inline loops, not newlib-nano memset calls
    _run([cc, *common, *defines, "-mcpu=cortex-m4", "-mthumb", "-O2", "-fno-tree-loop-distribute-patterns",
          "-ffunction-sections", "-fdata-sections", "-Wl,--gc-sections", "-nostartfiles", "-specs=nano.specs", *src,
          *[str(p) for p in sorted(board_dir.glob("*.c"))],
          "-T", str(board_dir / "link.ld"), "-lc", "-lgcc", "-o", str(elf)], "Cortex-M4 build")
    _run([_tool("arm-none-eabi-objcopy", "binutils-arm-none-eabi"), "-O", "binary", str(elf), str(out / "firmware.bin")],
         "objcopy")
    return elf


def plugin(out: Path) -> Path:
    """Build the instruction-counting / power-cutting QEMU plugin."""
    lib = out / "libtncount.so"
    if not lib.exists() or lib.stat().st_mtime < (FIRMWARE / "plugin" / "tncount.c").stat().st_mtime:
        out.mkdir(parents=True, exist_ok=True)
        _run([_tool("gcc", "gcc"), "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror",
              str(FIRMWARE / "plugin" / "tncount.c"), "-o", str(lib)], "plugin build")
    return lib


def code_size(elf: Path) -> dict[str, int]:
    proc = _run([_tool("arm-none-eabi-size", "binutils-arm-none-eabi"), str(elf)], "size")
    text, data, bss = (int(v) for v in proc.stdout.splitlines()[1].split()[:3])
    return {"text": text, "data": data, "bss": bss}


def symbol(elf: Path, name: str) -> int:
    proc = _run([_tool("arm-none-eabi-nm", "binutils-arm-none-eabi"), str(elf)], "nm")
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return int(parts[0], 16)
    raise FlashError(f"{elf}: no symbol {name}")


def parse_output(stdout: str) -> BoardRun:
    outputs: dict[tuple[int, int], list[int]] = {}
    boots, mismatches = 1, -1
    for line in stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["OUT"]:
            outputs[(int(parts[1]), int(parts[2]))] = [int(v) for v in parts[3:]]
        elif parts[:1] == ["BOOTS"]:
            boots = int(parts[1])
        elif parts[:1] == ["MISMATCHES"]:
            mismatches = int(parts[1])
    if mismatches < 0:
        raise FlashError(f"the board did not finish; it printed:\n{stdout[-2000:]}")
    return BoardRun(outputs, mismatches, boots, stdout=stdout)


def fresh_nv(path: Path, voltage_mv: int = 0) -> None:
    """Erased non-volatile memory, with the voltage register (its first word) set."""
    with open(path, "wb") as fh:
        fh.truncate(NV_BYTES)
        fh.write(int(voltage_mv).to_bytes(4, "little"))


def qemu(elf: Path, nv: Path, work: Path, cut: int | None = None, timeout: float = 600) -> tuple[int, str, list[int], int]:
    """One power-on of the board: (exit status, semihosting output, marker counts, instructions)."""
    counts = work / "counts.txt"
    counts.unlink(missing_ok=True)
    args = f"{plugin(work)},out={counts},mark={symbol(elf, 'tn_mark'):#x}" + (f",cut={cut}" if cut is not None else "")
    cmd = [_tool("qemu-system-arm", "qemu-system-arm"), "-M", "mps2-an386,memory-backend=nv", "-object",
           f"memory-backend-file,id=nv,size={NV_BYTES},mem-path={nv},share=on", "-nographic", "-monitor", "none",
           "-serial", "none", "-semihosting-config", "enable=on,target=native", "-kernel", str(elf), "-plugin", args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    marks, total = [], 0
    if counts.exists():
        for line in counts.read_text().splitlines():
            key, value = line.split()
            if key == "mark":
                marks.append(int(value))
            else:
                total = int(value)
    return proc.returncode, proc.stdout + proc.stderr, marks, total


def run_board(exe: Path, board: str, work: Path, voltage_mv: int = 0) -> BoardRun:
    if board == "host":
        proc = subprocess.run([str(exe), "run"], capture_output=True, text=True, timeout=600)
        result = parse_output(proc.stdout)
        if proc.returncode not in (0, 1):
            raise FlashError(f"host firmware exited {proc.returncode}: {proc.stderr.strip()}")
        return result
    nv = work / "nv.bin"
    fresh_nv(nv, voltage_mv)
    rc, out, marks, total = qemu(exe, nv, work)
    if rc not in (0, 1):
        raise FlashError(f"QEMU exited {rc}: {out[-2000:]}")
    result = parse_output(out)
    result.instructions, result.marks = total, marks
    return result


def run_with_cuts(elf: Path, work: Path, cuts: list[int]) -> BoardRun:
    """Power the board on repeatedly, cutting power before each instruction count in ``cuts``
    (counted from each power-on), then once more without a cut, until it finishes."""
    nv = work / "nv.bin"
    fresh_nv(nv)
    boots = 0
    for cut in [*cuts, None]:
        boots += 1
        rc, out, _, _ = qemu(elf, nv, work, cut=cut)
        if rc == CUT_EXIT:
            continue
        if rc not in (0, 1):
            raise FlashError(f"QEMU exited {rc}: {out[-2000:]}")
        result = parse_output(out)  # finished (before this cut's instruction, if there was one)
        result.boots = boots
        return result
    raise FlashError("the board never finished")


def inference_instructions(marks: list[int]) -> list[int]:
    """Instructions of each inference, from the marker counts (one mark before and one after each)."""
    return [b - a for a, b in zip(marks[0::2], marks[1::2])]


def layer_tiles(model: Any) -> list[tuple[str, int, int]]:
    """(name, tiles, output bytes) of each firmware layer, in the executor's order."""
    from export.intmodel import ConvLayer, PoolLayer

    out, convs = [], 0
    for layer in model.layers:
        if isinstance(layer, ConvLayer):
            convs += 1
            positions = math.prod(layer.out_shape[1:])
            out.append((f"conv{convs}", -(-positions // TILE_POSITIONS), math.prod(layer.out_shape)))
        elif isinstance(layer, PoolLayer):
            out.append(("pool", 1, 4 * layer.in_shape[0]))
        else:
            out.append(("classifier", 1, 4 * layer.weight.shape[0]))
    return out


def profile_layers(sources: Path, models: list[Any], plain: list[int], work: Path) -> list[dict[str, Any]]:
    """Instructions of each layer of each variant on mps2-an386, for the first test vector.

    A profiling build marks every commit, so the counts between marks are the tiles; the
    marks' own cost (the same for every tile) is taken out using ``plain``, the unmarked
    build's instructions for that inference. A layer's first tile includes what precedes it
    (the first layer: starting the run, copying the input to non-volatile memory)."""
    elf = build(sources, "mps2-an386", work, vectors=1, profile=True)
    run = run_board(elf, "mps2-an386", work)
    marks, at, result = run.marks, 0, []
    for model, total in zip(models, plain):
        layers = layer_tiles(model)
        n_tiles = sum(t for _, t, _ in layers)
        job = marks[at : at + n_tiles + 2]  # start, a mark per commit, end
        at += n_tiles + 2
        if len(job) != n_tiles + 2:
            raise FlashError(f"profiling run: expected {n_tiles + 2} marks per inference, got {len(job)}")
        hook = (job[-1] - job[0] - total) / n_tiles
        tiles = np.diff(job[:-1]) - hook
        bounds = np.cumsum([0] + [t for _, t, _ in layers])
        per_layer = [{"name": name, "instructions": round(float(tiles[a:b].sum())), "output_bytes": int(nbytes)}
                     for (name, _, nbytes), a, b in zip(layers, bounds[:-1], bounds[1:])]
        result.append({"instructions": int(total), "layers": per_layer})
    return result


def flash(bundle: Bundle, x_test: np.ndarray, board: str, out: Path, vectors: int | None = None,
          profile: bool = False) -> dict[str, Any]:
    """Generate, build and run the firmware of ``bundle`` on ``board``; returns what was measured.
    ``profile`` (mps2-an386): also split each variant's instructions into its layers."""
    from export.cgen import generate

    if board not in BOARDS:
        raise FlashError(f"--board {board}: must be one of {', '.join(BOARDS)}")
    sources, info = generate(bundle, x_test, max_vectors=vectors)
    gen = out / "generated"
    write_sources(sources, gen)
    exe = build(gen, board, out / board)
    run = run_board(exe, board, out / board)
    report: dict[str, Any] = {"board": board, "binary": str(exe), "vectors": info["vectors"], "variants": info["variants"],
                              "mismatches": run.mismatches, "outputs": run.outputs}
    if board == "mps2-an386":
        per = inference_instructions(run.marks)
        n_var = len(info["variants"])
        for k, v in enumerate(report["variants"]):
            counts = per[k::n_var]
            v["instructions_per_inference"] = int(np.median(counts)) if counts else None
            v["instructions_per_mac"] = v["instructions_per_inference"] / v["macs"] if counts else None
        report["size"] = code_size(exe)
        report["bin"] = str(exe.with_suffix(".bin"))
        if profile and per:
            for v, measured in zip(report["variants"], profile_layers(gen, info["models"], per[:n_var], out / "profile")):
                v["layers"] = measured["layers"]
    return report


def record(bundle: Bundle, report: dict[str, Any], out: Path, key: Ed25519PrivateKey | None) -> Path:
    """A copy of ``bundle`` at ``out`` whose variants carry the instructions ``report`` measured,
    with bundle_version + 1 (it is a new bundle to a device), signed with ``key``."""
    from edge.bundle import pack, write_bundle

    if "size" not in report or any("layers" not in v for v in report["variants"]):
        raise FlashError("only a profiled mps2-an386 run has instruction counts to record")
    if bundle.signed_by is not None and key is None:
        raise FlashError("the bundle is signed: pass --key PRIVATE to sign the recorded copy (it would lose its signature)")
    manifest = copy.deepcopy(bundle.manifest)
    measured = {v["name"]: v for v in report["variants"]}
    for v in manifest["variants"]:
        if v["name"] in measured:
            m = measured[v["name"]]
            v.setdefault("measured", {})[report["board"]] = {
                "cpu": BOARD_CPU[report["board"]], "instructions": m["instructions_per_inference"], "layers": m["layers"]}
    manifest["bundle_version"] += 1
    manifest.pop("files")
    return write_bundle(pack(manifest, dict(bundle.files), key), out)

