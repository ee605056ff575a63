/* The chrome backend's hot paths in C: the span that records an event, and the flush loop that
 * formats events as the bytes of JSON lines.
 *
 * format_events(events, quoted, pid) -> bytes. `events` is a list of (name, t0_ns, t1_ns, tid)
 * tuples, `quoted` maps each name to its JSON-escaped text. The result is byte for byte what
 * chrome.py's Python formatter writes: the flusher holds the GIL while it formats, so every
 * event it formats in Python (about 0.8 us) is time the engine thread waits.
 *
 * ChromeSpanFactory(pending, on_new_thread, max_pending) (Linux only): factory(name) is a context
 * manager that appends (name, t0_ns, t1_ns, tid) to `pending` when it exits, the tuple that
 * ChromeTraceWriter.complete appends, without a Python frame (see the span section below);
 * factory.mark(name) appends a zero-duration event the same way.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#if defined(__linux__)
#define HAVE_SPANS 1
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

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

#ifdef HAVE_SPANS
/* ---- Spans ----
 *
 * Inside vLLM's step loop every Python frame and every object a span touches is a cache miss, so
 * a span here costs one allocation of its own, the event tuple and its two clock readings:
 *
 * - `with` looks __enter__ and __exit__ up on the type and binds them. A method would be bound
 *   into a new object each time; SpanMethod instead binds to the span itself, which is callable:
 *   with no argument it enters, with three (exc_type, exc, tb) it exits. type(span).__enter__(span)
 *   works too (contextlib.ExitStack calls it so).
 * - The thread id is a system call: it is read once per thread and kept, with its Python int, in
 *   thread-local storage; a forked child forgets it (its thread has a new id).
 * - A writer records each thread's name when the thread first appears (on_new_thread). Each factory
 *   keeps the set of threads it has announced; a thread remembers the last factory it checked, so
 *   only a change of factory (a new writer after configure()) goes back to that set.
 * - The clock is CPython's time.perf_counter_ns on Linux (CLOCK_MONOTONIC), so events from the
 *   Python path and from this one interleave in one file.
 */

static __thread long tls_tid;          /* 0: not read yet in this thread (or since a fork) */
static __thread PyObject *tls_tid_obj; /* tls_tid as an int, shared by the thread's events; kept
                                          for the thread's life (one small int per thread) */
static __thread uint64_t tls_factory;  /* serial of the last factory that knew this thread */
static uint64_t next_serial = 1;       /* changed under the GIL only */

static void forget_thread(void) {
    /* The child of fork(): no Python object may be touched yet, so the int is left, not freed. */
    tls_tid = 0;
    tls_tid_obj = NULL;
    tls_factory = 0;
}

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *pending;       /* the writer's list of event tuples */
    PyObject *on_new_thread; /* on_new_thread(tid): the writer records the thread's name */
    PyObject *seen;          /* set of the tids announced through this factory */
    Py_ssize_t max_pending;
    Py_ssize_t dropped;      /* events not stored because `pending` was full */
    uint64_t serial;         /* unlike the address, never reused by a later factory */
} Factory;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Factory *factory;
    PyObject *name;
    long long t0;
    int open;
} Span;

static PyTypeObject FactoryType, SpanType;

/* Make the current thread known to `f` (announcing it once); 0, or -1 with an exception set. */
static int know_thread(Factory *f) {
    if (tls_tid == 0) {
        PyObject *obj = PyLong_FromLong((long)syscall(SYS_gettid));
        if (!obj)
            return -1;
        tls_tid_obj = obj;
        tls_tid = PyLong_AsLong(obj);
    }
    PyObject *tid = tls_tid_obj;
    int seen = PySet_Contains(f->seen, tid);
    if (seen < 0)
        return -1;
    if (!seen) {
        /* Added first: the callback runs Python code, during which this thread must not be
         * announced a second time. */
        if (PySet_Add(f->seen, tid) < 0)
            return -1;
        Py_INCREF(f);
        Py_INCREF(tid);
        PyObject *r = PyObject_CallOneArg(f->on_new_thread, tid);
        if (r)
            Py_DECREF(r);
        else  /* a missing thread name must not cost the event, nor mask the with-block's error */
            PyErr_WriteUnraisable(f->on_new_thread);
        Py_DECREF(tid);
        Py_DECREF(f);
    }
    tls_factory = f->serial;
    return 0;
}

static PyObject *span_enter(Span *s) {
    if (s->open) {
        PyErr_SetString(PyExc_RuntimeError, "this span is already open");
        return NULL;
    }
    s->open = 1;
    s->t0 = now_ns();
    Py_INCREF(s);
    return (PyObject *)s;
}

/* Append (name, t0, t1, tid) to the factory's pending list, or count it as dropped when the list
 * is full; 0, or -1 with an exception set. */
static int append_event(Factory *f, PyObject *name, long long t0, long long t1) {
    if (tls_factory != f->serial && know_thread(f) < 0)
        return -1;
    if (PyList_GET_SIZE(f->pending) >= f->max_pending) {
        f->dropped++;
        return 0;
    }
    PyObject *event = PyTuple_New(4);
    PyObject *start = PyLong_FromLongLong(t0), *end = PyLong_FromLongLong(t1);
    if (!event || !start || !end) {
        Py_XDECREF(event);
        Py_XDECREF(start);
        Py_XDECREF(end);
        return -1;
    }
    /* A str and ints cannot form a cycle: the collector need not visit the event while it waits
     * for the flusher (it would untrack it on its first pass anyway). */
    PyObject_GC_UnTrack(event);
    Py_INCREF(name);
    Py_INCREF(tls_tid_obj);
    PyTuple_SET_ITEM(event, 0, name);
    PyTuple_SET_ITEM(event, 1, start);
    PyTuple_SET_ITEM(event, 2, end);
    PyTuple_SET_ITEM(event, 3, tls_tid_obj);
    int rc = PyList_Append(f->pending, event);
    Py_DECREF(event);
    return rc;
}

static PyObject *span_exit(Span *s) {
    long long t1 = now_ns();
    if (!s->open)
        Py_RETURN_FALSE;  /* exited without being entered: there is nothing to record */
    s->open = 0;
    if (append_event(s->factory, s->name, s->t0, t1) < 0)
        return NULL;
    Py_RETURN_FALSE;  /* never swallows the with-block's exception */
}

static PyObject *span_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    (void)args;
    if (kw == NULL || PyTuple_GET_SIZE(kw) == 0) {
        if (n == 0)
            return span_enter((Span *)self);
        if (n == 3)
            return span_exit((Span *)self);
    }
    PyErr_SetString(PyExc_TypeError,
                    "a chrome span is called as its own __enter__() or __exit__(type, value, tb)");
    return NULL;
}

static void span_dealloc(Span *s) {
    Py_DECREF(s->factory);
    Py_DECREF(s->name);
    PyObject_Free(s);
}

static PyObject *span_repr(Span *s) {
    return PyUnicode_FromFormat("<chrome span %R%s>", s->name, s->open ? " (open)" : "");
}

static PyMemberDef span_members[] = {
    {"name", T_OBJECT_EX, offsetof(Span, name), READONLY, "the event's name"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SpanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mmscope.tracing._chrome_format.ChromeSpan",
    .tp_doc = "A chrome span, `with factory(name):`. It is its own bound __enter__/__exit__: "
              "called with no argument it opens, with (type, value, tb) it closes.",
    .tp_basicsize = sizeof(Span),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Span, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dealloc = (destructor)span_dealloc,
    .tp_repr = (reprfunc)span_repr,
    .tp_members = span_members,
};

/* __enter__ and __exit__ on ChromeSpan: bound, each is the span itself (no new object). */
typedef struct {
    PyObject_HEAD
    int exit;
} SpanMethod;

static PyObject *span_method_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    PyObject *bound = obj && obj != Py_None ? obj : self;
    Py_INCREF(bound);
    return bound;
}

static PyObject *span_method_call(SpanMethod *m, PyObject *args, PyObject *kw) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if ((kw && PyDict_GET_SIZE(kw)) || n != (m->exit ? 4 : 1) ||
        !PyObject_TypeCheck(PyTuple_GET_ITEM(args, 0), &SpanType)) {
        PyErr_SetString(PyExc_TypeError, m->exit ? "ChromeSpan.__exit__(span, type, value, tb)"
                                                 : "ChromeSpan.__enter__(span)");
        return NULL;
    }
    Span *s = (Span *)PyTuple_GET_ITEM(args, 0);
    return m->exit ? span_exit(s) : span_enter(s);
}

static PyTypeObject SpanMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mmscope.tracing._chrome_format.ChromeSpanMethod",
    .tp_basicsize = sizeof(SpanMethod),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_descr_get = span_method_get,
    .tp_call = (ternaryfunc)span_method_call,
};

static PyObject *factory_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw) {
    if (PyVectorcall_NARGS(nargsf) != 1 || (kw && PyTuple_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "a span factory takes one argument, the span's name");
        return NULL;
    }
    if (!PyUnicode_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "a span's name is a str, not %.100s",
                     Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    Span *s = PyObject_New(Span, &SpanType);
    if (!s)
        return NULL;
    s->vectorcall = span_call;
    Py_INCREF(self);
    s->factory = (Factory *)self;
    Py_INCREF(args[0]);
    s->name = args[0];
    s->t0 = 0;
    s->open = 0;
    return (PyObject *)s;
}

/* factory.mark(name): a zero-duration event now, as ChromeBackend.mark (the per-step step_meta). */
static PyObject *factory_mark(PyObject *self, PyObject *name) {
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "a mark's name is a str, not %.100s", Py_TYPE(name)->tp_name);
        return NULL;
    }
    long long t = now_ns();
    if (append_event((Factory *)self, name, t, t) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef factory_methods[] = {
    {"mark", factory_mark, METH_O,
     "mark(name): append a zero-duration event (name, t, t, tid), as ChromeBackend.mark does"},
    {NULL, NULL, 0, NULL},
};

static PyObject *factory_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"pending", "on_new_thread", "max_pending", NULL};
    PyObject *pending, *on_new_thread;
    Py_ssize_t max_pending = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O|n", names, &PyList_Type, &pending,
                                     &on_new_thread, &max_pending))
        return NULL;
    if (!PyCallable_Check(on_new_thread)) {
        PyErr_SetString(PyExc_TypeError, "on_new_thread must be callable");
        return NULL;
    }
    Factory *f = (Factory *)type->tp_alloc(type, 0);
    if (!f)
        return NULL;
    f->seen = PySet_New(NULL);
    if (!f->seen) {
        Py_DECREF(f);
        return NULL;
    }
    f->vectorcall = factory_call;
    Py_INCREF(pending);
    f->pending = pending;
    Py_INCREF(on_new_thread);
    f->on_new_thread = on_new_thread;
    f->max_pending = max_pending;
    f->serial = next_serial++;
    return (PyObject *)f;
}

/* The writer's bound method is held here and the writer holds the factory: a cycle to collect. */
static int factory_traverse(Factory *f, visitproc visit, void *arg) {
    Py_VISIT(f->pending);
    Py_VISIT(f->on_new_thread);
    Py_VISIT(f->seen);
    return 0;
}

static int factory_clear(Factory *f) {
    Py_CLEAR(f->pending);
    Py_CLEAR(f->on_new_thread);
    Py_CLEAR(f->seen);
    return 0;
}

static void factory_dealloc(Factory *f) {
    PyObject_GC_UnTrack(f);
    factory_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyMemberDef factory_members[] = {
    {"pending", T_OBJECT, offsetof(Factory, pending), READONLY, "the list events go to"},
    {"on_new_thread", T_OBJECT, offsetof(Factory, on_new_thread), READONLY,
     "called with a thread's id the first time the thread closes a span of this factory"},
    {"max_pending", T_PYSSIZET, offsetof(Factory, max_pending), 0,
     "beyond this many pending events a span is counted in `dropped` instead of stored"},
    {"dropped", T_PYSSIZET, offsetof(Factory, dropped), 0, "events not stored: pending was full"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FactoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mmscope.tracing._chrome_format.ChromeSpanFactory",
    .tp_doc = "ChromeSpanFactory(pending, on_new_thread, max_pending=sys.maxsize): "
              "factory(name) is a context manager that appends (name, t0_ns, t1_ns, tid) to "
              "`pending` as it exits (time.perf_counter_ns's clock, the native thread id); "
              "factory.mark(name) appends (name, t, t, tid) at once.",
    .tp_basicsize = sizeof(Factory),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Factory, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = factory_new,
    .tp_traverse = (traverseproc)factory_traverse,
    .tp_clear = (inquiry)factory_clear,
    .tp_dealloc = (destructor)factory_dealloc,
    .tp_members = factory_members,
    .tp_methods = factory_methods,
};

static int add_span_method(const char *attr, int exit) {
    SpanMethod *m = PyObject_New(SpanMethod, &SpanMethodType);
    if (!m)
        return -1;
    m->exit = exit;
    int rc = PyDict_SetItemString(SpanType.tp_dict, attr, (PyObject *)m);
    Py_DECREF(m);
    return rc;
}

static int add_spans(PyObject *mod) {
    static int atfork_done;
    if (PyType_Ready(&SpanMethodType) < 0 || PyType_Ready(&SpanType) < 0 ||
        PyType_Ready(&FactoryType) < 0)
        return -1;
    if (add_span_method("__enter__", 0) < 0 || add_span_method("__exit__", 1) < 0)
        return -1;
    PyType_Modified(&SpanType);
    if (!atfork_done && pthread_atfork(NULL, NULL, forget_thread) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
        return -1;
    }
    atfork_done = 1;
    Py_INCREF(&FactoryType);
    if (PyModule_AddObject(mod, "ChromeSpanFactory", (PyObject *)&FactoryType) < 0) {
        Py_DECREF(&FactoryType);
        return -1;
    }
    Py_INCREF(&SpanType);
    if (PyModule_AddObject(mod, "ChromeSpan", (PyObject *)&SpanType) < 0) {
        Py_DECREF(&SpanType);
        return -1;
    }
    return 0;
}
#endif /* HAVE_SPANS */

static PyMethodDef methods[] = {
    {"format_events", format_events, METH_VARARGS,
     "format_events(events, quoted, pid) -> bytes: Chrome trace X events, one JSON line each"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chrome_format", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chrome_format(void) {
    PyObject *mod = PyModule_Create(&module);
#ifdef HAVE_SPANS
    if (mod && add_spans(mod) < 0)
        Py_CLEAR(mod);
#endif
    return mod;
}
