/* Where a graph's branches meet: TFLite's quantized ADD (or SUB) and MUL of two computed tensors
 * (a residual connection, a recurrent layer's gates) and one input of a CONCATENATION. Each reads
 * tensors other than the one it writes, so a layer redone after a power cut rewrites the same bytes. */
#include "kernel.h"

#define TN_ADD_LEFT_SHIFT 20 /* TFLite's int8 ADD: inputs scaled up before their rescaling */

/* The ADD's table path on its own, so that its few values stay in registers (a store to out may
 * alias the row; the other paths' multipliers and shifts would crowd them out): two lookups, the
 * sum's output stage row (mbqm_row) and the clamp a value. */
__attribute__((noinline)) static void add_looked_up(const int8_t *a, const int8_t *b, int8_t *out, uint32_t n, const int32_t *ta,
                          const int32_t *tb, const int32_t *r, int32_t lo, int32_t hi) {
    const int32_t row[3] = {r[0], r[1], r[2]};
    for (const int8_t *end = a + n; a < end; a++, b++, out++) {
        *out = row_out(ta[*a] + tb[*b], row, lo, hi);
    }
}

/* out = clamp(mbqm(mbqm((a + off_a) << 20, m0, s0) + mbqm((b + off_b) << 20, m1, s1), m2, s2) + zp):
 * reference_integer_ops::AddElementwise, with Prepare's multipliers (export.firmware.tflite_import).
 * With bias = the two inputs' rescaled values for each int8 value ([2][256], export.firmware.cgen's
 * add_tables; a SUB's second row negated) and requant = the output's table row, two lookups and one
 * multiply-accumulate a value. */
void tn_add(const tn_layer *l, const int8_t *a, const int8_t *b, int8_t *out) {
    const uint32_t n = (uint32_t)l->cin * l->hin * l->win;
    if (l->bias != 0 && l->requant != 0) {
        add_looked_up(a, b, out, n, l->bias + 128, l->bias + 256 + 128, l->requant, l->act_min, l->act_max);
        return;
    }
    const int32_t m0 = l->multiplier[0], m1 = l->multiplier[1], m2 = l->multiplier[2];
    const int32_t s0 = l->shift[0], s1 = l->shift[1], s2 = l->shift[2];
    const int32_t off_a = l->in_offset, off_b = l->in2_offset, zp = l->out_offset;
    const int32_t lo = l->act_min, hi = l->act_max;
    if (l->bias != 0) { /* each input's rescaling looked up (export.firmware.cgen's add_tables) */
        const int32_t *ta = l->bias + 128, *tb = l->bias + 256 + 128;
        for (uint32_t i = 0; i < n; i++) {
            const int32_t v = mbqm(ta[a[i]] + tb[b[i]], m2, s2) + zp;
            out[i] = (int8_t)(v < lo ? lo : v > hi ? hi : v);
        }
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        const int32_t x = (int32_t)((uint32_t)(a[i] + off_a) << TN_ADD_LEFT_SHIFT);
        const int32_t y = (int32_t)((uint32_t)(b[i] + off_b) << TN_ADD_LEFT_SHIFT);
        int32_t v = mbqm(mbqm(x, m0, s0) + mbqm(y, m1, s1), m2, s2) + zp;
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
        out[i] = (int8_t)v;
    }
}

/* out = clamp(mbqm((a + off_a) (b + off_b), m, s) + zp): reference_integer_ops::MulElementwise, with
 * Prepare's multiplier s_a s_b / s_out (export.firmware.tflite_import). |a + off_a| and |b + off_b|
 * stay below 2^8, so the product fits an int32. */
void tn_mul(const tn_layer *l, const int8_t *a, const int8_t *b, int8_t *out) {
    const uint32_t n = (uint32_t)l->cin * l->hin * l->win;
    const int32_t m = l->multiplier[0], s = l->shift[0], off_a = l->in_offset, off_b = l->in2_offset;
    const int32_t zp = l->out_offset, lo = l->act_min, hi = l->act_max;
    for (uint32_t i = 0; i < n; i++) {
        const int32_t v = mbqm((a[i] + off_a) * (b[i] + off_b), m, s) + zp;
        out[i] = (int8_t)(v < lo ? lo : v > hi ? hi : v);
    }
}

/* Channels in2_offset ... in2_offset + cin - 1 of every position of dst (cout channels) from src. */
void tn_concat(const tn_layer *l, const int8_t *in, int8_t *out) {
    const uint32_t positions = (uint32_t)l->hin * l->win, cin = l->cin, cout = l->cout;
    int8_t *o = out + (uint32_t)l->in2_offset;
    for (uint32_t p = 0; p < positions; p++, in += cin, o += cout) {
        for (uint32_t c = 0; c < cin; c++) {
            o[c] = in[c];
        }
    }
}
