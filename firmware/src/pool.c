/* Pooling: the trained models' global sum over positions (int32 out), and TFLite's average and
 * max pools and MEAN over positions (int8 out, TFLite Micro's rounding). Sums of int8 over at most
 * 255 cells fit int16, so four channels are summed at once in two registers of int16 lanes
 * (SXTAB16 adds bytes 0 and 2, or 1 and 3, of a word of channels-last input). */
#include "kernel.h"
#include "simd.h"

#define LANES_MAX 255u /* cells whose int8 sum an int16 lane holds */

void tn_pool(const tn_layer *l, const int8_t *in, int32_t *out) {
    const uint32_t positions = (uint32_t)l->hin * l->win, cin = l->cin;
    for (uint32_t c = 0; c < cin; c++) {
        out[c] = (int32_t)positions * l->in_offset;
    }
    for (uint32_t i = 0; i < positions; i++, in += cin) {
        for (uint32_t c = 0; c < cin; c++) {
            out[c] += in[c];
        }
    }
}

/* Channels c..c+3 summed over a window of `rows` x `cols` cells (`row_step` bytes between rows,
 * `c_n` between cells) in int16 lanes: *even holds (c, c + 2), *odd (c + 1, c + 3). */
static inline __attribute__((always_inline)) void sum_lanes(const int8_t *x, uint32_t rows, uint32_t cols,
                                                            uint32_t row_step, uint32_t c_n, uint32_t *even_out,
                                                            uint32_t *odd_out) {
    uint32_t even = 0, odd = 0;
    for (uint32_t r = 0; r < rows; r++, x += row_step) {
        if (cols == 2u) { /* the common 2 x 2 window's row, unrolled */
            const uint32_t v0 = read_u32(x), v1 = read_u32(x + c_n);
            even = sxtab16(sxtab16(even, v0), v1);
            odd = sxtab16_ror8(sxtab16_ror8(odd, v0), v1);
            continue;
        }
        const int8_t *cell = x;
        for (uint32_t k = 0; k < cols; k++, cell += c_n) {
            const uint32_t v = read_u32(cell);
            even = sxtab16(even, v);
            odd = sxtab16_ror8(odd, v);
        }
    }
    *even_out = even;
    *odd_out = odd;
}

/* The same as four int32 sums, sums[0..3] for channels c..c+3. */
static inline __attribute__((always_inline)) void sum_quad(const int8_t *x, uint32_t rows, uint32_t cols,
                                                           uint32_t row_step, uint32_t c_n, int32_t *sums) {
    uint32_t even, odd;
    sum_lanes(x, rows, cols, row_step, c_n, &even, &odd);
    sums[0] = (int16_t)(even & 0xFFFFu);
    sums[1] = (int16_t)(odd & 0xFFFFu);
    sums[2] = (int16_t)(even >> 16);
    sums[3] = (int16_t)(odd >> 16);
}

/* TFLite's rounded average of the two int16 lane sums of `lanes` over a count of 2^k cells
 * (2 <= 2^k <= 128, half = 2^(k-1) in both lanes), as the low bytes of both lanes: rounding half
 * away from zero is (sum + half - [sum < 0]) >> k for an even count, the lane's sign bit its own
 * bit 15 (bit 31). The average fits int8, so its byte is bits k..k+7 of the lane, which a shift of
 * the whole word brings down (k <= 7: no bit of the other lane reaches them). */
static inline uint32_t average_lanes(uint32_t lanes, uint32_t half2, uint32_t k) {
    return (add16(lanes, half2 - ((lanes >> 15) & 0x00010001u)) >> k) & 0x00FF00FFu;
}

static int8_t clamp8(int32_t v, int32_t lo, int32_t hi) {
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return (int8_t)v;
}

/* TFLite's AveragePool: the window's sum over its cells inside the input, divided by their count,
 * rounding half away from zero: (sum + count / 2) / count above zero, (sum - count / 2) / count
 * else (both 0 for a sum of 0). half = count / 2 takes the sum's sign without a branch. */
static inline int32_t average(int32_t sum, int32_t count) {
    const int32_t sign = sum >> 31, half = count / 2;
    return (sum + ((half ^ sign) - sign)) / count;
}

/* A 2 x 2 window's average for the `n` bytes (a multiple of 4) at x, x + c_n, x + row_step and
 * x + row_step + c_n into o: the common average pool, apart so that its few values stay in
 * registers (count 4: k = 2, half = 2). */
__attribute__((noinline)) static void average_2x2(const int8_t *x, int8_t *o, uint32_t n, uint32_t c_n,
                                                  uint32_t row_step, uint32_t lo4, uint32_t hi4, int full) {
    const int8_t *const end = x + n;
    for (; x < end; x += 4, o += 4) {
        const uint32_t v0 = read_u32(x), v1 = read_u32(x + c_n), v2 = read_u32(x + row_step);
        const uint32_t v3 = read_u32(x + row_step + c_n);
        const uint32_t even = sxtab16(sxtab16(sxtab16(sxtb16(v0), v1), v2), v3);
        const uint32_t odd = sxtab16_ror8(sxtab16_ror8(sxtab16_ror8(sxtb16_ror8(v0), v1), v2), v3);
        const uint32_t v = average_lanes(even, 0x00020002u, 2u) | average_lanes(odd, 0x00020002u, 2u) << 8;
        write_u32(o, full ? v : clamp4(v, lo4, hi4));
    }
}

/* TFLite's AveragePool and MaxPool, clamped to the fused activation's range. The window's cells
 * inside the input are found once per output position. */
void tn_window_pool(const tn_layer *l, const int8_t *in, int8_t *out) {
    const uint32_t c_n = l->cin, row_step = (uint32_t)l->win * c_n;
    const int avg = l->kind == TN_AVGPOOL;
    const uint32_t lo4 = (uint8_t)l->act_min * 0x01010101u, hi4 = (uint8_t)l->act_max * 0x01010101u;
    const int full = l->act_min == -128 && l->act_max == 127; /* the activation's range is all of int8 */
    for (uint32_t oy = 0; oy < l->hout; oy++) {
        for (uint32_t ox = 0; ox < l->wout; ox++) {
            const int32_t iy0 = (int32_t)(oy * stride_rows(l)) - (int32_t)l->pad_h;
            const int32_t ix0 = (int32_t)(ox * l->stride) - (int32_t)l->pad;
            const int32_t fy0 = iy0 < 0 ? -iy0 : 0, fx0 = ix0 < 0 ? -ix0 : 0;
            const int32_t fy1 = iy0 + (int32_t)l->kh > (int32_t)l->hin ? (int32_t)l->hin - iy0 : (int32_t)l->kh;
            const int32_t fx1 = ix0 + (int32_t)l->kw > (int32_t)l->win ? (int32_t)l->win - ix0 : (int32_t)l->kw;
            int8_t *o = out + (oy * l->wout + ox) * c_n;
            if (fy1 <= fy0 || fx1 <= fx0) { /* no cell inside: TFLite's empty sum (0) or its -128 */
                for (uint32_t c = 0; c < c_n; c++) {
                    o[c] = clamp8(avg ? 0 : -128, l->act_min, l->act_max);
                }
                continue;
            }
            const uint32_t rows = (uint32_t)(fy1 - fy0), cols = (uint32_t)(fx1 - fx0);
            const int32_t count = (int32_t)(rows * cols);
            const int8_t *x = in + ((uint32_t)(iy0 + fy0) * l->win + (uint32_t)(ix0 + fx0)) * c_n;
            uint32_t c = 0;
            if (avg && rows == 2u && cols == 2u) {
                c = c_n & ~3u;
                average_2x2(x, o, c, c_n, row_step, lo4, hi4, full);
            } else if (avg && count >= 2 && count <= 128 && (count & (count - 1)) == 0) { /* a count of 2^k: no division */
                const uint32_t k = (uint32_t)__builtin_ctz((uint32_t)count), half2 = (uint32_t)count / 2u * 0x00010001u;
                for (; c + 4u <= c_n; c += 4u) {
                    uint32_t even, odd;
                    sum_lanes(x + c, rows, cols, row_step, c_n, &even, &odd);
                    const uint32_t v = average_lanes(even, half2, k) | average_lanes(odd, half2, k) << 8;
                    write_u32(o + c, full ? v : clamp4(v, lo4, hi4));
                }
            }
            for (; avg && (uint32_t)count <= LANES_MAX && c + 4u <= c_n; c += 4u) { /* four bytes at once */
                int32_t sums[4];
                sum_quad(x + c, rows, cols, row_step, c_n, sums);
                const uint32_t v = (uint32_t)(uint8_t)average(sums[0], count) |
                                   (uint32_t)(uint8_t)average(sums[1], count) << 8 |
                                   (uint32_t)(uint8_t)average(sums[2], count) << 16 |
                                   (uint32_t)(uint8_t)average(sums[3], count) << 24;
                write_u32(o + c, clamp4(v, lo4, hi4));
            }
            for (; c < c_n; c++) {
                int32_t acc = avg ? 0 : -128;
                const int8_t *row = x + c;
                for (uint32_t r = 0; r < rows; r++, row += row_step) {
                    for (uint32_t k = 0; k < cols; k++) {
                        const int32_t v = row[k * c_n];
                        acc = avg ? acc + v : (v > acc ? v : acc);
                    }
                }
                o[c] = clamp8(avg ? average(acc, count) : acc, l->act_min, l->act_max);
            }
        }
    }
}

/* TFLite Micro's MEAN over positions for int8: the sum of (x - input zero point), requantized by a
 * multiplier with 1/positions folded in (QuantizedMeanOrSum). */
void tn_mean(const tn_layer *l, const int8_t *in, int8_t *out) {
    const uint32_t positions = (uint32_t)l->hin * l->win, c_n = l->cin;
    int32_t sums[4] = {0, 0, 0, 0};
    for (uint32_t c = 0; c < c_n; c++) {
        const uint32_t lane = c % 4u;
        const int quad = c - lane + 4u <= c_n && positions <= LANES_MAX;
        if (quad && lane == 0u) {
            sum_quad(in + c, 1u, positions, 0u, c_n, sums);
        }
        int32_t sum = quad ? sums[lane] : 0;
        for (uint32_t p = 0; !quad && p < positions; p++) {
            sum += in[p * c_n + c];
        }
        out[c] = clamp8(mbqm(sum + l->in_offset * (int32_t)positions, l->multiplier[0], l->shift[0]) + l->out_offset,
                        -128, 127);
    }
}
