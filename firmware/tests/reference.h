/* Plain reference layers for the unit tests: the layer contract of tn.h written as directly as
 * possible (one MAC at a time, gemmlowp's requantization in 64-bit arithmetic), sharing no code
 * with the kernels, so a kernel agreeing with them is right rather than consistently wrong. */
#ifndef TN_REFERENCE_H
#define TN_REFERENCE_H

#include "tn.h"

/* conv: taps in (ky, kx, ic) order, [cout][kh * kw * cin] -> the firmware's rows: depth padded
 * to a multiple of four with zeros, each group of four stored as w0, w2, w1, w3, the rows of
 * channels 2p and 2p + 1 alternating group by group (an odd last channel's row whole at the end).
 * `packed` holds cout * tn_depth(l). TN_ERR_MODEL for a layer that is not a conv. */
tn_status ref_pack_conv(const tn_layer *l, const int8_t *taps, int8_t *packed);
/* The whole conv output [hout][wout][cout]; TN_ERR_MODEL when hout x wout is not what the
 * geometry (pad on rows only when kh > 1) gives. */
tn_status ref_conv(const tn_layer *l, const int8_t *in, int8_t *out);
/* depthwise: TFLite's taps [kh][kw][cout] -> the firmware's int16 weights (export.cgen's
 * depthwise_weights): where four channels are computed together (a depth multiplier of 1, 2 or a
 * multiple of 4) each quad's taps in turn, a tap's four as w0, w2, w1, w3; then the other channels
 * in TFLite's order. `packed` holds kh * kw * cout. TN_ERR_MODEL for a layer that is not one. */
tn_status ref_pack_dwconv(const tn_layer *l, const int8_t *taps, int16_t *packed);
/* TFLite's DEPTHWISE_CONV_2D from its taps [kh][kw][cout] (output channel oc reads input channel
 * oc / multiplier), the whole output [hout][wout][cout]. */
tn_status ref_dwconv(const tn_layer *l, const int8_t *taps, const int8_t *in, int8_t *out);
/* TFLite's int8 FULLY_CONNECTED: weights [cout][cin], requantized, clamped. */
tn_status ref_fc(const tn_layer *l, const int8_t *in, int8_t *out);
/* TFLite's AVERAGE_POOL_2D (the cells inside the input, rounded half away from zero) and
 * MAX_POOL_2D, clamped. */
tn_status ref_window_pool(const tn_layer *l, const int8_t *in, int8_t *out);
tn_status ref_pool(const tn_layer *l, const int8_t *in, int32_t *out);
tn_status ref_dense(const tn_layer *l, const int32_t *in, int32_t *out);
/* TFLite's quantized ADD of src and src2 (gemmlowp's two roundings at each rescaling). */
tn_status ref_add(const tn_layer *l, const int8_t *a, const int8_t *b, int8_t *out);
/* TFLite's quantized MUL of src and src2: the product of the offset values requantized once (a
 * negative shift multiplies first, as MultiplyByQuantizedMultiplier does). */
tn_status ref_mul(const tn_layer *l, const int8_t *a, const int8_t *b, int8_t *out);
/* One input of a concatenation along channels. */
tn_status ref_concat(const tn_layer *l, const int8_t *in, int8_t *out);
/* A whole model, layer by layer, into `logits` (n_classes values): each layer reads its src (and
 * src2) and writes its dst, offsets in an arena of its own. */
tn_status ref_forward(const tn_model *m, const int8_t *input, int32_t *logits);

#endif
