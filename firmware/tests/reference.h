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
tn_status ref_pack_conv(const tn_layer *l, const int8_t *taps, int16_t *packed); /* int16, word aligned */
/* A 1 x 1 conv over 8 or 16 input channels, unpadded, its output range all of int8: taps [cout][cin]
 * -> tn_layer.packed's stream (firmware/src/conv.c): blocks of two channels (cin 8) or one, each its
 * doubled biases, its doubled weights per input word as int16 halves (x0, x2), (x1, x3), its output
 * stage rows; cout x (1 + cin / 2 + 3) words. TN_ERR_MODEL where the layer does not qualify (or cin 8
 * with an odd cout, or the rows as for ref_pack_dwconv_packed). */
tn_status ref_pack_conv_packed(const tn_layer *l, const int8_t *taps, int32_t *stream);
/* The whole conv output [hout][wout][cout]; TN_ERR_MODEL when hout x wout is not what the
 * geometry (pad on rows only when kh > 1) gives. */
tn_status ref_conv(const tn_layer *l, const int8_t *in, int8_t *out);
/* depthwise: TFLite's taps [kh][kw][cout] -> the firmware's int16 weights (export.cgen's
 * depthwise_weights): where four channels are computed together (a depth multiplier of 1, 2 or a
 * multiple of 4) each quad's taps in turn, a tap's four as w0, w2, w1, w3; then the other channels
 * in TFLite's order. `packed` holds kh * kw * cout. TN_ERR_MODEL for a layer that is not one. */
tn_status ref_pack_dwconv(const tn_layer *l, const int8_t *taps, int16_t *packed);
/* depthwise, a depth multiplier of 1 or 2, cin a multiple of 4: TFLite's taps [kh][kw][cout], bias,
 * multiplier, shift, in_offset and out_offset -> tn_layer.packed's stream (tn.h), 2 (kh kw + 2) + cout / 4
 * x (16 + 4 (kh kw / 2) + 2 (kh kw odd)) words. TN_ERR_MODEL where the layer does not qualify: 2 to
 * TN_PACKED_TAPS taps, right shifts of 1 to 30 with |2^(s-1) + out_offset 2^s| < 2^30, |bias| + taps x 255
 * x 128 < 2^30. */
tn_status ref_pack_dwconv_packed(const tn_layer *l, const int8_t *taps, int32_t *stream);
/* TFLite's DEPTHWISE_CONV_2D from its taps [kh][kw][cout] (output channel oc reads input channel
 * oc / multiplier), the whole output [hout][wout][cout]. */
tn_status ref_dwconv(const tn_layer *l, const int8_t *taps, const int8_t *in, int8_t *out);
/* TFLite's int8 FULLY_CONNECTED: weights [cout][cin], requantized, clamped. */
tn_status ref_fc(const tn_layer *l, const int8_t *in, int8_t *out);
/* TFLite's FULLY_CONNECTED with cin a multiple of 8, cout of 4, an output range of all int8: its weights
 * [cout][cin], bias, in_offset and output stage -> tn_layer.packed's stream (firmware/src/dense.c):
 * blocks of four rows, each its biases with the input offset folded in (not doubled: the kernel
 * doubles the sum), per four inputs each row's four int8 weights as one word, its output stage rows
 * (as ref_pack_dwconv_packed's); cout x (1 + cin / 4 + 3) words. TN_ERR_MODEL where the layer does not
 * qualify. */
tn_status ref_pack_fc_packed(const tn_layer *l, int32_t *stream);
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
