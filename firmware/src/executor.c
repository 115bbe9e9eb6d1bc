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

#ifdef TN_ATOMIC
/* Atomic inference: the arena in volatile RAM (.bss); a cut loses it and the run starts over. */
int8_t tn_volatile_arena[TN_ARENA_BYTES] __attribute__((aligned(16)));
#define ARENA(nv) ((void)(nv), tn_volatile_arena)
#else
#define ARENA(nv) ((nv)->arena)
#endif

/* Whether a layer reads the arena (a dense layer reads the pooled sums), and whether it writes it
 * (a pool writes the pooled sums; a dense layer and the last fully connected one the logits). */
static int reads_arena(const tn_layer *l) {
    return l->kind != TN_DENSE;
}

static int writes_arena(const tn_model *model, uint32_t li) {
    const tn_layer *l = &model->layers[li];
    return !(l->kind == TN_POOL || l->kind == TN_DENSE || (l->kind == TN_FC && li + 1u == model->n_layers));
}

/* Bytes of a layer's input tensor (each input of an ADD) and output tensor in the arena. A table
 * layer's cin counts its tables, not its channels. */
static uint32_t in_bytes(const tn_layer *l) {
    return (uint32_t)(l->kind == TN_LUT ? l->cout : l->cin) * l->hin * l->win;
}

static uint32_t out_bytes(const tn_layer *l) {
    return (uint32_t)l->cout * l->hout * l->wout;
}

/* One tile of layer `li`: it reads its input tensors and writes only its output tensor (or the
 * pooled sums, or the logits), which the plan keeps apart from anything it reads, so redoing it
 * after a power cut rewrites the same bytes. A kind this executor does not know is TN_ERR_MODEL,
 * never some other layer's kernel. */
static tn_status run_tile(tn_nv *nv, const tn_model *model, uint32_t li, uint32_t tile, tn_scratch *scratch) {
    const tn_layer *l = &model->layers[li];
    int8_t *arena = ARENA(nv);
    const int8_t *in = arena + l->src;
    int8_t *out = arena + l->dst;
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
    case TN_FC: /* each row of hin */
        for (uint32_t r = 0; r < l->hin; r++) {
            if (li + 1u == model->n_layers) {
                tn_fc(l, in + r * l->cin, 0, nv->logits + r * l->cout);
            } else {
                tn_fc(l, in + r * l->cin, out + r * l->cout, 0);
            }
        }
        return TN_OK;
    case TN_DENSE:
        tn_dense(l, nv->pooled, nv->logits);
        return TN_OK;
    case TN_LUT:
        tn_lut(l, in, out);
        return TN_OK;
    case TN_ADD:
        tn_add(l, in, arena + l->src2, out);
        return TN_OK;
    case TN_MUL:
        tn_mul(l, in, arena + l->src2, out);
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

/* [a, a + n) and [b, b + m) share a byte. */
static int overlap(uint32_t a, uint32_t n, uint32_t b, uint32_t m) {
    return a < b + m && b < a + n;
}

/* The plan, within the arena: every tensor a layer reads or writes inside the model's arena, the
 * model's inside the one built, and no layer's output sharing a byte with its inputs (a tile
 * redone after a cut must read what it read the first time). */
static tn_status check_plan(const tn_model *model) {
    if (model->arena_bytes > TN_ARENA_BYTES || model->input_offset + model->input_bytes > model->arena_bytes) {
        return TN_ERR_ARENA;
    }
    for (uint32_t i = 0; i < model->n_layers; i++) {
        const tn_layer *l = &model->layers[i];
        const uint32_t n_in = in_bytes(l), n_out = out_bytes(l), n_arena = model->arena_bytes;
        const int two = l->kind == TN_ADD || l->kind == TN_MUL;
        if ((reads_arena(l) && (l->src > n_arena || n_in > n_arena - l->src)) ||
            (two && (l->src2 > n_arena || n_in > n_arena - l->src2))) {
            return TN_ERR_ARENA;
        }
        if (writes_arena(model, i) &&
            (l->dst > n_arena || n_out > n_arena - l->dst || overlap(l->dst, n_out, l->src, n_in) ||
             (two && overlap(l->dst, n_out, l->src2, n_in)))) {
            return l->dst > n_arena || n_out > n_arena - l->dst ? TN_ERR_ARENA : TN_ERR_MODEL;
        }
    }
    return TN_OK;
}

static tn_status check(const tn_model *model) {
    for (uint16_t i = 0; i < model->n_layers; i++) {
        const tn_layer *l = &model->layers[i];
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
        if (((l->kind == TN_ADD || l->kind == TN_MUL) && (l->cin != l->cout || l->hin != l->hout || l->win != l->wout)) ||
            (l->kind == TN_FC && (l->hin != l->hout || l->win != 1u || l->wout != 1u)) ||
            (l->kind == TN_CONCAT && (l->in2_offset < 0 || (uint32_t)l->in2_offset + l->cin > l->cout ||
                                      l->hin != l->hout || l->win != l->wout))) {
            return TN_ERR_MODEL;
        }
        if (l->kind < TN_CONV || l->kind > TN_MUL ||
            (l->kind == TN_DWCONV && (l->cin == 0 || l->cout % l->cin != 0))) {
            return TN_ERR_MODEL;
        }
        if ((l->kind == TN_POOL || l->kind == TN_DENSE) && l->cin > TN_MAX_CHANNELS) {
            return TN_ERR_ARENA;
        }
    }
    if (model->n_layers == 0) {
        return TN_ERR_MODEL;
    }
    const tn_layer *last = &model->layers[model->n_layers - 1];
    if (last->kind != TN_DENSE && last->kind != TN_FC) {
        return TN_ERR_MODEL;
    }
    return (uint32_t)last->cout * last->hout > TN_MAX_CLASSES ? TN_ERR_ARENA : check_plan(model);
}

tn_status tn_start(tn_nv *nv, const tn_model *model, uint32_t variant, uint32_t run, const int8_t *input) {
    tn_status status = check(model);
    if (status != TN_OK) {
        return status;
    }
    if (nv->magic == TN_MAGIC && nv->run == run) {
#ifdef TN_ATOMIC
        if (nv->progress >= tn_total_tiles(model)) {
            return TN_OK; /* finished before the power failure: the results are in place */
        } /* else cut short: the arena is lost, the run starts again from its input */
#else
        return TN_OK; /* resuming after a power failure: the input is already in place */
#endif
    }
    *(volatile uint32_t *)&nv->magic = 0u; /* invalidate first: a cut below restarts the copy */
    TN_COMPILER_BARRIER();
    int8_t *arena = ARENA(nv) + model->input_offset;
    const uint32_t n = model->input_bytes; /* read once: the byte stores below may alias *model */
    uint32_t i = 0;
    for (; i + 4u <= n; i += 4u) { /* a word at a time (the Cortex-M4 loads and stores words unaligned) */
        write_u32(arena + i, read_u32(input + i));
    }
    for (; i < n; i++) {
        arena[i] = input[i];
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
 * for uninterrupted runs only. It is not power-failure safe: a later layer may overwrite the
 * input's bytes, so after a cut the caller must tn_start again (copy the input in) before
 * tn_resume, or the logits are wrong (firmware/tests/test_executor.c skips cuts in this build). */
tn_status tn_resume(tn_nv *nv, const tn_model *model, tn_scratch *scratch) {
    if (nv->magic != TN_MAGIC) {
        return TN_ERR_STATE;
    }
    for (uint16_t li = 0; li < model->n_layers; li++) {
        const uint32_t tiles = layer_tiles(&model->layers[li]);
        for (uint32_t tile = 0; tile < tiles; tile++) {
            const tn_status status = run_tile(nv, model, li, tile, scratch);
            if (status != TN_OK) {
                return status;
            }
        }
    }
    return TN_OK;
}
#else
tn_status tn_resume(tn_nv *nv, const tn_model *model, tn_scratch *scratch) {
    if (nv->magic != TN_MAGIC) {
        return TN_ERR_STATE;
    }
    uint32_t p = *(volatile uint32_t *)&nv->progress, first = 0;
    for (uint32_t li = 0; li < model->n_layers; li++) { /* the layer of tile p found once, then followed */
        const uint32_t tiles = layer_tiles(&model->layers[li]);
        for (; p < first + tiles; p++) {
            const tn_status status = run_tile(nv, model, li, p - first, scratch);
            if (status != TN_OK) {
                return status; /* nothing committed: the tile is not counted done */
            }
            commit(nv, p + 1u);
        }
        first += tiles;
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
