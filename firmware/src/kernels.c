/* int8 kernels: conv (1-D and 2-D), global sum pool, dense, with TFLite's requantization. */
#include "tn.h"

static int32_t srdhm(int32_t a, int32_t b) {
    if (a == INT32_MIN && b == INT32_MIN) {
        return INT32_MAX;
    }
    int64_t ab = (int64_t)a * (int64_t)b;
    int64_t x = ab + (ab >= 0 ? (INT64_C(1) << 30) : (INT64_C(1) - (INT64_C(1) << 30)));
    /* x / 2^31, truncated toward zero (as C's division), without a 64-bit divide call */
    return (int32_t)(x >= 0 ? x >> 31 : -((-x) >> 31));
}

static int32_t rounding_divide_by_pot(int32_t x, int32_t exponent) {
    int32_t mask = (int32_t)((UINT32_C(1) << exponent) - 1u);
    int32_t remainder = x & mask;
    int32_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);
    return (x >> exponent) + (remainder > threshold ? 1 : 0);
}

int32_t tn_requantize(int32_t acc, int32_t multiplier, int32_t shift) {
    return rounding_divide_by_pot(srdhm(acc, multiplier), shift);
}

static int8_t clamp_out(const tn_layer *l, int32_t acc, uint32_t oc) {
    int32_t v = tn_requantize(acc, l->multiplier[oc], l->shift[oc]) + l->out_offset;
    v = v < l->act_min ? l->act_min : v;
    v = v > l->act_max ? l->act_max : v;
    return (int8_t)v;
}

/* The plain kernel: every tap checks the padding. The benchmark's baseline. */
void tn_conv_tile_reference(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t oc, uint32_t oy) {
    for (uint32_t ox = 0; ox < l->wout; ox++) {
        int32_t acc = l->bias[oc];
        for (uint32_t ic = 0; ic < l->cin; ic++) {
            for (uint32_t ky = 0; ky < l->kh; ky++) {
                int32_t iy = (int32_t)(oy * l->stride + ky) - (int32_t)(l->kh > 1 ? l->pad : 0);
                for (uint32_t kx = 0; kx < l->kw; kx++) {
                    int32_t ix = (int32_t)(ox * l->stride + kx) - (int32_t)l->pad;
                    if (iy < 0 || iy >= (int32_t)l->hin || ix < 0 || ix >= (int32_t)l->win) {
                        continue;
                    }
                    int32_t x = in[((uint32_t)ic * l->hin + (uint32_t)iy) * l->win + (uint32_t)ix];
                    int32_t w = l->weight[((oc * l->cin + ic) * l->kh + ky) * l->kw + kx];
                    acc += (x + l->in_offset) * w;
                }
            }
        }
        out[(oc * l->hout + oy) * l->wout + ox] = clamp_out(l, acc, oc);
    }
}

#if defined(__ARM_FEATURE_DSP)
static inline uint32_t read_u32(const int8_t *p) {
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}
static inline uint32_t sxtb16(uint32_t x) { /* bytes 0 and 2, sign-extended to halfwords */
    uint32_t r;
    __asm__("sxtb16 %0, %1" : "=r"(r) : "r"(x));
    return r;
}
static inline uint32_t sxtb16_ror8(uint32_t x) { /* bytes 1 and 3 */
    uint32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(x));
    return r;
}
static inline int32_t smlad(uint32_t a, uint32_t b, int32_t acc) { /* acc + a.lo * b.lo + a.hi * b.hi */
    int32_t r;
    __asm__("smlad %0, %1, %2, %3" : "=r"(r) : "r"(a), "r"(b), "r"(acc));
    return r;
}
#endif

/* The fast kernel: the valid tap range is computed once per output position, so the inner loop
 * is a straight dot product; on cores with the DSP extension it takes two MACs per SMLAD. */
void tn_conv_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t oc, uint32_t oy) {
    const int32_t pad_y = (int32_t)(l->kh > 1 ? l->pad : 0);
    const int32_t iy0 = (int32_t)(oy * l->stride) - pad_y;
    const uint32_t ky0 = iy0 < 0 ? (uint32_t)(-iy0) : 0u;
    const uint32_t ky1 = (uint32_t)(iy0 + (int32_t)l->kh) > l->hin ? (uint32_t)((int32_t)l->hin - iy0) : l->kh;
    const int8_t *wc = l->weight + (uint32_t)oc * l->cin * l->kh * l->kw;
    for (uint32_t ox = 0; ox < l->wout; ox++) {
        const int32_t ix0 = (int32_t)(ox * l->stride) - (int32_t)l->pad;
        const uint32_t kx0 = ix0 < 0 ? (uint32_t)(-ix0) : 0u;
        const uint32_t kx1 = (uint32_t)(ix0 + (int32_t)l->kw) > l->win ? (uint32_t)((int32_t)l->win - ix0) : l->kw;
        const uint32_t n = kx1 - kx0;
        int32_t acc = l->bias[oc];
        int32_t wsum = 0;
        for (uint32_t ic = 0; ic < l->cin; ic++) {
            for (uint32_t ky = ky0; ky < ky1; ky++) {
                const int8_t *xp = in + ((uint32_t)ic * l->hin + (uint32_t)(iy0 + (int32_t)ky)) * l->win + (uint32_t)(ix0 + (int32_t)kx0);
                const int8_t *wp = wc + (ic * l->kh + ky) * l->kw + kx0;
                uint32_t k = 0;
#if defined(__ARM_FEATURE_DSP)
                for (; k + 4 <= n; k += 4) {
                    uint32_t xv = read_u32(xp + k), wv = read_u32(wp + k);
                    acc = smlad(sxtb16(xv), sxtb16(wv), acc);
                    acc = smlad(sxtb16_ror8(xv), sxtb16_ror8(wv), acc);
                    wsum += wp[k] + wp[k + 1] + wp[k + 2] + wp[k + 3];
                }
#endif
                for (; k < n; k++) {
                    acc += xp[k] * wp[k];
                    wsum += wp[k];
                }
            }
        }
        acc += l->in_offset * wsum; /* sum (x + offset) * w = sum x * w + offset * sum w, over the valid taps */
        out[(oc * l->hout + oy) * l->wout + ox] = clamp_out(l, acc, oc);
    }
}

void tn_pool(const tn_layer *l, const int8_t *in, int32_t *out) {
    const uint32_t positions = (uint32_t)l->hin * l->win;
    for (uint32_t c = 0; c < l->cin; c++) {
        int32_t sum = 0;
        for (uint32_t i = 0; i < positions; i++) {
            sum += in[c * positions + i] + l->in_offset;
        }
        out[c] = sum;
    }
}

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

uint16_t tn_argmax(const int32_t *logits, uint16_t n) {
    uint16_t best = 0;
    for (uint16_t i = 1; i < n; i++) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}
