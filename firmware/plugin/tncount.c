/* QEMU TCG plugin: count guest instructions, record the count at every call of a marker
 * function, and cut power (exit at once, status 3) before instruction number `cut`.
 *
 *   -plugin libtncount.so,out=FILE,mark=0xADDR[,cut=N[,hold=FILE]]
 *
 * With hold=FILE the cut does not exit: the vCPU stops before the instruction and FILE is
 * created, so that the harness can save the board's non-volatile memory through the monitor
 * (pmemsave) before it kills QEMU: for a board whose non-volatile memory QEMU does not model
 * (the STM32F405's backup SRAM) and which therefore lives in guest RAM under QEMU.
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

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

static uint64_t count, cut, mark_addr = UINT64_MAX;
static uint64_t marks[1u << 16];
static size_t n_marks;
static char out_path[4096], hold_path[4096];

static void write_out(void) {
    if (out_path[0] == '\0') return;
    FILE *f = fopen(out_path, "w");
    if (f == NULL) return;
    fprintf(f, "total %" PRIu64 "\n", count);
    for (size_t i = 0; i < n_marks; i++) fprintf(f, "mark %" PRIu64 "\n", marks[i]);
    fclose(f);
}

static void on_tb(unsigned int vcpu, void *udata) {
    (void)vcpu;
    uint64_t packed = (uint64_t)(uintptr_t)udata; /* n_insns << 1 | starts at the marker */
    if ((packed & 1u) && n_marks < sizeof marks / sizeof marks[0]) marks[n_marks++] = count;
    count += packed >> 1;
}

static void on_insn(unsigned int vcpu, void *udata) {
    (void)vcpu;
    if ((uintptr_t)udata == 1u && n_marks < sizeof marks / sizeof marks[0]) marks[n_marks++] = count;
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
    size_t n = qemu_plugin_tb_n_insns(tb);
    if (cut == 0u) {
        uint64_t packed = ((uint64_t)n << 1) | (qemu_plugin_tb_vaddr(tb) == mark_addr ? 1u : 0u);
        qemu_plugin_register_vcpu_tb_exec_cb(tb, on_tb, QEMU_PLUGIN_CB_NO_REGS, (void *)(uintptr_t)packed);
        return;
    }
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
