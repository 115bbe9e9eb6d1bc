/* QEMU TCG plugin: count guest instructions and estimate their Cortex-M4 cycles, record both at
 * every call of a marker function, and cut power (exit at once, status 3) before instruction
 * number `cut`.
 *
 *   -plugin libtncount.so,out=FILE,mark=0xADDR[,cut=N[,hold=FILE]]
 *
 * FILE holds `total INSNS`, `cycles CYCLES` and a line `mark INSNS CYCLES` per call of the
 * marker, the counts before its first instruction. With cut=N only the instructions are counted
 * (`total INSNS`, `mark INSNS`): a cut run is about where power fails, not how long it takes.
 *
 * With hold=FILE the cut does not exit: the vCPU stops before the instruction and FILE is
 * created, so that the harness can save the board's non-volatile memory through the monitor
 * (pmemsave) before it kills QEMU: for a board whose non-volatile memory QEMU does not model
 * (the STM32F405's backup SRAM) and which therefore lives in guest RAM under QEMU.
 *
 * The cycle estimate. Each instruction is decoded from its bytes when QEMU translates it (the
 * ARMv7-M ARM, DDI 0403, A5.2 and A5.3: 16-bit and 32-bit Thumb encodings) into a class whose
 * cost is that of the Cortex-M4 TRM (DDI 0439 / 100166 r0p1, 3.3.1 Table 3-1, "Processor
 * instruction set summary", zero wait states), with P, the pipeline refill, taken as 2 (the
 * TRM gives 1 to 3 by the target's width and alignment and whether the address was speculated;
 * 1 or 3 instead moves a digits model's estimate by 4 %):
 *
 *   data processing, MOVW/MOVT, shifts, bit fields, extends, saturation, SIMD    1
 *   MUL, MLA, MLS, SMULL, UMULL, SMLAL, UMLAL, UMAAL and every DSP multiply
 *     (SMLAD{X}, SMLSD, SMUAD, SMLAxy, SMULxy, SMLAWy, SMLALxy, SMLALD, SMMUL, SMMLA, ...)  1
 *   SDIV, UDIV                       12: the TRM's 2 to 12 (early termination by the operands'
 *                                    leading bits), the worst case, so that no divide is
 *                                    under-counted; the kernels divide per tile or column, not per
 *                                    MAC (a digits model: 2 instead of 12 lowers its estimate 0.2 %)
 *   LDR, LDRB, LDRH, LDRSB, LDRSH, STR, STRB, STRH, LDREX*, STREX*   2, or 1 when pipelined:
 *     the TRM's load/store timing notes: a single load or store directly after a single load
 *     completes in one cycle unless its base or offset register is that load's destination
 *     ("LDR R0,[R1]; LDR R1,[R2]: normally three cycles total"); nothing pipelines behind a store
 *   LDRD, STRD                       1 + N = 3 (N = 2 registers; never pipelined)
 *   LDM, STM, PUSH, POP              1 + N (N = registers in the list, PC and LR included)
 *   POP / LDM with PC                1 + N + P
 *   LDR to PC                        2 + P
 *   B, BL, BX, BLX, MOV PC, ADD PC   1 + P
 *   B<c>, CBZ, CBNZ                  1 not taken, 1 + P taken
 *   TBB, TBH                         2 + P
 *   IT                               0 after a 16-bit instruction (folded onto it), else 1
 *   ISB                              1 + P (B, the barrier, is a pipeline refill); DMB, DSB 1
 *   MRS, MSR, CPS, hints, BKPT, SVC, and the FPU (unused by the soft-float firmware)    1
 *
 * A branch's outcome is seen at run time: QEMU ends a translation block (TB) at every
 * instruction that writes the PC, so when a TB ends in a conditional one (B<c>, CBZ, CBNZ, or a
 * PC write inside an IT block), the next TB to execute shows whether it was taken: P is added
 * unless that TB starts at the branch's fall-through address. An unconditional one is taken
 * every time and carries P in its TB's static cost.
 *
 * Not modelled: instructions skipped inside an IT block cost as if executed (the TRM gives 1;
 * the same for data processing, an over-count for a skipped load or divide); a load or store
 * whose address is the result of the instruction just before it (the TRM's one-cycle AGU stall);
 * the pipelining of a load across a TB boundary; exception entry and return (the firmware takes
 * none: semihosting ends TBs but enters no handler); flash wait states (QEMU's memory has none,
 * like the TRM's table).
 *
 * The count mode has one callback per TB, as the instruction count always had: the branch check
 * must run on every TB, so an inline add would save nothing.
 *
 * Debian's QEMU loads plugins but ships no qemu-plugin.h: the few API v1 functions used here
 * are declared below, as QEMU 7.2's include/qemu/qemu-plugin.h defines them. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_info_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_CB_R_REGS, QEMU_PLUGIN_CB_RW_REGS };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, qemu_plugin_vcpu_udata_cb_t cb,
                                          enum qemu_plugin_cb_flags flags, void *userdata);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *insn, qemu_plugin_vcpu_udata_cb_t cb,
                                            enum qemu_plugin_cb_flags flags, void *userdata);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *insn);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

enum { REFILL = 2, DIVIDE = 12, NO_REG = 0xFF };
#define NO_BRANCH UINT64_MAX
#define MAX_MARKS (1u << 16)

static uint64_t count, cycles, cut, mark_addr = UINT64_MAX;
static uint64_t pending_fallthrough = NO_BRANCH; /* where the last TB's conditional branch falls through */
static uint64_t marks[MAX_MARKS], cycle_marks[MAX_MARKS];
static size_t n_marks;
static char out_path[4096], hold_path[4096];

/* ---- decoding: one instruction's class and cost ------------------------------------------------ */

enum mem_kind { NOT_MEM, LOAD_SINGLE, STORE_SINGLE };

typedef struct {
    unsigned cycles;       /* the TRM's cost, without P for a PC write and without pipelining */
    enum mem_kind mem;     /* single loads and stores pipeline */
    uint8_t rt, rn, rm;    /* a single load's destination; its or a store's address registers */
    uint8_t writes_pc;     /* a branch: +P when taken */
    uint8_t conditional;   /* B<c>, CBZ, CBNZ: taken or not by its own condition */
    uint8_t it_mask;       /* an IT instruction's mask (non-zero only for IT) */
} insn_cost;

static insn_cost cost(unsigned n_cycles) {
    insn_cost c = {n_cycles, NOT_MEM, NO_REG, NO_REG, NO_REG, 0, 0, 0};
    return c;
}

static insn_cost single(int load, unsigned rt, unsigned rn, unsigned rm) {
    insn_cost c = cost(2);
    c.mem = load ? LOAD_SINGLE : STORE_SINGLE;
    c.rt = (uint8_t)rt, c.rn = (uint8_t)rn, c.rm = (uint8_t)rm;
    return c;
}

static insn_cost branch(unsigned n_cycles, int conditional) {
    insn_cost c = cost(n_cycles);
    c.writes_pc = 1, c.conditional = (uint8_t)conditional;
    return c;
}

static unsigned registers(unsigned list) {
    return (unsigned)__builtin_popcount(list);
}

/* A 16-bit Thumb instruction (ARMv7-M ARM A5.2). */
static insn_cost decode16(unsigned hw) {
    switch (hw >> 12) {
    case 0x4:
        if ((hw & 0xFC00) == 0x4400) { /* special data processing and branch/exchange (A5.2.3) */
            unsigned op = (hw >> 8) & 3u, rd = ((hw >> 4) & 8u) | (hw & 7u);
            if (op == 3u) return branch(1, 0);                     /* BX, BLX */
            if (op != 1u && rd == 15u) return branch(1, 0);        /* ADD PC, MOV PC */
            return cost(1);
        }
        if ((hw & 0xF800) == 0x4800) return single(1, (hw >> 8) & 7u, 15, NO_REG); /* LDR literal */
        return cost(1);                                            /* data processing, MULS */
    case 0x5: /* register offset: STR, STRH, STRB, LDRSB, LDR, LDRH, LDRB, LDRSH */
        return single(((hw >> 9) & 7u) >= 3u, hw & 7u, (hw >> 3) & 7u, (hw >> 6) & 7u);
    case 0x6: case 0x7: case 0x8: /* immediate offset: word, byte, halfword */
        return single((hw >> 11) & 1u, hw & 7u, (hw >> 3) & 7u, NO_REG);
    case 0x9: /* SP-relative */
        return single((hw >> 11) & 1u, (hw >> 8) & 7u, 13, NO_REG);
    case 0xB: /* miscellaneous (A5.2.5) */
        if ((hw & 0xF500) == 0xB100) return branch(1, 1);                 /* CBZ, CBNZ */
        if ((hw & 0xFE00) == 0xB400) return cost(1 + registers(hw & 0x1FFu)); /* PUSH, LR in bit 8 */
        if ((hw & 0xFE00) == 0xBC00) {                                    /* POP, PC in bit 8 */
            insn_cost c = cost(1 + registers(hw & 0x1FFu));
            c.writes_pc = (hw >> 8) & 1u;
            return c;
        }
        if ((hw & 0xFF00) == 0xBF00 && (hw & 0xFu) != 0u) {               /* IT (mask 0: a hint) */
            insn_cost c = cost(1);
            c.it_mask = (uint8_t)(hw & 0xFu);
            return c;
        }
        return cost(1);
    case 0xC: /* STM, LDM */
        return cost(1 + registers(hw & 0xFFu));
    case 0xD: /* B<c>; condition 1110 is UDF, 1111 SVC */
        return ((hw >> 8) & 0xFu) < 0xEu ? branch(1, 1) : cost(1);
    case 0xE: /* B (T2); 11101 is the first half of a 32-bit instruction, never seen here */
        return branch(1, 0);
    default:  /* shifts, add/subtract/compare/move immediate, ADR, ADD SP */
        return cost(1);
    }
}

/* Load/store dual or exclusive, table branch (A5.3.6). */
static insn_cost decode_dual(unsigned hw1, unsigned hw2) {
    unsigned op1 = (hw1 >> 7) & 3u, op2 = (hw1 >> 4) & 3u, op3 = (hw2 >> 4) & 0xFu;
    unsigned rn = hw1 & 0xFu, rt = hw2 >> 12;
    if ((op1 & 2u) != 0u || op2 >= 2u) return cost(1 + 2);         /* LDRD, STRD: 1 + N */
    if (op1 == 0u) return single(op2 == 1u, rt, rn, NO_REG);          /* STREX, LDREX */
    if (op2 == 0u) return single(0, rt, rn, NO_REG);                  /* STREXB, STREXH */
    if (op3 <= 1u) return branch(2, 0);                               /* TBB, TBH: 2 + P */
    return single(1, rt, rn, NO_REG);                                 /* LDREXB, LDREXH */
}

/* Branches and miscellaneous control (A5.3.4). */
static insn_cost decode_branch(unsigned hw1, unsigned hw2) {
    switch ((hw2 >> 12) & 5u) {
    case 0:
        if (((hw1 >> 7) & 7u) != 7u) return branch(1, 1);                /* B<c>.W (T3) */
        if (hw1 == 0xF3BFu && (hw2 & 0xFFF0u) == 0x8F60u) return cost(1 + REFILL); /* ISB */
        return cost(1);                                                   /* MSR, MRS, hints, DMB, DSB */
    case 1:
    case 5:
        return branch(1, 0);                                              /* B.W (T4), BL */
    default:
        return cost(1);
    }
}

/* Load and store single items (A5.3.7 to A5.3.10): word, halfword, byte; the register offset
 * form when bit 7 of the first halfword is clear and bits 11:6 of the second are. */
static insn_cost decode_single(unsigned hw1, unsigned hw2, int load) {
    unsigned rn = hw1 & 0xFu, rt = hw2 >> 12;
    unsigned rm = ((hw1 & 0x80u) == 0u && (hw2 & 0x0FC0u) == 0u && rn != 15u) ? (hw2 & 0xFu) : NO_REG;
    if (load && rt == 15u) {
        if (((hw1 >> 5) & 3u) == 2u) return branch(2, 0);                 /* LDR PC: 2 + P */
        return cost(1);                                                   /* PLD, PLI */
    }
    return single(load, rt, rn, rm);
}

/* A 32-bit Thumb instruction (A5.3): op1 = hw1[12:11], op2 = hw1[10:4], op = hw2[15]. */
static insn_cost decode32(unsigned hw1, unsigned hw2) {
    unsigned op1 = (hw1 >> 11) & 3u, op2 = (hw1 >> 4) & 0x7Fu;
    if (op1 == 1u) {
        if ((op2 & 0x64u) == 0x00u) { /* load/store multiple (A5.3.5): IA or DB, L in bit 4 */
            unsigned mode = (hw1 >> 7) & 3u;
            if (mode != 1u && mode != 2u) return cost(1);
            insn_cost c = cost(1 + registers(hw2 & 0xFFFFu));
            c.writes_pc = ((hw1 >> 4) & 1u) && (hw2 & 0x8000u);
            return c;
        }
        if ((op2 & 0x64u) == 0x04u) return decode_dual(hw1, hw2);
        return cost(1);                                  /* data processing (shifted register), coprocessor */
    }
    if (op1 == 2u) return (hw2 & 0x8000u) ? decode_branch(hw1, hw2) : cost(1); /* else data processing (immediate) */
    if ((op2 & 0x71u) == 0x00u) return decode_single(hw1, hw2, 0);            /* store single */
    if ((op2 & 0x67u) == 0x01u || (op2 & 0x67u) == 0x03u || (op2 & 0x67u) == 0x05u)
        return decode_single(hw1, hw2, 1);                                     /* load byte, halfword, word */
    if ((op2 & 0x78u) == 0x38u) {                                              /* long multiply, divide */
        unsigned op = (hw1 >> 4) & 7u;
        if ((op == 1u || op == 3u) && ((hw2 >> 4) & 0xFu) == 0xFu) return cost(DIVIDE); /* SDIV, UDIV */
    }
    return cost(1); /* data processing (register), multiplies, coprocessor */
}

static insn_cost decode(const uint8_t *bytes, size_t size) {
    unsigned hw1 = (unsigned)bytes[0] | ((unsigned)bytes[1] << 8);
    if (size < 4u) return decode16(hw1);
    return decode32(hw1, (unsigned)bytes[2] | ((unsigned)bytes[3] << 8));
}

/* The IT block's length from its mask: the position of the mask's lowest set bit. */
static unsigned it_length(unsigned mask) {
    return 4u - (unsigned)__builtin_ctz(mask);
}

/* ---- a translation block's static cost -------------------------------------------------------- */

typedef struct {
    uint64_t start;       /* the TB's first address */
    uint64_t fallthrough; /* where its last instruction, a conditional branch, falls through; else NO_BRANCH */
    uint32_t insns, cycles;
    int at_mark;
} tb_cost;

static tb_cost *cost_tb(const struct qemu_plugin_tb *tb) {
    tb_cost *t = calloc(1, sizeof *t); /* one per translation; QEMU 7.2 tells a plugin of no TB flush */
    if (t == NULL) {
        fprintf(stderr, "tncount: out of memory\n");
        _exit(1);
    }
    size_t n = qemu_plugin_tb_n_insns(tb);
    t->start = qemu_plugin_tb_vaddr(tb);
    t->fallthrough = NO_BRANCH;
    t->insns = (uint32_t)n;
    t->at_mark = t->start == mark_addr;
    insn_cost prev = cost(0);
    size_t prev_size = 0;
    unsigned it_left = 0;
    for (size_t i = 0; i < n; i++) {
        const struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        size_t size = qemu_plugin_insn_size(insn);
        insn_cost c = decode(qemu_plugin_insn_data(insn), size);
        unsigned cyc = c.cycles;
        int in_it = it_left > 0u;
        if (in_it) it_left--;
        if (c.it_mask != 0u) {
            cyc = prev_size == 2u ? 0u : 1u; /* folded onto a preceding 16-bit instruction */
            it_left = it_length(c.it_mask);
        } else if (c.mem != NOT_MEM && prev.mem == LOAD_SINGLE && prev.rt != c.rn && prev.rt != c.rm) {
            cyc = 1; /* pipelined behind the load */
        }
        if (c.writes_pc) {
            if (i + 1 == n && (c.conditional || in_it))
                t->fallthrough = qemu_plugin_insn_vaddr(insn) + size; /* P at run time, if taken */
            else
                cyc += REFILL;
        }
        t->cycles += cyc;
        prev = c, prev_size = size;
    }
    return t;
}

/* ---- run time ----------------------------------------------------------------------------------- */

static void write_out(void) {
    if (out_path[0] == '\0') return;
    FILE *f = fopen(out_path, "w");
    if (f == NULL) return;
    fprintf(f, "total %" PRIu64 "\n", count);
    if (cut == 0u) fprintf(f, "cycles %" PRIu64 "\n", cycles);
    for (size_t i = 0; i < n_marks; i++) {
        if (cut == 0u) fprintf(f, "mark %" PRIu64 " %" PRIu64 "\n", marks[i], cycle_marks[i]);
        else fprintf(f, "mark %" PRIu64 "\n", marks[i]);
    }
    fclose(f);
}

static void on_tb(unsigned int vcpu, void *udata) {
    (void)vcpu;
    const tb_cost *t = udata;
    if (pending_fallthrough != NO_BRANCH && t->start != pending_fallthrough) cycles += REFILL; /* taken */
    pending_fallthrough = t->fallthrough;
    if (t->at_mark && n_marks < MAX_MARKS) {
        marks[n_marks] = count;
        cycle_marks[n_marks++] = cycles;
    }
    count += t->insns;
    cycles += t->cycles;
}

static void on_insn(unsigned int vcpu, void *udata) {
    (void)vcpu;
    if ((uintptr_t)udata == 1u && n_marks < MAX_MARKS) marks[n_marks++] = count;
    if (count == cut) { /* power fails before this instruction executes */
        write_out();
        if (hold_path[0] == '\0') _exit(3);
        FILE *f = fopen(hold_path, "w");
        if (f != NULL) fclose(f);
        for (;;) pause(); /* until the harness has saved the memory and kills QEMU */
    }
    count++;
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    if (cut == 0u) {
        qemu_plugin_register_vcpu_tb_exec_cb(tb, on_tb, QEMU_PLUGIN_CB_NO_REGS, cost_tb(tb));
        return;
    }
    size_t n = qemu_plugin_tb_n_insns(tb);
    for (size_t i = 0; i < n; i++) {
        uintptr_t first_at_mark = (i == 0u && qemu_plugin_tb_vaddr(tb) == mark_addr) ? 1u : 0u;
        qemu_plugin_register_vcpu_insn_exec_cb(qemu_plugin_tb_get_insn(tb, i), on_insn, QEMU_PLUGIN_CB_NO_REGS,
                                               (void *)first_at_mark);
    }
}

static void on_exit_cb(qemu_plugin_id_t id, void *udata) {
    (void)id;
    (void)udata;
    write_out();
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const struct qemu_info_t *info,
                                                               int argc, char **argv) {
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "cut=", 4) == 0) cut = strtoull(argv[i] + 4, NULL, 0);
        else if (strncmp(argv[i], "mark=", 5) == 0) mark_addr = strtoull(argv[i] + 5, NULL, 0);
        else if (strncmp(argv[i], "out=", 4) == 0) snprintf(out_path, sizeof out_path, "%s", argv[i] + 4);
        else if (strncmp(argv[i], "hold=", 5) == 0) snprintf(hold_path, sizeof hold_path, "%s", argv[i] + 5);
        else {
            fprintf(stderr, "tncount: unknown argument %s\n", argv[i]);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, on_exit_cb, NULL);
    return 0;
}
