/* Vector table, reset handler and semihosting for mps2-an386 (Cortex-M4) under QEMU. */
#include <stdint.h>

#include "board.h"

extern uint32_t _data_load, _data_start, _data_end, _bss_start, _bss_end, _stack_top;
int main(void);
void reset_handler(void);
void semihost_exit(int ok);

static void fault_handler(void) {
    semihost_exit(0);
}

__attribute__((section(".vectors"), used)) static const void *const vectors[16] = {
    &_stack_top, (const void *)reset_handler, (const void *)fault_handler, (const void *)fault_handler,
    (const void *)fault_handler, (const void *)fault_handler, (const void *)fault_handler, 0, 0, 0, 0,
    (const void *)fault_handler, (const void *)fault_handler, 0, (const void *)fault_handler,
    (const void *)fault_handler,
};

static int semihost(int op, const void *arg) {
    register int r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

void board_write(const char *s) { /* the console: the semihosting host's stdout */
    semihost(0x04, s); /* SYS_WRITE0 */
}

void semihost_exit(int ok) {
    semihost(0x18, (const void *)(ok ? 0x20026u : 0x20023u)); /* SYS_EXIT: ApplicationExit or RunTimeError */
    for (;;) {
    }
}

void reset_handler(void) {
    uint32_t *src = &_data_load;
    for (uint32_t *dst = &_data_start; dst < &_data_end;) {
        *dst++ = *src++;
    }
    for (uint32_t *dst = &_bss_start; dst < &_bss_end;) {
        *dst++ = 0u;
    }
    semihost_exit(main() == 0);
}
