/* mps2-an386 board: runs every (vector, variant) job, keeping its place in non-volatile memory,
 * so a QEMU killed at any instruction and started again on the same backing file finishes
 * with the same results. Prints "OUT vector variant logits...", "BOOTS n", "MISMATCHES n".
 * Built with -DTN_DYNINFER, each vector runs the variant the voltage register affords. A model
 * with an early rule (TN_EARLY in model.h) instead streams every test series through
 * tn_early_update and prints "EARLY series samples class". */
#include <stdint.h>

#include "board.h"


#define BOARD_MAGIC 0x424F4152u

typedef struct {
    uint32_t magic;
    uint32_t next_job;  /* jobs done: committed with one word store */
    uint32_t boots;
    uint32_t variant[TN_JOBS];
    int32_t results[TN_JOBS][TN_N_CLASSES];
} board_state;

__attribute__((section(".tn_voltage"), used)) volatile uint32_t tn_voltage_mv; /* written by the harness */
__attribute__((section(".noinit"))) static board_state board;
__attribute__((section(".noinit"))) static tn_nv nv;
static tn_scratch scratch; /* volatile RAM: .bss, cleared at every boot */

#ifdef TN_PROFILE
/* Profiling build (-DTN_PROFILE -DTN_PROGRESS_HOOK=tn_progress_mark): a mark after every
 * commit, so the counts split an inference into its tiles and layers. */
void tn_progress_mark(uint32_t progress) {
    (void)progress;
    tn_mark();
}
#endif

#ifdef TN_EARLY
/* An early-rule model: every test series, sample by sample, to its decision; a cut anywhere
 * resumes at the step non-volatile memory holds. Prints "EARLY series samples class". */
__attribute__((section(".noinit"))) static uint32_t decided[TN_EARLY_SERIES][2];
__attribute__((section(".noinit"))) static tn_early_nv early_nv;

/* board.next_job counts the series decided */
static int early_main(void) {
    for (uint32_t s = board.next_job; s < TN_EARLY_SERIES; s++) {
        tn_decision d = {0u, 0u, 0u, 0u};
        if (tn_early_begin(&early_nv, &tn_early_rule, s + 1u) != TN_OK) {
            board_write("error: early rule rejected\n");
            return 1;
        }
        const int8_t *samples = &tn_early_series_flat[s * TN_EARLY_LENGTH * TN_EARLY_CHANNELS];
        tn_mark();
        for (uint32_t t = early_nv.t > 0u ? early_nv.t : 1u; t <= TN_EARLY_LENGTH; t++) {
            if (tn_early_update(&tn_early_rule, &early_nv, &nv, &scratch, t, &samples[(t - 1u) * TN_EARLY_CHANNELS],
                                &d) != TN_OK) {
                board_write("error: early rule rejected\n");
                return 1;
            }
            if (d.stop) {
                break;
            }
        }
        tn_mark();
        decided[s][0] = d.t;
        decided[s][1] = d.label;
        TN_COMPILER_BARRIER();
        *(volatile uint32_t *)&board.next_job = s + 1u;
    }
    int32_t mismatches = 0;
    for (uint32_t s = 0; s < TN_EARLY_SERIES; s++) {
        int32_t v[3] = {(int32_t)s, (int32_t)decided[s][0], (int32_t)decided[s][1]};
        board_line("EARLY", v, 3);
        mismatches += decided[s][0] != tn_early_expected[2u * s] || decided[s][1] != tn_early_expected[2u * s + 1u];
    }
    int32_t boots = (int32_t)board.boots;
    board_line("BOOTS", &boots, 1);
    board_line("MISMATCHES", &mismatches, 1);
    return mismatches == 0 ? 0 : 1;
}
#endif

int main(void) {
    if (board.magic != BOARD_MAGIC) { /* first boot on fresh non-volatile memory */
        board.next_job = 0u;
        board.boots = 0u;
        nv.magic = 0u;
#ifdef TN_EARLY
        early_nv.magic = 0u;
#endif
        TN_COMPILER_BARRIER();
        board.magic = BOARD_MAGIC;
    }
    board.boots++;
#ifdef TN_EARLY
    return early_main();
#endif
    for (uint32_t job = board.next_job; job < TN_JOBS; job++) {
        uint32_t variant;
        uint32_t vector = board_job(&nv, job, tn_voltage_mv, &variant);
        const tn_model *m = tn_variants[variant];
        tn_mark();
        if (tn_start(&nv, m, variant, job + 1u, &tn_inputs_flat[vector * TN_INPUT_BYTES]) != TN_OK ||
            tn_resume(&nv, m, &scratch) != TN_OK) {
            board_write("error: model rejected\n");
            return 1;
        }
        tn_mark();
        for (uint32_t c = 0; c < TN_N_CLASSES; c++) {
            board.results[job][c] = nv.logits[c];
        }
        board.variant[job] = variant;
        TN_COMPILER_BARRIER();
        *(volatile uint32_t *)&board.next_job = job + 1u;
    }
    int32_t mismatches = 0;
    for (uint32_t job = 0; job < TN_JOBS; job++) {
#ifdef TN_DYNINFER
        uint32_t vector = job;
#else
        uint32_t vector = job / TN_N_VARIANTS;
#endif
        uint32_t variant = board.variant[job];
        const int32_t *want = &tn_expected_flat[(vector * TN_N_VARIANTS + variant) * TN_N_CLASSES];
        int32_t values[2 + TN_N_CLASSES] = {(int32_t)vector, (int32_t)variant};
        for (uint32_t c = 0; c < TN_N_CLASSES; c++) {
            values[2 + c] = board.results[job][c];
            mismatches += board.results[job][c] != want[c];
        }
        board_line("OUT", values, 2 + TN_N_CLASSES);
    }
    int32_t boots = (int32_t)board.boots;
    board_line("BOOTS", &boots, 1);
    board_line("MISMATCHES", &mismatches, 1);
    return mismatches == 0 ? 0 : 1;
}
