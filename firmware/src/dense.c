/* Classifiers: the trained models' int32 dense layer, TFLite's requantized fully connected layer,
 * and the argmax of the logits. */
#include "kernel.h"

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

void tn_fc(const tn_layer *l, const int8_t *in, int8_t *out8, int32_t *out32) {
    const out_stage s = stage_of(l);
    for (uint32_t o = 0; o < l->cout; o++) {
        int32_t acc = l->bias[o];
        const int8_t *w = l->weight + o * l->cin;
        for (uint32_t i = 0; i < l->cin; i++) {
            acc += (in[i] + l->in_offset) * w[i];
        }
        const int8_t v = requantize_out(&s, acc, o);
        if (out8 != 0) {
            out8[o] = v;
        } else {
            out32[o] = v;
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
