/* What the int8 kernels share (private to firmware/src): TFLite's requantization, a layer's
 * output stage, unaligned word access. Activations are HWC (channels last, CMSIS-NN's layout):
 * the taps of one window row are one contiguous run of kw * cin bytes. */
#ifndef TN_KERNEL_H
#define TN_KERNEL_H
#include "tn.h"

/* SaturatingRoundingDoublingHighMul (gemmlowp): (a * b + nudge) / 2^31 truncated toward zero,
 * nudge = 2^30 for a * b >= 0 and 1 - 2^30 below. Both cases equal floor((a * b + 2^30) / 2^31),
 * one arithmetic shift (smlal and two shifts on a Cortex-M4). It saturates only for
 * a = b = INT32_MIN; multipliers are positive Q31 values (export.cgen checks), so never here. */
/* A window's geometry: rows between windows, and the spacing of its taps (dilation). */
static inline uint32_t stride_rows(const tn_layer *l) {
    return l->stride_h != 0u ? l->stride_h : l->stride;
}
static inline uint32_t dil_rows(const tn_layer *l) {
    return l->dil_h > 1u ? l->dil_h : 1u;
}
static inline uint32_t dil_cols(const tn_layer *l) {
    return l->dil_w > 1u ? l->dil_w : 1u;
}

static inline int32_t srdhm(int32_t a, int32_t b) {
    return (int32_t)(((int64_t)a * (int64_t)b + (INT64_C(1) << 30)) >> 31);
}

/* MultiplyByQuantizedMultiplier (TFLite): a shift >= 0 divides after the multiply, rounding; a
 * negative one multiplies by 2^-shift before it (two's complement wrap, as TFLite's int32 does).
 *
 * For a right shift s >= 2 both roundings fold into one multiply-accumulate. RoundingDivideByPOT
 * rounds x = srdhm(acc, m) = floor(P / 2^31), P = acc m + 2^30, half away from zero:
 * floor((x - [x < 0] + 2^(s-1)) / 2^s) = floor((P - [P < 0] 2^31 + 2^(30+s)) / 2^(31+s)), and
 * [P < 0] may be read as [acc < 0] (where they differ, -2^30 <= acc m < 0, both give 0). The
 * 64-bit base 2^30 + 2^(30+s) - [acc < 0] 2^31 has the high word 2^(s-2) - [acc < 0] and the low
 * word 0x40000000 or 0xC0000000; SMLAL adds acc m; the result is the high word >> (s - 1).
 * tests/firmware checks it against gemmlowp's two steps on ties and extremes. */
static inline int32_t mbqm(int32_t acc, int32_t multiplier, int32_t shift) {
    if (shift >= 2) {
        const uint32_t lo = 0x40000000u | ((uint32_t)acc & 0x80000000u);
        const uint32_t hi = (UINT32_C(1) << (uint32_t)(shift - 2)) + (uint32_t)(acc >> 31);
        const int64_t q = (int64_t)(((uint64_t)hi << 32) | lo) + (int64_t)acc * (int64_t)multiplier;
        return (int32_t)(q >> 32) >> (shift - 1);
    }
    const int32_t x = srdhm((int32_t)((uint32_t)acc << (uint32_t)(shift < 0 ? -shift : 0)), multiplier);
    if (shift == 1) { /* half away from zero: x - [x < 0] + 1, halved */
        const int32_t y = x + (x >> 31);
        return (y >> 1) + (y & 1);
    }
    return x;
}

/* mbqm for a right shift s >= 2, plus the output zero point zp, from a layer's table row
 * r = {multiplier, 2^(s-2) + zp 2^(s-1), s - 1}: the fold above with its constants computed at
 * export and no test of the shift. Adding zp 2^(s-1) to the high word before the shift by s - 1
 * adds zp after it, exactly; export.cgen writes the row only where |zp| 2^(s-1) + 2^(s-2) < 2^29,
 * so the 64-bit base stays below 2^61 + 2^31 and base + acc m (below 2^62) cannot overflow. */
static inline int32_t mbqm_row(int32_t acc, const int32_t *r) {
    const uint32_t lo = 0x40000000u | ((uint32_t)acc & 0x80000000u);
    const uint32_t hi = (uint32_t)r[1] + (uint32_t)(acc >> 31);
    const int64_t q = (int64_t)(((uint64_t)hi << 32) | lo) + (int64_t)acc * (int64_t)r[0];
    return (int32_t)(q >> 32) >> r[2];
}

/* The output stage of a doubled accumulator acc2 = 2 acc (tn_layer.packed: weights and biases times
 * 2) from its row r = {multiplier m, 2^(s-1) + zp 2^s, s}, a right shift s >= 1, unclamped. srdhm(acc, m)
 * = floor((acc2 m + 2^31) / 2^32), what SMMLAR rounds to, so SMMLAR adds r[1] with it; less [acc < 0]
 * (mbqm's reading of [x < 0]; where they differ x = 0 and both give zp) and shifted right by s, it is
 * RoundingDivideByPOT(x, s) + zp: one SMMLAR, SUB, ASR and SSAT on a Cortex-M4, two instructions fewer
 * than mbqm_row. export.cgen writes the stream only where |acc| < 2^30 for any input (so acc2 fits and
 * |x| <= 2^30) and |r[1]| < 2^30, so x + r[1] fits an int32. */
static inline int32_t requant_doubled(int32_t acc2, const int32_t *r) {
    const int64_t p = (int64_t)r[1] * (INT64_C(1) << 32) + (int64_t)acc2 * r[0] + (INT64_C(1) << 31);
    const int32_t t = (int32_t)(p >> 32) - (int32_t)((uint32_t)acc2 >> 31);
    return t >> r[2];
}

/* A conv layer's output stage, read once per tile: the stores to int8 outputs may alias
 * anything, so fields read per output would be reloaded each time. */
typedef struct {
    const int32_t *multiplier, *shift, *table;
    int32_t out_offset, act_min, act_max;
} out_stage;

static inline out_stage stage_of(const tn_layer *l) {
    out_stage s = {l->multiplier, l->shift, l->requant, l->out_offset, l->act_min, l->act_max};
    return s;
}

static inline int8_t requantize_out(const out_stage *s, int32_t acc, uint32_t oc) {
    int32_t v = s->table != 0 ? mbqm_row(acc, s->table + 3u * oc)
                              : mbqm(acc, s->multiplier[oc], s->shift[oc]) + s->out_offset;
    v = v < s->act_min ? s->act_min : v;
    v = v > s->act_max ? s->act_max : v;
    return (int8_t)v;
}

/* One output from its channel's table row, clamped to [lo, hi]: as an int32 (to pack into a word)
 * and as the int8 stored. */
static inline int32_t row_clamped(int32_t acc, const int32_t *r, int32_t lo, int32_t hi) {
    const int32_t v = mbqm_row(acc, r);
    return v < lo ? lo : v > hi ? hi : v;
}

static inline int8_t row_out(int32_t acc, const int32_t *r, int32_t lo, int32_t hi) {
    return (int8_t)row_clamped(acc, r, lo, hi);
}

static inline uint32_t read_u32(const void *p) {
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}

static inline void write_u32(void *p, uint32_t v) {
    __builtin_memcpy(p, &v, 4);
}

#endif
