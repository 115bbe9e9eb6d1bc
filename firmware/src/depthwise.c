/* Depthwise convolution (TFLite's DEPTHWISE_CONV_2D: cout = cin x depth multiplier), bit for bit
 * TFLite Micro's reference kernel. Per output position the window's rows and columns inside the
 * input are found once (no test per tap); four output channels are accumulated in registers, each
 * tap one word of channels-last input, widened two lanes at a time (SXTAB16 adds the input offset),
 * and the quad's two words of weights, stored widened (int16: w0, w2, w1, w3 per tap, what SXTB16
 * would unpack; export.cgen's depthwise_weights), multiplied lane by lane (SMLABB, SMLATT),
 * CMSIS-NN's manner; a depth multiplier of 2 reads two input values for the quad, a multiple of 4
 * one. Other depth multipliers take a channel at a time. A layer with a packed stream (a depth
 * multiplier of 1, whole quads: most layers, any window) takes the packed path below instead: pairs of
 * taps, two MACs per SMLAD, and a shorter output stage. */
#include "kernel.h"
#include "simd.h"

#define BLOCK 32u /* output channels accumulated together */

/* Taps k in [*k0, *k1) whose input index origin + k * dilation lies in [0, n). */
static void inside(int32_t origin, uint32_t taps, uint32_t dilation, uint32_t n, uint32_t *k0, uint32_t *k1) {
    const int32_t d = (int32_t)dilation;
    const int32_t first = origin < 0 ? (-origin + d - 1) / d : 0;
    const int32_t last = (int32_t)n - 1 - origin; /* the largest k * d that fits */
    *k0 = (uint32_t)first;
    *k1 = last < 0 ? 0u : (uint32_t)(last / d + 1) < taps ? (uint32_t)(last / d + 1) : taps;
    if (*k1 < *k0) {
        *k1 = *k0;
    }
}

#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
/* A whole 3 x 3 window for four channels on a Cortex-M4, written out (what gcc makes of the C
 * below spills its pointers around every tap): per tap the quad's two words of widened weights
 * (stored tap after tap, so a post-incremented LDRD walks them), one word of input (or, with
 * ``shared``, one input value all four channels read, or the two values a depth multiplier of 2
 * has channels 0, 1 and 2, 3 read) at x, x + x_tap or x + 2 x_tap, widened (SXTAB16 adds the input
 * offset; one value: LDRSB and an add; two: LDRH, two SXTAB16 and a PKHBT), four 16 x 16 MACs;
 * x_row bytes between rows. The same arithmetic as TN_DW_TAP: 74 instructions for 36 MACs (83 for
 * two values). */
#define TN_DW_ASM_WEIGHTS "ldrd %[t3], %[t1], [%[w]], #8\n\t"
#define TN_DW_ASM_TAP(xaddr)                                                                                          \
    TN_DW_ASM_WEIGHTS                                                                                                \
    "ldr %[t0], " xaddr "\n\tsxtab16 %[t2], %[off], %[t0]\n\tsxtab16 %[t0], %[off], %[t0], ror #8\n\t"               \
    "smlabb %[a0], %[t2], %[t3], %[a0]\n\tsmlatt %[a2], %[t2], %[t3], %[a2]\n\t"                                       \
    "smlabb %[a1], %[t0], %[t1], %[a1]\n\tsmlatt %[a3], %[t0], %[t1], %[a3]\n\t"
#define TN_DW_ASM_SHARED_TAP(xaddr) /* one input value for the four: its low half is what SMLABx read */              \
    TN_DW_ASM_WEIGHTS                                                                                                \
    "ldrsb %[t0], " xaddr "\n\tadd %[t0], %[t0], %[off]\n\t"                                                           \
    "smlabb %[a0], %[t0], %[t3], %[a0]\n\tsmlabt %[a2], %[t0], %[t3], %[a2]\n\t"                                       \
    "smlabb %[a1], %[t0], %[t1], %[a1]\n\tsmlabt %[a3], %[t0], %[t1], %[a3]\n\t"
#define TN_DW_ASM_PAIR_TAP(xaddr) /* two input values, (v0 + off, v1 + off) packed: channels 0, 1 read v0 */       \
    TN_DW_ASM_WEIGHTS                                                                                                \
    "ldrh %[t0], " xaddr "\n\tsxtab16 %[t2], %[off], %[t0]\n\tsxtab16 %[t0], %[off], %[t0], ror #8\n\t"              \
    "pkhbt %[t2], %[t2], %[t0], lsl #16\n\t"                                                                         \
    "smlabb %[a0], %[t2], %[t3], %[a0]\n\tsmlatt %[a2], %[t2], %[t3], %[a2]\n\t"                                       \
    "smlabb %[a1], %[t2], %[t1], %[a1]\n\tsmlatt %[a3], %[t2], %[t1], %[a3]\n\t"
#define TN_DW_ASM_ROW(TAP) TAP("[%[x]]") TAP("[%[x], %[xt]]") TAP("[%[x], %[xt], lsl #1]")
#define TN_DW_ASM_WINDOW(TAP)                                                                                         \
    TN_DW_ASM_ROW(TAP) "add %[x], %[x], %[xr]\n\t" TN_DW_ASM_ROW(TAP) "add %[x], %[x], %[xr]\n\t" TN_DW_ASM_ROW(TAP)
#define TN_DW_ASM_OPERANDS                                                                                            \
    : [a0] "+r"(s0), [a1] "+r"(s1), [a2] "+r"(s2), [a3] "+r"(s3), [x] "+r"(x), [w] "+r"(w), [t0] "=&r"(t0),          \
      [t1] "=&r"(t1), [t2] "=&r"(t2), [t3] "=&r"(t3)                                                                 \
    : [xt] "r"(x_tap), [xr] "r"(x_row), [off] "r"(off)                                                               \
    : "memory"
static inline __attribute__((always_inline)) void window3(int32_t *a, const int8_t *x, const int16_t *w, uint32_t x_tap,
                                                          uint32_t x_row, uint32_t off, int shared) {
    int32_t s0 = a[0], s1 = a[1], s2 = a[2], s3 = a[3];
    uint32_t t0, t1, t2, t3;
    if (shared == 2) {
        __asm__(TN_DW_ASM_WINDOW(TN_DW_ASM_PAIR_TAP) TN_DW_ASM_OPERANDS);
    } else if (shared) {
        __asm__(TN_DW_ASM_WINDOW(TN_DW_ASM_SHARED_TAP) TN_DW_ASM_OPERANDS);
    } else {
        __asm__(TN_DW_ASM_WINDOW(TN_DW_ASM_TAP) TN_DW_ASM_OPERANDS);
    }
    a[0] = s0;
    a[1] = s1;
    a[2] = s2;
    a[3] = s3;
}
#undef TN_DW_ASM_WEIGHTS
#undef TN_DW_ASM_TAP
#undef TN_DW_ASM_SHARED_TAP
#undef TN_DW_ASM_PAIR_TAP
#undef TN_DW_ASM_ROW
#undef TN_DW_ASM_WINDOW
#undef TN_DW_ASM_OPERANDS
#endif

/* One output position's channels c..c+3 over a window of `rows` x `cols` taps inside the input:
 * x at the first tap's input for channel c (``shared`` 0: the input word of channels c..c+3, a
 * depth multiplier of 1; 1: the one value all four read, a multiplier of 4k; 2: the two values
 * channels c, c+1 and c+2, c+3 read, a multiplier of 2), x_tap and x_row bytes to the next tap and
 * row; w at the first tap's weights of channels c..c+3 (the quad's taps stored in turn, 4 int16
 * apart), w_row int16 to the next row. The sums start at *a and stay in registers; a whole 3 x 3
 * window is written out on a Cortex-M4 (window3), a row of three taps unrolled elsewhere. Inlined with ``shared`` constant, so each caller gets its own loop. */
static inline __attribute__((always_inline)) void quad(int32_t *a, const int8_t *x, const int16_t *w, uint32_t rows,
                                                       uint32_t cols, uint32_t x_tap, uint32_t x_row, uint32_t w_row,
                                                       int32_t offset, int shared) {
    const uint32_t offsets = (uint32_t)(uint16_t)offset * 0x00010001u;
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
    if (rows == 3u && cols == 3u && w_row == 12u) { /* a whole 3 x 3 window (12 int16 a row) */
        window3(a, x, w, x_tap, x_row, shared == 1 ? (uint32_t)offset : offsets, shared);
        return;
    }
#endif
    int32_t a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
#define TN_DW_TAP(xp, wp)                                                                                            \
    do {                                                                                                             \
        const uint32_t we = read_u32(wp), wo = read_u32((wp) + 2); /* (w0, w2), (w1, w3) */                          \
        uint32_t xe, xo;                                                                                             \
        if (shared == 1) { /* one value: its low half is all SMLABB/SMLABT read */                                   \
            xe = xo = (uint32_t)(*(xp) + offset);                                                                    \
            a0 = smlabb(xe, we, a0);                                                                                 \
            a2 = smlabt(xe, we, a2);                                                                                 \
            a1 = smlabb(xo, wo, a1);                                                                                 \
            a3 = smlabt(xo, wo, a3);                                                                                 \
        } else if (shared == 2) { /* (v0, v1): channels 0 and 1 read v0, 2 and 3 read v1 */                         \
            xe = (uint32_t)(uint16_t)((xp)[0] + offset) | (uint32_t)((xp)[1] + offset) << 16;                        \
            a0 = smlabb(xe, we, a0);                                                                                 \
            a2 = smlatt(xe, we, a2);                                                                                 \
            a1 = smlabb(xe, wo, a1);                                                                                 \
            a3 = smlatt(xe, wo, a3);                                                                                 \
        } else { /* (x0, x2), (x1, x3), the offset added */                                                          \
            const uint32_t xs = read_u32(xp);                                                                        \
            xe = sxtab16(offsets, xs);                                                                               \
            xo = sxtab16_ror8(offsets, xs);                                                                          \
            a0 = smlabb(xe, we, a0);                                                                                 \
            a2 = smlatt(xe, we, a2);                                                                                 \
            a1 = smlabb(xo, wo, a1);                                                                                 \
            a3 = smlatt(xo, wo, a3);                                                                                 \
        }                                                                                                            \
    } while (0)
    for (; rows > 0u; rows--, x += x_row, w += w_row) {
        if (cols == 3u) {
            TN_DW_TAP(x, w);
            TN_DW_TAP(x + x_tap, w + 4);
            TN_DW_TAP(x + 2u * x_tap, w + 8);
            continue;
        }
        const int8_t *xp = x;
        const int16_t *wp = w;
        for (uint32_t k = cols; k > 0u; k--, xp += x_tap, wp += 4) {
            TN_DW_TAP(xp, wp);
        }
    }
#undef TN_DW_TAP
    a[0] = a0;
    a[1] = a1;
    a[2] = a2;
    a[3] = a3;
}

/* Four channels' sums to int8 outputs: from the layer's requantization table when it has one (its
 * rows and the clamp read once for the four), else from multiplier and shift. */
static void quad_out(const out_stage *s, const int32_t *a, int8_t *o, uint32_t c) {
    if (s->table != 0) {
        const int32_t *r = s->table + 3u * c, lo = s->act_min, hi = s->act_max;
        const int32_t v0 = row_clamped(a[0], r, lo, hi), v1 = row_clamped(a[1], r + 3, lo, hi);
        const int32_t v2 = row_clamped(a[2], r + 6, lo, hi), v3 = row_clamped(a[3], r + 9, lo, hi);
        write_u32(o, (uint32_t)(uint8_t)v0 | (uint32_t)(uint8_t)v1 << 8 | (uint32_t)(uint8_t)v2 << 16 |
                         (uint32_t)(uint8_t)v3 << 24);
        return;
    }
    o[0] = requantize_out(s, a[0], c);
    o[1] = requantize_out(s, a[1], c + 1u);
    o[2] = requantize_out(s, a[2], c + 2u);
    o[3] = requantize_out(s, a[3], c + 3u);
}

#define WINDOW_BYTES (2u * TN_MAX_COLUMN) /* the scratch a padded window is gathered into */

/* n bytes (a multiple of 4) from x to t; on a Cortex-M4 16 at a time by LDM and STM where both
 * are word aligned (as activations are: the buffers are, and cin is a multiple of 4). */
static inline __attribute__((always_inline)) void copy_words(int8_t *t, const int8_t *x, uint32_t n) {
#if defined(__thumb2__)
    if ((((uintptr_t)t | (uintptr_t)x) & 3u) == 0u) {
        for (; n >= 16u; n -= 16u) {
            __asm__ volatile("ldmia %[x]!, {r4-r7}\n\tstmia %[t]!, {r4-r7}"
                             : [x] "+r"(x), [t] "+r"(t)
                             :
                             : "r4", "r5", "r6", "r7", "memory");
        }
    }
#endif
    for (; n > 0u; n -= 4u, t += 4, x += 4) {
        write_u32(t, read_u32(x));
    }
}

/* n bytes (a multiple of 4) of t set to the word v. */
static inline __attribute__((always_inline)) void fill_words(int8_t *t, uint32_t v, uint32_t n) {
    for (; n > 0u; n -= 4u, t += 4) {
        write_u32(t, v);
    }
}

/* A 3 x 3 window that reaches into the padding, gathered into `window` tap after tap (each tap's
 * cin channels, cin a multiple of 4), the padded taps holding the input's zero point: zero point
 * + offset = 0, so they add nothing and the position runs the whole-window loop like any other.
 * Undilated along a row, a row's taps inside the input are one run: a copy and at most two fills. */
__attribute__((noinline)) static void gather3(const tn_layer *l, const int8_t *in, int8_t *window, int32_t iy0,
                                              int32_t ix0) {
    const uint32_t cin = l->cin, dh = dil_rows(l), dw = dil_cols(l), win = l->win;
    const uint32_t zp4 = (uint32_t)(uint8_t)(int8_t)-l->in_offset * 0x01010101u;
    int8_t *t = window;
    if (dw == 1u) {
        const uint32_t kx0 = ix0 < 0 ? (uint32_t)-ix0 : 0u;
        const uint32_t kx1 = ix0 + 3 > (int32_t)win ? (uint32_t)((int32_t)win - ix0) : 3u;
        const uint32_t left = kx0 * cin, run = (kx1 - kx0) * cin, right = (3u - kx1) * cin;
        for (uint32_t ky = 0; ky < 3u; ky++, t += 3u * cin) {
            const uint32_t iy = (uint32_t)(iy0 + (int32_t)(ky * dh));
            if (iy >= l->hin) { /* a negative coordinate wraps above the bound */
                fill_words(t, zp4, 3u * cin);
                continue;
            }
            fill_words(t, zp4, left);
            copy_words(t + left, in + (iy * win + (uint32_t)(ix0 + (int32_t)kx0)) * cin, run);
            fill_words(t + left + run, zp4, right);
        }
        return;
    }
    for (uint32_t ky = 0; ky < 3u; ky++) {
        const uint32_t iy = (uint32_t)(iy0 + (int32_t)(ky * dh));
        for (uint32_t kx = 0; kx < 3u; kx++, t += cin) {
            const uint32_t ix = (uint32_t)(ix0 + (int32_t)(kx * dw));
            if (iy < l->hin && ix < win) {
                copy_words(t, in + (iy * win + ix) * cin, cin);
            } else {
                fill_words(t, zp4, cin);
            }
        }
    }
}

#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
/* What dw_quads3 reads: byte offsets fixed by the assembly below. */
typedef struct {
    const int8_t *x;               /*  0: the first quad's first tap's input */
    const int16_t *w;              /*  4: and its weights */
    const int32_t *bias, *rows;    /*  8, 12: the first quad's biases and requantization rows */
    int8_t *out, *out_end;         /* 16, 20: the position's outputs */
    uint32_t x_tap, x_row;         /* 24, 28: bytes between taps and between rows */
    uint32_t offsets, lo4, hi4;    /* 32, 36, 40: the input offset in both halves; the clamp per byte */
} dw_job;

/* Every channel quad of one output position's whole 3 x 3 window on a Cortex-M4, written out as one
 * function (in C the compiler keeps the sums in memory between the window and the output stage).
 * Per quad: its four biases (LDM), window3's 36 MACs (the same taps: r4-r7 the widened input and
 * weights, r8 the input, r9 the weights, r10 and r11 the tap and row steps, r12 the offsets), the
 * output stage of mbqm_row per sum (the row by LDM; AND, ORR, ADD, SMLAL, ASR, SSAT), the four
 * bytes packed, clamped per byte (SSUB8, SEL) and stored as one word. lr holds the job. */
#define TN_DW_M4_TAP(xaddr)                                                                                           \
    "ldrd r7, r5, [r9], #8\n\t"                                                                                  \
    "ldr r4, " xaddr "\n\tsxtab16 r6, r12, r4\n\tsxtab16 r4, r12, r4, ror #8\n\t"                                 \
    "smlabb r0, r6, r7, r0\n\tsmlatt r2, r6, r7, r2\n\tsmlabb r1, r4, r5, r1\n\tsmlatt r3, r4, r5, r3\n\t"
#define TN_DW_M4_PAIR_TAP(xaddr) /* a depth multiplier of 2: two input values, channels 0 and 1 read the first */ \
    "ldrd r7, r5, [r9], #8\n\t"                                                                                  \
    "ldrh r4, " xaddr "\n\tsxtab16 r6, r12, r4\n\tsxtab16 r4, r12, r4, ror #8\n\tpkhbt r6, r6, r4, lsl #16\n\t"       \
    "smlabb r0, r6, r7, r0\n\tsmlatt r2, r6, r7, r2\n\tsmlabb r1, r6, r5, r1\n\tsmlatt r3, r6, r5, r3\n\t"
#define TN_DW_M4_ROW(TAP) TAP("[r8]") TAP("[r8, r10]") TAP("[r8, r10, lsl #1]")
#define TN_DW_M4_OUT(acc)                                                                                              \
    "ldm r9!, {r4, r5, r6}\n\tand r7, " acc ", #0x80000000\n\torr r7, r7, #0x40000000\n\t"                           \
    "add r8, r5, " acc ", asr #31\n\tsmlal r7, r8, " acc ", r4\n\tasr " acc ", r8, r6\n\tssat " acc ", #8, " acc "\n\t"
#define TN_DW_M4_CLAMP /* the fused activation's range, per byte */                                                    \
    "ldrd r4, r5, [lr, #36]\n\tssub8 r6, r0, r4\n\tsel r0, r0, r4\n\tssub8 r6, r5, r0\n\tsel r0, r0, r5\n\t"
#define TN_DW_QUADS3_ASM(CLAMP, TAP, X_STEP)                                                                           \
    "push {r4-r11, lr}\n\t"                                                                                            \
    "mov lr, r0\n\t"                                                                                                   \
    "ldrd r10, r11, [lr, #24]\n\t"                                                                                     \
    "ldr r12, [lr, #32]\n"                                                                                             \
    "1:\n\t"                                                                                                           \
    "ldrd r8, r9, [lr, #0]\n\t"                                                                                        \
    "add r4, r8, #" X_STEP "\n\t"                                                                                      \
    "str r4, [lr, #0]\n\t"                                                                                             \
    "ldr r4, [lr, #8]\n\t"                                                                                             \
    "ldmia r4!, {r0-r3}\n\t"                                                                                           \
    "str r4, [lr, #8]\n\t"                                                                                             \
    TN_DW_M4_ROW(TAP) "add r8, r8, r11\n\t" TN_DW_M4_ROW(TAP) "add r8, r8, r11\n\t" TN_DW_M4_ROW(TAP)                  \
    "str r9, [lr, #4]\n\t"                                                                                             \
    "ldr r9, [lr, #12]\n\t"                                                                                            \
    TN_DW_M4_OUT("r0") TN_DW_M4_OUT("r1") TN_DW_M4_OUT("r2") TN_DW_M4_OUT("r3")                                        \
    "str r9, [lr, #12]\n\t"                                                                                            \
    "bfi r0, r1, #8, #8\n\t"                                                                                           \
    "bfi r0, r2, #16, #8\n\t"                                                                                          \
    "bfi r0, r3, #24, #8\n\t"                                                                                          \
    CLAMP                                                                                                              \
    "ldrd r4, r5, [lr, #16]\n\t"                                                                                       \
    "str r0, [r4], #4\n\t"                                                                                             \
    "str r4, [lr, #16]\n\t"                                                                                            \
    "cmp r4, r5\n\t"                                                                                                   \
    "bne 1b\n\t"                                                                                                       \
    "pop {r4-r11, pc}"

__attribute__((naked, noinline)) static void dw_quads3(dw_job *job) {
    (void)job;
    __asm__(TN_DW_QUADS3_ASM(TN_DW_M4_CLAMP, TN_DW_M4_TAP, "4"));
}

/* The same where the activation's range is all of int8: SSAT's clamp is the whole clamp. */
__attribute__((naked, noinline)) static void dw_quads3_int8(dw_job *job) {
    (void)job;
    __asm__(TN_DW_QUADS3_ASM("", TN_DW_M4_TAP, "4"));
}

/* Both for a depth multiplier of 2: a quad reads two input values (LDRH, two SXTAB16 and a PKHBT a
 * tap: 83 instructions for 36 MACs), the next quad the next two. */
__attribute__((naked, noinline)) static void dw_pairs3(dw_job *job) {
    (void)job;
    __asm__(TN_DW_QUADS3_ASM(TN_DW_M4_CLAMP, TN_DW_M4_PAIR_TAP, "2"));
}

__attribute__((naked, noinline)) static void dw_pairs3_int8(dw_job *job) {
    (void)job;
    __asm__(TN_DW_QUADS3_ASM("", TN_DW_M4_PAIR_TAP, "2"));
}
#undef TN_DW_QUADS3_ASM
#undef TN_DW_M4_CLAMP
#undef TN_DW_M4_TAP
#undef TN_DW_M4_PAIR_TAP
#undef TN_DW_M4_ROW
#undef TN_DW_M4_OUT
#endif

/* A tile's positions through the whole 3 x 3 window (a depth multiplier of 1 or 2, cin a multiple of
 * 4, a requantization table): a window inside the input read where it lies, one at the padding
 * gathered first. Apart
 * from the general loop below, so that what stays fixed over the tile is worked out once and the
 * compiler keeps it in registers. */
__attribute__((noinline)) static void dw_whole_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile, int8_t *window,
                          const out_stage *s) {
    const uint32_t plane = (uint32_t)l->hout * l->wout, cin = l->cin, wout = l->wout;
    const uint32_t dh = dil_rows(l), dw = dil_cols(l), sh = stride_rows(l), sw = l->stride;
    const int32_t ly = (int32_t)l->hin - (int32_t)(2u * dh), lx = (int32_t)l->win - (int32_t)(2u * dw);
    const uint32_t last_y = ly > 0 ? (uint32_t)ly : 0u, last_x = lx > 0 ? (uint32_t)lx : 0u; /* origins inside: below */
    const uint32_t xt_in = dw * cin, xr_in = dh * l->win * cin;
    const uint32_t end = (tile + 1u) * TN_TILE_POSITIONS < plane ? (tile + 1u) * TN_TILE_POSITIONS : plane;
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
    const uint32_t offsets = (uint32_t)(uint16_t)l->in_offset * 0x00010001u;
    dw_job job = {0, 0, 0, 0, 0, 0, 0, 0, offsets, (uint8_t)s->act_min * 0x01010101u,
                  (uint8_t)s->act_max * 0x01010101u};
    const int int8_range = s->act_min == -128 && s->act_max == 127;
    void (*const quads)(dw_job *) = l->cout == cin ? (int8_range ? dw_quads3_int8 : dw_quads3)
                                                   : (int8_range ? dw_pairs3_int8 : dw_pairs3);
#else
    const uint32_t mult = l->cout / cin;
#endif
    for (uint32_t pos = tile * TN_TILE_POSITIONS; pos < end; pos++) {
        const uint32_t oy = pos / wout, ox = pos - oy * wout;
        const int32_t iy0 = (int32_t)(oy * sh) - (int32_t)l->pad_h, ix0 = (int32_t)(ox * sw) - (int32_t)l->pad;
        const int8_t *x = window;
        uint32_t xt = cin, xr = 3u * cin;
        if ((uint32_t)iy0 < last_y && (uint32_t)ix0 < last_x) { /* a negative origin wraps above the bound */
            x = in + ((uint32_t)iy0 * l->win + (uint32_t)ix0) * cin;
            xt = xt_in;
            xr = xr_in;
        } else {
            gather3(l, in, window, iy0, ix0);
        }
        int8_t *o = out + pos * l->cout;
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
        job.x = x; /* dw_quads3 walks x, w, bias, rows and out in the job */
        job.w = (const int16_t *)l->weight;
        job.bias = l->bias;
        job.rows = s->table;
        job.out = o;
        job.out_end = o + l->cout;
        job.x_tap = xt;
        job.x_row = xr;
        quads(&job);
#else
        for (uint32_t c = 0; c < l->cout; c += 4u) {
            int32_t a[4] = {l->bias[c], l->bias[c + 1u], l->bias[c + 2u], l->bias[c + 3u]};
            if (mult == 1u) {
                quad(a, x + c, (const int16_t *)l->weight + c * 9u, 3u, 3u, xt, xr, 12u, l->in_offset, 0);
            } else {
                quad(a, x + c / 2u, (const int16_t *)l->weight + c * 9u, 3u, 3u, xt, xr, 12u, l->in_offset, 2);
            }
            quad_out(s, a, o + c, c);
        }
#endif
    }
}

/* ---- The packed path (tn_layer.packed): a depth multiplier of 1 or 2, whole quads, any window -----
 * One output position's every quad in one pass over the packed stream. The input offset is in the
 * biases (export.cgen adds offset x the taps' sum; a gathered window's padding holds the zero point,
 * which then adds -offset x its weight: nothing, as TFLite's padding). Per pair of taps (t, t + 1),
 * TFLite's (ky, kx) order: both input words (four channels each) paired byte by byte (PKHBT, PKHTB:
 * each channel's two values in one word), sign-extended (four SXTB16), one SMLAD per channel against
 * the stream's (2 w_t, 2 w_t+1): 14 instructions for 8 MACs (a multiplier of 2: a tap's two input
 * values by LDRH, one PKHBT and two SXTB16 for the quad, 11). An odd last tap takes the lanes as they
 * come (SMLABB, SMLATT, as quad). The doubled sums leave by requant_doubled. Where the taps lie is a
 * table at the stream's head, byte offsets from the window's origin, in pairs, ending in (-1, the
 * odd last tap's offset): any window shape, dilation, or (the second table) a window gathered into
 * scratch at the padding takes the same loop. */

/* A window that reaches into the padding, gathered into `window` tap after tap (cin bytes each, the
 * padded ones the input's zero point). Undilated along a row, a row's taps inside the input are one
 * run: a copy and at most two fills. */
__attribute__((noinline)) static void gather(const tn_layer *l, const int8_t *in, int8_t *window, int32_t iy0,
                                             int32_t ix0) {
    const uint32_t cin = l->cin, dh = dil_rows(l), dw = dil_cols(l), kw = l->kw, win = l->win, row = kw * cin;
    const uint32_t zp4 = (uint32_t)(uint8_t)(int8_t)-l->in_offset * 0x01010101u;
    uint32_t kx0 = 0, kx1 = kw; /* undilated: the taps inside the input */
    if (dw == 1u) {
        kx0 = ix0 < 0 ? (uint32_t)-ix0 : 0u;
        kx1 = ix0 + (int32_t)kw > (int32_t)win ? (uint32_t)((int32_t)win - ix0) : kw;
    }
    int8_t *t = window;
    for (uint32_t ky = 0; ky < l->kh; ky++, t += row) {
        const uint32_t iy = (uint32_t)(iy0 + (int32_t)(ky * dh)); /* a negative coordinate wraps above the bound */
        if (iy >= l->hin) {
            fill_words(t, zp4, row);
        } else if (dw == 1u) {
            fill_words(t, zp4, kx0 * cin);
            copy_words(t + kx0 * cin, in + (iy * win + (uint32_t)(ix0 + (int32_t)kx0)) * cin, (kx1 - kx0) * cin);
            fill_words(t + kx1 * cin, zp4, (kw - kx1) * cin);
        } else {
            for (uint32_t kx = 0; kx < kw; kx++) {
                const uint32_t ix = (uint32_t)(ix0 + (int32_t)(kx * dw));
                if (ix < win) {
                    copy_words(t + kx * cin, in + (iy * win + ix) * cin, cin);
                } else {
                    fill_words(t + kx * cin, zp4, cin);
                }
            }
        }
    }
}

/* What dw_packed reads besides the inputs and the outputs: byte offsets fixed by the assembly below. */
typedef struct {
    const int32_t *taps;   /*  0: the tap table */
    int8_t *out_end;       /*  4: past the position's last output (written here) */
    uint32_t lo4, hi4;     /*  8, 12: the clamp per byte */
    const int32_t *quads;  /* 16: the stream's first quad */
    uint32_t cout;         /* 20: the outputs of a position */
} packed_job;
typedef void (*packed_fn)(const int8_t *x0, const int8_t *x1, int8_t *out, packed_job *job);

#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)

/* One position from x0 to out, then (x1 not 0) the next from x1 to the outputs after them, the same
 * taps. Registers: r0-r3 the doubled sums, r4 the quad's input, r5 the tap table, r6 the stream, r7-r11
 * the taps' words and weights, r12 the outputs, lr the job; x1 waits on the stack. The output stage
 * per sum, in place: the base less [acc < 0], SMMLAR, ASR, SSAT (requant_doubled), the rows by LDM;
 * the four bytes packed (BFI), clamped per byte where the range is narrower than int8 (SSUB8, SEL),
 * stored as one word. */
#define TN_DWP_PAIRS                                                                                                   \
    "ldrd r7, r8, [r5], #8\n"                                                                                          \
    "1:\n\t"                                                                                                           \
    "ldr r7, [r4, r7]\n\tldr r8, [r4, r8]\n\t"                                                                         \
    "pkhbt r9, r7, r8, lsl #16\n\tpkhtb r7, r8, r7, asr #16\n\t"                                                       \
    "sxtb16 r8, r9\n\tsxtb16 r9, r9, ror #8\n\t"                                                                       \
    "ldrd r10, r11, [r6], #8\n\tsmlad r0, r8, r10, r0\n\tsmlad r1, r9, r11, r1\n\t"                                    \
    "sxtb16 r8, r7\n\tsxtb16 r7, r7, ror #8\n\t"                                                                       \
    "ldrd r10, r11, [r6], #8\n\tsmlad r2, r8, r10, r2\n\tsmlad r3, r7, r11, r3\n\t"                                    \
    "ldrd r7, r8, [r5], #8\n\tcmp r7, #0\n\tbge 1b\n\t"
#define TN_DWP_PAIRS2 /* a depth multiplier of 2: a tap's two input values (LDRH), channels 0, 1 read the first */ \
    "ldrd r7, r8, [r5], #8\n"                                                                                          \
    "1:\n\t"                                                                                                           \
    "ldrh r7, [r4, r7]\n\tldrh r8, [r4, r8]\n\tpkhbt r9, r7, r8, lsl #16\n\t"                                           \
    "sxtb16 r8, r9\n\tsxtb16 r9, r9, ror #8\n\t"                                                                       \
    "ldrd r10, r11, [r6], #8\n\tsmlad r0, r8, r10, r0\n\tsmlad r1, r8, r11, r1\n\t"                                    \
    "ldrd r10, r11, [r6], #8\n\tsmlad r2, r9, r10, r2\n\tsmlad r3, r9, r11, r3\n\t"                                    \
    "ldrd r7, r8, [r5], #8\n\tcmp r7, #0\n\tbge 1b\n\t"
#define TN_DWP_SINGLE2 /* and its odd last tap: weights (c0, c1), (c2, c3) */                                        \
    "ldrh r7, [r4, r8]\n\tsxtb16 r8, r7\n\tsxtb16 r7, r7, ror #8\n\t"                                                   \
    "ldrd r10, r11, [r6], #8\n\tsmlabb r0, r8, r10, r0\n\tsmlabt r1, r8, r10, r1\n\t"                                  \
    "smlabb r2, r7, r11, r2\n\tsmlabt r3, r7, r11, r3\n\t"
#define TN_DWP_SINGLE /* the odd last tap, its offset in r8 */                                                        \
    "ldr r7, [r4, r8]\n\tsxtb16 r8, r7\n\tsxtb16 r7, r7, ror #8\n\t"                                                   \
    "ldrd r10, r11, [r6], #8\n\tsmlabb r0, r8, r10, r0\n\tsmlatt r2, r8, r10, r2\n\t"                                  \
    "smlabb r1, r7, r11, r1\n\tsmlatt r3, r7, r11, r3\n\t"
#define TN_DWP_OUT(acc, m, base, shift)                                                                                \
    "sub " base ", " base ", " acc ", lsr #31\n\tsmmlar " acc ", " acc ", " m ", " base "\n\t"                         \
    "asr " acc ", " acc ", " shift "\n\tssat " acc ", #8, " acc "\n\t"
#define TN_DWP_CLAMP                                                                                                   \
    "ldrd r7, r8, [lr, #8]\n\tssub8 r9, r0, r7\n\tsel r0, r0, r7\n\tssub8 r9, r8, r0\n\tsel r0, r0, r8\n\t"
#define TN_DWP_ASM(PAIRS, SINGLE, CLAMP, X_STEP)                                                                        \
    "push {r4-r11, lr}\n\t"                                                                                            \
    "str r1, [sp, #-8]!\n\t"                                                                                           \
    "mov r4, r0\n\tmov r12, r2\n\tmov lr, r3\n"                                                                        \
    "4:\n\t"                                                                                                           \
    "ldrd r6, r7, [lr, #16]\n\tadd r7, r12, r7\n\tstr r7, [lr, #4]\n"                                                  \
    "3:\n\t"                                                                                                           \
    "ldm r6!, {r0-r3}\n\t"                                                                                             \
    "ldr r5, [lr]\n\t" PAIRS SINGLE                                                                                    \
    "ldm r6!, {r5, r7-r11}\n\t" TN_DWP_OUT("r0", "r5", "r7", "r8") TN_DWP_OUT("r1", "r9", "r10", "r11")                \
    "ldm r6!, {r5, r7-r11}\n\t" TN_DWP_OUT("r2", "r5", "r7", "r8") TN_DWP_OUT("r3", "r9", "r10", "r11")                \
    "bfi r0, r1, #8, #8\n\tbfi r0, r2, #16, #8\n\tbfi r0, r3, #24, #8\n\t" CLAMP                                       \
    "str r0, [r12], #4\n\tadd r4, r4, #" X_STEP "\n\tldr r7, [lr, #4]\n\tcmp r12, r7\n\tbne 3b\n\t"                   \
    "ldr r4, [sp]\n\tmovs r7, #0\n\tstr r7, [sp]\n\tcmp r4, #0\n\tbne 4b\n\t"                                          \
    "add sp, sp, #8\n\tpop {r4-r11, pc}"

/* An even number of taps and an odd one, each with and without the per-byte clamp; a depth multiplier
 * of 1 (a quad reads a word of four input channels) and of 2 (two input values, the next quad the next
 * two). */
__attribute__((naked, noinline)) static void dw_packed_even(const int8_t *x0, const int8_t *x1, int8_t *out,
                                                            packed_job *job) {
    (void)x0, (void)x1, (void)out, (void)job;
    __asm__(TN_DWP_ASM(TN_DWP_PAIRS, "", TN_DWP_CLAMP, "4"));
}
__attribute__((naked, noinline)) static void dw_packed_even_int8(const int8_t *x0, const int8_t *x1, int8_t *out,
                                                                 packed_job *job) {
    (void)x0, (void)x1, (void)out, (void)job;
    __asm__(TN_DWP_ASM(TN_DWP_PAIRS, "", "", "4"));
}
__attribute__((naked, noinline)) static void dw_packed_odd(const int8_t *x0, const int8_t *x1, int8_t *out,
                                                           packed_job *job) {
    (void)x0, (void)x1, (void)out, (void)job;
    __asm__(TN_DWP_ASM(TN_DWP_PAIRS, TN_DWP_SINGLE, TN_DWP_CLAMP, "4"));
}
__attribute__((naked, noinline)) static void dw_packed_odd_int8(const int8_t *x0, const int8_t *x1, int8_t *out,
                                                                packed_job *job) {
    (void)x0, (void)x1, (void)out, (void)job;
    __asm__(TN_DWP_ASM(TN_DWP_PAIRS, TN_DWP_SINGLE, "", "4"));
}
__attribute__((naked, noinline)) static void dw_packed2_even(const int8_t *x0, const int8_t *x1, int8_t *out,
                                                             packed_job *job) {
    (void)x0, (void)x1, (void)out, (void)job;
    __asm__(TN_DWP_ASM(TN_DWP_PAIRS2, "", TN_DWP_CLAMP, "2"));
}
__attribute__((naked, noinline)) static void dw_packed2_even_int8(const int8_t *x0, const int8_t *x1, int8_t *out,
                                                                  packed_job *job) {
    (void)x0, (void)x1, (void)out, (void)job;
    __asm__(TN_DWP_ASM(TN_DWP_PAIRS2, "", "", "2"));
}
__attribute__((naked, noinline)) static void dw_packed2_odd(const int8_t *x0, const int8_t *x1, int8_t *out,
                                                            packed_job *job) {
    (void)x0, (void)x1, (void)out, (void)job;
    __asm__(TN_DWP_ASM(TN_DWP_PAIRS2, TN_DWP_SINGLE2, TN_DWP_CLAMP, "2"));
}
__attribute__((naked, noinline)) static void dw_packed2_odd_int8(const int8_t *x0, const int8_t *x1, int8_t *out,
                                                                 packed_job *job) {
    (void)x0, (void)x1, (void)out, (void)job;
    __asm__(TN_DWP_ASM(TN_DWP_PAIRS2, TN_DWP_SINGLE2, "", "2"));
}
#undef TN_DWP_PAIRS
#undef TN_DWP_PAIRS2
#undef TN_DWP_SINGLE
#undef TN_DWP_SINGLE2
#undef TN_DWP_OUT
#undef TN_DWP_CLAMP
#undef TN_DWP_ASM
#else
/* The same arithmetic in C (the host build): one position's quads from x to the outputs o..o_end. */
static void dw_packed_quads(const tn_layer *l, const int8_t *x, const int32_t *taps, const int32_t *w, int8_t *o,
                            const int8_t *o_end) {
    const int odd = ((uint32_t)l->kh * l->kw) % 2u == 1u;
    const uint32_t mult = l->cout / l->cin; /* 1 or 2: output k of a quad reads input k / mult */
    for (; o < o_end; o += 4, x += 4u / mult) {
        uint32_t a[4] = {(uint32_t)w[0], (uint32_t)w[1], (uint32_t)w[2], (uint32_t)w[3]}; /* wraps as SMLAD does */
        w += 4;
        const int32_t *t = taps;
        for (; t[0] >= 0; t += 2, w += 4) {
            for (uint32_t k = 0; k < 4u; k++) {
                const int32_t lo = (int16_t)(w[k] & 0xFFFF), hi = w[k] >> 16; /* 2 w_t, 2 w_t+1 */
                a[k] += (uint32_t)(x[t[0] + (int32_t)(k / mult)] * lo + x[t[1] + (int32_t)(k / mult)] * hi);
            }
        }
        if (odd) { /* t at the end mark: the last tap's offset in t[1], its weights (c0, c2), (c1, c3) or, for
                    * a multiplier of 2, (c0, c1), (c2, c3) */
            const int8_t *v = x + t[1];
            const uint32_t k1 = mult == 1u ? 2u : 1u, k2 = 3u - k1; /* the channels in w[0]'s top, w[1]'s bottom */
            a[0] += (uint32_t)(v[0] * (int16_t)(w[0] & 0xFFFF));
            a[k1] += (uint32_t)(v[k1 / mult] * (w[0] >> 16));
            a[k2] += (uint32_t)(v[k2 / mult] * (int16_t)(w[1] & 0xFFFF));
            a[3] += (uint32_t)(v[3u / mult] * (w[1] >> 16));
            w += 2;
        }
        for (uint32_t k = 0; k < 4u; k++, w += 3) {
            const int32_t v = requant_doubled((int32_t)a[k], w);
            o[k] = (int8_t)(v < l->act_min ? l->act_min : v > l->act_max ? l->act_max : v);
        }
    }
}
#endif

/* One position's quads: the window from x, its taps at `at`, to o. */
static inline __attribute__((always_inline)) void dw_packed_position(const tn_layer *l, const int8_t *x,
                                                                     const int32_t *at, const int32_t *quads,
                                                                     int8_t *o, packed_fn run, packed_job *job) {
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
    (void)l, (void)quads;
    job->taps = at;
    run(x, 0, o, job);
#else
    (void)run, (void)job;
    dw_packed_quads(l, x, at, quads, o, o + l->cout);
#endif
}

static void dw_general_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile);

/* A tile's positions through the packed stream: windows inside the input read where they lie (both
 * positions in one call), one at the padding gathered first (window: kh kw cin bytes) and read with
 * the second tap table. Written for TN_TILE_POSITIONS = 2: the second position is the first's
 * neighbour on its row, or the next row's first. */
__attribute__((noinline)) static void dw_packed_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile,
                                                     int8_t *window) {
    const uint32_t cin = l->cin, cout = l->cout, wout = l->wout, win = l->win, kh = l->kh, kw = l->kw, taps = kh * kw;
    const uint32_t p = tile * TN_TILE_POSITIONS, oy = p / wout, ox = p - oy * wout;
    const int32_t ly = (int32_t)l->hin - (int32_t)((kh - 1u) * dil_rows(l));
    const int32_t lx = (int32_t)win - (int32_t)((kw - 1u) * dil_cols(l));
    const uint32_t last_y = ly > 0 ? (uint32_t)ly : 0u, last_x = lx > 0 ? (uint32_t)lx : 0u; /* origins inside: below */
    const int32_t *const direct = l->packed, *const gathered = direct + taps + 2u, *const quads = gathered + taps + 2u;
    const int32_t iy0 = (int32_t)(oy * stride_rows(l)) - (int32_t)l->pad_h;
    const int32_t ix0 = (int32_t)(ox * l->stride) - (int32_t)l->pad;
    int32_t iy1 = iy0, ix1 = ix0 + (int32_t)l->stride; /* the second position's window */
    if (ox + 1u == wout) {
        iy1 += (int32_t)stride_rows(l);
        ix1 = -(int32_t)l->pad;
    }
    const int two = p + 1u < (uint32_t)l->hout * wout;
    int8_t *o = out + p * cout;
    packed_fn run = 0;
    packed_job job = {direct, 0, 0, 0, quads, cout};
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
    const int int8_range = l->act_min == -128 && l->act_max == 127;
    if (cout == cin) {
        run = taps % 2u == 1u ? (int8_range ? dw_packed_odd_int8 : dw_packed_odd)
                              : (int8_range ? dw_packed_even_int8 : dw_packed_even);
    } else { /* a depth multiplier of 2 */
        run = taps % 2u == 1u ? (int8_range ? dw_packed2_odd_int8 : dw_packed2_odd)
                              : (int8_range ? dw_packed2_even_int8 : dw_packed2_even);
    }
    if (!int8_range) {
        job.lo4 = (uint8_t)l->act_min * 0x01010101u;
        job.hi4 = (uint8_t)l->act_max * 0x01010101u;
    }
#endif
    /* a negative origin wraps above the bound */
    const int in0 = (uint32_t)iy0 < last_y && (uint32_t)ix0 < last_x;
    const int in1 = (uint32_t)iy1 < last_y && (uint32_t)ix1 < last_x;
    const int8_t *const x0 = in0 ? in + ((uint32_t)iy0 * win + (uint32_t)ix0) * cin : window;
    const int8_t *const x1 = in1 ? in + ((uint32_t)iy1 * win + (uint32_t)ix1) * cin : window;
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
    if (in0 && (in1 || !two)) { /* the common case: no padding, one call */
        run(x0, two ? x1 : 0, o, &job);
        return;
    }
#endif
    if ((!in0 || (two && !in1)) && taps * cin > WINDOW_BYTES) { /* a window to gather, larger than the */
        dw_general_tile(l, in, out, tile); /* scratch: export.cgen sizes it, a layer built otherwise may not */
        return;
    }
    if (!in0) {
        gather(l, in, window, iy0, ix0);
    }
    dw_packed_position(l, x0, in0 ? direct : gathered, quads, o, run, &job);
    if (two) {
        if (!in1) {
            gather(l, in, window, iy1, ix1);
        }
        dw_packed_position(l, x1, in1 ? direct : gathered, quads, o + cout, run, &job);
    }
}

/* Any depthwise conv, four channels at a time where the depth multiplier allows, the rest one by one. */
__attribute__((noinline)) static void dw_general_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile) {
    const uint32_t plane = (uint32_t)l->hout * l->wout, cout = l->cout, cin = l->cin, mult = cout / cin;
    const uint32_t dh = dil_rows(l), dw = dil_cols(l);
    const int32_t offset = l->in_offset;
    const out_stage s = stage_of(l);
    /* four channels read one input word, two input values or one */
    const int quads = mult == 1u || mult == 2u || mult % 4u == 0u;
    /* the weights, int16: each quad's taps in turn ([cout / 4][kh][kw][w0, w2, w1, w3], export.cgen's
     * depthwise_weights), then the other channels' in TFLite's order ([kh][kw][rest]) */
    const uint32_t taps = (uint32_t)l->kh * l->kw, c_rest = quads ? cout / 4u * 4u : 0u, rest = cout - c_rest;
    const int16_t *const weight = (const int16_t *)l->weight, *const rest_w = weight + c_rest * taps;
    int32_t acc[BLOCK];
    for (uint32_t pos = tile * TN_TILE_POSITIONS; pos < plane && pos < (tile + 1u) * TN_TILE_POSITIONS; pos++) {
        const int32_t iy0 = (int32_t)(pos / l->wout * stride_rows(l)) - (int32_t)l->pad_h;
        const int32_t ix0 = (int32_t)(pos % l->wout * l->stride) - (int32_t)l->pad;
        uint32_t ky0, ky1, kx0, kx1;
        inside(iy0, l->kh, dh, l->hin, &ky0, &ky1);
        inside(ix0, l->kw, dw, l->win, &kx0, &kx1);
        const uint32_t rows = ky1 - ky0, cols = kx1 - kx0;
        const uint32_t x_tap = dw * cin, x_row = dh * l->win * cin, w_row = l->kw * 4u;
        const uint32_t first = ((uint32_t)(iy0 + (int32_t)(ky0 * dh)) * l->win + (uint32_t)(ix0 + (int32_t)(kx0 * dw))) * cin;
        const int16_t *w0 = weight + (ky0 * l->kw + kx0) * 4u; /* quad 0's first tap inside the input */
        int8_t *o = out + pos * cout;
        uint32_t c = 0;
        if (quads && mult == 1u) {
            for (; c + 4u <= cout; c += 4u) {
                int32_t a[4] = {l->bias[c], l->bias[c + 1u], l->bias[c + 2u], l->bias[c + 3u]};
                quad(a, in + first + c, w0 + c * taps, rows, cols, x_tap, x_row, w_row, offset, 0);
                quad_out(&s, a, o + c, c);
            }
        } else if (quads && mult == 2u) {
            for (; c + 4u <= cout; c += 4u) {
                int32_t a[4] = {l->bias[c], l->bias[c + 1u], l->bias[c + 2u], l->bias[c + 3u]};
                quad(a, in + first + c / 2u, w0 + c * taps, rows, cols, x_tap, x_row, w_row, offset, 2);
                quad_out(&s, a, o + c, c);
            }
        } else if (quads) {
            for (; c + 4u <= cout; c += 4u) {
                int32_t a[4] = {l->bias[c], l->bias[c + 1u], l->bias[c + 2u], l->bias[c + 3u]};
                quad(a, in + first + c / mult, w0 + c * taps, rows, cols, x_tap, x_row, w_row, offset, 1);
                quad_out(&s, a, o + c, c);
            }
        }
        for (uint32_t cb = c; cb < cout; cb += BLOCK) { /* the rest, a channel at a time */
            const uint32_t n = cout - cb < BLOCK ? cout - cb : BLOCK;
            for (uint32_t i = 0; i < n; i++) {
                acc[i] = l->bias[cb + i];
            }
            for (uint32_t ky = ky0; ky < ky1; ky++) {
                const uint32_t iy = (uint32_t)(iy0 + (int32_t)(ky * dh));
                for (uint32_t kx = kx0; kx < kx1; kx++) {
                    const uint32_t ix = (uint32_t)(ix0 + (int32_t)(kx * dw));
                    const int8_t *x = in + (iy * l->win + ix) * cin;
                    const int16_t *w = rest_w + (ky * l->kw + kx) * rest + (cb - c_rest);
                    if (mult == 1u) {
                        x += cb;
                        for (uint32_t i = 0; i < n; i++) {
                            acc[i] += (x[i] + offset) * w[i];
                        }
                    } else {
                        for (uint32_t i = 0; i < n; i++) {
                            acc[i] += (x[(cb + i) / mult] + offset) * w[i];
                        }
                    }
                }
            }
            for (uint32_t i = 0; i < n; i++) {
                out[pos * cout + cb + i] = requantize_out(&s, acc[i], cb + i);
            }
        }
    }
}

void tn_dwconv_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile, int8_t *window) {
    if (l->packed != 0) {
        dw_packed_tile(l, in, out, tile, window);
    } else if ((l->cout == l->cin || l->cout == 2u * l->cin) && l->cin % 4u == 0u && l->kh == 3u && l->kw == 3u &&
               9u * l->cin <= WINDOW_BYTES && l->requant != 0) { /* a 3 x 3 window of whole quads, a table */
        const out_stage s = stage_of(l);
        dw_whole_tile(l, in, out, tile, window, &s);
    } else {
        dw_general_tile(l, in, out, tile);
    }
}
