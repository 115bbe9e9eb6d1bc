/* The intermittent executor: idempotent tiles, one word-sized commit each. */
#include "kernel.h"

#ifdef TN_REFERENCE_KERNEL
#define CONV_TILE tn_conv_tile_reference /* the plain kernel: the benchmark's baseline */
#else
#define CONV_TILE tn_conv_tile
#endif

static uint32_t layer_tiles(const tn_layer *l) {
    const int positions = l->kind == TN_CONV || l->kind == TN_DWCONV;
    return positions ? ((uint32_t)l->hout * l->wout + TN_TILE_POSITIONS - 1u) / TN_TILE_POSITIONS : 1u;
}

/* Layers that read one int8 buffer and write the other (the last fully connected layer writes
 * the logits instead, but nothing follows it). */
static uint32_t flips(const tn_layer *l) {
    return l->kind == TN_POOL || l->kind == TN_DENSE ? 0u : 1u;
}

/* One tile of layer `li`, whose input is buffer `flip` % 2 (or its src): it writes only the other
 * buffer (or its dst, never one it reads; or the pooled sums, or the logits), so redoing it after
 * a power cut rewrites the same bytes. A kind this executor does not know is TN_ERR_MODEL, never
 * some other layer's kernel. */
static tn_status run_tile(tn_nv *nv, const tn_model *model, uint32_t li, uint32_t tile, uint32_t flip,
                          tn_scratch *scratch) {
    const tn_layer *l = &model->layers[li];
    const int8_t *in = nv->buf[l->src != 0u ? l->src - 1u : flip & 1u];
    int8_t *out = nv->buf[l->dst != 0u ? l->dst - 1u : (flip + 1u) & 1u];
    switch (l->kind) {
    case TN_CONV:
        CONV_TILE(l, in, out, tile, scratch->column);
        return TN_OK;
    case TN_DWCONV:
        tn_dwconv_tile(l, in, out, tile, (int8_t *)scratch->column);
        return TN_OK;
    case TN_AVGPOOL:
    case TN_MAXPOOL:
        tn_window_pool(l, in, out);
        return TN_OK;
    case TN_MEAN:
        tn_mean(l, in, out);
        return TN_OK;
    case TN_POOL:
        tn_pool(l, in, nv->pooled);
        return TN_OK;
    case TN_FC:
        if (li + 1u == model->n_layers) {
            tn_fc(l, in, 0, nv->logits);
        } else {
            tn_fc(l, in, out, 0);
        }
        return TN_OK;
    case TN_DENSE:
        tn_dense(l, nv->pooled, nv->logits);
        return TN_OK;
    case TN_LUT:
        tn_lut(l, in, out);
        return TN_OK;
    case TN_ADD:
        tn_add(l, in, nv->buf[l->src2 - 1u], out);
        return TN_OK;
    case TN_CONCAT:
        tn_concat(l, in, out);
        return TN_OK;
    default:
        return TN_ERR_MODEL;
    }
}

uint32_t tn_total_tiles(const tn_model *model) {
    uint32_t total = 0;
    for (uint16_t i = 0; i < model->n_layers; i++) {
        total += layer_tiles(&model->layers[i]);
    }
    return total;
}

#ifndef TN_NO_PROGRESS
static void commit(tn_nv *nv, uint32_t progress) {
    TN_COMPILER_BARRIER(); /* the tile's stores are issued before the commit */
    *(volatile uint32_t *)&nv->progress = progress;
    TN_COMPILER_BARRIER();
#ifdef TN_PROGRESS_HOOK
    TN_PROGRESS_HOOK(progress);
#endif
}
#endif

static tn_status check(const tn_model *model) {
    for (uint16_t i = 0; i < model->n_layers; i++) {
        const tn_layer *l = &model->layers[i];
        if ((uint32_t)l->cin * l->hin * l->win > TN_ARENA_BYTES || (uint32_t)l->cout * l->hout * l->wout > TN_ARENA_BYTES) {
            return TN_ERR_ARENA;
        }
        if (l->kind == TN_CONV && TN_TILE_POSITIONS * tn_depth(l) > TN_MAX_COLUMN) {
            return TN_ERR_ARENA;
        }
        if ((l->kind == TN_CONV || l->kind == TN_DWCONV) && /* no window may lie wholly in the padding */
            (l->pad_h >= (l->kh - 1u) * dil_rows(l) + 1u || l->pad >= (l->kw - 1u) * dil_cols(l) + 1u ||
             l->kh == 0u || l->kw == 0u || l->stride == 0u ||
             (uint32_t)(l->hout - 1u) * stride_rows(l) >= (uint32_t)l->hin + l->pad_h ||
             (uint32_t)(l->wout - 1u) * l->stride >= (uint32_t)l->win + l->pad)) {
            return TN_ERR_MODEL;
        }
        if (l->kind == TN_LUT && l->cin > 1u && l->cin != l->cout) {
            return TN_ERR_MODEL; /* a table per channel, or one for all */
        }
        if (l->src > TN_BUFFERS || l->src2 > TN_BUFFERS || l->dst > TN_BUFFERS ||
            (l->dst != 0u && (l->dst == l->src || l->dst == l->src2))) {
            return TN_ERR_MODEL; /* a buffer the board lacks, or a layer overwriting its own input */
        }
        if ((l->kind == TN_ADD && (l->src2 == 0u || l->cin != l->cout || l->hin != l->hout || l->win != l->wout)) ||
            (l->kind == TN_CONCAT && (l->in2_offset < 0 || (uint32_t)l->in2_offset + l->cin > l->cout ||
                                      l->hin != l->hout || l->win != l->wout))) {
            return TN_ERR_MODEL;
        }
        if (l->kind < TN_CONV || l->kind > TN_CONCAT || ((l->kind == TN_POOL || l->kind == TN_DENSE) && l->cin > TN_MAX_CHANNELS) ||
            (l->kind == TN_DWCONV && (l->cin == 0 || l->cout % l->cin != 0))) {
            return TN_ERR_MODEL;
        }
    }
    if (model->n_layers == 0) {
        return TN_ERR_MODEL;
    }
    const tn_layer *last = &model->layers[model->n_layers - 1];
    return (last->kind == TN_DENSE || last->kind == TN_FC) && last->cout <= TN_MAX_CLASSES ? TN_OK : TN_ERR_MODEL;
}

tn_status tn_start(tn_nv *nv, const tn_model *model, uint32_t variant, uint32_t run, const int8_t *input) {
    tn_status status = check(model);
    if (status != TN_OK) {
        return status;
    }
    if (nv->magic == TN_MAGIC && nv->run == run) {
        return TN_OK; /* resuming after a power failure: the input is already in place */
    }
    *(volatile uint32_t *)&nv->magic = 0u; /* invalidate first: a cut below restarts the copy */
    TN_COMPILER_BARRIER();
    for (uint32_t i = 0; i < model->input_bytes; i++) {
        nv->buf[0][i] = input[i];
    }
    nv->run = run;
    nv->variant = variant;
    nv->progress = 0u;
    TN_COMPILER_BARRIER();
    *(volatile uint32_t *)&nv->magic = TN_MAGIC;
    return TN_OK;
}

#ifdef TN_NO_PROGRESS
/* The same kernels in straight loops, no progress kept: the intermittency overhead's baseline,
 * for uninterrupted runs only. It is not power-failure safe: the second conv overwrites the
 * input's buffer, so after a cut the caller must tn_start again (copy the input in) before
 * tn_resume, or the logits are wrong (firmware/tests/test_executor.c skips cuts in this build). */
tn_status tn_resume(tn_nv *nv, const tn_model *model, tn_scratch *scratch) {
    if (nv->magic != TN_MAGIC) {
        return TN_ERR_STATE;
    }
    uint32_t flip = 0;
    for (uint16_t li = 0; li < model->n_layers; li++) {
        const tn_layer *l = &model->layers[li];
        const uint32_t tiles = layer_tiles(l);
        for (uint32_t tile = 0; tile < tiles; tile++) {
            const tn_status status = run_tile(nv, model, li, tile, flip, scratch);
            if (status != TN_OK) {
                return status;
            }
        }
        flip += flips(l);
    }
    return TN_OK;
}
#else
tn_status tn_resume(tn_nv *nv, const tn_model *model, tn_scratch *scratch) {
    if (nv->magic != TN_MAGIC) {
        return TN_ERR_STATE;
    }
    uint32_t p = *(volatile uint32_t *)&nv->progress, first = 0, flip = 0;
    for (uint32_t li = 0; li < model->n_layers; li++) { /* the layer of tile p found once, then followed */
        const tn_layer *l = &model->layers[li];
        const uint32_t tiles = layer_tiles(l);
        for (; p < first + tiles; p++) {
            const tn_status status = run_tile(nv, model, li, p - first, flip, scratch);
            if (status != TN_OK) {
                return status; /* nothing committed: the tile is not counted done */
            }
            commit(nv, p + 1u);
        }
        first += tiles;
        flip += flips(l);
    }
    return TN_OK;
}
#endif

uint32_t tn_choose_variant(const tn_model *const *variants, uint32_t n, uint32_t voltage_mv, uint32_t v_cut_mv,
                           uint32_t capacitance_uf) {
    /* E = C (v^2 - v_cut^2) / 2, in nJ: uF * mV^2 = 1e-12 J = 1e-3 nJ */
    uint64_t usable_nj = 0;
    if (voltage_mv > v_cut_mv) {
        uint64_t dv2 = (uint64_t)voltage_mv * voltage_mv - (uint64_t)v_cut_mv * v_cut_mv;
        usable_nj = (uint64_t)capacitance_uf * dv2 / 2000u;
    }
    uint32_t best = n, cheapest = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (variants[i]->energy_nj < variants[cheapest]->energy_nj) {
            cheapest = i;
        }
        if (variants[i]->energy_nj <= usable_nj &&
            (best == n || variants[i]->accuracy_permille > variants[best]->accuracy_permille)) {
            best = i;
        }
    }
    return best == n ? cheapest : best;
}
