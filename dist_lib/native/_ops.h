/* What the C twins of `Model`'s ops share: `_ops.c` (forward, the backward ops, gradient sum) and
 * `_weight_ops.c` (load_weights, update, set_final_weight). */
#ifndef DIST_LIB_OPS_H
#define DIST_LIB_OPS_H

#include "_buffers.h"

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* a == b for two ints (identity first: small ints are shared). -1 with an exception set on error. */
static inline int int_eq(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (!a || !b) return 0;
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* An exact int's value when it fits a long, else `fallback` (never raises). */
static inline long small_int(PyObject *x, long fallback) {
    if (!x || !PyLong_CheckExact(x)) return fallback;
    int overflow;
    long v = PyLong_AsLongAndOverflow(x, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); return fallback; }
    return v;
}

/* Append the event tuple (rank, op, stream, start, end, layer, samples, nbytes, flops, peers, op_id, detail)
 * of these 12 fields (borrowed) to the list `events`. 0, or -1 with an exception. */
int append_event(PyObject *events, PyObject *const *fields);
/* `engine.new_op_id()`: add one to the engine's attribute `next_op_id` (the interned name) and return the
 * new id (a new reference), or NULL with an exception. */
PyObject *take_op_id(PyObject *engine, PyObject *next_op_id);
/* Set bits of a non-negative mask (its samples); -1 if it is not one (never raises). */
long mask_bit_count(PyObject *mask);
/* Is `mask` == (1 << n) - 1, every one of n shards (never raises)? */
int is_full_mask(PyObject *mask, long n);
/* Call the Python twin with self first (dropping any exception set on the way: the twin meets and
 * reports the same problem). */
PyObject *fallback(PyObject *twin, PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
/* The offset of the slot `name` of `cls`; -1 with TypeError if it is not an object slot. */
int slot_offset(PyObject *cls, const char *name, Py_ssize_t *out);
/* Do the classes `siblings` have the slots `names` at the offsets `want` (those of the class the fast ops
 * read them from)? 0, or -1 with TypeError naming the first that does not. */
int same_layout(PyObject *const *siblings, int nsiblings, const char *const *names, const Py_ssize_t *want,
                int nnames);
/* Put `def` on `cls`, keeping the Python method in *twin; docs[name] (kept alive by the caller) becomes
 * the C method's signature and docstring. */
int replace_method(PyObject *cls, PyMethodDef *def, PyObject **twin, PyObject *docs);
/* A class `module` defines, to store in *out (replacing a reference held there). */
typedef struct { const char *name; PyTypeObject **out; } ClassRef;
/* Look up each of `refs` on `module` (named `where` in errors). 0, or -1 with an exception (TypeError
 * if one is not a class). */
int load_classes(PyObject *module, const char *where, const ClassRef *refs, size_t n);

#endif
