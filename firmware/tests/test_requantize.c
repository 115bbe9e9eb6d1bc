/* Requantization (kernel.h: SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT)
 * against vectors worked out by hand and against gemmlowp's own definition (check.h), which
 * rounds with a nudge and a truncating division where the firmware uses one floor shift. The
 * two must agree bit for bit: the firmware's logits are compared with onnxruntime's. */
#include "check.h"
#include "tn.h"

typedef struct {
    int32_t acc, multiplier, shift, want;
} vector;

/* Hand-checkable cases; m = 2^30 is 0.5, so the first step alone lands on halves. SRDHM rounds
 * a half up (toward +inf), RoundingDivideByPOT rounds a half away from zero. */
static const vector known[] = {
    {0, 1073741824, 0, 0},
    {100, 1073741824, 0, 50},
    {1, 1073741824, 0, 1},           /* 0.5 -> 1 */
    {-1, 1073741824, 0, 0},          /* -0.5 -> 0: half up, not away from zero */
    {3, 1073741824, 0, 2},           /* 1.5 -> 2 */
    {-3, 1073741824, 0, -1},         /* -1.5 -> -1 */
    {3, 1073741824, 1, 1},           /* 2 / 2 */
    {-3, 1073741824, 1, -1},         /* -1 / 2 = -0.5 -> -1: away from zero */
    {5, 1073741824, 1, 2},           /* 3 / 2 = 1.5 -> 2 */
    {-5, 1073741824, 1, -1},         /* -2 / 2 */
    {6, 1073741824, 2, 1},           /* 3 / 4 = 0.75 -> 1 */
    {-6, 1073741824, 2, -1},
    {2147483647, 2147483647, 0, 2147483646},
    {-2147483647 - 1, 2147483647, 0, -2147483647},
    {2147483647, 2147483647, 31, 1},
    {-2147483647 - 1, 2147483647, 31, -1},
    {-2147483647 - 1, 1073741824, 31, -1},
    {2147483647, 1073741824, 30, 1},
    {12345, 1518500250, 3, 1091},    /* 12345 / sqrt(2) = 8729.2; / 8 = 1091.2 */
    {-12345, 1518500250, 3, -1091},
    {300000, 1395864371, 11, 95},    /* 300000 * 0.65 = 195000; / 2048 = 95.2 */
    {-300000, 1395864371, 11, -95},
};

/* gemmlowp saturates INT32_MIN * INT32_MIN; the firmware never sees it (multipliers are positive
 * Q31, export.cgen checks), so only the reference is held to it. */
static check_status test_reference_on_known_vectors(void) {
    for (unsigned i = 0; i < sizeof known / sizeof known[0]; i++) {
        const vector *v = &known[i];
        CHECK_MSG(gemmlowp_requantize(v->acc, v->multiplier, v->shift) == v->want, "case %u", i);
    }
    CHECK_EQ(gemmlowp_srdhm(INT32_MIN, INT32_MIN), INT32_MAX);
    return CHECK_OK;
}

static check_status test_known_vectors(void) {
    for (unsigned i = 0; i < sizeof known / sizeof known[0]; i++) {
        const vector *v = &known[i];
        int32_t got = tn_requantize(v->acc, v->multiplier, v->shift);
        CHECK_MSG(got == v->want, "case %u: tn_requantize(%ld, %ld, %ld) = %ld, want %ld", i, (long)v->acc,
                  (long)v->multiplier, (long)v->shift, (long)got, (long)v->want);
    }
    return CHECK_OK;
}

static check_status agree(int32_t acc, int32_t multiplier, int32_t shift) {
    int32_t got = tn_requantize(acc, multiplier, shift), want = gemmlowp_requantize(acc, multiplier, shift);
    CHECK_MSG(got == want, "tn_requantize(%ld, %ld, %ld) = %ld, gemmlowp %ld", (long)acc, (long)multiplier,
              (long)shift, (long)got, (long)want);
    return CHECK_OK;
}

/* Every shift the firmware accepts, on the accumulators where rounding and overflow go wrong. */
static check_status test_extremes_match_gemmlowp(void) {
    static const int32_t accs[] = {0, 1, -1, 2, -2, INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1,
                                   1 << 30, -(1 << 30), 3 << 20, -(3 << 20), 65535, -65536};
    static const int32_t multipliers[] = {1, 1 << 30, INT32_MAX, 1518500250, 1395864371, (1 << 30) + 1};
    for (unsigned a = 0; a < sizeof accs / sizeof accs[0]; a++) {
        for (unsigned m = 0; m < sizeof multipliers / sizeof multipliers[0]; m++) {
            for (int32_t s = 0; s <= 31; s++) {
                if (agree(accs[a], multipliers[m], s) != CHECK_OK) {
                    return CHECK_FAIL;
                }
            }
        }
    }
    return CHECK_OK;
}

/* With m = 0.5 every odd accumulator is a tie of the first step, and every shift puts ties of
 * the second step among these accumulators. */
static check_status test_ties_match_gemmlowp(void) {
    for (int32_t acc = -4096; acc <= 4096; acc++) {
        for (int32_t s = 0; s <= 12; s++) {
            if (agree(acc, 1 << 30, s) != CHECK_OK) {
                return CHECK_FAIL;
            }
        }
    }
    return CHECK_OK;
}

static check_status test_random_match_gemmlowp(void) {
    check_rng rng = {0x9E3779B9u};
    for (int i = 0; i < 200000; i++) {
        int32_t acc = check_range(&rng, INT32_MIN, INT32_MAX);
        if (i % 2 == 0) {
            acc >>= check_range(&rng, 0, 24); /* conv accumulators are mostly small */
        }
        int32_t multiplier = check_range(&rng, 1 << 30, INT32_MAX); /* export.cgen's Q31 range [0.5, 1) */
        if (agree(acc, multiplier, check_range(&rng, 0, 24)) != CHECK_OK) {
            return CHECK_FAIL;
        }
    }
    return CHECK_OK;
}

int main(void) {
    int failures = 0;
    RUN(failures, test_reference_on_known_vectors);
    RUN(failures, test_known_vectors);
    RUN(failures, test_extremes_match_gemmlowp);
    RUN(failures, test_ties_match_gemmlowp);
    RUN(failures, test_random_match_gemmlowp);
    printf("test_requantize: %d failed\n", failures);
    return failures == 0 ? 0 : 1;
}
