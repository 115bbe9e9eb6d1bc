#include "reference.h"

#include "check.h"

/* Within each group of four int8 depthwise weights, taps 1 and 2 trade places (the order SXTB16
 * unpacks; export.cgen's depthwise_weights). */
static const uint32_t group_order[4] = {0u, 2u, 1u, 3u};

static uint32_t taps_of(const tn_layer *l) {
    return (uint32_t)l->kh * l->kw * l->cin;
}

static uint32_t depth_of(const tn_layer *l) {
    return (taps_of(l) + 3u) / 4u * 4u;
}

/* The int16 of channel oc's tap k: its group of four at k / 4 in its row, the rows of an even and
 * an odd channel taking turns group by group, an odd last channel's row on its own at the end. */
static uint32_t slot_of(const tn_layer *l, uint32_t oc, uint32_t k) {
    const uint32_t depth = depth_of(l), group = k / 4u;
    if (oc + 1u == l->cout && l->cout % 2u == 1u) {
        return oc * depth + k;
    }
    return (oc / 2u) * 2u * depth + group * 8u + (oc % 2u) * 4u + k % 4u;
}

tn_status ref_pack_conv(const tn_layer *l, const int8_t *taps, int16_t *packed) {
    if (l->kind != TN_CONV) {
        return TN_ERR_MODEL;
    }
    const uint32_t n = taps_of(l), depth = depth_of(l);
    for (uint32_t oc = 0; oc < l->cout; oc++) {
        for (uint32_t k = 0; k < depth; k++) {
            packed[slot_of(l, oc, k)] = k < n ? taps[oc * n + k] : 0;
        }
    }
    return TN_OK;
}

static int16_t weight_at(const tn_layer *l, uint32_t oc, uint32_t k) {
    return ((const int16_t *)(const void *)l->weight)[slot_of(l, oc, k)];
}

/* v clamped to the layer's output range. */
static int8_t clamped(int64_t v, const tn_layer *l) {
    v = v < l->act_min ? l->act_min : v;
    v = v > l->act_max ? l->act_max : v;
    return (int8_t)v;
}

/* Where window tap (ky, kx) of output (oy, ox) reads the input, or -1 in the padding. */
static int32_t tap_at(const tn_layer *l, int32_t oy, int32_t ox, int32_t ky, int32_t kx) {
    const int32_t sr = l->stride_h ? (int32_t)l->stride_h : (int32_t)l->stride;
    const int32_t dr = l->dil_h > 1u ? (int32_t)l->dil_h : 1, dc = l->dil_w > 1u ? (int32_t)l->dil_w : 1;
    const int32_t iy = oy * sr + ky * dr - (int32_t)l->pad_h, ix = ox * (int32_t)l->stride + kx * dc - (int32_t)l->pad;
    return iy >= 0 && iy < (int32_t)l->hin && ix >= 0 && ix < (int32_t)l->win ? iy * (int32_t)l->win + ix : -1;
}

tn_status ref_conv(const tn_layer *l, const int8_t *in, int8_t *out) {
    const int32_t pad_rows = l->pad_h, pad_cols = l->pad;
    const int32_t sr = l->stride_h ? (int32_t)l->stride_h : (int32_t)l->stride; /* rows between windows */
    const int32_t dr = l->dil_h > 1u ? (int32_t)l->dil_h : 1, dc = l->dil_w > 1u ? (int32_t)l->dil_w : 1;
    const int32_t extent_rows = ((int32_t)l->kh - 1) * dr + 1, extent_cols = ((int32_t)l->kw - 1) * dc + 1;
    if (l->kind != TN_CONV || l->stride == 0 ||
        (int32_t)l->hout != ((int32_t)l->hin + 2 * pad_rows - extent_rows) / sr + 1 ||
        (int32_t)l->wout != ((int32_t)l->win + 2 * pad_cols - extent_cols) / (int32_t)l->stride + 1) {
        return TN_ERR_MODEL;
    }
    for (int32_t oy = 0; oy < (int32_t)l->hout; oy++) {
        for (int32_t ox = 0; ox < (int32_t)l->wout; ox++) {
            for (uint32_t oc = 0; oc < l->cout; oc++) {
                int64_t acc = l->bias[oc];
                uint32_t k = 0;
                for (int32_t ky = 0; ky < (int32_t)l->kh; ky++) {
                    for (int32_t kx = 0; kx < (int32_t)l->kw; kx++) {
                        const int32_t at = tap_at(l, oy, ox, ky, kx);
                        for (uint32_t ic = 0; ic < l->cin; ic++, k++) {
                            if (at >= 0) {
                                const int32_t x = in[(uint32_t)at * l->cin + ic];
                                acc += (int64_t)(x + l->in_offset) * weight_at(l, oc, k);
                            }
                        }
                    }
                }
                if (acc < INT32_MIN || acc > INT32_MAX) {
                    return TN_ERR_MODEL; /* the firmware accumulates in int32: such a model is malformed */
                }
                out[((uint32_t)oy * l->wout + (uint32_t)ox) * l->cout + oc] =
                    clamped((int64_t)gemmlowp_requantize((int32_t)acc, l->multiplier[oc], l->shift[oc]) + l->out_offset, l);
            }
        }
    }
    return TN_OK;
}

tn_status ref_pack_dwconv(const tn_layer *l, const int8_t *taps, int16_t *packed) {
    if (l->kind != TN_DWCONV || l->cin == 0 || l->cout % l->cin != 0) {
        return TN_ERR_MODEL;
    }
    const uint32_t n = (uint32_t)l->kh * l->kw, cout = l->cout, mult = cout / l->cin;
    const uint32_t quads = mult == 1u || mult == 2u || mult % 4u == 0u ? cout / 4u * 4u : 0u, rest = cout - quads;
    for (uint32_t t = 0; t < n; t++) {
        for (uint32_t oc = 0; oc < cout; oc++) {
            const uint32_t slot = oc < quads ? (oc / 4u * n + t) * 4u + group_order[oc % 4u]
                                             : quads * n + t * rest + (oc - quads);
            packed[slot] = taps[t * cout + oc];
        }
    }
    return TN_OK;
}

/* A stream word: two int16 values, lo in the low half. */
static int32_t halves(int32_t lo, int32_t hi) {
    return (int32_t)(((uint32_t)hi << 16) | ((uint32_t)lo & 0xFFFFu));
}

static int doubled_fits(const tn_layer *l, uint32_t taps) {
    for (uint32_t oc = 0; oc < l->cout; oc++) {
        const int64_t sh = l->shift[oc], bias = l->bias[oc];
        if (sh < 1 || sh > 30) {
            return 0;
        }
        const int64_t base = (INT64_C(1) << (sh - 1)) + (int64_t)l->out_offset * (INT64_C(1) << sh);
        if (base <= -(INT64_C(1) << 30) || base >= (INT64_C(1) << 30) ||
            (bias < 0 ? -bias : bias) + (int64_t)taps * 255 * 128 >= (INT64_C(1) << 30)) {
            return 0;
        }
    }
    return 1;
}

/* Channel oc's output stage row for a doubled accumulator: {multiplier, 2^(s-1) + out_offset 2^s, s}. */
static int32_t *doubled_row(const tn_layer *l, uint32_t oc, int32_t *s) {
    const int32_t sh = l->shift[oc];
    *s++ = l->multiplier[oc];
    *s++ = (int32_t)((INT64_C(1) << (sh - 1)) + (int64_t)l->out_offset * (INT64_C(1) << sh));
    *s++ = sh;
    return s;
}

tn_status ref_pack_dwconv_packed(const tn_layer *l, const int8_t *taps, int32_t *stream) {
    const uint32_t n = (uint32_t)l->kh * l->kw, c = l->cout, cin = l->cin;
    if (l->kind != TN_DWCONV || (c != cin && c != 2u * cin) || cin % 4u != 0u || n < 2u || n > TN_PACKED_TAPS) {
        return TN_ERR_MODEL;
    }
    if (!doubled_fits(l, n)) {
        return TN_ERR_MODEL;
    }
    int32_t *s = stream;
    const uint32_t dr = l->dil_h > 1u ? l->dil_h : 1u, dc = l->dil_w > 1u ? l->dil_w : 1u;
    const uint32_t steps[2][2] = {{dr * l->win * cin, dc * cin}, {l->kw * cin, cin}}; /* in place, gathered */
    for (uint32_t table = 0; table < 2u; table++) {
        int32_t *t = s;
        for (uint32_t ky = 0; ky < l->kh; ky++) {
            for (uint32_t kx = 0; kx < l->kw; kx++) {
                *t++ = (int32_t)(ky * steps[table][0] + kx * steps[table][1]);
            }
        }
        if (n % 2u == 1u) { /* (-1, the last tap), then a word of padding */
            t[0] = t[-1];
            t[-1] = -1;
            t[1] = 0;
        } else {
            t[0] = -1;
            t[1] = 0;
        }
        s += n + 2u;
    }
    for (uint32_t q = 0; q < c; q += 4u) {
        for (uint32_t k = 0; k < 4u; k++) { /* the input offset folded in: the taps read the raw input */
            int32_t sum = 0;
            for (uint32_t t = 0; t < n; t++) {
                sum += taps[t * c + q + k];
            }
            *s++ = 2 * (l->bias[q + k] + l->in_offset * sum);
        }
        for (uint32_t t = 0; t + 1u < n; t += 2u) {
            for (uint32_t k = 0; k < 4u; k++) {
                *s++ = halves(2 * taps[t * c + q + k], 2 * taps[(t + 1u) * c + q + k]);
            }
        }
        if (n % 2u == 1u) { /* the lanes the last tap's input word gives: (c0, c2), (c1, c3); two input values */
            const int8_t *last = taps + (n - 1u) * c + q;                  /* (a multiplier of 2): (c0, c1), (c2, c3) */
            const uint32_t k1 = c == cin ? 2u : 1u, k2 = 3u - k1;
            *s++ = halves(2 * last[0], 2 * last[k1]);
            *s++ = halves(2 * last[k2], 2 * last[3]);
        }
        for (uint32_t k = 0; k < 4u; k++) {
            s = doubled_row(l, q + k, s);
        }
    }
    return TN_OK;
}

/* Whether a doubled accumulator and requant_doubled's rows serve every channel: right shifts of 1 to
 * 30, |2^(s-1) + out_offset 2^s| < 2^30, and |bias| + taps x 255 x 128 < 2^30. */
tn_status ref_pack_conv_packed(const tn_layer *l, const int8_t *taps, int32_t *stream) {
    const uint32_t cin = l->cin, block = cin == 8u ? 2u : 1u;
    if (l->kind != TN_CONV || l->kh != 1u || l->kw != 1u || l->pad != 0u || l->pad_h != 0u ||
        (cin != 8u && cin != 16u) || l->cout % block != 0u || l->act_min != -128 || l->act_max != 127 ||
        !doubled_fits(l, cin)) {
        return TN_ERR_MODEL;
    }
    int32_t *s = stream;
    for (uint32_t c = 0; c < l->cout; c += block) {
        for (uint32_t k = 0; k < block; k++) {
            *s++ = 2 * l->bias[c + k];
        }
        for (uint32_t k = 0; k < block; k++) { /* per input word, the lanes SXTB16 gives: (x0, x2), (x1, x3) */
            const int8_t *w = taps + (c + k) * cin;
            for (uint32_t i = 0; i < cin; i += 4u) {
                *s++ = halves(2 * w[i], 2 * w[i + 2u]);
                *s++ = halves(2 * w[i + 1u], 2 * w[i + 3u]);
            }
        }
        for (uint32_t k = 0; k < block; k++) {
            s = doubled_row(l, c + k, s);
        }
    }
    return TN_OK;
}

tn_status ref_pack_fc_packed(const tn_layer *l, int32_t *stream) {
    const uint32_t cin = l->cin, cout = l->cout;
    if (l->kind != TN_FC || cin % 8u != 0u || cout % 4u != 0u || l->act_min != -128 || l->act_max != 127 ||
        !doubled_fits(l, cin)) {
        return TN_ERR_MODEL;
    }
    int32_t *s = stream;
    for (uint32_t o = 0; o < cout; o += 4u) {
        for (uint32_t k = 0; k < 4u; k++) { /* the input offset folded in: the rows read the raw input */
            int32_t sum = 0;
            for (uint32_t i = 0; i < cin; i++) {
                sum += l->weight[(o + k) * cin + i];
            }
            *s++ = l->bias[o + k] + l->in_offset * sum;
        }
        for (uint32_t i = 0; i < cin; i += 4u) {
            for (uint32_t k = 0; k < 4u; k++) { /* a row's four weights as they lie in memory */
                const int8_t *w = l->weight + (o + k) * cin + i;
                const uint32_t b0 = (uint8_t)w[0], b1 = (uint8_t)w[1], b2 = (uint8_t)w[2], b3 = (uint8_t)w[3];
                *s++ = (int32_t)(b0 | b1 << 8 | b2 << 16 | b3 << 24);
            }
        }
        for (uint32_t k = 0; k < 4u; k++) {
            s = doubled_row(l, o + k, s);
        }
    }
    return TN_OK;
}

tn_status ref_dwconv(const tn_layer *l, const int8_t *taps, const int8_t *in, int8_t *out) {
    if (l->kind != TN_DWCONV || l->cin == 0 || l->cout % l->cin != 0 || l->stride == 0) {
        return TN_ERR_MODEL;
    }
    const uint32_t mult = l->cout / l->cin;
    for (int32_t oy = 0; oy < (int32_t)l->hout; oy++) {
        for (int32_t ox = 0; ox < (int32_t)l->wout; ox++) {
            for (uint32_t oc = 0; oc < l->cout; oc++) {
                int64_t acc = l->bias[oc];
                for (int32_t ky = 0; ky < (int32_t)l->kh; ky++) {
                    for (int32_t kx = 0; kx < (int32_t)l->kw; kx++) {
                        const int32_t at = tap_at(l, oy, ox, ky, kx);
                        if (at >= 0) {
                            const int32_t x = in[(uint32_t)at * l->cin + oc / mult];
                            acc += (int64_t)(x + l->in_offset) * taps[((uint32_t)ky * l->kw + (uint32_t)kx) * l->cout + oc];
                        }
                    }
                }
                if (acc < INT32_MIN || acc > INT32_MAX) {
                    return TN_ERR_MODEL;
                }
                out[((uint32_t)oy * l->wout + (uint32_t)ox) * l->cout + oc] =
                    clamped((int64_t)gemmlowp_requantize((int32_t)acc, l->multiplier[oc], l->shift[oc]) + l->out_offset, l);
            }
        }
    }
    return TN_OK;
}

tn_status ref_fc(const tn_layer *l, const int8_t *in, int8_t *out) {
    if (l->kind != TN_FC) {
        return TN_ERR_MODEL;
    }
    for (uint32_t o = 0; o < l->cout; o++) {
        int64_t acc = l->bias[o];
        for (uint32_t i = 0; i < l->cin; i++) {
            acc += (int64_t)(in[i] + l->in_offset) * l->weight[o * l->cin + i];
        }
        if (acc < INT32_MIN || acc > INT32_MAX) {
            return TN_ERR_MODEL;
        }
        out[o] = clamped((int64_t)gemmlowp_requantize((int32_t)acc, l->multiplier[o], l->shift[o]) + l->out_offset, l);
    }
    return TN_OK;
}

tn_status ref_window_pool(const tn_layer *l, const int8_t *in, int8_t *out) {
    if ((l->kind != TN_AVGPOOL && l->kind != TN_MAXPOOL) || l->stride == 0) {
        return TN_ERR_MODEL;
    }
    for (int32_t oy = 0; oy < (int32_t)l->hout; oy++) {
        for (int32_t ox = 0; ox < (int32_t)l->wout; ox++) {
            for (uint32_t c = 0; c < l->cin; c++) {
                int32_t sum = 0, count = 0, max = -128;
                for (int32_t ky = 0; ky < (int32_t)l->kh; ky++) {
                    for (int32_t kx = 0; kx < (int32_t)l->kw; kx++) {
                        const int32_t at = tap_at(l, oy, ox, ky, kx);
                        if (at >= 0) {
                            const int32_t x = in[(uint32_t)at * l->cin + c];
                            sum += x;
                            count++;
                            max = x > max ? x : max;
                        }
                    }
                }
                if (count == 0) {
                    return TN_ERR_MODEL; /* a window wholly in the padding */
                }
                const int32_t avg = sum > 0 ? (sum + count / 2) / count : (sum - count / 2) / count;
                out[((uint32_t)oy * l->wout + (uint32_t)ox) * l->cin + c] = clamped(l->kind == TN_AVGPOOL ? avg : max, l);
            }
        }
    }
    return TN_OK;
}

tn_status ref_pool(const tn_layer *l, const int8_t *in, int32_t *out) {
    if (l->kind != TN_POOL) {
        return TN_ERR_MODEL;
    }
    for (uint32_t c = 0; c < l->cin; c++) {
        int64_t sum = 0;
        for (uint32_t p = 0; p < (uint32_t)l->hin * l->win; p++) {
            sum += in[p * l->cin + c] + l->in_offset;
        }
        out[c] = (int32_t)sum;
    }
    return TN_OK;
}

tn_status ref_dense(const tn_layer *l, const int32_t *in, int32_t *out) {
    if (l->kind != TN_DENSE) {
        return TN_ERR_MODEL;
    }
    for (uint32_t o = 0; o < l->cout; o++) {
        int64_t acc = l->bias[o];
        for (uint32_t i = 0; i < l->cin; i++) {
            acc += (int64_t)in[i] * l->weight[o * l->cin + i];
        }
        if (acc < INT32_MIN || acc > INT32_MAX) {
            return TN_ERR_MODEL;
        }
        out[o] = (int32_t)acc;
    }
    return TN_OK;
}

tn_status ref_add(const tn_layer *l, const int8_t *a, const int8_t *b, int8_t *out) {
    if (l->kind != TN_ADD) {
        return TN_ERR_MODEL;
    }
    for (uint32_t i = 0; i < (uint32_t)l->cin * l->hin * l->win; i++) {
        const int32_t x = (int32_t)((a[i] + l->in_offset) * (INT64_C(1) << 20));
        const int32_t y = (int32_t)((b[i] + l->in2_offset) * (INT64_C(1) << 20));
        const int64_t sum = (int64_t)gemmlowp_requantize(x, l->multiplier[0], l->shift[0]) +
                            gemmlowp_requantize(y, l->multiplier[1], l->shift[1]);
        out[i] = clamped((int64_t)gemmlowp_requantize((int32_t)sum, l->multiplier[2], l->shift[2]) + l->out_offset, l);
    }
    return TN_OK;
}

tn_status ref_mul(const tn_layer *l, const int8_t *a, const int8_t *b, int8_t *out) {
    if (l->kind != TN_MUL) {
        return TN_ERR_MODEL;
    }
    const int32_t shift = l->shift[0];
    for (uint32_t i = 0; i < (uint32_t)l->cin * l->hin * l->win; i++) {
        const int64_t product = (int64_t)(a[i] + l->in_offset) * (b[i] + l->in2_offset);
        const int32_t x = (int32_t)(shift < 0 ? product * (INT64_C(1) << -shift) : product); /* TFLite's left shift */
        const int32_t v = gemmlowp_rdbpot(gemmlowp_srdhm(x, l->multiplier[0]), shift < 0 ? 0 : shift);
        out[i] = clamped((int64_t)v + l->out_offset, l);
    }
    return TN_OK;
}

tn_status ref_concat(const tn_layer *l, const int8_t *in, int8_t *out) {
    if (l->kind != TN_CONCAT) {
        return TN_ERR_MODEL;
    }
    for (uint32_t p = 0; p < (uint32_t)l->hin * l->win; p++) {
        for (uint32_t c = 0; c < l->cin; c++) {
            out[p * l->cout + (uint32_t)l->in2_offset + c] = in[p * l->cin + c];
        }
    }
    return TN_OK;
}

tn_status ref_forward(const tn_model *m, const int8_t *input, int32_t *logits) {
    static int8_t arena[TN_ARENA_BYTES];
    static int32_t pooled[TN_MAX_CHANNELS];
    if (m->arena_bytes > TN_ARENA_BYTES) {
        return TN_ERR_ARENA;
    }
    for (uint32_t i = 0; i < m->input_bytes; i++) {
        arena[m->input_offset + i] = input[i];
    }
    tn_status status = TN_OK;
    for (uint16_t i = 0; i < m->n_layers && status == TN_OK; i++) {
        const tn_layer *l = &m->layers[i];
        const int8_t *in = arena + l->src;
        int8_t *out = arena + l->dst;
        if (l->kind == TN_CONV) {
            status = ref_conv(l, in, out);
        } else if (l->kind == TN_ADD) {
            status = ref_add(l, in, arena + l->src2, out);
        } else if (l->kind == TN_CONCAT) {
            status = ref_concat(l, in, out);
        } else if (l->kind == TN_POOL) {
            status = ref_pool(l, in, pooled);
        } else {
            status = ref_dense(l, pooled, logits);
        }
    }
    return status;
}
