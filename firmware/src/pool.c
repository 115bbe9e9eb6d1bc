/* Pooling: the trained models' global sum over positions (int32 out), and TFLite's average and
 * max pools and MEAN over positions (int8 out, TFLite Micro's rounding). */
#include "kernel.h"

void tn_pool(const tn_layer *l, const int8_t *in, int32_t *out) {
    const uint32_t positions = (uint32_t)l->hin * l->win, cin = l->cin;
    for (uint32_t c = 0; c < cin; c++) {
        out[c] = (int32_t)positions * l->in_offset;
    }
    for (uint32_t i = 0; i < positions; i++, in += cin) {
        for (uint32_t c = 0; c < cin; c++) {
            out[c] += in[c];
        }
    }
}

/* TFLite's AveragePool (the window's sum over its cells inside the input, divided by their count,
 * rounding half away from zero) and MaxPool, clamped to the fused activation's range. */
void tn_window_pool(const tn_layer *l, const int8_t *in, int8_t *out) {
    const uint32_t c_n = l->cin;
    for (uint32_t oy = 0; oy < l->hout; oy++) {
        for (uint32_t ox = 0; ox < l->wout; ox++) {
            const int32_t iy0 = (int32_t)(oy * stride_rows(l)) - (int32_t)l->pad_h;
            const int32_t ix0 = (int32_t)(ox * l->stride) - (int32_t)l->pad;
            const int32_t fy0 = iy0 < 0 ? -iy0 : 0, fx0 = ix0 < 0 ? -ix0 : 0;
            const int32_t fy1 = iy0 + (int32_t)l->kh > (int32_t)l->hin ? (int32_t)l->hin - iy0 : (int32_t)l->kh;
            const int32_t fx1 = ix0 + (int32_t)l->kw > (int32_t)l->win ? (int32_t)l->win - ix0 : (int32_t)l->kw;
            for (uint32_t c = 0; c < c_n; c++) {
                int32_t acc = l->kind == TN_MAXPOOL ? -128 : 0, count = 0;
                for (int32_t fy = fy0; fy < fy1; fy++) {
                    for (int32_t fx = fx0; fx < fx1; fx++) {
                        const int32_t x = in[((uint32_t)(iy0 + fy) * l->win + (uint32_t)(ix0 + fx)) * c_n + c];
                        acc = l->kind == TN_MAXPOOL ? (x > acc ? x : acc) : acc + x;
                        count++;
                    }
                }
                if (l->kind == TN_AVGPOOL && count > 0) {
                    acc = acc > 0 ? (acc + count / 2) / count : (acc - count / 2) / count;
                }
                acc = acc < l->act_min ? l->act_min : acc;
                acc = acc > l->act_max ? l->act_max : acc;
                out[(oy * l->wout + ox) * c_n + c] = (int8_t)acc;
            }
        }
    }
}

/* TFLite Micro's MEAN over positions for int8: the sum of (x - input zero point), requantized by a
 * multiplier with 1/positions folded in (QuantizedMeanOrSum). */
void tn_mean(const tn_layer *l, const int8_t *in, int8_t *out) {
    const uint32_t positions = (uint32_t)l->hin * l->win, c_n = l->cin;
    for (uint32_t c = 0; c < c_n; c++) {
        int32_t sum = 0;
        for (uint32_t p = 0; p < positions; p++) {
            sum += in[p * c_n + c];
        }
        int32_t v = mbqm(sum + l->in_offset * (int32_t)positions, l->multiplier[0], l->shift[0]) + l->out_offset;
        v = v < -128 ? -128 : v;
        v = v > 127 ? 127 : v;
        out[c] = (int8_t)v;
    }
}
