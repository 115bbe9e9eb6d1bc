/* What the Cortex-M boards share: "LABEL v1 v2 ...\n" lines through the board's console
 * (board_write: semihosting on mps2-an386, USART1 on stm32f405), integers in decimal without
 * printf; the marker; each job's vector and variant. */
#include <stdint.h>

#include "board.h"

__attribute__((noinline)) void tn_mark(void) {
    TN_COMPILER_BARRIER();
}

uint32_t board_job(const tn_nv *nv, uint32_t job, uint32_t voltage_mv, uint32_t *variant) {
#ifdef TN_DYNINFER
    uint32_t voltage = voltage_mv != 0u ? voltage_mv : 3300u;
    *variant = nv->magic == TN_MAGIC && nv->run == job + 1u
                   ? nv->variant /* a run keeps the variant it started with */
                   : tn_choose_variant(tn_variants, TN_N_VARIANTS, voltage, 2000u, 10000u);
    return job;
#else
    (void)nv;
    (void)voltage_mv;
    *variant = job % TN_N_VARIANTS;
    return job / TN_N_VARIANTS;
#endif
}

static char *put_int(char *p, int32_t v) {
    char tmp[12];
    int n = 0;
    uint32_t u = v < 0 ? (uint32_t)(-(v + 1)) + 1u : (uint32_t)v;
    if (v < 0) {
        *p++ = '-';
    }
    do {
        tmp[n++] = (char)('0' + u % 10u);
        u /= 10u;
    } while (u != 0u);
    while (n > 0) {
        *p++ = tmp[--n];
    }
    return p;
}

void board_line(const char *label, const int32_t *values, uint32_t n) {
    static char line[16 + 12 * (TN_N_CLASSES + 3)];
    char *p = line;
    while (*label) *p++ = *label++;
    for (uint32_t i = 0; i < n; i++) {
        *p++ = ' ';
        p = put_int(p, values[i]);
    }
    *p++ = '\n';
    *p = '\0';
    board_write(line);
}
