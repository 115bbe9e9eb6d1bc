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

static void fc_store(const out_stage *s, int32_t acc, uint32_t o, int8_t *out8, int32_t *out32) {
    const int8_t v = requantize_out(s, acc, o);
    if (out8 != 0) {
        out8[o] = v;
    } else {
        out32[o] = v;
    }
}

#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
/* The dot products of four weight rows (w, cin bytes apart) with the input from x to x_end (a
 * multiple of 4 bytes, at least 4) on a Cortex-M4, written out (gcc spills four of the loop's
 * pointers: 31 instructions per four inputs, here 25). acc: the four sums (in and out), cin, and the
 * input offset in both halves. Registers: r0 x, r1 x_end, r2 rows 0 and 1, r3 rows 2 and 3
 * (w + 2 cin), r4-r7 the sums, r8 cin, r9 the offsets, r10 and r11 the widened input, r12 and lr
 * a weight word. */
__attribute__((naked, noinline)) static void fc_dot4(const int8_t *x, const int8_t *x_end, const int8_t *w,
                                                     int32_t *acc) {
    (void)x;
    (void)x_end;
    (void)w;
    (void)acc;
    __asm__("push {r4-r11, lr}\n\t"
            "ldm r3, {r4-r9}\n\t"
            "str r3, [sp, #-8]!\n\t"
            "add r3, r2, r8, lsl #1\n"
            "1:\n\t"
            "ldr r10, [r0], #4\n\t"
            "sxtab16 r11, r9, r10, ror #8\n\t"
            "sxtab16 r10, r9, r10\n\t"
            "ldr r12, [r2, r8]\n\t"
            "sxtb16 lr, r12\n\t"
            "smlad r5, r10, lr, r5\n\t"
            "sxtb16 r12, r12, ror #8\n\t"
            "smlad r5, r11, r12, r5\n\t"
            "ldr r12, [r2], #4\n\t"
            "sxtb16 lr, r12\n\t"
            "smlad r4, r10, lr, r4\n\t"
            "sxtb16 r12, r12, ror #8\n\t"
            "smlad r4, r11, r12, r4\n\t"
            "ldr r12, [r3, r8]\n\t"
            "sxtb16 lr, r12\n\t"
            "smlad r7, r10, lr, r7\n\t"
            "sxtb16 r12, r12, ror #8\n\t"
            "smlad r7, r11, r12, r7\n\t"
            "ldr r12, [r3], #4\n\t"
            "sxtb16 lr, r12\n\t"
            "smlad r6, r10, lr, r6\n\t"
            "sxtb16 r12, r12, ror #8\n\t"
            "smlad r6, r11, r12, r6\n\t"
            "cmp r0, r1\n\t"
            "bne 1b\n\t"
            "ldr r3, [sp], #8\n\t"
            "stm r3, {r4-r7}\n\t"
            "pop {r4-r11, pc}");
}
#endif

/* Four outputs at a time, then two, then one: each input word is widened once (the offset added,
 * SXTAB16) and feeds two SMLADs per output row, two MACs each. */
void tn_fc(const tn_layer *l, const int8_t *in, int8_t *out8, int32_t *out32) {
    const out_stage s = stage_of(l);
    const uint32_t cin = l->cin, body = cin & ~3u;
    const int32_t offset = l->in_offset;
    const uint32_t offsets = (uint32_t)(uint16_t)offset * 0x00010001u;
    uint32_t o = 0;
    for (; o + 4u <= l->cout; o += 4u) {
        const int8_t *w0 = l->weight + o * cin, *w1 = w0 + cin, *w2 = w1 + cin, *w3 = w2 + cin;
        int32_t a0 = l->bias[o], a1 = l->bias[o + 1u], a2 = l->bias[o + 2u], a3 = l->bias[o + 3u];
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
        if (body > 0u) {
            int32_t acc[6] = {a0, a1, a2, a3, (int32_t)cin, (int32_t)offsets};
            fc_dot4(in, in + body, w0, acc);
            a0 = acc[0];
            a1 = acc[1];
            a2 = acc[2];
            a3 = acc[3];
        }
#else
        for (uint32_t i = 0; i < body; i += 4u) {
            const uint32_t x = read_u32(in + i), xe = sxtab16(offsets, x), xo = sxtab16_ror8(offsets, x);
            uint32_t v = read_u32(w0 + i);
            a0 = smlad(xe, sxtb16(v), a0);
            a0 = smlad(xo, sxtb16_ror8(v), a0);
            v = read_u32(w1 + i);
            a1 = smlad(xe, sxtb16(v), a1);
            a1 = smlad(xo, sxtb16_ror8(v), a1);
            v = read_u32(w2 + i);
            a2 = smlad(xe, sxtb16(v), a2);
            a2 = smlad(xo, sxtb16_ror8(v), a2);
            v = read_u32(w3 + i);
            a3 = smlad(xe, sxtb16(v), a3);
            a3 = smlad(xo, sxtb16_ror8(v), a3);
        }
#endif
        for (uint32_t i = body; i < cin; i++) {
            const int32_t x = in[i] + offset;
            a0 += x * w0[i];
            a1 += x * w1[i];
            a2 += x * w2[i];
            a3 += x * w3[i];
        }
        fc_store(&s, a0, o, out8, out32);
        fc_store(&s, a1, o + 1u, out8, out32);
        fc_store(&s, a2, o + 2u, out8, out32);
        fc_store(&s, a3, o + 3u, out8, out32);
    }
    for (; o < l->cout; o += 2u) {
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
        fc_store(&s, a0, o, out8, out32);
        if (pair) {
            fc_store(&s, a1, o + 1u, out8, out32);
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
