/* Each kernel (conv.c, depthwise.c, pool.c, dense.c) against the plain references (reference.c) on seeded random layers:
 * the fast conv (the host build runs its SXTB16/SMLAD path in C) and the plain conv the
 * executor uses under TN_REFERENCE_KERNEL, and the depthwise conv, tile by tile; the pools, the
 * dense and fully connected layers and argmax. `make check-m4` runs them on the Cortex-M4 too,
 * where the written-out Thumb-2 loops run instead of their C twins.
 *
 * Every buffer a kernel touches ends exactly where a static array ends, so an access past it
 * lands in ASan's redzone. */
#include <string.h>

#include "check.h"
#include "reference.h"
#include "tn.h"

#define CASES 400
#define MAX_CIN 6
#define MAX_COUT 7
#define MAX_K 5
#define MAX_HIN 16 /* a dilated window spans up to (MAX_K - 1) x 3 + 1 = 13 */
#define MAX_WIN 20
#define MAX_TAPS (MAX_K * MAX_K * MAX_CIN)
#define MAX_DEPTH ((MAX_TAPS + 3) / 4 * 4)
#define MAX_DW_COUT 16 /* a depthwise conv's channels: whole quads, a rest, multipliers 1, 2 and 4 */

static int8_t input_store[MAX_HIN * MAX_WIN * MAX_DW_COUT];
static int8_t taps[MAX_DW_COUT * MAX_TAPS];
static int16_t weight_store[MAX_COUT * MAX_DEPTH] __attribute__((aligned(8))); /* conv: int16, LDM: word aligned */
static int16_t dw_weight_store[MAX_K * MAX_K * MAX_DW_COUT] __attribute__((aligned(8))); /* LDRD: word aligned */
static int32_t bias[MAX_DW_COUT], multiplier[MAX_DW_COUT], shift[MAX_DW_COUT], requant[MAX_DW_COUT * 3];
static int8_t want[MAX_HIN * MAX_WIN * MAX_DW_COUT];
static int8_t out_store[MAX_HIN * MAX_WIN * MAX_DW_COUT];
static int16_t column_store[TN_TILE_POSITIONS * MAX_DEPTH];
static int16_t window_store[TN_MAX_COLUMN] __attribute__((aligned(8))); /* a depthwise window, as the executor's */

/* A tile function with its scratch (a conv's int16 columns, a depthwise conv's window bytes). */
typedef void (*tile_fn)(const tn_layer *, const int8_t *, int8_t *, uint32_t, void *);

static void conv_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t t, void *scratch) {
    tn_conv_tile(l, in, out, t, scratch);
}
static void conv_tile_reference(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t t, void *scratch) {
    tn_conv_tile_reference(l, in, out, t, scratch);
}
static void dwconv_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t t, void *scratch) {
    tn_dwconv_tile(l, in, out, t, scratch);
}

/* The table export.cgen writes for a layer whose right shifts are all 2 or more. */
static void table_of(tn_layer *l) {
    for (uint32_t oc = 0; oc < l->cout; oc++) {
        requant[3u * oc] = l->multiplier[oc];
        requant[3u * oc + 1u] = (int32_t)(UINT32_C(1) << (uint32_t)(l->shift[oc] - 2)) +
                                l->out_offset * (INT32_C(1) << (uint32_t)(l->shift[oc] - 1));
        requant[3u * oc + 2u] = l->shift[oc] - 1;
    }
    l->requant = requant;
}

/* Random biases and requantization (outputs spread over int8, some saturate) for l->cout channels. */
static void random_requantization(check_rng *rng, tn_layer *l) {
    for (uint32_t oc = 0; oc < l->cout; oc++) {
        bias[oc] = check_range(rng, -20000, 20000);
        multiplier[oc] = check_range(rng, 1 << 30, INT32_MAX);
        shift[oc] = check_range(rng, 2, 11);
    }
    l->bias = bias;
    l->multiplier = multiplier;
    l->shift = shift;
}

/* A window's geometry: 1-D (one row, kh = 1, padding on columns only, as export.cgen writes
 * conv1d) or 2-D, padding at most half the window as PyTorch allows; a third of them dilated, and
 * a 2-D one's rows strided apart from its columns' stride half the time (TFLite's strides and
 * dilation factors). kh, kw: drawn here where 0. */
static void random_geometry(check_rng *rng, tn_layer *l, int two_d) {
    l->kh = l->kh ? l->kh : (uint8_t)(two_d ? check_range(rng, 2, MAX_K) : 1);
    l->kw = l->kw ? l->kw : (uint8_t)check_range(rng, 1, MAX_K);
    l->stride = (uint8_t)check_range(rng, 1, 3);
    l->stride_h = (uint8_t)(two_d && check_range(rng, 0, 1) == 1 ? check_range(rng, 1, 3) : 0);
    const int dilated = check_range(rng, 0, 2) == 0;
    l->dil_w = (uint8_t)(dilated ? check_range(rng, 1, 3) : 0);
    l->dil_h = (uint8_t)(dilated && two_d ? check_range(rng, 1, 3) : 0);
    const int32_t rows = ((int32_t)l->kh - 1) * (l->dil_h > 1 ? l->dil_h : 1) + 1; /* the window's extent */
    const int32_t cols = ((int32_t)l->kw - 1) * (l->dil_w > 1 ? l->dil_w : 1) + 1;
    const int32_t sr = l->stride_h ? l->stride_h : l->stride;
    l->pad = (uint8_t)check_range(rng, 0, (two_d && rows < cols ? rows : cols) / 2);
    const int32_t pad_rows = two_d ? l->pad : 0;
    l->pad_h = (uint8_t)pad_rows;
    l->hin = (uint16_t)(two_d ? check_range(rng, rows - 2 * pad_rows > 1 ? rows - 2 * pad_rows : 1, MAX_HIN) : 1);
    l->win = (uint16_t)check_range(rng, cols - 2 * l->pad > 1 ? cols - 2 * l->pad : 1, MAX_WIN);
    l->hout = (uint16_t)((l->hin + 2 * pad_rows - rows) / sr + 1);
    l->wout = (uint16_t)((l->win + 2 * l->pad - cols) / l->stride + 1);
}

/* A random conv layer (random_geometry's windows). */
static check_status random_conv(check_rng *rng, tn_layer *l, const int8_t **weight) {
    memset(l, 0, sizeof *l);
    const int two_d = check_range(rng, 0, 1) == 1;
    l->kind = TN_CONV;
    l->cin = (uint16_t)check_range(rng, 1, MAX_CIN);
    l->cout = (uint16_t)check_range(rng, 1, MAX_COUT);
    random_geometry(rng, l, two_d);
    l->in_offset = check_range(rng, -127, 128); /* minus an int8 zero point */
    l->out_offset = check_range(rng, -128, 127);
    const int relu = check_range(rng, 0, 1) == 1;
    l->act_min = relu ? l->out_offset : -128;
    l->act_max = 127;
    const uint32_t n_taps = (uint32_t)l->kh * l->kw * l->cin, depth = tn_depth(l);
    CHECK_EQ(depth, (n_taps + 3u) / 4u * 4u);
    for (uint32_t i = 0; i < l->cout * n_taps; i++) {
        taps[i] = (int8_t)check_range(rng, -128, 127);
    }
    random_requantization(rng, l);
    int16_t *w = weight_store + sizeof weight_store / sizeof weight_store[0] - l->cout * depth;
    l->weight = (const int8_t *)w;
    CHECK_EQ(ref_pack_conv(l, taps, w), TN_OK);
    *weight = l->weight;
    return CHECK_OK;
}

/* Every tile of `tile_fn` over the whole layer equals the reference output; a tile writes only
 * its own positions, and writing it again changes nothing (the executor's idempotence). */
static check_status tiles_match(const char *name, tile_fn fn, const tn_layer *l, const int8_t *in, unsigned layer_case,
                                void *scratch, uint32_t scratch_bytes) {
    const uint32_t plane = (uint32_t)l->hout * l->wout, tiles = (plane + TN_TILE_POSITIONS - 1u) / TN_TILE_POSITIONS;
    const uint32_t n_out = plane * l->cout;
    int8_t *out = out_store + sizeof out_store - n_out;
    memset(out, 0x5A, n_out);
    for (uint32_t t = 0; t < tiles; t++) {
        memset(scratch, 0xA5, scratch_bytes); /* scratch is garbage after a cut */
        fn(l, in, out, t, scratch);
        for (uint32_t i = 0; i < n_out; i++) {
            const uint32_t pos = i / l->cout;
            const int written = pos < (t + 1u) * TN_TILE_POSITIONS;
            CHECK_MSG(out[i] == (written ? want[i] : 0x5A), "%s, case %u, tile %lu: byte %lu = %d, want %d", name,
                      layer_case, (unsigned long)t, (unsigned long)i, out[i], written ? want[i] : 0x5A);
        }
    }
    for (uint32_t t = tiles; t-- > 0u;) { /* redone in any order over finished outputs */
        fn(l, in, out, t, scratch);
    }
    CHECK_MSG(memcmp(out, want, n_out) == 0, "%s, case %u: a redone tile changed the output", name, layer_case);
    return CHECK_OK;
}

static check_status test_conv_tiles_match_reference(void) {
    check_rng rng = {12345u};
    unsigned lone = 0, padded = 0, one_d = 0, odd_cout = 0, dilated = 0, row_strided = 0;
    for (unsigned c = 0; c < CASES; c++) {
        tn_layer l;
        const int8_t *weight;
        if (random_conv(&rng, &l, &weight) != CHECK_OK) {
            return CHECK_FAIL;
        }
        const uint32_t n_in = (uint32_t)l.hin * l.win * l.cin;
        int8_t *in = input_store + sizeof input_store - n_in;
        for (uint32_t i = 0; i < n_in; i++) {
            in[i] = (int8_t)check_range(&rng, -128, 127);
        }
        CHECK_MSG(ref_conv(&l, in, want) == TN_OK, "case %u: reference rejected the layer", c);
        if (c % 2u == 1u) { /* every other case through the requantization table export.cgen writes */
            table_of(&l);
        }
        const uint32_t column_n = TN_TILE_POSITIONS * tn_depth(&l);
        int16_t *column = column_store + sizeof column_store / sizeof column_store[0] - column_n;
        if (tiles_match("tn_conv_tile", conv_tile, &l, in, c, column, 2u * column_n) != CHECK_OK ||
            tiles_match("tn_conv_tile_reference", conv_tile_reference, &l, in, c, column, 2u * column_n) != CHECK_OK) {
            return CHECK_FAIL;
        }
        lone += ((uint32_t)l.hout * l.wout) % 2u;
        padded += l.pad > 0 ? 1u : 0u;
        one_d += l.kh == 1 ? 1u : 0u;
        odd_cout += l.cout % 2u;
        dilated += l.dil_h > 1u || l.dil_w > 1u ? 1u : 0u;
        row_strided += l.stride_h != 0u && l.stride_h != l.stride ? 1u : 0u;
    }
    /* the seeded cases do reach the paths a lone last position, padding, conv1d, an odd channel
     * count, dilation and a row stride of its own take */
    CHECK(lone > 20u && padded > 20u && one_d > 20u && one_d < CASES - 20u && odd_cout > 20u && dilated > 20u &&
          row_strided > 20u);
    return CHECK_OK;
}

/* The packed pointwise conv (1 x 1 over 8 or 16 input channels: vww_96_int8's conv2 and conv3) on random
 * layers, strided or not, odd position counts, against ref_conv. */
static check_status test_conv_packed_matches_reference(void) {
    static int32_t pk_bias[40], pk_mult[40], pk_shift[40], stream[40 * (1 + 8 + 3)];
    check_rng rng = {24680u};
    unsigned eight = 0, strided = 0, lone = 0;
    for (unsigned c = 0; c < CASES; c++) {
        tn_layer l;
        memset(&l, 0, sizeof l);
        l.kind = TN_CONV;
        l.cin = (uint16_t)(check_range(&rng, 0, 1) == 1 ? 8 : 16);
        l.cout = (uint16_t)(l.cin == 8u ? 2 * check_range(&rng, 1, 20) : check_range(&rng, 1, 40));
        l.kh = l.kw = 1;
        l.stride = (uint8_t)check_range(&rng, 1, 2);
        l.stride_h = (uint8_t)check_range(&rng, 0, 2);
        l.hin = (uint16_t)check_range(&rng, 1, 8);
        l.win = (uint16_t)check_range(&rng, 1, 8);
        const uint32_t sr = l.stride_h ? l.stride_h : l.stride;
        l.hout = (uint16_t)((l.hin - 1u) / sr + 1u);
        l.wout = (uint16_t)((l.win - 1u) / l.stride + 1u);
        l.in_offset = check_range(&rng, -127, 128);
        l.out_offset = check_range(&rng, -128, 127);
        l.act_min = -128;
        l.act_max = 127;
        for (uint32_t i = 0; i < (uint32_t)l.cout * l.cin; i++) {
            taps[i] = (int8_t)check_range(&rng, -128, 127);
        }
        for (uint32_t oc = 0; oc < l.cout; oc++) {
            pk_bias[oc] = check_range(&rng, -100000, 100000);
            pk_mult[oc] = check_range(&rng, 1 << 30, INT32_MAX);
            pk_shift[oc] = check_range(&rng, 1, 14);
        }
        l.bias = pk_bias;
        l.multiplier = pk_mult;
        l.shift = pk_shift;
        int16_t *w = weight_store + sizeof weight_store / sizeof weight_store[0] - (uint32_t)l.cout * tn_depth(&l);
        CHECK_EQ(ref_pack_conv(&l, taps, w), TN_OK);
        l.weight = (const int8_t *)w;
        CHECK_EQ(ref_pack_conv_packed(&l, taps, stream), TN_OK);
        l.packed = stream;
        const uint32_t n_in = (uint32_t)l.hin * l.win * l.cin;
        int8_t *in = input_store + sizeof input_store - n_in;
        for (uint32_t i = 0; i < n_in; i++) {
            in[i] = (int8_t)check_range(&rng, -128, 127);
        }
        CHECK_MSG(ref_conv(&l, in, want) == TN_OK, "case %u: reference rejected the layer", c);
        const uint32_t column_n = TN_TILE_POSITIONS * tn_depth(&l);
        int16_t *column = column_store + sizeof column_store / sizeof column_store[0] - column_n;
        if (tiles_match("tn_conv_tile (packed)", conv_tile, &l, in, c, column, 2u * column_n) != CHECK_OK) {
            return CHECK_FAIL;
        }
        eight += l.cin == 8u ? 1u : 0u;
        strided += sr > 1u || l.stride > 1u ? 1u : 0u;
        lone += ((uint32_t)l.hout * l.wout) % 2u;
    }
    CHECK_MSG(eight > 100u && eight < CASES - 100u && strided > 100u && lone > 50u, "eight %u, strided %u, lone %u",
              eight, strided, lone);
    return CHECK_OK;
}

/* An output clamp: all of int8, a ReLU's (from the zero point) or a narrow range (ReLU6-like), for
 * the kernels' copies with and without the per-byte clamp. */
static void random_clamp(check_rng *rng, tn_layer *l) {
    const int32_t kind = check_range(rng, 0, 2);
    l->act_min = kind == 0 ? -128 : l->out_offset;
    l->act_max = kind == 2 ? (l->out_offset + 60 < 127 ? l->out_offset + 60 : 127) : 127;
}

/* A random depthwise conv (random_geometry's windows): depth multiplier 1 mostly, 2 (a channel at a
 * time) or 4 (one input value for a quad); half of them 3 x 3, the written-out whole window. */
static void random_dwconv(check_rng *rng, tn_layer *l) {
    memset(l, 0, sizeof *l);
    l->kind = TN_DWCONV;
    static const uint32_t mults[5] = {1u, 1u, 1u, 2u, 4u};
    const uint32_t mult = mults[check_range(rng, 0, 4)];
    l->cin = (uint16_t)check_range(rng, 1, (int32_t)(MAX_DW_COUT / mult));
    if (mult == 1u && check_range(rng, 0, 1) == 1) { /* whole quads */
        l->cin = (uint16_t)(4 * check_range(rng, 1, MAX_DW_COUT / 4));
    }
    l->cout = (uint16_t)(l->cin * mult);
    const int whole = check_range(rng, 0, 1) == 1, two_d = whole || check_range(rng, 0, 1) == 1;
    l->kh = l->kw = (uint8_t)(whole ? 3 : 0);
    random_geometry(rng, l, two_d);
    l->in_offset = check_range(rng, -127, 128);
    l->out_offset = check_range(rng, -128, 127);
    random_clamp(rng, l);
    for (uint32_t i = 0; i < (uint32_t)l->kh * l->kw * l->cout; i++) {
        taps[i] = (int8_t)check_range(rng, -128, 127);
    }
    random_requantization(rng, l);
}

static int32_t packed_store[2 * (MAX_K * MAX_K + 2) + MAX_DW_COUT / 4 * (16 + 4 * (MAX_K * MAX_K / 2) + 2)];

static check_status test_dwconv_tiles_match_reference(void) {
    check_rng rng = {2468u};
    unsigned whole = 0, gathered = 0, shared = 0, rest = 0, narrow = 0, packed = 0;
    for (unsigned c = 0; c < CASES; c++) {
        tn_layer l;
        random_dwconv(&rng, &l);
        /* as close to the end as a word-aligned start allows (export.cgen aligns the array) */
        const uint32_t n_w = ((uint32_t)l.kh * l.kw * l.cout + 3u) & ~3u;
        int16_t *w = dw_weight_store + sizeof dw_weight_store / sizeof dw_weight_store[0] - n_w;
        CHECK_EQ(ref_pack_dwconv(&l, taps, w), TN_OK);
        l.weight = (const int8_t *)w;
        const uint32_t n_in = (uint32_t)l.hin * l.win * l.cin;
        int8_t *in = input_store + sizeof input_store - n_in;
        for (uint32_t i = 0; i < n_in; i++) {
            in[i] = (int8_t)check_range(&rng, -128, 127);
        }
        CHECK_MSG(ref_dwconv(&l, taps, in, want) == TN_OK, "case %u: reference rejected the layer", c);
        if (c % 2u == 1u) {
            table_of(&l);
        }
        /* every other case that qualifies (3 x 3 ones too) through the packed stream export.cgen writes */
        if (c / 2u % 2u == 1u && ref_pack_dwconv_packed(&l, taps, packed_store) == TN_OK) {
            l.packed = packed_store;
            packed++;
        }
        if (tiles_match("tn_dwconv_tile", dwconv_tile, &l, in, c, window_store, sizeof window_store) != CHECK_OK) {
            return CHECK_FAIL;
        }
        const int quads3 = l.kh == 3u && l.kw == 3u && l.cout == l.cin && l.cin % 4u == 0u && l.requant != 0 &&
                           l.packed == 0;
        whole += quads3 ? 1u : 0u;
        gathered += quads3 && (l.pad > 0u || l.pad_h > 0u) ? 1u : 0u;
        shared += l.cout == 4u * l.cin ? 1u : 0u;
        rest += l.cout % 4u != 0u ? 1u : 0u;
        narrow += l.act_max < 127 ? 1u : 0u;
    }
    /* the seeded cases reach the whole-window function (padded windows gathered), a quad reading one
     * input value, channels outside the quads and a clamp narrower than int8 */
    CHECK_MSG(whole > 20u && gathered > 10u && shared > 20u && rest > 20u && narrow > 20u && packed > 20u,
              "whole %u, gathered %u, shared %u, rest %u, narrow %u, packed %u", whole, gathered, shared, rest, narrow,
              packed);
    return CHECK_OK;
}

/* The packed depthwise path on the shapes it is for: tall 1-D windows over (H, 1, C) (str_ww_ref_model's
 * 3x1 to 15x1) and 2-D ones of any size, C = 8 and 40 (or a depth multiplier of 2), odd and even tap
 * counts, strided, dilated, padded (windows gathered) or not; each against ref_dwconv. */
#define PK_C 40
#define PK_TAPS 52
static check_status test_dwconv_packed_match_reference(void) {
    /* 13 x 4 x 40 is more than the scratch a padded window is gathered into: such tiles take the general path */
    static const uint8_t shapes[][2] = {{3, 1}, {5, 1}, {10, 1}, {15, 1}, {1, 7},
                                        {2, 2}, {5, 5},  {4, 3},  {2, 1},  {13, 4}};
    static int32_t pk_bias[PK_C], pk_mult[PK_C], pk_shift[PK_C];
    static int32_t stream[2 * (PK_TAPS + 2) + PK_C / 4 * (16 + 4 * (PK_TAPS / 2) + 2)];
    static int16_t pk_weight[PK_TAPS * PK_C] __attribute__((aligned(8)));
    check_rng rng = {97531u};
    unsigned tall = 0, padded = 0, dilated = 0, strided = 0, big = 0, doubled = 0;
    for (unsigned c = 0; c < CASES; c++) {
        tn_layer l;
        memset(&l, 0, sizeof l);
        l.kind = TN_DWCONV;
        l.cin = l.cout = (uint16_t)(check_range(&rng, 0, 1) == 1 ? PK_C : 8);
        if (check_range(&rng, 0, 2) == 0) { /* a depth multiplier of 2: a quad reads two input values */
            l.cin = (uint16_t)(check_range(&rng, 0, 1) == 1 ? PK_C / 2 : 4);
            l.cout = (uint16_t)(2u * l.cin);
        }
        const uint8_t *shape = shapes[check_range(&rng, 0, (int32_t)(sizeof shapes / sizeof shapes[0]) - 1)];
        l.kh = shape[0];
        l.kw = shape[1];
        const int one_d = l.kw == 1u || l.kh == 1u;
        l.stride = (uint8_t)check_range(&rng, 1, 2);
        l.stride_h = (uint8_t)check_range(&rng, 0, 2);
        const int dilate = l.kh * l.kw <= 25u; /* the input of a dilated 13 x 4 would not fit its store */
        l.dil_h = (uint8_t)(dilate && check_range(&rng, 0, 3) == 0 ? 2 : 0);
        l.dil_w = (uint8_t)(dilate && check_range(&rng, 0, 3) == 0 ? 2 : 0);
        const int32_t rows = ((int32_t)l.kh - 1) * (l.dil_h > 1 ? l.dil_h : 1) + 1;
        const int32_t cols = ((int32_t)l.kw - 1) * (l.dil_w > 1 ? l.dil_w : 1) + 1;
        const int pad = check_range(&rng, 0, 2) == 0;
        l.pad_h = (uint8_t)(pad ? check_range(&rng, 0, (rows - 1) / 2) : 0);
        l.pad = (uint8_t)(pad ? check_range(&rng, 0, (cols - 1) / 2) : 0);
        const int32_t max_h = l.kw == 1u ? 40 : one_d ? 1 : 9, max_w = l.kh == 1u ? 40 : one_d ? 1 : 9;
        const int32_t min_h = rows - 2 * l.pad_h, min_w = cols - 2 * l.pad;
        l.hin = (uint16_t)check_range(&rng, min_h > 1 ? min_h : 1, max_h > min_h ? max_h : min_h);
        l.win = (uint16_t)check_range(&rng, min_w > 1 ? min_w : 1, max_w > min_w ? max_w : min_w);
        const int32_t sr = l.stride_h ? l.stride_h : l.stride;
        l.hout = (uint16_t)((l.hin + 2 * l.pad_h - rows) / sr + 1);
        l.wout = (uint16_t)((l.win + 2 * l.pad - cols) / l.stride + 1);
        l.in_offset = check_range(&rng, -127, 128);
        l.out_offset = check_range(&rng, -128, 127);
        random_clamp(&rng, &l);
        const uint32_t n_taps = (uint32_t)l.kh * l.kw;
        for (uint32_t i = 0; i < n_taps * l.cout; i++) {
            taps[i] = (int8_t)check_range(&rng, -128, 127);
        }
        for (uint32_t oc = 0; oc < l.cout; oc++) {
            pk_bias[oc] = check_range(&rng, -20000, 20000);
            pk_mult[oc] = check_range(&rng, 1 << 30, INT32_MAX);
            pk_shift[oc] = check_range(&rng, 1, 12);
        }
        l.bias = pk_bias;
        l.multiplier = pk_mult;
        l.shift = pk_shift;
        CHECK_EQ(ref_pack_dwconv(&l, taps, pk_weight), TN_OK);
        l.weight = (const int8_t *)pk_weight;
        CHECK_EQ(ref_pack_dwconv_packed(&l, taps, stream), TN_OK);
        l.packed = stream;
        const uint32_t n_in = (uint32_t)l.hin * l.win * l.cin;
        int8_t *in = input_store + sizeof input_store - n_in;
        for (uint32_t i = 0; i < n_in; i++) {
            in[i] = (int8_t)check_range(&rng, -128, 127);
        }
        CHECK_MSG(ref_dwconv(&l, taps, in, want) == TN_OK, "case %u: reference rejected the layer", c);
        if (tiles_match("tn_dwconv_tile (packed)", dwconv_tile, &l, in, c, window_store, sizeof window_store) !=
            CHECK_OK) {
            fprintf(stderr, "  %ux%u cin %u, in %ux%u, stride %u/%u, dil %u/%u, pad %u/%u\n", l.kh, l.kw, l.cin, l.hin,
                    l.win, l.stride_h, l.stride, l.dil_h, l.dil_w, l.pad_h, l.pad);
            return CHECK_FAIL;
        }
        tall += l.kw == 1u && l.kh >= 5u ? 1u : 0u;
        padded += l.pad > 0u || l.pad_h > 0u ? 1u : 0u;
        dilated += l.dil_h > 1u || l.dil_w > 1u ? 1u : 0u;
        strided += sr > 1 || l.stride > 1u ? 1u : 0u;
        big += (l.pad > 0u || l.pad_h > 0u) && (uint32_t)l.kh * l.kw * l.cin > sizeof window_store ? 1u : 0u;
        doubled += l.cout == 2u * l.cin ? 1u : 0u;
    }
    CHECK_MSG(tall > 50u && padded > 50u && dilated > 50u && strided > 50u && big > 3u && doubled > 50u,
              "tall %u, padded %u, dilated %u, strided %u, big %u, multiplier 2 %u", tall, padded, dilated, strided, big,
              doubled);
    return CHECK_OK;
}

static check_status test_fc_matches_reference(void) {
    static int8_t w_store[TN_MAX_CLASSES * 64], in_store[64], got_store[TN_MAX_CLASSES], expect[TN_MAX_CLASSES];
    check_rng rng = {1357u};
    unsigned odd_in = 0, odd_out = 0;
    for (unsigned c = 0; c < CASES; c++) {
        tn_layer l;
        memset(&l, 0, sizeof l);
        l.kind = TN_FC;
        l.cin = (uint16_t)check_range(&rng, 1, 64);
        l.cout = (uint16_t)check_range(&rng, 1, TN_MAX_CLASSES);
        l.hin = l.win = l.hout = l.wout = 1;
        l.in_offset = check_range(&rng, -127, 128);
        l.out_offset = check_range(&rng, -128, 127);
        random_clamp(&rng, &l);
        int8_t *w = w_store + sizeof w_store - (uint32_t)l.cout * l.cin, *in = in_store + sizeof in_store - l.cin;
        for (uint32_t i = 0; i < (uint32_t)l.cout * l.cin; i++) {
            w[i] = (int8_t)check_range(&rng, -128, 127);
        }
        for (uint32_t i = 0; i < l.cin; i++) {
            in[i] = (int8_t)check_range(&rng, -128, 127);
        }
        random_requantization(&rng, &l);
        l.weight = w;
        CHECK_EQ(ref_fc(&l, in, expect), TN_OK);
        if (c % 2u == 1u) {
            table_of(&l);
        }
        int8_t *got = got_store + sizeof got_store - l.cout;
        tn_fc(&l, in, got, 0);
        CHECK_MSG(memcmp(got, expect, l.cout) == 0, "case %u (cin %u, cout %u)", c, l.cin, l.cout);
        odd_in += l.cin % 4u != 0u ? 1u : 0u;
        odd_out += l.cout % 4u != 0u ? 1u : 0u;
    }
    CHECK(odd_in > 20u && odd_out > 20u);
    return CHECK_OK;
}

/* The packed fully connected path (ad01_int8's layers: 8, 128 and 640 inputs), int8 outputs and the
 * logits' int32, against ref_fc. */
static check_status test_fc_packed_matches_reference(void) {
    static int8_t w_store[48 * 160], in_store[160], got_store[48], expect[48];
    static int32_t got32[48], pk_bias[48], pk_mult[48], pk_shift[48], stream[48 * (1 + 40 + 3)];
    check_rng rng = {86420u};
    unsigned logits = 0;
    for (unsigned c = 0; c < CASES; c++) {
        tn_layer l;
        memset(&l, 0, sizeof l);
        l.kind = TN_FC;
        l.cin = (uint16_t)(8 * check_range(&rng, 1, 20));
        l.cout = (uint16_t)(4 * check_range(&rng, 1, 12));
        l.hin = l.win = l.hout = l.wout = 1;
        l.in_offset = check_range(&rng, -127, 128);
        l.out_offset = check_range(&rng, -128, 127);
        l.act_min = -128;
        l.act_max = 127;
        int8_t *w = w_store + sizeof w_store - (uint32_t)l.cout * l.cin, *in = in_store + sizeof in_store - l.cin;
        for (uint32_t i = 0; i < (uint32_t)l.cout * l.cin; i++) {
            w[i] = (int8_t)check_range(&rng, -128, 127);
        }
        for (uint32_t i = 0; i < l.cin; i++) {
            in[i] = (int8_t)check_range(&rng, -128, 127);
        }
        for (uint32_t o = 0; o < l.cout; o++) {
            pk_bias[o] = check_range(&rng, -200000, 200000);
            pk_mult[o] = check_range(&rng, 1 << 30, INT32_MAX);
            pk_shift[o] = check_range(&rng, 1, 14);
        }
        l.weight = w;
        l.bias = pk_bias;
        l.multiplier = pk_mult;
        l.shift = pk_shift;
        CHECK_EQ(ref_fc(&l, in, expect), TN_OK);
        CHECK_EQ(ref_pack_fc_packed(&l, stream), TN_OK);
        l.packed = stream;
        int8_t *got = got_store + sizeof got_store - l.cout;
        if (c % 3u == 2u) { /* the last layer's way: the int8 values as int32 logits */
            int32_t *got_logits = got32 + sizeof got32 / sizeof got32[0] - l.cout;
            tn_fc(&l, in, 0, got_logits);
            for (uint32_t o = 0; o < l.cout; o++) {
                CHECK_MSG(got_logits[o] == expect[o], "case %u (cin %u, cout %u): logit %lu", c, l.cin, l.cout,
                          (unsigned long)o);
            }
            logits++;
            continue;
        }
        tn_fc(&l, in, got, 0);
        CHECK_MSG(memcmp(got, expect, l.cout) == 0, "case %u (cin %u, cout %u)", c, l.cin, l.cout);
    }
    CHECK(logits > 100u);
    return CHECK_OK;
}

/* TFLite's MUL of two tensors (a recurrent layer's gates): random offsets, clamps, multipliers and
 * shifts both ways (a product scale above one half shifts left first). */
static check_status test_mul_matches_reference(void) {
    static int8_t a[97], b[97], got[97], expect[97];
    check_rng rng = {4242u};
    unsigned left = 0;
    for (unsigned c = 0; c < CASES; c++) {
        tn_layer l;
        memset(&l, 0, sizeof l);
        l.kind = TN_MUL;
        l.cin = l.cout = (uint16_t)check_range(&rng, 1, 97);
        l.hin = l.win = l.hout = l.wout = 1;
        l.in_offset = check_range(&rng, -127, 128);
        l.in2_offset = check_range(&rng, -127, 128);
        l.out_offset = check_range(&rng, -128, 127);
        random_clamp(&rng, &l);
        multiplier[0] = check_range(&rng, 1 << 30, INT32_MAX);
        shift[0] = check_range(&rng, -3, 14);
        l.multiplier = multiplier;
        l.shift = shift;
        for (uint32_t i = 0; i < l.cin; i++) {
            a[i] = (int8_t)check_range(&rng, -128, 127);
            b[i] = (int8_t)check_range(&rng, -128, 127);
        }
        CHECK_EQ(ref_mul(&l, a, b, expect), TN_OK);
        tn_mul(&l, a, b, got);
        CHECK_MSG(memcmp(got, expect, l.cin) == 0, "case %u (n %u, shift %ld)", c, l.cin, (long)shift[0]);
        left += shift[0] < 0 ? 1u : 0u;
    }
    CHECK(left > 10u);
    return CHECK_OK;
}

static check_status test_window_pools_match_reference(void) {
    static int8_t in_store[MAX_HIN * MAX_WIN * 12], got_store[MAX_HIN * MAX_WIN * 12];
    check_rng rng = {8642u};
    unsigned two_by_two = 0, padded = 0, maxed = 0;
    for (unsigned c = 0; c < CASES; c++) {
        tn_layer l;
        memset(&l, 0, sizeof l);
        l.kind = check_range(&rng, 0, 3) == 0 ? TN_MAXPOOL : TN_AVGPOOL;
        l.cin = l.cout = (uint16_t)check_range(&rng, 1, 12);
        l.kh = (uint8_t)check_range(&rng, 1, 4);
        l.kw = (uint8_t)(check_range(&rng, 0, 1) == 1 ? l.kh : check_range(&rng, 1, 4));
        l.stride = (uint8_t)check_range(&rng, 1, 3);
        l.stride_h = (uint8_t)(check_range(&rng, 0, 1) == 1 ? check_range(&rng, 1, 3) : 0);
        l.pad_h = (uint8_t)check_range(&rng, 0, (l.kh - 1) / 2); /* TFLite's SAME padding: no window wholly in it */
        l.pad = (uint8_t)check_range(&rng, 0, (l.kw - 1) / 2);
        l.hin = (uint16_t)check_range(&rng, l.kh - 2 * l.pad_h, MAX_HIN);
        l.win = (uint16_t)check_range(&rng, l.kw - 2 * l.pad, MAX_WIN);
        l.hout = (uint16_t)((l.hin + 2 * l.pad_h - l.kh) / (l.stride_h ? l.stride_h : l.stride) + 1);
        l.wout = (uint16_t)((l.win + 2 * l.pad - l.kw) / l.stride + 1);
        l.out_offset = check_range(&rng, -128, 127);
        random_clamp(&rng, &l);
        const uint32_t n_in = (uint32_t)l.hin * l.win * l.cin, n_out = (uint32_t)l.hout * l.wout * l.cin;
        int8_t *in = in_store + sizeof in_store - n_in, *got = got_store + sizeof got_store - n_out;
        for (uint32_t i = 0; i < n_in; i++) {
            in[i] = (int8_t)check_range(&rng, -128, 127);
        }
        CHECK_EQ(ref_window_pool(&l, in, want), TN_OK);
        tn_window_pool(&l, in, got);
        CHECK_MSG(memcmp(got, want, n_out) == 0, "case %u (%s %ux%u, cin %u)", c, l.kind == TN_AVGPOOL ? "avg" : "max",
                  l.kh, l.kw, l.cin);
        two_by_two += l.kind == TN_AVGPOOL && l.kh == 2u && l.kw == 2u && l.cin >= 4u ? 1u : 0u;
        padded += l.pad > 0u || l.pad_h > 0u ? 1u : 0u;
        maxed += l.kind == TN_MAXPOOL ? 1u : 0u;
    }
    CHECK(two_by_two > 20u && padded > 20u && maxed > 20u);
    return CHECK_OK;
}

/* Hand-computed: a 1-D conv, one channel, kernel 3, pad 1, stride 1, multiplier 0.5 and no
 * shift, so each output is half the window sum (half up), plus the zero point, clamped. */
static check_status test_conv_known_values(void) {
    static const int8_t in[4] = {10, 20, 30, 41};
    static int16_t w[4] __attribute__((aligned(4)));
    static const int8_t taps3[3] = {1, 1, 1};
    static const int32_t b[1] = {0}, m[1] = {1 << 30}, s[1] = {0};
    tn_layer l = {TN_CONV, 1, 1, 4, 1, 1, 4, 1, 3, 1, 1, 0, 0, 1, -128, 127, (const int8_t *)w, b, m, s, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK_EQ(ref_pack_conv(&l, taps3, w), TN_OK);
    static const int8_t expect[4] = {16, 31, 47, 37}; /* (30 / 2 = 15, 60 / 2, 91 / 2 = 45.5 -> 46, 71 / 2 -> 36) + 1 */
    int8_t out[4];
    int16_t column[TN_TILE_POSITIONS * 4];
    for (uint32_t t = 0; t < 2u; t++) {
        tn_conv_tile(&l, in, out, t, column);
    }
    CHECK(memcmp(out, expect, sizeof expect) == 0);
    memset(out, 0, sizeof out);
    for (uint32_t t = 0; t < 2u; t++) {
        tn_conv_tile_reference(&l, in, out, t, column);
    }
    CHECK(memcmp(out, expect, sizeof expect) == 0);
    return CHECK_OK;
}

static check_status test_pool_matches_reference(void) {
    static int8_t in_store[MAX_HIN * MAX_WIN * TN_MAX_CHANNELS];
    static int32_t got[TN_MAX_CHANNELS], expect[TN_MAX_CHANNELS];
    check_rng rng = {777u};
    for (unsigned c = 0; c < CASES; c++) {
        tn_layer l;
        memset(&l, 0, sizeof l);
        l.kind = TN_POOL;
        l.cin = l.cout = (uint16_t)check_range(&rng, 1, TN_MAX_CHANNELS);
        l.hin = (uint16_t)check_range(&rng, 1, MAX_HIN);
        l.win = (uint16_t)check_range(&rng, 1, MAX_WIN);
        l.hout = l.wout = 1;
        l.in_offset = check_range(&rng, -127, 128);
        const uint32_t n = (uint32_t)l.hin * l.win * l.cin;
        int8_t *in = in_store + sizeof in_store - n;
        for (uint32_t i = 0; i < n; i++) {
            in[i] = (int8_t)check_range(&rng, -128, 127);
        }
        CHECK_EQ(ref_pool(&l, in, expect), TN_OK);
        tn_pool(&l, in, got);
        CHECK_MSG(memcmp(got, expect, sizeof(int32_t) * l.cin) == 0, "case %u", c);
    }
    return CHECK_OK;
}

static check_status test_dense_matches_reference(void) {
    static int8_t w_store[TN_MAX_CLASSES * TN_MAX_CHANNELS];
    static int32_t in[TN_MAX_CHANNELS], b[TN_MAX_CLASSES], got[TN_MAX_CLASSES], expect[TN_MAX_CLASSES];
    check_rng rng = {4242u};
    for (unsigned c = 0; c < CASES; c++) {
        tn_layer l;
        memset(&l, 0, sizeof l);
        l.kind = TN_DENSE;
        l.cin = (uint16_t)check_range(&rng, 1, TN_MAX_CHANNELS);
        l.cout = (uint16_t)check_range(&rng, 1, TN_MAX_CLASSES);
        l.hin = l.win = l.hout = l.wout = 1;
        int8_t *w = w_store + sizeof w_store - (uint32_t)l.cout * l.cin;
        for (uint32_t i = 0; i < (uint32_t)l.cout * l.cin; i++) {
            w[i] = (int8_t)check_range(&rng, -128, 127);
        }
        for (uint32_t i = 0; i < l.cin; i++) {
            in[i] = check_range(&rng, -30000, 30000); /* a pool's sums: up to positions x 255 */
        }
        for (uint32_t o = 0; o < l.cout; o++) {
            b[o] = check_range(&rng, -100000, 100000);
        }
        l.weight = w;
        l.bias = b;
        CHECK_EQ(ref_dense(&l, in, expect), TN_OK);
        tn_dense(&l, in, got);
        CHECK_MSG(memcmp(got, expect, sizeof(int32_t) * l.cout) == 0, "case %u", c);
    }
    return CHECK_OK;
}

static check_status test_argmax(void) {
    static const int32_t one[1] = {-5};
    static const int32_t ties[4] = {3, 7, 7, -1};  /* the first of equal maxima */
    static const int32_t last[3] = {INT32_MIN, INT32_MIN + 1, INT32_MAX};
    static const int32_t negative[3] = {-9, -2, -3};
    CHECK_EQ(tn_argmax(one, 1), 0);
    CHECK_EQ(tn_argmax(ties, 4), 1);
    CHECK_EQ(tn_argmax(last, 3), 2);
    CHECK_EQ(tn_argmax(negative, 3), 1);
    check_rng rng = {99u};
    for (unsigned c = 0; c < CASES; c++) {
        int32_t v[TN_MAX_CLASSES];
        const uint16_t n = (uint16_t)check_range(&rng, 1, TN_MAX_CLASSES);
        uint16_t best = 0;
        for (uint16_t i = 0; i < n; i++) {
            v[i] = check_range(&rng, -8, 8); /* a narrow range, so ties are common */
            best = v[i] > v[best] ? i : best;
        }
        CHECK_MSG(tn_argmax(v, n) == best, "case %u", c);
    }
    return CHECK_OK;
}

int main(void) {
    int failures = 0;
    RUN(failures, test_conv_known_values);
    RUN(failures, test_conv_tiles_match_reference);
    RUN(failures, test_conv_packed_matches_reference);
    RUN(failures, test_dwconv_tiles_match_reference);
    RUN(failures, test_dwconv_packed_match_reference);
    RUN(failures, test_pool_matches_reference);
    RUN(failures, test_window_pools_match_reference);
    RUN(failures, test_fc_matches_reference);
    RUN(failures, test_fc_packed_matches_reference);
    RUN(failures, test_mul_matches_reference);
    RUN(failures, test_dense_matches_reference);
    RUN(failures, test_argmax);
    printf("test_kernels: %d failed\n", failures);
    return failures == 0 ? 0 : 1;
}
