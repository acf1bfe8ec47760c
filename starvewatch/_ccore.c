/* starvewatch._ccore: the compiled fast path of a watched iterator (optional; issue 29).
 *
 * hooks/loader.py keeps the whole design: an epoch's iterator switches its __class__ between
 * WatchedIterator (the general path) and FastWatchedIterator (the steady state), and every
 * switch back (mark(), rotate(), probe_cpu(), the buffer's room, an exception, the end) stays
 * in Python. What this module provides is FastWatchedIterator.__next__ and
 * FastGpuWatchedIterator.__next__: method descriptors of WatchedIterator (so the class switch
 * still selects them, and hooks/core.py also puts them in those types' tp_iternext slots) that
 * do what the Python ones do: one length check, a clock read appended to the segment's reads
 * (a Times, below), the inner next(), a clock read appended; or, on the CUDA path, the
 * countdown, one 6-tuple record and the slot writes. Their fallbacks call back into Python
 * (the general __next__, _fast_failed, _gpu_fast_failed, _gpu_fast_drop), so the rare paths
 * have one implementation.
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
/* the CUDA-event countdown path (FastGpuWatchedIterator), bound by bind_gpu(): */
static Py_ssize_t off_gpu = -1, off_buffer = -1, off_capacity = -1, off_key = -1, off_step = -1,
    off_t_call = -1, off_t_ret = -1, off_bs = -1, off_t_wait = -1;
static PyObject *gpu_drop = NULL;     /* WatchedIterator._gpu_fast_drop(self, t_call) */
static PyObject *gpu_failed = NULL;   /* WatchedIterator._gpu_fast_failed(self, exc, t_call) */
static PyObject *str_countdown = NULL;  /* "_countdown" */
static PyObject *int_zero = NULL, *int_one = NULL;
static PyObject *fake_clock = NULL;     /* tests: a callable returning ints, instead of the clock */
static PyObject *str_class = NULL;      /* "__class__" */
/* the batch-size probe (a loader whose settings give no batch size), bound by bind(): */
static Py_ssize_t off_probe_bs = -1, off_fast_bs = -1;
static PyObject *new_batch_size = NULL;  /* WatchedIterator._fast_new_batch_size(self, t_call, t_ret, bs) */
static PyObject *str_shape = NULL, *str_values = NULL;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* The clock's reading in ns, as time.perf_counter_ns() gives it: 0, or -1 with an error
 * (only a test's clock can fail). */
static inline int
read_clock(long long *out)
{
    if (fake_clock != NULL) {
        PyObject *v = PyObject_CallNoArgs(fake_clock);
        if (v == NULL) {
            return -1;
        }
        *out = PyLong_AsLongLong(v);
        Py_DECREF(v);
        return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    (void)PyTime_PerfCounterRaw(&t);
    *out = (long long)t;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *out = (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
#endif
    return 0;
}

/* ---- Times: a segment's clock reads as int64, ints made when read -------------------------
 * The compiled core's segment list (hooks/core.py gives it to _enter_fast): append, len(),
 * t[i] (negative too), t[a:b:c] (a list of ints) and the sequence protocol (bisect, iteration),
 * which is all that the loader and the shipper do with a segment's list. The training thread
 * only stores 8 bytes per read; the ints are made by whoever reads (the shipper's slice). All
 * of it runs under the GIL, so a slice sees the reads before or after an append, whole. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t len;
    Py_ssize_t cap;
    long long *data;
} TimesObject;

static PyTypeObject Times_Type;

static int
times_reserve(TimesObject *t, Py_ssize_t need)
{
    if (need <= t->cap) {
        return 0;
    }
    Py_ssize_t cap = t->cap ? t->cap : 16;
    while (cap < need) {
        if (cap > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(long long)) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    long long *data = PyMem_Realloc(t->data, (size_t)cap * sizeof(long long));
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->data = data;
    t->cap = cap;
    return 0;
}

static inline int
times_push(TimesObject *t, long long value)
{
    if (t->len >= t->cap && times_reserve(t, t->len + 1) < 0) {
        return -1;
    }
    t->data[t->len++] = value;
    return 0;
}

static PyObject *
times_append(TimesObject *self, PyObject *value)
{
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (times_push(self, v) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
times_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *initial = NULL;
    static char *kwlist[] = {"reads", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:Times", kwlist, &initial)) {
        return NULL;
    }
    TimesObject *self = (TimesObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    if (initial != NULL) {
        PyObject *it = PyObject_GetIter(initial), *item;
        if (it == NULL) {
            Py_DECREF(self);
            return NULL;
        }
        while ((item = PyIter_Next(it)) != NULL) {
            PyObject *res = times_append(self, item);
            Py_DECREF(item);
            if (res == NULL) {
                Py_DECREF(it);
                Py_DECREF(self);
                return NULL;
            }
            Py_DECREF(res);
        }
        Py_DECREF(it);
        if (PyErr_Occurred()) {
            Py_DECREF(self);
            return NULL;
        }
    }
    return (PyObject *)self;
}

static void
times_dealloc(TimesObject *self)
{
    PyMem_Free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
times_length(TimesObject *self)
{
    return self->len;
}

static PyObject *
times_item(TimesObject *self, Py_ssize_t i)
{
    if (i < 0 || i >= self->len) {
        PyErr_SetString(PyExc_IndexError, "Times index out of range");
        return NULL;
    }
    return PyLong_FromLongLong(self->data[i]);
}

static PyObject *
times_subscript(TimesObject *self, PyObject *key)
{
    if (PyIndex_Check(key)) {
        Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (i < 0) {
            i += self->len;
        }
        return times_item(self, i);
    }
    if (PySlice_Check(key)) {
        Py_ssize_t start, stop, step;
        if (PySlice_Unpack(key, &start, &stop, &step) < 0) {
            return NULL;
        }
        Py_ssize_t n = PySlice_AdjustIndices(self->len, &start, &stop, step);
        PyObject *out = PyList_New(n);
        if (out == NULL) {
            return NULL;
        }
        for (Py_ssize_t k = 0, i = start; k < n; k++, i += step) {
            PyObject *v = PyLong_FromLongLong(self->data[i]);
            if (v == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            PyList_SET_ITEM(out, k, v);
        }
        return out;
    }
    PyErr_Format(PyExc_TypeError, "Times indices must be integers or slices, not %.200s", Py_TYPE(key)->tp_name);
    return NULL;
}

static PyMethodDef times_methods[] = {
    {"append", (PyCFunction)times_append, METH_O, "append(ns): one more clock read"},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods times_as_sequence = {
    .sq_length = (lenfunc)times_length,
    .sq_item = (ssizeargfunc)times_item,
};

static PyMappingMethods times_as_mapping = {
    .mp_length = (lenfunc)times_length,
    .mp_subscript = (binaryfunc)times_subscript,
};

static PyTypeObject Times_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "starvewatch._ccore.Times",
    .tp_basicsize = sizeof(TimesObject),
    .tp_dealloc = (destructor)times_dealloc,
    .tp_as_sequence = &times_as_sequence,
    .tp_as_mapping = &times_as_mapping,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A segment's clock reads (ns), stored as int64: the compiled core's segment list.",
    .tp_methods = times_methods,
    .tp_new = times_new,
};

/* list.append(item) with a new reference to item: in place when the list has room (what
 * list.append does, without its call), else PyList_Append. Both writes happen under the GIL,
 * before anything else can run: the shipper's slice sees the list before or after, whole. */
static inline int
append(PyObject *list, PyObject *item)
{
    PyListObject *l = (PyListObject *)list;
    Py_ssize_t n = Py_SIZE(l);
    if (n < l->allocated) {
        Py_INCREF(item);
        PyList_SET_ITEM(list, n, item);
        Py_SET_SIZE(l, n + 1);
        return 0;
    }
    return PyList_Append(list, item);
}

/* An error that hooks/introspect.py's `except Exception` swallows: cleared, 1; else 0 (a
 * KeyboardInterrupt goes on up, as it does from the Python probe). */
static int
swallowed(void)
{
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 1;
    }
    return 0;
}

/* getattr(obj, name, None): a new reference, None included; NULL with an error. */
static PyObject *
optional_attr(PyObject *obj, PyObject *name)
{
    PyObject *value = NULL;
#if PY_VERSION_HEX >= 0x030D0000
    int found = PyObject_GetOptionalAttr(obj, name, &value);
#else
    int found = _PyObject_LookupAttr(obj, name, &value);
#endif
    if (found < 0) {
        return NULL;
    }
    if (found == 0) {
        Py_RETURN_NONE;
    }
    return value;
}

/* hooks/introspect.py's leading_dim(batch), operation for operation (the records of both cores
 * must match): the leading dimension of the first tensor of batch, (x, y) or {"x": ...}, a few
 * levels at most; None where it cannot be read. A new reference; NULL only for an error that
 * is not an Exception. */
static PyObject *
leading_dim(PyObject *batch)
{
    Py_INCREF(batch);
    for (int level = 0; level < 3; level++) {
        PyObject *shape = optional_attr(batch, str_shape);
        if (shape == NULL) {
            goto failed;
        }
        if (shape != Py_None) {
            Py_DECREF(batch);
            Py_ssize_t n = PyObject_Size(shape);
            PyObject *dim = NULL;
            if (n > 0) {
                PyObject *first = PyObject_GetItem(shape, int_zero);
                if (first != NULL) {
                    dim = PyNumber_Long(first);
                    Py_DECREF(first);
                }
            }
            Py_DECREF(shape);
            if (dim != NULL) {
                return dim;
            }
            if (n == 0 || swallowed()) {  /* a shape without a length, or nothing readable */
                Py_RETURN_NONE;
            }
            return NULL;
        }
        Py_DECREF(shape);
        PyObject *inner = NULL;
        if (PyList_Check(batch) || PyTuple_Check(batch)) {
            int nonempty = PyObject_IsTrue(batch);
            if (nonempty < 0) {
                goto failed;
            }
            if (!nonempty) {
                break;
            }
            inner = PyObject_GetItem(batch, int_zero);  /* batch[0] */
        }
        else if (PyDict_Check(batch)) {
            int nonempty = PyObject_IsTrue(batch);
            if (nonempty < 0) {
                goto failed;
            }
            if (!nonempty) {
                break;
            }
            /* next(iter(batch.values())) */
            PyObject *values = PyObject_CallMethodNoArgs(batch, str_values);
            PyObject *it = values == NULL ? NULL : PyObject_GetIter(values);
            Py_XDECREF(values);
            if (it != NULL) {
                inner = PyIter_Next(it);
                Py_DECREF(it);
                if (inner == NULL && !PyErr_Occurred()) {
                    PyErr_SetNone(PyExc_StopIteration);
                }
            }
        }
        else {
            break;
        }
        if (inner == NULL) {
            goto failed;
        }
        Py_SETREF(batch, inner);
    }
    Py_DECREF(batch);
    Py_RETURN_NONE;
failed:
    Py_DECREF(batch);
    if (swallowed()) {
        Py_RETURN_NONE;
    }
    return NULL;
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

/* One clock read appended: to a Times (the compiled core's segments) or to a list (a segment
 * that the Python core began before a switch of cores). */
static inline int
push(PyObject *times, long long ns)
{
    if (Py_IS_TYPE(times, &Times_Type)) {
        return times_push((TimesObject *)times, ns);
    }
    PyObject *v = PyLong_FromLongLong(ns);
    if (v == NULL) {
        return -1;
    }
    int rc = append(times, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *
fast_next(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *times = SLOT(self, off_times);
    PyObject *reads_left = SLOT(self, off_reads_left);
    PyObject *it = SLOT(self, off_it);
    if (times == NULL || reads_left == NULL || !PyLong_CheckExact(reads_left)
            || it == NULL || Py_TYPE(it)->tp_iternext == NULL) {
        return to_general(self);  /* not in the fast path's state: the general path knows */
    }
    Py_ssize_t n;
    if (Py_IS_TYPE(times, &Times_Type)) {
        n = ((TimesObject *)times)->len;
    }
    else if (PyList_CheckExact(times)) {
        n = PyList_GET_SIZE(times);
    }
    else {
        return to_general(self);
    }
    Py_ssize_t left = PyLong_AsSsize_t(reads_left);
    if (left == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return to_general(self);
    }
    if (n >= left) {  /* the buffer's room is used up: the general path */
        return to_general(self);
    }
    /* Held across the inner next(), which may run other Python code (and other threads). */
    Py_INCREF(times);
    Py_INCREF(it);
    PyObject *batch = NULL;
    long long t_call, t_ret;
    /* closes the previous step; an odd count means "waiting since" */
    if (read_clock(&t_call) < 0 || push(times, t_call) < 0) {
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
        PyObject *t_call_obj = PyLong_FromLongLong(t_call);
        PyObject *res = t_call_obj == NULL ? NULL : PyObject_CallFunctionObjArgs(
            fast_failed, self, value ? value : Py_None, t_call_obj, NULL);
        Py_XDECREF(t_call_obj);
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
    if (read_clock(&t_ret) < 0) {
        Py_CLEAR(batch);
        goto done;
    }
    if (SLOT(self, off_probe_bs) == Py_True) {  /* no batch size from the settings: each batch's */
        PyObject *bs = leading_dim(batch);
        PyObject *segment_bs = SLOT(self, off_fast_bs);
        int changed = bs == NULL || segment_bs == NULL ? -1 : PyObject_RichCompareBool(bs, segment_bs, Py_NE);
        if (changed != 0) {  /* another size (the general path records this step), or an error */
            PyObject *res = NULL;
            if (changed > 0) {
                PyObject *t_call_obj = PyLong_FromLongLong(t_call), *t_ret_obj = PyLong_FromLongLong(t_ret);
                if (t_call_obj != NULL && t_ret_obj != NULL) {
                    res = PyObject_CallFunctionObjArgs(new_batch_size, self, t_call_obj, t_ret_obj, bs, NULL);
                }
                Py_XDECREF(t_call_obj);
                Py_XDECREF(t_ret_obj);
            }
            else if (bs != NULL && !PyErr_Occurred()) {
                PyErr_SetString(PyExc_AttributeError, "_bs");
            }
            Py_XDECREF(bs);
            if (res == NULL) {
                Py_CLEAR(batch);
            }
            Py_XDECREF(res);
            goto done;
        }
        Py_DECREF(bs);
    }
    if (push(times, t_ret) < 0) {
        Py_CLEAR(batch);
    }
done:
    Py_DECREF(it);
    Py_DECREF(times);
    return batch;
}

static PyMethodDef fast_next_def;
static Py_ssize_t slot_offset(PyObject *cls, const char *name);
/* self.<slot> = value (a new reference is taken) */
static inline void
set_slot(PyObject *self, Py_ssize_t off, PyObject *value)
{
    PyObject *old = SLOT(self, off);
    Py_INCREF(value);
    SLOT(self, off) = value;
    Py_XDECREF(old);
}

/* The exception in flight goes to a Python handler handler(self, exc, t_call), then is raised
 * again (or the handler's own error is). Returns NULL. */
static PyObject *
hand_failure(PyObject *handler, PyObject *self, PyObject *t_call_obj)
{
    if (!PyErr_Occurred()) {
        PyErr_SetNone(PyExc_StopIteration);
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *res = t_call_obj == NULL ? NULL : PyObject_CallFunctionObjArgs(
        handler, self, value ? value : Py_None, t_call_obj, NULL);
    if (res == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    }
    else {
        Py_DECREF(res);
        PyErr_Restore(type, value, tb);
    }
    return NULL;
}

/* FastGpuWatchedIterator.__next__: the steps between two CUDA-measured ones. As the Python one:
 * the countdown, one 6-tuple record of the step the call closes, the inner next(). */
static PyObject *
gpu_next(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *gpu = SLOT(self, off_gpu);
    PyObject *it = SLOT(self, off_it);
    PyObject *buffer = SLOT(self, off_buffer);
    PyObject *capacity = SLOT(self, off_capacity);
    PyObject *key = SLOT(self, off_key), *step = SLOT(self, off_step), *bs = SLOT(self, off_bs);
    PyObject *t_call_prev = SLOT(self, off_t_call), *t_ret_prev = SLOT(self, off_t_ret);
    if (gpu == NULL || it == NULL || Py_TYPE(it)->tp_iternext == NULL || buffer == NULL
            || !PyList_CheckExact(buffer) || capacity == NULL || key == NULL || step == NULL
            || bs == NULL || t_call_prev == NULL || t_ret_prev == NULL) {
        return to_general(self);
    }
    PyObject *cd = PyObject_GetAttr(gpu, str_countdown);
    if (cd == NULL) {
        return NULL;
    }
    long countdown = PyLong_AsLong(cd);
    Py_DECREF(cd);
    if (countdown == -1 && PyErr_Occurred()) {
        return NULL;
    }
    countdown -= 1;
    if (countdown <= 0) {  /* this step is measured: the full path (begin() draws the next gap) */
        return to_general(self);
    }
    PyObject *cd_new = PyLong_FromLong(countdown);
    if (cd_new == NULL) {
        return NULL;
    }
    int rc = PyObject_SetAttr(gpu, str_countdown, cd_new);
    Py_DECREF(cd_new);
    if (rc < 0) {
        return NULL;
    }
    Py_ssize_t room = PyLong_AsSsize_t(capacity);
    if (room == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long long t_call;
    if (read_clock(&t_call) < 0) {
        return NULL;
    }
    PyObject *t_call_obj = PyLong_FromLongLong(t_call);
    if (t_call_obj == NULL) {
        return NULL;
    }
    Py_INCREF(it);
    PyObject *batch = NULL;
    if (PyList_GET_SIZE(buffer) < room) {
        PyObject *record = PyTuple_Pack(6, key, step, t_call_prev, t_ret_prev, t_call_obj, bs);
        if (record == NULL) {
            goto done;
        }
        rc = append(buffer, record);
        Py_DECREF(record);
        if (rc < 0) {
            goto done;
        }
    }
    else {
        PyObject *res = PyObject_CallFunctionObjArgs(gpu_drop, self, t_call_obj, NULL);
        if (res == NULL) {
            goto done;
        }
        Py_DECREF(res);
    }
    PyObject *next_step = PyNumber_Add(SLOT(self, off_step), int_one);
    if (next_step == NULL) {
        goto done;
    }
    set_slot(self, off_step, next_step);
    Py_DECREF(next_step);
    set_slot(self, off_t_wait, t_call_obj);
    batch = (*Py_TYPE(it)->tp_iternext)(it);
    if (batch == NULL) {
        hand_failure(gpu_failed, self, t_call_obj);
        goto done;
    }
    set_slot(self, off_t_wait, int_zero);
    set_slot(self, off_t_call, t_call_obj);
    long long t_ret;
    PyObject *t_ret_obj = read_clock(&t_ret) < 0 ? NULL : PyLong_FromLongLong(t_ret);
    if (t_ret_obj == NULL) {
        Py_CLEAR(batch);
        goto done;
    }
    set_slot(self, off_t_ret, t_ret_obj);
    Py_DECREF(t_ret_obj);
    if (SLOT(self, off_probe_bs) == Py_True) {  /* no batch size from the settings: each batch's */
        PyObject *bs = leading_dim(batch);
        if (bs == NULL) {
            Py_CLEAR(batch);
            goto done;
        }
        set_slot(self, off_bs, bs);
        Py_DECREF(bs);
    }
done:
    Py_DECREF(it);
    Py_DECREF(t_call_obj);
    return batch;
}

static PyMethodDef gpu_next_def = {
    "__next__", (PyCFunction)gpu_next, METH_NOARGS,
    "The CUDA-event countdown path's next(): one record per step between measured ones (compiled)."};

static PyObject *
gpu_iternext(PyObject *self)
{
    return gpu_next(self, NULL);
}


/* The same as the type's tp_iternext slot: a for loop calls it without looking __next__ up
 * and without the method descriptor's call (about 150 instructions less per batch). */
static PyObject *
fast_iternext(PyObject *self)
{
    return fast_next(self, NULL);
}

/* install_iternext(FastWatchedIterator): after `FastWatchedIterator.__next__ = <bind()'s
 * descriptor>` (which sets the slot to the generic lookup), point the slot at fast_iternext.
 * Assigning __next__ again (the Python core) resets it: the slot always agrees with __next__. */
static PyObject *
install_iternext(PyObject *module, PyObject *cls)
{
    if (!PyType_Check(cls) || !(((PyTypeObject *)cls)->tp_flags & Py_TPFLAGS_HEAPTYPE)
            || general_class == NULL || !PyType_IsSubtype((PyTypeObject *)cls, (PyTypeObject *)general_class)) {
        PyErr_SetString(PyExc_TypeError, "install_iternext() needs a heap subclass of the bound class");
        return NULL;
    }
    PyObject *next = PyObject_GetAttrString(cls, "__next__");
    if (next == NULL) {
        return NULL;
    }
    PyMethodDef *def = Py_IS_TYPE(next, &PyMethodDescr_Type) ? ((PyMethodDescrObject *)next)->d_method : NULL;
    Py_DECREF(next);
    if (def != &fast_next_def && def != &gpu_next_def) {
        PyErr_SetString(PyExc_TypeError, "the class's __next__ is not a compiled fast path's");
        return NULL;
    }
    ((PyTypeObject *)cls)->tp_iternext = def == &fast_next_def ? fast_iternext : gpu_iternext;
    PyType_Modified((PyTypeObject *)cls);
    Py_RETURN_NONE;
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
    Py_ssize_t p = slot_offset(cls, "_probe_bs"), b = slot_offset(cls, "_bs");
    if (t < 0 || r < 0 || i < 0 || p < 0 || b < 0) {
        return NULL;
    }
    PyObject *new_bs_fn = PyObject_GetAttrString(cls, "_fast_new_batch_size");
    if (new_bs_fn == NULL) {
        return NULL;
    }
    Py_XSETREF(new_batch_size, new_bs_fn);
    off_times = t;
    off_reads_left = r;
    off_it = i;
    off_probe_bs = p;
    off_fast_bs = b;
    Py_INCREF(cls);
    Py_XSETREF(general_class, cls);
    Py_INCREF(next_fn);
    Py_XSETREF(general_next, next_fn);
    Py_INCREF(failed_fn);
    Py_XSETREF(fast_failed, failed_fn);
    return PyDescr_NewMethod((PyTypeObject *)cls, &fast_next_def);
}

/* bind_gpu(WatchedIterator, its _gpu_fast_drop, its _gpu_fast_failed) -> the descriptor for
 * FastGpuWatchedIterator.__next__ (after bind(), which gives the general path) */
static PyObject *
bind_gpu(PyObject *module, PyObject *args)
{
    PyObject *cls, *drop_fn, *failed_fn;
    if (!PyArg_ParseTuple(args, "O!OO:bind_gpu", &PyType_Type, &cls, &drop_fn, &failed_fn)) {
        return NULL;
    }
    if (general_class != cls) {
        PyErr_SetString(PyExc_TypeError, "bind_gpu() needs the class bound by bind()");
        return NULL;
    }
    const char *names[] = {"_gpu", "_buffer", "_capacity", "_key", "_step", "_t_call", "_t_ret", "_bs", "_t_wait"};
    Py_ssize_t *offsets[] = {&off_gpu, &off_buffer, &off_capacity, &off_key, &off_step, &off_t_call, &off_t_ret,
                             &off_bs, &off_t_wait};
    Py_ssize_t found[9];
    for (int i = 0; i < 9; i++) {
        found[i] = slot_offset(cls, names[i]);
        if (found[i] < 0) {
            return NULL;
        }
    }
    for (int i = 0; i < 9; i++) {
        *offsets[i] = found[i];
    }
    Py_INCREF(drop_fn);
    Py_XSETREF(gpu_drop, drop_fn);
    Py_INCREF(failed_fn);
    Py_XSETREF(gpu_failed, failed_fn);
    return PyDescr_NewMethod((PyTypeObject *)cls, &gpu_next_def);
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
    long long t;
    return read_clock(&t) < 0 ? NULL : PyLong_FromLongLong(t);
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS, "bind(WatchedIterator, its __next__, its _fast_failed): the fast __next__"},
    {"bind_gpu", bind_gpu, METH_VARARGS, "bind_gpu(WatchedIterator, its _gpu_fast_drop, its _gpu_fast_failed): the CUDA fast __next__"},
    {"install_iternext", install_iternext, METH_O, "install_iternext(cls): the fast path as cls's tp_iternext slot"},
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
    str_countdown = PyUnicode_InternFromString("_countdown");
    str_shape = PyUnicode_InternFromString("shape");
    str_values = PyUnicode_InternFromString("values");
    int_zero = PyLong_FromLong(0);
    int_one = PyLong_FromLong(1);
    if (str_class == NULL || str_countdown == NULL || str_shape == NULL || str_values == NULL || int_zero == NULL
            || int_one == NULL) {
        return NULL;
    }
    if (PyType_Ready(&Times_Type) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&Times_Type);
    if (PyModule_AddObject(module, "Times", (PyObject *)&Times_Type) < 0) {
        Py_DECREF(&Times_Type);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
