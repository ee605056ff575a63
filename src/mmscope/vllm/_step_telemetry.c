/* The worker's per-step telemetry observer in C: count the step, and only when the step_meta range
 * or the step_tokens line needs it, split the batch's tokens into prefill and decode.
 *
 * StepObserver(logger, first_rank, tracing, info_every, meta_format, log_format, fallback) is
 * called before GPUModelRunner._prepare_inputs as observer(runner, scheduler_output,
 * num_scheduled_tokens, ...), from the C hook wrapper. It does what telemetry.StepTelemetry's
 * next_step() and emit() do (they remain the reference and the fallback): the same counter, the
 * same levels, the same text. Every step used to run about ten Python frames here (12-30 us in
 * place, with the caches cold after the forward); this runs none unless a line is logged.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#if PY_VERSION_HEX >= 0x030D0000
#define _PyObject_LookupAttr PyObject_GetOptionalAttr
#endif

#define LEVEL_DEBUG 10
#define LEVEL_INFO 20

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    long long step;
    long long info_every;
    int emit_log;           /* -1: not known yet, first_rank() decides on the first step */
    PyObject *logger;       /* logging.Logger of the step_tokens line */
    PyObject *first_rank;   /* () -> bool: only the first tensor-parallel rank logs */
    PyObject *tracing;      /* the tracing module: `on`, and `_mark`, its cheapest mark() */
    PyObject *meta_format;  /* stages.STEP_META_FORMAT % (prefill, decode, total, reqs) */
    PyObject *log_format;   /* the step_tokens message, % (step, prefill, decode, total, reqs) */
    PyObject *fallback;     /* (runner, num_scheduled_tokens) -> StepShape, for unusual arrays */
} StepObserver;

typedef struct {
    long long prefill, decode, total, reqs;
} Shape;

static PyObject *s_on, *s_mark, *s_disabled, *s_cache, *s_is_enabled_for;
static PyObject *s_input_batch, *s_num_reqs, *s_num_computed, *s_num_prompt;
static PyObject *s_prefill, *s_decode, *s_total, *s_reqs;

/* Truth of obj.name, 0 when it is missing; -1 with an exception set when it cannot be told. */
static int attr_true(PyObject *obj, PyObject *name) {
    PyObject *v;
    int found = _PyObject_LookupAttr(obj, name, &v);
    if (found <= 0)
        return found;
    int truth = PyObject_IsTrue(v);
    Py_DECREF(v);
    return truth;
}

/* logging.Logger.isEnabledFor(level) without its Python frame: logging keeps the answer per level
 * in the logger's `_cache`, and clears every logger's cache whenever a level changes; on a miss
 * (or a logging without that cache) isEnabledFor itself is asked, which fills it. */
static int logger_enabled(StepObserver *o, int level) {
    int disabled = attr_true(o->logger, s_disabled);
    if (disabled != 0)
        return disabled < 0 ? -1 : 0;
    PyObject *key = PyLong_FromLong(level);
    if (key == NULL)
        return -1;
    PyObject *cache;
    int found = _PyObject_LookupAttr(o->logger, s_cache, &cache);
    if (found > 0 && PyDict_CheckExact(cache)) {
        PyObject *known = PyDict_GetItemWithError(cache, key); /* borrowed */
        if (known != NULL) {
            int truth = PyObject_IsTrue(known);
            Py_DECREF(cache);
            Py_DECREF(key);
            return truth;
        }
    }
    Py_XDECREF(cache);
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    }
    PyObject *answer = PyObject_CallMethodOneArg(o->logger, s_is_enabled_for, key);
    Py_DECREF(key);
    if (answer == NULL)
        return -1;
    int truth = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return truth;
}

/* A 1-D buffer of 32- or 64-bit native signed ints, as vLLM's numpy arrays are. */
typedef struct {
    Py_buffer view;
    int ok;
} Ints;

static int ints_open(Ints *a, PyObject *obj) {
    a->ok = 0;
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = a->view.format ? a->view.format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    int plain = (f[0] == 'i' || f[0] == 'l' || f[0] == 'q') && f[1] == '\0';
    if (a->view.ndim != 1 || !plain || (a->view.itemsize != 4 && a->view.itemsize != 8)) {
        PyBuffer_Release(&a->view);
        return 0;
    }
    a->ok = 1;
    return 1;
}

static inline long long ints_at(Ints *a, Py_ssize_t i) {
    const char *p = (const char *)a->view.buf + i * a->view.strides[0];
    return a->view.itemsize == 4 ? (long long)*(const int32_t *)p : (long long)*(const int64_t *)p;
}

static void ints_close(Ints *a) {
    if (a->ok)
        PyBuffer_Release(&a->view);
    a->ok = 0;
}

/* telemetry.split_prefill_decode over the batch's first num_reqs rows, as batch_shape() slices
 * them. 1 when done, 0 when the arrays are not plain ints (the fallback decides), -1 on error. */
static int shape_in_c(PyObject *runner, PyObject *scheduled_obj, Shape *out) {
    PyObject *batch = PyObject_GetAttr(runner, s_input_batch);
    if (batch == NULL)
        return -1;
    int rc = -1;
    PyObject *n_obj = NULL, *computed_obj = NULL, *prompt_obj = NULL;
    Ints s = {0}, c = {0}, p = {0};
    if (!(n_obj = PyObject_GetAttr(batch, s_num_reqs)) ||
        !(computed_obj = PyObject_GetAttr(batch, s_num_computed)) ||
        !(prompt_obj = PyObject_GetAttr(batch, s_num_prompt)))
        goto done;
    Py_ssize_t n = PyLong_AsSsize_t(n_obj);
    if (n == -1 && PyErr_Occurred())
        goto done;
    rc = 0;
    if (n < 0 || !ints_open(&s, scheduled_obj) || !ints_open(&c, computed_obj) ||
        !ints_open(&p, prompt_obj))
        goto done;
    /* Python's slices stop at the array's end and zip stops at the shortest. */
    Py_ssize_t reqs = n < s.view.shape[0] ? n : s.view.shape[0];
    Py_ssize_t rows = reqs;
    if (c.view.shape[0] < rows)
        rows = c.view.shape[0];
    if (p.view.shape[0] < rows)
        rows = p.view.shape[0];
    long long total = 0, prefill = 0;
    for (Py_ssize_t i = 0; i < reqs; i++)
        total += ints_at(&s, i);
    for (Py_ssize_t i = 0; i < rows; i++)
        if (ints_at(&c, i) < ints_at(&p, i))
            prefill += ints_at(&s, i);
    out->prefill = prefill;
    out->decode = total - prefill;
    out->total = total;
    out->reqs = reqs;
    rc = 1;
done:
    ints_close(&s);
    ints_close(&c);
    ints_close(&p);
    Py_XDECREF(n_obj);
    Py_XDECREF(computed_obj);
    Py_XDECREF(prompt_obj);
    Py_DECREF(batch);
    return rc;
}

static int long_attr(PyObject *obj, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int shape_of(StepObserver *o, PyObject *runner, PyObject *scheduled, Shape *out) {
    int rc = shape_in_c(runner, scheduled, out);
    if (rc != 0)
        return rc < 0 ? -1 : 0;
    PyObject *shape = PyObject_CallFunctionObjArgs(o->fallback, runner, scheduled, NULL);
    if (shape == NULL)
        return -1;
    rc = (long_attr(shape, s_prefill, &out->prefill) < 0 ||
          long_attr(shape, s_decode, &out->decode) < 0 ||
          long_attr(shape, s_total, &out->total) < 0 ||
          long_attr(shape, s_reqs, &out->reqs) < 0) ? -1 : 0;
    Py_DECREF(shape);
    return rc;
}

/* The step_meta range: its name formatted with stages.STEP_META_FORMAT, marked through tracing. */
static PyObject *mark_step(StepObserver *o, Shape *sh) {
    PyObject *values = Py_BuildValue("(LLLL)", sh->prefill, sh->decode, sh->total, sh->reqs);
    if (values == NULL)
        return NULL;
    PyObject *name = PyUnicode_Format(o->meta_format, values);
    Py_DECREF(values);
    PyObject *mark = name ? PyObject_GetAttr(o->tracing, s_mark) : NULL;
    PyObject *r = mark ? PyObject_CallOneArg(mark, name) : NULL;
    Py_XDECREF(mark);
    Py_XDECREF(name);
    return r;
}

static PyObject *log_step(StepObserver *o, int level, Shape *sh) {
    return PyObject_CallMethod(o->logger, "log", "iOLLLLL", level, o->log_format, o->step,
                               sh->prefill, sh->decode, sh->total, sh->reqs);
}

static PyObject *observer_call(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    StepObserver *o = (StepObserver *)self;
    (void)kwnames;
    if (PyVectorcall_NARGS(nargsf) < 3) {
        PyErr_SetString(PyExc_TypeError,
                        "a step observer is called as (runner, scheduler_output, "
                        "num_scheduled_tokens, ...)");
        return NULL;
    }
    o->step++;
    int level = o->step % o->info_every == 0 ? LEVEL_INFO : LEVEL_DEBUG;
    if (o->emit_log < 0) {
        PyObject *first = PyObject_CallNoArgs(o->first_rank);
        if (first == NULL)
            return NULL;
        o->emit_log = PyObject_IsTrue(first);
        Py_DECREF(first);
        if (o->emit_log < 0)
            return NULL;
    }
    int log = o->emit_log ? logger_enabled(o, level) : 0;
    int trace = attr_true(o->tracing, s_on);
    if (log < 0 || trace < 0)
        return NULL;
    if (!log && !trace)
        Py_RETURN_NONE;
    Shape sh;
    if (shape_of(o, args[0], args[2], &sh) < 0)
        return NULL;
    if (trace) {
        PyObject *r = mark_step(o, &sh);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    if (log) {
        PyObject *r = log_step(o, level, &sh);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

static PyObject *observer_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"logger", "first_rank", "tracing", "info_every", "meta_format",
                            "log_format", "fallback", NULL};
    PyObject *logger, *first_rank, *tracing, *meta_format, *log_format, *fallback;
    long long info_every;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOLUUO", names, &logger, &first_rank, &tracing,
                                     &info_every, &meta_format, &log_format, &fallback))
        return NULL;
    if (info_every < 1 || !PyCallable_Check(first_rank) || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_ValueError,
                        "info_every must be >= 1; first_rank and fallback must be callable");
        return NULL;
    }
    StepObserver *o = (StepObserver *)type->tp_alloc(type, 0);
    if (o == NULL)
        return NULL;
    o->vectorcall = observer_call;
    o->info_every = info_every;
    o->emit_log = -1;
    o->logger = Py_NewRef(logger);
    o->first_rank = Py_NewRef(first_rank);
    o->tracing = Py_NewRef(tracing);
    o->meta_format = Py_NewRef(meta_format);
    o->log_format = Py_NewRef(log_format);
    o->fallback = Py_NewRef(fallback);
    return (PyObject *)o;
}

static int observer_traverse(StepObserver *o, visitproc visit, void *arg) {
    Py_VISIT(o->logger);
    Py_VISIT(o->first_rank);
    Py_VISIT(o->tracing);
    Py_VISIT(o->fallback);
    return 0;
}

static int observer_clear(StepObserver *o) {
    Py_CLEAR(o->logger);
    Py_CLEAR(o->first_rank);
    Py_CLEAR(o->tracing);
    Py_CLEAR(o->meta_format);
    Py_CLEAR(o->log_format);
    Py_CLEAR(o->fallback);
    return 0;
}

static void observer_dealloc(StepObserver *o) {
    PyObject_GC_UnTrack(o);
    observer_clear(o);
    Py_TYPE(o)->tp_free((PyObject *)o);
}

static PyMemberDef observer_members[] = {
    {"step", T_LONGLONG, offsetof(StepObserver, step), 0, "steps counted in this process"},
    {"emit_log", T_INT, offsetof(StepObserver, emit_log), 0,
     "1: this rank logs step_tokens; 0: it does not; -1: decided on the first step"},
    {"logger", T_OBJECT, offsetof(StepObserver, logger), READONLY, "the step_tokens logger"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StepObserverType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mmscope.vllm._step_telemetry.StepObserver",
    .tp_doc = "StepObserver(logger, first_rank, tracing, info_every, meta_format, log_format, "
              "fallback): observer(runner, scheduler_output, num_scheduled_tokens, ...) counts "
              "a step and emits its step_meta range and step_tokens line as "
              "telemetry.StepTelemetry does.",
    .tp_basicsize = sizeof(StepObserver),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(StepObserver, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = observer_new,
    .tp_traverse = (traverseproc)observer_traverse,
    .tp_clear = (inquiry)observer_clear,
    .tp_dealloc = (destructor)observer_dealloc,
    .tp_members = observer_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mmscope.vllm._step_telemetry",
    "The per-step telemetry observer in C (telemetry.StepTelemetry is the Python equivalent).",
    -1, NULL,
};

static int intern_all(void) {
    struct { PyObject **slot; const char *text; } names[] = {
        {&s_on, "on"}, {&s_mark, "_mark"}, {&s_disabled, "disabled"}, {&s_cache, "_cache"},
        {&s_is_enabled_for, "isEnabledFor"}, {&s_input_batch, "input_batch"},
        {&s_num_reqs, "num_reqs"}, {&s_num_computed, "num_computed_tokens_cpu"},
        {&s_num_prompt, "num_prompt_tokens"}, {&s_prefill, "prefill"}, {&s_decode, "decode"},
        {&s_total, "total"}, {&s_reqs, "reqs"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!(*names[i].slot = PyUnicode_InternFromString(names[i].text)))
            return -1;
    return 0;
}

PyMODINIT_FUNC PyInit__step_telemetry(void) {
    if (PyType_Ready(&StepObserverType) < 0 || intern_all() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&StepObserverType);
    if (PyModule_AddObject(m, "StepObserver", (PyObject *)&StepObserverType) < 0) {
        Py_DECREF(&StepObserverType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
