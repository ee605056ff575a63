/*
 * Writes one SQLite table straight into a new database file, page by page, for `mmscope record`.
 *
 * Inserting ten million NVTX rows through SQLite costs about a microsecond a row even from C (the
 * VDBE, the B-tree descent, the record encoding), which is too slow for the recorder's target. The
 * rows here arrive complete and in rowid order, so the table B-tree can be laid out bottom-up in
 * one pass: leaf pages filled in order, then interior levels over them. The result is an ordinary
 * SQLite database (file format 4, UTF-8, no journal, no freelist) holding that one table; the
 * caller then opens it with the sqlite3 module to add the small tables and metadata.
 *
 * Format reference: https://www.sqlite.org/fileformat2.html (database header, b-tree pages, record
 * format, varints). Rows must fit a leaf page locally (no overflow pages): the caller keeps every
 * record below page_size - 35 bytes.
 *
 * Called through ctypes; no Python API.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MM_EXPORT __attribute__((visibility("default")))

enum { COL_NULL = 0, COL_INT = 1, COL_REAL = 2, COL_TEXT = 3, COL_INT32 = 4 };

typedef struct {
    int fd;
    uint32_t page_size;
    uint8_t *page;        /* leaf being filled */
    uint32_t ncells, content; /* cell count, start of the cell content area */
    uint32_t next_pgno;   /* next page number to hand out */
    uint8_t *out;         /* pages waiting to be written, in page order */
    size_t out_used, out_cap;
    uint32_t out_first;   /* page number of out[0] */
    uint32_t *kid_pg;     /* finished pages of the level being built, and their max rowid */
    int64_t *kid_key;
    size_t nkids, kids_cap;
    char *err;
    int errlen;
} mm_sq;

static void put16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

/* SQLite's varint: big-endian 7-bit groups, the ninth byte carrying a full 8 bits. */
static int put_varint(uint8_t *p, uint64_t v) {
    if (v <= 0x7f) {
        p[0] = (uint8_t)v;
        return 1;
    }
    if (v <= 0x3fff) {
        p[0] = (uint8_t)(((v >> 7) & 0x7f) | 0x80);
        p[1] = (uint8_t)(v & 0x7f);
        return 2;
    }
    if (v & (((uint64_t)0xff000000) << 32)) {
        p[8] = (uint8_t)v;
        v >>= 8;
        for (int i = 7; i >= 0; i--) {
            p[i] = (uint8_t)((v & 0x7f) | 0x80);
            v >>= 7;
        }
        return 9;
    }
    uint8_t buf[10];
    int n = 0;
    do {
        buf[n++] = (uint8_t)((v & 0x7f) | 0x80);
        v >>= 7;
    } while (v);
    buf[0] &= 0x7f;
    for (int i = 0; i < n; i++) p[i] = buf[n - 1 - i];
    return n;
}

static int varint_len(uint64_t v) {
    uint8_t tmp[9];
    return put_varint(tmp, v);
}

static void fail(mm_sq *s, const char *msg) {
    if (s->err && !s->err[0]) snprintf(s->err, (size_t)s->errlen, "%s", msg);
}

/* Serial type and body size of an integer, the smallest encoding as SQLite itself picks it. */
static uint32_t int_type(int64_t v, uint32_t *size) {
    if (v == 0) { *size = 0; return 8; }
    if (v == 1) { *size = 0; return 9; }
    uint64_t u = v < 0 ? ~(uint64_t)v : (uint64_t)v;
    if (u <= 127) { *size = 1; return 1; }
    if (u <= 32767) { *size = 2; return 2; }
    if (u <= 8388607) { *size = 3; return 3; }
    if (u <= 2147483647) { *size = 4; return 4; }
    if (u <= 0x00007fffffffffffull) { *size = 6; return 5; }
    *size = 8;
    return 6;
}

static void put_be(uint8_t *p, uint64_t v, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
}

static int flush_out(mm_sq *s) {
    size_t done = 0;
    off_t off = (off_t)(s->out_first - 1) * s->page_size;
    while (done < s->out_used) {
        ssize_t w = pwrite(s->fd, s->out + done, s->out_used - done, off + (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            fail(s, strerror(errno));
            return -1;
        }
        done += (size_t)w;
    }
    s->out_first += (uint32_t)(s->out_used / s->page_size);
    s->out_used = 0;
    return 0;
}

/* Hands out the next page number and queues the page; pages are numbered in write order. */
static int emit_page(mm_sq *s, const uint8_t *page, uint32_t *pgno) {
    if (s->out_used == s->out_cap && flush_out(s) != 0) return -1;
    memcpy(s->out + s->out_used, page, s->page_size);
    s->out_used += s->page_size;
    *pgno = s->next_pgno++;
    return 0;
}

static int add_kid(mm_sq *s, uint32_t pgno, int64_t key) {
    if (s->nkids == s->kids_cap) {
        size_t cap = s->kids_cap ? s->kids_cap * 2 : 1024;
        uint32_t *p = realloc(s->kid_pg, cap * sizeof *p);
        if (!p) return -1;
        s->kid_pg = p;
        int64_t *k = realloc(s->kid_key, cap * sizeof *k);
        if (!k) return -1;
        s->kid_key = k;
        s->kids_cap = cap;
    }
    s->kid_pg[s->nkids] = pgno;
    s->kid_key[s->nkids++] = key;
    return 0;
}

static void leaf_reset(mm_sq *s) {
    memset(s->page, 0, s->page_size);
    s->ncells = 0;
    s->content = s->page_size;
}

static int leaf_flush(mm_sq *s, int64_t last_rowid) {
    uint8_t *h = s->page;
    h[0] = 0x0D;
    put16(h + 3, s->ncells);
    put16(h + 5, s->content == 65536 ? 0 : s->content);
    uint32_t pgno;
    if (emit_page(s, s->page, &pgno) != 0 || add_kid(s, pgno, last_rowid) != 0) return -1;
    leaf_reset(s);
    return 0;
}

/* Places one cell (already encoded) into the leaf, flushing the leaf first when it is full. */
static int leaf_add(mm_sq *s, const uint8_t *cell, uint32_t len, int64_t rowid, int64_t prev_rowid) {
    uint32_t ptrs_end = 8 + 2 * (s->ncells + 1);
    if (s->ncells && ptrs_end + len > s->content) {
        if (leaf_flush(s, prev_rowid) != 0) return -1;
        ptrs_end = 8 + 2;
    }
    (void)rowid;
    s->content -= len;
    memcpy(s->page + s->content, cell, len);
    put16(s->page + 8 + 2 * s->ncells, s->content);
    s->ncells++;
    return 0;
}

/* Builds the interior levels over s->kid_*; returns the root page number. */
static int build_interior(mm_sq *s, uint32_t *root) {
    uint8_t *page = calloc(1, s->page_size);
    if (!page) return -1;
    while (s->nkids > 1) {
        uint32_t *pg = s->kid_pg;
        int64_t *key = s->kid_key;
        size_t n = s->nkids;
        s->kid_pg = NULL;
        s->kid_key = NULL;
        s->nkids = s->kids_cap = 0;
        size_t i = 0;
        while (i < n) {
            memset(page, 0, s->page_size);
            uint32_t ncells = 0, content = s->page_size;
            /* children i..j-1 become cells, child j the right-most pointer */
            while (i + 1 < n) {
                uint8_t cell[13];
                put32(cell, pg[i]);
                uint32_t len = 4 + (uint32_t)put_varint(cell + 4, (uint64_t)key[i]);
                if (12 + 2 * (ncells + 1) + len + 16 > content) break;
                content -= len;
                memcpy(page + content, cell, len);
                put16(page + 12 + 2 * ncells, content);
                ncells++;
                i++;
            }
            page[0] = 0x05;
            put16(page + 3, ncells);
            put16(page + 5, content == 65536 ? 0 : content);
            put32(page + 8, pg[i]);
            uint32_t pgno;
            if (emit_page(s, page, &pgno) != 0 || add_kid(s, pgno, key[i]) != 0) {
                free(pg); free(key); free(page);
                return -1;
            }
            i++;
        }
        free(pg);
        free(key);
    }
    free(page);
    *root = s->kid_pg[0];
    return 0;
}

/* Page 1: the 100-byte database header and the sqlite_schema leaf with the table's row. */
static int write_page1(mm_sq *s, const char *name, const char *sql, uint32_t root) {
    uint8_t *p = calloc(1, s->page_size);
    if (!p) return -1;
    uint32_t npages = s->next_pgno - 1;
    memcpy(p, "SQLite format 3", 16);
    put16(p + 16, s->page_size == 65536 ? 1 : s->page_size);
    p[18] = 1; p[19] = 1; p[20] = 0; p[21] = 64; p[22] = 32; p[23] = 32;
    put32(p + 24, 1);          /* file change counter */
    put32(p + 28, npages);     /* database size in pages */
    put32(p + 40, 1);          /* schema cookie */
    put32(p + 44, 4);          /* schema format */
    put32(p + 56, 1);          /* UTF-8 */
    put32(p + 92, 1);          /* version-valid-for = change counter */
    put32(p + 96, 3031000);    /* writer version: any 3.x reader accepts format 4 */
    /* record: type, name, tbl_name, rootpage, sql */
    const char *texts[4] = {"table", name, name, sql};
    size_t tl[4];
    for (int i = 0; i < 4; i++) tl[i] = strlen(texts[i]);
    uint32_t rsize;
    uint32_t rtype = int_type(root, &rsize);
    uint8_t hdr[64];
    int hl = 1;
    hl += put_varint(hdr + hl, 2 * tl[0] + 13);
    hl += put_varint(hdr + hl, 2 * tl[1] + 13);
    hl += put_varint(hdr + hl, 2 * tl[2] + 13);
    hl += put_varint(hdr + hl, rtype);
    hl += put_varint(hdr + hl, 2 * tl[3] + 13);
    hdr[0] = (uint8_t)hl;
    size_t payload = (size_t)hl + tl[0] + tl[1] + tl[2] + rsize + tl[3];
    size_t cell_len = (size_t)varint_len(payload) + 1 + payload;
    if (100 + 8 + 2 + cell_len + 35 > s->page_size) {
        free(p);
        fail(s, "CREATE TABLE statement too long for page 1");
        return -1;
    }
    uint32_t content = s->page_size - (uint32_t)cell_len;
    uint8_t *c = p + content;
    c += put_varint(c, payload);
    c += put_varint(c, 1);
    memcpy(c, hdr, (size_t)hl); c += hl;
    for (int i = 0; i < 3; i++) { memcpy(c, texts[i], tl[i]); c += tl[i]; }
    put_be(c, (uint64_t)root, rsize); c += rsize;
    memcpy(c, texts[3], tl[3]);
    uint8_t *h = p + 100;
    h[0] = 0x0D;
    put16(h + 3, 1);
    put16(h + 5, content);
    put16(h + 8, content);
    int rc = 0;
    if (pwrite(s->fd, p, s->page_size, 0) != (ssize_t)s->page_size) {
        fail(s, strerror(errno));
        rc = -1;
    }
    free(p);
    return rc;
}

typedef struct {
    int32_t ncols;
    const int32_t *types;
    const void *const *data;
    const uint8_t *const *nulls;
    const int64_t *order;  /* row order, or NULL for 0..n-1 */
    const char *blob;
    const int64_t *offsets;
} mm_cols;

/* Encodes row i as a leaf cell (payload size, rowid, record). Returns the cell length or 0. */
static uint32_t encode_row(const mm_cols *c, int64_t i, int64_t rowid, uint8_t *cell,
                           uint32_t *types, uint32_t *sizes, uint32_t max_local) {
    uint32_t hbody = 0, body = 0;
    for (int32_t k = 0; k < c->ncols; k++) {
        uint32_t t = 0, sz = 0;
        int is_null = c->types[k] == COL_NULL || (c->nulls[k] && c->nulls[k][i]);
        if (!is_null && c->types[k] == COL_INT) {
            t = int_type(((const int64_t *)c->data[k])[i], &sz);
        } else if (!is_null && c->types[k] == COL_INT32) {
            t = int_type(((const int32_t *)c->data[k])[i], &sz);
        } else if (!is_null && c->types[k] == COL_REAL) {
            double d = ((const double *)c->data[k])[i];
            if (!isnan(d)) { t = 7; sz = 8; } /* SQLite stores NaN as NULL */
        } else if (!is_null && c->types[k] == COL_TEXT) {
            int64_t s = ((const int64_t *)c->data[k])[i];
            if (s >= 0) {
                sz = (uint32_t)(c->offsets[s + 1] - c->offsets[s]);
                t = 2 * sz + 13;
            }
        }
        types[k] = t;
        sizes[k] = sz;
        hbody += (uint32_t)varint_len(t);
        body += sz;
    }
    uint32_t hsize = hbody + 1;
    if (hsize > 127) hsize = hbody + (uint32_t)varint_len(hbody + 2);
    uint64_t payload = (uint64_t)hsize + body;
    if (payload > max_local) return 0;
    uint8_t *p = cell;
    p += put_varint(p, payload);
    p += put_varint(p, (uint64_t)rowid);
    p += put_varint(p, hsize);
    for (int32_t k = 0; k < c->ncols; k++) p += put_varint(p, types[k]);
    for (int32_t k = 0; k < c->ncols; k++) {
        if (!sizes[k]) continue;
        if (c->types[k] == COL_INT) {
            put_be(p, (uint64_t)((const int64_t *)c->data[k])[i], sizes[k]);
        } else if (c->types[k] == COL_INT32) {
            put_be(p, (uint64_t)(int64_t)((const int32_t *)c->data[k])[i], sizes[k]);
        } else if (c->types[k] == COL_REAL) {
            uint64_t bits;
            memcpy(&bits, &((const double *)c->data[k])[i], 8);
            put_be(p, bits, 8);
        } else {
            int64_t s = ((const int64_t *)c->data[k])[i];
            memcpy(p, c->blob + c->offsets[s], sizes[k]);
        }
        p += sizes[k];
    }
    return (uint32_t)(p - cell);
}

static int write_rows(mm_sq *s, const mm_cols *c, int64_t nrows) {
    uint32_t max_local = s->page_size - 35;
    uint8_t *cell = malloc((size_t)s->page_size + 64);
    uint32_t *types = malloc((size_t)c->ncols * sizeof *types);
    uint32_t *sizes = malloc((size_t)c->ncols * sizeof *sizes);
    int rc = cell && types && sizes ? 0 : -1;
    for (int64_t i = 0; rc == 0 && i < nrows; i++) {
        uint32_t len = encode_row(c, c->order ? c->order[i] : i, i + 1, cell, types, sizes, max_local);
        if (!len) {
            fail(s, "a row is larger than a page");
            rc = -1;
        } else {
            rc = leaf_add(s, cell, len, i + 1, i);
        }
    }
    if (rc == 0) rc = leaf_flush(s, nrows);
    free(cell);
    free(types);
    free(sizes);
    return rc;
}

/*
 * Writes `path` (truncated) as a database holding one table `name` created by `create_sql`, with
 * rows 1..nrows. Column k has type types[k]: COL_NULL (always NULL, e.g. the INTEGER PRIMARY KEY,
 * which SQLite stores as NULL and reads from the rowid), COL_INT (int64 data[k]), COL_INT32
 * (int32 data[k]), COL_REAL
 * (double data[k]) or COL_TEXT (int64 data[k]: index into the strings blob[offsets[j]:offsets[j+1]],
 * -1 for NULL). nulls[k], where not NULL, flags NULL rows of INT, INT32 and REAL columns. Row
 * i of the table is element order[i] of the columns (element i where order is NULL).
 * Returns 0, or -1 with a message in err.
 */
MM_EXPORT int mm_sqlite_write_table(const char *path, uint32_t page_size, const char *name,
                                    const char *create_sql, int64_t nrows, int32_t ncols,
                                    const int32_t *types, const void *const *data,
                                    const uint8_t *const *nulls, const int64_t *order,
                                    const char *blob, const int64_t *offsets, char *err,
                                    int32_t errlen) {
    if (err && errlen > 0) err[0] = 0;
    mm_sq s = {0};
    s.err = err;
    s.errlen = errlen;
    if (page_size < 512 || page_size > 65536 || (page_size & (page_size - 1))) {
        fail(&s, "bad page size");
        return -1;
    }
    s.page_size = page_size;
    s.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (s.fd < 0) {
        fail(&s, strerror(errno));
        return -1;
    }
    s.page = malloc(page_size);
    s.out_cap = (size_t)page_size * 64;
    s.out = malloc(s.out_cap);
    s.next_pgno = 2;
    s.out_first = 2;
    int rc = s.page && s.out ? 0 : -1;
    if (rc) fail(&s, "out of memory");
    mm_cols c = {ncols, types, data, nulls, order, blob, offsets};
    uint32_t root = 0;
    if (rc == 0) {
        leaf_reset(&s);
        rc = write_rows(&s, &c, nrows);
    }
    if (rc == 0) rc = build_interior(&s, &root);
    if (rc == 0) rc = flush_out(&s);
    if (rc == 0) rc = write_page1(&s, name, create_sql, root);
    if (close(s.fd) != 0 && rc == 0) {
        fail(&s, strerror(errno));
        rc = -1;
    }
    free(s.page);
    free(s.out);
    free(s.kid_pg);
    free(s.kid_key);
    return rc;
}
