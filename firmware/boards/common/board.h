/* What the Cortex-M boards share (common/board.c): the jobs a run goes through, the console's
 * lines and the marker the instruction-counting plugin watches. */
#ifndef TN_BOARD_H
#define TN_BOARD_H
#include <stdint.h>

#include "model.h"
#include "tn.h"

#ifndef TN_BOARD_VECTORS
#define TN_BOARD_VECTORS TN_N_VECTORS
#endif
#ifdef TN_DYNINFER
#define TN_JOBS TN_BOARD_VECTORS /* each vector once, with the variant the voltage affords */
#else
#define TN_JOBS (TN_BOARD_VECTORS * TN_N_VARIANTS) /* every (vector, variant) */
#endif

void board_write(const char *s);                                    /* the board's console */
void board_line(const char *label, const int32_t *values, uint32_t n); /* "LABEL v1 v2 ...\n" */
void tn_mark(void); /* the plugin records the instruction count each time this runs */

/* Job ``job``'s test vector and (in *variant) its model variant; with TN_DYNINFER the variant the
 * voltage affords, or the one a run cut short started with (``nv``, ``voltage_mv``: 0 is 3300). */
uint32_t board_job(const tn_nv *nv, uint32_t job, uint32_t voltage_mv, uint32_t *variant);

#endif
