/*
 * A C program calling NVTX through the real header-only NVTX loader, for the record tests: the
 * ASCII and wide-string entry points, thread and category naming, a domain with a registered
 * string, and a start/end range ended on a second thread.
 */
#define _GNU_SOURCE
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

static nvtxRangeId_t g_range;

static void *ender(void *arg) {
    (void)arg;
    nvtxNameOsThreadA((uint32_t)syscall(SYS_gettid), "c-ender");
    nvtxRangeEnd(g_range);
    return NULL;
}

int main(void) {
    nvtxNameOsThreadA((uint32_t)syscall(SYS_gettid), "c-main");
    nvtxNameCategoryA(7, "cat-seven");
    nvtxRangePushA("c-push");
    nvtxRangePushW(L"wide-\u00fc");
    nvtxMarkA("c-mark");
    nvtxRangePop();
    nvtxRangePop();

    nvtxDomainHandle_t d = nvtxDomainCreateA("cdomain");
    nvtxStringHandle_t s = nvtxDomainRegisterStringA(d, "c-registered");
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.category = 7;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = 0xFF00FF00u;
    a.payloadType = NVTX_PAYLOAD_TYPE_DOUBLE;
    a.payload.dValue = 2.5;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = s;
    int level = nvtxDomainRangePushEx(d, &a);
    int popped = nvtxDomainRangePop(d);

    g_range = nvtxRangeStartA("c-start-end");
    pthread_t th;
    pthread_create(&th, NULL, ender, NULL);
    pthread_join(th, NULL);
    printf("%d %d %d\n", level, popped, nvtxRangePop()); /* 0 0 and -1: nothing left to pop */
    return 0;
}
