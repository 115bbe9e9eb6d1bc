/* Early decisions: FIRMBOUND's stopping rule after every sample, in integers (tn.h). */
#include "tn.h"

static tn_status check_early(const tn_early *e) {
    if (e->frame == 0 || e->channels == 0 || e->context == 0 || e->horizon < 2 || e->n_pieces == 0 ||
        e->n_classes == 0 || e->n_classes > TN_MAX_CLASSES || e->exp_len == 0 || e->exp_q16[0] == 0u ||
        e->frac_bits > 30 ||
        e->frame->input_bytes != (uint32_t)e->channels * e->context || e->frame->n_classes != e->n_classes) {
        return TN_ERR_MODEL;
    }
    if ((uint32_t)e->channels * e->context > TN_EARLY_WINDOW ||
        (uint32_t)e->channels * e->context > 2u * TN_MAX_COLUMN) {
        return TN_ERR_ARENA;
    }
    return TN_OK;
}

tn_status tn_early_begin(tn_early_nv *s, const tn_early *e, uint32_t series) {
    tn_status status = check_early(e);
    if (status != TN_OK || series == 0u) {
        return status != TN_OK ? status : TN_ERR_STATE;
    }
    if (s->magic == TN_EARLY_MAGIC && s->series == series) {
        return TN_OK;
    }
    *(volatile uint32_t *)&s->magic = 0u; /* a cut below starts the series over */
    TN_COMPILER_BARRIER();
    for (uint32_t i = 0; i < (uint32_t)e->channels * e->context; i++) {
        s->ring[i] = 0;
    }
    for (uint16_t k = 0; k < e->n_classes; k++) {
        s->acc[0][k] = 0;
    }
    s->t = 0u;
    s->sampled = 0u;
    s->series = series;
    TN_COMPILER_BARRIER();
    *(volatile uint32_t *)&s->magic = TN_EARLY_MAGIC;
    return TN_OK;
}

/* The rule on the sums `acc` after t samples (1 <= t <= horizon). */
static void decide(const tn_early *e, const int32_t *acc, uint32_t t, tn_decision *d) {
    const uint32_t k_n = e->n_classes;
    uint32_t label = 0;
    for (uint32_t k = 1; k < k_n; k++) {
        if (acc[k] > acc[label]) {
            label = k;
        }
    }
    uint64_t ex[TN_MAX_CLASSES], sum = 0;
    for (uint32_t k = 0; k < k_n; k++) {
        uint32_t j = (uint32_t)(acc[label] - acc[k]);
        ex[k] = j < e->exp_len ? e->exp_q16[j] : 0u;
        sum += ex[k];
    }
    uint32_t pi[TN_MAX_CLASSES], pi_max = 0;
    for (uint32_t k = 0; k < k_n; k++) {
        pi[k] = (uint32_t)((ex[k] << 16) / sum);
        pi_max = pi[k] > pi_max ? pi[k] : pi_max;
    }
    uint32_t stop = t >= e->horizon;
    if (!stop) {
        const int32_t *p = e->pieces + (t - 1u) * e->n_pieces * (k_n + 1u);
        int64_t best = INT64_MIN;
        for (uint32_t i = 0; i < e->n_pieces; i++, p += k_n + 1u) {
            int64_t g = (int64_t)p[k_n] * 65536;
            for (uint32_t k = 0; k < k_n; k++) {
                g += (int64_t)p[k] * (int64_t)pi[k];
            }
            best = g > best ? g : best;
        }
        const int64_t top = (int64_t)e->loss_q * 65536;
        int64_t future = -best;
        future = future < 0 ? 0 : (future > top ? top : future);
        stop = (int64_t)e->loss_q * (int64_t)(65536u - pi_max) <= (int64_t)e->cost_q * 65536 + future;
    }
    d->stop = stop;
    d->label = label;
    d->t = t;
    d->max_posterior_q16 = pi_max;
}

tn_status tn_early_update(const tn_early *e, tn_early_nv *s, tn_nv *nv, tn_scratch *scratch, uint32_t t,
                          const int8_t *sample, tn_decision *d) {
    tn_status status = check_early(e);
    if (status != TN_OK) {
        return status;
    }
    const uint32_t done = *(volatile uint32_t *)&s->t;
    if (s->magic != TN_EARLY_MAGIC || t == 0u || t > e->horizon || (t != done && t != done + 1u)) {
        return TN_ERR_STATE;
    }
    if (t == done + 1u) {
        const uint32_t c_n = e->channels, ctx = e->context;
        if (*(volatile uint32_t *)&s->sampled != t) { /* else: sample t is the ring's already */
            int8_t *row = &s->ring[((t - 1u) % ctx) * c_n];
            for (uint32_t c = 0; c < c_n; c++) {
                row[c] = sample[c];
            }
            TN_COMPILER_BARRIER();
            *(volatile uint32_t *)&s->sampled = t;
            TN_COMPILER_BARRIER();
#ifdef TN_PROGRESS_HOOK
            TN_PROGRESS_HOOK(0u);
#endif
        }
        int8_t *frame = (int8_t *)scratch->column; /* volatile: rebuilt from the ring after a cut */
        for (uint32_t j = 0; j < ctx; j++) {
            /* position j holds sample u = t - ctx + 1 + j, zeros before the first */
            const int have = t + 1u + j >= ctx + 1u;
            const int8_t *src = have ? &s->ring[((t + j - ctx) % ctx) * c_n] : 0;
            for (uint32_t c = 0; c < c_n; c++) {
                frame[c * ctx + j] = have ? src[c] : 0;
            }
        }
        const uint32_t run = s->series * 65536u + t;
        status = tn_start(nv, e->frame, 0u, run, frame);
        if (status == TN_OK) {
            status = tn_resume(nv, e->frame, scratch);
        }
        if (status != TN_OK) {
            return status;
        }
        int32_t *next = s->acc[t & 1u];
        const int32_t *prev = s->acc[(t - 1u) & 1u];
        for (uint32_t k = 0; k < e->n_classes; k++) {
            next[k] = (t == 1u ? 0 : prev[k]) + nv->logits[k] - e->logit_zero_point;
        }
        TN_COMPILER_BARRIER();
        *(volatile uint32_t *)&s->t = t;
        TN_COMPILER_BARRIER();
#ifdef TN_PROGRESS_HOOK
        TN_PROGRESS_HOOK(0u);
#endif
    }
    decide(e, s->acc[t & 1u], t, d);
    return TN_OK;
}
