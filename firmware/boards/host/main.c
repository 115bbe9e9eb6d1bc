/* Host board: runs the generated model's test vectors; `cuts` injects a power failure after
 * every progress point (the harness longjmps out of the progress hook, wipes volatile state,
 * and restarts from what non-volatile memory holds).
 *
 *   host_fw run [VARIANT]        every vector, prints "OUT vector variant logits...", checks them
 *   host_fw cuts [VECTORS]       a cut at every progress point of each of the first VECTORS vectors
 *   host_fw dyn VOLTAGE_MV       DynInfer: the variant the voltage register affords, per vector
 *   host_fw early                an early-rule model (TN_EARLY): every test series sample by
 *                                sample, "EARLY series samples class", checked against edge.classify.early
 *   host_fw early-cuts [SERIES]  a cut after every commit (tiles and steps) of the first SERIES
 *   host_fw layers [VARIANT]     the first vector; after each layer's last tile, "LAYER index v1 v2 ..."
 *                                (its output tensor, or the logits of the last one): what a peer's
 *                                kernels are checked against layer by layer (bench/cmsis_nn.py)
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "tn.h"

static tn_nv nv; /* stands for FRAM: the harness decides what survives */
static tn_scratch scratch; /* volatile RAM */
static jmp_buf power_fail;
static uint32_t cut_at; /* progress value after whose commit power fails; 0 = never */
static unsigned long reboots;

static unsigned long commits, cut_commit; /* early-cuts: cut after commit number cut_commit (0 = never) */

static const tn_model *dumped; /* layers: the model whose layer outputs are printed */
static uint32_t dumped_layer;  /* the next layer to print */

/* After layer `dumped_layer`'s last tile (its tiles so far: the model cut after it), print its output. */
static void dump_layer(uint32_t progress) {
    tn_model upto = *dumped;
    upto.n_layers = (uint16_t)(dumped_layer + 1u);
    if (dumped_layer >= dumped->n_layers || progress != tn_total_tiles(&upto)) {
        return;
    }
    const tn_layer *l = &dumped->layers[dumped_layer];
    const uint32_t n = (uint32_t)l->cout * l->hout * l->wout;
    printf("LAYER %u", (unsigned)dumped_layer);
    for (uint32_t i = 0; i < n; i++) {
        printf(" %d", dumped_layer + 1u == dumped->n_layers ? (int)nv.logits[i] : (int)nv.arena[l->dst + i]);
    }
    printf("\n");
    dumped_layer++;
}

void tn_progress_hook(uint32_t progress) {
    commits++;
    if (dumped != NULL) {
        dump_layer(progress);
    }
    if ((cut_at != 0u && progress == cut_at) || (cut_commit != 0u && commits == cut_commit)) {
        cut_at = 0u;
        cut_commit = 0u;
        longjmp(power_fail, 1);
    }
}

#ifdef TN_EARLY
static tn_early_nv early_nv; /* non-volatile, with nv */

/* One series to its decision; a power cut longjmps back here and the series resumes at the
 * step non-volatile memory holds. */
static int run_series(uint32_t series, tn_decision *d) {
    static int8_t garbage[TN_EARLY_CHANNELS];
    volatile int resumed = 0;
    if (setjmp(power_fail) != 0) {
        reboots++;
        resumed = 1;
    }
    memset(garbage, 0x55, sizeof garbage);
    if (tn_early_begin(&early_nv, &tn_early_rule, series + 1u) != TN_OK) {
        return -1;
    }
    const int8_t *samples = &tn_early_series_flat[(size_t)series * TN_EARLY_LENGTH * TN_EARLY_CHANNELS];
    for (uint32_t t = early_nv.t > 0u ? early_nv.t : 1u; t <= TN_EARLY_LENGTH; t++) {
        /* after a cut, a step whose sample the ring holds gets another (a sensor read again): ignored */
        const int8_t *sample = resumed && early_nv.sampled == t && early_nv.t < t ? garbage
                                                                                 : &samples[(t - 1u) * TN_EARLY_CHANNELS];
        if (tn_early_update(&tn_early_rule, &early_nv, &nv, &scratch, t, sample, d) != TN_OK) {
            return -1;
        }
        if (d->stop) {
            break;
        }
    }
    return d->t == tn_early_expected[2u * series] && d->label == tn_early_expected[2u * series + 1u] ? 0 : 1;
}

static int early_main(int argc, char **argv) {
    tn_decision d;
    if (strcmp(argv[1], "early") == 0) {
        unsigned long mismatches = 0;
        for (uint32_t s = 0; s < TN_EARLY_SERIES; s++) {
            memset(&early_nv, 0, sizeof early_nv);
            int r = run_series(s, &d);
            if (r < 0) {
                fprintf(stderr, "error: early rule rejected\n");
                return 2;
            }
            mismatches += (unsigned long)r;
            printf("EARLY %u %u %u\n", (unsigned)s, (unsigned)d.t, (unsigned)d.label);
        }
        printf("MISMATCHES %lu\n", mismatches);
        return mismatches == 0 ? 0 : 1;
    }
    uint32_t series = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 1u;
    unsigned long trials = 0, identical = 0;
    for (uint32_t s = 0; s < series && s < TN_EARLY_SERIES; s++) {
        memset(&early_nv, 0, sizeof early_nv);
        commits = 0;
        if (run_series(s, &d) != 0) {
            return 1;
        }
        const unsigned long total = commits;
        for (unsigned long cut = 1; cut <= total; cut++) {
            memset(&early_nv, 0, sizeof early_nv);
            memset(&nv, 0, sizeof nv);
            commits = 0;
            cut_commit = cut;
            unsigned long before = reboots;
            int r = run_series(s, &d);
            trials++;
            identical += (r == 0 && reboots == before + 1u) ? 1u : 0u;
        }
    }
    printf("CUTS %lu IDENTICAL %lu REBOOTS %lu\n", trials, identical, reboots);
    return trials == identical && trials > 0 ? 0 : 1;
}
#endif

static const int32_t *expected(uint32_t vector, uint32_t variant) {
    return &tn_expected_flat[((size_t)vector * TN_N_VARIANTS + variant) * TN_N_CLASSES];
}

static int run_vector(uint32_t vector, uint32_t variant, uint32_t run_id) {
    const tn_model *m = tn_variants[variant];
    if (setjmp(power_fail) != 0) {
        reboots++; /* power is back: volatile state is gone, nv is what it was */
    }
    if (tn_start(&nv, m, variant, run_id, &tn_inputs_flat[(size_t)vector * TN_INPUT_BYTES]) != TN_OK) {
        return -1;
    }
    if (tn_resume(&nv, m, &scratch) != TN_OK) {
        return -1;
    }
    return memcmp(nv.logits, expected(vector, variant), sizeof(int32_t) * TN_N_CLASSES) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "run";
    uint32_t run_id = 1;
#ifdef TN_EARLY
    if (strcmp(mode, "early") == 0 || strcmp(mode, "early-cuts") == 0) {
        return early_main(argc, argv);
    }
#endif
    if (strcmp(mode, "run") == 0 || strcmp(mode, "dyn") == 0) {
        int only = -1;
        uint32_t voltage_mv = 0;
        if (strcmp(mode, "run") == 0 && argc > 2) {
            only = atoi(argv[2]);
        }
        if (strcmp(mode, "dyn") == 0) {
            voltage_mv = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 3300u;
        }
        unsigned long mismatches = 0;
        for (uint32_t v = 0; v < TN_N_VECTORS; v++) {
            for (uint32_t k = 0; k < TN_N_VARIANTS; k++) {
                uint32_t variant = k;
                if (strcmp(mode, "dyn") == 0) {
                    if (k > 0) break;
                    variant = tn_choose_variant(tn_variants, TN_N_VARIANTS, voltage_mv, 2000u, 10000u);
                } else if (only >= 0 && (uint32_t)only != k) {
                    continue;
                }
                int r = run_vector(v, variant, run_id++);
                if (r < 0) {
                    fprintf(stderr, "error: model rejected\n");
                    return 2;
                }
                mismatches += (unsigned long)r;
                printf("OUT %u %u", (unsigned)v, (unsigned)variant);
                for (uint32_t c = 0; c < TN_N_CLASSES; c++) {
                    printf(" %ld", (long)nv.logits[c]);
                }
                printf("\n");
            }
        }
        printf("MISMATCHES %lu\n", mismatches);
        return mismatches == 0 ? 0 : 1;
    }
    if (strcmp(mode, "layers") == 0) {
        const uint32_t variant = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 0u;
        if (variant >= TN_N_VARIANTS) {
            fprintf(stderr, "error: variant %u of %u\n", (unsigned)variant, (unsigned)TN_N_VARIANTS);
            return 2;
        }
        dumped = tn_variants[variant];
        const int r = run_vector(0u, variant, run_id);
        printf("MISMATCHES %d\n", r);
        return r == 0 && dumped_layer == dumped->n_layers ? 0 : 1;
    }
    if (strcmp(mode, "cuts") == 0) {
        uint32_t vectors = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 2u;
        unsigned long trials = 0, identical = 0;
        for (uint32_t v = 0; v < vectors && v < TN_N_VECTORS; v++) {
            for (uint32_t k = 0; k < TN_N_VARIANTS; k++) {
                uint32_t total = tn_total_tiles(tn_variants[k]);
                for (uint32_t point = 1; point <= total; point++) {
                    memset(&nv, 0, sizeof nv);
                    cut_at = point;
                    unsigned long before = reboots;
                    int r = run_vector(v, k, run_id++);
                    trials++;
                    identical += (r == 0 && reboots == before + 1u) ? 1u : 0u;
                }
            }
        }
        printf("CUTS %lu IDENTICAL %lu REBOOTS %lu\n", trials, identical, reboots);
        return trials == identical ? 0 : 1;
    }
    fprintf(stderr, "usage: %s run [VARIANT] | cuts [VECTORS] | dyn VOLTAGE_MV | early | early-cuts [SERIES] | layers [VARIANT]\n",
            argv[0]);
    return 2;
}
