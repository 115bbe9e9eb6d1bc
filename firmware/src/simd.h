/* The Cortex-M4's DSP instructions the kernels use (private to firmware/src), and the same
 * instructions in C, so the host build runs the board's code path. */
#ifndef TN_SIMD_H
#define TN_SIMD_H
#include <stdint.h>

#if defined(__ARM_FEATURE_DSP)
/* ACLE intrinsics where GCC 12 makes of them code at least as fast as the instruction written out
 * (__smlad, __sxtab16: with them it schedules the conv loop better, 2.6 % fewer instructions per
 * inference, measured by trickle bench firmware). Inline assembly where it does not: __sxtb16
 * cost 0.3 % more; the "ror #8" forms, which GCC does not fold (__sxtb16(__ror(x, 8)) adds a MOV
 * per use); and PKHBT, PKHTB, which ACLE lacks. */
#include <arm_acle.h>

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
    return __smlad((int16x2_t)a, (int16x2_t)b, acc);
}
static inline uint32_t sxtab16(uint32_t a, uint32_t x) { /* halfwords of a + bytes 0 and 2 of x */
    return (uint32_t)__sxtab16((int16x2_t)a, (int8x4_t)x);
}
static inline uint32_t sxtab16_ror8(uint32_t a, uint32_t x) { /* halfwords of a + bytes 1 and 3 of x */
    uint32_t r;
    __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(a), "r"(x));
    return r;
}
static inline uint32_t pkhbt16(uint32_t lo, uint32_t hi) { /* lo's bottom half, hi's bottom half on top */
    uint32_t r;
    __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(r) : "r"(lo), "r"(hi));
    return r;
}
static inline uint32_t pkhtb16(uint32_t hi, uint32_t lo) { /* hi's top half, lo's top half below */
    uint32_t r;
    __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(r) : "r"(hi), "r"(lo));
    return r;
}

/* Each signed byte of v clamped to [lo, hi] (lo4, hi4: the bounds in every byte): SSUB8 sets a
 * byte's GE flag where the first operand's byte is at least the second's, SEL picks by it. */
static inline uint32_t clamp4(uint32_t v, uint32_t lo4, uint32_t hi4) {
    uint32_t t;
    __asm__("ssub8 %[t], %[v], %[lo]\n\tsel %[v], %[v], %[lo]\n\tssub8 %[t], %[hi], %[v]\n\tsel %[v], %[v], %[hi]"
            : [v] "+r"(v), [t] "=&r"(t)
            : [lo] "r"(lo4), [hi] "r"(hi4)
            : "cc");
    return v;
}

static inline uint32_t add16(uint32_t a, uint32_t b) { /* halfword by halfword, modulo 2^16 */
    return (uint32_t)__uadd16((uint16x2_t)a, (uint16x2_t)b);
}

static inline int32_t smlabb(uint32_t a, uint32_t b, int32_t acc) { /* acc + a.lo * b.lo */
    return __smlabb((int32_t)a, (int32_t)b, acc);
}
static inline int32_t smlatt(uint32_t a, uint32_t b, int32_t acc) { /* acc + a.hi * b.hi */
    return __smlatt((int32_t)a, (int32_t)b, acc);
}
static inline int32_t smlabt(uint32_t a, uint32_t b, int32_t acc) { /* acc + a.lo * b.hi */
    return __smlabt((int32_t)a, (int32_t)b, acc);
}
#else
static inline uint32_t sxtb16(uint32_t x) {
    return (uint32_t)(uint16_t)(int16_t)(int8_t)(uint8_t)(x & 0xFFu) |
           (uint32_t)(uint16_t)(int16_t)(int8_t)(uint8_t)((x >> 16) & 0xFFu) << 16;
}
static inline uint32_t sxtb16_ror8(uint32_t x) {
    return sxtb16(x >> 8);
}
static inline int32_t smlad(uint32_t a, uint32_t b, int32_t acc) {
    return acc + (int16_t)(a & 0xFFFFu) * (int16_t)(b & 0xFFFFu) + (int16_t)(a >> 16) * (int16_t)(b >> 16);
}
static inline uint32_t sxtab16(uint32_t a, uint32_t x) {
    const uint32_t e = sxtb16(x);
    return (uint32_t)(uint16_t)((uint16_t)a + (uint16_t)e) | (uint32_t)(uint16_t)((a >> 16) + (e >> 16)) << 16;
}
static inline uint32_t sxtab16_ror8(uint32_t a, uint32_t x) {
    return sxtab16(a, x >> 8);
}
static inline uint32_t clamp4(uint32_t v, uint32_t lo4, uint32_t hi4) {
    uint32_t r = 0;
    for (uint32_t i = 0; i < 32u; i += 8u) {
        const int8_t x = (int8_t)(v >> i), lo = (int8_t)(lo4 >> i), hi = (int8_t)(hi4 >> i);
        r |= (uint32_t)(uint8_t)(x < lo ? lo : x > hi ? hi : x) << i;
    }
    return r;
}
static inline uint32_t add16(uint32_t a, uint32_t b) {
    return (uint32_t)(uint16_t)(a + b) | (uint32_t)(uint16_t)((a >> 16) + (b >> 16)) << 16;
}
static inline int32_t smlabb(uint32_t a, uint32_t b, int32_t acc) {
    return acc + (int16_t)(a & 0xFFFFu) * (int16_t)(b & 0xFFFFu);
}
static inline int32_t smlatt(uint32_t a, uint32_t b, int32_t acc) {
    return acc + (int16_t)(a >> 16) * (int16_t)(b >> 16);
}
static inline int32_t smlabt(uint32_t a, uint32_t b, int32_t acc) {
    return acc + (int16_t)(a & 0xFFFFu) * (int16_t)(b >> 16);
}
#endif

#endif
