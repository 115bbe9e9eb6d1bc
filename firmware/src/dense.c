/* Classifiers: the trained models' int32 dense layer, TFLite's requantized fully connected layer,
 * and the argmax of the logits. */
#include "kernel.h"
#include "simd.h"

void tn_dense(const tn_layer *l, const int32_t *in, int32_t *out) {
    for (uint32_t o = 0; o < l->cout; o++) {
        int32_t acc = l->bias[o];
        const int8_t *w = l->weight + o * l->cin;
        for (uint32_t i = 0; i < l->cin; i++) {
            acc += in[i] * w[i];
        }
        out[o] = acc;
    }
}

/* Two outputs at a time: each input word is widened once (the offset added, SXTAB16) and feeds
 * two SMLADs per output row, two MACs each. */
void tn_fc(const tn_layer *l, const int8_t *in, int8_t *out8, int32_t *out32) {
    const out_stage s = stage_of(l);
    const uint32_t cin = l->cin, body = cin & ~3u;
    const int32_t offset = l->in_offset;
    const uint32_t offsets = (uint32_t)(uint16_t)offset * 0x00010001u;
    for (uint32_t o = 0; o < l->cout; o += 2u) {
        const int pair = o + 1u < l->cout;
        const int8_t *w0 = l->weight + o * cin, *w1 = pair ? w0 + cin : w0;
        int32_t a0 = l->bias[o], a1 = pair ? l->bias[o + 1u] : 0;
        for (uint32_t i = 0; i < body; i += 4u) {
            const uint32_t x = read_u32(in + i), xe = sxtab16(offsets, x), xo = sxtab16_ror8(offsets, x);
            const uint32_t v0 = read_u32(w0 + i), v1 = read_u32(w1 + i);
            a0 = smlad(xe, sxtb16(v0), a0);
            a0 = smlad(xo, sxtb16_ror8(v0), a0);
            a1 = smlad(xe, sxtb16(v1), a1);
            a1 = smlad(xo, sxtb16_ror8(v1), a1);
        }
        for (uint32_t i = body; i < cin; i++) {
            a0 += (in[i] + offset) * w0[i];
            a1 += (in[i] + offset) * w1[i];
        }
        for (uint32_t k = 0; k < (pair ? 2u : 1u); k++) {
            const int8_t v = requantize_out(&s, k == 0u ? a0 : a1, o + k);
            if (out8 != 0) {
                out8[o + k] = v;
            } else {
                out32[o + k] = v;
            }
        }
    }
}

uint16_t tn_argmax(const int32_t *logits, uint16_t n) {
    uint16_t best = 0;
    for (uint16_t i = 1; i < n; i++) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}
