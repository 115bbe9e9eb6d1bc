/* trickle-nn: int8 inference for Cortex-M, correct across power failures.
 *
 * Arithmetic is TFLite's / CMSIS-NN's: int8 activations, channels last (HWC), with zero points,
 * int32 accumulation, per-channel requantization by a Q31 multiplier and a right shift
 * (SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT). No malloc: the caller owns
 * the non-volatile state (activations, progress), a volatile scratch, and the model is const
 * data in flash.
 *
 * Memory: one arena per model (TFLite Micro's model). Every activation tensor has an offset in it,
 * planned at code generation from the tensors' lifetimes (export.firmware.plan: a tensor never
 * shares bytes with one live at the same time, a layer's output never with its inputs), and the
 * arena is sized to the plan's peak (TN_ARENA_BYTES, from the generated tn_config.h).
 *
 * Intermittency: a run is a sequence of idempotent tiles (TN_TILE_POSITIONS output positions of
 * a conv or depthwise conv, all channels; any other layer whole). A tile reads only its layer's
 * input tensors (two for an ADD) and writes only its own output, never bytes it reads; after a
 * tile, a single 32-bit store advances `progress`. Two policies, chosen per board and model
 * (export.firmware.flash):
 *   - tiles commit (the default): the arena is in non-volatile memory (FRAM, or the board's
 *     battery-backed RAM where it fits). A power cut at any instruction leaves either the old or
 *     the new progress word, and redoing a tile rewrites the same bytes, so resuming gives the
 *     same logits bit for bit (SONIC/HAWAII-style loop continuation).
 *   - atomic inference (-DTN_ATOMIC): the arena is in volatile RAM; only tn_nv (progress, the
 *     finished results) is non-volatile. A run cut before its end starts again from its input
 *     (tn_start copies it in again), so the results are still bit-exact, at the cost of the work
 *     lost.
 */
#ifndef TN_H
#define TN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TN_OK = 0,
    TN_ERR_ARENA = 1,   /* the model needs a larger arena (TN_ARENA_BYTES), more outputs (TN_MAX_CLASSES), pooled
                         * channels (TN_MAX_CHANNELS) or column scratch (TN_MAX_COLUMN) than built with */
    TN_ERR_MODEL = 2,   /* a malformed model descriptor */
    TN_ERR_STATE = 3    /* non-volatile state from another model or run */
} tn_status;

typedef enum {
    TN_CONV = 1,    /* int8 -> int8: convolution (1-D or 2-D), per-channel requantization, fused clamp */
    TN_POOL = 2,    /* int8 -> int32: global sum over positions (the trained models' average pool) */
    TN_DENSE = 3,   /* int32 -> int32 logits: the trained models' classifier */
    TN_DWCONV = 4,  /* int8 -> int8: depthwise convolution, cout = cin x depth multiplier (TFLite's) */
    TN_AVGPOOL = 5, /* int8 -> int8: windowed average, TFLite's rounding, same scale in and out */
    TN_MAXPOOL = 6, /* int8 -> int8: windowed maximum */
    TN_MEAN = 7,    /* int8 -> int8: mean over positions, as TFLite Micro's MEAN */
    TN_FC = 8,      /* int8 -> int8: fully connected, requantized, applied to each of hin rows of cin inputs
                     * (hout = hin rows of cout outputs); the last layer writes its int8 outputs as int32
                     * logits */
    TN_LUT = 9,     /* int8 -> int8 value by value through 256-entry tables (weight: cin tables, one per
                     * channel of cout, or one for all): LOGISTIC, TANH, ADD/MUL by constants */
    TN_ADD = 10,    /* int8 + int8 -> int8, value by value, TFLite's quantized ADD (a residual connection):
                     * src and src2 rescaled (multiplier/shift [0] and [1], after a left shift of 20), summed,
                     * requantized ([2]); cin = cout channels, hin x win positions */
    TN_CONCAT = 11, /* int8 -> int8: the cin channels of src into channels in2_offset... of dst's cout (one
                     * input of a CONCATENATION along channels; each input is one such layer) */
    TN_MUL = 12     /* int8 x int8 -> int8, value by value, TFLite's quantized MUL: (src + in_offset)
                     * (src2 + in2_offset) requantized by multiplier/shift [0], plus out_offset, clamped;
                     * cin = cout channels, hin x win positions (a recurrent layer's gate products) */
} tn_kind;

typedef struct {
    tn_kind kind;
    uint16_t cin, hin, win;       /* input: channels x rows x columns (rows = 1 for 1-D) */
    uint16_t cout, hout, wout;    /* output (dense: cout classes) */
    uint8_t kh, kw, stride, pad;  /* window geometry (kh = 1 for 1-D); stride: columns between windows;
                                   * pad: columns on the left */
    uint8_t pad_h;                /* rows of padding on top (below and right: up to hout, wout) */
    int32_t in_offset;            /* added to every input value (-zero point) */
    int32_t out_offset;           /* output zero point */
    int32_t act_min, act_max;     /* output clamp (the fused ReLU) */
    const int8_t *weight;         /* conv: int16 behind this pointer, word aligned: [cout][depth], a row's
                                   * taps in (kh, kw, cin) order, zero-padded to depth = a multiple of 4,
                                   * the rows of channels 2p and 2p + 1 alternating group of four taps by
                                   * group (an odd last row whole at the end; export.cgen's conv_rows);
                                   * dwconv: int16 behind this pointer, word aligned (export.cgen's
                                   * depthwise_weights: channel quads tap after tap as w0, w2, w1, w3,
                                   * then the other channels in TFLite's [kh][kw][rest] order);
                                   * dense, fc: [cout][cin] */
    const int32_t *bias;          /* [cout]; add: 0, or [2][256] each input's rescaled value by int8 value */
    const int32_t *multiplier;    /* conv, dwconv, fc: [cout], Q31; mean: [1], 1/positions folded in */
    const int32_t *shift;         /* as multiplier: a right shift (< 0: a left shift) */
    uint8_t stride_h;             /* rows between windows; 0: stride, the columns' (older descriptors) */
    uint8_t dil_h, dil_w;         /* dilation: rows, columns between a window's taps (0 or 1: adjacent) */
    int32_t in2_offset;           /* add: the second input's offset (-zero point); concat: the first channel
                                   * of dst written */
    uint32_t src, src2, dst;      /* byte offsets in the arena of the input, the second input (ADD) and the
                                   * output (export.firmware.plan); a pool writes the pooled sums, a dense
                                   * layer and the last fully connected one the logits, not the arena */
    const int32_t *requant;       /* conv, dwconv, fc: [cout][3] = multiplier, 2^(shift - 2) + out_offset
                                   * 2^(shift - 1), shift - 1, when every shift is a right shift of 2 or more
                                   * and |out_offset| 2^(shift - 1) + 2^(shift - 2) < 2^29 (export.cgen writes
                                   * it, so the 64-bit sum cannot overflow): the same
                                   * requantization and zero point in one multiply-accumulate and fewer
                                   * instructions; 0: multiplier, shift and out_offset */
    const int32_t *packed;        /* 0, or the stream a fast kernel walks with one pointer, export.cgen's
                                   * packed_stream, where the layer qualifies: biases, weights and output
                                   * stage block of channels by block, each output stage row {multiplier,
                                   * 2^(shift - 1) + out_offset 2^shift, shift} taken by one SMMLAR from a
                                   * doubled sum (kernel.h's requant_doubled). The fields above stay for the
                                   * other paths (an fc's weight is 0: the stream holds it).
                                   * dwconv, a depth multiplier of 1 or 2, cin a multiple of 4, 2 to
                                   * TN_PACKED_TAPS taps (kh kw): two tables of kh kw + 2 words, where the
                                   * window's taps lie in bytes from its first, in place in the input and
                                   * gathered (tap after tap, cin bytes each): the taps in pairs, then -1 and
                                   * the odd last tap's (or 0), padded with 0; then per quad of channels
                                   * c..c+3: [4] 2 (bias + in_offset x the taps' sum); [pairs][4] taps t and
                                   * t + 1 (TFLite's (ky, kx) order) of each channel as int16 halves, 2 w_t
                                   * low; an odd last tap's [2] (c, c + 2), (c + 1, c + 3) halves (a
                                   * multiplier of 2: (c, c + 1), (c + 2, c + 3)); [4][3] rows.
                                   * conv, 1 x 1 over cin 8 or 16, unpadded, an output range of all int8: per
                                   * block of 2 channels (cin 8) or 1: [block] 2 bias; [block][cin / 2] per
                                   * input word the int16 halves (2 w0, 2 w2), (2 w1, 2 w3); [block][3] rows.
                                   * fc, cin a multiple of 8, cout of 4, an output range of all int8: per
                                   * block of 4 rows: [4] bias + in_offset x the row's sum (the kernel doubles
                                   * the sum); [cin / 4][4] each row's next four int8 weights as one word;
                                   * [4][3] rows. */
} tn_layer;

/* The most taps (kh x kw) a packed depthwise window has: its table of input offsets lies on the stack. */
#define TN_PACKED_TAPS 64u

typedef struct {
    const char *name;
    uint16_t n_layers;
    const tn_layer *layers;
    uint32_t input_bytes;         /* int8 input, [hin][win][cin] of the first layer (channels last) */
    uint16_t n_classes;
    uint32_t macs;
    uint32_t energy_nj;           /* one inference on the target profile (DynInfer) */
    uint16_t accuracy_permille;   /* measured test accuracy of this variant */
    uint32_t arena_bytes;         /* the memory plan's peak: the arena this model needs */
    uint32_t input_offset;        /* where tn_start puts the input in the arena */
} tn_model;

/* A build for a generated model takes these from its tn_config.h (firmware/Makefile includes it
 * in every file): the largest over the model's variants. The defaults serve the C unit tests. */
#ifndef TN_ARENA_BYTES
#define TN_ARENA_BYTES 4096       /* the activation arena */
#endif
#ifndef TN_MAX_CLASSES
#define TN_MAX_CLASSES 16         /* outputs of the last layer */
#endif
#ifndef TN_MAX_CHANNELS
#define TN_MAX_CHANNELS 128       /* channels a global sum pool keeps (int32) */
#endif
#ifndef TN_MAX_COLUMN
#define TN_MAX_COLUMN 1024        /* int16 scratch: TN_TILE_POSITIONS x the widest conv's depth */
#endif
#define TN_TILE_POSITIONS 2u      /* output positions per conv tile */

#define TN_MAGIC 0x544E4E31u      /* "TNN1" */

/* A compiler barrier: the compiler may not move memory accesses across it. It is not a hardware
 * barrier (no DMB/DSB): on one Cortex-M core writing its own FRAM or SRAM, what a power cut can
 * observe is the order the stores were issued in, which is program order once the compiler keeps
 * it. A commit is a barrier, one aligned word store, a barrier. */
#define TN_COMPILER_BARRIER() __asm__ volatile("" ::: "memory")

/* Everything that must survive a power failure: place it in non-volatile memory (FRAM, or a
 * .noinit region the loader does not touch). Under TN_ATOMIC the arena is not part of it: the
 * executor keeps it in volatile RAM (tn_volatile_arena). */
typedef struct {
    uint32_t magic;               /* TN_MAGIC once a run's input is in place */
    uint32_t run;                 /* which run (input) the state belongs to */
    uint32_t variant;             /* the model variant chosen when the run started */
    uint32_t progress;            /* tiles done; the only word a commit writes */
    int32_t logits[TN_MAX_CLASSES];
    int32_t pooled[TN_MAX_CHANNELS];
#ifndef TN_ATOMIC
    int8_t arena[TN_ARENA_BYTES] __attribute__((aligned(16)));
#endif
} tn_nv;

#ifdef TN_ATOMIC
extern int8_t tn_volatile_arena[TN_ARENA_BYTES]; /* the arena under TN_ATOMIC: volatile RAM, lost at a cut */
#endif

/* Scratch in volatile RAM (contents need not survive a power failure): a tile's im2col columns. */
typedef struct {
    int16_t column[TN_MAX_COLUMN] __attribute__((aligned(8))); /* or a depthwise window's bytes */
} tn_scratch;

/* Called after every commit with the new progress value; a board or test harness may cut power
 * here. Define TN_PROGRESS_HOOK to a function name to use it. */
#ifdef TN_PROGRESS_HOOK
void TN_PROGRESS_HOOK(uint32_t progress);
#endif

/* Start a run if `nv` does not already hold run `run`: copies the input, then commits. Under
 * TN_ATOMIC a run that `nv` holds but did not finish (a power cut) starts again from `input`. */
tn_status tn_start(tn_nv *nv, const tn_model *model, uint32_t variant, uint32_t run, const int8_t *input);
/* Run (or resume) to the end; logits land in nv->logits. */
tn_status tn_resume(tn_nv *nv, const tn_model *model, tn_scratch *scratch);
/* Tiles of a whole inference (progress points). */
uint32_t tn_total_tiles(const tn_model *model);
uint16_t tn_argmax(const int32_t *logits, uint16_t n);
/* DynInfer: the most accurate variant whose energy fits what the capacitor holds above the
 * brown-out voltage; if none fits, the cheapest. Voltages in millivolts, capacitance in uF. */
uint32_t tn_choose_variant(const tn_model *const *variants, uint32_t n, uint32_t voltage_mv, uint32_t v_cut_mv,
                           uint32_t capacitance_uf);

/* ---- Early decisions (FIRMBOUND): a frame model after every sample, then a stopping rule ------
 *
 * After sample t the frame model reads the last `context` int8 samples (channel by channel, oldest
 * first; zeros before the first sample); A_t = sum over samples of (int8 logit - zero point),
 * in int32; pi_k = floor(2^16 e_k / sum e), e_k = exp_q16[max A - A_k] (0 beyond the table); stop
 * when L (2^16 - max pi) <= c 2^16 + clamp(-max_i (a_i . pi + b_i 2^16), 0, L 2^16) (the pieces,
 * c and L in Q(frac_bits), everything in int64), and at t = horizon at the latest. The same
 * integers as edge.classify.early's integer rule, so the decisions agree bit for bit.
 *
 * Intermittency: the samples sit in a ring and A in two slots in non-volatile memory. A step
 * writes sample t into the ring and commits `sampled` = t (one word store): from then on sample t
 * is the ring's, and a step redone after a power cut ignores the sample it is given (a sensor read
 * again gives another value). It then runs the frame model (tn_start/tn_resume), writes A_t's
 * slot and commits t with one word store; redone after a cut, it rewrites the same bytes. */
typedef struct {
    const tn_model *frame;        /* int8 channels x context in, its int8 logits out */
    uint16_t channels, context, horizon, n_classes, n_pieces;
    int32_t logit_zero_point;
    uint32_t exp_len;
    const uint32_t *exp_q16;      /* exp(-j x logit scale) in Q16, j < exp_len */
    const int32_t *pieces;        /* [horizon - 1][n_pieces][n_classes + 1]: slopes, then the intercept */
    uint8_t frac_bits;
    int32_t cost_q, loss_q;       /* c and L in Q(frac_bits) */
} tn_early;

#ifndef TN_EARLY_WINDOW
#define TN_EARLY_WINDOW 1024      /* bytes of the sample ring: context x channels */
#endif
#define TN_EARLY_MAGIC 0x544E4531u /* "TNE1" */

typedef struct {
    uint32_t magic;               /* TN_EARLY_MAGIC once series `series` began */
    uint32_t series;
    uint32_t sampled;             /* sample `sampled` is in the ring (committed before the frame runs) */
    uint32_t t;                   /* samples whose logits are summed: a step's last commit */
    int32_t acc[2][TN_MAX_CLASSES]; /* A_t in acc[t & 1] */
    int8_t ring[TN_EARLY_WINDOW]; /* sample u (from 1) at row (u - 1) % context */
} tn_early_nv;

typedef struct {
    uint32_t stop;                /* 1: the decision is safe (or the horizon is reached) */
    uint32_t label;               /* the class leading now */
    uint32_t t;                   /* samples taken */
    uint32_t max_posterior_q16;
} tn_decision;

/* Begin series `series` (any id but 0), unless `s` already holds it (after a power failure). */
tn_status tn_early_begin(tn_early_nv *s, const tn_early *e, uint32_t series);
/* Take sample t (from 1; `channels` int8 values) and decide. t = s->t repeats the last decision
 * (what a caller resuming after a power failure asks first); anything but s->t or s->t + 1 is
 * TN_ERR_STATE. A resumed step whose sample is already in the ring (s->sampled == t) ignores
 * `sample`. Uses nv and scratch for the frame model. */
tn_status tn_early_update(const tn_early *e, tn_early_nv *s, tn_nv *nv, tn_scratch *scratch, uint32_t t,
                          const int8_t *sample, tn_decision *d);

/* Kernels (exposed for tests and benchmarks). */
/* One conv tile: output positions tile * TN_TILE_POSITIONS ... (row-major over hout x wout, the
 * last tile may hold fewer) of every output channel. */
void tn_conv_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile, int16_t *column);
void tn_conv_tile_reference(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile, int16_t *column);
uint32_t tn_depth(const tn_layer *l); /* conv: taps per output, rounded up to 4 */
void tn_pool(const tn_layer *l, const int8_t *in, int32_t *out);
void tn_dense(const tn_layer *l, const int32_t *in, int32_t *out);
/* window: scratch for a 3 x 3 window at the padding (9 x cin bytes, TN_MAX_COLUMN x 2 at most). */
void tn_dwconv_tile(const tn_layer *l, const int8_t *in, int8_t *out, uint32_t tile, int8_t *window);
void tn_window_pool(const tn_layer *l, const int8_t *in, int8_t *out);
void tn_mean(const tn_layer *l, const int8_t *in, int8_t *out);
/* Writes int8 outputs to out8, or (out8 = 0) their values as int32 to out32. */
void tn_fc(const tn_layer *l, const int8_t *in, int8_t *out8, int32_t *out32);
void tn_lut(const tn_layer *l, const int8_t *in, int8_t *out);
void tn_add(const tn_layer *l, const int8_t *a, const int8_t *b, int8_t *out);
void tn_mul(const tn_layer *l, const int8_t *a, const int8_t *b, int8_t *out);
void tn_concat(const tn_layer *l, const int8_t *in, int8_t *out);
int32_t tn_requantize(int32_t acc, int32_t multiplier, int32_t shift);

#ifdef __cplusplus
}
#endif
#endif
