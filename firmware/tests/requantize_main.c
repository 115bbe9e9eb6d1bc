/* Reads "acc multiplier shift" lines, prints tn_requantize of each: the test compares them with
 * gemmlowp's definition written out in Python. */
#include <stdio.h>

#include "tn.h"

int main(void) {
    long acc, multiplier, shift;
    while (scanf("%ld %ld %ld", &acc, &multiplier, &shift) == 3) {
        printf("%ld\n", (long)tn_requantize((int32_t)acc, (int32_t)multiplier, (int32_t)shift));
    }
    return 0;
}
