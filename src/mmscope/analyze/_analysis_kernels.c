/* The analyzer's hot loops in C, loaded with ctypes (mmscope/analysis/kernels.py) on numpy arrays.
 *
 * Each kernel does exactly what the numpy code it stands in for does (nsys_pages.py, table.nest,
 * stats, checks._overlapping), in one linear pass where numpy needs many full-size temporaries;
 * anything a kernel cannot do exactly it reports, and the caller takes the numpy road instead.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

/* kernels.py refuses a library whose number differs from its own (an old build beside new Python
 * code would be called with the wrong arguments): bump it with any change of a signature. */
API int64_t mk_abi(void) { return 1; }

/* ---------------------------------------------------------------------------------------------
 * NVTX_EVENTS leaf pages -> columns (nsys_pages.py's rules; every failure means "read through
 * SQLite", never a guess).
 */

enum { F_START, F_END, F_ETYPE, F_TEXT, F_GTID, F_EGTID, F_TEXTID, F_DOMAIN, N_WANTED };
#define E_UNSUPPORTED (-1)
#define E_NOMEM (-2)

typedef struct {
    /* distinct texts in first-appearance order: code k (k >= 1) is toff/tlen[k - 1] */
    int64_t *toff;
    int32_t *tlen;
    int64_t nt, tcap;
    int32_t *slot; /* open addressing: code, 0 = empty */
    uint64_t nslot;
    int64_t *xpos, *xthr; /* rows whose range ends on another thread, and that thread */
    int64_t nx, xcap;
    int64_t n_domain; /* rows with a domain other than 0 */
} ctx_t;

API ctx_t *mk_ctx_new(void) { return calloc(1, sizeof(ctx_t)); }

API void mk_ctx_free(ctx_t *c)
{
    if (!c)
        return;
    free(c->toff);
    free(c->tlen);
    free(c->slot);
    free(c->xpos);
    free(c->xthr);
    free(c);
}

API void mk_ctx_sizes(const ctx_t *c, int64_t *out)
{
    out[0] = c->nt;
    out[1] = c->nx;
    out[2] = c->n_domain;
}

API void mk_ctx_copy(const ctx_t *c, int64_t *toff, int32_t *tlen, int64_t *xpos, int64_t *xthr)
{
    if (c->nt) {
        memcpy(toff, c->toff, c->nt * sizeof *toff);
        memcpy(tlen, c->tlen, c->nt * sizeof *tlen);
    }
    if (c->nx) {
        memcpy(xpos, c->xpos, c->nx * sizeof *xpos);
        memcpy(xthr, c->xthr, c->nx * sizeof *xthr);
    }
}

static int grow(void **p, int64_t *cap, int64_t need, size_t item)
{
    if (need <= *cap)
        return 0;
    int64_t n = *cap ? *cap * 2 : 1024;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, (size_t)n * item);
    if (!q)
        return E_NOMEM;
    *p = q;
    *cap = n;
    return 0;
}

static int add_cross(ctx_t *c, int64_t row, int64_t thr)
{
    int64_t cap = c->xcap;
    if (grow((void **)&c->xpos, &cap, c->nx + 1, sizeof(int64_t)))
        return E_NOMEM;
    cap = c->xcap;
    if (grow((void **)&c->xthr, &cap, c->nx + 1, sizeof(int64_t)))
        return E_NOMEM;
    c->xcap = cap;
    c->xpos[c->nx] = row;
    c->xthr[c->nx++] = thr;
    return 0;
}

static uint64_t hash_bytes(const uint8_t *p, int64_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (int64_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static int rehash(ctx_t *c, const uint8_t *file)
{
    uint64_t n = c->nslot ? c->nslot * 2 : 4096;
    int32_t *slot = calloc(n, sizeof *slot);
    if (!slot)
        return E_NOMEM;
    for (int64_t k = 0; k < c->nt; k++) {
        uint64_t h = hash_bytes(file + c->toff[k], c->tlen[k]) & (n - 1);
        while (slot[h])
            h = (h + 1) & (n - 1);
        slot[h] = (int32_t)(k + 1);
    }
    free(c->slot);
    c->slot = slot;
    c->nslot = n;
    return 0;
}

/* The dictionary code of the text at file[off, off + len): first appearance first, from 1. */
static int64_t text_code(ctx_t *c, const uint8_t *file, int64_t off, int64_t len)
{
    if ((uint64_t)(c->nt + 1) * 2 > c->nslot && rehash(c, file))
        return E_NOMEM;
    uint64_t h = hash_bytes(file + off, len) & (c->nslot - 1);
    while (c->slot[h]) {
        int64_t k = c->slot[h] - 1;
        if (c->tlen[k] == len && memcmp(file + c->toff[k], file + off, len) == 0)
            return k + 1;
        h = (h + 1) & (c->nslot - 1);
    }
    if (c->nt >= INT32_MAX - 1)
        return E_UNSUPPORTED;
    int64_t cap = c->tcap;
    if (grow((void **)&c->toff, &cap, c->nt + 1, sizeof(int64_t)))
        return E_NOMEM;
    cap = c->tcap;
    if (grow((void **)&c->tlen, &cap, c->nt + 1, sizeof(int32_t)))
        return E_NOMEM;
    c->tcap = cap;
    c->toff[c->nt] = off;
    c->tlen[c->nt] = (int32_t)len;
    c->slot[h] = (int32_t)(++c->nt);
    return c->nt;
}

/* A varint at p[*pos] that must end before `limit`; SQLite's 9-byte form. */
static inline int varint(const uint8_t *p, int64_t *pos, int64_t limit, uint64_t *out)
{
    uint64_t v = 0;
    int64_t i = *pos;
    for (int k = 0; k < 8; k++) {
        if (i >= limit)
            return E_UNSUPPORTED;
        uint8_t b = p[i++];
        v = (v << 7) | (b & 0x7f);
        if (!(b & 0x80)) {
            *pos = i;
            *out = v;
            return 0;
        }
    }
    if (i >= limit)
        return E_UNSUPPORTED;
    *out = (v << 8) | p[i++];
    *pos = i;
    return 0;
}

static const uint8_t FIXED_SIZE[12] = {0, 1, 2, 3, 4, 6, 8, 8, 0, 0, 0, 0};
static uint8_t SIZE_OF[128]; /* bytes of the value of each one-byte serial type */

__attribute__((constructor)) static void init_sizes(void)
{
    for (int t = 0; t < 128; t++)
        SIZE_OF[t] = t < 12 ? FIXED_SIZE[t] : (uint8_t)((t - 12) >> 1);
}

/* An integer field (serial types 0-6, 8, 9); a float, text or blob is E_UNSUPPORTED. */
static inline int int_field(const uint8_t *p, uint64_t t, int64_t *v, int *null)
{
    *null = 0;
    switch (t) {
    case 0:
        *null = 1;
        *v = 0;
        return 0;
    case 8:
    case 9:
        *v = (int64_t)t - 8;
        return 0;
    case 1:
    case 2:
    case 3:
    case 4:
    case 5:
    case 6: {
        int n = FIXED_SIZE[t];
        uint64_t u = 0;
        for (int k = 0; k < n; k++)
            u = (u << 8) | p[k];
        int shift = 64 - 8 * n;
        *v = shift ? (int64_t)(u << shift) >> shift : (int64_t)u;
        return 0;
    }
    default:
        return E_UNSUPPORTED;
    }
}

static int leaf_at(const uint8_t *file, int64_t file_size, int64_t pgno, int64_t page_size,
                   const uint8_t **page)
{
    if (pgno < 2 || pgno > file_size / page_size)
        return E_UNSUPPORTED;
    *page = file + (pgno - 1) * page_size;
    return (*page)[0] == 0x0D ? 0 : E_UNSUPPORTED;
}

/* Rows on these leaf pages (an upper bound for mk_decode's output), or E_UNSUPPORTED. */
API int64_t mk_count_cells(const uint8_t *file, int64_t file_size, const int64_t *leaves,
                           int64_t n_leaves, int64_t page_size)
{
    int64_t n = 0;
    for (int64_t i = 0; i < n_leaves; i++) {
        const uint8_t *pg;
        if (leaf_at(file, file_size, leaves[i], page_size, &pg))
            return E_UNSUPPORTED;
        n += (pg[3] << 8) | pg[4];
    }
    return n;
}

/* Decode every record of the leaf pages, in order, into the columns (nsys_scan's coalesce()s
 * applied). `fields` holds the record position of each N_WANTED column, -1 where the table has
 * none; `domain` and `tcode` must come zeroed. Returns the number of rows, or a negative error. */
API int64_t mk_decode(ctx_t *ctx, const uint8_t *file, int64_t file_size, const int64_t *leaves,
                      int64_t n_leaves, int64_t page_size, int64_t usable, const int64_t *fields,
                      int64_t cap, int64_t *start, int64_t *end, int64_t *thread,
                      int64_t *text_id, int16_t *etype, int64_t *domain, int32_t *tcode)
{
    int64_t nf = 0;
    for (int w = 0; w < N_WANTED; w++)
        if (fields[w] + 1 > nf)
            nf = fields[w] + 1;
    int8_t *want_of = malloc(nf ? nf : 1);
    if (!want_of)
        return E_NOMEM;
    memset(want_of, -1, nf ? nf : 1);
    for (int w = 0; w < N_WANTED; w++)
        if (fields[w] >= 0)
            want_of[fields[w]] = (int8_t)w;
    const int cross = fields[F_EGTID] >= 0 && fields[F_GTID] >= 0;
    int64_t row = 0, rc = 0;
    for (int64_t i = 0; i < n_leaves && rc == 0; i++) {
        const uint8_t *pg;
        if (leaf_at(file, file_size, leaves[i], page_size, &pg)) {
            rc = E_UNSUPPORTED;
            break;
        }
        int64_t ncell = (pg[3] << 8) | pg[4];
        if (8 + 2 * ncell > usable || row + ncell > cap) {
            rc = E_UNSUPPORTED;
            break;
        }
        for (int64_t c = 0; c < ncell; c++, row++) {
            int64_t pos = (pg[8 + 2 * c] << 8) | pg[9 + 2 * c];
            uint64_t payload, rowid, hsize;
            if (pos < 8 || varint(pg, &pos, usable, &payload) || payload > (uint64_t)usable - 35
                || varint(pg, &pos, usable, &rowid)) {
                rc = E_UNSUPPORTED; /* overflow pages, or a cell outside its page */
                break;
            }
            int64_t rec = pos, end_rec = rec + (int64_t)payload;
            int64_t hpos = rec;
            if (end_rec > usable || varint(pg, &hpos, end_rec, &hsize)
                || hsize > payload) {
                rc = E_UNSUPPORTED;
                break;
            }
            int64_t hend = rec + (int64_t)hsize, body = hend;
            uint64_t wt[N_WANTED] = {0};
            int64_t wo[N_WANTED] = {0};
            for (int64_t j = 0; j < nf; j++) {
                uint64_t t = 0;
                if (hpos < hend) {
                    if (pg[hpos] < 0x80) /* nearly every serial type is one byte */
                        t = pg[hpos++];
                    else if (varint(pg, &hpos, hend, &t)) {
                        rc = E_UNSUPPORTED;
                        break;
                    }
                }
                uint64_t size = t < 128 ? SIZE_OF[t] : (t - 12) >> 1;
                if (want_of[j] >= 0) {
                    wt[want_of[j]] = t;
                    wo[want_of[j]] = body;
                }
                if (size > (uint64_t)(end_rec - body)) {
                    rc = E_UNSUPPORTED; /* record fields past the payload */
                    break;
                }
                body += (int64_t)size;
            }
            if (rc)
                break;
            int64_t v[N_WANTED];
            int null[N_WANTED];
            for (int w = 0; w < N_WANTED; w++) {
                null[w] = 1;
                v[w] = 0;
                if (w == F_TEXT || fields[w] < 0)
                    continue;
                if (int_field(pg + wo[w], wt[w], &v[w], &null[w])) {
                    rc = E_UNSUPPORTED;
                    break;
                }
            }
            if (rc || null[F_START] || null[F_ETYPE]) {
                rc = E_UNSUPPORTED;
                break;
            }
            start[row] = v[F_START];
            end[row] = null[F_END] ? v[F_START] - 1 : v[F_END];
            thread[row] = null[F_GTID] ? 0 : v[F_GTID];
            text_id[row] = null[F_TEXTID] ? -1 : v[F_TEXTID];
            if (!null[F_DOMAIN] && v[F_DOMAIN]) { /* zeroed by the caller: untouched pages */
                domain[row] = v[F_DOMAIN];        /* stay unmapped where every domain is 0 */
                ctx->n_domain++;
            }
            etype[row] = (int16_t)v[F_ETYPE];
            int64_t code = 0;
            if (fields[F_TEXT] >= 0) {
                uint64_t t = wt[F_TEXT];
                if ((t >= 1 && t < 13) || (t >= 13 && t % 2 == 0)) {
                    rc = E_UNSUPPORTED; /* a number or blob in the text column */
                    break;
                }
                if (t > 13) {
                    code = text_code(ctx, file, (pg - file) + wo[F_TEXT], (int64_t)(t - 13) >> 1);
                    if (code < 0) {
                        rc = code;
                        break;
                    }
                }
            }
            if (code)
                tcode[row] = (int32_t)code;
            if (cross && !null[F_EGTID] && !null[F_GTID] && v[F_EGTID] != v[F_GTID]
                && add_cross(ctx, row, v[F_EGTID])) {
                rc = E_NOMEM;
                break;
            }
        }
    }
    free(want_of);
    return rc ? rc : row;
}

/* ---------------------------------------------------------------------------------------------
 * Text ids -> name codes (nsys._resolve_names' dense table): the registered string's position,
 * else n_ids + the row's text code.
 */
API void mk_resolve(int64_t n, const int64_t *text_id, const int32_t *text_code,
                    const int64_t *table, int64_t lo, int64_t span, int64_t n_ids, int64_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t at = (uint64_t)(text_id[i] - lo);
        int64_t pos = at < (uint64_t)span ? table[at] : -1;
        out[i] = pos >= 0 ? pos : n_ids + (text_code ? text_code[i] : 0);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Nesting (table.nest): rows by (group, start, end descending, row); per group a min-heap of the
 * open ranges' ends gives the depth (ranges opened before minus those closed by my start, as
 * numpy's searchsorted counts them), the last range seen one level up is the parent; a
 * zero-length range climbs from the last positive range to one still open at its time.
 */
typedef struct {
    int64_t thread;
    int32_t sub;
    int32_t used;
    int64_t last_row, last_pos;
    int64_t *heap, hn, hcap;
    int64_t *lvl, lcap;
    int64_t off, cnt, cur, prev; /* mk_latest_before: this thread's slice of the outer rows */
} group_t;

typedef struct {
    group_t *g;
    int64_t n, cap;
    int64_t *slot; /* group index + 1, 0 = empty */
    uint64_t nslot;
} groups_t;

static void groups_free(groups_t *gs)
{
    for (int64_t k = 0; k < gs->n; k++) {
        free(gs->g[k].heap);
        free(gs->g[k].lvl);
    }
    free(gs->g);
    free(gs->slot);
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static int groups_rehash(groups_t *gs)
{
    uint64_t n = gs->nslot ? gs->nslot * 2 : 64;
    int64_t *slot = calloc(n, sizeof *slot);
    if (!slot)
        return E_NOMEM;
    for (int64_t k = 0; k < gs->n; k++) {
        uint64_t h = mix((uint64_t)gs->g[k].thread * 31 + (uint32_t)gs->g[k].sub) & (n - 1);
        while (slot[h])
            h = (h + 1) & (n - 1);
        slot[h] = k + 1;
    }
    free(gs->slot);
    gs->slot = slot;
    gs->nslot = n;
    return 0;
}

static group_t *group_find(const groups_t *gs, int64_t thread, int32_t sub)
{
    if (!gs->nslot)
        return NULL;
    uint64_t h = mix((uint64_t)thread * 31 + (uint32_t)sub) & (gs->nslot - 1);
    while (gs->slot[h]) {
        group_t *g = &gs->g[gs->slot[h] - 1];
        if (g->thread == thread && g->sub == sub)
            return g;
        h = (h + 1) & (gs->nslot - 1);
    }
    return NULL;
}

static group_t *group_of(groups_t *gs, int64_t thread, int32_t sub)
{
    if ((uint64_t)(gs->n + 1) * 2 > gs->nslot && groups_rehash(gs))
        return NULL;
    uint64_t h = mix((uint64_t)thread * 31 + (uint32_t)sub) & (gs->nslot - 1);
    while (gs->slot[h]) {
        group_t *g = &gs->g[gs->slot[h] - 1];
        if (g->thread == thread && g->sub == sub)
            return g;
        h = (h + 1) & (gs->nslot - 1);
    }
    if (grow((void **)&gs->g, &gs->cap, gs->n + 1, sizeof(group_t)))
        return NULL;
    group_t *g = &gs->g[gs->n];
    memset(g, 0, sizeof *g);
    g->thread = thread;
    g->sub = sub;
    g->last_row = g->last_pos = -1;
    gs->slot[h] = ++gs->n;
    return g;
}

static int heap_push(group_t *g, int64_t v)
{
    if (grow((void **)&g->heap, &g->hcap, g->hn + 1, sizeof(int64_t)))
        return E_NOMEM;
    int64_t i = g->hn++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (g->heap[p] <= v)
            break;
        g->heap[i] = g->heap[p];
        i = p;
    }
    g->heap[i] = v;
    return 0;
}

static void heap_pop(group_t *g)
{
    int64_t v = g->heap[--g->hn], i = 0, n = g->hn;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && g->heap[c + 1] < g->heap[c])
            c++;
        if (g->heap[c] >= v)
            break;
        g->heap[i] = g->heap[c];
        i = c;
    }
    if (n)
        g->heap[i] = v;
}

static int nest_one(group_t *g, int64_t i, const int64_t *start, const int64_t *end,
                    int32_t *depth, int64_t *parent)
{
    int64_t s = start[i], e = end[i];
    if (e > s) {
        while (g->hn && g->heap[0] <= s)
            heap_pop(g);
        int64_t d = g->hn;
        depth[i] = (int32_t)d;
        parent[i] = d ? g->lvl[d - 1] : -1;
        if (grow((void **)&g->lvl, &g->lcap, d + 1, sizeof(int64_t)) || heap_push(g, e))
            return E_NOMEM;
        g->lvl[d] = i;
        g->last_pos = i;
    } else {
        int64_t c = g->last_pos;
        while (c >= 0 && end[c] <= s)
            c = parent[c];
        parent[i] = c;
        depth[i] = c >= 0 ? depth[c] + 1 : 0;
    }
    return 0;
}

/* With order == NULL, rows in row order, grouped by (thread, sub) here; returns 1 where a
 * group's rows are not in (start, end descending) order, so the caller sorts. With an order,
 * `gid` holds each row's group (0 <= gid < n_groups). Without `sub`, each row's is
 * (domain << 1) | (kind == start_end), as table.build forms it. 0 when done, E_NOMEM. */
API int64_t mk_nest(int64_t n, const int64_t *thread, const int32_t *sub, const int32_t *domain,
                    const int8_t *kind, int8_t start_end, const int64_t *start, const int64_t *end,
                    const int64_t *order, const int64_t *gid, int64_t n_groups, int32_t *depth,
                    int64_t *parent)
{
    groups_t gs = {0};
    int64_t rc = 0;
    if (order) {
        if (grow((void **)&gs.g, &gs.cap, n_groups, sizeof(group_t)))
            return E_NOMEM;
        memset(gs.g, 0, n_groups * sizeof(group_t));
        gs.n = n_groups;
        for (int64_t k = 0; k < n_groups; k++)
            gs.g[k].last_pos = -1;
        for (int64_t k = 0; k < n && !rc; k++) {
            int64_t i = order[k];
            rc = nest_one(&gs.g[gid[i]], i, start, end, depth, parent);
        }
    } else {
        group_t *g = NULL;
        for (int64_t i = 0; i < n && !rc; i++) {
            /* without `sub`, table.build's (domain_id << 1) | (kind == START_END) */
            int32_t sb = sub ? sub[i]
                             : (int32_t)(((uint32_t)domain[i] << 1) | (kind[i] == start_end));
            if (!g || g->thread != thread[i] || g->sub != sb) {
                g = group_of(&gs, thread[i], sb);
                if (!g) {
                    rc = E_NOMEM;
                    break;
                }
            }
            int64_t r = g->last_row;
            if (r >= 0 && (start[i] < start[r] || (start[i] == start[r] && end[i] > end[r]))) {
                rc = 1;
                break;
            }
            g->last_row = i;
            rc = nest_one(g, i, start, end, depth, parent);
        }
    }
    groups_free(&gs);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Stage table (stats.stage_stats), a row's stage being stage_of[name_id[row]]: exact count,
 * total, min and max per stage, the durations grouped by stage for the caller's selection of
 * percentiles, and the share of parent: per stage the time of the distinct parent ranges its
 * ranges lie in, and the usual parent stage (most distinct parents, ties to the lower stage id).
 */
API int64_t mk_stage_stats(int64_t n, int64_t n_stages, const int32_t *name_id,
                           const int32_t *stage_of, const int64_t *start,
                           const int64_t *end, const int64_t *parent, int64_t *count,
                           int64_t *total, int64_t *mn, int64_t *mx, int64_t *grouped,
                           int64_t *child_sum, int64_t *pairs, int64_t *parent_total,
                           int64_t *usual)
{
#define SID(row) stage_of[name_id[row]]
    int64_t *next = calloc(n_stages + 1, sizeof *next);
    int64_t *rows = n_stages <= 32 ? NULL : malloc((n ? n : 1) * sizeof *rows);
    int32_t *mark = calloc(n ? n : 1, sizeof *mark);
    int64_t *votes = calloc(n_stages ? n_stages : 1, sizeof *votes);
    int64_t *touched = malloc((n_stages ? n_stages : 1) * sizeof *touched);
    int64_t rc = 0;
    if (!next || (n_stages > 32 && !rows) || !mark || !votes || !touched) {
        rc = E_NOMEM;
        goto out;
    }
    for (int64_t s = 0; s < n_stages; s++) {
        count[s] = total[s] = child_sum[s] = pairs[s] = parent_total[s] = 0;
        mn[s] = INT64_MAX;
        mx[s] = INT64_MIN;
        usual[s] = -1;
    }
    for (int64_t i = 0; i < n; i++) {
        int32_t s = SID(i);
        int64_t d = end[i] - start[i];
        count[s]++;
        total[s] = (int64_t)((uint64_t)total[s] + (uint64_t)d);
        if (d < mn[s])
            mn[s] = d;
        if (d > mx[s])
            mx[s] = d;
    }
    for (int64_t s = 0, at = 0; s < n_stages; s++) {
        next[s] = at;
        at += count[s];
    }
    if (n_stages <= 32) {
        /* Few stages: a bit per stage and parent row marks the distinct pairs in one pass. */
        int64_t *vote = calloc(n_stages * n_stages, sizeof *vote);
        if (!vote) {
            rc = E_NOMEM;
            goto out;
        }
        uint32_t *seen = (uint32_t *)mark;
        for (int64_t i = 0; i < n; i++) {
            int32_t s = SID(i);
            int64_t d = end[i] - start[i], p = parent[i];
            grouped[next[s]++] = d;
            if (p < 0)
                continue;
            child_sum[s] = (int64_t)((uint64_t)child_sum[s] + (uint64_t)d);
            if (seen[p] & (1u << s))
                continue;
            seen[p] |= 1u << s;
            pairs[s]++;
            parent_total[s] =
                (int64_t)((uint64_t)parent_total[s] + (uint64_t)(end[p] - start[p]));
            vote[s * n_stages + SID(p)]++;
        }
        for (int64_t s = 0; s < n_stages; s++) {
            int64_t best = -1;
            for (int64_t ps = 0; ps < n_stages; ps++)
                if (vote[s * n_stages + ps] && (best < 0 || vote[s * n_stages + ps] >
                                                                vote[s * n_stages + best]))
                    best = ps;
            usual[s] = best;
        }
        free(vote);
        goto out;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t k = next[SID(i)]++;
        rows[k] = i;
        grouped[k] = end[i] - start[i];
    }
    for (int64_t s = 0, at = 0; s < n_stages; s++) {
        int64_t nt = 0;
        for (int64_t k = at; k < at + count[s]; k++) {
            int64_t i = rows[k], p = parent[i];
            if (p < 0)
                continue;
            child_sum[s] = (int64_t)((uint64_t)child_sum[s] + (uint64_t)(end[i] - start[i]));
            if (mark[p] == s + 1)
                continue;
            mark[p] = (int32_t)(s + 1);
            pairs[s]++;
            parent_total[s] =
                (int64_t)((uint64_t)parent_total[s] + (uint64_t)(end[p] - start[p]));
            if (votes[SID(p)]++ == 0)
                touched[nt++] = SID(p);
        }
        int64_t best = -1;
        for (int64_t k = 0; k < nt; k++) {
            int64_t ps = touched[k];
            if (best < 0 || votes[ps] > votes[best] || (votes[ps] == votes[best] && ps < best))
                best = ps;
        }
        for (int64_t k = 0; k < nt; k++)
            votes[touched[k]] = 0;
        usual[s] = best;
        at += count[s];
    }
out:
    free(next);
    free(rows);
    free(mark);
    free(votes);
    free(touched);
    return rc;
#undef SID
}

/* ---------------------------------------------------------------------------------------------
 * checks._overlapping: of these rows (row order), how many start before an earlier one on their
 * thread ends, taking each thread's rows by (start, row). -1 where a thread's rows are not in
 * start order already (the caller sorts), E_NOMEM.
 */
API int64_t mk_overlaps(int64_t m, const int64_t *rows, const int64_t *thread,
                        const int64_t *start, const int64_t *end)
{
    groups_t gs = {0};
    int64_t bad = 0;
    group_t *g = NULL;
    for (int64_t k = 0; k < m; k++) {
        int64_t i = rows[k];
        if (!g || g->thread != thread[i]) {
            g = group_of(&gs, thread[i], 0);
            if (!g) {
                bad = E_NOMEM;
                break;
            }
        }
        /* last_row: the previous row's start; last_pos: the running maximum of the ends */
        if (g->used) {
            if (start[i] < g->last_row) {
                bad = -1;
                break;
            }
            if (start[i] < g->last_pos)
                bad++;
            if (end[i] > g->last_pos)
                g->last_pos = end[i];
        } else {
            g->used = 1;
            g->last_pos = end[i];
        }
        g->last_row = start[i];
    }
    groups_free(&gs);
    return bad;
}

/* ---------------------------------------------------------------------------------------------
 * table.latest_before: for each inner row, the outer row on its thread that started last at or
 * before it (of equal starts the last in `outer`'s order), or -1. The outer rows go into one
 * slice per thread; each inner row moves its thread's cursor forward (or searches, where the
 * inner rows go back in time). -1 where a thread's outer rows are not in start order (the caller
 * sorts), E_NOMEM. With `end`, only a candidate that encloses the inner row counts.
 */
API int64_t mk_latest_before(int64_t n_out, const int64_t *outer, int64_t n_in,
                             const int64_t *inner, const int64_t *thread, const int64_t *start,
                             const int64_t *end, int64_t *found)
{
    groups_t gs = {0};
    int64_t rc = 0;
    int64_t *slice = malloc((n_out ? n_out : 1) * sizeof *slice);
    int32_t *gix = malloc((n_out ? n_out : 1) * sizeof *gix);
    if (!slice || !gix) {
        rc = E_NOMEM;
        goto out;
    }
    group_t *g = NULL;
    for (int64_t k = 0; k < n_out; k++) {
        int64_t o = outer[k];
        if (!g || g->thread != thread[o]) {
            g = group_of(&gs, thread[o], 0);
            if (!g) {
                rc = E_NOMEM;
                goto out;
            }
        }
        if (g->cnt && start[o] < g->prev) {
            rc = -1;
            goto out;
        }
        g->prev = start[o];
        g->cnt++;
        gix[k] = (int32_t)(g - gs.g);
    }
    for (int64_t k = 0, at = 0; k < gs.n; k++) {
        gs.g[k].off = at;
        at += gs.g[k].cnt;
        gs.g[k].cur = 0; /* filling position first, then the cursor */
    }
    for (int64_t k = 0; k < n_out; k++) {
        group_t *h = &gs.g[gix[k]];
        slice[h->off + h->cur++] = outer[k];
    }
    for (int64_t k = 0; k < gs.n; k++) {
        gs.g[k].cur = 0;
        gs.g[k].prev = INT64_MIN;
    }
    g = NULL;
    for (int64_t k = 0; k < n_in; k++) {
        int64_t i = inner[k], s = start[i];
        if (!g || g->thread != thread[i])
            g = group_find(&gs, thread[i], 0);
        if (!g) {
            found[k] = -1;
            continue;
        }
        const int64_t *sl = slice + g->off;
        if (s < g->prev) { /* back in time: the first outer row after s, by bisection */
            int64_t lo = 0, hi = g->cnt;
            while (lo < hi) {
                int64_t mid = lo + (hi - lo) / 2;
                if (start[sl[mid]] <= s)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            g->cur = lo;
        } else {
            while (g->cur < g->cnt && start[sl[g->cur]] <= s)
                g->cur++;
        }
        g->prev = s;
        int64_t o = g->cur ? sl[g->cur - 1] : -1;
        /* with `end`, checks._inside: the candidate must also hold the inner range */
        if (end && o >= 0 && !(end[o] >= end[i] && (end[o] > s || start[o] == s)))
            o = -1;
        found[k] = o;
    }
out:
    free(slice);
    free(gix);
    groups_free(&gs);
    return rc;
}

/* The distinct values (first appearance first) into out[0, cap); their number, E_NOMEM. */
API int64_t mk_distinct(int64_t n, const int64_t *values, int64_t cap, int64_t *out)
{
    groups_t gs = {0};
    group_t *g = NULL;
    int64_t rc = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!g || g->thread != values[i]) {
            g = group_of(&gs, values[i], 0);
            if (!g) {
                rc = E_NOMEM;
                break;
            }
        }
    }
    if (!rc) {
        rc = gs.n;
        for (int64_t k = 0; k < gs.n && k < cap; k++)
            out[k] = gs.g[k].thread;
    }
    groups_free(&gs);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * steps._parse_joined for the regex ^step_meta: prefill=(\d+) decode=(\d+) total=(\d+) reqs=(\d+)$
 * over n lines of ASCII text joined by '\n' (the caller checks both, and that the regex is this
 * one): per line its four numbers, or -1s where the line does not match. Numbers of more than 18
 * digits return -1 (the caller parses those names one by one).
 */
static int64_t digits(const char **p, const char *end)
{
    const char *q = *p;
    int64_t v = 0;
    int n = 0;
    while (q < end && *q >= '0' && *q <= '9') {
        if (++n > 18)
            return -2;
        v = v * 10 + (*q++ - '0');
    }
    if (!n)
        return -1;
    *p = q;
    return v;
}

API int64_t mk_parse_step_meta(const char *text, int64_t len, int64_t n_lines, int64_t *out)
{
    static const char *const lit[4] = {"step_meta: prefill=", " decode=", " total=", " reqs="};
    const char *p = text, *stop = text + len;
    int64_t line = 0;
    while (line < n_lines) {
        const char *eol = memchr(p, '\n', stop - p);
        if (!eol)
            eol = stop;
        const char *q = p;
        int64_t v[4];
        int ok = 1;
        for (int k = 0; k < 4 && ok; k++) {
            size_t m = strlen(lit[k]);
            if ((size_t)(eol - q) < m || memcmp(q, lit[k], m) != 0) {
                ok = 0;
                break;
            }
            q += m;
            v[k] = digits(&q, eol);
            if (v[k] == -2)
                return -1;
            ok = v[k] >= 0;
        }
        ok = ok && q == eol;
        for (int k = 0; k < 4; k++)
            out[4 * line + k] = ok ? v[k] : -1;
        line++;
        if (eol == stop)
            break;
        p = eol + 1;
    }
    return line == n_lines && p <= stop ? 0 : -1;
}

/* ---------------------------------------------------------------------------------------------
 * RangeTable.rows_named for several name sets in one pass: slot_of[name id] is the set a name
 * belongs to (-1: none). Without `rows`, counts per set; with it (and those counts), the rows of
 * each set one after the other, each set's in row order.
 */
API void mk_rows_by_slot(int64_t n, const int32_t *name_id, const int32_t *slot_of,
                         int64_t n_slots, int64_t *counts, int64_t *rows)
{
    if (!rows) {
        for (int64_t k = 0; k < n_slots; k++)
            counts[k] = 0;
        for (int64_t i = 0; i < n; i++) {
            int32_t k = slot_of[name_id[i]];
            if (k >= 0)
                counts[k]++;
        }
        return;
    }
    int64_t *at = malloc((n_slots ? n_slots : 1) * sizeof *at);
    if (!at)
        return;
    for (int64_t k = 0, sum = 0; k < n_slots; k++) {
        at[k] = sum;
        sum += counts[k];
    }
    for (int64_t i = 0; i < n; i++) {
        int32_t k = slot_of[name_id[i]];
        if (k >= 0)
            rows[at[k]++] = i;
    }
    free(at);
}

