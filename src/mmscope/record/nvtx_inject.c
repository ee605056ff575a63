/*
 * NVTX injection library of `mmscope record`: captures NVTX calls into a per-process spool file.
 *
 * NVTX loads the library named by NVTX_INJECTION64_PATH and calls InitializeInjectionNvtx2, which
 * fills NVTX's function tables with the handlers below. MMSCOPE_RECORD_DIR names the spool folder;
 * without it the library declines to attach and NVTX stays a no-op.
 *
 * Design (writer.py reads the format back):
 * - Every process writes one spool file. Each thread writes fixed-size 48-byte records into its own
 *   ring, a region of that file mapped MAP_SHARED. A record is in the page cache the moment it is
 *   written, so nothing is lost when the process ends by exit(), os._exit() (multiprocessing fork
 *   children never run atexit), SIGTERM, SIGINT or even SIGKILL: there is nothing buffered outside
 *   the file, hence no exit or signal handler that would have to flush it.
 * - The ring's pages stay resident and are reused, so the recording thread never pays for fresh
 *   page-cache pages (a page fault per 85 records, the dominant cost on VMs). A background copier
 *   thread, started once some ring completes a segment, appends every completed segment to the
 *   file; a thread whose ring is full, or that exits, copies for itself. The reader joins the
 *   copies and whatever the ring still holds by record sequence number. Rings of exited threads
 *   are reused by new threads.
 * - A push writes its record with end = 0; the matching pop stores the end time into that record in
 *   place while the record's segment is still being filled, otherwise (the segment may already be
 *   copied) it writes a POPLATE record naming the push by sequence number. Unclosed ranges stay
 *   records with end = 0.
 * - Start/end ranges write one record at start and one at end (possibly on another thread); the
 *   writer joins them on the range id.
 * - Strings (messages, registered strings, domain and category names, thread names) are interned
 *   once per process and written once, as metadata entries in shared-mapped metadata chunks.
 * - Timestamps are CLOCK_MONOTONIC_RAW nanoseconds, the clock nsys uses on Linux. Where the kernel
 *   itself derives that clock from the TSC (clocksource "tsc"), records carry raw TSC ticks, read in
 *   a few ns instead of a clock_gettime call, plus (ticks, CLOCK_MONOTONIC_RAW ns) calibration pairs
 *   from which the writer converts them exactly.
 * - After fork the child drops the parent's rings and open ranges, opens its own spool file on its
 *   first event and re-writes the interned strings, domains and categories it inherited.
 *
 * The NVTX types are restated here (binary-compatible with nvToolsExt.h and nvtxDetail/nvtxTypes.h
 * of NVTX 3) so that the build needs no NVTX or CUDA headers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#define MM_EXPORT __attribute__((visibility("default")))
#define MM_LIKELY(x) __builtin_expect(!!(x), 1)
#define MM_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- NVTX ABI (NVTX 3: nvToolsExt.h, nvtxDetail/nvtxTypes.h) ---------------------------------- */

typedef uint64_t nvtxRangeId_t;
typedef void *nvtxDomainHandle_t;
typedef void *nvtxStringHandle_t;

typedef union {
    uint64_t ullValue;
    int64_t llValue;
    double dValue;
    uint32_t uiValue;
    int32_t iValue;
    float fValue;
} nvtx_payload_t;

typedef union {
    const char *ascii;
    const wchar_t *unicode;
    nvtxStringHandle_t registered;
} nvtx_message_t;

typedef struct {
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t colorType;
    uint32_t color;
    int32_t payloadType;
    int32_t reserved0;
    nvtx_payload_t payload;
    int32_t messageType;
    nvtx_message_t message;
} nvtxEventAttributes_t;

enum { NVTX_MESSAGE_TYPE_ASCII = 1, NVTX_MESSAGE_TYPE_UNICODE = 2, NVTX_MESSAGE_TYPE_REGISTERED = 3 };
#define NVTX_NO_PUSH_POP_TRACKING (-2)

typedef void (*NvtxFunctionPointer)(void);
typedef NvtxFunctionPointer **NvtxFunctionTable;
typedef const void *(*NvtxGetExportTableFunc_t)(uint32_t exportTableId);

typedef struct {
    size_t struct_size;
    int (*GetModuleFunctionTable)(int module, NvtxFunctionTable *out_table, unsigned int *out_size);
} NvtxExportTableCallbacks;

typedef struct {
    size_t struct_size;
    uint32_t version;
    uint32_t reserved0;
    void (*SetInjectionNvtxVersion)(uint32_t version);
} NvtxExportTableVersionInfo;

enum { NVTX_ETID_CALLBACKS = 1, NVTX_ETID_VERSIONINFO = 3 };
enum { NVTX_CB_MODULE_CORE = 1, NVTX_CB_MODULE_CORE2 = 5 };
enum {
    CORE_MarkEx = 1, CORE_MarkA, CORE_MarkW, CORE_RangeStartEx, CORE_RangeStartA, CORE_RangeStartW,
    CORE_RangeEnd, CORE_RangePushEx, CORE_RangePushA, CORE_RangePushW, CORE_RangePop,
    CORE_NameCategoryA, CORE_NameCategoryW, CORE_NameOsThreadA, CORE_NameOsThreadW
};
enum {
    CORE2_DomainMarkEx = 1, CORE2_DomainRangeStartEx, CORE2_DomainRangeEnd, CORE2_DomainRangePushEx,
    CORE2_DomainRangePop, CORE2_DomainResourceCreate, CORE2_DomainResourceDestroy,
    CORE2_DomainNameCategoryA, CORE2_DomainNameCategoryW, CORE2_DomainRegisterStringA,
    CORE2_DomainRegisterStringW, CORE2_DomainCreateA, CORE2_DomainCreateW, CORE2_DomainDestroy,
    CORE2_Initialize
};

/* ---- spool format (mirrored in writer.py) ------------------------------------------------------ */

#define MM_FILE_HEADER 4096u
#define MM_REGION_HEADER 64u /* u32 magic, u32 type, u32 tid, .., u64 size @24, u64 ring id @40 */
#define MM_REGION_MAGIC 0x4B434D4Du /* "MMCK" */
/* region types */
#define MM_RING 1u    /* a thread's ring: u32 nseg @12, u64 capacity @16, u64 head @32 */
#define MM_META 2u    /* metadata entries */
#define MM_COPY 3u    /* a copied ring range: u64 first seq @48, u64 count @56 */
#define MM_COPYING 4u /* a copy still being written; its records are still in the ring */
#define MM_META_CHUNK (64u * 1024u)
#define MM_SEG_RECS 2048u /* records per ring segment (96 KiB) */
#define MM_NSEG 8u        /* segments per ring */

enum { MM_PUSH = 1, MM_START = 2, MM_END = 3, MM_MARK = 4, MM_POPLATE = 5 };
enum { MM_META_STRING = 1, MM_META_DOMAIN = 2, MM_META_CATEGORY = 3, MM_META_THREAD = 4, MM_META_CALIB = 5 };

typedef struct {
    uint64_t start;    /* ticks */
    uint64_t aux;      /* PUSH: end ticks (0 while open); START/END: range id; POPLATE: push seq */
    uint64_t payload;  /* the 8 payload bytes as given */
    uint32_t text;     /* interned string id, 0 = none */
    uint32_t color;
    uint32_t category;
    uint32_t domain;   /* 0 = default domain */
    uint8_t kind;
    uint8_t msgtype;   /* NVTX message type */
    uint8_t ptype;     /* NVTX payload type */
    uint8_t colortype;
    uint32_t level;    /* push level within the domain */
} mm_rec;

_Static_assert(sizeof(mm_rec) == 48, "record layout is part of the spool format");

/* ---- global state ------------------------------------------------------------------------------ */

#define MM_TCACHE 256u

typedef struct {
    uint64_t hash;
    const char *str;
    size_t len;
    uint32_t id;
} mm_tcache_ent;

typedef struct {
    uint64_t seq;
    uint32_t domain, level;
} mm_open;

typedef struct mm_thread {
    /* hot: owned by the thread */
    mm_rec *slots;         /* ring slots; capacity is a power of two */
    uint64_t mask;
    uint64_t head;         /* sequence number of the next record */
    uint64_t seg_start;    /* first seq of the segment being filled */
    uint64_t seg_end;
    volatile uint64_t *head_out; /* the ring header's head, read back after a crash */
    mm_open *stack;
    uint32_t depth, cap;
    uint32_t tid;
    /* shared with the copier: completed is written by the thread, copied under copy_mu */
    uint64_t completed;    /* records below this seq are immutable and may be copied */
    uint64_t copied;
    uint64_t ring_id;
    char *region;
    size_t region_size;
    int dead;              /* the thread has exited; the copier frees the state */
    pthread_mutex_t copy_mu;
    char comm[16];
    struct mm_thread *next, *prev;
    mm_tcache_ent cache[MM_TCACHE];
} mm_thread;

typedef struct {
    uint64_t hash;
    size_t len;
    uint32_t id;
} mm_sent;

typedef struct {
    uint32_t name_sid, tid;
    uint64_t ticks;
} mm_domain;

typedef struct {
    uint32_t domain, category, name_sid, tid;
    uint64_t ticks;
} mm_category;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_copy_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_copy_cond = PTHREAD_COND_INITIALIZER;
static int g_copy_pending, g_copier_running;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_key;
static int g_enabled;
static int g_failed;
static int g_use_tsc;
static char g_dir[4096];
static uint64_t g_seg_recs = MM_SEG_RECS;

static int g_fd = -1;
static off_t g_file_end;
static uint64_t g_region_seq;
static char *g_meta;          /* current metadata chunk */
static size_t g_meta_used, g_meta_size;

static mm_thread *g_threads;
/* Rings of exited threads, fully copied, handed to new threads: a program that starts many
 * short-lived threads reuses a few rings instead of growing the file by a ring per thread. */
static char **g_free_rings;
static uint32_t g_nfree, g_free_cap;
static uint64_t g_next_rid;

static mm_sent *g_stab;       /* open-addressing table over the interned strings */
static size_t g_stab_cap;
static char **g_strs;         /* id -> NUL-terminated copy; ids start at 1 */
static size_t *g_strlens;
static uint32_t g_nstrs, g_strs_cap;

static mm_domain *g_domains;  /* index = domain id - 1 */
static uint32_t g_ndomains, g_domains_cap;
static mm_category *g_cats;
static uint32_t g_ncats, g_cats_cap;

static __thread mm_thread *tls_thr;

/* ---- clock ------------------------------------------------------------------------------------- */

static inline uint64_t mm_raw_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t mm_ticks(void) {
#if defined(__x86_64__) || defined(__i386__)
    if (MM_LIKELY(g_use_tsc)) return __rdtsc();
#endif
    return mm_raw_ns();
}

/* The TSC stands in for CLOCK_MONOTONIC_RAW only where the kernel itself derives that clock from
 * it; elsewhere (other clocksources, other CPUs) every timestamp is a clock_gettime call. */
static int mm_pick_tsc(void) {
#if defined(__x86_64__) || defined(__i386__)
    const char *force = getenv("MMSCOPE_RECORD_CLOCK");
    if (force && strcmp(force, "raw") == 0) return 0;
    if (force && strcmp(force, "tsc") == 0) return 1;
    char buf[64] = {0};
    int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    return n >= 3 && strncmp(buf, "tsc", 3) == 0 && (buf[3] == '\n' || buf[3] == 0);
#else
    return 0;
#endif
}

/* One (ticks, ns) pair; the tightest of a few reads keeps a preemption from skewing it. */
static void mm_calib_pair(uint64_t *ticks, uint64_t *ns) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t t1 = mm_ticks();
        uint64_t n = mm_raw_ns();
        uint64_t t2 = mm_ticks();
        if (t2 - t1 < best) {
            best = t2 - t1;
            *ticks = t1 + (t2 - t1) / 2;
            *ns = n;
        }
    }
}

/* For the recorder's session calibration (ctypes). Returns 1 when ticks are TSC, 0 when ns. */
MM_EXPORT int mmscope_clock_pair(uint64_t *ticks, uint64_t *ns) {
    g_use_tsc = mm_pick_tsc();
    mm_calib_pair(ticks, ns);
    return g_use_tsc;
}

static uint32_t mm_gettid(void) { return (uint32_t)syscall(SYS_gettid); }

/* ---- spool file -------------------------------------------------------------------------------- */

static void mm_fail_locked(const char *what, int err) {
    if (!g_failed)
        fprintf(stderr, "mmscope record: NVTX recording stopped in pid %d: %s: %s\n",
                (int)getpid(), what, strerror(err));
    g_failed = 1;
}

static void mm_put32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static void mm_put64(char *p, uint64_t v) { memcpy(p, &v, 8); }

static void mm_read_file(const char *path, char *out, size_t cap, size_t *len) {
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n;
    while (*len < cap && (n = read(fd, out + *len, cap - *len)) > 0) *len += (size_t)n;
    close(fd);
}

static int mm_write_header(int fd) {
    char h[MM_FILE_HEADER];
    memset(h, 0, sizeof h);
    memcpy(h, "MMSPOOL1", 8);
    mm_put32(h + 8, 1);
    mm_put32(h + 12, MM_FILE_HEADER);
    mm_put32(h + 16, (uint32_t)getpid());
    mm_put32(h + 20, (uint32_t)getppid());
    mm_put32(h + 24, (uint32_t)g_use_tsc);
    mm_put32(h + 28, (uint32_t)sizeof(mm_rec));
    uint64_t tk, ns;
    mm_calib_pair(&tk, &ns);
    mm_put64(h + 32, tk);
    mm_put64(h + 40, ns);
    mm_put32(h + 48, MM_REGION_HEADER);
    size_t n;
    mm_read_file("/proc/self/comm", h + 64, 63, &n);
    if (n && h[64 + n - 1] == '\n') h[64 + n - 1] = 0;
    mm_read_file("/proc/self/cmdline", h + 128, MM_FILE_HEADER - 128 - 1, &n);
    mm_put32(h + 124, (uint32_t)n);
    return pwrite(fd, h, sizeof h, 0) == (ssize_t)sizeof h ? 0 : -1;
}

/* Reserves `size` bytes at the end of the file (zero-filled, blocks allocated so a later write
 * cannot fail with SIGBUS on a full disk). */
static off_t mm_reserve_locked(size_t size) {
    off_t off = g_file_end;
    int rc = posix_fallocate(g_fd, off, (off_t)size);
    if (rc != 0) {
        mm_fail_locked("cannot grow the spool file", rc);
        return -1;
    }
    g_file_end += (off_t)size;
    return off;
}

static char *mm_map_region_locked(size_t size, uint32_t type, uint32_t tid, uint64_t *id) {
    off_t off = mm_reserve_locked(size);
    if (off < 0) return NULL;
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, g_fd, off);
    if (p == MAP_FAILED) {
        mm_fail_locked("cannot map the spool file", errno);
        return NULL;
    }
#ifdef MADV_POPULATE_WRITE
    madvise(p, size, MADV_POPULATE_WRITE); /* one call instead of a fault per page */
#endif
    mm_put32(p + 4, type);
    mm_put32(p + 8, tid);
    mm_put64(p + 24, size);
    *id = ++g_region_seq;
    mm_put64(p + 40, *id);
    __atomic_store_n((uint32_t *)p, MM_REGION_MAGIC, __ATOMIC_RELEASE);
    return p;
}

static void mm_emit_all_locked(void);

static int mm_spool_ready_locked(void) {
    if (g_fd >= 0) return 1;
    if (g_failed) return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/%d-%llx.mmspool", g_dir, (int)getpid(),
             (unsigned long long)mm_raw_ns());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        mm_fail_locked(path, errno);
        return 0;
    }
    if (mm_write_header(fd) != 0) {
        mm_fail_locked("cannot write the spool header", errno);
        close(fd);
        return 0;
    }
    g_fd = fd;
    g_file_end = MM_FILE_HEADER;
    g_meta = NULL;
    g_meta_used = g_meta_size = 0;
    mm_emit_all_locked();
    return 1;
}

/* Appends one metadata entry: u16 type, u16 0, u32 length, payload, padded to 8 bytes. The type
 * is stored last, so a reader never sees a half-written entry as valid. */
static void mm_meta_locked(uint16_t type, const void *a, size_t alen, const void *b, size_t blen) {
    if (!mm_spool_ready_locked()) return;
    size_t need = (8 + alen + blen + 7) & ~(size_t)7;
    if (!g_meta || g_meta_used + need + 8 > g_meta_size) {
        size_t size = MM_META_CHUNK;
        while (size < MM_REGION_HEADER + need + 8) size *= 2;
        uint64_t id;
        char *p = mm_map_region_locked(size, MM_META, 0, &id);
        if (!p) return;
        if (g_meta) munmap(g_meta, g_meta_size);
        g_meta = p;
        g_meta_size = size;
        g_meta_used = MM_REGION_HEADER;
    }
    char *e = g_meta + g_meta_used;
    mm_put32(e + 4, (uint32_t)(alen + blen));
    memcpy(e + 8, a, alen);
    if (blen) memcpy(e + 8 + alen, b, blen);
    __atomic_store_n((uint16_t *)e, type, __ATOMIC_RELEASE);
    g_meta_used += need;
}

static void mm_meta_string_locked(uint32_t id) {
    mm_meta_locked(MM_META_STRING, &id, 4, g_strs[id], g_strlens[id]);
}

static void mm_meta_domain_locked(uint32_t id) {
    const mm_domain *d = &g_domains[id - 1];
    uint32_t v[6] = {id, d->name_sid, d->tid, 0, (uint32_t)d->ticks, (uint32_t)(d->ticks >> 32)};
    mm_meta_locked(MM_META_DOMAIN, v, sizeof v, NULL, 0);
}

static void mm_meta_category_locked(const mm_category *c) {
    uint32_t v[6] = {c->domain, c->category, c->name_sid, c->tid,
                     (uint32_t)c->ticks, (uint32_t)(c->ticks >> 32)};
    mm_meta_locked(MM_META_CATEGORY, v, sizeof v, NULL, 0);
}

static void mm_meta_calib_locked(void) {
    uint64_t v[2];
    mm_calib_pair(&v[0], &v[1]);
    mm_meta_locked(MM_META_CALIB, v, sizeof v, NULL, 0);
}

/* Everything a fresh spool file needs to resolve ids this process already handed out. */
static void mm_emit_all_locked(void) {
    for (uint32_t id = 1; id <= g_nstrs; id++) mm_meta_string_locked(id);
    for (uint32_t id = 1; id <= g_ndomains; id++) mm_meta_domain_locked(id);
    for (uint32_t i = 0; i < g_ncats; i++) mm_meta_category_locked(&g_cats[i]);
}

/* ---- strings ----------------------------------------------------------------------------------- */

static inline uint64_t mm_hash(const char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, s, n);
        h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    }
    h ^= h >> 29;
    return h ? h : 1;
}

static int mm_stab_grow_locked(void) {
    size_t cap = g_stab_cap ? g_stab_cap * 2 : 1024;
    mm_sent *t = calloc(cap, sizeof *t);
    if (!t) return 0;
    for (size_t i = 0; i < g_stab_cap; i++) {
        if (!g_stab[i].id) continue;
        size_t j = g_stab[i].hash & (cap - 1);
        while (t[j].id) j = (j + 1) & (cap - 1);
        t[j] = g_stab[i];
    }
    free(g_stab);
    g_stab = t;
    g_stab_cap = cap;
    return 1;
}

static uint32_t mm_intern_locked(const char *s, size_t n, uint64_t h) {
    if ((g_nstrs + 1) * 2 > g_stab_cap && !mm_stab_grow_locked()) return 0;
    size_t j = h & (g_stab_cap - 1);
    for (; g_stab[j].id; j = (j + 1) & (g_stab_cap - 1)) {
        const mm_sent *e = &g_stab[j];
        if (e->hash == h && e->len == n && memcmp(g_strs[e->id], s, n) == 0) return e->id;
    }
    if (g_nstrs + 2 > g_strs_cap) {
        uint32_t cap = g_strs_cap ? g_strs_cap * 2 : 1024;
        char **ns = realloc(g_strs, cap * sizeof *ns);
        if (!ns) return 0;
        g_strs = ns;
        size_t *nl = realloc(g_strlens, cap * sizeof *nl);
        if (!nl) return 0;
        g_strlens = nl;
        g_strs_cap = cap;
    }
    char *copy = malloc(n + 1);
    if (!copy) return 0;
    memcpy(copy, s, n);
    copy[n] = 0;
    uint32_t id = ++g_nstrs;
    g_strs[id] = copy;
    g_strlens[id] = n;
    g_stab[j] = (mm_sent){h, n, id};
    mm_meta_string_locked(id);
    return id;
}

static uint32_t mm_intern(const char *s, size_t n, uint64_t h, const char **copy) {
    pthread_mutex_lock(&g_lock);
    uint32_t id = mm_spool_ready_locked() ? mm_intern_locked(s, n, h) : 0;
    if (id && copy) *copy = g_strs[id];
    pthread_mutex_unlock(&g_lock);
    return id;
}

/* Per-thread cache in front of the locked table: a repeated message costs a hash and a memcmp. */
static uint32_t mm_text_id(mm_thread *t, const char *s, size_t n) {
    uint64_t h = mm_hash(s, n);
    mm_tcache_ent *c = &t->cache[h & (MM_TCACHE - 1)];
    if (c->hash == h && c->len == n && memcmp(c->str, s, n) == 0) return c->id;
    const char *copy = NULL;
    uint32_t id = mm_intern(s, n, h, &copy);
    if (id) *c = (mm_tcache_ent){h, copy, n, id};
    return id;
}

/* wchar_t is UTF-32 on the platforms NVTX injection runs on; the file stores UTF-8. */
static char *mm_utf8(const wchar_t *w, size_t *out_len) {
    size_t n = wcslen(w);
    char *o = malloc(n * 4 + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = (uint32_t)w[i];
        if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) c = 0xFFFD;
        if (c < 0x80) {
            o[k++] = (char)c;
        } else if (c < 0x800) {
            o[k++] = (char)(0xC0 | (c >> 6));
            o[k++] = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            o[k++] = (char)(0xE0 | (c >> 12));
            o[k++] = (char)(0x80 | ((c >> 6) & 0x3F));
            o[k++] = (char)(0x80 | (c & 0x3F));
        } else {
            o[k++] = (char)(0xF0 | (c >> 18));
            o[k++] = (char)(0x80 | ((c >> 12) & 0x3F));
            o[k++] = (char)(0x80 | ((c >> 6) & 0x3F));
            o[k++] = (char)(0x80 | (c & 0x3F));
        }
    }
    o[k] = 0;
    *out_len = k;
    return o;
}

static uint32_t mm_ascii_id(mm_thread *t, const char *s) {
    return s ? mm_text_id(t, s, strlen(s)) : 0;
}

static uint32_t mm_wide_id(mm_thread *t, const wchar_t *w) {
    if (!w) return 0;
    size_t n;
    char *s = mm_utf8(w, &n);
    if (!s) return 0;
    uint32_t id = mm_text_id(t, s, n);
    free(s);
    return id;
}

static uint32_t mm_intern_plain(const char *s) {
    return s ? mm_intern(s, strlen(s), mm_hash(s, strlen(s)), NULL) : 0;
}

static uint32_t mm_intern_wide(const wchar_t *w) {
    if (!w) return 0;
    size_t n;
    char *s = mm_utf8(w, &n);
    if (!s) return 0;
    uint32_t id = mm_intern(s, n, mm_hash(s, n), NULL);
    free(s);
    return id;
}

/* ---- rings and the copier ---------------------------------------------------------------------- */

static void mm_thread_name_locked(mm_thread *t) {
    char comm[16] = {0};
    prctl(PR_GET_NAME, comm, 0, 0, 0);
    if (memcmp(comm, t->comm, sizeof comm) == 0) return;
    memcpy(t->comm, comm, sizeof comm);
    size_t n = strnlen(comm, sizeof comm);
    uint32_t sid = mm_intern_locked(comm, n, mm_hash(comm, n));
    uint64_t ticks = mm_ticks();
    uint32_t v[6] = {t->tid, sid, 0, t->tid, (uint32_t)ticks, (uint32_t)(ticks >> 32)};
    mm_meta_locked(MM_META_THREAD, v, sizeof v, NULL, 0);
}

static int mm_pwrite_all(const void *buf, size_t n, off_t off) {
    const char *p = buf;
    while (n) {
        ssize_t w = pwrite(g_fd, p, n, off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

/* Appends ring records [copied, completed) to the file. Caller holds t->copy_mu. The region's
 * header goes out first, as MM_COPYING, so a reader can always step over the region (regions are
 * page-aligned) and skips it until the records are written; after a crash mid-copy those records
 * are still in the ring, whose slots are released only once the copy is complete. */
static void mm_copy_locked(mm_thread *t) {
    uint64_t upto = __atomic_load_n(&t->completed, __ATOMIC_ACQUIRE);
    uint64_t from = t->copied;
    if (upto <= from) return;
    size_t n = (size_t)(upto - from), bytes = n * sizeof(mm_rec);
    size_t size = (MM_REGION_HEADER + bytes + 4095) & ~(size_t)4095;
    char h[MM_REGION_HEADER] = {0};
    mm_put32(h, MM_REGION_MAGIC);
    mm_put32(h + 4, MM_COPYING);
    mm_put32(h + 8, t->tid);
    mm_put64(h + 24, size);
    mm_put64(h + 40, t->ring_id);
    mm_put64(h + 48, from);
    mm_put64(h + 56, n);
    pthread_mutex_lock(&g_lock);
    off_t off = g_fd >= 0 && !g_failed ? mm_reserve_locked(size) : -1;
    int ok = off >= 0 && mm_pwrite_all(h, sizeof h, off) == 0;
    pthread_mutex_unlock(&g_lock);
    uint64_t first = from & t->mask, cap = t->mask + 1;
    size_t n1 = (size_t)(first + n <= cap ? n : cap - first);
    ok = ok && mm_pwrite_all(t->slots + first, n1 * sizeof(mm_rec), off + MM_REGION_HEADER) == 0;
    if (n1 < n)
        ok = ok && mm_pwrite_all(t->slots, (n - n1) * sizeof(mm_rec),
                                 off + MM_REGION_HEADER + (off_t)(n1 * sizeof(mm_rec))) == 0;
    uint32_t done = MM_COPY;
    ok = ok && mm_pwrite_all(&done, 4, off + 4) == 0;
    if (!ok) {
        pthread_mutex_lock(&g_lock);
        mm_fail_locked("cannot write the spool file", errno ? errno : EIO);
        pthread_mutex_unlock(&g_lock);
    }
    /* released even on failure: a broken spool must not block the application */
    __atomic_store_n(&t->copied, upto, __ATOMIC_RELEASE);
}

static size_t mm_ring_size(void) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t size = MM_REGION_HEADER + g_seg_recs * MM_NSEG * sizeof(mm_rec);
    return (size + page - 1) / page * page;
}

static void mm_thread_free(mm_thread *t) {
    if (t->region) munmap(t->region, t->region_size);
    pthread_mutex_destroy(&t->copy_mu);
    free(t->stack);
    free(t);
}

static void mm_unlink_locked(mm_thread *t) {
    if (t->prev) t->prev->next = t->next;
    else g_threads = t->next;
    if (t->next) t->next->prev = t->prev;
}

/* Frees an exited thread's state, keeping its ring (now fully copied) for the next new thread. */
static void mm_recycle_locked(mm_thread *t) {
    if (t->region && t->copied == t->head && g_nfree < 64) {
        if (g_nfree == g_free_cap) {
            uint32_t cap = g_free_cap ? g_free_cap * 2 : 8;
            char **nf = realloc(g_free_rings, cap * sizeof *nf);
            if (nf) {
                g_free_rings = nf;
                g_free_cap = cap;
            }
        }
        if (g_nfree < g_free_cap) {
            g_free_rings[g_nfree++] = t->region;
            t->region = NULL;
        }
    }
    mm_thread_free(t);
}

/* One pass of the copier: copies every ring's completed records, frees the states of exited
 * threads. Only the copier frees states, so a state found under g_lock stays valid after it. */
static void mm_copy_pass(void) {
    pthread_mutex_lock(&g_lock);
    mm_thread *t = g_threads;
    pthread_mutex_unlock(&g_lock);
    while (t) {
        pthread_mutex_lock(&t->copy_mu);
        mm_copy_locked(t);
        pthread_mutex_unlock(&t->copy_mu);
        pthread_mutex_lock(&g_lock);
        mm_thread *next = t->next;
        if (t->dead) {
            mm_unlink_locked(t);
            mm_recycle_locked(t);
        }
        pthread_mutex_unlock(&g_lock);
        t = next;
    }
}

static void *mm_copier(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "mmscope-copier", 0, 0, 0);
    for (;;) {
        pthread_mutex_lock(&g_copy_lock);
        while (!g_copy_pending) pthread_cond_wait(&g_copy_cond, &g_copy_lock);
        g_copy_pending = 0;
        pthread_mutex_unlock(&g_copy_lock);
        mm_copy_pass();
    }
    return NULL;
}

static void mm_wake_copier(void) {
    pthread_mutex_lock(&g_copy_lock);
    g_copy_pending = 1;
    pthread_cond_signal(&g_copy_cond);
    pthread_mutex_unlock(&g_copy_lock);
}

/* Started when a ring first completes a segment, so processes that record little never get a
 * thread of ours; signals stay with the application's threads. */
static void mm_start_copier_locked(void) {
    if (g_copier_running) return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    g_copier_running = pthread_create(&th, &attr, mm_copier, NULL) == 0;
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Moves the thread to its next segment; the slots it will overwrite must have been copied. */
static void mm_next_segment(mm_thread *t) {
    __atomic_store_n(&t->completed, t->head, __ATOMIC_RELEASE);
    uint64_t cap = t->mask + 1;
    if (MM_UNLIKELY(!g_copier_running)) {
        pthread_mutex_lock(&g_lock);
        mm_start_copier_locked();
        pthread_mutex_unlock(&g_lock);
    }
    if (g_copier_running) mm_wake_copier();
    if (__atomic_load_n(&t->copied, __ATOMIC_ACQUIRE) + cap < t->head + g_seg_recs) {
        pthread_mutex_lock(&t->copy_mu); /* the copier is behind: copy for ourselves */
        mm_copy_locked(t);
        pthread_mutex_unlock(&t->copy_mu);
    }
    t->seg_start = t->head;
    t->seg_end = t->head + g_seg_recs;
}

/* With a copier running, it owns the exited thread's state (it may be copying it right now);
 * without one, nothing else can reach the state once unlinked, so the thread copies for itself. */
static void mm_thread_exit(void *p) {
    mm_thread *t = p;
    tls_thr = NULL;
    __atomic_store_n(&t->completed, t->head, __ATOMIC_RELEASE);
    pthread_mutex_lock(&g_lock);
    int copier = g_copier_running;
    if (copier) t->dead = 1;
    else mm_unlink_locked(t);
    pthread_mutex_unlock(&g_lock);
    if (copier) {
        mm_wake_copier();
        return;
    }
    pthread_mutex_lock(&t->copy_mu);
    mm_copy_locked(t);
    pthread_mutex_unlock(&t->copy_mu);
    pthread_mutex_lock(&g_lock);
    mm_recycle_locked(t);
    pthread_mutex_unlock(&g_lock);
}

static mm_thread *mm_thread_new(void) {
    if (!g_enabled || g_failed) return NULL;
    mm_thread *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->tid = mm_gettid();
    t->cap = 64;
    t->stack = malloc(t->cap * sizeof *t->stack);
    pthread_mutex_init(&t->copy_mu, NULL);
    uint64_t cap = g_seg_recs * MM_NSEG;
    size_t size = mm_ring_size();
    pthread_mutex_lock(&g_lock);
    char *p = NULL;
    if (t->stack && g_nfree) {
        /* the reader finds the old ring's records in its copies, by the old ring id */
        p = g_free_rings[--g_nfree];
        __atomic_store_n((uint64_t *)(p + 32), 0, __ATOMIC_RELEASE);
        mm_put32(p + 8, t->tid);
        t->ring_id = ++g_region_seq;
        __atomic_store_n((uint64_t *)(p + 40), t->ring_id, __ATOMIC_RELEASE);
    } else if (t->stack && mm_spool_ready_locked()) {
        p = mm_map_region_locked(size, MM_RING, t->tid, &t->ring_id);
    }
    if (p) {
        mm_put32(p + 12, MM_NSEG);
        mm_put64(p + 16, cap);
        t->region = p;
        t->region_size = size;
        t->slots = (mm_rec *)(p + MM_REGION_HEADER);
        t->mask = cap - 1;
        t->head_out = (volatile uint64_t *)(p + 32);
        t->seg_end = g_seg_recs;
        mm_thread_name_locked(t);
        mm_meta_calib_locked();
        t->next = g_threads;
        if (g_threads) g_threads->prev = t;
        g_threads = t;
    }
    pthread_mutex_unlock(&g_lock);
    if (!p) {
        free(t->stack);
        pthread_mutex_destroy(&t->copy_mu);
        free(t);
        return NULL;
    }
    pthread_setspecific(g_key, t);
    tls_thr = t;
    return t;
}

/* Returns the calling thread's state with a free slot, or NULL when recording is off. */
static inline mm_thread *mm_room(void) {
    mm_thread *t = tls_thr;
    if (MM_UNLIKELY(!t)) {
        t = mm_thread_new();
        if (!t) return NULL;
    }
    if (MM_UNLIKELY(t->head == t->seg_end)) mm_next_segment(t);
    return t;
}

/* Publishes the record just written: the ring header's head is what a reader trusts. */
static inline void mm_commit(mm_thread *t) {
    t->head++;
    __atomic_store_n(t->head_out, t->head, __ATOMIC_RELEASE);
}

/* ---- records ----------------------------------------------------------------------------------- */

static inline void mm_fill(mm_thread *t, mm_rec *r, uint8_t kind, uint32_t domain,
                           const nvtxEventAttributes_t *a, const char *ascii, const wchar_t *wide) {
    mm_rec v = {0};
    v.kind = kind;
    v.domain = domain;
    if (a && a->size >= 16) {
        v.category = a->category;
        v.colortype = (uint8_t)a->colorType;
        v.color = a->color;
    }
    if (a && a->size >= sizeof *a) {
        v.ptype = (uint8_t)a->payloadType;
        v.payload = a->payload.ullValue;
        v.msgtype = (uint8_t)a->messageType;
        switch (a->messageType) {
        case NVTX_MESSAGE_TYPE_REGISTERED:
            v.text = (uint32_t)(uintptr_t)a->message.registered;
            break;
        case NVTX_MESSAGE_TYPE_ASCII:
            v.text = mm_ascii_id(t, a->message.ascii);
            break;
        case NVTX_MESSAGE_TYPE_UNICODE:
            v.text = mm_wide_id(t, a->message.unicode);
            break;
        default:
            v.msgtype = 0;
        }
    } else if (ascii) {
        v.msgtype = NVTX_MESSAGE_TYPE_ASCII;
        v.text = mm_ascii_id(t, ascii);
    } else if (wide) {
        v.msgtype = NVTX_MESSAGE_TYPE_UNICODE;
        v.text = mm_wide_id(t, wide);
    }
    *r = v; /* the slot holds a record from the ring's previous lap: overwrite all of it */
}

static inline uint32_t mm_dom(nvtxDomainHandle_t d) { return (uint32_t)(uintptr_t)d; }

static uint32_t mm_level(const mm_thread *t, uint32_t domain) {
    for (uint32_t i = t->depth; i-- > 0;)
        if (t->stack[i].domain == domain) return t->stack[i].level + 1;
    return 0;
}

static int mm_stack_room(mm_thread *t) {
    if (MM_LIKELY(t->depth < t->cap)) return 1;
    mm_open *ns = realloc(t->stack, (size_t)t->cap * 2 * sizeof *ns);
    if (!ns) return 0;
    t->stack = ns;
    t->cap *= 2;
    return 1;
}

static int mm_push(uint32_t domain, const nvtxEventAttributes_t *a, const char *ascii, const wchar_t *wide) {
    mm_thread *t = mm_room();
    if (MM_UNLIKELY(!t || !mm_stack_room(t))) return NVTX_NO_PUSH_POP_TRACKING;
    mm_rec *r = &t->slots[t->head & t->mask];
    mm_fill(t, r, MM_PUSH, domain, a, ascii, wide);
    uint32_t level = MM_LIKELY(t->depth && t->stack[t->depth - 1].domain == domain)
                         ? t->stack[t->depth - 1].level + 1
                         : mm_level(t, domain);
    r->level = level;
    t->stack[t->depth++] = (mm_open){t->head, domain, level};
    r->start = mm_ticks(); /* last, so the range does not include the tool's own work */
    mm_commit(t);
    return (int)level;
}

static int mm_pop(uint32_t domain) {
    uint64_t now = mm_ticks(); /* first, for the same reason */
    mm_thread *t = tls_thr;
    if (MM_UNLIKELY(!t || !t->depth)) return -1;
    uint32_t i = t->depth;
    while (MM_UNLIKELY(t->stack[i - 1].domain != domain))
        if (--i == 0) return -1; /* nothing of this domain is open */
    mm_open o = t->stack[--i];
    if (MM_UNLIKELY(i != t->depth - 1))
        memmove(&t->stack[i], &t->stack[i + 1], (t->depth - 1 - i) * sizeof *t->stack);
    t->depth--;
    if (MM_LIKELY(o.seq >= t->seg_start)) {
        t->slots[o.seq & t->mask].aux = now; /* segment not completed: still mutable */
        return (int)o.level;
    }
    if (MM_UNLIKELY(t->head == t->seg_end)) mm_next_segment(t);
    mm_rec *r = &t->slots[t->head & t->mask];
    *r = (mm_rec){.start = now, .aux = o.seq, .kind = MM_POPLATE, .domain = domain, .level = o.level};
    mm_commit(t);
    return (int)o.level;
}

static void mm_mark(uint32_t domain, const nvtxEventAttributes_t *a, const char *ascii, const wchar_t *wide) {
    uint64_t now = mm_ticks();
    mm_thread *t = mm_room();
    if (MM_UNLIKELY(!t)) return;
    mm_rec *r = &t->slots[t->head & t->mask];
    mm_fill(t, r, MM_MARK, domain, a, ascii, wide);
    r->start = now;
    mm_commit(t);
}

static nvtxRangeId_t mm_start(uint32_t domain, const nvtxEventAttributes_t *a, const char *ascii, const wchar_t *wide) {
    mm_thread *t = mm_room();
    if (MM_UNLIKELY(!t)) return 0;
    mm_rec *r = &t->slots[t->head & t->mask];
    mm_fill(t, r, MM_START, domain, a, ascii, wide);
    nvtxRangeId_t id = __atomic_add_fetch(&g_next_rid, 1, __ATOMIC_RELAXED);
    r->aux = id;
    r->start = mm_ticks();
    mm_commit(t);
    return id;
}

static void mm_end(uint32_t domain, nvtxRangeId_t id) {
    uint64_t now = mm_ticks();
    mm_thread *t = mm_room();
    if (MM_UNLIKELY(!t || !id)) return;
    mm_rec *r = &t->slots[t->head & t->mask];
    *r = (mm_rec){.start = now, .aux = id, .kind = MM_END, .domain = domain};
    mm_commit(t);
}

/* ---- NVTX handlers ----------------------------------------------------------------------------- */

static void h_MarkEx(const nvtxEventAttributes_t *a) { mm_mark(0, a, NULL, NULL); }
static void h_MarkA(const char *m) { if (m) mm_mark(0, NULL, m, NULL); }
static void h_MarkW(const wchar_t *m) { if (m) mm_mark(0, NULL, NULL, m); }
static nvtxRangeId_t h_RangeStartEx(const nvtxEventAttributes_t *a) { return mm_start(0, a, NULL, NULL); }
static nvtxRangeId_t h_RangeStartA(const char *m) { return mm_start(0, NULL, m ? m : "", NULL); }
static nvtxRangeId_t h_RangeStartW(const wchar_t *m) { return mm_start(0, NULL, m ? NULL : "", m); }
static void h_RangeEnd(nvtxRangeId_t id) { mm_end(0, id); }
static int h_RangePushEx(const nvtxEventAttributes_t *a) { return mm_push(0, a, NULL, NULL); }
static int h_RangePushA(const char *m) { return mm_push(0, NULL, m ? m : "", NULL); }
static int h_RangePushW(const wchar_t *m) { return mm_push(0, NULL, m ? NULL : "", m); }
static int h_RangePop(void) { return mm_pop(0); }

static void mm_name_category(uint32_t domain, uint32_t category, uint32_t sid) {
    if (!sid) return;
    pthread_mutex_lock(&g_lock);
    if (g_ncats == g_cats_cap) {
        uint32_t cap = g_cats_cap ? g_cats_cap * 2 : 16;
        mm_category *nc = realloc(g_cats, cap * sizeof *nc);
        if (!nc) goto out;
        g_cats = nc;
        g_cats_cap = cap;
    }
    mm_category *c = &g_cats[g_ncats++];
    *c = (mm_category){domain, category, sid, mm_gettid(), mm_ticks()};
    mm_meta_category_locked(c);
out:
    pthread_mutex_unlock(&g_lock);
}

static void h_NameCategoryA(uint32_t c, const char *n) { mm_name_category(0, c, mm_intern_plain(n)); }
static void h_NameCategoryW(uint32_t c, const wchar_t *n) { mm_name_category(0, c, mm_intern_wide(n)); }

static void mm_name_thread(uint32_t tid, uint32_t sid) {
    if (!sid) return;
    uint64_t ticks = mm_ticks();
    uint32_t v[6] = {tid, sid, 1, mm_gettid(), (uint32_t)ticks, (uint32_t)(ticks >> 32)};
    pthread_mutex_lock(&g_lock);
    mm_meta_locked(MM_META_THREAD, v, sizeof v, NULL, 0);
    pthread_mutex_unlock(&g_lock);
}

static void h_NameOsThreadA(uint32_t tid, const char *n) { mm_name_thread(tid, mm_intern_plain(n)); }
static void h_NameOsThreadW(uint32_t tid, const wchar_t *n) { mm_name_thread(tid, mm_intern_wide(n)); }

static void h_DomainMarkEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { mm_mark(mm_dom(d), a, NULL, NULL); }
static nvtxRangeId_t h_DomainRangeStartEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { return mm_start(mm_dom(d), a, NULL, NULL); }
static void h_DomainRangeEnd(nvtxDomainHandle_t d, nvtxRangeId_t id) { mm_end(mm_dom(d), id); }
static int h_DomainRangePushEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { return mm_push(mm_dom(d), a, NULL, NULL); }
static int h_DomainRangePop(nvtxDomainHandle_t d) { return mm_pop(mm_dom(d)); }
static void h_DomainNameCategoryA(nvtxDomainHandle_t d, uint32_t c, const char *n) { mm_name_category(mm_dom(d), c, mm_intern_plain(n)); }
static void h_DomainNameCategoryW(nvtxDomainHandle_t d, uint32_t c, const wchar_t *n) { mm_name_category(mm_dom(d), c, mm_intern_wide(n)); }

/* A registered string's handle is its interned id; NVTX hands it back in event attributes. */
static nvtxStringHandle_t h_DomainRegisterStringA(nvtxDomainHandle_t d, const char *s) {
    (void)d;
    return (nvtxStringHandle_t)(uintptr_t)mm_intern_plain(s);
}

static nvtxStringHandle_t h_DomainRegisterStringW(nvtxDomainHandle_t d, const wchar_t *s) {
    (void)d;
    return (nvtxStringHandle_t)(uintptr_t)mm_intern_wide(s);
}

/* A domain's handle is its id (1, 2, ...; 0 is the default domain). Creating a name twice returns
 * the same domain, so one create row per name and process. */
static nvtxDomainHandle_t mm_domain_create(uint32_t sid) {
    if (!sid) return NULL;
    uint32_t id = 0;
    pthread_mutex_lock(&g_lock);
    for (uint32_t i = 0; i < g_ndomains; i++)
        if (g_domains[i].name_sid == sid) id = i + 1;
    if (!id && g_ndomains == g_domains_cap) {
        uint32_t cap = g_domains_cap ? g_domains_cap * 2 : 16;
        mm_domain *nd = realloc(g_domains, cap * sizeof *nd);
        if (nd) {
            g_domains = nd;
            g_domains_cap = cap;
        }
    }
    if (!id && g_ndomains < g_domains_cap) {
        g_domains[g_ndomains] = (mm_domain){sid, mm_gettid(), mm_ticks()};
        id = ++g_ndomains;
        mm_meta_domain_locked(id);
    }
    pthread_mutex_unlock(&g_lock);
    return (nvtxDomainHandle_t)(uintptr_t)id;
}

static nvtxDomainHandle_t h_DomainCreateA(const char *n) { return mm_domain_create(mm_intern_plain(n)); }
static nvtxDomainHandle_t h_DomainCreateW(const wchar_t *n) { return mm_domain_create(mm_intern_wide(n)); }
static void h_DomainDestroy(nvtxDomainHandle_t d) { (void)d; /* ids stay valid: events may still name them */ }
static void h_Initialize(const void *reserved) { (void)reserved; }

/* ---- process lifecycle ------------------------------------------------------------------------- */

static void mm_atfork_prepare(void) {
    pthread_mutex_lock(&g_copy_lock);
    pthread_mutex_lock(&g_lock);
}

static void mm_atfork_parent(void) {
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_unlock(&g_copy_lock);
}

/* The child owns none of the parent's rings or open ranges and has no copier thread; it starts
 * its own file lazily, so a child that only execs leaves no file behind. */
static void mm_atfork_child(void) {
    pthread_mutex_init(&g_lock, NULL);
    pthread_mutex_init(&g_copy_lock, NULL);
    pthread_cond_init(&g_copy_cond, NULL);
    g_copy_pending = 0;
    g_copier_running = 0;
    mm_thread *t = g_threads;
    while (t) {
        mm_thread *next = t->next;
        pthread_mutex_init(&t->copy_mu, NULL); /* may have been held by the parent's copier */
        mm_thread_free(t);
        t = next;
    }
    g_threads = NULL;
    for (uint32_t i = 0; i < g_nfree; i++) munmap(g_free_rings[i], mm_ring_size());
    g_nfree = 0;
    tls_thr = NULL;
    pthread_setspecific(g_key, NULL);
    /* inherited domains and categories are re-declared in the child's own file, by its thread */
    uint32_t tid = mm_gettid();
    for (uint32_t i = 0; i < g_ndomains; i++) g_domains[i].tid = tid;
    for (uint32_t i = 0; i < g_ncats; i++) g_cats[i].tid = tid;
    if (g_meta) munmap(g_meta, g_meta_size);
    g_meta = NULL;
    g_meta_used = g_meta_size = 0;
    if (g_fd >= 0) close(g_fd);
    g_fd = -1;
    g_failed = 0;
}

__attribute__((destructor)) static void mm_fini(void) {
    if (!g_enabled) return;
    pthread_mutex_lock(&g_lock);
    if (g_fd >= 0) mm_meta_calib_locked(); /* a late pair sharpens the tick conversion */
    pthread_mutex_unlock(&g_lock);
}

static void mm_global_init(void) {
    const char *dir = getenv("MMSCOPE_RECORD_DIR");
    if (!dir || !*dir || strlen(dir) >= sizeof g_dir) {
        fprintf(stderr, "mmscope record: MMSCOPE_RECORD_DIR is not set; NVTX recording is off\n");
        return;
    }
    strcpy(g_dir, dir);
    /* tests shrink the ring to exercise its wrap-around and the copier */
    const char *seg = getenv("MMSCOPE_RECORD_SEGMENT_RECORDS");
    if (seg && atol(seg) >= 16) {
        g_seg_recs = 16;
        while (g_seg_recs * 2 <= (uint64_t)atol(seg)) g_seg_recs *= 2;
    }
    g_use_tsc = mm_pick_tsc();
    if (pthread_key_create(&g_key, mm_thread_exit) != 0) return;
    pthread_atfork(mm_atfork_prepare, mm_atfork_parent, mm_atfork_child);
    g_enabled = 1;
}

#define MM_SET(tbl, size, id, fn) \
    do { if ((id) < (size) && (tbl)[id]) *(tbl)[id] = (NvtxFunctionPointer)(fn); } while (0)

static int mm_attach(NvtxGetExportTableFunc_t get) {
    const NvtxExportTableCallbacks *cb = get(NVTX_ETID_CALLBACKS);
    if (!cb || !cb->GetModuleFunctionTable) return 0;
    NvtxFunctionTable core = NULL, core2 = NULL;
    unsigned int n1 = 0, n2 = 0;
    if (!cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &n1) || !core) return 0;
    if (!cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &core2, &n2) || !core2) return 0;
    MM_SET(core, n1, CORE_MarkEx, h_MarkEx);
    MM_SET(core, n1, CORE_MarkA, h_MarkA);
    MM_SET(core, n1, CORE_MarkW, h_MarkW);
    MM_SET(core, n1, CORE_RangeStartEx, h_RangeStartEx);
    MM_SET(core, n1, CORE_RangeStartA, h_RangeStartA);
    MM_SET(core, n1, CORE_RangeStartW, h_RangeStartW);
    MM_SET(core, n1, CORE_RangeEnd, h_RangeEnd);
    MM_SET(core, n1, CORE_RangePushEx, h_RangePushEx);
    MM_SET(core, n1, CORE_RangePushA, h_RangePushA);
    MM_SET(core, n1, CORE_RangePushW, h_RangePushW);
    MM_SET(core, n1, CORE_RangePop, h_RangePop);
    MM_SET(core, n1, CORE_NameCategoryA, h_NameCategoryA);
    MM_SET(core, n1, CORE_NameCategoryW, h_NameCategoryW);
    MM_SET(core, n1, CORE_NameOsThreadA, h_NameOsThreadA);
    MM_SET(core, n1, CORE_NameOsThreadW, h_NameOsThreadW);
    MM_SET(core2, n2, CORE2_DomainMarkEx, h_DomainMarkEx);
    MM_SET(core2, n2, CORE2_DomainRangeStartEx, h_DomainRangeStartEx);
    MM_SET(core2, n2, CORE2_DomainRangeEnd, h_DomainRangeEnd);
    MM_SET(core2, n2, CORE2_DomainRangePushEx, h_DomainRangePushEx);
    MM_SET(core2, n2, CORE2_DomainRangePop, h_DomainRangePop);
    MM_SET(core2, n2, CORE2_DomainNameCategoryA, h_DomainNameCategoryA);
    MM_SET(core2, n2, CORE2_DomainNameCategoryW, h_DomainNameCategoryW);
    MM_SET(core2, n2, CORE2_DomainRegisterStringA, h_DomainRegisterStringA);
    MM_SET(core2, n2, CORE2_DomainRegisterStringW, h_DomainRegisterStringW);
    MM_SET(core2, n2, CORE2_DomainCreateA, h_DomainCreateA);
    MM_SET(core2, n2, CORE2_DomainCreateW, h_DomainCreateW);
    MM_SET(core2, n2, CORE2_DomainDestroy, h_DomainDestroy);
    MM_SET(core2, n2, CORE2_Initialize, h_Initialize);
    const NvtxExportTableVersionInfo *vi = get(NVTX_ETID_VERSIONINFO);
    if (vi && vi->struct_size >= sizeof *vi && vi->SetInjectionNvtxVersion) vi->SetInjectionNvtxVersion(3);
    return 1;
}

/* Called by every NVTX instance in the process (each library that compiled NVTX in has its own). */
MM_EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
    pthread_once(&g_once, mm_global_init);
    if (!g_enabled || !get) return 0;
    return mm_attach(get);
}
