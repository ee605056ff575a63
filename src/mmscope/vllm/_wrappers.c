/* The mechanics of mmscope's hook wrappers in C: call vLLM's original, then (or before) our observer.
 *
 * In vLLM's step loop every Python frame a wrapper adds runs with cold caches (after each forward)
 * and costs microseconds; these wrappers pass the caller's arguments straight through with
 * vectorcall, bind like Python functions (no bound-method object per call), and call the Python
 * observer only when its hook is enabled. patching.py keeps equivalent Python closures as the
 * fallback and the reference: same calls, same exception rules (an Exception raised by the observer
 * turns the hook off through state.failed(exc); vLLM's own exceptions pass through untouched).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <time.h>

#if PY_VERSION_HEX >= 0x030D0000
#define _PyObject_LookupAttr PyObject_GetOptionalAttr
#endif

/* AFTER/BEFORE: observe(result, *args) after, or observe(*args) before, the original.
 * TIMED: the original timed whole, then observe(name, ns) (a stage collector's record).
 * TIMED_BY_ITEM: TIMED for MultiModalHasher.hash_kwargs(cls, algorithm, **kwargs), named by the
 *   type of the one keyword argument not in `not_items` (name: dict type -> range name); any other
 *   call (several items, a type not yet named) takes `slow`, the Python wrapper, which names it.
 * RANGED_CM: the original returns a context manager; it is handed back inside a TimedCM that
 *   times the block and calls observe(names[args[1]], ns) on exit. With `noop_unless` (an
 *   attribute name), the original is not called while args[0].<noop_unless> is false: its context
 *   manager is then a no-op (vLLM's TimingContext.record with timing off), and the TimedCM stands
 *   in for it alone instead of nesting a second context manager inside.
 * While tracing is on (`switch.on`), TIMED and RANGED_CM also open a span from tracing's current
 * factory (`switch._span_factory`); RANGED_CM hands a stage not yet in `names` to `slow` (the
 * Python wrapper, which names it). */
enum {
    MODE_AFTER = 0, MODE_BEFORE = 1, MODE_TIMED = 2, MODE_RANGED_CM = 3, MODE_TIMED_BY_ITEM = 4
};

/* One clause of a hook's `when` guard (patching.py documents the forms): the observer runs when
 * any clause holds, so quiet steps cost no Python call at all. */
typedef struct {
    int source;       /* -1: the result; i >= 0: the i-th positional argument */
    PyObject *kwname; /* source's parameter name, for a call that passes it by keyword; or NULL */
    PyObject *via;    /* read the attributes of source.via instead; NULL: of source itself */
    PyObject *attrs;  /* tuple of interned attribute names; NULL for a timer clause */
    int want_any;     /* 1: some attribute truthy; 0: every attribute falsy (or missing) */
    double every;     /* a timer clause: at least this many seconds since it last held */
    double last;
} Clause;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original;
    PyObject *observe; /* AFTER: observe(result, *args); BEFORE: observe(*args) */
    PyObject *state;   /* HookState: .enabled, .failed(exc) */
    PyObject *dict;    /* functools.wraps writes __name__, __wrapped__, ... here */
    int mode;
    Py_ssize_t nclauses;
    Clause *clauses;
    PyObject *name;   /* TIMED: the stage name; RANGED_CM: dict vLLM stage -> range name;
                         TIMED_BY_ITEM: dict item type -> range name */
    PyObject *slow;   /* RANGED_CM, TIMED_BY_ITEM: the Python wrapper, for a call C cannot name */
    PyObject *not_items; /* TIMED_BY_ITEM: a frozenset of keyword names that are not items */
    PyObject *switch_;/* an object whose `on` says whether tracing is on */
    PyObject *store;  /* TIMED, RANGED_CM: the collector's live dict stage -> [ns]; optional */
    Py_ssize_t limit; /* the bound per stage: at it, `observe` (record) decides (and counts) */
    PyObject *noop_unless; /* RANGED_CM: args[0]'s attribute that, false, makes the original a
                              no-op; NULL: always call it */
} Wrapper;

/* A context manager timed in C: vLLM's processor-stage block, once per stage per request. */
typedef struct {
    PyObject_HEAD
    PyObject *inner; /* vLLM's context manager, or NULL where it would be a no-op */
    PyObject *name;
    PyObject *span;  /* the tracing span around the block, or NULL while tracing is off */
    PyObject *owner; /* the Wrapper: its observe records, its state turns off on our error */
    long long t0;
    int entered;
} TimedCM;

static PyObject *s_on, *s_enter, *s_exit, *s_span_factory;
static PyObject *s_enabled, *s_failed, *s_inc, *s_lock, *s_value, *s_acquire, *s_release;

static int state_enabled(Wrapper *w) {
    PyObject *v = PyObject_GetAttr(w->state, s_enabled);
    if (v == NULL) {
        PyErr_Clear();
        return 0;
    }
    int on = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (on < 0) {
        PyErr_Clear();
        return 0;
    }
    return on;
}

/* An exception raised by our own code: an Exception turns the hook off and is swallowed;
 * anything else (KeyboardInterrupt, SystemExit) propagates, as in the Python wrappers.
 * Returns 0 when swallowed, -1 when the error must propagate. */
static int our_error(Wrapper *w) {
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *r = PyObject_CallMethodOneArg(w->state, s_failed, value ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (r == NULL)
        PyErr_Clear(); /* failed() itself failing must not reach vLLM either */
    Py_XDECREF(r);
    return 0;
}


static double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Truthiness of obj.attr; a missing attribute, or one whose truth cannot be told, is false
 * (-1 only for "cannot tell", which makes the guard pass: the observer decides then). */
static int attr_truth(PyObject *obj, PyObject *name) {
    PyObject *v;
    int found = _PyObject_LookupAttr(obj, name, &v);
    if (found <= 0) {
        if (found < 0)
            PyErr_Clear();
        return found;
    }
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (t < 0)
        PyErr_Clear();
    return t;
}

/* The argument a clause reads: positional, else passed by keyword under the clause's name, else
 * (named but omitted) None, as a default would be; NULL: an unnamed source the call lacks. */
static PyObject *clause_arg(Clause *c, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames) {
    if (c->source < nargs)
        return args[c->source];
    if (c->kwname == NULL)
        return NULL;
    if (kwnames == NULL)
        return Py_None;
    Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t j = 0; j < nkw; j++) { /* call sites' names are interned: pointers first */
        if (PyTuple_GET_ITEM(kwnames, j) == c->kwname)
            return args[nargs + j];
    }
    for (Py_ssize_t j = 0; j < nkw; j++) {
        if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, j), c->kwname) == 0)
            return args[nargs + j];
    }
    return Py_None;
}

static int guard_passes(Wrapper *w, PyObject *result, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames) {
    if (w->nclauses == 0)
        return 1;
    for (Py_ssize_t i = 0; i < w->nclauses; i++) {
        Clause *c = &w->clauses[i];
        if (c->attrs == NULL) {
            double now = monotonic_s();
            if (now - c->last >= c->every) {
                c->last = now;
                return 1;
            }
            continue;
        }
        PyObject *obj = c->source < 0 ? result : clause_arg(c, args, nargs, kwnames);
        if (obj == NULL)
            return 1; /* called in an unusual way: the observer decides */
        PyObject *owner = NULL; /* source.via, while read */
        if (c->via != NULL) {
            int found = _PyObject_LookupAttr(obj, c->via, &owner);
            if (found < 0) {
                PyErr_Clear();
                return 1;
            }
            if (found == 0) { /* no such object: each of its attributes counts as missing */
                if (!c->want_any)
                    return 1;
                continue;
            }
            obj = owner;
        }
        Py_ssize_t n = PyTuple_GET_SIZE(c->attrs);
        int holds = !c->want_any;
        if (n == 0) { /* truthy/falsy: the object's own truth */
            int t = PyObject_IsTrue(obj);
            if (t < 0)
                PyErr_Clear();
            holds = t < 0 || (c->want_any ? t : !t);
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            int t = attr_truth(obj, PyTuple_GET_ITEM(c->attrs, k));
            if (t < 0) {
                holds = 1;
                break;
            }
            if (c->want_any && t) {
                holds = 1;
                break;
            }
            if (!c->want_any && t) {
                holds = 0;
                break;
            }
        }
        Py_XDECREF(owner);
        if (holds)
            return 1;
    }
    return 0;
}

static void free_clauses(Wrapper *w) {
    for (Py_ssize_t i = 0; i < w->nclauses; i++) {
        Py_CLEAR(w->clauses[i].attrs);
        Py_CLEAR(w->clauses[i].via);
        Py_CLEAR(w->clauses[i].kwname);
    }
    PyMem_Free(w->clauses);
    w->clauses = NULL;
    w->nclauses = 0;
}

/* `when`: a tuple of clauses, each (source, (attr, ...), want_any[, via[, name]]) or
 * (seconds,); with no attributes, the clause reads the truth of source (or source.via) itself;
 * name: source's parameter name, for calls that pass it by keyword. */
static int parse_clauses(Wrapper *w, PyObject *when) {
    if (when == NULL || when == Py_None)
        return 0;
    if (!PyTuple_Check(when)) {
        PyErr_SetString(PyExc_TypeError, "when must be a tuple of clauses");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(when);
    w->clauses = PyMem_Calloc(n ? n : 1, sizeof(Clause));
    if (w->clauses == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PyTuple_GET_ITEM(when, i);
        Clause *out = &w->clauses[i];
        w->nclauses = i + 1;
        if (PyTuple_Check(c) && PyTuple_GET_SIZE(c) == 1) {
            out->every = PyFloat_AsDouble(PyTuple_GET_ITEM(c, 0));
            out->last = -1e300;
            if (out->every < 0 && PyErr_Occurred())
                return -1;
            continue;
        }
        PyObject *attrs, *via = Py_None, *kwname = Py_None;
        int source, want_any;
        if (!PyTuple_Check(c) || !PyArg_ParseTuple(c, "iO!p|OO", &source, &PyTuple_Type, &attrs,
                                                   &want_any, &via, &kwname)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a clause is (source, attrs, want_any[, via[, "
                                "name]]) or (seconds,)");
            return -1;
        }
        if ((via != Py_None && !PyUnicode_Check(via)) ||
            (kwname != Py_None && !PyUnicode_Check(kwname))) {
            PyErr_SetString(PyExc_TypeError, "via and name must be str or None");
            return -1;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(attrs); k++) {
            if (!PyUnicode_Check(PyTuple_GET_ITEM(attrs, k))) {
                PyErr_SetString(PyExc_TypeError, "attribute names must be str");
                return -1;
            }
        }
        Py_INCREF(attrs);
        out->attrs = attrs;
        if (via != Py_None) {
            Py_INCREF(via);
            out->via = via;
        }
        if (kwname != Py_None) {
            Py_INCREF(kwname);
            PyUnicode_InternInPlace(&kwname);
            out->kwname = kwname;
        }
        out->source = source;
        out->want_any = want_any;
    }
    return 0;
}

/* observe(first, *args, **kw) with `first` prepended when not NULL. */
static PyObject *call_observer(Wrapper *w, PyObject *first, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (first == NULL)
        return PyObject_Vectorcall(w->observe, args, nargs, kwnames);
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[10];
    PyObject **buf = total + 1 <= 10 ? small : PyMem_Malloc((total + 1) * sizeof(PyObject *));
    if (buf == NULL)
        return PyErr_NoMemory();
    buf[0] = first;
    for (Py_ssize_t i = 0; i < total; i++)
        buf[i + 1] = args[i];
    PyObject *r = PyObject_Vectorcall(w->observe, buf, nargs + 1, kwnames);
    if (buf != small)
        PyMem_Free(buf);
    return r;
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.perf_counter_ns's clock on Linux */
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A new span for `name` from tracing's current span factory (switch._span_factory), or NULL with
 * no error set while tracing is off. With an error set (our failure) it returns NULL too. */
static PyObject *new_span(Wrapper *w, PyObject *name) {
    if (w->switch_ == NULL || attr_truth(w->switch_, s_on) == 0)
        return NULL;
    PyObject *factory = PyObject_GetAttr(w->switch_, s_span_factory);
    if (factory == NULL)
        return NULL;
    PyObject *span = PyObject_CallOneArg(factory, name);
    Py_DECREF(factory);
    return span;
}

static int span_enter(PyObject *span) {
    PyObject *r = PyObject_CallMethodNoArgs(span, s_enter);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* callable(*argv), or argv[0].method(*argv[1:]) when `method` is given, with any exception
 * already set (vLLM's) kept in place and winning: returns -1, with the call's own exception set,
 * only when there was none before. */
static int call_keeping_error(PyObject *callable, PyObject *method, PyObject *const *argv,
                              size_t nargs) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = method ? PyObject_VectorcallMethod(method, argv, nargs, NULL)
                         : PyObject_Vectorcall(callable, argv, nargs, NULL);
    int ok = r != NULL;
    Py_XDECREF(r);
    if (type == NULL)
        return ok ? 0 : -1;
    if (!ok)
        PyErr_Clear();
    PyErr_Restore(type, value, tb);
    return 0;
}

/* span.__exit__(None, None, None) */
static int span_exit(PyObject *span) {
    PyObject *argv[4] = {span, Py_None, Py_None, Py_None};
    return call_keeping_error(NULL, s_exit, argv, 4);
}

/* record(name, ns) */
static int call_record(PyObject *record, PyObject *name, long long ns) {
    PyObject *n = PyLong_FromLongLong(ns);
    if (n == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *argv[2] = {name, n};
    int rc = call_keeping_error(record, NULL, argv, 2);
    Py_DECREF(n);
    return rc;
}

/* The duration into the collector: appended to its live list in C, or record(name, ns) (Python)
 * when there is no store or the stage is at its bound. Keeps an exception already set in place. */
static int store_duration(Wrapper *w, PyObject *name, long long ns) {
    if (w->store == NULL || PyErr_Occurred())
        return call_record(w->observe, name, ns);
    PyObject *bucket = PyDict_GetItemWithError(w->store, name); /* borrowed */
    if (bucket == NULL) {
        if (PyErr_Occurred())
            return -1;
        bucket = PyList_New(0);
        if (bucket == NULL)
            return -1;
        int rc = PyDict_SetItem(w->store, name, bucket);
        Py_DECREF(bucket); /* the dict holds it */
        if (rc < 0)
            return -1;
    }
    if (!PyList_Check(bucket) || PyList_GET_SIZE(bucket) >= w->limit)
        return call_record(w->observe, name, ns);
    PyObject *n = PyLong_FromLongLong(ns);
    if (n == NULL)
        return -1;
    int rc = PyList_Append(bucket, n);
    Py_DECREF(n);
    return rc;
}

/* The original timed whole as stage `name` (a span around it while tracing). */
static PyObject *timed_run(Wrapper *w, PyObject *name, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    PyObject *span = new_span(w, name);
    if (span == NULL && PyErr_Occurred()) {
        if (our_error(w) < 0)
            return NULL;
    } else if (span != NULL && span_enter(span) < 0) {
        Py_CLEAR(span);
        if (our_error(w) < 0)
            return NULL;
    }
    long long t0 = now_ns();
    PyObject *result = PyObject_Vectorcall(w->original, args, nargsf, kwnames);
    long long elapsed = now_ns() - t0;
    int failed = span != NULL && span_exit(span) < 0;
    Py_XDECREF(span);
    failed = failed || store_duration(w, name, elapsed) < 0;
    if (failed && our_error(w) < 0) {
        Py_XDECREF(result);
        return NULL;
    }
    return result;
}

static PyObject *timed_call(Wrapper *w, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (!state_enabled(w))
        return PyObject_Vectorcall(w->original, args, nargsf, kwnames);
    return timed_run(w, w->name, args, nargsf, kwnames);
}

/* The range name for this call's one item, borrowed; NULL (no error set) for `slow` to decide. */
static PyObject *item_name(Wrapper *w, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames) {
    PyObject *item = NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        int skip = PySet_Contains(w->not_items, PyTuple_GET_ITEM(kwnames, i));
        if (skip < 0 || (!skip && item != NULL)) { /* several items: "mixed", in Python */
            PyErr_Clear();
            return NULL;
        }
        if (!skip)
            item = args[nargs + i];
    }
    PyObject *name = item ? PyDict_GetItemWithError(w->name, (PyObject *)Py_TYPE(item)) : NULL;
    if (name == NULL)
        PyErr_Clear();
    return name;
}

static PyObject *timed_by_item_call(Wrapper *w, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames) {
    if (!state_enabled(w))
        return PyObject_Vectorcall(w->original, args, nargsf, kwnames);
    PyObject *name = item_name(w, args, PyVectorcall_NARGS(nargsf), kwnames);
    if (name == NULL)
        return PyObject_Vectorcall(w->slow, args, nargsf, kwnames);
    Py_INCREF(name); /* the Python road may rebind the dict's entries meanwhile */
    PyObject *result = timed_run(w, name, args, nargsf, kwnames);
    Py_DECREF(name);
    return result;
}

static PyTypeObject TimedCMType;

/* Whether `self.<noop_unless>` is false, so that the original would hand back a context manager
 * that does nothing; any doubt (no such attribute, a failing truth test) calls the original. */
static int original_is_noop(Wrapper *w, PyObject *self) {
    if (w->noop_unless == NULL)
        return 0;
    PyObject *v;
    if (_PyObject_LookupAttr(self, w->noop_unless, &v) <= 0) {
        PyErr_Clear();
        return 0;
    }
    int on = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (on < 0)
        PyErr_Clear();
    return on == 0;
}

static PyObject *ranged_cm_call(Wrapper *w, PyObject *const *args, size_t nargsf,
                                PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!state_enabled(w))
        return PyObject_Vectorcall(w->original, args, nargsf, kwnames);
    PyObject *name = nargs >= 2 ? PyDict_GetItemWithError(w->name, args[1]) : NULL;
    if (name == NULL) {
        if (PyErr_Occurred()) /* an unhashable stage: the Python road decides */
            PyErr_Clear();
        return PyObject_Vectorcall(w->slow, args, nargsf, kwnames);
    }
    PyObject *inner = NULL;
    if (!original_is_noop(w, args[0])) {
        inner = PyObject_Vectorcall(w->original, args, nargsf, kwnames);
        if (inner == NULL)
            return NULL;
    }
    PyObject *span = new_span(w, name);
    if (span == NULL && PyErr_Occurred() && our_error(w) < 0) {
        Py_XDECREF(inner);
        return NULL;
    }
    TimedCM *cm = PyObject_New(TimedCM, &TimedCMType);
    if (cm == NULL) {
        PyErr_Clear(); /* no wrapper then: vLLM's context manager as it is */
        Py_XDECREF(span);
        return inner ? inner : PyObject_Vectorcall(w->original, args, nargsf, kwnames);
    }
    cm->inner = inner;
    Py_INCREF(name);
    cm->name = name;
    cm->span = span;
    Py_INCREF(w);
    cm->owner = (PyObject *)w;
    cm->t0 = 0;
    cm->entered = 0;
    return (PyObject *)cm;
}

/* Record the block's time and close its span; our own failure turns the hook off and is
 * swallowed (an interrupt propagates). */
static int timedcm_record(TimedCM *cm) {
    Wrapper *w = (Wrapper *)cm->owner;
    long long elapsed = now_ns() - cm->t0;
    cm->entered = 0;
    int failed = cm->span != NULL && span_exit(cm->span) < 0;
    failed = failed || store_duration(w, cm->name, elapsed) < 0;
    return failed ? our_error(w) : 0;
}

static PyObject *timedcm_enter(TimedCM *cm, PyObject *noargs) {
    (void)noargs;
    if (cm->span != NULL && span_enter(cm->span) < 0) {
        Py_CLEAR(cm->span);
        if (our_error((Wrapper *)cm->owner) < 0)
            return NULL;
    }
    cm->t0 = now_ns();
    cm->entered = 1;
    if (cm->inner == NULL)
        Py_RETURN_NONE; /* what vLLM's no-op block yields */
    PyObject *r = PyObject_CallMethodNoArgs(cm->inner, s_enter);
    if (r == NULL)
        timedcm_record(cm); /* vLLM's exception stays the one raised */
    return r;
}

static PyObject *timedcm_exit(TimedCM *cm, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *argv[4] = {cm->inner, Py_None, Py_None, Py_None};
    for (Py_ssize_t i = 0; i < nargs && i < 3; i++)
        argv[i + 1] = args[i];
    PyObject *r; /* a no-op's exit: False, the block's exception propagates */
    if (cm->inner == NULL) {
        r = Py_False;
        Py_INCREF(r);
    } else {
        r = PyObject_VectorcallMethod(s_exit, argv, 4, NULL);
    }
    if (cm->entered && timedcm_record(cm) < 0) {
        Py_XDECREF(r);
        return NULL;
    }
    return r;
}

static void timedcm_dealloc(TimedCM *cm) {
    Py_XDECREF(cm->inner);
    Py_XDECREF(cm->name);
    Py_XDECREF(cm->span);
    Py_XDECREF(cm->owner);
    PyObject_Free(cm);
}

static PyMethodDef timedcm_methods[] = {
    {"__enter__", (PyCFunction)timedcm_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))timedcm_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TimedCMType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mmscope.vllm._wrappers.TimedCM",
    .tp_doc = "vLLM's context manager, timed: record(name, ns) on exit.",
    .tp_basicsize = sizeof(TimedCM),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)timedcm_dealloc,
    .tp_methods = timedcm_methods,
};

static PyObject *wrapper_call(PyObject *self, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames) {
    Wrapper *w = (Wrapper *)self;
    if (w->mode == MODE_TIMED)
        return timed_call(w, args, nargsf, kwnames);
    if (w->mode == MODE_TIMED_BY_ITEM)
        return timed_by_item_call(w, args, nargsf, kwnames);
    if (w->mode == MODE_RANGED_CM)
        return ranged_cm_call(w, args, nargsf, kwnames);
    if (w->mode == MODE_AFTER) {
        PyObject *result = PyObject_Vectorcall(w->original, args, nargsf, kwnames);
        if (result == NULL ||
            !guard_passes(w, result, args, PyVectorcall_NARGS(nargsf), kwnames) ||
            !state_enabled(w))
            return result;
        PyObject *r = call_observer(w, result, args, nargsf, kwnames);
        if (r == NULL && our_error(w) < 0) {
            Py_DECREF(result);
            return NULL;
        }
        Py_XDECREF(r);
        return result;
    }
    /* MODE_BEFORE */
    if (guard_passes(w, NULL, args, PyVectorcall_NARGS(nargsf), kwnames) && state_enabled(w)) {
        PyObject *r = call_observer(w, NULL, args, nargsf, kwnames);
        if (r == NULL && our_error(w) < 0)
            return NULL;
        Py_XDECREF(r);
    }
    return PyObject_Vectorcall(w->original, args, nargsf, kwnames);
}

static PyObject *wrapper_tp_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    return PyVectorcall_Call(self, args, kwargs);
}

/* Bind like a function: looked up on an instance, a bound method (LOAD_METHOD skips even that,
 * thanks to Py_TPFLAGS_METHOD_DESCRIPTOR). */
static PyObject *wrapper_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static int wrapper_traverse(Wrapper *w, visitproc visit, void *arg) {
    Py_VISIT(w->original);
    Py_VISIT(w->observe);
    Py_VISIT(w->state);
    Py_VISIT(w->dict);
    Py_VISIT(w->name);
    Py_VISIT(w->slow);
    Py_VISIT(w->not_items);
    Py_VISIT(w->switch_);
    Py_VISIT(w->store);
    Py_VISIT(w->noop_unless);
    return 0;
}

static int wrapper_clear(Wrapper *w) {
    Py_CLEAR(w->original);
    Py_CLEAR(w->observe);
    Py_CLEAR(w->state);
    Py_CLEAR(w->dict);
    Py_CLEAR(w->name);
    Py_CLEAR(w->slow);
    Py_CLEAR(w->not_items);
    Py_CLEAR(w->switch_);
    Py_CLEAR(w->store);
    Py_CLEAR(w->noop_unless);
    return 0;
}

static void wrapper_dealloc(Wrapper *w) {
    PyObject_GC_UnTrack(w);
    wrapper_clear(w);
    free_clauses(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyObject *wrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *original, *observe, *state, *when = NULL, *name = NULL, *slow = NULL,
             *switch_ = NULL, *store = NULL, *not_items = NULL, *noop_unless = NULL;
    Py_ssize_t limit = PY_SSIZE_T_MAX;
    int mode;
    static char *kw[] = {"original", "observe", "state", "mode", "when", "name", "slow", "switch",
                         "store", "limit", "not_items", "noop_unless", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOi|OOOOO!nO!U", kw, &original, &observe,
                                     &state, &mode, &when, &name, &slow, &switch_, &PyDict_Type,
                                     &store, &limit, &PyFrozenSet_Type, &not_items, &noop_unless))
        return NULL;
    if (mode < MODE_AFTER || mode > MODE_TIMED_BY_ITEM) {
        PyErr_SetString(PyExc_ValueError, "unknown mode");
        return NULL;
    }
    if ((mode == MODE_TIMED && name == NULL) ||
        (mode == MODE_RANGED_CM && (name == NULL || !PyDict_Check(name) || slow == NULL ||
                                    !PyCallable_Check(slow)))) {
        PyErr_SetString(PyExc_TypeError, "TIMED needs a name; RANGED_CM a dict of names and slow");
        return NULL;
    }
    if (mode == MODE_TIMED_BY_ITEM && (name == NULL || !PyDict_Check(name) || slow == NULL ||
                                       !PyCallable_Check(slow) || not_items == NULL)) {
        PyErr_SetString(PyExc_TypeError, "TIMED_BY_ITEM needs a dict of names, slow, not_items");
        return NULL;
    }
    if (!PyCallable_Check(original) || !PyCallable_Check(observe)) {
        PyErr_SetString(PyExc_TypeError, "original and observe must be callable");
        return NULL;
    }
    Wrapper *w = (Wrapper *)type->tp_alloc(type, 0);
    if (w == NULL)
        return NULL;
    w->vectorcall = wrapper_call;
    Py_INCREF(original);
    w->original = original;
    Py_INCREF(observe);
    w->observe = observe;
    Py_INCREF(state);
    w->state = state;
    w->mode = mode;
    Py_XINCREF(name);
    w->name = name;
    Py_XINCREF(slow);
    w->slow = slow;
    Py_XINCREF(not_items);
    w->not_items = not_items;
    w->switch_ = switch_ == Py_None ? NULL : switch_;
    Py_XINCREF(w->switch_);
    Py_XINCREF(store);
    w->store = store;
    w->limit = limit;
    if (noop_unless != NULL) {
        Py_INCREF(noop_unless);
        PyUnicode_InternInPlace(&noop_unless);
        w->noop_unless = noop_unless;
    }
    if (parse_clauses(w, when) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
}

static PyMemberDef wrapper_members[] = {
    {"mode", T_INT, offsetof(Wrapper, mode), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef wrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject WrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mmscope.vllm._wrappers.Wrapper",
    .tp_doc = "A hook wrapper: vLLM's original plus mmscope's observer (see patching.py).",
    .tp_basicsize = sizeof(Wrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = wrapper_new,
    .tp_dealloc = (destructor)wrapper_dealloc,
    .tp_traverse = (traverseproc)wrapper_traverse,
    .tp_clear = (inquiry)wrapper_clear,
    .tp_call = wrapper_tp_call,
    .tp_vectorcall_offset = offsetof(Wrapper, vectorcall),
    .tp_descr_get = wrapper_get,
    .tp_dictoffset = offsetof(Wrapper, dict),
    .tp_members = wrapper_members,
    .tp_getset = wrapper_getset,
};

/* Add `amount` to one prometheus_client value: straight under its lock for a MutexValue (the
 * single-process value class: its inc is exactly this, one Python frame the less per bucket),
 * through .inc otherwise (e.g. the multiprocess MmapedValue). */
static int value_add(PyObject *value, PyObject *amount, PyObject *mutex_type) {
    if ((PyObject *)Py_TYPE(value) != mutex_type) {
        PyObject *r = PyObject_CallMethodOneArg(value, s_inc, amount);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    PyObject *lock = PyObject_GetAttr(value, s_lock);
    if (lock == NULL)
        return -1;
    PyObject *r = PyObject_CallMethodNoArgs(lock, s_acquire);
    int rc = -1;
    if (r != NULL) {
        Py_DECREF(r);
        PyObject *old = PyObject_GetAttr(value, s_value);
        PyObject *sum = old ? PyNumber_Add(old, amount) : NULL;
        rc = sum ? PyObject_SetAttr(value, s_value, sum) : -1;
        Py_XDECREF(sum);
        Py_XDECREF(old);
        PyObject *exc_type, *exc, *tb;
        PyErr_Fetch(&exc_type, &exc, &tb);
        r = PyObject_CallMethodNoArgs(lock, s_release);
        Py_XDECREF(r);
        if (exc_type != NULL)
            PyErr_Restore(exc_type, exc, tb);
        else if (r == NULL)
            rc = -1;
    }
    Py_DECREF(lock);
    return rc;
}

/* An int as a long long, saturated (the last threshold is 2**63, "+Inf" in nanoseconds). */
static int clamped_ll(PyObject *v, long long *out) {
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow)
        *out = overflow > 0 ? LLONG_MAX : LLONG_MIN;
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* observe_batch(durations_ns, thresholds_ns, buckets, total, mutex_type): Histogram.observe for
 * a batch of integer durations (stat_loggers.observe_many's fast path): the count per bucket by
 * bisect_left over the ascending thresholds, one add per bucket touched, one to the sum (in
 * seconds). Emission runs every second with cold caches; in Python it cost tens of us a stage. */
#define MAX_BUCKETS 64
static PyObject *observe_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5 || !PyList_Check(args[0]) || !PyTuple_Check(args[1]) ||
        !PyList_Check(args[2]) || PyTuple_GET_SIZE(args[1]) != PyList_GET_SIZE(args[2]) ||
        PyTuple_GET_SIZE(args[1]) > MAX_BUCKETS) {
        PyErr_SetString(PyExc_TypeError,
                        "observe_batch(durations list, thresholds tuple, buckets list of the same "
                        "length, total, mutex_type)");
        return NULL;
    }
    PyObject *durations = args[0], *thresholds = args[1], *buckets = args[2];
    Py_ssize_t nb = PyTuple_GET_SIZE(thresholds);
    long long bound[MAX_BUCKETS];
    Py_ssize_t count[MAX_BUCKETS] = {0};
    for (Py_ssize_t i = 0; i < nb; i++)
        if (clamped_ll(PyTuple_GET_ITEM(thresholds, i), &bound[i]) < 0)
            return NULL;
    long double total_ns = 0;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(durations); j++) {
        long long d;
        if (clamped_ll(PyList_GET_ITEM(durations, j), &d) < 0)
            return NULL;
        Py_ssize_t lo = 0, hi = nb; /* bisect_left: the first bound >= d */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (bound[mid] < d)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == nb) {
            PyErr_SetString(PyExc_ValueError, "a duration beyond the last threshold");
            return NULL;
        }
        count[lo]++;
        total_ns += d;
    }
    for (Py_ssize_t i = 0; i < nb; i++) {
        if (count[i] == 0)
            continue;
        PyObject *n = PyLong_FromSsize_t(count[i]);
        int rc = n ? value_add(PyList_GET_ITEM(buckets, i), n, args[4]) : -1;
        Py_XDECREF(n);
        if (rc < 0)
            return NULL;
    }
    PyObject *seconds = PyFloat_FromDouble((double)(total_ns / 1e9L));
    int rc = seconds ? value_add(args[3], seconds, args[4]) : -1;
    Py_XDECREF(seconds);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef module_functions[] = {
    {"observe_batch", (PyCFunction)(void (*)(void))observe_batch, METH_FASTCALL,
     "observe_batch(durations_ns, thresholds_ns, buckets, total, mutex_type): a histogram "
     "child's observe() for a batch of integer durations."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mmscope.vllm._wrappers",
    "mmscope's hook wrappers in C (patching.py holds the Python equivalents).", -1,
    module_functions,
};

PyMODINIT_FUNC PyInit__wrappers(void) {
    if (PyType_Ready(&WrapperType) < 0 || PyType_Ready(&TimedCMType) < 0)
        return NULL;
    if (!(s_on = PyUnicode_InternFromString("on")) ||
        !(s_enter = PyUnicode_InternFromString("__enter__")) ||
        !(s_exit = PyUnicode_InternFromString("__exit__")) ||
        !(s_span_factory = PyUnicode_InternFromString("_span_factory")))
        return NULL;
    if (!(s_enabled = PyUnicode_InternFromString("enabled")) ||
        !(s_failed = PyUnicode_InternFromString("failed")) ||
        !(s_inc = PyUnicode_InternFromString("inc")) ||
        !(s_lock = PyUnicode_InternFromString("_lock")) ||
        !(s_value = PyUnicode_InternFromString("_value")) ||
        !(s_acquire = PyUnicode_InternFromString("acquire")) ||
        !(s_release = PyUnicode_InternFromString("release")))
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&WrapperType);
    if (PyModule_AddObject(m, "Wrapper", (PyObject *)&WrapperType) < 0 ||
        PyModule_AddIntConstant(m, "AFTER", MODE_AFTER) < 0 ||
        PyModule_AddIntConstant(m, "BEFORE", MODE_BEFORE) < 0 ||
        PyModule_AddIntConstant(m, "TIMED", MODE_TIMED) < 0 ||
        PyModule_AddIntConstant(m, "RANGED_CM", MODE_RANGED_CM) < 0 ||
        PyModule_AddIntConstant(m, "TIMED_BY_ITEM", MODE_TIMED_BY_ITEM) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
