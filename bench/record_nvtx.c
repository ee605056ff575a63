/*
 * C side of bench/record_overhead.py: times NVTX push/pop pairs through the real header-only NVTX
 * loader (nvtxRangePushA with a constant message, and nvtxDomainRangePushEx with a registered
 * string), with or without an injection library, and can produce a large recording.
 *
 * usage: record_nvtx PAIRS ROUNDS   prints "pushA_ns domainEx_ns", the best round of each
 */
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 1000000;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    nvtxDomainHandle_t d = nvtxDomainCreateA("bench");
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = nvtxDomainRegisterStringA(d, "registered range");
    double best_a = 1e30, best_ex = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t0 = now_ns();
        for (long i = 0; i < pairs; i++) {
            nvtxRangePushA("ascii range");
            nvtxRangePop();
        }
        double t1 = now_ns();
        for (long i = 0; i < pairs; i++) {
            nvtxDomainRangePushEx(d, &a);
            nvtxDomainRangePop(d);
        }
        double t2 = now_ns();
        if ((t1 - t0) / pairs < best_a) best_a = (t1 - t0) / pairs;
        if ((t2 - t1) / pairs < best_ex) best_ex = (t2 - t1) / pairs;
    }
    printf("%.2f %.2f\n", best_a, best_ex);
    return 0;
}
