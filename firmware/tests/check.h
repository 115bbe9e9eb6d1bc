/* A tiny test harness for the firmware's C unit tests: no framework, no malloc.
 *
 * A test is `static check_status test_x(void)`; CHECK returns CHECK_FAIL from it at the first
 * failed condition, after printing where and why, so one broken case does not bury the report
 * under thousands of follow-on failures. RUN counts failures so every test still runs. */
#ifndef TN_CHECK_H
#define TN_CHECK_H

#include <stdint.h>
#include <stdio.h>

typedef enum { CHECK_OK = 0, CHECK_FAIL = 1 } check_status;

#define CHECK_MSG(cond, ...)                                                    \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: %s: CHECK(%s) failed: ", __FILE__, __LINE__, \
                    __func__, #cond);                                           \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            return CHECK_FAIL;                                                  \
        }                                                                       \
    } while (0)

#define CHECK(cond) CHECK_MSG(cond, "%s", "")

/* Both sides printed, widened to long long so any integer type fits. */
#define CHECK_EQ(a, b)                                                               \
    CHECK_MSG((long long)(a) == (long long)(b), "%s = %lld, %s = %lld", #a, (long long)(a), \
              #b, (long long)(b))

#define RUN(failures, test)                                            \
    do {                                                               \
        check_status s_ = test();                                      \
        printf("%s %s\n", s_ == CHECK_OK ? "ok  " : "FAIL", #test);    \
        (failures) += s_ == CHECK_OK ? 0 : 1;                          \
    } while (0)

/* Seeded xorshift32: the same "random" cases on every machine and every run. */
typedef struct {
    uint32_t state;
} check_rng;

static inline uint32_t check_next(check_rng *r) {
    uint32_t x = r->state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    r->state = x;
    return x;
}

/* Uniform in [lo, hi] (inclusive); the modulo bias is irrelevant for test inputs. */
static inline int32_t check_range(check_rng *r, int32_t lo, int32_t hi) {
    uint32_t span = (uint32_t)((int64_t)hi - (int64_t)lo + 1);
    uint32_t v = span == 0u ? check_next(r) : check_next(r) % span; /* span 0: the whole int32 range */
    return (int32_t)((int64_t)lo + (int64_t)v);
}

/* gemmlowp's SaturatingRoundingDoublingHighMul and RoundingDivideByPOT as gemmlowp writes them
 * (fixedpoint.h), in 64-bit arithmetic with C's truncating division: an independent definition
 * of what the firmware's shifted, floor-based form must equal. */
static inline int32_t gemmlowp_srdhm(int32_t a, int32_t b) {
    if (a == INT32_MIN && b == INT32_MIN) {
        return INT32_MAX;
    }
    int64_t ab = (int64_t)a * (int64_t)b;
    int64_t nudge = ab >= 0 ? (INT64_C(1) << 30) : (INT64_C(1) - (INT64_C(1) << 30));
    return (int32_t)((ab + nudge) / (INT64_C(1) << 31));
}

static inline int32_t gemmlowp_rdbpot(int32_t x, int32_t exponent) {
    int64_t mask = (INT64_C(1) << exponent) - 1;
    int64_t remainder = (int64_t)x & mask;
    int64_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);
    int64_t floor = (int64_t)x >= 0 ? (int64_t)x / (INT64_C(1) << exponent)
                                    : -((-(int64_t)x + (INT64_C(1) << exponent) - 1) / (INT64_C(1) << exponent));
    return (int32_t)(floor + (remainder > threshold ? 1 : 0));
}

static inline int32_t gemmlowp_requantize(int32_t acc, int32_t multiplier, int32_t shift) {
    return gemmlowp_rdbpot(gemmlowp_srdhm(acc, multiplier), shift);
}

#endif
