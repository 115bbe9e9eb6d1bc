/* The main of the boards with little non-volatile memory (stm32f405: 4 KB of backup SRAM;
 * nrf52840): runs every (vector, variant) job and prints "OUT vector variant logits..." as each
 * finishes, then "BOOTS n" and "MISMATCHES n". The state is small: a job's result is printed,
 * checked against the expected logits and committed with one word store (jobs done and
 * mismatches so far), and a job cut before its commit runs, and prints, again (the last line of
 * a job is its result). Built with -DTN_DYNINFER, each vector runs the variant the voltage
 * register affords. The board says where the state is at run time (board_nv_base).
 *
 * Built with -DTN_ATOMIC (the model's live tensors do not fit the non-volatile memory), the arena
 * is in RAM and a job cut by power starts its inference again; with -DTN_KEEP_INPUT each job's
 * sample is first copied into the non-volatile state and committed, so the inference redone reads
 * the sample it began with (without it the sensor, here the test vector, is read again). */
#include <stdint.h>

#include "board.h"

#ifdef TN_EARLY
#error "this board runs classifiers; early-decision models run on host and mps2-an386"
#endif

char *board_nv_base(void);
extern char _nv_start[];

#define BOARD_MAGIC 0x544E4231u /* "TNB1": the compact board state */

typedef struct {
    volatile uint32_t voltage_mv; /* written by the harness (DynInfer builds); 0: 3300 mV */
    uint32_t magic;
    uint32_t boots;
    uint32_t done; /* jobs done << 16 | mismatches so far: one word store commits both */
#ifdef TN_KEEP_INPUT
    uint32_t sampled; /* the job (+ 1) whose sample `input` holds: committed after the copy */
    int8_t input[TN_INPUT_BYTES];
#endif
    tn_nv nv;
} board_state;

/* Its image in .noinit: the linker checks that it fits the board's non-volatile region;
 * board_nv_base() says where it is at run time (stm32f405: backup SRAM on the chip, RAM under QEMU). */
__attribute__((section(".noinit"), used)) static board_state image;
static tn_scratch scratch; /* volatile RAM: .bss, cleared at every boot */

int main(void) {
    board_state *s = (board_state *)(void *)(board_nv_base() + ((char *)&image - _nv_start));
    if (s->magic != BOARD_MAGIC) { /* first boot on fresh non-volatile memory */
        s->done = 0u;
        s->boots = 0u;
        s->nv.magic = 0u;
#ifdef TN_KEEP_INPUT
        s->sampled = 0u;
#endif
        TN_COMPILER_BARRIER();
        s->magic = BOARD_MAGIC;
    }
    s->boots++;
    for (uint32_t job = s->done >> 16; job < TN_JOBS; job++) {
        uint32_t variant;
        uint32_t vector = board_job(&s->nv, job, s->voltage_mv, &variant);
        const tn_model *m = tn_variants[variant];
        const int8_t *sample = &tn_inputs_flat[vector * TN_INPUT_BYTES]; /* the sensor */
#ifdef TN_KEEP_INPUT
        if (s->sampled != job + 1u) {
            for (uint32_t i = 0; i < TN_INPUT_BYTES; i++) {
                s->input[i] = sample[i];
            }
            TN_COMPILER_BARRIER();
            *(volatile uint32_t *)&s->sampled = job + 1u;
        }
        sample = s->input;
#endif
        tn_mark();
        if (tn_start(&s->nv, m, variant, job + 1u, sample) != TN_OK ||
            tn_resume(&s->nv, m, &scratch) != TN_OK) {
            board_write("error: model rejected\n");
            return 1;
        }
        tn_mark();
        const int32_t *want = &tn_expected_flat[(vector * TN_N_VARIANTS + variant) * TN_N_CLASSES];
        int32_t values[2 + TN_N_CLASSES] = {(int32_t)vector, (int32_t)variant};
        uint32_t wrong = 0u;
        for (uint32_t c = 0; c < TN_N_CLASSES; c++) {
            values[2 + c] = s->nv.logits[c];
            wrong += s->nv.logits[c] != want[c];
        }
        board_line("OUT", values, 2 + TN_N_CLASSES);
        uint32_t mismatches = (s->done & 0xFFFFu) + wrong;
        TN_COMPILER_BARRIER();
        *(volatile uint32_t *)&s->done = (job + 1u) << 16 | (mismatches > 0xFFFFu ? 0xFFFFu : mismatches);
    }
    int32_t boots = (int32_t)s->boots, mismatches = (int32_t)(s->done & 0xFFFFu);
    board_line("BOOTS", &boots, 1);
    board_line("MISMATCHES", &mismatches, 1);
    return mismatches == 0 ? 0 : 1;
}
