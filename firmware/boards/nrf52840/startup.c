/* nRF52840 startup: vector table, reset handler, the 64 MHz crystal oscillator started, and the
 * legacy UART0 as the console (TX on P0.06, the nRF52840 DK's VCOM, 115200 8N1). The run ends
 * printing and sleeping. */
#include <stdint.h>

#include "board.h"

#define REG(addr) (*(volatile uint32_t *)(addr))
#define CLOCK_TASKS_HFCLKSTART REG(0x40000000u)
#define CLOCK_EVENTS_HFCLKSTARTED REG(0x40000100u)
#define UART0_TASKS_STARTTX REG(0x40002008u)
#define UART0_EVENTS_TXDRDY REG(0x4000211Cu)
#define UART0_ENABLE REG(0x40002500u)
#define UART0_PSELTXD REG(0x4000250Cu)
#define UART0_TXD REG(0x4000251Cu)
#define UART0_BAUDRATE REG(0x40002524u)
#define TX_PIN 6u
#define BAUD_115200 0x01D7E000u
#define WAIT 100000u

extern uint32_t _data_load, _data_start, _data_end, _bss_start, _bss_end, _stack_top;
extern char _nv_start[];
int main(void);
void reset_handler(void);

static void halt(void) {
    for (;;) {
        __asm__ volatile("wfi");
    }
}

static void fault_handler(void) {
    board_write("error: hard fault\n");
    halt();
}

__attribute__((section(".vectors"), used)) static const void *const vectors[16] = {
    &_stack_top, (const void *)reset_handler, (const void *)fault_handler, (const void *)fault_handler,
    (const void *)fault_handler, (const void *)fault_handler, (const void *)fault_handler, 0, 0, 0, 0,
    (const void *)fault_handler, (const void *)fault_handler, 0, (const void *)fault_handler,
    (const void *)fault_handler,
};

void board_write(const char *s) {
    for (; *s; s++) {
        UART0_EVENTS_TXDRDY = 0u;
        UART0_TXD = (uint8_t)*s;
        for (uint32_t i = 0; i < WAIT && UART0_EVENTS_TXDRDY == 0u; i++) {
        }
    }
}

char *board_nv_base(void) {
    return _nv_start;
}

void reset_handler(void) {
    uint32_t *src = &_data_load;
    for (uint32_t *dst = &_data_start; dst < &_data_end;) {
        *dst++ = *src++;
    }
    for (uint32_t *dst = &_bss_start; dst < &_bss_end;) {
        *dst++ = 0u;
    }
    CLOCK_EVENTS_HFCLKSTARTED = 0u;
    CLOCK_TASKS_HFCLKSTART = 1u;
    for (uint32_t i = 0; i < WAIT && CLOCK_EVENTS_HFCLKSTARTED == 0u; i++) {
    }
    UART0_PSELTXD = TX_PIN;
    UART0_BAUDRATE = BAUD_115200;
    UART0_ENABLE = 4u;
    UART0_TASKS_STARTTX = 1u;
    (void)main();
    halt();
}
