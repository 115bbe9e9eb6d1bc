"""Arm's CMSIS-NN, run layer by layer on the same counter as the firmware (issue 50).

For each operator of an int8 TFLite model that TFLite Micro hands to a CMSIS-NN kernel (CONV_2D,
DEPTHWISE_CONV_2D, FULLY_CONNECTED, AVERAGE_POOL_2D, MAX_POOL_2D, ADD, SOFTMAX), one mps2-an386
program calls CMSIS-NN's own entry point (``arm_convolve_wrapper_s8``, ``arm_depthwise_conv_wrapper_s8``,
``arm_fully_connected_s8`` (``_per_channel_s8`` for per-channel weights), ``arm_avgpool_s8``,
``arm_max_pool_s8``, ``arm_elementwise_add_s8``,
``arm_softmax_s8``) with the parameters TFLite Micro's CMSIS-NN kernels compute in Prepare (the
multipliers, shifts, padding and activation range; the fully connected layer's kernel sums when its
buffer asks for them), the scratch buffer its ``_get_buffer_size`` function asks, and, as input, the
tensor TFLite Micro itself computed for that operator (its interpreter keeping every tensor). Each
call sits between two calls of the marker the counting plugin watches, so a layer's count is the
kernel's alone (TFLite Micro's interpreter around it is left out: the peer's figure is its best
case). The program compares each output with TFLite Micro's tensor byte for byte and prints the
differences.

CMSIS-NN is never part of the project: its sources are read from ``--peer cmsis-nn=PATH``
(default ``../shared/peers/cmsis-nn``, or ``$TRICKLE_PEERS/cmsis-nn``), compiled into a build
folder, and linked only into these measuring programs. Built with Debian's ``arm-none-eabi-gcc
-mcpu=cortex-m4 -mthumb`` (the DSP extension on) at -O2 and at -O3; each layer is counted at the
level where it runs faster (the stronger baseline).
"""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge.core.errors import FlashError
from edge.core.files import REPO_ROOT

PEER_ENV = "TRICKLE_PEERS"
KERNEL_DIRS = ("ConvolutionFunctions", "FullyConnectedFunctions", "PoolingFunctions", "BasicMathFunctions",
               "SoftmaxFunctions", "NNSupportFunctions", "ActivationFunctions")
OPT_LEVELS = ("-O2", "-O3")
# the firmware's layer names (export.firmware.flash.layer_tiles) of the operators both sides run
KIND_NAMES = {"CONV_2D": "conv", "DEPTHWISE_CONV_2D": "dwconv", "FULLY_CONNECTED": "fc", "AVERAGE_POOL_2D": "avgpool",
              "MAX_POOL_2D": "maxpool", "ADD": "add", "SOFTMAX": "softmax"}
BOARD = REPO_ROOT / "firmware" / "boards" / "mps2-an386"
SCRATCH_WORDS = 1 << 16  # 256 KiB for the kernels' buffers (the program stops, saying so, if one asks more)


class PeerError(FlashError):
    """The peer's sources are absent or a measuring program could not be built or run."""


def peer_folder(given: str | os.PathLike[str] | None = None) -> Path:
    """CMSIS-NN's folder (``Include/`` and ``Source/``): ``given``, else ``$TRICKLE_PEERS/cmsis-nn``, else
    ``shared/peers/cmsis-nn`` beside the checkout; one clear error when it is not there."""
    folder = Path(given) if given else Path(os.environ.get(PEER_ENV, REPO_ROOT.parent / "shared" / "peers")) / "cmsis-nn"
    if not (folder / "Include" / "arm_nnfunctions.h").is_file() or not (folder / "Source").is_dir():
        raise PeerError(f"{folder}: no CMSIS-NN here (Include/arm_nnfunctions.h and Source/ are needed); give its "
                        "folder with --peer cmsis-nn=PATH (a checkout of github.com/ARM-software/CMSIS-NN)")
    return folder


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise PeerError(f"{what} failed ({' '.join(cmd[:3])} ...):\n{(proc.stdout + proc.stderr)[-3000:]}")


M4 = ["-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=soft", "-ffunction-sections", "-fdata-sections"]


def build_library(peer: Path, out: Path, opt: str) -> Path:
    """CMSIS-NN's int8 kernels compiled at ``opt`` into ``out/libcmsis-nn.a`` (kept between runs)."""
    lib = out / "libcmsis-nn.a"
    if lib.exists():
        return lib
    out.mkdir(parents=True, exist_ok=True)
    sources = sorted(p for d in KERNEL_DIRS for p in (peer / "Source" / d).glob("*.c")
                     if not p.stem.endswith(("_f16", "_f32")))  # the integer kernels
    if not sources:
        raise PeerError(f"{peer}/Source: no kernels in {', '.join(KERNEL_DIRS)}")

    def compile_one(src: Path) -> Path:
        obj = out / f"{src.stem}.o"
        _run(["arm-none-eabi-gcc", *M4, opt, "-I", str(peer / "Include"), "-c", str(src), "-o", str(obj)],
             f"compiling {src.name}")
        return obj

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        objects = list(pool.map(compile_one, sources))
    _run(["arm-none-eabi-ar", "rcs", str(lib.with_suffix(".tmp")), *map(str, objects)], "arm-none-eabi-ar")
    lib.with_suffix(".tmp").replace(lib)
    return lib


# ---- the cases: one operator each, with TFLite Micro's own tensors ------------------------------------------------


@dataclass
class Case:
    """One operator as CMSIS-NN runs it: the C statements of its call, its arrays, its expected output."""

    k: int  # the operator's index in the graph
    kind: str
    name: str  # conv1, dwconv2, ..., softmax1: the firmware's name for the same layer
    arrays: dict[str, np.ndarray]  # name -> constant data
    setup: str  # C statements before the mark (dims, params, the context; TFLite Micro's Prepare)
    call: str  # the kernel call, between the marks
    want: np.ndarray  # TFLite Micro's output, int8
    macs: int = 0  # conv, depthwise and fully connected multiply-accumulates
    shape: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _dims(name: str, n: int, h: int, w: int, c: int) -> str:
    return f"const cmsis_nn_dims {name} = {{.n = {n}, .h = {h}, .w = {w}, .c = {c}}};"


def _tensors(data: bytes, x_q: np.ndarray) -> dict[int, np.ndarray]:
    """Every tensor TFLite Micro computes for the int8 input ``x_q`` (its interpreter preserving all)."""
    from tflite_micro.python.tflite_micro import runtime

    from export.firmware.tflite_import import _native_stdout

    with _native_stdout():
        interpreter = runtime.Interpreter.from_bytes(data, intrepreter_config=runtime.InterpreterConfig.kPreserveAllTensors)
    interpreter.set_input(x_q.astype(np.int8).reshape(interpreter.get_input_details(0)["shape"]), 0)
    interpreter.invoke()
    out = {}
    from export.firmware.tflite_import import read_model

    for t in range(len(read_model(data).subgraphs[0].tensors)):
        try:
            got = interpreter.GetTensor(t, 0)
        except (RuntimeError, ValueError, IndexError):
            continue
        if got is not None and got.get("tensor_data") is not None:
            out[t] = np.asarray(got["tensor_data"])
    return out


def _exp(real: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier as CMSIS-NN takes it: (Q31 multiplier, shift exponent, left positive)."""
    from export.firmware.tflite_import import quantize_multiplier

    m, right = quantize_multiplier(real)
    return m, -right


def cases(data: bytes, x_q: np.ndarray) -> list[Case]:
    """The operators of ``data`` that TFLite Micro runs with CMSIS-NN kernels, each with TFLite Micro's
    tensors for the input ``x_q``."""
    from export.firmware.tflite_import import _activation_range, _Graph, _same_pad, op_names, read_model

    model = read_model(data)
    graph = _Graph(model, data)
    tensors = _tensors(data, x_q)
    out: list[Case] = []
    counts: dict[str, int] = {}
    for k, (op, kind) in enumerate(zip(graph.g.operators, op_names(model))):
        if kind not in KIND_NAMES:
            continue
        counts[kind] = counts.get(kind, 0) + 1
        name = f"{KIND_NAMES[kind]}{counts[kind]}"
        ins, outs, opts = [int(i) for i in op.inputs], [int(i) for i in op.outputs], op.builtinOptions
        x, y = ins[0], outs[0]
        if x not in tensors or y not in tensors:
            raise PeerError(f"operator {k} ({kind}): TFLite Micro kept no tensor for its input or output")
        xs, ys = graph.shape(x), graph.shape(y)
        (s_x, zp_x), (s_y, zp_y) = graph.act(x), graph.act(y)
        p = f"c{k}"
        arrays: dict[str, np.ndarray] = {f"{p}_in": tensors[x].reshape(-1).astype(np.int8)}
        want = tensors[y].reshape(-1).astype(np.int8)
        fused = getattr(opts, "fusedActivationFunction", 0) if opts is not None else 0
        act_min, act_max = _activation_range(fused, s_y, zp_y, f"operator {k}")
        act = f"{{.min = {act_min}, .max = {act_max}}}"
        if kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            w = graph.const(ins[1])
            s_w, _ = graph.quant(ins[1])
            n_out = ys[3]
            bias = graph.const(ins[2]).astype(np.int32) if len(ins) > 2 and ins[2] >= 0 else np.zeros(n_out, np.int32)
            scales = np.broadcast_to(s_w, (n_out,))
            mults, shifts = zip(*(_exp(float(np.float64(s_x) * np.float64(s) / np.float64(s_y))) for s in scales))
            sh, sw, dh, dw = int(opts.strideH), int(opts.strideW), int(opts.dilationHFactor), int(opts.dilationWFactor)
            kh, kw = w.shape[1], w.shape[2]
            same = opts.padding == graph.schema.Padding.SAME
            top = _same_pad(xs[1], (kh - 1) * dh + 1, sh, ys[1]) if same else 0
            left = _same_pad(xs[2], (kw - 1) * dw + 1, sw, ys[2]) if same else 0
            arrays |= {f"{p}_w": w.reshape(-1), f"{p}_b": bias, f"{p}_m": np.array(mults, np.int32),
                       f"{p}_s": np.array(shifts, np.int32)}
            geometry = (f".stride = {{.w = {sw}, .h = {sh}}}, .padding = {{.w = {left}, .h = {top}}}, "
                        f".dilation = {{.w = {dw}, .h = {dh}}}, .activation = {act}")
            dims = " ".join((_dims("in", 1, xs[1], xs[2], xs[3]), _dims("b", 1, 1, 1, n_out),
                             _dims("o", 1, ys[1], ys[2], n_out)))
            quant = f"cmsis_nn_per_channel_quant_params q = {{(int32_t *){p}_m, (int32_t *){p}_s}};"
            args = f"&in, {p}_in, &f, {p}_w, &b, {p}_b, &o, out"
            if kind == "CONV_2D":
                setup = (f"{dims} {_dims('f', n_out, kh, kw, w.shape[3])} {quant}\n"
                         f"    const cmsis_nn_conv_params p = {{.input_offset = {-zp_x}, .output_offset = {zp_y}, "
                         f"{geometry}}};\n"
                         "    const cmsis_nn_context ctx = scratch(arm_convolve_wrapper_s8_get_buffer_size(&p, &in, &f, &o));")
                call = f"status = arm_convolve_wrapper_s8(&ctx, &p, &q, {args});"
                macs, shape = math.prod(ys) * kh * kw * w.shape[3], f"{kh}x{kw} {xs[3]}->{n_out} over {ys[1]}x{ys[2]}"
            else:
                mult_ch = n_out // xs[3]
                setup = (f"{dims} {_dims('f', 1, kh, kw, n_out)} {quant}\n"
                         f"    const cmsis_nn_dw_conv_params p = {{.input_offset = {-zp_x}, .output_offset = {zp_y}, "
                         f".ch_mult = {mult_ch}, {geometry}}};\n"
                         "    const cmsis_nn_context ctx = scratch(arm_depthwise_conv_wrapper_s8_get_buffer_size(&p, &in, "
                         "&f, &o));")
                call = f"status = arm_depthwise_conv_wrapper_s8(&ctx, &p, &q, {args});"
                macs, shape = math.prod(ys) * kh * kw, f"dw {kh}x{kw} x{xs[3]} m{mult_ch} over {ys[1]}x{ys[2]}"
            if sh > 1 or sw > 1:
                shape += f" /{sh}x{sw}" if sh != sw else f" /{sw}"
        elif kind == "FULLY_CONNECTED":
            w = graph.const(ins[1])
            s_w, _ = graph.quant(ins[1])
            n_out, n_in = w.shape
            rows = arrays[f"{p}_in"].size // n_in
            bias = graph.const(ins[2]).astype(np.int32) if len(ins) > 2 and ins[2] >= 0 else np.zeros(n_out, np.int32)
            arrays |= {f"{p}_w": w.reshape(-1), f"{p}_b": bias}
            dims = (f"{_dims('in', rows, 1, 1, n_in)} {_dims('f', n_in, 1, 1, n_out)} {_dims('b', 1, 1, 1, n_out)} "
                    f"{_dims('o', rows, 1, 1, n_out)}\n"
                    f"    const cmsis_nn_fc_params p = {{.input_offset = {-zp_x}, .filter_offset = 0, "
                    f".output_offset = {zp_y}, .activation = {act}}};\n"
                    "    const cmsis_nn_context ctx = scratch(arm_fully_connected_s8_get_buffer_size(&f));\n"
                    f"    if (ctx.size > 0) arm_vector_sum_s8(ctx.buf, {n_in}, {n_out}, {p}_w, {-zp_x}, 0, {p}_b);")
            args = f"&ctx, &p, &q, &in, {p}_in, &f, {p}_w, &b, {p}_b, &o, out"
            if s_w.size == 1:  # TFLite Micro's per-tensor scale: the scales' product in float32, then double
                m_fc, e_fc = _exp(float(np.float32(s_x) * s_w[0]) / float(s_y))
                setup = f"{dims}\n    const cmsis_nn_per_tensor_quant_params q = {{{m_fc}, {e_fc}}};"
                call = f"status = arm_fully_connected_s8({args});"
            else:  # per channel: TFLite Micro calls arm_fully_connected_per_channel_s8
                mults, shifts = zip(*(_exp(float(np.float64(s_x) * np.float64(s) / np.float64(s_y))) for s in s_w))
                arrays |= {f"{p}_m": np.array(mults, np.int32), f"{p}_s": np.array(shifts, np.int32)}
                setup = f"{dims}\n    cmsis_nn_per_channel_quant_params q = {{(int32_t *){p}_m, (int32_t *){p}_s}};"
                call = f"status = arm_fully_connected_per_channel_s8({args});"
            macs, shape = rows * n_in * n_out, f"{n_in}->{n_out}" + (f" x{rows}" if rows > 1 else "")
        elif kind in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
            fh, fw, sh, sw = int(opts.filterHeight), int(opts.filterWidth), int(opts.strideH), int(opts.strideW)
            same = opts.padding == graph.schema.Padding.SAME
            top = _same_pad(xs[1], fh, sh, ys[1]) if same else 0
            left = _same_pad(xs[2], fw, sw, ys[2]) if same else 0
            fn = "arm_avgpool_s8" if kind == "AVERAGE_POOL_2D" else "arm_max_pool_s8"
            size = f"arm_avgpool_s8_get_buffer_size({ys[2]}, {xs[3]})" if kind == "AVERAGE_POOL_2D" else "0"
            setup = (f"{_dims('in', 1, xs[1], xs[2], xs[3])} {_dims('f', 1, fh, fw, 1)} "
                     f"{_dims('o', 1, ys[1], ys[2], ys[3])}\n"
                     f"    const cmsis_nn_pool_params p = {{.stride = {{.w = {sw}, .h = {sh}}}, "
                     f".padding = {{.w = {left}, .h = {top}}}, .activation = {act}}};\n"
                     f"    const cmsis_nn_context ctx = scratch({size});")
            call = f"status = {fn}(&ctx, &p, &in, {p}_in, &f, &o, out);"
            macs, shape = 0, f"{fh}x{fw} x{xs[3]} over {ys[1]}x{ys[2]}"
        elif kind == "ADD":
            x2 = ins[1]
            if graph.has_data(x) or graph.has_data(x2) or math.prod(graph.shape(x2)) != math.prod(xs):
                raise PeerError(f"operator {k}: an ADD of a constant or with broadcasting (not a residual ADD)")
            s_2, zp_2 = graph.act(x2)
            arrays[f"{p}_in2"] = tensors[x2].reshape(-1).astype(np.int8)
            twice_max = 2.0 * max(s_x, s_2)  # TFLite Micro's add.cc: left shift 20, multipliers below one
            (m1, e1), (m2, e2) = _exp(s_x / twice_max), _exp(s_2 / twice_max)
            m_y, e_y = _exp(twice_max / ((1 << 20) * s_y))
            setup = "const cmsis_nn_context ctx = scratch(0);\n    (void)ctx;"
            call = (f"status = arm_elementwise_add_s8({p}_in, {p}_in2, {-zp_x}, {m1}, {e1}, {-zp_2}, {m2}, {e2}, 20, out, "
                    f"{zp_y}, {m_y}, {e_y}, {act_min}, {act_max}, {want.size});")
            macs, shape = 0, f"{want.size} values"
        else:  # SOFTMAX: TFLite Micro's PreprocessSoftmaxScaling and CalculateInputRadius, 5 integer bits
            beta = float(opts.beta) if opts is not None else 1.0
            real = min(beta * s_x * (1 << (31 - 5)), (1 << 31) - 1.0)
            m_sm, e_sm = _exp(real)  # QuantizeMultiplierGreaterThanOne: a left shift
            radius = math.floor(((1 << 5) - 1) * (1 << (31 - 5)) / (1 << e_sm))
            row = xs[-1]
            setup = "const cmsis_nn_context ctx = scratch(0);\n    (void)ctx;"
            call = (f"arm_softmax_s8({p}_in, {want.size // row}, {row}, {m_sm}, {e_sm}, {-radius}, out); "
                    "status = ARM_CMSIS_NN_SUCCESS;")
            macs, shape = 0, f"{want.size // row} x {row}"
        out.append(Case(k, kind, name, arrays, setup, call, want, int(macs), shape))
    return out


def _array(name: str, a: np.ndarray) -> str:
    ctype = {np.dtype(np.int8): "int8_t", np.dtype(np.int32): "int32_t"}[a.dtype]
    body = ",".join(map(str, a.reshape(-1).tolist()))
    return f"static const {ctype} {name}[{a.size}] __attribute__((aligned(4))) = {{{body}}};\n"


MAIN = r"""
/* Generated by trickle bench/cmsis_nn.py: each operator through CMSIS-NN between two marks. */
#include <stdint.h>
#include <string.h>
#include "arm_nnfunctions.h"

void board_write(const char *s);
void semihost_exit(int ok);
__attribute__((noinline)) void tn_mark(void) { __asm__ volatile("" ::: "memory"); }

static int8_t out[OUT_BYTES] __attribute__((aligned(4)));
static int32_t scratch_buf[SCRATCH_WORDS];
static int32_t scratch_asked;
static cmsis_nn_context scratch(int32_t size) {
    if (size > (int32_t)sizeof scratch_buf) {
        board_write("SCRATCH TOO SMALL\n");
        semihost_exit(0);
    }
    cmsis_nn_context ctx = {size > 0 ? scratch_buf : NULL, size};
    scratch_asked = size;
    return ctx;
}

static char *put_int(char *p, int32_t v) {
    char tmp[12];
    int n = 0;
    uint32_t u = v < 0 ? (uint32_t)(-(v + 1)) + 1u : (uint32_t)v;
    if (v < 0) *p++ = '-';
    do { tmp[n++] = (char)('0' + u % 10u); u /= 10u; } while (u != 0u);
    while (n > 0) *p++ = tmp[--n];
    return p;
}

/* "CASE k status differing first_differing scratch_bytes" */
static void report(int32_t k, int32_t status, const int8_t *want, int32_t n) {
    int32_t differ = 0, first = -1;
    for (int32_t i = 0; i < n; i++) {
        if (out[i] != want[i]) { if (first < 0) first = i; differ++; }
    }
    char line[96], *p = line;
    const char *label = "CASE";
    while (*label) *p++ = *label++;
    const int32_t values[5] = {k, status, differ, first, scratch_asked};
    for (int i = 0; i < 5; i++) { *p++ = ' '; p = put_int(p, values[i]); }
    *p++ = '\n';
    *p = '\0';
    board_write(line);
}

int main(void) {
    tn_mark(); tn_mark(); /* the marks' own cost */
CALLS
    board_write("MISMATCHES 0\n");
    return 0;
}
"""


def harness_source(model_cases: list[Case]) -> str:
    parts = [MAIN.split("int main(void)")[0]]
    out_bytes = 1
    calls = []
    for c in model_cases:
        parts.extend(_array(n, a) for n, a in c.arrays.items())
        parts.append(_array(f"c{c.k}_want", c.want))
        parts.append(f"static void run_{c.k}(void) {{\n    arm_cmsis_nn_status status;\n    {c.setup}\n"
                     f"    memset(out, 0, {c.want.size});\n    tn_mark();\n    {c.call}\n    tn_mark();\n"
                     f"    report({c.k}, (int32_t)status, c{c.k}_want, {c.want.size});\n}}\n")
        calls.append(f"    run_{c.k}();")
        out_bytes = max(out_bytes, c.want.size)
    main = "int main(void)" + MAIN.split("int main(void)")[1].replace("CALLS", "\n".join(calls))
    head = f"#define OUT_BYTES {out_bytes}\n#define SCRATCH_WORDS {SCRATCH_WORDS}\n"
    return head + "".join(parts) + main


def build_harness(model_cases: list[Case], lib: Path, peer: Path, out: Path) -> Path:
    """The mps2-an386 program of ``model_cases`` linked with CMSIS-NN (``lib``), the board's start-up
    code and link script."""
    out.mkdir(parents=True, exist_ok=True)
    src = out / "harness.c"
    src.write_text(harness_source(model_cases))
    (out / "model.h").write_text("/* no model: the board's start-up code needs only tn.h */\n")
    elf = out / "harness.elf"
    includes = [peer / "Include", out, REPO_ROOT / "firmware" / "include", REPO_ROOT / "firmware" / "boards" / "common"]
    _run(["arm-none-eabi-gcc", *M4, "-O2", *(f"-I{d}" for d in includes),
          str(src), str(BOARD / "startup.c"), str(lib), "-T", str(BOARD / "link.ld"), "-nostartfiles", "-specs=nano.specs",
          "-Wl,--gc-sections", "-lc", "-lgcc", "-o", str(elf)], "building the CMSIS-NN harness")
    return elf


@dataclass
class LayerCount:
    """One operator's count on mps2-an386 through CMSIS-NN, and how its output compared."""

    name: str
    kind: str
    shape: str
    macs: int
    instructions: int
    cycles: int | None
    differing: int  # output bytes that differ from TFLite Micro's
    status: int  # the kernel's arm_cmsis_nn_status (0: success)
    scratch_bytes: int


def run_harness(elf: Path, model_cases: list[Case], work: Path) -> list[LayerCount]:
    """Run the program on mps2-an386 under QEMU with the counting plugin: each case's count between its
    two marks, less the marks' own cost (the first, empty, pair)."""
    from export.firmware import flash

    nv = work / "nv.bin"
    flash.fresh_nv(nv)
    rc, said, marks, _ = flash.qemu(elf, nv, work)
    cycle_marks = _cycle_marks(work)
    lines = {int(f[1]): [int(v) for v in f[2:]] for f in (ln.split() for ln in said.splitlines()) if f[:1] == ["CASE"]}
    if rc not in (0, 1) or len(lines) != len(model_cases) or len(marks) != 2 * len(model_cases) + 2:
        raise PeerError(f"the CMSIS-NN program did not finish (exit {rc}, {len(marks)} marks):\n{said[-2000:]}")

    def spans(values: list[int]) -> Iterator[int]:
        empty = values[1] - values[0]
        for a, b in zip(values[2::2], values[3::2]):
            yield b - a - empty

    cycles = list(spans(cycle_marks)) if cycle_marks else [None] * len(model_cases)
    return [LayerCount(c.name, c.kind, c.shape, c.macs, n, cy, lines[c.k][1], lines[c.k][0], lines[c.k][3])
            for c, n, cy in zip(model_cases, spans(marks), cycles)]


def _cycle_marks(work: Path) -> list[int]:
    """The cycle estimate at each mark, when the plugin wrote one (``mark INSNS CYCLES``)."""
    counts = work / "counts.txt"
    if not counts.exists():
        return []
    rows = [line.split() for line in counts.read_text().splitlines() if line.startswith("mark")]
    return [int(r[2]) for r in rows] if rows and all(len(r) > 2 for r in rows) else []


def measure_model(model: Path, x_q: np.ndarray, peer: Path, libs: dict[str, Path], work: Path) -> dict[str, Any]:
    """CMSIS-NN's count for every operator of ``model`` on the int8 input ``x_q``, at each optimization
    level; per layer the faster level's."""
    model_cases = cases(model.read_bytes(), x_q)
    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / "tflm_outputs.npz", **{c.name: c.want for c in model_cases})  # type: ignore[arg-type]
    by_level = {}
    for opt, lib in libs.items():
        here = work / opt.strip("-")
        elf = build_harness(model_cases, lib, peer, here)
        by_level[opt] = run_harness(elf, model_cases, here)
    layers = []
    for per in zip(*by_level.values()):
        best = min(per, key=lambda la: la.instructions)
        opt = list(by_level)[per.index(best)]
        layers.append({"name": best.name, "kind": best.kind, "shape": best.shape, "macs": best.macs,
                       "instructions": best.instructions, "estimated_cycles": best.cycles, "opt": opt,
                       "instructions_by_opt": {o: la.instructions for o, la in zip(by_level, per)},
                       "bit_exact_with_tflm": best.differing == 0 and all(la.differing == 0 for la in per),
                       "differing_bytes": max(la.differing for la in per), "status": best.status,
                       "scratch_bytes": best.scratch_bytes})
    return {"layers": layers}


def libraries(peer: Path, build: Path) -> dict[str, Path]:
    return {opt: build_library(peer, build / f"cmsis-nn{opt}", opt) for opt in OPT_LEVELS}
