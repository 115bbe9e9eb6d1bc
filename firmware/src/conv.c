/* Convolution (1-D and 2-D), int8 -> int8 with TFLite's requantization: the tiled kernel (an
 * im2col column of TN_TILE_POSITIONS positions, two MACs per SMLAD on a Cortex-M4) and the plain
 * one, the benchmark's baseline. */
#include "kernel.h"
#include "simd.h"

uint32_t tn_depth(const tn_layer *l) {
    return ((uint32_t)l->cin * l->kh * l->kw + 3u) & ~3u;
}

/* Where tap k of output channel oc's weights is stored: groups of four are kept as w0, w2, w1, w3,
 * and channels 2p and 2p + 1 alternate group by group (an odd last channel's row follows whole). */
static uint32_t stored(const tn_layer *l, uint32_t depth, uint32_t oc, uint32_t k) {
    const uint32_t in_group = ((k & 1u) << 1) | ((k >> 1) & 1u);
    if ((oc | 1u) >= l->cout) { /* the odd last channel */
        return oc * depth + (k & ~3u) + in_group;
    }
    return (oc & ~1u) * depth + (k & ~3u) * 2u + (oc & 1u) * 4u + in_group;
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
                        int32_t w = l->weight[stored(l, depth, oc, k)];
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
/* The inner loop of the fast kernel on a Cortex-M4, written out: per four taps one LDRD of the
 * channel pair's weight words (8-byte steps, word aligned), four SXTB16 and, for each of the four
 * column words loaded in turn, two SMLAD: 19 instructions for 16 MACs, every pointer in a register
 * (what gcc makes of the C below spills the loop bound and adds the pointers apart: 24). The C
 * loop is the same arithmetic, which the host build runs. depth >= 4: the loop runs at least once. */
static inline __attribute__((always_inline)) void pair_dot(const int8_t *w, const int16_t *pa, const int16_t *pb,
                                                           const int16_t *end, int32_t *a0, int32_t *a1, int32_t *b0,
                                                           int32_t *b1) {
    int32_t sa0 = *a0, sa1 = *a1, sb0 = *b0, sb1 = *b1;
    uint32_t v0, v1, h0, h1, x;
    __asm__("1:\n\t"
            "ldrd %[v0], %[v1], [%[w]], #8\n\t"
            "sxtb16 %[h0], %[v0], ror #8\n\t"
            "sxtb16 %[v0], %[v0]\n\t"
            "sxtb16 %[h1], %[v1], ror #8\n\t"
            "sxtb16 %[v1], %[v1]\n\t"
            "ldr %[x], [%[pa]], #4\n\t"
            "smlad %[a0], %[x], %[v0], %[a0]\n\t"
            "smlad %[a1], %[x], %[v1], %[a1]\n\t"
            "ldr %[x], [%[pa]], #4\n\t"
            "smlad %[a0], %[x], %[h0], %[a0]\n\t"
            "smlad %[a1], %[x], %[h1], %[a1]\n\t"
            "ldr %[x], [%[pb]], #4\n\t"
            "smlad %[b0], %[x], %[v0], %[b0]\n\t"
            "smlad %[b1], %[x], %[v1], %[b1]\n\t"
            "ldr %[x], [%[pb]], #4\n\t"
            "smlad %[b0], %[x], %[h0], %[b0]\n\t"
            "smlad %[b1], %[x], %[h1], %[b1]\n\t"
            "cmp %[pa], %[end]\n\t"
            "bne 1b"
            : [a0] "+r"(sa0), [a1] "+r"(sa1), [b0] "+r"(sb0), [b1] "+r"(sb1), [w] "+r"(w), [pa] "+r"(pa),
              [pb] "+r"(pb), [v0] "=&r"(v0), [v1] "=&r"(v1), [h0] "=&r"(h0), [h1] "=&r"(h1), [x] "=&r"(x)
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
    const int8_t *w;                /*  0: the first pair's weights (pairs follow one another) */
    const int16_t *ca, *cb, *ca_end; /*  4,  8, 12: the two columns, the first one's end */
    const int32_t *bias, *rows;     /* 16, 20: the first pair's biases and requantization rows */
    int8_t *oa, *ob;                /* 24, 28: where the first pair's outputs go at the two positions */
    const int8_t *w_end;            /* 32: past the last pair's weights */
    uint32_t lo4, hi4;              /* 36, 40: the clamp's bounds, one per byte */
} pair_job;

/* Every channel pair of a tile on a Cortex-M4, written out as one function (in C the compiler
 * spills the loop's pointers around each pair: 32 instructions of setup and a reloaded clamp per
 * output). Per pair: the biases (LDRD), pair_dot's loop (19 instructions for 16 MACs), then the
 * output stage of mbqm_row for the four sums (the table row read once for both positions;
 * AND, ORR, ADD, SMLAL, ASR and SSAT per output), the four bytes packed into one word, clamped
 * per byte (SSUB8 sets a lane's GE flag, SEL picks: the clamp of four outputs in four
 * instructions) and stored as a halfword at each position. Registers: r0-r3 the sums a0, a1, b0,
 * b1; r4-r7 the weights; r8 a column word; r9 the weights' pointer; r10, r11 the columns' pointers;
 * r12 the first column's end; lr the job. With a lone last position cb = ca and ob = oa, so the
 * second store rewrites the first's bytes with the same values. */
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
    "2:\n\t"                                                                                                           \
    "ldrd r4, r5, [r9], #8\n\t"                                                                                        \
    "sxtb16 r6, r4, ror #8\n\t"                                                                                        \
    "sxtb16 r4, r4\n\t"                                                                                                \
    "sxtb16 r7, r5, ror #8\n\t"                                                                                        \
    "sxtb16 r5, r5\n\t"                                                                                                \
    "ldr r8, [r10], #4\n\t"                                                                                            \
    "smlad r0, r8, r4, r0\n\t"                                                                                         \
    "smlad r1, r8, r5, r1\n\t"                                                                                         \
    "ldr r8, [r10], #4\n\t"                                                                                            \
    "smlad r0, r8, r6, r0\n\t"                                                                                         \
    "smlad r1, r8, r7, r1\n\t"                                                                                         \
    "ldr r8, [r11], #4\n\t"                                                                                            \
    "smlad r2, r8, r4, r2\n\t"                                                                                         \
    "smlad r3, r8, r5, r3\n\t"                                                                                         \
    "ldr r8, [r11], #4\n\t"                                                                                            \
    "smlad r2, r8, r6, r2\n\t"                                                                                         \
    "smlad r3, r8, r7, r3\n\t"                                                                                         \
    "cmp r10, r12\n\t"                                                                                                 \
    "bne 2b\n\t"                                                                                                       \
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
#undef TN_CONV_ASM_ROW
#undef TN_CONV_ASM_OUT
#undef TN_CONV_ASM_CLAMP
#endif

/* The fast kernel (CMSIS-NN's scheme): an im2col column per output position, two positions and
 * two output channels at a time, so each weight word and each column word loaded feeds two
 * SMLADs (two MACs each). A tile is TN_TILE_POSITIONS output positions of every channel. */
void tn_conv_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile, int16_t *column) {
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
        pair_job job = {l->weight, ca, cb, ca_end, l->bias, s.table, oa, two ? ob : oa,
                        l->weight + 2u * pairs * depth, lo * 0x01010101u, hi * 0x01010101u};
        if (s.act_min == -128 && s.act_max == 127) {
            conv_pairs_int8(&job);
        } else {
            conv_pairs(&job);
        }
        oc = 2u * pairs;
    }
#endif
    for (; oc + 2u <= cout; oc += 2u) {
        const int8_t *w = l->weight + oc * depth; /* the pair's groups, alternating */
        int32_t a0 = l->bias[oc], a1 = l->bias[oc + 1u], b0 = a0, b1 = a1;
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
        pair_dot(w, ca, cb, ca_end, &a0, &a1, &b0, &b1);
#else
        /* each column word feeds both channels as it is loaded: few values live at once */
        for (const int16_t *pa = ca, *pb = cb; pa < ca_end; pa += 4, pb += 4, w += 8) {
            const uint32_t v0 = read_u32(w), v1 = read_u32(w + 4);
            const uint32_t lo0 = sxtb16(v0), hi0 = sxtb16_ror8(v0), lo1 = sxtb16(v1), hi1 = sxtb16_ror8(v1);
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
        const int8_t *w0 = l->weight + oc * depth;
        int32_t a0 = l->bias[oc], b0 = a0;
        for (uint32_t k = 0; k < depth; k += 4u) {
            const uint32_t v0 = read_u32(w0 + k), lo0 = sxtb16(v0), hi0 = sxtb16_ror8(v0);
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
