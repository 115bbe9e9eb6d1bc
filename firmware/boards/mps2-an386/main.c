/* mps2-an386 board: runs every (vector, variant) job, keeping its place in non-volatile memory,
 * so a QEMU killed at any instruction and started again on the same backing file finishes
 * with the same results. Prints "OUT vector variant logits...", "BOOTS n", "MISMATCHES n".
 * Built with -DTN_DYNINFER, each vector runs the variant the voltage register affords. */
#include <stdint.h>

#include "model.h"
#include "tn.h"

void semihost_write(const char *s);

#ifndef TN_BOARD_VECTORS
#define TN_BOARD_VECTORS TN_N_VECTORS
#endif
#ifdef TN_DYNINFER
#define TN_JOBS TN_BOARD_VECTORS
#else
#define TN_JOBS (TN_BOARD_VECTORS * TN_N_VARIANTS)
#endif
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

/* The instruction-counting plugin records the count each time this runs. */
__attribute__((noinline)) void tn_mark(void) {
    __asm__ volatile("" ::: "memory");
}

#ifdef TN_PROFILE
/* Profiling build (-DTN_PROFILE -DTN_PROGRESS_HOOK=tn_progress_mark): a mark after every
 * commit, so the counts split an inference into its tiles and layers. */
void tn_progress_mark(uint32_t progress) {
    (void)progress;
    tn_mark();
}
#endif

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

int main(void) {
    if (board.magic != BOARD_MAGIC) { /* first boot on fresh non-volatile memory */
        board.next_job = 0u;
        board.boots = 0u;
        nv.magic = 0u;
        __asm__ volatile("" ::: "memory");
        board.magic = BOARD_MAGIC;
    }
    board.boots++;
    for (uint32_t job = board.next_job; job < TN_JOBS; job++) {
#ifdef TN_DYNINFER
        uint32_t vector = job;
        uint32_t voltage = tn_voltage_mv != 0u ? tn_voltage_mv : 3300u;
        uint32_t variant = nv.magic == TN_MAGIC && nv.run == job + 1u
                               ? nv.variant /* a run keeps the variant it started with */
                               : tn_choose_variant(tn_variants, TN_N_VARIANTS, voltage, 2000u, 10000u);
#else
        uint32_t vector = job / TN_N_VARIANTS, variant = job % TN_N_VARIANTS;
#endif
        const tn_model *m = tn_variants[variant];
        tn_mark();
        if (tn_start(&nv, m, variant, job + 1u, &tn_inputs_flat[vector * TN_INPUT_BYTES]) != TN_OK ||
            tn_resume(&nv, m, &scratch) != TN_OK) {
            semihost_write("error: model rejected\n");
            return 1;
        }
        tn_mark();
        for (uint32_t c = 0; c < TN_N_CLASSES; c++) {
            board.results[job][c] = nv.logits[c];
        }
        board.variant[job] = variant;
        __asm__ volatile("" ::: "memory");
        *(volatile uint32_t *)&board.next_job = job + 1u;
    }
    uint32_t mismatches = 0;
    static char line[16 + 12 * (TN_N_CLASSES + 2)];
    for (uint32_t job = 0; job < TN_JOBS; job++) {
#ifdef TN_DYNINFER
        uint32_t vector = job;
#else
        uint32_t vector = job / TN_N_VARIANTS;
#endif
        uint32_t variant = board.variant[job];
        const int32_t *want = &tn_expected_flat[(vector * TN_N_VARIANTS + variant) * TN_N_CLASSES];
        char *p = line;
        *p++ = 'O'; *p++ = 'U'; *p++ = 'T'; *p++ = ' ';
        p = put_int(p, (int32_t)vector);
        *p++ = ' ';
        p = put_int(p, (int32_t)variant);
        for (uint32_t c = 0; c < TN_N_CLASSES; c++) {
            *p++ = ' ';
            p = put_int(p, board.results[job][c]);
            mismatches += board.results[job][c] != want[c] ? 1u : 0u;
        }
        *p++ = '\n';
        *p = '\0';
        semihost_write(line);
    }
    char *p = line;
    const char *b = "BOOTS ";
    while (*b) *p++ = *b++;
    p = put_int(p, (int32_t)board.boots);
    *p++ = '\n';
    *p = '\0';
    semihost_write(line);
    p = line;
    b = "MISMATCHES ";
    while (*b) *p++ = *b++;
    p = put_int(p, (int32_t)mismatches);
    *p++ = '\n';
    *p = '\0';
    semihost_write(line);
    return mismatches == 0u ? 0 : 1;
}
