/* What every twin's install and fast paths share: ints read as sample masks, events appended to a
 * rank's log, the call to a Python twin, and reading classes' slots and putting C methods on them.
 * `common_ready` makes their state once, when the module is made (`_module.c`). */
#include "_common.h"

PyObject *str_clock, *str_code, *str_args, *str_defaults, *str_frombytes, *array_type;

/* ---- ints and events ------------------------------------------------------------------------------ */

/* The C functions behind `int.bit_count` and `int.bit_length` (METH_NOARGS), found once by `common_ready`:
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

#ifdef MASK_DIGITS
/* The bit count and bounds of the wide masks read last, by identity (each held, so that its address names no
 * other int while it is here; an int never changes): a microbatch's mask is one int object that every op on
 * it reads again, and a mask as wide as a step of thousands of samples is a hundred digits and more to scan. */
#define MASK_MEMO 64 /* a power of two */
#define WIDE_MASK 4  /* digits from which a mask is remembered */
typedef struct {
    PyObject *mask; /* a strong reference, or NULL */
    long count, first, stop;
} MaskFacts;
static MaskFacts mask_memo[MASK_MEMO];

/* The memo's entry for a positive exact int of at least WIDE_MASK digits, filled if it was not there. */
static inline MaskFacts *wide_mask(PyObject *mask, Py_ssize_t ndigits) {
    size_t slot = (size_t)(((uintptr_t)mask >> 4) * 0x9E3779B97F4A7C15ULL >> 32) & (MASK_MEMO - 1);
    if (mask_memo[slot].mask == mask) return &mask_memo[slot];
    const digit *d = MASK_DIGITS(mask);
    long count = 0;
    Py_ssize_t i = 0;
    for (; i + 1 < ndigits; i += 2) { /* two 30-bit digits per 64-bit popcount */
        unsigned long long word = (unsigned long long)d[i] | (unsigned long long)d[i + 1] << 30;
        /* a microbatch's mask is zero below its samples: without a popcount instruction in the build
           each count is a library call, so the zero words are skipped */
        if (word) count += __builtin_popcountll(word);
    }
    if (i < ndigits) count += __builtin_popcountll(d[i]);
    i = 0;
    while (!d[i]) i++; /* (the top digit of a positive int is not zero) */
    Py_XSETREF(mask_memo[slot].mask, Py_NewRef(mask));
    mask_memo[slot].count = count;
    mask_memo[slot].first = (long)(i * PyLong_SHIFT + __builtin_ctzl((unsigned long)d[i]));
    mask_memo[slot].stop =
        (long)((ndigits - 1) * PyLong_SHIFT + (64 - __builtin_clzll((unsigned long long)d[ndigits - 1])));
    return &mask_memo[slot];
}
#endif

/* Set bits of a non-negative mask (its samples); -1 if it is not one (never raises). Where the digits
 * can be read, they are counted directly: asking for an unsigned long long first would raise (and clear)
 * an OverflowError for every mask of a step of more than 64 samples. */
long mask_bit_count(PyObject *mask) {
    if (!mask || !PyLong_CheckExact(mask)) return -1;
#ifdef MASK_DIGITS
    Py_ssize_t ndigits = MASK_NDIGITS(mask);
    if (ndigits >= WIDE_MASK) return wide_mask(mask, ndigits)->count;
    if (ndigits >= 0) {
        const digit *d = MASK_DIGITS(mask);
        long count = 0;
        for (Py_ssize_t i = 0; i < ndigits; i++)
            if (d[i]) count += __builtin_popcountll(d[i]);
        return count;
    }
#else
    unsigned long long v = PyLong_AsUnsignedLongLong(mask);
    if (v != (unsigned long long)-1 || !PyErr_Occurred()) return __builtin_popcountll(v);
    PyErr_Clear(); /* negative, or wider than 64 bits (a step of more than 64 samples) */
#endif
    return int_method(mask, int_bit_count);
}

/* The lowest set bit and the bit length of a positive mask (its first sample and one past its last), or 0
 * (never raises) where this build does not read an int's digits or `mask` is not a positive int. */
int mask_bounds(PyObject *mask, long *first, long *stop) {
#ifdef MASK_DIGITS
    if (!mask || !PyLong_CheckExact(mask)) return 0;
    Py_ssize_t ndigits = MASK_NDIGITS(mask);
    if (ndigits <= 0) return 0;
    if (ndigits >= WIDE_MASK) {
        const MaskFacts *facts = wide_mask(mask, ndigits);
        *first = facts->first;
        *stop = facts->stop;
        return 1;
    }
    const digit *d = MASK_DIGITS(mask);
    Py_ssize_t i = 0;
    while (!d[i]) i++; /* (the top digit of a positive int is not zero) */
    *first = (long)(i * PyLong_SHIFT + __builtin_ctzl((unsigned long)d[i]));
    *stop = (long)((ndigits - 1) * PyLong_SHIFT + (64 - __builtin_clzll((unsigned long long)d[ndigits - 1])));
    return 1;
#else
    (void)mask; (void)first; (void)stop;
    return 0;
#endif
}

/* Do two masks share a bit? 1 or 0, or -1 with an exception set. Non-negative ints are compared digit by
 * digit, without making their intersection. */
int masks_overlap(PyObject *a, PyObject *b) {
#ifdef MASK_DIGITS
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) {
        Py_ssize_t na = MASK_NDIGITS(a), nb = MASK_NDIGITS(b);
        if (na >= 0 && nb >= 0) {
            const digit *da = MASK_DIGITS(a), *db = MASK_DIGITS(b);
            for (Py_ssize_t i = 0, n = na < nb ? na : nb; i < n; i++)
                if (da[i] & db[i]) return 1;
            return 0;
        }
    }
#endif
    PyObject *overlap = PyNumber_And(a, b);
    if (!overlap) return -1;
    int clash = PyObject_IsTrue(overlap);
    Py_DECREF(overlap);
    return clash;
}

int masks_join(PyObject *a, PyObject *b, PyObject **out) {
#ifdef MASK_DIGITS
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) {
        Py_ssize_t na = MASK_NDIGITS(a), nb = MASK_NDIGITS(b);
        if (na >= 0 && nb >= 0 && (na >= 3 || nb >= 3)) {
            const digit *da = MASK_DIGITS(a), *db = MASK_DIGITS(b);
            if (na < nb) { /* a is the wider */
                const digit *d = da; da = db; db = d;
                Py_ssize_t n = na; na = nb; nb = n;
            }
            for (Py_ssize_t i = 0; i < nb; i++)
                if (da[i] & db[i]) return 1;
            /* the top digit is a's, not zero: the union is normalized as it stands */
            PyLongObject *both = _PyLong_New(na);
            if (!both) return -1;
            digit *d = MASK_DIGITS(both);
            for (Py_ssize_t i = 0; i < nb; i++) d[i] = da[i] | db[i];
            memcpy(d + nb, da + nb, (size_t)(na - nb) * sizeof(digit));
            *out = (PyObject *)both;
            return 0;
        }
    }
#endif
    int clash = masks_overlap(a, b);
    if (clash) return clash;
    *out = PyNumber_Or(a, b);
    return *out ? 0 : -1;
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

static Py_ssize_t slot_known(PyObject *obj, PyObject *name); /* (below) */

PyObject *take_op_id(PyObject *engine, PyObject *next_op_id) {
    PyObject *last = slot_get(engine, next_op_id);
    Py_ssize_t offset = last && Py_TYPE(engine)->tp_setattro == PyObject_GenericSetAttr
                            ? slot_known(engine, next_op_id) : -1;
    long v = offset >= 0 ? small_int(last, -1) : -1;
    if (v >= 0 && v < LONG_MAX) { /* the engine's slot: the next id stored there straight */
        Py_DECREF(last);
        PyObject *id = PyLong_FromLong(v + 1);
        if (id) Py_XSETREF(SLOT(engine, offset), Py_NewRef(id));
        return id;
    }
    PyObject *one = last ? PyLong_FromLong(1) : NULL;
    PyObject *id = one ? PyNumber_Add(last, one) : NULL;
    Py_XDECREF(last);
    Py_XDECREF(one);
    if (id && PyObject_SetAttr(engine, next_op_id, id) < 0) Py_CLEAR(id);
    return id;
}

/* Call the Python twin with self first. It re-checks everything, so a failed comparison on the way here
 * (an exception set) is dropped: the twin meets and reports the same problem. */
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

/* ---- classes and methods ------------------------------------------------------------------------- */

int slot_offset(PyObject *cls, const char *name, Py_ssize_t *out) {
    PyObject *descr = PyObject_GetAttrString(cls, name);
    if (!descr) return -1;
    int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type) && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
    if (ok) *out = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    if (!ok) PyErr_Format(PyExc_TypeError, "%R.%s is not a slot", cls, name);
    return ok ? 0 : -1;
}

/* The slots read last by name, by the class of the object (held) and the class's version tag: a class changed
 * since (an attribute set on it) gets a new tag, and its slots are looked up again. */
#define SLOT_MEMO 16
static struct {
    PyTypeObject *type; /* a strong reference, or NULL */
    unsigned int version;
    PyObject *name; /* an interned str (held) */
    Py_ssize_t offset;
} slot_memo[SLOT_MEMO];
static int slot_next;

/* Where the object's class keeps the slot `name`, if the memo knows: its offset, or -1. */
static Py_ssize_t slot_known(PyObject *obj, PyObject *name) {
    PyTypeObject *type = Py_TYPE(obj);
    if (PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG))
        for (int i = 0; i < SLOT_MEMO; i++)
            if (slot_memo[i].type == type && slot_memo[i].name == name && slot_memo[i].version == type->tp_version_tag)
                return slot_memo[i].offset;
    return -1;
}

PyObject *slot_get(PyObject *obj, PyObject *name) {
    PyTypeObject *type = Py_TYPE(obj);
    Py_ssize_t offset = slot_known(obj, name);
    if (offset >= 0 && SLOT(obj, offset)) return Py_NewRef(SLOT(obj, offset)); /* (unset: getattr raises) */
    PyObject *value = PyObject_GetAttr(obj, name);
    /* getattr found it through a slot of the class (its member descriptor, which a data descriptor is, comes
       before any instance attribute): remember where */
    PyObject *descr = value ? _PyType_Lookup(type, name) : NULL;
    if (descr && Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
        ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX &&
        PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG)) {
        int i = slot_next++ & (SLOT_MEMO - 1);
        Py_INCREF(type);
        Py_INCREF(name);
        Py_XDECREF(slot_memo[i].type);
        Py_XDECREF(slot_memo[i].name);
        slot_memo[i].type = type;
        slot_memo[i].name = name;
        slot_memo[i].version = type->tp_version_tag;
        slot_memo[i].offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    return value;
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

/* Put `def` on `cls`, keeping the Python method there as the twin; `docs[name]` (its signature and
 * docstring, kept alive by the caller) becomes the C method's. */
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

/* ---- once ---------------------------------------------------------------------------------------- */

int common_ready(void) {
    struct { PyObject **out; const char *text; } strings[] = {
        {&str_clock, "clock"}, {&str_code, "code"}, {&str_args, "_args"}, {&str_defaults, "_defaults"},
        {&str_frombytes, "frombytes"},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!(*strings[i].out = PyUnicode_InternFromString(strings[i].text))) return -1;
    PyObject *array_module = PyImport_ImportModule("array");
    if (!array_module) return -1;
    array_type = PyObject_GetAttrString(array_module, "array");
    Py_DECREF(array_module);
    if (!array_type) return -1;
    return int_c_method("bit_count", &int_bit_count) < 0 || int_c_method("bit_length", &int_bit_length) < 0 ? -1 : 0;
}
