/* Convolution (1-D and 2-D), int8 -> int8 with TFLite's requantization: the tiled kernel (an
 * im2col column of TN_TILE_POSITIONS positions, two MACs per SMLAD on a Cortex-M4) and the plain
 * one, the benchmark's baseline. The weights are int16 (export.cgen's conv_rows widens them when it
 * writes the model), so the inner loop only loads and multiplies: no SXTB16 per weight word. */
#include "kernel.h"
#include "simd.h"

uint32_t tn_depth(const tn_layer *l) {
    return ((uint32_t)l->cin * l->kh * l->kw + 3u) & ~3u;
}

/* Where tap k of output channel oc's int16 weight is stored: channels 2p and 2p + 1 take turns
 * group of four taps by group (an odd last channel's row follows whole), the taps in order. */
static uint32_t stored(const tn_layer *l, uint32_t depth, uint32_t oc, uint32_t k) {
    if ((oc | 1u) >= l->cout) { /* the odd last channel */
        return oc * depth + k;
    }
    return (oc & ~1u) * depth + (k & ~3u) * 2u + (oc & 1u) * 4u + (k & 3u);
}

static const int16_t *weights16(const tn_layer *l) { /* word aligned (export.cgen) */
    return (const int16_t *)(const void *)l->weight;
}

/* The plain kernel: every tap checks the padding, one MAC at a time. The benchmark's baseline. */
void tn_conv_tile_reference(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile, int16_t *column) {
    (void)column;
    const uint32_t depth = tn_depth(l), plane = (uint32_t)l->hout * l->wout;
    const uint32_t sh = stride_rows(l), dh = dil_rows(l), dw = dil_cols(l);
    const out_stage s = stage_of(l);
    for (uint32_t pos = tile * TN_TILE_POSITIONS; pos < plane && pos < (tile + 1u) * TN_TILE_POSITIONS; pos++) {
        const uint32_t oy = pos / l->wout, ox = pos % l->wout;
        for (uint32_t oc = 0; oc < l->cout; oc++) {
            int32_t acc = l->bias[oc];
            uint32_t k = 0;
            for (uint32_t ky = 0; ky < l->kh; ky++) {
                int32_t iy = (int32_t)(oy * sh + ky * dh) - (int32_t)l->pad_h;
                for (uint32_t kx = 0; kx < l->kw; kx++) {
                    int32_t ix = (int32_t)(ox * l->stride + kx * dw) - (int32_t)l->pad;
                    for (uint32_t ic = 0; ic < l->cin; ic++, k++) {
                        if (iy < 0 || iy >= (int32_t)l->hin || ix < 0 || ix >= (int32_t)l->win) {
                            continue;
                        }
                        int32_t x = in[((uint32_t)iy * l->win + (uint32_t)ix) * l->cin + ic];
                        int32_t w = weights16(l)[stored(l, depth, oc, k)];
                        acc += (x + l->in_offset) * w;
                    }
                }
            }
            out[pos * l->cout + oc] = requantize_out(&s, acc, oc);
        }
    }
}

#if defined(__ARM_FEATURE_DSP)
/* dst[i] = src[i] + offset as int16, four at a time: two SXTAB16 widen and add, two PKH
 * restore the order. */
static void widen(int16_t *dst, const int8_t *src, uint32_t n, int32_t offset) {
    const uint32_t offsets = (uint32_t)(uint16_t)offset * 0x00010001u;
    for (; n >= 4u; n -= 4u, src += 4, dst += 4) {
        const uint32_t x = read_u32(src);
        const uint32_t even = sxtab16(offsets, x), odd = sxtab16_ror8(offsets, x); /* (x0, x2), (x1, x3) */
        write_u32(dst, pkhbt16(even, odd));
        write_u32(dst + 2, pkhtb16(odd, even));
    }
    for (; n > 0u; n--) {
        *dst++ = (int16_t)(*src++ + offset);
    }
}
#else
static void widen(int16_t *dst, const int8_t *src, uint32_t n, int32_t offset) {
    for (uint32_t i = 0; i < n; i++) {
        dst[i] = (int16_t)(src[i] + offset);
    }
}
#endif

static void zero(int16_t *dst, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        dst[i] = 0;
    }
}

/* im2col of a dilated window: tap by tap, each tap cin values (or zeros in the padding). */
static void fill_column_dilated(const tn_layer *l, const int8_t *in, int16_t *column, uint32_t pos) {
    const uint32_t cin = l->cin, dh = dil_rows(l), dw = dil_cols(l);
    const int32_t iy0 = (int32_t)(pos / l->wout * stride_rows(l)) - (int32_t)l->pad_h;
    const int32_t ix0 = (int32_t)(pos % l->wout * l->stride) - (int32_t)l->pad;
    int16_t *c = column;
    for (uint32_t ky = 0; ky < l->kh; ky++) {
        const int32_t iy = iy0 + (int32_t)(ky * dh);
        for (uint32_t kx = 0; kx < l->kw; kx++, c += cin) {
            const int32_t ix = ix0 + (int32_t)(kx * dw);
            if (iy < 0 || iy >= (int32_t)l->hin || ix < 0 || ix >= (int32_t)l->win) {
                zero(c, cin);
            } else {
                widen(c, in + ((uint32_t)iy * l->win + (uint32_t)ix) * cin, cin, l->in_offset);
            }
        }
    }
    zero(c, (uint32_t)(column + tn_depth(l) - c));
}

/* A one-channel undilated 3 x 3 window whose first tap is (iy0, ix0), as int16 with the input
 * offset added and zeros in the padding, then the three zeros up to depth 12: written out (the
 * general fill below costs a call per row, more than the row's three values). */
static inline __attribute__((always_inline)) void fill_one_channel3(const int8_t *in, int16_t *c, int32_t iy0,
                                                                    int32_t ix0, uint32_t hin, uint32_t win,
                                                                    int16_t offset) {
    if (iy0 >= 0 && ix0 >= 0 && iy0 + 3 <= (int32_t)hin && ix0 + 3 <= (int32_t)win) { /* inside the input */
        const int8_t *src = in + (uint32_t)iy0 * win + (uint32_t)ix0;
        const int16_t x0 = src[0], x1 = src[1], x2 = src[2];
        const int16_t x3 = src[win], x4 = src[win + 1u], x5 = src[win + 2u];
        const int16_t x6 = src[2u * win], x7 = src[2u * win + 1u], x8 = src[2u * win + 2u];
        c[0] = (int16_t)(x0 + offset);
        c[1] = (int16_t)(x1 + offset);
        c[2] = (int16_t)(x2 + offset);
        c[3] = (int16_t)(x3 + offset);
        c[4] = (int16_t)(x4 + offset);
        c[5] = (int16_t)(x5 + offset);
        c[6] = (int16_t)(x6 + offset);
        c[7] = (int16_t)(x7 + offset);
        c[8] = (int16_t)(x8 + offset);
    } else {
        int16_t *t = c;
        for (uint32_t ky = 0; ky < 3u; ky++, t += 3) {
            const uint32_t iy = (uint32_t)(iy0 + (int32_t)ky); /* a negative coordinate wraps above the bound */
            for (uint32_t kx = 0; kx < 3u; kx++) {
                const uint32_t ix = (uint32_t)(ix0 + (int32_t)kx);
                t[kx] = iy < hin && ix < win ? (int16_t)(in[iy * win + ix] + offset) : 0;
            }
        }
    }
    c[9] = 0;
    c[10] = 0;
    c[11] = 0;
}

/* The columns of a tile's two output positions (p and p + 1; `two` = 0: p alone) for a one-channel
 * undilated 3 x 3 conv, the geometry worked out once for both. */
__attribute__((noinline)) static void fill_tile_one_channel3(const tn_layer *l, const int8_t *in, int16_t *column,
                                                             uint32_t p, int two) {
    const uint32_t wout = l->wout, oy = p / wout, ox = p - oy * wout, sh = stride_rows(l), sw = l->stride;
    const int16_t offset = (int16_t)l->in_offset;
    const int32_t iy0 = (int32_t)(oy * sh) - (int32_t)l->pad_h, ix0 = (int32_t)(ox * sw) - (int32_t)l->pad;
    fill_one_channel3(in, column, iy0, ix0, l->hin, l->win, offset);
    if (two) {
        const int last = ox + 1u == wout; /* the next position starts the next row */
        fill_one_channel3(in, column + 12, last ? iy0 + (int32_t)sh : iy0, last ? -(int32_t)l->pad : ix0 + (int32_t)sw,
                          l->hin, l->win, offset);
    }
}

/* im2col: the receptive field of output position `pos` as int16, the input offset added, with
 * zeros for the padding and for the tail up to a multiple of four taps. In HWC a window row
 * inside the input is one contiguous run, so a position costs kh runs, not kh * cin. */
static void fill_column(const tn_layer *l, const int8_t *in, int16_t *column, uint32_t pos) {
    if (l->dil_h > 1u || l->dil_w > 1u) {
        fill_column_dilated(l, in, column, pos);
        return;
    }
    const uint32_t kh = l->kh, kw = l->kw, hin = l->hin, win = l->win, cin = l->cin;
    const int32_t iy0 = (int32_t)(pos / l->wout * stride_rows(l)) - (int32_t)l->pad_h;
    const int32_t ix0 = (int32_t)(pos % l->wout * l->stride) - (int32_t)l->pad;
    const uint32_t ky0 = iy0 < 0 ? (uint32_t)-iy0 : 0u, kx0 = ix0 < 0 ? (uint32_t)-ix0 : 0u;
    const uint32_t ky1 = iy0 + (int32_t)kh > (int32_t)hin ? (uint32_t)((int32_t)hin - iy0) : kh;
    const uint32_t kx1 = ix0 + (int32_t)kw > (int32_t)win ? (uint32_t)((int32_t)win - ix0) : kw;
    const uint32_t row = kw * cin, left = kx0 * cin, run = (kx1 - kx0) * cin, right = (kw - kx1) * cin;
    const int8_t *src = in + ((uint32_t)(iy0 + (int32_t)ky0) * win + (uint32_t)(ix0 + (int32_t)kx0)) * cin;
    int16_t *c = column;
    if (ky0 == 0u && ky1 == kh && run == row) { /* the window inside the input: kh runs, no padding */
        if (kh == 1u) {
            widen(c, src, row, l->in_offset);
        } else {
            for (uint32_t ky = 0; ky < kh; ky++, src += win * cin, c += row) {
                widen(c, src, row, l->in_offset);
            }
        }
        for (uint32_t k = kh * row; k < tn_depth(l); k++) { /* the tail to a multiple of four */
            column[k] = 0;
        }
        return;
    }
    zero(c, ky0 * row);
    c += ky0 * row;
    for (uint32_t ky = ky0; ky < ky1; ky++, src += win * cin) {
        zero(c, left);
        widen(c + left, src, run, l->in_offset);
        zero(c + left + run, right);
        c += row;
    }
    zero(c, (uint32_t)(column + tn_depth(l) - c));
}

#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
/* The inner loop of the fast kernel on a Cortex-M4, written out (for the layers without a
 * requantization table; conv_pairs below runs the others): per four taps two LDRD of the channel
 * pair's int16 weight words, and for each position an LDRD of its two column words and four SMLAD:
 * 14 instructions for 16 MACs. The C loop is the same arithmetic, which the host build runs.
 * depth >= 4: the loop runs at least once. */
static inline __attribute__((always_inline)) void pair_dot(const int16_t *w, const int16_t *pa, const int16_t *pb,
                                                           const int16_t *end, int32_t *a0, int32_t *a1, int32_t *b0,
                                                           int32_t *b1) {
    int32_t sa0 = *a0, sa1 = *a1, sb0 = *b0, sb1 = *b1;
    uint32_t v0, v1, h0, h1, x0, x1;
    __asm__("1:\n\t"
            "ldrd %[v0], %[h0], [%[w]], #8\n\t"
            "ldrd %[v1], %[h1], [%[w]], #8\n\t"
            "ldrd %[x0], %[x1], [%[pa]], #8\n\t"
            "smlad %[a0], %[x0], %[v0], %[a0]\n\t"
            "smlad %[a0], %[x1], %[h0], %[a0]\n\t"
            "smlad %[a1], %[x0], %[v1], %[a1]\n\t"
            "smlad %[a1], %[x1], %[h1], %[a1]\n\t"
            "ldrd %[x0], %[x1], [%[pb]], #8\n\t"
            "smlad %[b0], %[x0], %[v0], %[b0]\n\t"
            "smlad %[b0], %[x1], %[h0], %[b0]\n\t"
            "smlad %[b1], %[x0], %[v1], %[b1]\n\t"
            "smlad %[b1], %[x1], %[h1], %[b1]\n\t"
            "cmp %[pa], %[end]\n\t"
            "bne 1b"
            : [a0] "+r"(sa0), [a1] "+r"(sa1), [b0] "+r"(sb0), [b1] "+r"(sb1), [w] "+r"(w), [pa] "+r"(pa),
              [pb] "+r"(pb), [v0] "=&r"(v0), [v1] "=&r"(v1), [h0] "=&r"(h0), [h1] "=&r"(h1), [x0] "=&r"(x0),
              [x1] "=&r"(x1)
            : [end] "r"(end)
            : "cc", "memory");
    *a0 = sa0;
    *a1 = sa1;
    *b0 = sb0;
    *b1 = sb1;
}
#endif

#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
/* What conv_pairs reads: byte offsets fixed by the assembly below. */
typedef struct {
    const int16_t *w;               /*  0: the first pair's weights (pairs follow one another) */
    const int16_t *ca, *cb, *ca_end; /*  4,  8, 12: the two columns, the first one's end */
    const int32_t *bias, *rows;     /* 16, 20: the first pair's biases and requantization rows */
    int8_t *oa, *ob;                /* 24, 28: where the first pair's outputs go at the two positions */
    const int16_t *w_end;           /* 32: past the last pair's weights */
    uint32_t lo4, hi4;              /* 36, 40: the clamp's bounds, one per byte */
} pair_job;

/* Every channel pair of a tile on a Cortex-M4, written out as one function (in C the compiler
 * spills the loop's pointers around each pair: 32 instructions of setup and a reloaded clamp per
 * output). Per pair: the biases (LDRD), the dot products, then the output stage of mbqm_row for the
 * four sums (the table row read once for both positions; AND, ORR, ADD, SMLAL, ASR and SSAT per
 * output), the four bytes packed into one word, clamped per byte (SSUB8 sets a lane's GE flag, SEL
 * picks: the clamp of four outputs in four instructions) and stored as a halfword at each position.
 * The dot products take four taps a step: one LDM of the pair's four int16 weight words, for each
 * position one LDRD of its two column words and four SMLAD (11 instructions, and by the Cortex-M4's
 * timings 19 cycles, for 16 MACs), four steps a turn of the loop, whose test and branch cost 2 more
 * instructions and 4 cycles (a count of steps not a multiple of four enters where that many remain). Registers: r0-r3 the sums
 * a0, a1, b0, b1; r4-r7 the weights; r8 and lr a column's two words (the job's pointer, in lr
 * otherwise, waits on the stack); r9 the weights' pointer; r10, r11 the columns' pointers; r12 the
 * first column's end. With a lone last position cb = ca and ob = oa, so the second store rewrites
 * the first's bytes with the same values. */
#define TN_CONV_ASM_STEP                                                                                               \
    "ldm r9!, {r4, r5, r6, r7}\n\t"                                                                                    \
    "ldrd r8, lr, [r10], #8\n\t"                                                                                       \
    "smlad r0, r8, r4, r0\n\tsmlad r0, lr, r5, r0\n\tsmlad r1, r8, r6, r1\n\tsmlad r1, lr, r7, r1\n\t"                 \
    "ldrd r8, lr, [r11], #8\n\t"                                                                                       \
    "smlad r2, r8, r4, r2\n\tsmlad r2, lr, r5, r2\n\tsmlad r3, r8, r6, r3\n\tsmlad r3, lr, r7, r3\n\t"
#define TN_CONV_ASM_ROW "ldm r12!, {r4, r5, r6}\n\t"
#define TN_CONV_ASM_OUT(acc, hi)                                                                                    \
    "and r7, " acc ", #0x80000000\n\torr r7, r7, #0x40000000\n\tadd " hi ", r5, " acc ", asr #31\n\t"               \
    "smlal r7, " hi ", " acc ", r4\n\tasr " acc ", " hi ", r6\n\tssat " acc ", #8, " acc "\n\t"
#define TN_CONV_ASM_CLAMP /* the fused activation's range, per byte */                                                 \
    "ldrd r4, r5, [lr, #36]\n\tssub8 r6, r0, r4\n\tsel r0, r0, r4\n\tssub8 r6, r5, r0\n\tsel r0, r0, r5\n\t"
#define TN_CONV_PAIRS_ASM(CLAMP)                                                                                       \
    "push {r4-r11, lr}\n\t"                                                                                            \
    "mov lr, r0\n\t"                                                                                                   \
    "ldr r9, [lr, #0]\n"                                                                                               \
    "1:\n\t"                                                                                                           \
    "ldrd r10, r11, [lr, #4]\n\t"                                                                                      \
    "ldrd r12, r8, [lr, #12]\n\t"                                                                                      \
    "ldrd r0, r1, [r8], #8\n\t"                                                                                        \
    "str r8, [lr, #16]\n\t"                                                                                            \
    "mov r2, r0\n\t"                                                                                                   \
    "mov r3, r1\n"                                                                                                     \
    "sub r8, r12, r10\n\t"                                                                                             \
    "str lr, [sp, #-4]!\n\t"                                                                                           \
    "ands r8, r8, #24\n\t" /* 8 x (the steps mod 4): enter where that many remain */                                   \
    "beq 2f\n\t"                                                                                                       \
    "cmp r8, #16\n\t"                                                                                                  \
    "beq 4f\n\t"                                                                                                       \
    "bhi 3f\n\t"                                                                                                       \
    "b 5f\n"                                                                                                           \
    "2:\n\t" TN_CONV_ASM_STEP "3:\n\t" TN_CONV_ASM_STEP "4:\n\t" TN_CONV_ASM_STEP "5:\n\t" TN_CONV_ASM_STEP            \
    "cmp r10, r12\n\t"                                                                                                 \
    "bne 2b\n\t"                                                                                                       \
    "ldr lr, [sp], #4\n\t"                                                                                             \
    /* the output stage: r4 multiplier, r5 base, r6 shift; r7, r8 the 64-bit sum */                                    \
    "ldr r12, [lr, #20]\n\t"                                                                                           \
    TN_CONV_ASM_ROW TN_CONV_ASM_OUT("r0", "r8") TN_CONV_ASM_OUT("r2", "r5")                                            \
    TN_CONV_ASM_ROW TN_CONV_ASM_OUT("r1", "r8") TN_CONV_ASM_OUT("r3", "r5")                                            \
    "str r12, [lr, #20]\n\t"                                                                                           \
    "bfi r0, r1, #8, #8\n\t"                                                                                           \
    "bfi r2, r3, #8, #8\n\t"                                                                                           \
    "pkhbt r0, r0, r2, lsl #16\n\t"                                                                                    \
    CLAMP                                                                                                              \
    "ldrd r4, r5, [lr, #24]\n\t"                                                                                       \
    "strh r0, [r4], #2\n\t"                                                                                            \
    "lsr r0, r0, #16\n\t"                                                                                              \
    "strh r0, [r5], #2\n\t"                                                                                            \
    "strd r4, r5, [lr, #24]\n\t"                                                                                       \
    "ldr r4, [lr, #32]\n\t"                                                                                            \
    "cmp r9, r4\n\t"                                                                                                   \
    "bne 1b\n\t"                                                                                                       \
    "pop {r4-r11, pc}"

__attribute__((naked, noinline)) static void conv_pairs(pair_job *job) {
    (void)job;
    __asm__(TN_CONV_PAIRS_ASM(TN_CONV_ASM_CLAMP));
}

/* The same where the activation's range is all of int8 (no fused activation, or a ReLU whose zero
 * point is -128): SSAT's clamp is the whole clamp. */
__attribute__((naked, noinline)) static void conv_pairs_int8(pair_job *job) {
    (void)job;
    __asm__(TN_CONV_PAIRS_ASM(""));
}
#undef TN_CONV_PAIRS_ASM
#undef TN_CONV_ASM_STEP
#undef TN_CONV_ASM_ROW
#undef TN_CONV_ASM_OUT
#undef TN_CONV_ASM_CLAMP
#endif

/* ---- The packed pointwise path (tn_layer.packed): a 1 x 1 conv over 8 or 16 input channels ------
 * Few input channels leave the column path little to share: a tile's 2 x cin values are widened, stored
 * and reloaded by every channel pair, and each pair's setup and output stage weigh on its 32 (cin 8)
 * MACs. Here a position's input stays in registers (cin 8: four words, cin 16: eight, widened by
 * SXTAB16 with the input offset added, lanes (x0, x2), (x1, x3), ...), and the stream gives each output
 * channel its doubled bias, its weights widened to int16 and doubled in the same lanes (one LDM or
 * LDRD per two to four words, no SXTB16) and its output stage row (requant_doubled): per channel
 * cin / 2 SMLADs. Two channels a block for cin 8 (the LDM of four weight words fits beside the four
 * input registers), one for cin 16. Only for an output range of all int8 (SSAT is the clamp; each
 * output one STRB). */
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
/* What conv_pw8 and conv_pw16 read besides the inputs and the outputs: byte offsets fixed below. */
typedef struct {
    const int32_t *stream; /* 0 */
    uint32_t cout;         /* 4: the outputs of a position */
    uint32_t offsets;      /* 8: the input offset in both halves */
} pw_job;

/* cin 8, two channels a block, the tile's positions in turn: x0's outputs at out, then (x1 not 0)
 * x1's after them. Registers: r0-r3 the widened input, r4 the stream, r5 the outputs, r6 their end,
 * r7 and r8 the doubled sums, r9-r12 the weights, then the rows (one LDM loads both biases and the
 * first channel's weights), lr the job; x1 waits on the stack. */
#define TN_PW_OUT(acc)                                                                                                 \
    "ldm r4!, {r9-r11}\n\tsub r10, r10, " acc ", lsr #31\n\tsmmlar " acc ", " acc ", r9, r10\n\t"                      \
    "asr " acc ", " acc ", r11\n\tssat " acc ", #8, " acc "\n\tstrb " acc ", [r5], #1\n\t"
#define TN_PW_DOT4(acc)                                                                                                \
    "smlad " acc ", r0, r9, " acc "\n\tsmlad " acc ", r1, r10, " acc "\n\t"                                            \
    "smlad " acc ", r2, r11, " acc "\n\tsmlad " acc ", r3, r12, " acc "\n\t"
__attribute__((naked, noinline)) static void conv_pw8(const int8_t *x0, const int8_t *x1, int8_t *out,
                                                      const pw_job *job) {
    (void)x0, (void)x1, (void)out, (void)job;
    __asm__("push {r4-r11, lr}\n\t"
            "str r1, [sp, #-8]!\n\t"
            "mov lr, r3\n\tmov r5, r2\n\tmov r7, r0\n"
            "2:\n\t"
            "ldr r12, [lr, #8]\n\tldr r8, [r7, #4]\n\tldr r7, [r7]\n\t"
            "sxtab16 r0, r12, r7\n\tsxtab16 r1, r12, r7, ror #8\n\t"
            "sxtab16 r2, r12, r8\n\tsxtab16 r3, r12, r8, ror #8\n\t"
            "ldrd r4, r6, [lr]\n\tadd r6, r5, r6\n"
            "1:\n\t"
            "ldm r4!, {r7-r12}\n\t" TN_PW_DOT4("r7") "ldm r4!, {r9-r12}\n\t" TN_PW_DOT4("r8") TN_PW_OUT("r7")
            TN_PW_OUT("r8") "cmp r5, r6\n\tbne 1b\n\t"
            "ldr r7, [sp]\n\tmovs r8, #0\n\tstr r8, [sp]\n\tcmp r7, #0\n\tbne 2b\n\t"
            "add sp, sp, #8\n\t"
            "pop {r4-r11, pc}");
}
#undef TN_PW_OUT
#undef TN_PW_DOT4

/* cin 16, a channel a block, the positions as conv_pw8's. Registers: r0-r7 the widened input, r8 the
 * stream, r9 the outputs, r10 their end, r11 the doubled sum, r12 and lr two weight words, then the
 * row; the job and x1 on the stack. */
#define TN_PW_DOT2(a, b) "ldrd r12, lr, [r8], #8\n\tsmlad r11, " a ", r12, r11\n\tsmlad r11, " b ", lr, r11\n\t"
__attribute__((naked, noinline)) static void conv_pw16(const int8_t *x0, const int8_t *x1, int8_t *out,
                                                       const pw_job *job) {
    (void)x0, (void)x1, (void)out, (void)job;
    __asm__("push {r4-r11, lr}\n\t"
            "strd r1, r3, [sp, #-8]!\n\t"
            "mov r9, r2\n\tmov r8, r0\n"
            "2:\n\t"
            "ldr r12, [r3, #8]\n\t"
            "ldr r4, [r8]\n\tldr r5, [r8, #4]\n\tldr r6, [r8, #8]\n\tldr r7, [r8, #12]\n\t"
            "sxtab16 r0, r12, r4\n\tsxtab16 r1, r12, r4, ror #8\n\t"
            "sxtab16 r2, r12, r5\n\tsxtab16 r3, r12, r5, ror #8\n\t"
            "sxtab16 r4, r12, r6\n\tsxtab16 r5, r12, r6, ror #8\n\t"
            "sxtab16 r6, r12, r7\n\tsxtab16 r7, r12, r7, ror #8\n\t"
            "ldr lr, [sp, #4]\n\tldrd r8, r10, [lr]\n\tadd r10, r9, r10\n"
            "1:\n\t"
            "ldr r11, [r8], #4\n\t" TN_PW_DOT2("r0", "r1") TN_PW_DOT2("r2", "r3") TN_PW_DOT2("r4", "r5")
            TN_PW_DOT2("r6", "r7")
            "ldrd r12, lr, [r8], #8\n\tsub lr, lr, r11, lsr #31\n\tsmmlar r11, r11, r12, lr\n\t"
            "ldr r12, [r8], #4\n\tasr r11, r11, r12\n\tssat r11, #8, r11\n\tstrb r11, [r9], #1\n\t"
            "cmp r9, r10\n\tbne 1b\n\t"
            "ldrd r8, r3, [sp]\n\tmovs r0, #0\n\tstr r0, [sp]\n\tcmp r8, #0\n\tbne 2b\n\t"
            "add sp, sp, #8\n\t"
            "pop {r4-r11, pc}");
}
#undef TN_PW_DOT2
#else
/* The same arithmetic in C (the host build): blocks of `block` channels, each its doubled biases, its
 * weights (per input word (x0, x2), (x1, x3) as int16 halves) and its rows. */
static void conv_pw(const int8_t *x, const int32_t *w, int8_t *out, const int8_t *out_end, int32_t offset,
                    uint32_t cin, uint32_t block) {
    for (; out < out_end; out += block) {
        const int32_t *weights = w + block, *rows = weights + block * cin / 2u;
        for (uint32_t k = 0; k < block; k++) {
            uint32_t acc = (uint32_t)w[k]; /* wraps as SMLAD does */
            for (uint32_t i = 0; i < cin; i += 4u) {
                const int32_t even = *weights++, odd = *weights++;
                acc += (uint32_t)((x[i] + offset) * (int16_t)(even & 0xFFFF) + (x[i + 2u] + offset) * (even >> 16) +
                                  (x[i + 1u] + offset) * (int16_t)(odd & 0xFFFF) + (x[i + 3u] + offset) * (odd >> 16));
            }
            const int32_t v = requant_doubled((int32_t)acc, rows + 3u * k);
            out[k] = (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v);
        }
        w = rows + 3u * block;
    }
}
#endif

/* A tile's positions of a packed pointwise conv. */
__attribute__((noinline)) static void conv_packed_tile(const tn_layer *l, const int8_t *in, int8_t *out,
                                                       uint32_t tile) {
    const uint32_t plane = (uint32_t)l->hout * l->wout, cin = l->cin, cout = l->cout, wout = l->wout;
    const uint32_t p = tile * TN_TILE_POSITIONS, oy = p / wout, ox = p - oy * wout; /* = 2 positions: p, p + 1 */
    const uint32_t row = stride_rows(l) * l->win * cin, col = l->stride * cin;
    const int8_t *x0 = in + oy * row + ox * col, *x1 = 0;
    if (p + 1u < plane) { /* the next position, on this row or the next */
        x1 = ox + 1u < wout ? x0 + col : in + (oy + 1u) * row;
    }
    int8_t *o = out + p * cout;
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
    const pw_job job = {l->packed, cout, (uint32_t)(uint16_t)l->in_offset * 0x00010001u};
    (cin == 8u ? conv_pw8 : conv_pw16)(x0, x1, o, &job);
#else
    const uint32_t block = cin == 8u ? 2u : 1u;
    conv_pw(x0, l->packed, o, o + cout, l->in_offset, cin, block);
    if (x1 != 0) {
        conv_pw(x1, l->packed, o + cout, o + 2u * cout, l->in_offset, cin, block);
    }
#endif
}

/* The fast kernel (CMSIS-NN's scheme): an im2col column per output position, two positions and
 * two output channels at a time, so each weight word and each column word loaded feeds two
 * SMLADs (two MACs each). A tile is TN_TILE_POSITIONS output positions of every channel. */
__attribute__((noinline)) static void conv_column_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile,
                                                       int16_t *column) {
    const uint32_t depth = tn_depth(l), plane = (uint32_t)l->hout * l->wout, cout = l->cout;
    const uint32_t p = tile * TN_TILE_POSITIONS; /* = 2: the loops below are written for two */
    const int two = p + 1u < plane;
    const int16_t *ca = column, *cb = two ? column + depth : column; /* a lone last position is computed twice */
    const out_stage s = stage_of(l);
    int8_t *oa = out + p * cout, *ob = oa + cout;
    if (l->kh == 1u && l->kw == 1u && l->pad == 0u && l->pad_h == 0u) { /* a pointwise conv: the inputs as they are */
        const uint32_t sh = stride_rows(l), oy = p / l->wout, ox = p % l->wout, cin = l->cin;
        widen(column, in + (oy * sh * l->win + ox * l->stride) * cin, cin, l->in_offset);
        zero(column + cin, depth - cin);
        if (two) {
            const uint32_t oy1 = ox + 1u < l->wout ? oy : oy + 1u, ox1 = ox + 1u < l->wout ? ox + 1u : 0u;
            widen(column + depth, in + (oy1 * sh * l->win + ox1 * l->stride) * cin, cin, l->in_offset);
            zero(column + depth + cin, depth - cin);
        }
    } else if (l->cin == 1u && l->kh == 3u && l->kw == 3u && l->dil_h <= 1u && l->dil_w <= 1u) { /* depth 12 */
        fill_tile_one_channel3(l, in, column, p, two);
    } else {
        fill_column(l, in, column, p);
        if (two) {
            fill_column(l, in, column + depth, p + 1u);
        }
    }
    const int16_t *const ca_end = ca + depth;
    uint32_t oc = 0;
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
    if (s.table != 0 && cout >= 2u) { /* every pair through the written-out loop */
        const uint32_t pairs = cout / 2u, lo = (uint8_t)s.act_min, hi = (uint8_t)s.act_max;
        pair_job job = {weights16(l), ca, cb, ca_end, l->bias, s.table, oa, two ? ob : oa,
                        weights16(l) + 2u * pairs * depth, lo * 0x01010101u, hi * 0x01010101u};
        if (s.act_min == -128 && s.act_max == 127) {
            conv_pairs_int8(&job);
        } else {
            conv_pairs(&job);
        }
        oc = 2u * pairs;
    }
#endif
    for (; oc + 2u <= cout; oc += 2u) {
        const int16_t *w = weights16(l) + oc * depth; /* the pair's groups, alternating */
        int32_t a0 = l->bias[oc], a1 = l->bias[oc + 1u], b0 = a0, b1 = a1;
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
        pair_dot(w, ca, cb, ca_end, &a0, &a1, &b0, &b1);
#else
        /* each column word feeds both channels as it is loaded: few values live at once */
        for (const int16_t *pa = ca, *pb = cb; pa < ca_end; pa += 4, pb += 4, w += 8) {
            const uint32_t lo0 = read_u32(w), hi0 = read_u32(w + 2), lo1 = read_u32(w + 4), hi1 = read_u32(w + 6);
            uint32_t x = read_u32(pa);
            a0 = smlad(x, lo0, a0);
            a1 = smlad(x, lo1, a1);
            x = read_u32(pa + 2);
            a0 = smlad(x, hi0, a0);
            a1 = smlad(x, hi1, a1);
            x = read_u32(pb);
            b0 = smlad(x, lo0, b0);
            b1 = smlad(x, lo1, b1);
            x = read_u32(pb + 2);
            b0 = smlad(x, hi0, b0);
            b1 = smlad(x, hi1, b1);
        }
#endif
        if (s.table != 0) { /* the table's rows and the clamp read once for the four */
            const int32_t *r = s.table + 3u * oc, lo = s.act_min, hi = s.act_max;
            oa[oc] = row_out(a0, r, lo, hi);
            oa[oc + 1u] = row_out(a1, r + 3, lo, hi);
            if (two) {
                ob[oc] = row_out(b0, r, lo, hi);
                ob[oc + 1u] = row_out(b1, r + 3, lo, hi);
            }
            continue;
        }
        oa[oc] = requantize_out(&s, a0, oc);
        oa[oc + 1u] = requantize_out(&s, a1, oc + 1u);
        if (two) {
            ob[oc] = requantize_out(&s, b0, oc);
            ob[oc + 1u] = requantize_out(&s, b1, oc + 1u);
        }
    }
    if (oc < cout) { /* an odd channel count's last channel */
        const int16_t *w0 = weights16(l) + oc * depth;
        int32_t a0 = l->bias[oc], b0 = a0;
        for (uint32_t k = 0; k < depth; k += 4u) {
            const uint32_t lo0 = read_u32(w0 + k), hi0 = read_u32(w0 + k + 2u);
            a0 = smlad(read_u32(ca + k), lo0, a0);
            a0 = smlad(read_u32(ca + k + 2u), hi0, a0);
            b0 = smlad(read_u32(cb + k), lo0, b0);
            b0 = smlad(read_u32(cb + k + 2u), hi0, b0);
        }
        oa[oc] = requantize_out(&s, a0, oc);
        if (two) {
            ob[oc] = requantize_out(&s, b0, oc);
        }
    }
}

void tn_conv_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile, int16_t *column) {
    if (l->packed != 0) {
        conv_packed_tile(l, in, out, tile);
    } else {
        conv_column_tile(l, in, out, tile, column);
    }
}
