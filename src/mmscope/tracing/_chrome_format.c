/* The chrome backend's flush loop in C: Chrome trace "X" events as the bytes of JSON lines.
 *
 * format_events(events, quoted, pid) -> bytes. `events` is a list of (name, t0_ns, t1_ns, tid)
 * tuples, `quoted` maps each name to its JSON-escaped text. The result is byte for byte what
 * chrome.py's Python formatter writes: the flusher holds the GIL while it formats, so every
 * event it formats in Python (about 0.8 us) is time the engine thread waits.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Floor division and remainder, as Python's divmod(v, 1000). */
static void divmod1000(long long v, long long *q, long long *r) {
    *q = v / 1000;
    *r = v % 1000;
    if (*r < 0) {
        *r += 1000;
        *q -= 1;
    }
}

static char *put_int(char *p, long long v) {
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *p++ = '-';
    while (n)
        *p++ = tmp[--n];
    return p;
}

/* "%d.%03d" of divmod(v, 1000) */
static char *put_us(char *p, long long v) {
    long long q, r;
    divmod1000(v, &q, &r);
    p = put_int(p, q);
    *p++ = '.';
    *p++ = (char)('0' + r / 100);
    *p++ = (char)('0' + r / 10 % 10);
    *p++ = (char)('0' + r % 10);
    return p;
}

static char *put_str(char *p, const char *s, size_t n) {
    memcpy(p, s, n);
    return p + n;
}

#define PUT(lit) (p = put_str(p, lit, sizeof(lit) - 1))

static PyObject *format_events(PyObject *self, PyObject *args) {
    PyObject *events, *quoted;
    long long pid;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!L", &PyList_Type, &events, &PyDict_Type, &quoted, &pid))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(events);
    size_t cap = 64 + (size_t)n * 160, used = 0;
    char *buf = PyMem_Malloc(cap);
    if (!buf)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(events, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4) {
            PyErr_SetString(PyExc_TypeError, "an event is a (name, t0, t1, tid) tuple");
            goto fail;
        }
        PyObject *q = PyDict_GetItemWithError(quoted, PyTuple_GET_ITEM(e, 0));
        if (!q) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, PyTuple_GET_ITEM(e, 0));
            goto fail;
        }
        Py_ssize_t qlen;
        const char *qs = PyUnicode_AsUTF8AndSize(q, &qlen);
        long long t0 = PyLong_AsLongLong(PyTuple_GET_ITEM(e, 1));
        long long t1 = PyLong_AsLongLong(PyTuple_GET_ITEM(e, 2));
        long long tid = PyLong_AsLongLong(PyTuple_GET_ITEM(e, 3));
        if (!qs || PyErr_Occurred())
            goto fail;
        size_t need = (size_t)qlen + 160;
        if (used + need > cap) {
            cap = (used + need) * 2;
            char *grown = PyMem_Realloc(buf, cap);
            if (!grown) {
                PyErr_NoMemory();
                goto fail;
            }
            buf = grown;
        }
        char *p = buf + used;
        PUT("{\"name\":");
        p = put_str(p, qs, (size_t)qlen);
        PUT(",\"ph\":\"X\",\"ts\":");
        p = put_us(p, t0);
        PUT(",\"dur\":");
        p = put_us(p, t1 - t0);
        PUT(",\"pid\":");
        p = put_int(p, pid);
        PUT(",\"tid\":");
        p = put_int(p, tid);
        PUT("},\n");
        used = (size_t)(p - buf);
    }
    PyObject *out = PyBytes_FromStringAndSize(buf, (Py_ssize_t)used);
    PyMem_Free(buf);
    return out;
fail:
    PyMem_Free(buf);
    return NULL;
}

static PyMethodDef methods[] = {
    {"format_events", format_events, METH_VARARGS,
     "format_events(events, quoted, pid) -> bytes: Chrome trace X events, one JSON line each"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chrome_format", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chrome_format(void) { return PyModule_Create(&module); }
