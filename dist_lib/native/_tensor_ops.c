/* The twins of the tensor ops of `Model` (`model/handle.py`), two twins that `DIST_SANDBOX_C_OFF` switches
 * apart: `ops` (forward, the backward ops, the gradient sum), installed by `install_ops`, and `weight_ops`
 * (load_weights, update, set_final_weight), installed by `install_weight_ops`. */
#include "_common.h"

/* ==== ops ========================================================================================= */

/* `ops`: the hottest ops in C: `Model.forward`, `Model.backward`, its two halves `Model.backward_input` and
 * `Model.backward_weight`, the runs of layers `Model.forward_layers` and `Model.backward_layers`, and
 * `WeightGrad.__add__`.
 *
 * Each handles the common, valid case exactly as the Python method in `model/handle.py` / `tensors.py` does
 * (same checks, same costs, same event, same allocations in the same order) and hands every other call
 * (a keyword it does not know, a first use of a shape, any error) to that Python method, which stays the
 * specification. `install_ops` puts them on the classes; the tests run the whole suite both ways and
 * compare a step's books entry by entry, and the backward ops' errors message by message.
 */

/* Slot offsets, classes and constants, resolved once by `install_ops`. */
static struct {
    PyTypeObject *Model, *Activation, *ActivationGrad, *Weight, *WeightGrad, *Stash;
    PyObject *py_forward, *py_backward, *py_backward_input, *py_backward_weight, *py_add; /* the Python twins */
    PyObject *py_forward_layers, *py_backward_layers;
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
    PyObject *s_start, *s_stop, *s_step, *s_add;
} K;

/* The last entries read from the dicts whose entries are written once (the cost cache, `Model._cost` and
 * `Model._update_cost` fill a missing key and never replace one; the step's shard sizes, `Model._shard_bytes`,
 * likewise), by the dict itself (held, so that its address names no other dict while it is here), up to three
 * parts of the key by identity and two ints by value. A remembered entry is what the dict holds for that key; a
 * step's ops repeat a handful of keys, and this skips building, hashing and comparing a tuple key for each op.
 * Two ways a set: with one, two keys of a step that fell on one set (a few pairs among a step's couple of
 * hundred) pushed each other out at every op of every rank. */
#define MEMO_SETS 1024 /* a power of two */
typedef struct {
    PyObject *dict, *a, *b, *c, *value; /* strong references, or NULL */
    long x, y;
} Memo;
static Memo memo[MEMO_SETS][2];

static inline Memo *memo_set(PyObject *dict, PyObject *a, PyObject *b, PyObject *c, long x, long y) {
    uint64_t h = (uint64_t)x * 0x9E3779B97F4A7C15ULL ^ (uint64_t)y * 0xC2B2AE3D27D4EB4FULL ^
                 ((uintptr_t)a >> 4) * 0x165667B19E3779F9ULL ^ ((uintptr_t)c >> 4) * 0x27D4EB2F165667C5ULL ^
                 ((uintptr_t)b >> 4) ^ ((uintptr_t)dict >> 4) * 0x85EBCA77C2B2AE63ULL;
    return memo[(size_t)(h ^ h >> 29 ^ h >> 47) & (MEMO_SETS - 1)];
}

static inline int memo_holds(const Memo *m, PyObject *dict, PyObject *a, PyObject *b, PyObject *c, long x, long y) {
    return m->dict == dict && m->a == a && m->b == b && m->c == c && m->x == x && m->y == y;
}

/* The remembered value (borrowed), or NULL (never raises). */
static inline PyObject *memo_get(PyObject *dict, PyObject *a, PyObject *b, PyObject *c, long x, long y) {
    Memo *set = memo_set(dict, a, b, c, x, y);
    if (memo_holds(&set[0], dict, a, b, c, x, y)) return set[0].value;
    if (memo_holds(&set[1], dict, a, b, c, x, y)) return set[1].value;
    return NULL;
}

/* Remember `value`, which `dict` holds for the key these parts make. The new entry takes the first way;
 * what was there moves to the second, whose entry goes. */
static void memo_put(PyObject *dict, PyObject *a, PyObject *b, PyObject *c, long x, long y, PyObject *value) {
    Memo *set = memo_set(dict, a, b, c, x, y), old = set[1];
    set[1] = set[0];
    set[0] = (Memo){Py_NewRef(dict), Py_XNewRef(a), Py_XNewRef(b), Py_XNewRef(c), Py_NewRef(value), x, y};
    Py_XDECREF(old.dict);
    Py_XDECREF(old.a);
    Py_XDECREF(old.b);
    Py_XDECREF(old.c);
    Py_XDECREF(old.value);
}

/* dict[(layer, second)] of the step's shard sizes (`Model._shard_bytes`): a borrowed reference, or NULL with
 * or without an exception (a missing key). `layer_v` and `second_v` are the two ints' values (`small_int`),
 * -1 for anything else. */
static PyObject *shard_sizes_get(PyObject *dict, PyObject *layer, long layer_v, PyObject *second, long second_v) {
    int by_value = layer_v >= 0 && second_v >= 0; /* both exact ints (`small_int`) */
    PyObject *sizes = by_value ? memo_get(dict, NULL, NULL, NULL, layer_v, second_v) : NULL;
    if (sizes) return sizes;
    PyObject *key = PyTuple_Pack(2, layer, second);
    if (!key) return NULL;
    sizes = PyDict_GetItemWithError(dict, key);
    Py_DECREF(key);
    if (sizes && by_value) memo_put(dict, NULL, NULL, NULL, layer_v, second_v, sizes);
    return sizes;
}

/* (seconds, FLOPs, stash bytes) of a compute op: the model's cost cache, else `Model._cost`.
 * Returns a new reference to the cached tuple. */
static PyObject *op_cost_lookup(PyObject *self, PyObject *op, PyObject *layer, long n, PyObject *tp, PyObject *mode);

static PyObject *op_cost(PyObject *self, PyObject *op, PyObject *layer, long n, PyObject *tp, PyObject *mode) {
    PyObject *cache = SLOT(self, K.m_cache);
    long layer_v = PyLong_CheckExact(layer) ? small_int(layer, -1) : -1;
    if (!cache || layer_v < 0) return op_cost_lookup(self, op, layer, n, tp, mode);
    PyObject *known = memo_get(cache, op, tp, mode, layer_v, n);
    if (known) return Py_NewRef(known);
    PyObject *cost = op_cost_lookup(self, op, layer, n, tp, mode);
    if (!cost) return NULL;
    /* only what the dict holds is remembered (a `_cost` of another class might not store it) */
    if (SLOT(self, K.m_cache) == cache) {
        PyObject *n_obj = PyLong_FromLong(n);
        PyObject *key = n_obj ? PyTuple_Pack(5, op, layer, n_obj, tp, mode) : NULL;
        Py_XDECREF(n_obj);
        PyObject *held = key ? PyDict_GetItemWithError(cache, key) : NULL;
        Py_XDECREF(key);
        if (held == cost) memo_put(cache, op, tp, mode, layer_v, n, cost);
        PyErr_Clear();
    }
    return cost;
}

static PyObject *op_cost_lookup(PyObject *self, PyObject *op, PyObject *layer, long n, PyObject *tp, PyObject *mode) {
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
    if (pending_events(events) >= K.pack_at) {
        PyObject *log = PyObject_GetAttr(SLOT(self, K.m_engine), K.s_events);
        PyObject *r = log ? PyObject_CallMethodNoArgs(log, K.s_pack) : NULL;
        Py_XDECREF(log);
        if (!r) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* mem.context = (op, layer): what an out-of-memory message names. The pairs are kept by the identity of the
 * op's name and the layer's value (the op names are the twin's own strings), and shared between ops: a context
 * is only read, by value, when a rank runs out of memory. */
#define CONTEXT_MEMO 512 /* a power of two */
static PyObject *context_memo[CONTEXT_MEMO];

static int set_context(PyObject *mem, PyObject *op, PyObject *layer) {
    long layer_v = PyLong_CheckExact(layer) ? small_int(layer, -1) : -1;
    size_t slot = (size_t)(((uintptr_t)op >> 4) * 31u + (size_t)layer_v) & (CONTEXT_MEMO - 1);
    PyObject *context = layer_v >= 0 ? context_memo[slot] : NULL;
    if (context && PyTuple_GET_ITEM(context, 0) == op && small_int(PyTuple_GET_ITEM(context, 1), -1) == layer_v) {
        Py_INCREF(context);
    } else {
        if (!(context = PyTuple_Pack(2, op, layer))) return -1;
        if (layer_v >= 0) Py_XSETREF(context_memo[slot], Py_NewRef(context));
    }
    Py_XSETREF(SLOT(mem, K.mem_context), context);
    return 0;
}

/* n * one sample's activation bytes, or -1 (never raises). */
static long long activation_bytes(PyObject *self, long n) {
    PyObject *per_sample = SLOT(self, K.m_act_bytes);
    long long each = per_sample ? long_long_of(per_sample) : -1;
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

    /* a forward of samples this layer (and TP slice) has already seen on this rank is a recompute
       (`RankState.seen_before`: what the layer has forwarded is a mask, or [first, stop] of one run of samples) */
    PyObject *before = PyList_GET_ITEM(masks, layer_v);
    long first, stop;
    if (!mask_bounds(samples, &first, &stop)) goto slow;
    int one_run = n == stop - first, recompute;
    if (PyList_CheckExact(before)) {
        long run_first = PyList_GET_SIZE(before) == 2 ? small_int(PyList_GET_ITEM(before, 0), -1) : -1;
        long run_stop = PyList_GET_SIZE(before) == 2 ? small_int(PyList_GET_ITEM(before, 1), -1) : -1;
        if (run_first < 0 || run_stop < 0) goto slow;
        if (run_first <= first && stop <= run_stop) {
            recompute = 1;
        } else if (one_run && first == run_stop) { /* the next samples after the run: the run goes on */
            PyObject *now = PyLong_FromLong(stop);
            if (!now) return NULL;
            PyList_SetItem(before, 1, now); /* steals `now` */
            recompute = 0;
        } else {
            goto slow; /* the run becomes a mask again: the Python twin builds it */
        }
    } else if (PyLong_CheckExact(before) && Py_SIZE(before) == 0 && one_run) {
        PyObject *run = PyList_New(2), *a = PyLong_FromLong(first), *b = PyLong_FromLong(stop);
        if (!run || !a || !b) { Py_XDECREF(run); Py_XDECREF(a); Py_XDECREF(b); return NULL; }
        PyList_SET_ITEM(run, 0, a);
        PyList_SET_ITEM(run, 1, b);
        PyList_SetItem(masks, layer_v, run); /* steals `run` */
        recompute = 0;
    } else if (PyLong_CheckExact(before)) {
        PyObject *seen = PyNumber_And(before, samples);
        if (!seen) return NULL;
        recompute = PyObject_RichCompareBool(seen, samples, Py_EQ);
        Py_DECREF(seen);
        if (recompute < 0) return NULL;
        if (!recompute) {
            int any = PyObject_IsTrue(before);
            if (any < 0) return NULL;
            PyObject *now = any ? PyNumber_Or(before, samples) : Py_NewRef(samples);
            if (!now) return NULL;
            PyList_SetItem(masks, layer_v, now); /* steals `now` */
        }
    } else {
        goto slow;
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
        long long stash_bytes = long_long_of(PyTuple_GET_ITEM(cost, 2));
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
        PyObject *sizes = shard_sizes_get(SLOT(self, K.m_shard_sizes), layer, layer_v, tp, small_int(tp, -1));
        if (!sizes || !PyTuple_CheckExact(sizes) || PyTuple_GET_SIZE(sizes) != 2) return 0;
        weight_grad_bytes = long_long_of(PyTuple_GET_ITEM(sizes, 0));
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
    long long kept = long_long_of(PyTuple_GET_ITEM(cost, 2));
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
    PyObject *both;
    if (masks_join(mine, theirs, &both)) goto slow; /* (or an error): Python says which samples */
    PyObject *fields[7] = {SLOT(self, K.w_rank), SLOT(self, K.w_layer), both, SLOT(self, K.w_shards),
                           SLOT(self, K.w_num_shards), SLOT(self, K.w_tp_rank), SLOT(self, K.w_tp_size)};
    PyObject *sum = buffer_view(K.WeightGrad, self, fields, 7); /* like `.grad +=`: the left buffer */
    Py_DECREF(both);
    return sum;
slow:
    return fallback(K.py_add, self, args, nargs, kwnames);
}

static PyMethodDef add_def; /* WeightGrad.__add__ (below) */

/* ---- runs of layers (`model/layer_runs.py`) -------------------------------------------------------- */

/* The bounds of `layers`, a range of step 1: 1, or 0 (never raises) for the Python twin to take. A stage passes
 * the same range object for each run of a chunk's layers: the last few ranges' bounds are remembered by
 * identity (each held, so that its address names no other object while it is here; a range never changes). */
#define RANGE_MEMO 8
static struct {
    PyObject *range; /* a strong reference, or NULL */
    long start, stop;
    int ok;
} range_memo[RANGE_MEMO];
static int range_next;

static int run_bounds(PyObject *layers, long *start, long *stop) {
    if (!PyRange_Check(layers)) return 0;
    for (int i = 0; i < RANGE_MEMO; i++)
        if (range_memo[i].range == layers) {
            *start = range_memo[i].start;
            *stop = range_memo[i].stop;
            return range_memo[i].ok;
        }
    PyObject *v[3] = {PyObject_GetAttr(layers, K.s_start), PyObject_GetAttr(layers, K.s_stop),
                      PyObject_GetAttr(layers, K.s_step)};
    long got[3];
    for (int i = 0; i < 3; i++) {
        got[i] = small_int(v[i], -1);
        Py_XDECREF(v[i]);
    }
    PyErr_Clear();
    *start = got[0];
    *stop = got[1];
    int ok = got[0] >= 0 && got[1] >= got[0] && got[2] == 1;
    int slot = range_next++ & (RANGE_MEMO - 1);
    Py_XSETREF(range_memo[slot].range, Py_NewRef(layers));
    range_memo[slot].start = got[0];
    range_memo[slot].stop = got[1];
    range_memo[slot].ok = ok;
    return ok;
}

/* `loaded[layer][0]`: the weight of what `load_weights` returned for `layer` (a new reference), or NULL
 * with the error the Python twin's subscripts raise. */
static PyObject *loaded_weight(PyObject *loaded, PyObject *layer) {
    PyObject *entry = PyDict_GetItemWithError(loaded, layer);
    if (!entry) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, layer);
        return NULL;
    }
    return PySequence_GetItem(entry, 0);
}

/* list.pop() of a list the call owns a reference to: the last item (a new reference), or NULL and
 * IndexError as list.pop raises it. */
static PyObject *list_pop(PyObject *list) {
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (!n) {
        PyErr_SetString(PyExc_IndexError, "pop from empty list");
        return NULL;
    }
    PyObject *item = Py_NewRef(PyList_GET_ITEM(list, n - 1));
    if (PyList_SetSlice(list, n - 1, n, NULL) < 0) { Py_DECREF(item); return NULL; }
    return item;
}

/* `LayerRuns.forward_layers(layers, act, loaded)`: `forward` (`fast_forward`) for each layer in order. */
static PyObject *fast_forward_layers(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    long start, stop;
    /* (a subclass of Model may have its own forward: the Python twin calls it) */
    if (Py_TYPE(self) != K.Model || nargs != 3 || kwnames || !run_bounds(args[0], &start, &stop) ||
        !PyDict_CheckExact(args[2]))
        return fallback(K.py_forward_layers, self, args, nargs, kwnames);
    PyObject *loaded = args[2], *act = Py_NewRef(args[1]);
    PyObject *xs = PyList_New(0);
    if (!xs || PyList_Append(xs, act) < 0) goto fail;
    for (long l = start; l < stop; l++) {
        PyObject *layer = PyLong_FromLong(l);
        PyObject *weight = layer ? loaded_weight(loaded, layer) : NULL;
        if (!weight) { Py_XDECREF(layer); goto fail; }
        PyObject *call[3] = {layer, act, weight};
        PyObject *out = fast_forward(self, call, 3, NULL);
        Py_DECREF(weight);
        Py_DECREF(layer);
        if (!out) goto fail;
        Py_SETREF(act, out);
        if (PyList_Append(xs, act) < 0) goto fail;
    }
    Py_DECREF(act);
    return xs;
fail:
    Py_XDECREF(xs);
    Py_DECREF(act);
    return NULL;
}

/* `LayerRuns.backward_layers(layers, held, loaded, grads)`: `backward` (`fast_backward`) for each layer, the
 * last first, its weight gradient summed into `grads`, and what the run lets go of freed in the twin's order:
 * the old sum, the weight gradient, the input, then the output gradient. */
static PyObject *fast_backward_layers(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    long start, stop;
    if (Py_TYPE(self) != K.Model || nargs != 4 || kwnames || !run_bounds(args[0], &start, &stop) ||
        !PyList_CheckExact(args[1]) ||
        !PyDict_CheckExact(args[2]) || !PyDict_CheckExact(args[3]))
        return fallback(K.py_backward_layers, self, args, nargs, kwnames);
    PyObject *held = args[1], *loaded = args[2], *grads = args[3];
    Py_INCREF(held); /* (a caller's list: kept alive while it is popped) */
    PyObject *grad = list_pop(held);
    if (!grad) { Py_DECREF(held); return NULL; }
    for (long l = stop - 1; l >= start; l--) {
        PyObject *x = list_pop(held);
        if (!x) goto fail;
        PyObject *layer = PyLong_FromLong(l);
        PyObject *weight = layer ? loaded_weight(loaded, layer) : NULL;
        if (!weight) { Py_XDECREF(layer); Py_DECREF(x); goto fail; }
        PyObject *call[4] = {layer, x, grad, weight};
        PyObject *pair = fast_backward(self, call, 4, NULL);
        Py_DECREF(weight);
        if (pair && (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2)) {
            Py_DECREF(pair);
            pair = NULL;
            PyErr_SetString(PyExc_TypeError, "Model.backward must return (weight gradient, input gradient)");
        }
        if (!pair) { Py_DECREF(layer); Py_DECREF(x); goto fail; }
        PyObject *weight_grad = Py_NewRef(PyTuple_GET_ITEM(pair, 0)), *grad_in = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
        Py_DECREF(pair);
        PyObject *total = PyDict_GetItemWithError(grads, layer);
        Py_XINCREF(total);
        int failed = 0;
        if (!total && PyErr_Occurred()) {
            failed = 1;
        } else if (!total || total == Py_None) {
            failed = PyDict_SetItem(grads, layer, weight_grad) < 0;
        } else {
            /* `total + weight_grad`: WeightGrad.__add__ straight, while it is this file's */
            PyObject *add = Py_TYPE(total) == K.WeightGrad && Py_TYPE(weight_grad) == K.WeightGrad
                                ? _PyType_Lookup(K.WeightGrad, K.s_add) : NULL;
            int direct = add && Py_IS_TYPE(add, &PyMethodDescr_Type) &&
                         ((PyMethodDescrObject *)add)->d_method == &add_def;
            PyObject *sum = direct ? fast_add(total, &weight_grad, 1, NULL) : PyNumber_Add(total, weight_grad);
            failed = !sum || PyDict_SetItem(grads, layer, sum) < 0;
            Py_XDECREF(sum);
        }
        Py_XDECREF(total); /* freed in this order, as the Python twin frees them */
        Py_DECREF(weight_grad);
        Py_DECREF(x);
        Py_DECREF(layer);
        Py_SETREF(grad, grad_in);
        if (failed) goto fail;
    }
    Py_DECREF(held);
    return grad;
fail:
    Py_DECREF(grad);
    Py_DECREF(held);
    return NULL;
}

/* ---- install ------------------------------------------------------------------------------------- */

static PyMethodDef forward_layers_def = {"forward_layers", (PyCFunction)(void (*)(void))fast_forward_layers,
                                         METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef backward_layers_def = {"backward_layers", (PyCFunction)(void (*)(void))fast_backward_layers,
                                          METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef forward_def = {"forward", (PyCFunction)(void (*)(void))fast_forward, METH_FASTCALL | METH_KEYWORDS,
                                  NULL};
static PyMethodDef backward_def = {"backward", (PyCFunction)(void (*)(void))fast_backward,
                                   METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef backward_input_def = {"backward_input", (PyCFunction)(void (*)(void))fast_backward_input,
                                         METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef backward_weight_def = {"backward_weight", (PyCFunction)(void (*)(void))fast_backward_weight,
                                          METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef add_def = {"__add__", (PyCFunction)(void (*)(void))fast_add, METH_FASTCALL | METH_KEYWORDS, NULL};

/* The names and constants the twin reads, made once, by the first install. */
static int ops_names(void) {
    if (K.s_forward) return 0;
    struct { PyObject **out; const char *text; } strings[] = {
        {&K.s_forward, "forward"}, {&K.s_backward, "backward"}, {&K.s_backward_input, "backward_input"},
        {&K.s_backward_weight, "backward_weight"}, {&K.s_compute, "compute"},
        {&K.s_recompute, "recompute"}, {&K.s_empty, ""}, {&K.s_none, "none"}, {&K.s_stash, "stash"},
        {&K.s_selective, "selective_recompute"}, {&K.s_cost, "_cost"},
        {&K.s_events, "events"}, {&K.s_add, "__add__"}, {&K.s_pack, "pack"}, {&K.s_selective_mode, "selective"},
        {&K.s_start, "start"}, {&K.s_stop, "stop"}, {&K.s_step, "step"},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!(*strings[i].out = PyUnicode_InternFromString(strings[i].text))) return -1;
    K.zero = PyLong_FromLong(0);
    K.one = PyLong_FromLong(1);
    if (!K.zero || !K.one) return -1;
    return 0;
}

PyObject *install_ops(PyObject *module, PyObject *args) {
    if (ops_names() < 0) return NULL;
    PyObject *Model, *RankState, *MemoryTracker, *Activation, *ActivationGrad, *Weight, *WeightGrad, *Stash;
    PyObject *docs;
    Py_ssize_t pack_at;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!nO!:install_ops", &PyType_Type, &Model, &PyType_Type, &RankState,
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
    PyTypeObject **types[] = {&K.Model, &K.Activation, &K.ActivationGrad, &K.Weight, &K.WeightGrad, &K.Stash};
    PyObject *given[] = {Model, Activation, ActivationGrad, Weight, WeightGrad, Stash};
    for (int i = 0; i < 6; i++) {
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
        replace_method(WeightGrad, &add_def, &K.py_add, K.docs) < 0 ||
        replace_method(Model, &forward_layers_def, &K.py_forward_layers, K.docs) < 0 ||
        replace_method(Model, &backward_layers_def, &K.py_backward_layers, K.docs) < 0)
        return NULL;
    PyTypeObject *tensors[] = {K.Activation, K.ActivationGrad, K.Weight, K.WeightGrad, K.Stash};
    for (int i = 0; i < 5; i++)
        if (fast_tensor_dealloc(tensors[i]) < 0) return NULL;
    set_clock_slot((PyTypeObject *)RankState, K.s_clock);
    Py_RETURN_NONE;
}

/* ==== weight_ops ================================================================================== */

/* `weight_ops`: C twins of the per-layer weight ops: `Model.load_weights`, `Model.update` and
 * `Model.set_final_weight`.
 *
 * As `ops` does, each handles the common valid call exactly as the Python method in `model/handle.py` does
 * (same checks, cost-cache key, event and allocations) and hands every other call to that method, which
 * stays the specification: a keyword it does not know, a first use of a size or cost, an update that
 * allocates (a weight holding other ZeRO shards than its optimizer state), a layer's second shard
 * (`op_checks._first_time` then keeps a set), and any error. Nothing is changed before the fast path is
 * sure to finish, so the Python method starts from the same state.
 */

/* Slot offsets, classes and constants, resolved once by `install_weight_ops`. */
static struct {
    PyTypeObject *Weight, *OptState, *WeightGrad;
    PyObject *py_load, *py_update, *py_final; /* the Python twins */
    PyObject *docs;
    /* Model */
    Py_ssize_t m_state, m_mem, m_events, m_cache, m_rank, m_num_layers, m_shard_sizes, m_full_batch;
    /* RankState and MemoryTracker */
    Py_ssize_t s_clock, s_updated, s_handed, s_final_weights, s_loaded, mem_context;
    /* Weight, OptState and WeightGrad share these offsets (checked by `install_weight_ops`) */
    Py_ssize_t rank, layer, step, shards, num_shards, tp_rank, tp_size, samples;
    PyObject *s_load, *s_update, *s_compute, *s_empty, *s_shard, *s_num_shards, *s_tp_rank, *s_tp_size, *zero,
        *one, *zero_float;
} W;

/* `op_checks._shard_key(shards, num_shards, tp_rank)` for the ranges where C computes it as Python does;
 * NULL without an exception elsewhere (the caller takes the slow path). */
static PyObject *shard_key(PyObject *shards, PyObject *num_shards, PyObject *tp_rank) {
    long n = small_int(num_shards, -1), s = small_int(shards, -1), t = small_int(tp_rank, -1);
    if (n == 1) return Py_NewRef(tp_rank);
    if (n < 1 || n >= 1L << 16 || s < 0 || s >= 1L << 31 || t < 0 || t >= 1L << 16) return NULL;
    return PyLong_FromUnsignedLongLong(((unsigned long long)s << 16 | (unsigned long long)n) << 16 |
                                       (unsigned long long)t);
}

/* Is `layer`'s entry of `seen` (RankState.updated or .handed) still empty? When it is taken (the Python
 * `_first_time` decides then) or off the list, no. */
static int first_time(PyObject *seen, long layer) {
    return PyList_CheckExact(seen) && layer >= 0 && layer < PyList_GET_SIZE(seen) &&
           PyList_GET_ITEM(seen, layer) == Py_None;
}

/* t holds every parameter of the optimizer state's shards (`op_checks._covers`), for masks that fit a long. */
static int covers(PyObject *t, long opt_shards, long opt_num_shards) {
    long n = small_int(SLOT(t, W.num_shards), -1), s = small_int(SLOT(t, W.shards), -1);
    if (n < 1 || n > 62 || s < 0) return 0;
    return s == (1L << n) - 1 || (n == opt_num_shards && (s & opt_shards) == opt_shards);
}

/* ---- load_weights -------------------------------------------------------------------------------- */

static PyObject *fast_load_weights(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    /* layer, shard=0, num_shards=1, *, tp_rank=0, tp_size=1 */
    PyObject *given[5] = {NULL, W.zero, W.one, W.zero, W.one};
    PyObject *names[5] = {NULL, W.s_shard, W.s_num_shards, W.s_tp_rank, W.s_tp_size};
    if (nargs < 1 || nargs > 3) goto slow;
    for (Py_ssize_t i = 0; i < nargs; i++) given[i] = args[i];
    for (Py_ssize_t k = 0; kwnames && k < PyTuple_GET_SIZE(kwnames); k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int i = 1;
        while (i < 5 && names[i] != name) i++;
        if (i == 5 || i < nargs) goto slow; /* unknown, not interned, or given twice: Python says which */
        given[i] = args[nargs + k];
    }
    PyObject *layer = given[0], *shard = given[1], *num_shards = given[2], *tp_rank = given[3], *tp = given[4];
    long layer_v = small_int(layer, -1), shard_v = small_int(shard, -1), n = small_int(num_shards, -1);
    long t = small_int(tp_rank, -1), tp_v = small_int(tp, -1);
    if (!PyLong_CheckExact(layer) || layer_v < 0 || layer_v >= small_int(SLOT(self, W.m_num_layers), 0) ||
        shard_v < 0 || shard_v >= n || shard_v > 62 || t < 0 || t >= tp_v || tp_v > 1L << 20 || n > 1L << 20)
        goto slow;
    PyObject *sizes = memo_get(SLOT(self, W.m_shard_sizes), NULL, NULL, NULL, layer_v, tp_v * n);
    if (!sizes) {
        PyObject *parts = PyLong_FromLong(tp_v * n);
        if (!parts) return NULL;
        sizes = shard_sizes_get(SLOT(self, W.m_shard_sizes), layer, layer_v, parts, tp_v * n);
        Py_DECREF(parts);
    }
    if (!sizes || !PyTuple_CheckExact(sizes) || PyTuple_GET_SIZE(sizes) != 2) {
        if (PyErr_Occurred()) return NULL;
        goto slow; /* the first time for this (layer, parts): Python computes and caches the sizes */
    }
    long long weight_bytes = long_long_of(PyTuple_GET_ITEM(sizes, 0));
    long long optimizer_bytes = long_long_of(PyTuple_GET_ITEM(sizes, 1));
    if (PyErr_Occurred()) return NULL;
    AllocLog *mem = (AllocLog *)SLOT(self, W.m_mem);
    PyObject *context = PyTuple_Pack(2, W.s_load, layer);
    if (!context) return NULL;
    Py_XSETREF(SLOT(mem, W.mem_context), context);
    PyObject *shards = PyLong_FromLong(1L << shard_v);
    if (!shards) return NULL;
    PyObject *load = PyTuple_Pack(5, layer, shards, num_shards, tp_rank, tp); /* RankState.loaded */
    if (!load || PyList_Append(SLOT(SLOT(self, W.m_state), W.s_loaded), load) < 0) {
        Py_XDECREF(load);
        Py_DECREF(shards);
        return NULL;
    }
    Py_DECREF(load);
    PyObject *fields[8] = {SLOT(self, W.m_rank), layer, W.zero, shards, num_shards, tp_rank, tp, W.zero};
    PyObject *weight = buffer_alloc(W.Weight, mem, weight_bytes, fields, 8), *result = NULL;
    PyObject *opt = weight ? buffer_alloc(W.OptState, mem, optimizer_bytes, fields, 8) : NULL;
    if (opt) result = PyTuple_Pack(2, weight, opt);
    Py_DECREF(shards);
    Py_XDECREF(weight);
    Py_XDECREF(opt);
    return result;
slow:
    return fallback(W.py_load, self, args, nargs, kwnames);
}

/* ---- update -------------------------------------------------------------------------------------- */

static PyObject *fast_update(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs != 4 || kwnames) goto slow;
    PyObject *layer = args[0], *grad = args[1], *weight = args[2], *opt = args[3], *rank = SLOT(self, W.m_rank);
    if (!PyLong_CheckExact(layer) || Py_TYPE(grad) != W.WeightGrad || Py_TYPE(weight) != W.Weight ||
        Py_TYPE(opt) != W.OptState)
        goto slow;
    PyObject *shards = SLOT(opt, W.shards), *num_shards = SLOT(opt, W.num_shards);
    PyObject *tp_rank = SLOT(opt, W.tp_rank), *tp = SLOT(opt, W.tp_size), *full = SLOT(self, W.m_full_batch);
    long layer_v = small_int(layer, -1), n = small_int(num_shards, -1), s = small_int(shards, -1);
    PyObject *state = SLOT(self, W.m_state);
    PyObject *updated = SLOT(state, W.s_updated);
    if (layer_v < 0 || n < 1 || n > 62 || s < 0 || !tp || !full || !first_time(updated, layer_v)) goto slow;
    PyObject *const tensors[3] = {grad, weight, opt};
    for (int i = 0; i < 3; i++)
        if (int_eq(SLOT(tensors[i], W.rank), rank) != 1 || int_eq(SLOT(tensors[i], W.layer), layer) != 1 ||
            buffer_log(tensors[i]) != SLOT(self, W.m_mem))
            goto slow;
    if (int_eq(SLOT(grad, W.tp_rank), tp_rank) != 1 || int_eq(SLOT(weight, W.tp_rank), tp_rank) != 1 ||
        int_eq(SLOT(grad, W.tp_size), tp) != 1 || int_eq(SLOT(weight, W.tp_size), tp) != 1 ||
        !covers(grad, s, n) || !covers(weight, s, n) || small_int(SLOT(weight, W.step), -1) != 0 ||
        small_int(SLOT(opt, W.step), -1) != 0 || int_eq(SLOT(grad, W.samples), full) != 1 ||
        /* updated in place: the weight holds the optimizer state's shards (else Python allocates) */
        int_eq(SLOT(weight, W.shards), shards) != 1 || int_eq(SLOT(weight, W.num_shards), num_shards) != 1)
        goto slow;
    PyObject *key_shard = shard_key(shards, num_shards, tp_rank);
    if (!key_shard) goto slow;
    /* the cost cache's key (update, layer, shards held, num_shards, tp); remembered by (update, tp,
       num_shards) by identity and (layer, shards held) by value (no compute op's key has `update` first) */
    PyObject *cache = SLOT(self, W.m_cache);
    PyObject *cost = memo_get(cache, W.s_update, tp, num_shards, layer_v, __builtin_popcountl(s));
    if (!cost) {
        PyObject *held = PyLong_FromLong(__builtin_popcountl(s));
        PyObject *cost_key = held ? PyTuple_Pack(5, W.s_update, layer, held, num_shards, tp) : NULL;
        Py_XDECREF(held);
        cost = cost_key ? PyDict_GetItemWithError(cache, cost_key) : NULL;
        Py_XDECREF(cost_key);
        if (cost) memo_put(cache, W.s_update, tp, num_shards, layer_v, __builtin_popcountl(s), cost);
    }
    if (!cost || !PyTuple_CheckExact(cost) || PyTuple_GET_SIZE(cost) != 2) {
        Py_DECREF(key_shard);
        if (PyErr_Occurred()) return NULL;
        goto slow; /* the first update of this shape on this device type: Python computes the cost */
    }
    PyObject *start = SLOT(state, W.s_clock);
    double duration = PyFloat_AsDouble(PyTuple_GET_ITEM(cost, 0));
    double start_s = start ? PyFloat_AsDouble(start) : -1.0;
    PyObject *end = PyErr_Occurred() || !start ? NULL : PyFloat_FromDouble(start_s + duration);
    PyObject *items[12] = {rank, W.s_update, W.s_compute, start, end, layer, full, PyTuple_GET_ITEM(cost, 1),
                           W.zero_float, Py_None, W.zero, W.s_empty};
    if (!end || append_event(SLOT(self, W.m_events), items) < 0) {
        Py_XDECREF(end);
        Py_DECREF(key_shard);
        return NULL;
    }
    PyList_SetItem(updated, layer_v, key_shard); /* steals `key_shard` */
    Py_SETREF(SLOT(state, W.s_clock), end);      /* the event holds its own reference */
    PyObject *fields[8] = {rank, layer, W.one, shards, num_shards, tp_rank, tp, full};
    PyObject *new_weight = buffer_view(W.Weight, weight, fields, 8), *result = NULL;
    PyObject *new_opt = new_weight ? buffer_view(W.OptState, opt, fields, 8) : NULL;
    if (new_opt) result = PyTuple_Pack(2, new_weight, new_opt);
    Py_XDECREF(new_weight);
    Py_XDECREF(new_opt);
    return result;
slow:
    return fallback(W.py_update, self, args, nargs, kwnames);
}

/* ---- set_final_weight ---------------------------------------------------------------------------- */

static PyObject *fast_set_final_weight(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames) {
    if (nargs != 2 || kwnames) goto slow;
    PyObject *layer = args[0], *weight = args[1], *state = SLOT(self, W.m_state);
    PyObject *handed = SLOT(state, W.s_handed), *finals = SLOT(state, W.s_final_weights);
    long layer_v = small_int(layer, -1);
    if (!PyLong_CheckExact(layer) || Py_TYPE(weight) != W.Weight || !finals || !PyList_CheckExact(finals) ||
        !first_time(handed, layer_v) || int_eq(SLOT(weight, W.rank), SLOT(self, W.m_rank)) != 1 ||
        int_eq(SLOT(weight, W.layer), layer) != 1 || buffer_log(weight) != SLOT(self, W.m_mem))
        goto slow;
    PyObject *key = shard_key(SLOT(weight, W.shards), SLOT(weight, W.num_shards), SLOT(weight, W.tp_rank));
    if (!key) goto slow;
    if (PyList_Append(finals, weight) < 0) {
        Py_DECREF(key);
        return NULL;
    }
    PyList_SetItem(handed, layer_v, key); /* steals `key` */
    Py_RETURN_NONE;
slow:
    return fallback(W.py_final, self, args, nargs, kwnames);
}

/* ---- install ------------------------------------------------------------------------------------- */

static PyMethodDef load_def = {"load_weights", (PyCFunction)(void (*)(void))fast_load_weights,
                               METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef update_def = {"update", (PyCFunction)(void (*)(void))fast_update, METH_FASTCALL | METH_KEYWORDS,
                                 NULL};
static PyMethodDef final_def = {"set_final_weight", (PyCFunction)(void (*)(void))fast_set_final_weight,
                                METH_FASTCALL | METH_KEYWORDS, NULL};

/* The names and constants the twin reads, made once, by the first install. */
static int weight_ops_names(void) {
    if (W.s_load) return 0;
    struct { PyObject **out; const char *text; } strings[] = {
        {&W.s_load, "load_weights"}, {&W.s_update, "update"}, {&W.s_compute, "compute"}, {&W.s_empty, ""},
        {&W.s_shard, "shard"}, {&W.s_num_shards, "num_shards"}, {&W.s_tp_rank, "tp_rank"},
        {&W.s_tp_size, "tp_size"},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!(*strings[i].out = PyUnicode_InternFromString(strings[i].text))) return -1;
    if (!(W.zero = PyLong_FromLong(0)) || !(W.one = PyLong_FromLong(1)) || !(W.zero_float = PyFloat_FromDouble(0.0)))
        return -1;
    return 0;
}

PyObject *install_weight_ops(PyObject *module, PyObject *args) {
    if (weight_ops_names() < 0) return NULL;
    PyObject *Model, *RankState, *MemoryTracker, *Weight, *OptState, *WeightGrad, *docs;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!:install_weight_ops", &PyType_Type, &Model, &PyType_Type,
                          &RankState, &PyType_Type, &MemoryTracker, &PyType_Type, &Weight, &PyType_Type, &OptState,
                          &PyType_Type, &WeightGrad, &PyDict_Type, &docs))
        return NULL;
    struct { PyObject *cls; const char *name; Py_ssize_t *out; } slots[] = {
        {Model, "_state", &W.m_state}, {Model, "_mem", &W.m_mem}, {Model, "_events", &W.m_events},
        {Model, "_cache", &W.m_cache}, {Model, "rank", &W.m_rank}, {Model, "num_layers", &W.m_num_layers},
        {Model, "_shard_sizes", &W.m_shard_sizes}, {Model, "_full_batch", &W.m_full_batch},
        {RankState, "clock", &W.s_clock}, {RankState, "updated", &W.s_updated}, {RankState, "handed", &W.s_handed},
        {RankState, "final_weights", &W.s_final_weights}, {RankState, "loaded", &W.s_loaded}, {MemoryTracker, "context", &W.mem_context},
        {Weight, "rank", &W.rank}, {Weight, "layer", &W.layer}, {Weight, "step", &W.step},
        {Weight, "shards", &W.shards}, {Weight, "num_shards", &W.num_shards}, {Weight, "tp_rank", &W.tp_rank},
        {Weight, "tp_size", &W.tp_size}, {Weight, "samples", &W.samples},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slot_offset(slots[i].cls, slots[i].name, slots[i].out) < 0) return NULL;
    const char *shared[] = {"rank", "layer", "shards", "num_shards", "tp_rank", "tp_size", "samples"};
    Py_ssize_t want[] = {W.rank, W.layer, W.shards, W.num_shards, W.tp_rank, W.tp_size, W.samples};
    PyObject *siblings[] = {OptState, WeightGrad};
    if (same_layout(siblings, 2, shared, want, 7) < 0) return NULL;
    PyObject *given[] = {Weight, OptState, WeightGrad};
    PyTypeObject **types[] = {&W.Weight, &W.OptState, &W.WeightGrad};
    for (int i = 0; i < 3; i++) Py_XSETREF(*types[i], (PyTypeObject *)Py_NewRef(given[i]));
    Py_XSETREF(W.docs, Py_NewRef(docs));
    if (replace_method(Model, &load_def, &W.py_load, W.docs) < 0 ||
        replace_method(Model, &update_def, &W.py_update, W.docs) < 0 ||
        replace_method(Model, &final_def, &W.py_final, W.docs) < 0)
        return NULL;
    for (int i = 0; i < 3; i++)
        if (fast_tensor_dealloc(*types[i]) < 0) return NULL;
    Py_RETURN_NONE;
}

