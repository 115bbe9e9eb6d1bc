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

/* ---- The packed path (tn_layer.packed): cin a multiple of 8, cout of 4, an output range of int8 -----
 * Four output rows at a time, their weights interleaved in the stream four inputs by four (one LDM
 * loads the four rows' words, one pointer walks the whole layer), the input offset folded into the
 * biases (export.cgen adds offset x the row's sum), so each input word is only sign-extended (two
 * SXTB16, lanes (x0, x2), (x1, x3)) and each weight word too, in the same lanes: two SMLADs per row,
 * 20 instructions for 16 MACs. The output stage doubles the sum (LSL) and takes requant_doubled's row. */
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
/* What fc_packed reads besides the stream: byte offsets fixed by the assembly below. */
typedef struct {
    void *out;              /* 0: the next block's outputs (int8, or int32 for the logits) */
    const void *out_end;    /* 4 */
    const int8_t *x, *x_end; /* 8, 12: the input row */
} fc_job;

/* Four inputs against the block's four rows. Registers: r0-r3 the sums, r4 the input, r5 its end, r6
 * the stream, r7 and r8 the input's lanes, r9-r12 the rows' words, lr a row's lanes; the job on the
 * stack. */
#define TN_FC_ROW(acc, w)                                                                                              \
    "sxtb16 lr, " w "\n\tsmlad " acc ", r7, lr, " acc "\n\tsxtb16 " w ", " w ", ror #8\n\tsmlad " acc ", r8, " w ", "  \
    acc "\n\t"
#define TN_FC_GROUP                                                                                                    \
    "ldr r7, [r4], #4\n\tsxtb16 r8, r7, ror #8\n\tsxtb16 r7, r7\n\tldm r6!, {r9-r12}\n\t"                              \
    TN_FC_ROW("r0", "r9")                                                                                              \
    TN_FC_ROW("r1", "r10") TN_FC_ROW("r2", "r11") TN_FC_ROW("r3", "r12")
#define TN_FC_OUT(acc, m, base, shift)                                                                                 \
    "lsl " acc ", " acc ", #1\n\tsub " base ", " base ", " acc ", lsr #31\n\t"                                         \
    "smmlar " acc ", " acc ", " m ", " base "\n\tasr " acc ", " acc ", " shift "\n\t"                                  \
    "ssat " acc ", #8, " acc "\n\t"
#define TN_FC_ASM(STORE)                                                                                               \
    "push {r4-r11, lr}\n\t"                                                                                            \
    "str r1, [sp, #-8]!\n\t"                                                                                           \
    "mov r6, r0\n"                                                                                                     \
    "1:\n\t"                                                                                                           \
    "ldr lr, [sp]\n\tldrd r4, r5, [lr, #8]\n\tldm r6!, {r0-r3}\n"                                                      \
    "2:\n\t" TN_FC_GROUP TN_FC_GROUP "cmp r4, r5\n\tbne 2b\n\t"                                                        \
    "ldm r6!, {r7-r12}\n\t" TN_FC_OUT("r0", "r7", "r8", "r9") TN_FC_OUT("r1", "r10", "r11", "r12")                     \
    "ldm r6!, {r7-r12}\n\t" TN_FC_OUT("r2", "r7", "r8", "r9") TN_FC_OUT("r3", "r10", "r11", "r12")                     \
    "ldr lr, [sp]\n\tldrd r4, r5, [lr]\n\t" STORE "str r4, [lr]\n\tcmp r4, r5\n\tbne 1b\n\t"                           \
    "add sp, sp, #8\n\tpop {r4-r11, pc}"

/* int8 outputs, and the logits (the int8 values as int32). */
__attribute__((naked, noinline)) static void fc_packed8(const int32_t *stream, fc_job *job) {
    (void)stream, (void)job;
    __asm__(TN_FC_ASM("strb r0, [r4], #1\n\tstrb r1, [r4], #1\n\tstrb r2, [r4], #1\n\tstrb r3, [r4], #1\n\t"));
}
__attribute__((naked, noinline)) static void fc_packed32(const int32_t *stream, fc_job *job) {
    (void)stream, (void)job;
    __asm__(TN_FC_ASM("stm r4!, {r0-r3}\n\t"));
}
#undef TN_FC_ROW
#undef TN_FC_GROUP
#undef TN_FC_OUT
#undef TN_FC_ASM
#endif

static void fc_packed(const tn_layer *l, const int8_t *in, int8_t *out8, int32_t *out32) {
#if defined(__ARM_FEATURE_DSP) && defined(__thumb2__)
    fc_job job = {out8, out8 + l->cout, in, in + l->cin};
    if (out8 == 0) {
        job.out = out32;
        job.out_end = out32 + l->cout;
    }
    (out8 != 0 ? fc_packed8 : fc_packed32)(l->packed, &job);
#else /* the same arithmetic in C (the host build) */
    const int32_t *w = l->packed;
    for (uint32_t o = 0; o < l->cout; o += 4u) {
        uint32_t acc[4] = {(uint32_t)w[0], (uint32_t)w[1], (uint32_t)w[2], (uint32_t)w[3]}; /* wraps as SMLAD does */
        w += 4;
        for (uint32_t i = 0; i < l->cin; i += 4u, w += 4) {
            for (uint32_t k = 0; k < 4u; k++) {
                const int8_t *row = (const int8_t *)&w[k]; /* four int8 weights in memory order */
                acc[k] += (uint32_t)(in[i] * row[0] + in[i + 1u] * row[1] + in[i + 2u] * row[2] + in[i + 3u] * row[3]);
            }
        }
        for (uint32_t k = 0; k < 4u; k++, w += 3) {
            const int32_t v = requant_doubled((int32_t)(acc[k] << 1), w), c = v < -128 ? -128 : v > 127 ? 127 : v;
            if (out8 != 0) {
                out8[o + k] = (int8_t)c;
            } else {
                out32[o + k] = c;
            }
        }
    }
#endif
}

/* Four outputs at a time, then two, then one: each input word is widened once (the offset added,
 * SXTAB16) and feeds two SMLADs per output row, two MACs each. */
void tn_fc(const tn_layer *l, const int8_t *in, int8_t *out8, int32_t *out32) {
    if (l->packed != 0) {
        fc_packed(l, in, out8, out32);
        return;
    }
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
