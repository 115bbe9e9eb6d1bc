/* The C unit tests on the Cortex-M4 (mps2-an386 under QEMU): newlib's semihosting stdio (rdimon)
 * opened before the test program's own main, renamed tn_test_main by the Makefile. The board's
 * startup (boards/mps2-an386/startup.c) calls this main and exits QEMU with its status. */
extern void initialise_monitor_handles(void);
int tn_test_main(void);
int main(void);

int main(void) {
    initialise_monitor_handles();
    return tn_test_main();
}
