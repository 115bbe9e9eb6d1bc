/* TFLite's requantization as one call (the C unit tests and tests/firmware check it against
 * gemmlowp). */
#include "kernel.h"

int32_t tn_requantize(int32_t acc, int32_t multiplier, int32_t shift) {
    return mbqm(acc, multiplier, shift);
}
