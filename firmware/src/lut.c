/* Elementwise int8 operators as tables: the 256 outputs of LOGISTIC, TANH, an ADD or MUL by a
 * constant (a BatchNorm left as MUL and ADD), a requantizing QUANTIZE, computed at export by TFLite
 * Micro's own kernel on the operator alone (export.tflite_import), so the lookup is bit for bit
 * TFLite Micro's. cin tables: one for every value, or one per channel (channels last, cout). */
#include "kernel.h"

void tn_lut(const tn_layer *l, const int8_t *in, int8_t *out) {
    const uint32_t n = (uint32_t)l->cout * l->hout * l->wout, channels = l->cout;
    const int8_t *table = l->weight + 128; /* indexed by the int8 value itself */
    if (l->cin <= 1u) {
        for (uint32_t i = 0; i < n; i++) {
            out[i] = table[in[i]];
        }
        return;
    }
    for (uint32_t i = 0; i < n; i += channels) {
        const int8_t *t = table;
        for (uint32_t c = 0; c < channels; c++, t += 256) {
            out[i + c] = t[in[i + c]];
        }
    }
}
