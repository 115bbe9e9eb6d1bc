/* Depthwise convolution (TFLite's DEPTHWISE_CONV_2D: cout = cin x depth multiplier), bit for bit
 * TFLite Micro's reference kernel. */
#include "kernel.h"

void tn_dwconv_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile) {
    const uint32_t plane = (uint32_t)l->hout * l->wout, cout = l->cout, mult = cout / l->cin;
    const int32_t dh = (int32_t)dil_rows(l), dw = (int32_t)dil_cols(l);
    const out_stage s = stage_of(l);
    for (uint32_t pos = tile * TN_TILE_POSITIONS; pos < plane && pos < (tile + 1u) * TN_TILE_POSITIONS; pos++) {
        const int32_t iy0 = (int32_t)(pos / l->wout * stride_rows(l)) - (int32_t)l->pad_h;
        const int32_t ix0 = (int32_t)(pos % l->wout * l->stride) - (int32_t)l->pad;
        for (uint32_t oc = 0; oc < cout; oc++) {
            const uint32_t ic = oc / mult;
            int32_t acc = l->bias[oc];
            for (int32_t ky = 0; ky < (int32_t)l->kh; ky++) {
                const int32_t iy = iy0 + ky * dh;
                if (iy < 0 || iy >= (int32_t)l->hin) {
                    continue;
                }
                for (int32_t kx = 0; kx < (int32_t)l->kw; kx++) {
                    const int32_t ix = ix0 + kx * dw;
                    if (ix < 0 || ix >= (int32_t)l->win) {
                        continue;
                    }
                    const int32_t x = in[((uint32_t)iy * l->win + (uint32_t)ix) * l->cin + ic];
                    acc += (x + l->in_offset) * l->weight[((uint32_t)ky * l->kw + (uint32_t)kx) * cout + oc];
                }
            }
            out[pos * cout + oc] = requantize_out(&s, acc, oc);
        }
    }
}
