/* STM32F405 startup: vector table, reset handler, a 168 MHz clock from the internal 16 MHz
 * oscillator (so any board's crystal will do), USART1 as the console (PA9 TX / PA10 RX, AF7,
 * 115200 8N1), and the backup SRAM switched on with its regulator, so the non-volatile state
 * survives a power failure while VBAT holds.
 *
 * Under QEMU (-M netduinoplus2) RCC, PWR and the backup SRAM are not modelled: registers read
 * zero, and a write to the backup SRAM is a bus fault. The firmware knows it is emulated when
 * RCC_CR says the 16 MHz oscillator it runs on is not ready (on the chip HSIRDY is set from reset):
 * then the clock stays on that oscillator, the state lives at 0x20020000 (RAM QEMU maps past the
 * chip's 128 KB; the harness saves it at a power cut and restores it at power-on), and the end of
 * the run is reported to QEMU through semihosting. On the chip the backup SRAM's last word is
 * probed once, and the run ends printing and sleeping. */
#include <stdint.h>

#include "board.h"

#define REG(addr) (*(volatile uint32_t *)(addr))
#define RCC_CR REG(0x40023800u)
#define RCC_PLLCFGR REG(0x40023804u)
#define RCC_CFGR REG(0x40023808u)
#define RCC_AHB1ENR REG(0x40023830u)
#define RCC_APB1ENR REG(0x40023840u)
#define RCC_APB2ENR REG(0x40023844u)
#define PWR_CR REG(0x40007000u)
#define PWR_CSR REG(0x40007004u)
#define FLASH_ACR REG(0x40023C00u)
#define GPIOA_MODER REG(0x40020000u)
#define GPIOA_AFRH REG(0x40020024u)
#define USART1_SR REG(0x40011000u)
#define USART1_DR REG(0x40011004u)
#define USART1_BRR REG(0x40011008u)
#define USART1_CR1 REG(0x4001100Cu)

#define HSI_HZ 16000000u
#define SYSCLK_HZ 168000000u
#define BAUD 115200u
#define WAIT 100000u /* polls before a clock or regulator is taken to be absent */

extern uint32_t _data_load, _data_start, _data_end, _bss_start, _bss_end, _stack_top;
extern char _nv_start[], _nv_probe[], _nv_emulated[];
int main(void);
void reset_handler(void);

static char *nv_base;
static uint32_t emulated;

static void semihost_exit(int ok) {
    register int r0 __asm__("r0") = 0x18; /* SYS_EXIT: ApplicationExit or RunTimeError */
    register const void *r1 __asm__("r1") = (const void *)(ok ? 0x20026u : 0x20023u);
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
}

static void board_exit(int ok) {
    if (emulated) {
        semihost_exit(ok); /* QEMU: end the run (on the chip, without a debugger, bkpt would fault) */
    }
    for (;;) {
        __asm__ volatile("wfi");
    }
}

static void fault_handler(void) {
    board_write("error: hard fault\n");
    board_exit(0);
}

__attribute__((section(".vectors"), used)) static const void *const vectors[16] = {
    &_stack_top, (const void *)reset_handler, (const void *)fault_handler, (const void *)fault_handler,
    (const void *)fault_handler, (const void *)fault_handler, (const void *)fault_handler, 0, 0, 0, 0,
    (const void *)fault_handler, (const void *)fault_handler, 0, (const void *)fault_handler,
    (const void *)fault_handler,
};

static int wait_set(volatile uint32_t *reg, uint32_t mask, uint32_t want) {
    for (uint32_t i = 0; i < WAIT; i++) {
        if ((*reg & mask) == want) {
            return 1;
        }
    }
    return 0;
}

/* 168 MHz from the 16 MHz HSI: PLLM 16, PLLN 336, PLLP 2 (PLLQ 7: 48 MHz for USB); AHB 168,
 * APB1 42, APB2 84 MHz; five flash wait states at 3.3 V. Returns APB2's clock (USART1's). */
static uint32_t clock_init(void) {
    RCC_APB1ENR |= 1u << 28; /* PWREN */
    PWR_CR |= 1u << 14;      /* VOS: scale 1, for 168 MHz */
    RCC_PLLCFGR = 16u | 336u << 6 | 0u << 16 | 0u << 22 | 7u << 24;
    RCC_CR |= 1u << 24; /* PLLON */
    if (!wait_set(&RCC_CR, 1u << 25, 1u << 25)) {
        return HSI_HZ; /* no PLL (QEMU): stay on the HSI */
    }
    FLASH_ACR = 5u | 1u << 8 | 1u << 9 | 1u << 10; /* LATENCY 5, PRFTEN, ICEN, DCEN */
    RCC_CFGR = (RCC_CFGR & ~0xFCF3u) | 5u << 10 | 4u << 13 | 2u; /* PPRE1 /4, PPRE2 /2, SW = PLL */
    if (!wait_set(&RCC_CFGR, 0xCu, 0x8u)) {
        RCC_CFGR &= ~0x3u;
        return HSI_HZ;
    }
    return SYSCLK_HZ / 2u;
}

static void console_init(uint32_t pclk2) {
    RCC_AHB1ENR |= 1u << 0;  /* GPIOAEN */
    RCC_APB2ENR |= 1u << 4;  /* USART1EN */
    GPIOA_MODER = (GPIOA_MODER & ~(0xFu << 18)) | 0xAu << 18;  /* PA9, PA10: alternate function */
    GPIOA_AFRH = (GPIOA_AFRH & ~(0xFFu << 4)) | 0x77u << 4;    /* AF7: USART1 */
    USART1_BRR = (pclk2 + BAUD / 2u) / BAUD;
    USART1_CR1 = 1u << 13 | 1u << 3 | 1u << 2; /* UE, TE, RE */
}

void board_write(const char *s) {
    for (; *s; s++) {
        if (*s == '\n') {
            while (!(USART1_SR & (1u << 7))) {
            }
            USART1_DR = '\r';
        }
        while (!(USART1_SR & (1u << 7))) { /* TXE */
        }
        USART1_DR = (uint8_t)*s;
    }
    while (!(USART1_SR & (1u << 6))) { /* TC: the last byte has left before a power cut or a sleep */
    }
}

/* Backup SRAM on, with its regulator (BRE) so VBAT keeps it, then a probe of its last word. */
static void nv_init(void) {
    nv_base = _nv_emulated;
    if (emulated) {
        return;
    }
    PWR_CR |= 1u << 8;         /* DBP: backup domain writable */
    RCC_AHB1ENR |= 1u << 18;   /* BKPSRAMEN */
    PWR_CSR |= 1u << 9;        /* BRE */
    if (!wait_set(&PWR_CSR, 1u << 3, 1u << 3)) { /* BRR */
        board_write("error: the backup SRAM's regulator is not ready\n");
        board_exit(0);
    }
    volatile uint32_t *probe = (volatile uint32_t *)(void *)_nv_probe;
    *probe = 0x5A5AA5A5u;
    uint32_t a = *probe;
    *probe = ~0x5A5AA5A5u;
    if (a != 0x5A5AA5A5u || *probe != ~0x5A5AA5A5u) {
        board_write("error: the backup SRAM does not keep what is written\n");
        board_exit(0);
    }
    nv_base = _nv_start;
}

char *board_nv_base(void) {
    return nv_base;
}

void reset_handler(void) {
    uint32_t *src = &_data_load;
    for (uint32_t *dst = &_data_start; dst < &_data_end;) {
        *dst++ = *src++;
    }
    for (uint32_t *dst = &_bss_start; dst < &_bss_end;) {
        *dst++ = 0u;
    }
    emulated = !(RCC_CR & (1u << 1)); /* HSIRDY: the chip runs on the HSI from reset */
    console_init(emulated ? HSI_HZ : clock_init());
    nv_init();
    board_exit(main() == 0);
}
