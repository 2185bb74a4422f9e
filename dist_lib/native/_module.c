/* The module `dist_lib._buffers`: every C twin's entry points in one table. Python calls each twin's own
 * install (`model.accelerated.install_c_twins`) or takes its types and functions (`memory.tracker`,
 * `engine.eventlog`, `engine.transfers`), one twin at a time, so that `DIST_SANDBOX_C_OFF` can leave any of
 * them out (`dist_lib.native.twin`). Making the module readies the shared helpers and the types; nothing
 * else runs until Python asks. */
#include "_common.h"

static PyMethodDef methods[] = {
    /* buffers (`_buffers.c`) */
    {"slot_records", slot_records, METH_VARARGS,
     "slot_records(objects, cls, names): the named slots of each object of class `cls`, as tuples (those of "
     "ints untracked by the cycle collector)."},
    /* events (`_events.c`) */
    {"pack_events", (PyCFunction)(void (*)(void))pack_events, METH_FASTCALL,
     "pack_events(recent, index, table, rank, kind, start, end, samples, op_id): move the recent event "
     "tuples into the columns, as EventLog.pack does; False (nothing moved) if an event is off the fast path."},
    /* ops (`_tensor_ops.c`) */
    {"install_ops", install_ops, METH_VARARGS,
     "install_ops(Model, RankState, MemoryTracker, Activation, ActivationGrad, Weight, WeightGrad, Stash, pack_at, "
     "docs): put the C forward, backward, backward_input, backward_weight and WeightGrad.__add__ on the classes; "
     "the Python methods stay as their fallback for every case off the fast path."},
    /* weight_ops (`_tensor_ops.c`) */
    {"install_weight_ops", install_weight_ops, METH_VARARGS,
     "install_weight_ops(Model, RankState, MemoryTracker, Weight, OptState, WeightGrad, docs): put the C "
     "load_weights, update and set_final_weight on Model; the Python methods stay their fallback."},
    /* comm (`_comm.c`) */
    {"install_comm_ops", install_comm_ops, METH_VARARGS,
     "install_comm_ops(Model, RankState, MemoryTracker, comm, Weight, OptState, WeightGrad, docs): put the C "
     "all_reduce, all_gather and reduce_scatter on Model, and the C resolution, start and end of a collective "
     "and Work._complete in comm; the Python stays their fallback."},
    /* p2p (`_p2p.c`) */
    {"install_p2p_ops", install_p2p_ops, METH_VARARGS,
     "install_p2p_ops(Model, RankState, MemoryTracker, p2p, comm, tensors, docs): put the C send and recv on "
     "Model and the C finish of a message in p2p._finish; the Python stays their fallback."},
    /* drive (`_drive.c`) */
    {"install_drive", install_drive, METH_VARARGS,
     "install_drive(Engine, RankState, Work, EventLog, WAKE_ME, PACK_AT, twins, docs): put the C Engine.wake, "
     "Engine._drive and Work.__await__ in place; the Python methods go to `twins` and stay their fallback."},
    {NULL}};

static const struct { const char *name; PyTypeObject *type; } types[] = {
    {"AllocLog", &AllocLogType}, {"Buffer", &BufferType}, /* buffers */
    {"KindIndex", &KindIndexType},                         /* events */
    {"Transfer", &TransferType}, {"Scheduler", &SchedulerType}, /* transfers */
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_buffers",
                                    "The C twins (see dist_lib/native/__init__.py).", -1, methods};

PyMODINIT_FUNC PyInit__buffers(void) {
    if (common_ready() < 0) return NULL;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyType_Ready(types[i].type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
#ifndef SOURCE_HASH
#define SOURCE_HASH "" /* built without setup.py: dist_lib/native treats it as stale */
#endif
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyModule_AddObjectRef(m, types[i].name, (PyObject *)types[i].type) < 0) { Py_DECREF(m); return NULL; }
    if (PyModule_AddStringConstant(m, "SOURCE_HASH", SOURCE_HASH) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
