/* The hottest ops in C: `Model.forward`, `Model.backward`, its two halves `Model.backward_input` and
 * `Model.backward_weight`, and `WeightGrad.__add__`.
 *
 * Each handles the common, valid case exactly as the Python method in `model/handle.py` / `tensors.py` does
 * (same checks, same costs, same event, same allocations in the same order) and hands every other call
 * (a keyword it does not know, a first use of a shape, any error) to that Python method, which stays the
 * specification. `install` puts them on the classes; the tests run the whole suite both ways and
 * compare a step's books entry by entry, and the backward ops' errors message by message.
 */
#include "_ops.h"

/* Slot offsets, classes and constants, resolved once by `install`. */
static struct {
    PyTypeObject *Activation, *ActivationGrad, *Weight, *WeightGrad, *Stash;
    PyObject *py_forward, *py_backward, *py_backward_input, *py_backward_weight, *py_add; /* the Python twins */
    PyObject *docs;                              /* method name -> text signature and docstring */
    /* Model */
    Py_ssize_t m_engine, m_state, m_mem, m_events, m_cache, m_rank, m_act_bytes, m_shard_sizes;
    /* RankState and MemoryTracker */
    Py_ssize_t s_clock, s_flops, s_forwarded, mem_context;
    /* Activation / ActivationGrad (_Hidden) */
    Py_ssize_t h_rank, h_layer, h_samples, h_tp_size, a_stash;
    /* Weight / WeightGrad (_Sharded) */
    Py_ssize_t w_rank, w_layer, w_samples, w_shards, w_num_shards, w_tp_rank, w_tp_size;
    /* Stash */
    Py_ssize_t st_tp_rank, st_tp_size, st_recompute, st_input_done;
    Py_ssize_t pack_at;
    PyObject *s_forward, *s_backward, *s_backward_input, *s_backward_weight, *s_compute, *s_recompute, *s_empty,
        *s_none, *s_stash, *s_selective, *s_cost, *s_events, *s_pack, *s_selective_mode, *zero, *one;
} K;

/* ---- small helpers -------------------------------------------------------------------------------- */

/* The C functions behind `int.bit_count` and `int.bit_length` (METH_NOARGS), found once by `ops_init`:
 * calling them directly skips the method lookup and the call machinery, which a mask wider than 64 bits
 * (a step of more than 64 samples) would otherwise pay on every compute op. */
static PyCFunction int_bit_count, int_bit_length;

/* An int method's result as a long, or -1 (never raises). */
static long int_method(PyObject *x, PyCFunction method) {
    PyObject *r = method(x, NULL);
    long v = r ? PyLong_AsLong(r) : -1;
    Py_XDECREF(r);
    if (v == -1) PyErr_Clear();
    return v;
}

/* An int's digits, where this build knows CPython's layout of them (30-bit digits since 3.11's
 * `cpython/longintrepr.h`; the sign and count moved into `lv_tag` in 3.12): the digits' popcount is a
 * mask's bit count without building an int. Other versions ask `int.bit_count`. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
#define MASK_DIGITS(x) (((PyLongObject *)(x))->ob_digit)
#define MASK_NDIGITS(x) Py_SIZE(x) /* negative for a negative int */
#elif PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030F0000 && PYLONG_BITS_IN_DIGIT == 30
#define MASK_DIGITS(x) (((PyLongObject *)(x))->long_value.ob_digit)
#define MASK_NDIGITS(x) \
    ((((PyLongObject *)(x))->long_value.lv_tag & 3) == 2 ? -1 : (Py_ssize_t)(((PyLongObject *)(x))->long_value.lv_tag >> 3))
#endif

/* Set bits of a non-negative mask (its samples); -1 if it is not one (never raises). Where the digits
 * can be read, they are counted directly: asking for an unsigned long long first would raise (and clear)
 * an OverflowError for every mask of a step of more than 64 samples. */
long mask_bit_count(PyObject *mask) {
    if (!mask || !PyLong_CheckExact(mask)) return -1;
#ifdef MASK_DIGITS
    Py_ssize_t ndigits = MASK_NDIGITS(mask);
    if (ndigits >= 0) {
        const digit *d = MASK_DIGITS(mask);
        long count = 0;
        Py_ssize_t i = 0;
        for (; i + 1 < ndigits; i += 2) /* two 30-bit digits per 64-bit popcount */
            count += __builtin_popcountll((unsigned long long)d[i] | (unsigned long long)d[i + 1] << 30);
        if (i < ndigits) count += __builtin_popcountll(d[i]);
        return count;
    }
#else
    unsigned long long v = PyLong_AsUnsignedLongLong(mask);
    if (v != (unsigned long long)-1 || !PyErr_Occurred()) return __builtin_popcountll(v);
    PyErr_Clear(); /* negative, or wider than 64 bits (a step of more than 64 samples) */
#endif
    return int_method(mask, int_bit_count);
}

/* Is `mask` == (1 << n) - 1, every one of n shards (never raises)? */
int is_full_mask(PyObject *mask, long n) {
    if (n < 1 || !mask || !PyLong_CheckExact(mask)) return 0;
    if (n <= 62) return small_int(mask, -1) == (1L << n) - 1;
    return int_method(mask, int_bit_length) == n && mask_bit_count(mask) == n;
}

/* The C function of the METH_NOARGS method `name` of int; -1 with TypeError if it has none. */
static int int_c_method(const char *name, PyCFunction *out) {
    PyObject *descr = PyObject_GetAttrString((PyObject *)&PyLong_Type, name);
    if (!descr) return -1;
    int ok = Py_IS_TYPE(descr, &PyMethodDescr_Type) &&
             (((PyMethodDescrObject *)descr)->d_method->ml_flags & (METH_NOARGS | METH_VARARGS | METH_FASTCALL |
                                                                    METH_KEYWORDS | METH_O)) == METH_NOARGS;
    if (ok) *out = ((PyMethodDescrObject *)descr)->d_method->ml_meth;
    Py_DECREF(descr);
    if (!ok) PyErr_Format(PyExc_TypeError, "int.%s is not a C method without arguments", name);
    return ok ? 0 : -1;
}

/* Call the Python twin with self first. It re-checks everything, so a failed comparison on the way here
 * (an exception set) is dropped: the twin meets and reports the same problem. */
int append_event(PyObject *events, PyObject *const *fields) {
    PyObject *event = PyTuple_New(12);
    if (!event) return -1;
    for (int i = 0; i < 12; i++) PyTuple_SET_ITEM(event, i, Py_NewRef(fields[i]));
    int failed = PyList_Append(events, event);
    Py_DECREF(event);
    return failed;
}

PyObject *take_op_id(PyObject *engine, PyObject *next_op_id) {
    PyObject *last = PyObject_GetAttr(engine, next_op_id), *one = last ? PyLong_FromLong(1) : NULL;
    PyObject *id = one ? PyNumber_Add(last, one) : NULL;
    Py_XDECREF(last);
    Py_XDECREF(one);
    if (id && PyObject_SetAttr(engine, next_op_id, id) < 0) Py_CLEAR(id);
    return id;
}

PyObject *fallback(PyObject *twin, PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyErr_Clear();
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0) + 1;
    PyObject *small[8], **stack = total <= 8 ? small : PyMem_Malloc(total * sizeof(PyObject *));
    if (!stack) return PyErr_NoMemory();
    stack[0] = self;
    for (Py_ssize_t i = 1; i < total; i++) stack[i] = args[i - 1];
    PyObject *out = PyObject_Vectorcall(twin, stack, nargs + 1, kwnames);
    if (stack != small) PyMem_Free(stack);
    return out;
}

/* (seconds, FLOPs, stash bytes) of a compute op: the model's cost cache, else `Model._cost`.
 * Returns a new reference to the cached tuple. */
static PyObject *op_cost(PyObject *self, PyObject *op, PyObject *layer, long n, PyObject *tp, PyObject *mode) {
    PyObject *n_obj = PyLong_FromLong(n);
    if (!n_obj) return NULL;
    PyObject *key = PyTuple_Pack(5, op, layer, n_obj, tp, mode);
    if (!key) { Py_DECREF(n_obj); return NULL; }
    PyObject *cost = PyDict_GetItemWithError(SLOT(self, K.m_cache), key);
    Py_DECREF(key);
    if (cost) {
        Py_DECREF(n_obj);
        Py_INCREF(cost);
    } else if (!PyErr_Occurred()) {
        PyObject *args[6] = {self, op, layer, n_obj, tp, mode};
        cost = PyObject_VectorcallMethod(K.s_cost, args, 6 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(n_obj);
    } else {
        Py_DECREF(n_obj);
    }
    if (cost && (!PyTuple_CheckExact(cost) || PyTuple_GET_SIZE(cost) != 3)) {
        Py_DECREF(cost);
        PyErr_SetString(PyExc_TypeError, "Model._cost must return (seconds, flops, stash bytes)");
        return NULL;
    }
    return cost;
}

/* Advance the rank's compute stream by `cost` and record the event, as `Model._compute` does. */
static int run_compute(PyObject *self, PyObject *op, PyObject *layer, PyObject *samples, PyObject *cost,
                       PyObject *detail) {
    PyObject *state = SLOT(self, K.m_state);
    PyObject *start = SLOT(state, K.s_clock), *flops_before = SLOT(state, K.s_flops);
    double duration = PyFloat_AsDouble(PyTuple_GET_ITEM(cost, 0));
    double flops = PyFloat_AsDouble(PyTuple_GET_ITEM(cost, 1));
    if (PyErr_Occurred() || !start || !flops_before) return -1;
    double start_s = PyFloat_AsDouble(start), flops_so_far = PyFloat_AsDouble(flops_before);
    if (PyErr_Occurred()) return -1;
    PyObject *end = PyFloat_FromDouble(start_s + duration);
    PyObject *total = end ? PyFloat_FromDouble(flops_so_far + flops) : NULL;
    if (!total) { Py_XDECREF(end); return -1; }
    PyObject *items[12] = {SLOT(self, K.m_rank), op, K.s_compute, start, end, layer, samples, K.zero,
                           PyTuple_GET_ITEM(cost, 1), Py_None, K.zero, detail};
    PyObject *events = SLOT(self, K.m_events);
    if (append_event(events, items) < 0) { Py_DECREF(end); Py_DECREF(total); return -1; }
    Py_XSETREF(SLOT(state, K.s_clock), end); /* `end` is now owned by the slot; the event holds its own */
    Py_XSETREF(SLOT(state, K.s_flops), total);
    if (PyList_GET_SIZE(events) >= K.pack_at) {
        PyObject *log = PyObject_GetAttr(SLOT(self, K.m_engine), K.s_events);
        PyObject *r = log ? PyObject_CallMethodNoArgs(log, K.s_pack) : NULL;
        Py_XDECREF(log);
        if (!r) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* mem.context = (op, layer): what an out-of-memory message names. */
static int set_context(PyObject *mem, PyObject *op, PyObject *layer) {
    PyObject *context = PyTuple_Pack(2, op, layer);
    if (!context) return -1;
    Py_XSETREF(SLOT(mem, K.mem_context), context);
    return 0;
}

/* n * one sample's activation bytes, or -1 (never raises). */
static long long activation_bytes(PyObject *self, long n) {
    PyObject *per_sample = SLOT(self, K.m_act_bytes);
    long long each = per_sample ? PyLong_AsLongLong(per_sample) : -1;
    long long out;
    if (each < 0 || __builtin_mul_overflow(each, (long long)n, &out)) { PyErr_Clear(); return -1; }
    return out;
}

/* ---- forward ------------------------------------------------------------------------------------- */

static PyObject *fast_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs != 3) goto slow;
    int keep_stash = 1;
    PyObject *mode = K.s_none; /* compute_mode(selective_recompute, sequence_parallel=False) */
    if (kwnames) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
            if (name == K.s_stash) {
                keep_stash = PyObject_IsTrue(value);
                if (keep_stash < 0) return NULL;
            } else if (name == K.s_selective && (value == Py_False || value == Py_True)) {
                mode = value == Py_True ? K.s_selective_mode : K.s_none;
            } else {
                goto slow;
            }
        }
    }
    PyObject *layer = args[0], *act = args[1], *weight = args[2], *rank = SLOT(self, K.m_rank);
    if (Py_TYPE(act) != K.Activation || Py_TYPE(weight) != K.Weight || !PyLong_CheckExact(layer)) goto slow;
    long layer_v = small_int(layer, -1);
    /* a TP slice: its rank within the group (the part of the sum it yields), at most 62 */
    long tp_rank = small_int(SLOT(weight, K.w_tp_rank), -1);
    if (layer_v < 0 || small_int(SLOT(act, K.h_tp_size), 0) != 1 || tp_rank < 0 || tp_rank > 62 ||
        !is_full_mask(SLOT(weight, K.w_shards), small_int(SLOT(weight, K.w_num_shards), -1)) ||
        int_eq(SLOT(act, K.h_rank), rank) != 1 || int_eq(SLOT(weight, K.w_rank), rank) != 1 ||
        int_eq(SLOT(act, K.h_layer), layer) != 1 || int_eq(SLOT(weight, K.w_layer), layer) != 1 ||
        buffer_log(act) != SLOT(self, K.m_mem) || buffer_log(weight) != SLOT(self, K.m_mem))
        goto slow;
    PyObject *samples = SLOT(act, K.h_samples), *tp = SLOT(weight, K.w_tp_size);
    long n = mask_bit_count(samples);
    PyObject *state = SLOT(self, K.m_state);
    /* this TP slice's per-layer masks of forwarded samples (`RankState.forwarded`); Python makes the list
       on a slice's first forward */
    PyObject *forwarded = SLOT(state, K.s_forwarded);
    if (n < 0 || !tp || !forwarded || !PyList_CheckExact(forwarded) || tp_rank >= PyList_GET_SIZE(forwarded))
        goto slow;
    PyObject *masks = PyList_GET_ITEM(forwarded, tp_rank);
    if (!PyList_CheckExact(masks) || layer_v >= PyList_GET_SIZE(masks)) goto slow;
    long long out_bytes = activation_bytes(self, n);
    if (out_bytes < 0) goto slow;

    /* a forward of samples this layer (and TP slice) has already seen on this rank is a recompute */
    PyObject *before = PyList_GET_ITEM(masks, layer_v);
    PyObject *seen = PyNumber_And(before, samples);
    if (!seen) return NULL;
    int recompute = PyObject_RichCompareBool(seen, samples, Py_EQ);
    Py_DECREF(seen);
    if (recompute < 0) return NULL;
    if (!recompute) {
        int any = PyObject_IsTrue(before);
        if (any < 0) return NULL;
        PyObject *now = any ? PyNumber_Or(before, samples) : Py_NewRef(samples);
        if (!now) return NULL;
        PyList_SetItem(masks, layer_v, now); /* steals `now` */
    }
    PyObject *cost = op_cost(self, K.s_forward, layer, n, tp, mode);
    if (!cost) return NULL;
    if (run_compute(self, K.s_forward, layer, samples, cost, recompute ? K.s_recompute : K.s_empty) < 0 ||
        set_context(SLOT(self, K.m_mem), K.s_forward, layer) < 0) {
        Py_DECREF(cost);
        return NULL;
    }
    AllocLog *mem = (AllocLog *)SLOT(self, K.m_mem);
    if (keep_stash) {
        long long stash_bytes = PyLong_AsLongLong(PyTuple_GET_ITEM(cost, 2));
        if (stash_bytes == -1 && PyErr_Occurred()) { Py_DECREF(cost); return NULL; }
        PyObject *fields[3] = {SLOT(weight, K.w_tp_rank), tp, mode};
        PyObject *stash = buffer_alloc(K.Stash, mem, stash_bytes, fields, 3);
        if (!stash) { Py_DECREF(cost); return NULL; }
        Py_XSETREF(SLOT(act, K.a_stash), stash);
    }
    Py_DECREF(cost);
    PyObject *next = PyLong_FromLong(layer_v + 1);
    if (!next) return NULL;
    PyObject *part = PyLong_FromLong(1L << tp_rank); /* TP slice tp_rank of `tp`: part 1 << tp_rank */
    if (!part) { Py_DECREF(next); return NULL; }
    PyObject *fields[5] = {rank, next, samples, part, tp};
    PyObject *out = buffer_alloc(K.Activation, mem, out_bytes, fields, 5);
    Py_DECREF(next);
    Py_DECREF(part);
    return out;
slow:
    return fallback(K.py_forward, self, args, nargs, kwnames);
}

/* ---- backward, backward_input, backward_weight ----------------------------------------------------- */

/* A backward op's arguments once they pass `OpChecks._check_backward` (borrowed references). */
typedef struct {
    PyObject *layer, *act, *stash, *samples, *tp, *tp_rank, *recompute;
    long n;                       /* samples */
    long part;                    /* the input gradient's TP part: 1 << tp_rank */
    long long act_grad_bytes;     /* the input gradient's bytes */
    long long weight_grad_bytes;  /* the weight gradient's bytes (if asked for) */
} BackwardCall;

/* Does this call of a backward op pass `_check_backward`'s test, with its stash's `input_done` as
 * `input_done` wants, on the fast path? 1 and *b filled, or 0: the Python twin takes the call (and
 * raises, if it is wrong). `weight_grad`: the op returns a weight gradient, whose size comes from the
 * per-step shard sizes (`Model._shard_bytes`); the first time for a (layer, TP degree), or where
 * gradients are wider than weights, Python computes it. May leave an exception set for `fallback`. */
static int backward_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                         PyObject *input_done, int weight_grad, BackwardCall *b) {
    if (nargs != 4 || kwnames) return 0;
    PyObject *layer = args[0], *act = args[1], *grad = args[2], *weight = args[3], *rank = SLOT(self, K.m_rank);
    if (Py_TYPE(act) != K.Activation || Py_TYPE(grad) != K.ActivationGrad || Py_TYPE(weight) != K.Weight ||
        !PyLong_CheckExact(layer))
        return 0;
    PyObject *stash = SLOT(act, K.a_stash);
    long layer_v = small_int(layer, -1);
    /* a TP slice's rank, at most 62: its input gradient is part 1 << tp_rank of the sum */
    long tp_rank = small_int(SLOT(weight, K.w_tp_rank), -1);
    if (!stash || Py_TYPE(stash) != K.Stash || layer_v < 0 || tp_rank < 0 || tp_rank > 62 ||
        small_int(SLOT(act, K.h_tp_size), 0) != 1 || small_int(SLOT(grad, K.h_tp_size), 0) != 1 ||
        small_int(SLOT(grad, K.h_layer), -1) != layer_v + 1 ||
        !is_full_mask(SLOT(weight, K.w_shards), small_int(SLOT(weight, K.w_num_shards), -1)) ||
        SLOT(stash, K.st_input_done) != input_done ||
        int_eq(SLOT(act, K.h_rank), rank) != 1 || int_eq(SLOT(weight, K.w_rank), rank) != 1 ||
        int_eq(SLOT(grad, K.h_rank), rank) != 1 || int_eq(SLOT(act, K.h_layer), layer) != 1 ||
        int_eq(SLOT(weight, K.w_layer), layer) != 1 ||
        int_eq(SLOT(grad, K.h_samples), SLOT(act, K.h_samples)) != 1 ||
        int_eq(SLOT(stash, K.st_tp_rank), SLOT(weight, K.w_tp_rank)) != 1 ||
        int_eq(SLOT(stash, K.st_tp_size), SLOT(weight, K.w_tp_size)) != 1 ||
        buffer_log(act) != SLOT(self, K.m_mem) || buffer_log(grad) != SLOT(self, K.m_mem) ||
        buffer_log(weight) != SLOT(self, K.m_mem))
        return 0;
    PyObject *samples = SLOT(act, K.h_samples), *tp = SLOT(weight, K.w_tp_size);
    PyObject *recompute = SLOT(stash, K.st_recompute);
    long n = mask_bit_count(samples);
    long long act_grad_bytes = n < 0 ? -1 : activation_bytes(self, n);
    if (act_grad_bytes < 0 || !tp || !recompute || !PyUnicode_CheckExact(recompute)) return 0;
    /* a sequence-parallel layer's input-gradient pass checks how its output gradient was gathered
     * (`OpChecks._check_sequence_parallel_grad`): the Python twin takes it */
    if (input_done == Py_False && small_int(tp, 0) != 1) {
        int plain = recompute == K.s_none || PyUnicode_Compare(recompute, K.s_none) == 0;
        if (!plain && !PyErr_Occurred())
            plain = recompute == K.s_selective_mode || PyUnicode_Compare(recompute, K.s_selective_mode) == 0;
        if (!plain) return 0;
    }
    long long weight_grad_bytes = 0;
    if (weight_grad) {
        PyObject *key = PyTuple_Pack(2, layer, tp);
        if (!key) return 0;
        PyObject *sizes = PyDict_GetItemWithError(SLOT(self, K.m_shard_sizes), key);
        Py_DECREF(key);
        if (!sizes || !PyTuple_CheckExact(sizes) || PyTuple_GET_SIZE(sizes) != 2) return 0;
        weight_grad_bytes = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, 0));
        if (weight_grad_bytes < 0) return 0;
    }
    *b = (BackwardCall){layer, act, stash, samples, tp, SLOT(weight, K.w_tp_rank), recompute, n,
                        1L << tp_rank, act_grad_bytes, weight_grad_bytes};
    return 1;
}

/* `Model._compute(op, layer, samples, tp, mode)`: the compute stream advances by the op's cost in
 * compute mode `mode`, and the event's detail names the mode unless it is "none". */
static int backward_compute(PyObject *self, PyObject *op, const BackwardCall *b, PyObject *mode) {
    int plain = mode == K.s_none || PyUnicode_Compare(mode, K.s_none) == 0;
    if (!plain && PyErr_Occurred()) return -1;
    PyObject *cost = op_cost(self, op, b->layer, b->n, b->tp, mode);
    if (!cost) return -1;
    int failed = run_compute(self, op, b->layer, b->samples, cost, plain ? K.s_empty : mode);
    Py_DECREF(cost);
    return failed;
}

/* `Model._weight_grad`: the layer's weight gradient (this TP slice's) for the call's samples. */
static PyObject *new_weight_grad(PyObject *self, const BackwardCall *b) {
    PyObject *fields[7] = {SLOT(self, K.m_rank), b->layer, b->samples, K.one, K.one, b->tp_rank, b->tp};
    return buffer_alloc(K.WeightGrad, (AllocLog *)SLOT(self, K.m_mem), b->weight_grad_bytes, fields, 7);
}

/* `Model._activation_grad`: the gradient entering the layer, a TP slice's part of the sum. */
static PyObject *new_activation_grad(PyObject *self, const BackwardCall *b) {
    PyObject *part = PyLong_FromLong(b->part);
    if (!part) return NULL;
    PyObject *fields[5] = {SLOT(self, K.m_rank), SLOT(b->act, K.h_layer), b->samples, part, b->tp};
    PyObject *out = buffer_alloc(K.ActivationGrad, (AllocLog *)SLOT(self, K.m_mem), b->act_grad_bytes, fields, 5);
    Py_DECREF(part);
    return out;
}

static PyObject *fast_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    BackwardCall b;
    if (!backward_call(self, args, nargs, kwnames, Py_False, 1, &b))
        return fallback(K.py_backward, self, args, nargs, kwnames);
    if (backward_compute(self, K.s_backward, &b, b.recompute) < 0) return NULL;
    Py_SETREF(SLOT(b.act, K.a_stash), Py_NewRef(Py_None)); /* freed before the gradients are allocated */
    if (set_context(SLOT(self, K.m_mem), K.s_backward, b.layer) < 0) return NULL;
    PyObject *weight_grad = new_weight_grad(self, &b);
    if (!weight_grad) return NULL;
    PyObject *act_grad = new_activation_grad(self, &b);
    PyObject *result = act_grad ? PyTuple_Pack(2, weight_grad, act_grad) : NULL;
    Py_DECREF(weight_grad);
    Py_XDECREF(act_grad);
    return result;
}

static PyObject *fast_backward_input(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    BackwardCall b;
    if (!backward_call(self, args, nargs, kwnames, Py_False, 0, &b))
        return fallback(K.py_backward_input, self, args, nargs, kwnames);
    /* the cost's third figure: the bytes the stash keeps for backward_weight (`Model._cost`) */
    PyObject *cost = op_cost(self, K.s_backward_input, b.layer, b.n, b.tp, b.recompute);
    if (!cost) return NULL;
    long long kept = PyLong_AsLongLong(PyTuple_GET_ITEM(cost, 2));
    Py_DECREF(cost);
    if (kept == -1 && PyErr_Occurred()) return NULL;
    /* the stash's compute mode outlives it in the new one (b.recompute is borrowed from the old) */
    PyObject *mode = Py_NewRef(b.recompute), *out = NULL;
    if (backward_compute(self, K.s_backward_input, &b, mode) < 0) goto done;
    Py_SETREF(SLOT(b.act, K.a_stash), Py_NewRef(Py_None)); /* the forward's stash goes first, as in backward */
    b.stash = b.recompute = NULL;
    if (set_context(SLOT(self, K.m_mem), K.s_backward_input, b.layer) < 0) goto done;
    PyObject *fields[4] = {b.tp_rank, b.tp, mode, Py_True};
    PyObject *stash = buffer_alloc(K.Stash, (AllocLog *)SLOT(self, K.m_mem), kept, fields, 4);
    if (!stash) goto done;
    Py_SETREF(SLOT(b.act, K.a_stash), stash);
    out = new_activation_grad(self, &b);
done:
    Py_DECREF(mode);
    return out;
}

static PyObject *fast_backward_weight(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    BackwardCall b;
    if (!backward_call(self, args, nargs, kwnames, Py_True, 1, &b))
        return fallback(K.py_backward_weight, self, args, nargs, kwnames);
    /* the weight-gradient GEMMs re-run nothing: compute mode "none" whatever the forward's, unless its linear
     * layers ran in FP8 (`costs.ops.weight_pass_mode`): the Python twin takes those */
    static PyObject *fp8_word = NULL;
    if (!fp8_word && !(fp8_word = PyUnicode_InternFromString("fp8"))) return NULL;
    int fp8 = PyUnicode_Contains(b.recompute, fp8_word);
    if (fp8 < 0) return NULL;
    if (fp8) return fallback(K.py_backward_weight, self, args, nargs, kwnames);
    if (backward_compute(self, K.s_backward_weight, &b, K.s_none) < 0) return NULL;
    Py_SETREF(SLOT(b.act, K.a_stash), Py_NewRef(Py_None)); /* consumes the stash */
    if (set_context(SLOT(self, K.m_mem), K.s_backward_weight, b.layer) < 0) return NULL;
    return new_weight_grad(self, &b);
}

/* ---- WeightGrad + WeightGrad ---------------------------------------------------------------------- */

static PyObject *fast_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs != 1 || kwnames || Py_TYPE(self) != K.WeightGrad || Py_TYPE(args[0]) != K.WeightGrad) goto slow;
    PyObject *other = args[0];
    Py_ssize_t same[] = {K.w_rank, K.w_layer, K.w_shards, K.w_num_shards, K.w_tp_rank, K.w_tp_size};
    for (int i = 0; i < 6; i++)
        if (int_eq(SLOT(self, same[i]), SLOT(other, same[i])) != 1) goto slow;
    if (buffer_log(self) != buffer_log(other)) goto slow; /* gradients of two steps */
    if (BUFFER_NBYTES((Buffer *)self) != BUFFER_NBYTES((Buffer *)other)) goto slow; /* different parameters */
    PyObject *mine = SLOT(self, K.w_samples), *theirs = SLOT(other, K.w_samples);
    if (!mine || !theirs) goto slow;
    PyObject *overlap = PyNumber_And(mine, theirs);
    if (!overlap) return NULL;
    int clash = PyObject_IsTrue(overlap);
    Py_DECREF(overlap);
    if (clash) goto slow; /* (or an error): Python says which samples */
    PyObject *both = PyNumber_Or(mine, theirs);
    if (!both) return NULL;
    PyObject *fields[7] = {SLOT(self, K.w_rank), SLOT(self, K.w_layer), both, SLOT(self, K.w_shards),
                           SLOT(self, K.w_num_shards), SLOT(self, K.w_tp_rank), SLOT(self, K.w_tp_size)};
    PyObject *sum = buffer_view(K.WeightGrad, self, fields, 7); /* like `.grad +=`: the left buffer */
    Py_DECREF(both);
    return sum;
slow:
    return fallback(K.py_add, self, args, nargs, kwnames);
}

/* ---- install ------------------------------------------------------------------------------------- */

int slot_offset(PyObject *cls, const char *name, Py_ssize_t *out) {
    PyObject *descr = PyObject_GetAttrString(cls, name);
    if (!descr) return -1;
    int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type) && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
    if (ok) *out = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    if (!ok) PyErr_Format(PyExc_TypeError, "%R.%s is not a slot", cls, name);
    return ok ? 0 : -1;
}

int same_layout(PyObject *const *siblings, int nsiblings, const char *const *names, const Py_ssize_t *want,
                int nnames) {
    for (int c = 0; c < nsiblings; c++)
        for (int i = 0; i < nnames; i++) {
            Py_ssize_t offset;
            if (slot_offset(siblings[c], names[i], &offset) < 0) return -1;
            if (offset != want[i]) {
                PyErr_Format(PyExc_TypeError, "%R.%s is not laid out like its sibling's", siblings[c], names[i]);
                return -1;
            }
        }
    return 0;
}

static PyMethodDef forward_def = {"forward", (PyCFunction)(void (*)(void))fast_forward, METH_FASTCALL | METH_KEYWORDS,
                                  NULL};
static PyMethodDef backward_def = {"backward", (PyCFunction)(void (*)(void))fast_backward,
                                   METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef backward_input_def = {"backward_input", (PyCFunction)(void (*)(void))fast_backward_input,
                                         METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef backward_weight_def = {"backward_weight", (PyCFunction)(void (*)(void))fast_backward_weight,
                                          METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef add_def = {"__add__", (PyCFunction)(void (*)(void))fast_add, METH_FASTCALL | METH_KEYWORDS, NULL};

/* Put `def` on `cls`, keeping the Python method there as the twin; `docs[name]` (its signature and
 * docstring, kept alive by the caller) becomes the C method's. */
int load_classes(PyObject *module, const char *where, const ClassRef *refs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        PyObject *cls = PyObject_GetAttrString(module, refs[i].name);
        if (!cls) return -1;
        if (!PyType_Check(cls)) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a class", where, refs[i].name);
            Py_DECREF(cls);
            return -1;
        }
        Py_XSETREF(*refs[i].out, (PyTypeObject *)cls);
    }
    return 0;
}

int replace_method(PyObject *cls, PyMethodDef *def, PyObject **twin, PyObject *docs) {
    PyObject *python = PyObject_GetAttrString(cls, def->ml_name);
    if (!python) return -1;
    if (!PyFunction_Check(python)) {
        Py_DECREF(python);
        PyErr_Format(PyExc_TypeError, "%R.%s is not a Python function (installed twice?)", cls, def->ml_name);
        return -1;
    }
    PyObject *doc = PyDict_GetItemString(docs, def->ml_name);
    if (doc && PyUnicode_Check(doc)) def->ml_doc = PyUnicode_AsUTF8(doc);
    if (PyErr_Occurred()) { Py_DECREF(python); return -1; }
    Py_XSETREF(*twin, python);
    PyObject *descr = PyDescr_NewMethod((PyTypeObject *)cls, def);
    if (!descr) return -1;
    int r = PyObject_SetAttrString(cls, def->ml_name, descr);
    Py_DECREF(descr);
    return r;
}

static PyObject *install(PyObject *module, PyObject *args) {
    PyObject *Model, *RankState, *MemoryTracker, *Activation, *ActivationGrad, *Weight, *WeightGrad, *Stash;
    PyObject *docs;
    Py_ssize_t pack_at;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!nO!:install", &PyType_Type, &Model, &PyType_Type, &RankState,
                          &PyType_Type, &MemoryTracker, &PyType_Type, &Activation, &PyType_Type, &ActivationGrad,
                          &PyType_Type, &Weight, &PyType_Type, &WeightGrad, &PyType_Type, &Stash, &pack_at, &PyDict_Type, &docs))
        return NULL;
    struct { PyObject *cls; const char *name; Py_ssize_t *out; } slots[] = {
        {Model, "_engine", &K.m_engine}, {Model, "_state", &K.m_state}, {Model, "_mem", &K.m_mem},
        {Model, "_events", &K.m_events}, {Model, "_cache", &K.m_cache}, {Model, "rank", &K.m_rank},
        {Model, "_act_bytes", &K.m_act_bytes},
        {Model, "_shard_sizes", &K.m_shard_sizes},
        {RankState, "clock", &K.s_clock}, {RankState, "flops", &K.s_flops}, {RankState, "forwarded", &K.s_forwarded},
        {MemoryTracker, "context", &K.mem_context},
        {Activation, "rank", &K.h_rank}, {Activation, "layer", &K.h_layer}, {Activation, "samples", &K.h_samples},
        {Activation, "tp_size", &K.h_tp_size},
        {Activation, "_stash", &K.a_stash},
        {Weight, "rank", &K.w_rank}, {Weight, "layer", &K.w_layer}, {Weight, "samples", &K.w_samples},
        {Weight, "shards", &K.w_shards}, {Weight, "num_shards", &K.w_num_shards},
        {Weight, "tp_rank", &K.w_tp_rank}, {Weight, "tp_size", &K.w_tp_size},
        {Stash, "tp_rank", &K.st_tp_rank}, {Stash, "tp_size", &K.st_tp_size},
        {Stash, "recompute", &K.st_recompute}, {Stash, "input_done", &K.st_input_done},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slot_offset(slots[i].cls, slots[i].name, slots[i].out) < 0) return NULL;
    /* the shared fields must sit at the same offsets in the sibling classes the ops read them from */
    Py_ssize_t check;
    struct { PyObject *cls; const char *name; Py_ssize_t want; } same[] = {
        {ActivationGrad, "rank", K.h_rank}, {ActivationGrad, "layer", K.h_layer},
        {ActivationGrad, "samples", K.h_samples}, {ActivationGrad, "tp_size", K.h_tp_size},
        {WeightGrad, "rank", K.w_rank}, {WeightGrad, "layer", K.w_layer}, {WeightGrad, "samples", K.w_samples},
        {WeightGrad, "shards", K.w_shards}, {WeightGrad, "num_shards", K.w_num_shards},
        {WeightGrad, "tp_rank", K.w_tp_rank}, {WeightGrad, "tp_size", K.w_tp_size},
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        if (slot_offset(same[i].cls, same[i].name, &check) < 0) return NULL;
        if (check != same[i].want) {
            PyErr_Format(PyExc_TypeError, "%R.%s is not laid out like its sibling's", same[i].cls, same[i].name);
            return NULL;
        }
    }
    PyTypeObject **types[] = {&K.Activation, &K.ActivationGrad, &K.Weight, &K.WeightGrad, &K.Stash};
    PyObject *given[] = {Activation, ActivationGrad, Weight, WeightGrad, Stash};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(given[i]);
        Py_XSETREF(*types[i], (PyTypeObject *)given[i]);
    }
    K.pack_at = pack_at;
    Py_INCREF(docs);
    Py_XSETREF(K.docs, docs);
    if (replace_method(Model, &forward_def, &K.py_forward, K.docs) < 0 ||
        replace_method(Model, &backward_def, &K.py_backward, K.docs) < 0 ||
        replace_method(Model, &backward_input_def, &K.py_backward_input, K.docs) < 0 ||
        replace_method(Model, &backward_weight_def, &K.py_backward_weight, K.docs) < 0 ||
        replace_method(WeightGrad, &add_def, &K.py_add, K.docs) < 0)
        return NULL;
    set_clock_slot((PyTypeObject *)RankState, K.s_clock);
    Py_RETURN_NONE;
}

static PyMethodDef ops_methods[] = {
    {"install", install, METH_VARARGS,
     "install(Model, RankState, MemoryTracker, Activation, ActivationGrad, Weight, WeightGrad, Stash, pack_at, docs): "
     "put the C forward, backward, backward_input, backward_weight and WeightGrad.__add__ on the classes; the "
     "Python methods stay as their fallback for every case off the fast path."},
    {NULL}};

int ops_init(PyObject *module) {
    struct { PyObject **out; const char *text; } strings[] = {
        {&K.s_forward, "forward"}, {&K.s_backward, "backward"}, {&K.s_backward_input, "backward_input"},
        {&K.s_backward_weight, "backward_weight"}, {&K.s_compute, "compute"},
        {&K.s_recompute, "recompute"}, {&K.s_empty, ""}, {&K.s_none, "none"}, {&K.s_stash, "stash"},
        {&K.s_selective, "selective_recompute"}, {&K.s_cost, "_cost"},
        {&K.s_events, "events"}, {&K.s_pack, "pack"}, {&K.s_selective_mode, "selective"},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!(*strings[i].out = PyUnicode_InternFromString(strings[i].text))) return -1;
    if (int_c_method("bit_count", &int_bit_count) < 0 || int_c_method("bit_length", &int_bit_length) < 0) return -1;
    K.zero = PyLong_FromLong(0);
    K.one = PyLong_FromLong(1);
    if (!K.zero || !K.one) return -1;
    return PyModule_AddFunctions(module, ops_methods);
}
