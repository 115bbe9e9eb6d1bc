/* The intermittent executor on two small models built here by hand (not by export.cgen): the
 * logits equal the reference network's, and a power failure at any progress point, or between
 * a tile's stores and its commit, resumes to the same logits bit for bit.
 *
 * Power fails the way the host board makes it fail (boards/host/main.c): the progress hook,
 * called after every commit, longjmps back to "power-on"; volatile state (the scratch) is
 * scrambled, and `nv` (standing for FRAM) is left as the cut found it.
 *
 * Built four ways by the Makefile: the shipped kernel, -DTN_REFERENCE_KERNEL (the plain conv),
 * -DTN_NO_PROGRESS (no commits: only the uninterrupted results are checked) and -DTN_ATOMIC (the
 * arena in volatile RAM, scrambled at every cut: a run cut short starts again from its input). */
#include <setjmp.h>
#include <string.h>

#include "check.h"
#include "reference.h"
#include "tn.h"

#define CONV_WEIGHTS __attribute__((aligned(4))) /* int16, read a word (LDM) at a time */

/* ---- model A: conv2d 3x3 pad 1 -> conv2d 2x2 stride 2 -> pool -> dense ------------------ */
static int8_t a_taps1[3 * 3 * 3 * 2], a_taps2[4 * 2 * 2 * 3], a_w4[3 * 4];
static int16_t a_w1[3 * 20] CONV_WEIGHTS, a_w2[4 * 12] CONV_WEIGHTS;
static int32_t a_b1[3], a_m1[3], a_s1[3], a_b2[4], a_m2[4], a_s2[4], a_b4[3];
static const tn_layer a_layers[4] = {
    /* kind cin hin win cout hout wout kh kw stride pad pad_h in_off out_off act_min act_max */
    /* ... weight bias multiplier shift stride_h dil_h dil_w in2_offset src src2 dst requant packed; the plan:
     * the input at 0 (40 bytes), conv1's output at 48 (60), conv2's at 0 over the dead input (16) */
    {TN_CONV, 2, 5, 4, 3, 5, 4, 3, 3, 1, 1, 1, 5, -10, -10, 127, (const int8_t *)a_w1, a_b1, a_m1, a_s1, 0, 0, 0, 0, 0, 0, 48, 0, 0},
    {TN_CONV, 3, 5, 4, 4, 2, 2, 2, 2, 2, 0, 0, 10, 3, -128, 127, (const int8_t *)a_w2, a_b2, a_m2, a_s2, 0, 0, 0, 0, 48, 0, 0, 0, 0},
    {TN_POOL, 4, 2, 2, 4, 1, 1, 0, 0, 0, 0, 0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {TN_DENSE, 4, 1, 1, 3, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, a_w4, a_b4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};
static const tn_model model_a = {"a", 4, a_layers, 5 * 4 * 2, 3, 0, 1000u, 900u, 112u, 0u};
#define A_TILES (10u + 2u + 1u + 1u) /* 20 positions / 2, 4 / 2, the pool, the classifier */

/* ---- model B: three conv1d (the second writes over the dead input, the third where the first
 * wrote), odd position counts (a lone last tile) -> pool -> dense ------------------------- */
static int8_t b_taps1[5 * 3 * 3], b_taps2[2 * 3 * 5], b_taps3[3 * 2 * 2];
static int16_t b_w1[5 * 12] CONV_WEIGHTS, b_w2[2 * 16] CONV_WEIGHTS, b_w3[3 * 4] CONV_WEIGHTS;
static int8_t b_w5[4 * 3];
static int32_t b_b1[5], b_m1[5], b_s1[5], b_b2[2], b_m2[2], b_s2[2], b_b3[3], b_m3[3], b_s3[3], b_b5[4];
static const tn_layer b_layers[5] = {
    {TN_CONV, 3, 1, 9, 5, 1, 5, 1, 3, 2, 1, 0, -7, 0, 0, 127, (const int8_t *)b_w1, b_b1, b_m1, b_s1, 0, 0, 0, 0, 0, 0, 32, 0, 0},
    {TN_CONV, 5, 1, 5, 2, 1, 5, 1, 3, 1, 1, 0, 0, -20, -20, 127, (const int8_t *)b_w2, b_b2, b_m2, b_s2, 0, 0, 0, 0, 32, 0, 0, 0, 0},
    {TN_CONV, 2, 1, 5, 3, 1, 4, 1, 2, 1, 0, 0, 20, 1, -128, 127, (const int8_t *)b_w3, b_b3, b_m3, b_s3, 0, 0, 0, 0, 0, 0, 32, 0, 0},
    {TN_POOL, 3, 1, 4, 3, 1, 1, 0, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0, 0, 0},
    {TN_DENSE, 3, 1, 1, 4, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, b_w5, b_b5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};
static const tn_model model_b = {"b", 5, b_layers, 9 * 3, 4, 0, 2000u, 950u, 64u, 0u};
#define B_TILES (3u + 3u + 2u + 1u + 1u)

/* ---- model C: a graph that branches: conv -> conv, the residual ADD of both, the concatenation
 * of the sum and the second conv along channels -> pool -> dense. The plan: the input at 0 (40
 * bytes), conv1's output at 48 (60), conv2's at 112 (60, read by the ADD and the concatenation),
 * the sum at 176 (60), the concatenation at 240 (120) ---------------------------------------- */
static int8_t c_taps1[3 * 3 * 3 * 2], c_taps2[3 * 3 * 3 * 3], c_w6[3 * 6];
static int16_t c_w1[3 * 20] CONV_WEIGHTS, c_w2[3 * 28] CONV_WEIGHTS;
static int32_t c_b1[3], c_m1[3], c_s1[3], c_b2[3], c_m2[3], c_s2[3], c_b6[3];
/* TFLite's ADD of inputs at scales 0.02 and 0.03 into 0.04: 0.02 / 0.06, 0.03 / 0.06, 0.06 / (2^20 0.04) */
static const int32_t c_add_m[3] = {1431655765, 1073741824, 1610612736}, c_add_s[3] = {1, 0, 19};
static const tn_layer c_layers[7] = {
    {TN_CONV, 2, 5, 4, 3, 5, 4, 3, 3, 1, 1, 1, 5, -10, -10, 127, (const int8_t *)c_w1, c_b1, c_m1, c_s1, 0, 0, 0, 0, 0, 0, 48, 0, 0},
    {TN_CONV, 3, 5, 4, 3, 5, 4, 3, 3, 1, 1, 1, 10, 3, -128, 127, (const int8_t *)c_w2, c_b2, c_m2, c_s2, 0, 0, 0, 0, 48, 0, 112, 0, 0},
    {TN_ADD, 3, 5, 4, 3, 5, 4, 0, 0, 0, 0, 0, -3, -7, -128, 100, 0, 0, c_add_m, c_add_s, 0, 0, 0, 10, 112, 48, 176, 0, 0},
    {TN_CONCAT, 3, 5, 4, 6, 5, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 176, 0, 240, 0, 0},
    {TN_CONCAT, 3, 5, 4, 6, 5, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 112, 0, 240, 0, 0},
    {TN_POOL, 6, 5, 4, 6, 1, 1, 0, 0, 0, 0, 0, -2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 240, 0, 0, 0, 0},
    {TN_DENSE, 6, 1, 1, 3, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, c_w6, c_b6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};
static const tn_model model_c = {"c", 7, c_layers, 5 * 4 * 2, 3, 0, 0u, 0u, 368u, 0u};
#define C_TILES (10u + 10u + 1u + 2u + 1u + 1u)

/* Weights, biases and requantization of a conv, seeded; the shift keeps outputs inside int8
 * for most positions, so the clamps are reached but the outputs are not all clamped. */
static check_status fill_conv(check_rng *rng, const tn_layer *l, int8_t *taps, int16_t *packed, int32_t *b, int32_t *m,
                              int32_t *s, int32_t shift) {
    for (uint32_t i = 0; i < (uint32_t)l->cout * l->kh * l->kw * l->cin; i++) {
        taps[i] = (int8_t)check_range(rng, -128, 127);
    }
    for (uint32_t oc = 0; oc < l->cout; oc++) {
        b[oc] = check_range(rng, -3000, 3000);
        m[oc] = check_range(rng, 1 << 30, INT32_MAX);
        s[oc] = shift;
    }
    CHECK_EQ(ref_pack_conv(l, taps, packed), TN_OK);
    return CHECK_OK;
}

static void fill_dense(check_rng *rng, const tn_layer *l, int8_t *w, int32_t *b) {
    for (uint32_t i = 0; i < (uint32_t)l->cout * l->cin; i++) {
        w[i] = (int8_t)check_range(rng, -128, 127);
    }
    for (uint32_t o = 0; o < l->cout; o++) {
        b[o] = check_range(rng, -50000, 50000);
    }
}

static check_status build_models(void) {
    check_rng rng = {2024u};
    if (fill_conv(&rng, &a_layers[0], a_taps1, a_w1, a_b1, a_m1, a_s1, 8) != CHECK_OK ||
        fill_conv(&rng, &a_layers[1], a_taps2, a_w2, a_b2, a_m2, a_s2, 8) != CHECK_OK ||
        fill_conv(&rng, &b_layers[0], b_taps1, b_w1, b_b1, b_m1, b_s1, 7) != CHECK_OK ||
        fill_conv(&rng, &b_layers[1], b_taps2, b_w2, b_b2, b_m2, b_s2, 8) != CHECK_OK ||
        fill_conv(&rng, &b_layers[2], b_taps3, b_w3, b_b3, b_m3, b_s3, 6) != CHECK_OK) {
        return CHECK_FAIL;
    }
    if (fill_conv(&rng, &c_layers[0], c_taps1, c_w1, c_b1, c_m1, c_s1, 8) != CHECK_OK ||
        fill_conv(&rng, &c_layers[1], c_taps2, c_w2, c_b2, c_m2, c_s2, 8) != CHECK_OK) {
        return CHECK_FAIL;
    }
    fill_dense(&rng, &c_layers[6], c_w6, c_b6);
    CHECK_EQ(sizeof c_w2 / 2u, 3u * tn_depth(&c_layers[1]));
    fill_dense(&rng, &a_layers[3], a_w4, a_b4);
    fill_dense(&rng, &b_layers[4], b_w5, b_b5);
    CHECK_EQ(sizeof a_w1 / 2u, 3u * tn_depth(&a_layers[0]));
    CHECK_EQ(sizeof a_w2 / 2u, 4u * tn_depth(&a_layers[1]));
    CHECK_EQ(sizeof b_w1 / 2u, 5u * tn_depth(&b_layers[0]));
    CHECK_EQ(sizeof b_w2 / 2u, 2u * tn_depth(&b_layers[1]));
    CHECK_EQ(sizeof b_w3 / 2u, 3u * tn_depth(&b_layers[2]));
    return CHECK_OK;
}

/* ---- the board: non-volatile state, volatile scratch, and the power switch --------------- */
static tn_nv nv;           /* FRAM: survives a cut */
static tn_scratch scratch; /* RAM: garbage after a cut */
static jmp_buf power_on;

#define MAX_COMMITS 256
static uint32_t commits[MAX_COMMITS]; /* every progress value committed, in order, over all boots */
static uint32_t n_commits;
static uint32_t cut_at;          /* cut power after the commit of this progress value; 0: never */
static int cut_every;            /* cut after every commit: each power-on finishes one tile */
static int lose_commit;          /* the cut falls between a tile's stores and its commit */
static uint32_t boots;

void tn_progress_hook(uint32_t progress) {
    if (n_commits < MAX_COMMITS) {
        commits[n_commits] = progress;
    }
    n_commits++;
    if (cut_every || (cut_at != 0u && progress == cut_at)) {
        cut_at = 0u;
        longjmp(power_on, 1);
    }
}

/* One run to its end, through as many power failures as the switches above make. Statics, not
 * locals, carry state across the longjmp (locals changed after setjmp are indeterminate). */
static tn_status run(const tn_model *m, uint32_t run_id, const int8_t *input) {
    boots = 1u;
    if (setjmp(power_on) != 0) {
        boots++;
        if (lose_commit) {
            nv.progress--; /* the tile's stores landed, its progress store did not */
            lose_commit = 0;
        }
        memset(&scratch, 0xA5, sizeof scratch);
#ifdef TN_ATOMIC
        memset(tn_volatile_arena, 0x3C, sizeof tn_volatile_arena); /* RAM holds nothing of the run */
#endif
        if (nv.progress >= tn_total_tiles(m)) {
            cut_every = 0; /* nothing left to cut: the last power-on only finds the run done */
        }
    }
    tn_status status = tn_start(&nv, m, 0u, run_id, input);
    return status != TN_OK ? status : tn_resume(&nv, m, &scratch);
}

static void power_up_fresh(void) {
    memset(&nv, 0xA5, sizeof nv); /* FRAM holds whatever it held: no magic, no zeros */
    memset(&scratch, 0x5A, sizeof scratch);
    n_commits = 0u;
    cut_at = 0u;
    cut_every = lose_commit = 0;
}

static check_status commits_are(uint32_t first, uint32_t last, uint32_t at) {
    for (uint32_t p = first; p <= last; p++, at++) {
        CHECK_MSG(at < n_commits && commits[at] == p, "commit %lu: %lu, want %lu", (unsigned long)at,
                  (unsigned long)(at < n_commits ? commits[at] : 0u), (unsigned long)p);
    }
    CHECK_EQ(at, n_commits);
    return CHECK_OK;
}

static int8_t input_a[5 * 4 * 2], input_b[9 * 3], input_c[5 * 4 * 2];

static check_status resume_everywhere(const tn_model *m, const int8_t *input, uint32_t tiles) {
    int32_t expect[TN_MAX_CLASSES], whole[TN_MAX_CLASSES];
    const size_t bytes = sizeof(int32_t) * m->n_classes;
    CHECK_EQ(tn_total_tiles(m), tiles);
    CHECK_EQ(ref_forward(m, input, expect), TN_OK);
    static int8_t flipped[TN_ARENA_BYTES];
    for (uint32_t i = 0; i < m->input_bytes; i++) {
        flipped[i] = (int8_t)~input[i];
    }
    CHECK_EQ(ref_forward(m, flipped, whole), TN_OK);
    CHECK_MSG(memcmp(whole, expect, bytes) != 0, "model %s: the logits do not depend on the input", m->name);

    power_up_fresh();
    CHECK_EQ(run(m, 1u, input), TN_OK);
    CHECK_EQ(boots, 1u);
    memcpy(whole, nv.logits, bytes);
    CHECK_MSG(memcmp(whole, expect, bytes) == 0, "model %s: logits differ from the reference network", m->name);
#ifdef TN_NO_PROGRESS
    CHECK_EQ(n_commits, 0u);
    (void)commits_are;
#elif defined(TN_ATOMIC)
    if (commits_are(1u, tiles, 0u) != CHECK_OK) {
        return CHECK_FAIL;
    }
    for (uint32_t k = 1; k < tiles; k++) {
        /* a cut after commit k: the arena is gone, the next power-on starts the run over */
        power_up_fresh();
        cut_at = k;
        CHECK_EQ(run(m, 1u, input), TN_OK);
        CHECK_EQ(boots, 2u);
        CHECK_MSG(memcmp(nv.logits, whole, bytes) == 0, "model %s: atomic, cut after commit %lu", m->name,
                  (unsigned long)k);
        CHECK_EQ(n_commits, k + tiles);
        CHECK_EQ(commits[k - 1u], k);
        CHECK_EQ(commits[k], 1u); /* from the first tile again */
    }
    /* a cut after the last commit finds the run done: its results survive, nothing is redone */
    power_up_fresh();
    cut_at = tiles;
    CHECK_EQ(run(m, 1u, input), TN_OK);
    CHECK_EQ(boots, 2u);
    CHECK_EQ(n_commits, tiles);
    CHECK(memcmp(nv.logits, whole, bytes) == 0);
#else
    if (commits_are(1u, tiles, 0u) != CHECK_OK) {
        return CHECK_FAIL;
    }
    for (uint32_t k = 1; k <= tiles; k++) {
        /* a cut right after commit k: the next power-on goes on with tile k + 1 */
        power_up_fresh();
        cut_at = k;
        CHECK_EQ(run(m, 1u, input), TN_OK);
        CHECK_EQ(boots, 2u);
        CHECK_MSG(memcmp(nv.logits, whole, bytes) == 0, "model %s: cut after commit %lu", m->name, (unsigned long)k);
        if (commits_are(1u, tiles, 0u) != CHECK_OK) { /* 1..k, then k + 1.. after power-on: no tile twice */
            return CHECK_FAIL;
        }

        /* a cut after tile k's stores but before its commit: tile k is done again over its own
         * outputs, reading an input no tile of its layer writes */
        power_up_fresh();
        cut_at = k;
        lose_commit = 1;
        CHECK_EQ(run(m, 1u, input), TN_OK);
        CHECK_EQ(boots, 2u);
        CHECK_MSG(memcmp(nv.logits, whole, bytes) == 0, "model %s: cut before commit %lu", m->name, (unsigned long)k);
        CHECK_EQ(n_commits, tiles + 1u);
        CHECK_EQ(commits[k - 1u], k);
        CHECK_EQ(commits[k], k); /* tile k redone */
    }

    /* a cut after every commit: each power-on gets exactly one tile further */
    power_up_fresh();
    cut_every = 1;
    CHECK_EQ(run(m, 1u, input), TN_OK);
    CHECK_EQ(boots, tiles + 1u);
    CHECK_MSG(memcmp(nv.logits, whole, bytes) == 0, "model %s: a cut at every commit", m->name);
    if (commits_are(1u, tiles, 0u) != CHECK_OK) {
        return CHECK_FAIL;
    }

    /* the same run id after it finished: nothing left to do. (Not under TN_NO_PROGRESS: it
     * starts again from the first layer, but tn_start keeps the input only while no conv has
     * overwritten its buffer, and the second conv does.) */
    n_commits = 0u;
    CHECK_EQ(run(m, 1u, input), TN_OK);
    CHECK_EQ(n_commits, 0u);
    CHECK(memcmp(nv.logits, whole, bytes) == 0);
#endif
    return CHECK_OK;
}

static check_status test_model_a_resumes_at_every_progress_point(void) {
    return resume_everywhere(&model_a, input_a, A_TILES);
}

static check_status test_model_b_resumes_at_every_progress_point(void) {
    return resume_everywhere(&model_b, input_b, B_TILES);
}

/* Where the graph branches, the tensors kept for later survive every cut: no tile writes bytes
 * another tile still reads. */
static check_status test_model_c_resumes_at_every_progress_point(void) {
    return resume_everywhere(&model_c, input_c, C_TILES);
}

/* A layer that would overwrite its own input, or reach past the arena, and a model whose arena
 * or input lies beyond what was built, are refused. */
static check_status test_routes_are_checked(void) {
    tn_layer layers[7];
    memcpy(layers, c_layers, sizeof layers);
    tn_model m = model_c;
    m.layers = layers;
    memset(&nv, 0, sizeof nv);
    CHECK_EQ(tn_start(&nv, &m, 0u, 3u, input_c), TN_OK);
    layers[2].dst = 112u + 59u; /* the ADD writing over the last byte of its first input */
    CHECK_EQ(tn_start(&nv, &m, 0u, 4u, input_c), TN_ERR_MODEL);
    layers[2].dst = 0u; /* ... over the first bytes of its second (48...) */
    CHECK_EQ(tn_start(&nv, &m, 0u, 4u, input_c), TN_ERR_MODEL);
    layers[2].dst = 368u - 59u; /* past the arena's end */
    CHECK_EQ(tn_start(&nv, &m, 0u, 5u, input_c), TN_ERR_ARENA);
    layers[2].dst = 176u;
    layers[2].src2 = 368u - 59u; /* an input past the arena's end */
    CHECK_EQ(tn_start(&nv, &m, 0u, 6u, input_c), TN_ERR_ARENA);
    layers[2].src2 = 48u;
    layers[4].in2_offset = 4; /* channels 4..6 of 6 */
    CHECK_EQ(tn_start(&nv, &m, 0u, 7u, input_c), TN_ERR_MODEL);
    layers[4].in2_offset = 3;
    m.arena_bytes = TN_ARENA_BYTES + 16u; /* a plan larger than the arena built */
    CHECK_EQ(tn_start(&nv, &m, 0u, 8u, input_c), TN_ERR_ARENA);
    m.arena_bytes = 368u;
    m.input_offset = 368u - 39u; /* the input reaching past the arena */
    CHECK_EQ(tn_start(&nv, &m, 0u, 9u, input_c), TN_ERR_ARENA);
    CHECK_EQ(nv.run, 3u); /* a rejected model starts no run */
    return CHECK_OK;
}

/* A second run on new input starts over even if the previous one was cut mid-way. */
static check_status test_new_run_starts_over(void) {
    int32_t expect[TN_MAX_CLASSES];
    static int8_t other[sizeof input_a];
    for (uint32_t i = 0; i < sizeof other; i++) {
        other[i] = (int8_t)(input_a[i] ^ 0x55);
    }
    CHECK_EQ(ref_forward(&model_a, other, expect), TN_OK);
    power_up_fresh();
#ifndef TN_NO_PROGRESS
    cut_at = A_TILES / 2u;
    CHECK_EQ(run(&model_a, 7u, input_a), TN_OK); /* finishes after one cut */
#endif
    CHECK_EQ(run(&model_a, 8u, other), TN_OK);
    CHECK_EQ(nv.run, 8u);
    CHECK(memcmp(nv.logits, expect, sizeof(int32_t) * model_a.n_classes) == 0);
    return CHECK_OK;
}

static check_status test_rejects_what_does_not_fit(void) {
    static int32_t zeros[TN_MAX_CHANNELS];
    static int8_t w[TN_MAX_CHANNELS];
    tn_layer layers[2] = {a_layers[2], a_layers[3]};
    tn_model m = {"bad", 2, layers, 16, 3, 0, 0, 0, 16u, 0u};
    static int8_t input[16];
    memset(&nv, 0, sizeof nv);
    CHECK_EQ(tn_resume(&nv, &model_a, &scratch), TN_ERR_STATE); /* no run started */

    m.n_layers = 0;
    CHECK_EQ(tn_start(&nv, &m, 0u, 1u, input), TN_ERR_MODEL);
    m.n_layers = 1; /* ends in a pool, not a classifier */
    CHECK_EQ(tn_start(&nv, &m, 0u, 1u, input), TN_ERR_MODEL);
    m.n_layers = 2;
    layers[1].cout = TN_MAX_CLASSES + 1; /* more outputs than the build keeps */
    layers[1].weight = w;
    layers[1].bias = zeros;
    CHECK_EQ(tn_start(&nv, &m, 0u, 1u, input), TN_ERR_ARENA);
    layers[1].cout = 3;
    layers[0].cin = layers[0].cout = TN_MAX_CHANNELS + 1; /* more pooled channels than it keeps */
    CHECK_EQ(tn_start(&nv, &m, 0u, 1u, input), TN_ERR_ARENA);
    layers[0].cin = layers[0].cout = 4;
    layers[0].hin = 64;
    layers[0].win = 64; /* 4 x 64 x 64 bytes: more than the model's arena */
    CHECK_EQ(tn_start(&nv, &m, 0u, 1u, input), TN_ERR_ARENA);

    tn_layer conv = a_layers[0];
    conv.cin = 120; /* 3 x 3 x 120 taps per position: wider than the column scratch */
    conv.hin = conv.win = 1;
    conv.hout = conv.wout = 1;
    tn_layer deep[3] = {conv, a_layers[2], a_layers[3]};
    tn_model d = {"deep", 3, deep, 120, 3, 0, 0, 0, 128u, 0u};
    CHECK_EQ(tn_start(&nv, &d, 0u, 1u, input), TN_ERR_ARENA);
    CHECK(nv.magic != TN_MAGIC); /* a rejected model leaves no run behind */
    return CHECK_OK;
}

/* DynInfer: E = C (V^2 - Vcut^2) / 2. With 10 mF and a 2 V cut, 3.3 V holds 34.45 mJ. */
static check_status test_choose_variant(void) {
    const tn_model cheap = {"cheap", 0, 0, 0, 0, 0, 1000000u, 800u, 0u, 0u};
    const tn_model mid = {"mid", 0, 0, 0, 0, 0, 20000000u, 900u, 0u, 0u};
    const tn_model best = {"best", 0, 0, 0, 0, 0, 50000000u, 950u, 0u, 0u};
    const tn_model *const variants[3] = {&best, &mid, &cheap};
    CHECK_EQ(tn_choose_variant(variants, 3u, 3300u, 2000u, 10000u), 1u);  /* best does not fit */
    CHECK_EQ(tn_choose_variant(variants, 3u, 5000u, 2000u, 10000u), 0u);  /* 105 mJ: everything fits */
    CHECK_EQ(tn_choose_variant(variants, 3u, 2100u, 2000u, 10000u), 2u);  /* 2.05 mJ: only the cheapest */
    CHECK_EQ(tn_choose_variant(variants, 3u, 2000u, 2000u, 10000u), 2u);  /* nothing fits: the cheapest */
    CHECK_EQ(tn_choose_variant(variants, 3u, 1000u, 2000u, 10000u), 2u);  /* below the cut */
    CHECK_EQ(tn_choose_variant(variants, 1u, 1000u, 2000u, 10000u), 0u);
    return CHECK_OK;
}

/* A layer kind the executor does not know is a model error, from tn_start's check and from
 * tn_resume itself (a descriptor corrupted after the check): never another layer's kernel, and
 * the tile is not counted done. */
static check_status test_an_unknown_kind_is_a_model_error(void) {
    static int8_t input[5 * 4 * 2];
    tn_layer layers[4] = {a_layers[0], a_layers[1], a_layers[2], a_layers[3]};
    tn_model m = model_a;
    m.layers = layers;
    layers[2].kind = (tn_kind)99;
    memset(&nv, 0, sizeof nv);
    CHECK_EQ(tn_start(&nv, &m, 0u, 7u, input), TN_ERR_MODEL);
    CHECK_EQ(tn_start(&nv, &model_a, 0u, 7u, input), TN_OK); /* a checked model, then a changed one */
    for (uint32_t i = 0; i < TN_MAX_CLASSES; i++) {
        nv.logits[i] = 12345;
    }
    CHECK_EQ(tn_resume(&nv, &m, &scratch), TN_ERR_MODEL);
#ifndef TN_NO_PROGRESS
    CHECK_EQ(nv.progress, 12u); /* the two convs' tiles, then the unknown layer: not done */
#endif
    CHECK_EQ(nv.logits[0], 12345); /* no classifier ran in its place */
    layers[3].kind = (tn_kind)0;
    layers[2].kind = TN_POOL;
    CHECK_EQ(tn_start(&nv, &m, 0u, 8u, input), TN_ERR_MODEL); /* 0 is no kind either */
    return CHECK_OK;
}

int main(void) {
    int failures = 0;
    check_rng rng = {31337u};
    for (uint32_t i = 0; i < sizeof input_a; i++) {
        input_a[i] = (int8_t)check_range(&rng, -128, 127);
    }
    for (uint32_t i = 0; i < sizeof input_b; i++) {
        input_b[i] = (int8_t)check_range(&rng, -128, 127);
    }
    for (uint32_t i = 0; i < sizeof input_c; i++) {
        input_c[i] = (int8_t)check_range(&rng, -128, 127);
    }
    RUN(failures, build_models);
    RUN(failures, test_model_a_resumes_at_every_progress_point);
    RUN(failures, test_model_b_resumes_at_every_progress_point);
    RUN(failures, test_model_c_resumes_at_every_progress_point);
    RUN(failures, test_routes_are_checked);
    RUN(failures, test_new_run_starts_over);
    RUN(failures, test_rejects_what_does_not_fit);
    RUN(failures, test_choose_variant);
    RUN(failures, test_an_unknown_kind_is_a_model_error);
    printf("test_executor: %d failed\n", failures);
    return failures == 0 ? 0 : 1;
}
