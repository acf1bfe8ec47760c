/* starvewatch._ccore: the compiled fast path of a watched iterator (optional; issue 29).
 *
 * hooks/loader.py keeps the whole design: an epoch's iterator switches its __class__ between
 * WatchedIterator (the general path) and FastWatchedIterator (the steady state), and every
 * switch back (mark(), rotate(), probe_cpu(), the buffer's room, an exception, the end) stays
 * in Python. What this module provides is only FastWatchedIterator.__next__: a method
 * descriptor of WatchedIterator (so the class switch still selects it) that does what the
 * Python one does, i.e. one length check, a clock read appended to the segment's list, the
 * inner next(), a clock read appended. Its fallbacks call back into Python (the general
 * __next__, _fast_failed), so the rare paths have one implementation.
 *
 * The slots of the iterator are read at the offsets of WatchedIterator's __slots__ member
 * descriptors, resolved once in bind(). The shipper slices the segment's list on another
 * thread while this appends to it: PyList_Append holds the GIL, as list.append does, so the
 * protocol is the same as the Python path's. A free-threaded build has no such guarantee:
 * the module refuses to load there and Python runs the fast path (hooks/core.py).
 *
 * The clock is exactly time.perf_counter_ns's (records from both paths of one epoch are
 * compared with each other): PyTime_PerfCounterRaw on 3.13+, else CLOCK_MONOTONIC on Linux,
 * which is what perf_counter reads there. Elsewhere the module does not build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

#ifdef Py_GIL_DISABLED
#define SW_FREE_THREADED 1
#else
#define SW_FREE_THREADED 0
#endif

#if PY_VERSION_HEX < 0x030D0000 && !defined(__linux__)
#error "starvewatch._ccore needs Python 3.13+ or Linux (the clock must be perf_counter's)"
#endif

/* Bound by bind(): */
static PyObject *general_class = NULL;  /* WatchedIterator */
static PyObject *general_next = NULL;   /* WatchedIterator.__next__ (a Python function) */
static PyObject *fast_failed = NULL;    /* WatchedIterator._fast_failed(self, exc, t_call) */
static Py_ssize_t off_times = -1, off_reads_left = -1, off_it = -1;
static PyObject *fake_clock = NULL;     /* tests: a callable returning ints, instead of the clock */
static PyObject *str_class = NULL;      /* "__class__" */

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* A new reference to the clock's reading in ns, as time.perf_counter_ns() gives it. */
static inline PyObject *
now_ns(void)
{
    if (fake_clock != NULL) {
        return PyObject_CallNoArgs(fake_clock);
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    (void)PyTime_PerfCounterRaw(&t);
    return PyLong_FromLongLong((long long)t);
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec);
#endif
}

/* The general path from here: self.__class__ = WatchedIterator; WatchedIterator.__next__(self) */
static PyObject *
to_general(PyObject *self)
{
    if (PyObject_SetAttr(self, str_class, general_class) < 0) {
        return NULL;
    }
    return PyObject_CallOneArg(general_next, self);
}

static PyObject *
fast_next(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *times = SLOT(self, off_times);
    PyObject *reads_left = SLOT(self, off_reads_left);
    PyObject *it = SLOT(self, off_it);
    if (times == NULL || !PyList_CheckExact(times) || reads_left == NULL || !PyLong_CheckExact(reads_left)
            || it == NULL || !PyIter_Check(it)) {
        return to_general(self);  /* not in the fast path's state: the general path knows */
    }
    Py_ssize_t left = PyLong_AsSsize_t(reads_left);
    if (left == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return to_general(self);
    }
    if (PyList_GET_SIZE(times) >= left) {  /* the buffer's room is used up: the general path */
        return to_general(self);
    }
    /* Held across the inner next(), which may run other Python code (and other threads). */
    Py_INCREF(times);
    Py_INCREF(it);
    PyObject *batch = NULL;
    PyObject *t_call = now_ns();
    if (t_call == NULL) {
        goto done;
    }
    /* closes the previous step; an odd count means "waiting since" */
    if (PyList_Append(times, t_call) < 0) {
        goto done;
    }
    batch = (*Py_TYPE(it)->tp_iternext)(it);
    if (batch == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetNone(PyExc_StopIteration);
        }
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL) {
            PyException_SetTraceback(value, tb);
        }
        /* the step was closed above; none is open */
        PyObject *res = PyObject_CallFunctionObjArgs(fast_failed, self, value ? value : Py_None, t_call, NULL);
        if (res == NULL) {  /* the handler failed: its error wins, as in Python */
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        }
        else {
            Py_DECREF(res);
            PyErr_Restore(type, value, tb);
        }
        goto done;
    }
    PyObject *t_ret = now_ns();
    if (t_ret == NULL || PyList_Append(times, t_ret) < 0) {
        Py_XDECREF(t_ret);
        Py_CLEAR(batch);
        goto done;
    }
    Py_DECREF(t_ret);
done:
    Py_XDECREF(t_call);
    Py_DECREF(it);
    Py_DECREF(times);
    return batch;
}

static PyMethodDef fast_next_def = {
    "__next__", (PyCFunction)fast_next, METH_NOARGS,
    "The fast path's next(): two clock reads appended to the segment's list (compiled)."};

static Py_ssize_t
slot_offset(PyObject *cls, const char *name)
{
    PyObject *descr = PyObject_GetAttrString(cls, name);
    if (descr == NULL) {
        return -1;
    }
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX && !(member->flags & READONLY)) {
            offset = member->offset;
        }
    }
    Py_DECREF(descr);
    if (offset < 0) {
        PyErr_Format(PyExc_TypeError, "%s is not a writable object slot", name);
    }
    return offset;
}

/* bind(WatchedIterator, general_next, fast_failed) -> the descriptor for FastWatchedIterator.__next__ */
static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *cls, *next_fn, *failed_fn;
    if (!PyArg_ParseTuple(args, "O!OO:bind", &PyType_Type, &cls, &next_fn, &failed_fn)) {
        return NULL;
    }
    Py_ssize_t t = slot_offset(cls, "_times"), r = slot_offset(cls, "_reads_left"), i = slot_offset(cls, "_it");
    if (t < 0 || r < 0 || i < 0) {
        return NULL;
    }
    off_times = t;
    off_reads_left = r;
    off_it = i;
    Py_INCREF(cls);
    Py_XSETREF(general_class, cls);
    Py_INCREF(next_fn);
    Py_XSETREF(general_next, next_fn);
    Py_INCREF(failed_fn);
    Py_XSETREF(fast_failed, failed_fn);
    return PyDescr_NewMethod((PyTypeObject *)cls, &fast_next_def);
}

/* set_clock(callable | None): tests feed both cores the same clock */
static PyObject *
set_clock(PyObject *module, PyObject *clock)
{
    if (clock == Py_None) {
        Py_CLEAR(fake_clock);
    }
    else {
        if (!PyCallable_Check(clock)) {
            PyErr_SetString(PyExc_TypeError, "set_clock() needs a callable or None");
            return NULL;
        }
        Py_INCREF(clock);
        Py_XSETREF(fake_clock, clock);
    }
    Py_RETURN_NONE;
}

static PyObject *
clock_ns(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return now_ns();
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS, "bind(WatchedIterator, its __next__, its _fast_failed): the fast __next__"},
    {"set_clock", set_clock, METH_O, "set_clock(callable | None): read this instead of the clock (tests)"},
    {"clock_ns", clock_ns, METH_NOARGS, "the clock the fast path reads, in ns (time.perf_counter_ns's)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "starvewatch._ccore",
    "The compiled fast path of a watched iterator (optional; see starvewatch/hooks/core.py).",
    -1, module_methods};

PyMODINIT_FUNC
PyInit__ccore(void)
{
    if (SW_FREE_THREADED) {
        /* list appends and the shipper's slices are atomic only under the GIL */
        PyErr_SetString(PyExc_ImportError, "starvewatch._ccore is not used on a free-threaded build");
        return NULL;
    }
    str_class = PyUnicode_InternFromString("__class__");
    if (str_class == NULL) {
        return NULL;
    }
    return PyModule_Create(&module_def);
}
