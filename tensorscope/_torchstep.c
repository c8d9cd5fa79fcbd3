/* The pickle VM's torch step (`parsers.pickle_vm._VM.torch_tensor`) compiled: the ~25 opcodes
 * torch.save writes for one dense tensor, from the MARK after the rebuild function to the REDUCE
 * that calls it, run as one step (a 100,000-tensor checkpoint is 100,000 of them).
 *
 * `tensor` reads the same byte pattern as `pickle_torchpath._TORCH_TENSOR` (that regex is deterministic:
 * each alternative starts with its own byte, so a plain left-to-right reading is the same match)
 * and declines, having changed nothing, in every case where `torch_tensor` declines. Otherwise
 * it has `torch_tensor`'s effects in their order: the memo's six entries, the persistent id
 * (recorded when the run records), the storage, the two REDUCEs, the stack top, the opcode and
 * object counts. Only three of those steps are done here rather than by the Python function
 * that `torch_tensor` calls, each in the one case where the outcome is certain:
 *  - a storage met for the first time with a stored record of the exact name: the inline branch
 *    of `torch_zip.make_storage_resolver`'s `persistent_load` (its "fast context" says where the
 *    storages, records and tables are);
 *  - `OrderedDict()` through `pickle_hooks._ordered_dict`: a new empty dict;
 *  - `_rebuild_tensor_v2` of a StorageRef with a typed dtype, an int offset >= 0, size and stride
 *    tuples of ints >= 0 of one length: `torch_pickle._dense`'s TensorRef.
 * Anything else (another hook, another storage, a run that records calls) calls the same Python
 * functions `torch_tensor` calls (`_VM.load_storage`, `_VM.reduce_global`), so every error comes
 * from one place. On a failure the step sets `vm.fast_at` as `torch_tensor` does.
 *
 * After a tensor it goes on through the dict's next items (PUT, key, PUT, GET of the rebuild
 * function, tensor ...), each opcode only in its plain form, and stops where the VM's loop would
 * end its batch and check the limits: it returns how many of the loop's dispatches it ran.
 *
 * `infos` makes the records of a flat state dict for `torch_zip.build_tensor_list` in listing
 * mode: what `torch_pickle.to_tensor_info` makes for a tensor that fits its storage record, in a
 * dtype of whole bytes per element; every other item is handed back to the Python code.
 *
 * StorageRef, TensorRef and TensorInfo are slots classes: they are made by allocating the
 * instance and filling its slots, as `__init__` (or `TensorInfo.trusted`) would (a Python
 * `__init__` call costs ~1 µs). `bind_torch` checks the layout (every field a plain object slot,
 * nothing else) before this is used. Every read of the data is bounds-checked against `n`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define ABI 1

/* Opcode bytes (pickle's, as pickletools lists them). */
#define OP_MARK '('
#define OP_BINGET 'h'
#define OP_LONG_BINGET 'j'
#define OP_BINPUT 'q'
#define OP_LONG_BINPUT 'r'
#define OP_MEMOIZE 0x94
#define OP_BINUNICODE 'X'
#define OP_SHORT_BINUNICODE 0x8c
#define OP_BININT1 'K'
#define OP_BININT2 'M'
#define OP_BININT 'J'
#define OP_TUPLE 't'
#define OP_BINPERSID 'Q'
#define OP_EMPTY_TUPLE ')'
#define OP_TUPLE1 0x85
#define OP_TUPLE3 0x87
#define OP_NEWTRUE 0x88
#define OP_NEWFALSE 0x89
#define OP_REDUCE 'R'

/* -- classes and hooks, bound once at import (`bind_vm`, `bind_torch`) ----------------------- */

typedef struct {
    const char *name;
    Py_ssize_t offset;
} Slot;

enum { G_MODULE, G_NAME, G_HOOK, N_GLOBAL };
static Slot global_slots[N_GLOBAL] = {{"module"}, {"name"}, {"_hook"}};
/* StorageRef's and TensorRef's fields, in their declaration order. */
enum { S_KEY, S_DTYPE, S_NUMEL, S_LOCATION, S_FILE, S_MEMBER, S_DATA_OFFSET, S_NBYTES, S_ERROR,
       N_STORAGE };
static Slot storage_slots[N_STORAGE] = {{"key"}, {"dtype"}, {"numel"}, {"location"}, {"file"},
                                        {"member"}, {"data_offset"}, {"nbytes"}, {"error"}};
enum { T_STORAGE, T_OFFSET, T_SHAPE, T_STRIDE, T_DTYPE, T_GRAD, T_ROLE, T_POS, T_EXTRAS,
       N_TENSOR };
static Slot tensor_slots[N_TENSOR] = {{"storage"}, {"storage_offset"}, {"shape"}, {"stride"},
                                      {"dtype"}, {"requires_grad"}, {"role"}, {"pos"},
                                      {"extras"}};

/* TensorInfo's fields (tensorscope/model.py), in its declaration order. */
enum { I_NAME, I_DTYPE, I_SHAPE, I_STRIDE, I_STORAGE_OFFSET, I_BYTE_OFFSET, I_NBYTES, I_FILE,
       I_STORAGE_KEY, I_STORAGE_NBYTES, I_PATH, I_FORMAT, I_ROLE, I_CHUNKS, I_EXTRAS, I_HAS_DATA,
       N_INFO };
static Slot info_slots[N_INFO] = {
    {"name"}, {"dtype"}, {"shape"}, {"stride"}, {"storage_offset"}, {"byte_offset"}, {"nbytes"},
    {"file"}, {"storage_key"}, {"storage_nbytes"}, {"path"}, {"source_format"}, {"role"},
    {"chunks"}, {"extras"}, {"has_data"}};

static PyTypeObject *global_type, *storage_type, *tensor_type, *info_type, *frozen_dict_type;
static PyObject *small_tuples;      /* pickle_torchpath._SMALL_TUPLES: opcode bytes -> (tuple, ops) */
static PyObject *small_tuple_fn;    /* pickle_torchpath._small_tuple */
static PyObject *ordered_dict_hook; /* pickle_hooks._ordered_dict */
static PyObject *rebuild_v2_hook;   /* torch_pickle._rebuild_tensor_v2 */
static PyObject *no_extras;         /* torch_pickle._NO_EXTRAS */
static PyObject *str_storage, *str_tensor, *str_fast_at, *str_load_storage, *str_reduce_global;
static PyObject *str_location, *str_member, *empty_tuple;

#define SLOT(obj, slots, k) (*(PyObject **)((char *)(obj) + (slots)[k].offset))

/* Find each slot's offset; fail unless every one is a plain object slot of `type` and, when
 * `whole`, they are all its fields (an unknown field would be left unset by `make`). */
static int find_slots(PyTypeObject *type, Slot *slots, int count, int whole) {
    Py_ssize_t offsets[16];
    for (int k = 0; k < count; k++) {
        PyObject *descr = PyDict_GetItemString(type->tp_dict, slots[k].name);  /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyDescrObject *)descr)->d_type != type) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot of that class", type->tp_name,
                         slots[k].name);
            return -1;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0 ||
            m->offset + (Py_ssize_t)sizeof(PyObject *) > type->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a plain object slot", type->tp_name,
                         slots[k].name);
            return -1;
        }
        offsets[k] = m->offset;
    }
    if (whole && (type->tp_itemsize != 0 || type->tp_dictoffset != 0 ||
                  type->tp_basicsize != (Py_ssize_t)(sizeof(PyObject) +
                                                     count * sizeof(PyObject *)))) {
        PyErr_Format(PyExc_TypeError, "%s has other fields than the %d this file sets",
                     type->tp_name, count);
        return -1;
    }
    for (int k = 0; k < count; k++)
        slots[k].offset = offsets[k];
    return 0;
}

static PyObject *bind_vm(PyObject *self, PyObject *args) {
    PyObject *global, *tuples, *tuple_fn, *od_hook;
    if (!PyArg_ParseTuple(args, "O!O!OO", &PyType_Type, &global, &PyDict_Type, &tuples,
                          &tuple_fn, &od_hook))
        return NULL;
    if (find_slots((PyTypeObject *)global, global_slots, N_GLOBAL, 0) < 0)
        return NULL;
    Py_INCREF(global);
    Py_XSETREF(global_type, (PyTypeObject *)global);
    Py_INCREF(tuples);
    Py_XSETREF(small_tuples, tuples);
    Py_INCREF(tuple_fn);
    Py_XSETREF(small_tuple_fn, tuple_fn);
    Py_INCREF(od_hook);
    Py_XSETREF(ordered_dict_hook, od_hook);
    Py_RETURN_NONE;
}

static PyObject *bind_torch(PyObject *self, PyObject *args) {
    PyObject *storage, *tensor, *hook, *extras, *info, *frozen;
    if (!PyArg_ParseTuple(args, "O!O!OOO!O!", &PyType_Type, &storage, &PyType_Type, &tensor,
                          &hook, &extras, &PyType_Type, &info, &PyType_Type, &frozen))
        return NULL;
    /* extras are made by dict's tp_new (no Python __new__ to call back) and filled by
     * PyDict_SetItem: only right for a dict subclass that adds no field and no __new__ */
    if (!PyType_IsSubtype((PyTypeObject *)frozen, &PyDict_Type) ||
        ((PyTypeObject *)frozen)->tp_new != PyDict_Type.tp_new ||
        ((PyTypeObject *)frozen)->tp_basicsize != PyDict_Type.tp_basicsize ||
        ((PyTypeObject *)frozen)->tp_dictoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "FrozenDict must be a dict subclass with dict's layout "
                        "and dict's __new__");
        return NULL;
    }
    if (find_slots((PyTypeObject *)storage, storage_slots, N_STORAGE, 1) < 0 ||
        find_slots((PyTypeObject *)tensor, tensor_slots, N_TENSOR, 1) < 0 ||
        find_slots((PyTypeObject *)info, info_slots, N_INFO, 1) < 0)
        return NULL;
    Py_INCREF(info);
    Py_XSETREF(info_type, (PyTypeObject *)info);
    Py_INCREF(frozen);
    Py_XSETREF(frozen_dict_type, (PyTypeObject *)frozen);
    Py_INCREF(storage);
    Py_XSETREF(storage_type, (PyTypeObject *)storage);
    Py_INCREF(tensor);
    Py_XSETREF(tensor_type, (PyTypeObject *)tensor);
    Py_INCREF(hook);
    Py_XSETREF(rebuild_v2_hook, hook);
    Py_INCREF(extras);
    Py_XSETREF(no_extras, extras);
    Py_RETURN_NONE;
}

/* An instance of a bound slots class with every slot set from `values` (new references,
 * stolen, all of them even on failure). */
static PyObject *make(PyTypeObject *type, const Slot *slots, int count, PyObject **values) {
    for (int k = 0; k < count; k++) {
        if (values[k] == NULL) {
            for (int j = 0; j < count; j++)
                Py_XDECREF(values[j]);
            return NULL;
        }
    }
    PyObject *obj = type->tp_alloc(type, 0);
    if (obj == NULL) {
        for (int k = 0; k < count; k++)
            Py_DECREF(values[k]);
        return NULL;
    }
    for (int k = 0; k < count; k++)
        SLOT(obj, slots, k) = values[k];
    return obj;
}

/* -- reading the sequence (no effects) ------------------------------------------------------ */

typedef struct {
    const unsigned char *d;
    Py_ssize_t at, end;
} Reader;

static int next_is(Reader *r, int byte) {
    if (r->at < r->end && r->d[r->at] == byte) {
        r->at++;
        return 1;
    }
    return 0;
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* BINGET / LONG_BINGET: the memo index, or -1 when the bytes are not one. */
static Py_ssize_t read_get(Reader *r) {
    if (r->end - r->at >= 2 && r->d[r->at] == OP_BINGET) {
        r->at += 2;
        return r->d[r->at - 1];
    }
    if (r->end - r->at >= 5 && r->d[r->at] == OP_LONG_BINGET) {
        r->at += 5;
        return (Py_ssize_t)le32(r->d + r->at - 4);
    }
    return -1;
}

/* BININT1 / BININT2 / BININT: 1 and the value, or 0. */
static int read_int(Reader *r, long *value) {
    const unsigned char *p = r->d + r->at;
    Py_ssize_t left = r->end - r->at;
    if (left >= 2 && p[0] == OP_BININT1) {
        *value = p[1];
        r->at += 2;
    } else if (left >= 3 && p[0] == OP_BININT2) {
        *value = p[1] | p[2] << 8;
        r->at += 3;
    } else if (left >= 5 && p[0] == OP_BININT) {
        *value = (int32_t)le32(p + 1);
        r->at += 5;
    } else {
        return 0;
    }
    return 1;
}

/* The six memo PUTs: their kind is fixed by the first; each must store index `want`. */
typedef struct {
    int kind;
    Py_ssize_t want;
} Puts;

static int read_put(Reader *r, Puts *puts) {
    if (r->at >= r->end)
        return 0;
    int op = r->d[r->at];
    if (puts->kind == 0)
        puts->kind = op;
    if (op != puts->kind)
        return 0;
    if (op == OP_MEMOIZE) {
        r->at += 1;
    } else if (op == OP_BINPUT) {
        if (r->end - r->at < 2 || r->d[r->at + 1] != puts->want)
            return 0;
        r->at += 2;
    } else if (op == OP_LONG_BINPUT) {
        if (r->end - r->at < 5 || (Py_ssize_t)le32(r->d + r->at + 1) != puts->want)
            return 0;
        r->at += 5;
    } else {
        return 0;
    }
    if (__builtin_add_overflow(puts->want, 1, &puts->want))
        return 0;
    return 1;
}

/* `_SMALL_TUPLE`: EMPTY_TUPLE, 1-3 ints and TUPLE1-3, or MARK, 0-64 ints and TUPLE. Sets the
 * span of its bytes. */
static int read_small_tuple(Reader *r, Py_ssize_t *start) {
    long ignored;
    *start = r->at;
    if (next_is(r, OP_EMPTY_TUPLE))
        return 1;
    if (next_is(r, OP_MARK)) {
        for (int k = 0; k < 64 && read_int(r, &ignored); k++)
            ;
        return next_is(r, OP_TUPLE);
    }
    int k = 0;
    while (k < 3 && read_int(r, &ignored))
        k++;
    if (k == 0 || r->at >= r->end || r->d[r->at] < OP_TUPLE1 || r->d[r->at] > OP_TUPLE3)
        return 0;
    r->at++;
    return 1;
}

/* The (tuple, opcodes) pair `pickle_torchpath._small_tuple` gives for these opcode bytes (a new
 * reference); the last pair for each of the two places is kept, as checkpoints repeat shapes. */
typedef struct {
    unsigned char bytes[64];
    Py_ssize_t size;
    PyObject *pair;
} LastTuple;
static LastTuple last_tuple[2];

static PyObject *small_tuple(int place, const unsigned char *p, Py_ssize_t size) {
    LastTuple *last = &last_tuple[place];
    if (last->pair != NULL && size == last->size && memcmp(p, last->bytes, size) == 0) {
        Py_INCREF(last->pair);
        return last->pair;
    }
    PyObject *key = PyBytes_FromStringAndSize((const char *)p, size);
    if (key == NULL)
        return NULL;
    PyObject *pair = PyDict_GetItemWithError(small_tuples, key);  /* borrowed */
    if (pair != NULL)
        Py_INCREF(pair);
    else if (!PyErr_Occurred())
        pair = PyObject_CallOneArg(small_tuple_fn, key);
    Py_DECREF(key);
    if (pair == NULL)
        return NULL;
    if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(pair, 1))) {
        Py_DECREF(pair);
        PyErr_SetString(PyExc_TypeError, "_small_tuple gave something else than (tuple, ops)");
        return NULL;
    }
    if (size <= (Py_ssize_t)sizeof last->bytes) {
        memcpy(last->bytes, p, size);
        last->size = size;
        Py_INCREF(pair);
        Py_XSETREF(last->pair, pair);
    }
    return pair;
}

/* -- the storage, the rebuild ----------------------------------------------------------------- */

/* The inline branch of `make_storage_resolver`'s persistent_load for this pid, or NULL with no
 * error when it does not apply (the Python function then decides). `fast` is the resolver's
 * `torch_fast`: (storages, records, prefix, path, storage dtypes, storage modules, record class). */
static PyObject *fast_storage(PyObject *fast, PyObject *pid) {
    PyObject *storages = PyTuple_GET_ITEM(fast, 0), *records = PyTuple_GET_ITEM(fast, 1);
    PyObject *prefix = PyTuple_GET_ITEM(fast, 2), *path = PyTuple_GET_ITEM(fast, 3);
    PyObject *dtypes = PyTuple_GET_ITEM(fast, 4), *modules = PyTuple_GET_ITEM(fast, 5);
    PyTypeObject *record_type = (PyTypeObject *)PyTuple_GET_ITEM(fast, 6);
    PyObject *tag = PyTuple_GET_ITEM(pid, 0), *cls = PyTuple_GET_ITEM(pid, 1);
    PyObject *key = PyTuple_GET_ITEM(pid, 2), *location = PyTuple_GET_ITEM(pid, 3);
    PyObject *numel = PyTuple_GET_ITEM(pid, 4);
    if (!PyUnicode_CheckExact(tag) || PyUnicode_Compare(tag, str_storage) != 0 ||
        !Py_IS_TYPE(cls, global_type) || !PyUnicode_CheckExact(location) ||
        !PyLong_CheckExact(numel) || _PyLong_Sign(numel) < 0)
        return NULL;
    PyObject *module = SLOT(cls, global_slots, G_MODULE), *name = SLOT(cls, global_slots, G_NAME);
    /* exact strs, so that hashing them runs no Python code; and every object read here is held
     * by a strong reference across the lookups (a key of another type in one of these tables
     * could make a comparison call back into Python, which could drop what is borrowed) */
    if (module == NULL || name == NULL || !PyUnicode_CheckExact(module) ||
        !PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(key))
        return NULL;
    Py_INCREF(module);
    Py_INCREF(name);
    PyObject *dtype = NULL, *member = NULL, *record = NULL, *storage = NULL;
    int in = PySet_Contains(modules, module);
    if (in <= 0)
        goto out;
    dtype = Py_XNewRef(PyDict_GetItemWithError(dtypes, name));   /* None: untyped */
    if (dtype == NULL)
        goto out;
    member = PyUnicode_Concat(prefix, key);
    if (member == NULL)
        goto out;
    record = Py_XNewRef(PyDict_GetItemWithError(records, member));
    /* record_type was checked to be a tuple subclass with tuple's layout (`valid_fast`) */
    int stored = record != NULL && Py_IS_TYPE(record, record_type) &&
                 PyTuple_GET_SIZE(record) == 5;
    PyObject *rname = NULL, *method = NULL;
    if (stored) {   /* _Record(name, error, method, data_offset, size) */
        rname = PyTuple_GET_ITEM(record, 0);
        method = PyTuple_GET_ITEM(record, 2);
        PyObject *error = PyTuple_GET_ITEM(record, 1);
        stored = (error == Py_None || (PyUnicode_CheckExact(error) &&
                                       PyUnicode_GET_LENGTH(error) == 0)) &&
                 PyLong_CheckExact(method) && _PyLong_Sign(method) == 0 &&
                 PyUnicode_CheckExact(rname) && PyUnicode_Compare(rname, member) == 0;
    }
    if (!stored)
        goto out;
    PyObject *values[N_STORAGE] = {Py_NewRef(key), Py_NewRef(dtype), Py_NewRef(numel),
                                   Py_NewRef(location), Py_NewRef(path), Py_NewRef(rname),
                                   Py_NewRef(PyTuple_GET_ITEM(record, 3)),
                                   Py_NewRef(PyTuple_GET_ITEM(record, 4)), Py_NewRef(Py_None)};
    storage = make(storage_type, storage_slots, N_STORAGE, values);
    if (storage == NULL)
        goto out;
    /* `key not in storages`, then `storages[key] = storage`, in one lookup: a key met before
     * keeps its storage, and the Python function returns that one */
    PyObject *held = PyDict_SetDefault(storages, key, storage);     /* borrowed */
    if (held != storage)
        Py_CLEAR(storage);
out:
    Py_DECREF(module);
    Py_DECREF(name);
    Py_XDECREF(dtype);
    Py_XDECREF(member);
    Py_XDECREF(record);
    return storage;
}

/* The resolver's `torch_fast` tuple as `fast_storage` reads it, every member of the exact type
 * whose layout or C API it relies on; anything else makes the step call the Python function. */
static int valid_fast(PyObject *fast) {
    if (storage_type == NULL || !PyTuple_CheckExact(fast) || PyTuple_GET_SIZE(fast) != 7)
        return 0;
    PyObject *record = PyTuple_GET_ITEM(fast, 6);
    if (!PyType_Check(record))
        return 0;
    PyTypeObject *rtype = (PyTypeObject *)record;
    /* a NamedTuple: a tuple subclass with tuple's own layout (PyTuple_GET_* are valid on it) */
    return PyDict_CheckExact(PyTuple_GET_ITEM(fast, 0)) &&
           PyDict_CheckExact(PyTuple_GET_ITEM(fast, 1)) &&
           PyUnicode_CheckExact(PyTuple_GET_ITEM(fast, 2)) &&
           PyDict_CheckExact(PyTuple_GET_ITEM(fast, 4)) &&
           PyAnySet_CheckExact(PyTuple_GET_ITEM(fast, 5)) &&
           PyType_FastSubclass(rtype, Py_TPFLAGS_TUPLE_SUBCLASS) &&
           PyType_IsSubtype(rtype, &PyTuple_Type) &&
           rtype->tp_basicsize == PyTuple_Type.tp_basicsize &&
           rtype->tp_itemsize == PyTuple_Type.tp_itemsize && rtype->tp_dictoffset == 0;
}

/* An int >= 0 (not a bool). */
static int plain_count(PyObject *v) {
    return PyLong_CheckExact(v) && _PyLong_Sign(v) >= 0;
}

/* A tuple of at most 64 ints >= 0: what `torch_pickle._int_tuple` returns unchanged. */
static int plain_dims(PyObject *t) {
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) > 64)
        return 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(t); k++)
        if (!plain_count(PyTuple_GET_ITEM(t, k)))
            return 0;
    return 1;
}

/* `_rebuild_tensor_v2(args, pos)` when `_dense` makes its TensorRef without a question; NULL
 * with no error otherwise. */
static PyObject *plain_rebuild(PyObject *args, PyObject *pos) {
    PyObject *storage = PyTuple_GET_ITEM(args, 0), *offset = PyTuple_GET_ITEM(args, 1);
    PyObject *shape = PyTuple_GET_ITEM(args, 2), *stride = PyTuple_GET_ITEM(args, 3);
    if (!Py_IS_TYPE(storage, storage_type) || !plain_count(offset) || !plain_dims(shape) ||
        !plain_dims(stride) || PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(stride))
        return NULL;
    PyObject *dtype = SLOT(storage, storage_slots, S_DTYPE);
    if (dtype == NULL || dtype == Py_None)
        return NULL;
    PyObject *grad = PyTuple_GET_ITEM(args, 4) == Py_True ? Py_True : Py_False;
    PyObject *values[N_TENSOR] = {Py_NewRef(storage), Py_NewRef(offset), Py_NewRef(shape),
                                  Py_NewRef(stride), Py_NewRef(dtype), Py_NewRef(grad),
                                  Py_NewRef(str_tensor), Py_NewRef(pos), Py_NewRef(no_extras)};
    return make(tensor_type, tensor_slots, N_TENSOR, values);
}

/* REDUCE of `func` (a Global) with `args`: the plain case of `hook`, else `vm.reduce_global`. */
static PyObject *reduce(PyObject *vm, PyObject *func, PyObject *args, Py_ssize_t at,
                        int recording) {
    PyObject *hook = SLOT(func, global_slots, G_HOOK);
    if (!recording && hook == ordered_dict_hook && PyTuple_GET_SIZE(args) == 0)
        return PyDict_New();
    PyObject *pos = PyLong_FromSsize_t(at);
    if (pos == NULL)
        return NULL;
    PyObject *value = NULL;
    if (!recording && hook == rebuild_v2_hook && rebuild_v2_hook != NULL &&
        tensor_type != NULL && PyTuple_GET_SIZE(args) == 6) {
        value = plain_rebuild(args, pos);
        if (value == NULL && PyErr_Occurred()) {
            Py_DECREF(pos);
            return NULL;
        }
    }
    if (value == NULL)
        value = PyObject_CallMethodObjArgs(vm, str_reduce_global, func, args, pos, NULL);
    Py_DECREF(pos);
    return value;
}

static int list_append(PyObject *list, PyObject *item) {
    /* item: a new reference, stolen */
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

/* -- the step ---------------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *d;
    Py_ssize_t n;               /* where the data (or the open FRAME) ends */
    PyObject *stack, *memo, *vm, *fast, *pids;
    int recording;
} Run;

enum { DECLINED, DONE, FAILED };

/* The stack still holds `depth` items, the top one a Global (read after every call into Python,
 * which could have changed the list). */
static int stack_top_is_global(PyObject *stack, Py_ssize_t depth) {
    return depth > 0 && PyList_GET_SIZE(stack) == depth &&
           Py_IS_TYPE(PyList_GET_ITEM(stack, depth - 1), global_type);
}

/* One tensor sequence at `start` (`torch_tensor`): DONE with its end, opcodes and objects built;
 * DECLINED having changed nothing; FAILED with the error set and `*at`, `*ran` where it failed
 * and the opcodes run up to it. */
static int one_tensor(Run *run, Py_ssize_t start, Py_ssize_t budget, Py_ssize_t *end,
                      Py_ssize_t *ops_out, Py_ssize_t *built, Py_ssize_t *at, Py_ssize_t *ran) {
    PyObject *stack = run->stack, *memo = run->memo, *vm = run->vm;
    int recording = run->recording, status = FAILED;
    PyObject *pid = NULL, *storage = NULL, *size_pair = NULL, *stride_pair = NULL;
    PyObject *empty = NULL, *args = NULL, *value = NULL;
    *at = start;
    *ran = 0;
    Py_ssize_t depth = PyList_GET_SIZE(stack);
    if (!stack_top_is_global(stack, depth))
        return DECLINED;

    /* The pattern, read without effects. */
    Reader r = {run->d, start, run->n};
    Py_ssize_t memo_n = PyList_GET_SIZE(memo);
    Puts puts = {0, memo_n};
    long numel, offset;
    if (!next_is(&r, OP_MARK) || !next_is(&r, OP_MARK))
        goto decline;
    Py_ssize_t ia = read_get(&r), ib = read_get(&r);
    if (ia < 0 || ib < 0 || r.at >= r.end)
        goto decline;
    Py_ssize_t key_len;
    if (r.d[r.at] == OP_BINUNICODE) {
        if (r.end - r.at < 5 || r.d[r.at + 2] || r.d[r.at + 3] || r.d[r.at + 4])
            goto decline;
        key_len = r.d[r.at + 1];
        r.at += 5;
    } else if (r.d[r.at] == OP_SHORT_BINUNICODE) {
        if (r.end - r.at < 2)
            goto decline;
        key_len = r.d[r.at + 1];
        r.at += 2;
    } else {
        goto decline;
    }
    Py_ssize_t key_at = r.at, digits = 0;
    while (r.at < r.end && digits < 20 && r.d[r.at] >= '0' && r.d[r.at] <= '9') {
        r.at++;
        digits++;
    }
    if (digits < 1 || digits > 19 || digits != key_len || !read_put(&r, &puts))
        goto decline;
    Py_ssize_t ic = read_get(&r);
    if (ic < 0 || !read_int(&r, &numel) || !next_is(&r, OP_TUPLE) || !read_put(&r, &puts))
        goto decline;
    Py_ssize_t persid_at = r.at;
    if (!next_is(&r, OP_BINPERSID) || !read_int(&r, &offset))
        goto decline;
    Py_ssize_t size_at, stride_at, size_end;
    if (!read_small_tuple(&r, &size_at))
        goto decline;
    size_end = r.at;
    if (!read_put(&r, &puts) || !read_small_tuple(&r, &stride_at))
        goto decline;
    Py_ssize_t stride_end = r.at;
    if (!read_put(&r, &puts) || r.at >= r.end ||
        (r.d[r.at] != OP_NEWTRUE && r.d[r.at] != OP_NEWFALSE))
        goto decline;
    int grad = r.d[r.at++] == OP_NEWTRUE;
    Py_ssize_t id = read_get(&r);
    Py_ssize_t od_at = r.at + 1;
    if (id < 0 || !next_is(&r, OP_EMPTY_TUPLE) || !next_is(&r, OP_REDUCE) ||
        !read_put(&r, &puts) || !next_is(&r, OP_TUPLE) || !read_put(&r, &puts))
        goto decline;
    Py_ssize_t rebuild_at = r.at;
    if (!next_is(&r, OP_REDUCE))
        goto decline;
    /* `_puts_in_order`: a run of BINPUTs must stay below 256 (memo_n < 251) */
    if (puts.kind == OP_BINPUT && memo_n >= 256 - 5)
        goto decline;
    /* `_small_tuple` may run Python code (a miss of its table): what is read from the VM's
     * lists is checked after it, not before */
    size_pair = small_tuple(0, r.d + size_at, size_end - size_at);
    if (size_pair == NULL)
        goto done;
    stride_pair = small_tuple(1, r.d + stride_at, stride_end - stride_at);
    if (stride_pair == NULL)
        goto done;
    if (PyList_GET_SIZE(memo) != memo_n || !stack_top_is_global(stack, depth) ||
        ia >= memo_n || ib >= memo_n || ic >= memo_n || id >= memo_n ||
        !Py_IS_TYPE(PyList_GET_ITEM(memo, id), global_type))
        goto decline;
    PyObject *shape = PyTuple_GET_ITEM(size_pair, 0), *strides = PyTuple_GET_ITEM(stride_pair, 0);
    Py_ssize_t size_ops = PyLong_AsSsize_t(PyTuple_GET_ITEM(size_pair, 1));
    Py_ssize_t stride_ops = PyLong_AsSsize_t(PyTuple_GET_ITEM(stride_pair, 1));
    if (PyErr_Occurred())
        goto done;
    Py_ssize_t ops;
    if (size_ops < 0 || stride_ops < 0 || __builtin_add_overflow(size_ops, stride_ops, &ops) ||
        __builtin_add_overflow(ops, 22, &ops))
        goto decline;
    if (shape == Py_None || strides == Py_None || ops > budget)
        goto decline;

    /* From here on, the opcodes' effects in their order (as `torch_tensor`). */
    PyObject *key = PyUnicode_FromStringAndSize((const char *)r.d + key_at, key_len);
    if (key == NULL)
        goto done;
    pid = PyTuple_New(5);
    if (pid == NULL) {
        Py_DECREF(key);
        goto done;
    }
    PyTuple_SET_ITEM(pid, 0, Py_NewRef(PyList_GET_ITEM(memo, ia)));
    PyTuple_SET_ITEM(pid, 1, Py_NewRef(PyList_GET_ITEM(memo, ib)));
    PyTuple_SET_ITEM(pid, 2, key);
    PyTuple_SET_ITEM(pid, 3, Py_NewRef(PyList_GET_ITEM(memo, ic)));
    PyObject *numel_obj = PyLong_FromLong(numel);
    if (numel_obj == NULL)
        goto done;
    PyTuple_SET_ITEM(pid, 4, numel_obj);
    if (PyList_Append(memo, key) < 0 || PyList_Append(memo, pid) < 0)
        goto done;
    *at = persid_at;
    *ran = 11;
    if (recording) {
        PyObject *entry = Py_BuildValue("(On)", pid, *at);
        if (entry == NULL || list_append(run->pids, entry) < 0)
            goto done;
    }
    if (run->fast != Py_None) {
        storage = fast_storage(run->fast, pid);
        if (storage == NULL && PyErr_Occurred())
            goto done;
    }
    if (storage == NULL) {
        PyObject *pos = PyLong_FromSsize_t(*at);
        if (pos == NULL)
            goto done;
        storage = PyObject_CallMethodObjArgs(vm, str_load_storage, pid, pos, NULL);
        Py_DECREF(pos);
        if (storage == NULL)
            goto done;
    }
    if (PyList_Append(memo, shape) < 0 || PyList_Append(memo, strides) < 0)
        goto done;
    *at = od_at;
    *ran = ops - 4;
    /* load_storage ran Python code: the memo entry and the stack are read again, checked */
    if (id >= PyList_GET_SIZE(memo) || !Py_IS_TYPE(PyList_GET_ITEM(memo, id), global_type)) {
        PyErr_SetString(PyExc_RuntimeError, "a hook changed the VM's memo");
        goto done;
    }
    PyObject *od = Py_NewRef(PyList_GET_ITEM(memo, id));   /* held across Python calls */
    empty = reduce(vm, od, empty_tuple, *at, recording);
    Py_DECREF(od);
    if (empty == NULL || PyList_Append(memo, empty) < 0)
        goto done;
    PyObject *offset_obj = PyLong_FromLong(offset);
    if (offset_obj == NULL)
        goto done;
    args = PyTuple_Pack(6, storage, offset_obj, shape, strides, grad ? Py_True : Py_False,
                        empty);
    Py_DECREF(offset_obj);
    if (args == NULL || PyList_Append(memo, args) < 0)
        goto done;
    *at = rebuild_at;
    *ran = ops;
    /* the reduces and load_storage ran Python code: the stack top is read only after its
     * length and its type are checked again */
    if (!stack_top_is_global(stack, depth)) {
        PyErr_SetString(PyExc_RuntimeError, "a hook changed the VM's stack");
        goto done;
    }
    Py_ssize_t top = depth - 1;
    PyObject *rebuild = Py_NewRef(PyList_GET_ITEM(stack, top));
    value = reduce(vm, rebuild, args, *at, recording);
    Py_DECREF(rebuild);
    if (value == NULL)
        goto done;
    if (PyList_GET_SIZE(stack) != depth) {
        PyErr_SetString(PyExc_RuntimeError, "a hook changed the VM's stack");
        goto done;
    }
    PyList_SetItem(stack, top, value);   /* steals it */
    value = NULL;
    *end = r.at;
    *ops_out = ops;
    /* objects built: the pid and argument tuples, the two calls, non-empty size and stride */
    *built = 4 + (r.d[size_at] != OP_EMPTY_TUPLE) + (r.d[stride_at] != OP_EMPTY_TUPLE);
    status = DONE;
    goto done;
decline:
    status = DECLINED;
done:
    Py_XDECREF(pid);
    Py_XDECREF(storage);
    Py_XDECREF(size_pair);
    Py_XDECREF(stride_pair);
    Py_XDECREF(empty);
    Py_XDECREF(args);
    Py_XDECREF(value);
    return status;
}

/* The opcodes between two tensors of a dict's items, as the VM's loop runs them, each only in
 * its plain form (anything else is left to the loop, which reports what is wrong):
 * BINPUT / LONG_BINPUT / MEMOIZE of the next memo index (the memo is a list in order), a
 * BINUNICODE / SHORT_BINUNICODE key, a BINGET / LONG_BINGET. Returns the next offset, or -1. */
static Py_ssize_t simple_op(Run *run, int unit, Py_ssize_t at, Py_ssize_t max_string) {
    const unsigned char *d = run->d;
    Py_ssize_t n = run->n;
    if (at >= n)
        return -1;
    int op = d[at];
    Py_ssize_t memo_n = PyList_GET_SIZE(run->memo);
    if (unit == 'P') {      /* a PUT of the stack top */
        Py_ssize_t next;
        if (op == OP_MEMOIZE)
            next = at + 1;
        else if (op == OP_BINPUT && n - at >= 2 && d[at + 1] == memo_n)
            next = at + 2;
        else if (op == OP_LONG_BINPUT && n - at >= 5 && (Py_ssize_t)le32(d + at + 1) == memo_n)
            next = at + 5;
        else
            return -1;
        Py_ssize_t top = PyList_GET_SIZE(run->stack);
        if (top == 0 || PyList_Append(run->memo, PyList_GET_ITEM(run->stack, top - 1)) < 0)
            return -1;      /* (an empty stack cannot follow a REDUCE or a push) */
        return next;
    }
    if (unit == 'K') {      /* a str key */
        Py_ssize_t size, head;
        if (op == OP_BINUNICODE && n - at >= 5) {
            size = (Py_ssize_t)le32(d + at + 1);
            head = 5;
        } else if (op == OP_SHORT_BINUNICODE && n - at >= 2) {
            size = d[at + 1];
            head = 2;
        } else {
            return -1;
        }
        if (size > n - at - head || (op == OP_BINUNICODE && size > max_string))
            return -1;
        PyObject *key = PyUnicode_DecodeUTF8((const char *)d + at + head, size, "surrogatepass");
        if (key == NULL) {
            PyErr_Clear();  /* the loop raises it, placed and worded as it words it */
            return -1;
        }
        if (list_append(run->stack, key) < 0)
            return -1;
        return at + head + size;
    }
    /* 'G': a GET */
    Py_ssize_t index, next;
    if (op == OP_BINGET && n - at >= 2) {
        index = d[at + 1];
        next = at + 2;
    } else if (op == OP_LONG_BINGET && n - at >= 5) {
        index = (Py_ssize_t)le32(d + at + 1);
        next = at + 5;
    } else {
        return -1;
    }
    if (index < 0 || index >= memo_n || PyList_Append(run->stack, PyList_GET_ITEM(run->memo, index)) < 0)
        return -1;
    return next;
}

static PyObject *tensor(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    /* tensor(data, pos, n, stack, memo, depth_room, budget, dispatches, max_string, vm, fast,
     *        recording, pids) */
    if (argc != 13) {
        PyErr_SetString(PyExc_TypeError, "tensor() takes 13 arguments");
        return NULL;
    }
    if (global_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind_vm() first");
        return NULL;
    }
    Run run = {NULL, 0, argv[3], argv[4], argv[9], argv[10], argv[12], 0};
    Py_ssize_t start = PyLong_AsSsize_t(argv[1]), n = PyLong_AsSsize_t(argv[2]);
    Py_ssize_t depth_room = PyLong_AsSsize_t(argv[5]), budget = PyLong_AsSsize_t(argv[6]);
    Py_ssize_t dispatches = PyLong_AsSsize_t(argv[7]), max_string = PyLong_AsSsize_t(argv[8]);
    run.recording = PyObject_IsTrue(argv[11]);
    if (PyErr_Occurred() || run.recording < 0)
        return NULL;
    if (!PyList_CheckExact(run.memo) || !PyList_CheckExact(run.stack) || depth_room < 3 ||
        dispatches < 1)
        Py_RETURN_NONE;
    if (run.fast != Py_None && !valid_fast(run.fast))
        run.fast = Py_None;
    if (run.recording && !PyList_CheckExact(run.pids))
        Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(argv[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (n > view.len || start < 0 || start > n) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    run.d = view.buf;
    run.n = n;
    /* A dict's items, as torch.save writes them: tensor, PUT, key, PUT, GET of the rebuild
     * function, tensor ... Each unit is one dispatch of the VM's loop (the tensor too, as the
     * Python step is): the step stops where the loop's batch would end, so that the limits are
     * checked where the Python step has them checked. */
    static const char units[] = "TPKPG";
    Py_ssize_t at = start, ops = 0, built = 0, used = 0, extra = 0;
    PyObject *out = NULL;
    for (int u = 0; used < dispatches; u = (u + 1) % 5) {
        if (units[u] == 'T') {
            Py_ssize_t end, t_ops, t_built, fail_at, fail_ran;
            Py_ssize_t room;
            if (__builtin_sub_overflow(budget, extra, &room))
                break;
            int status = one_tensor(&run, at, room, &end, &t_ops, &t_built, &fail_at,
                                    &fail_ran);
            if (status == FAILED) {
                /* `vm.fast_at`, as `torch_tensor` leaves it: the opcodes of this call */
                PyObject *type, *exc, *tb;
                PyErr_Fetch(&type, &exc, &tb);
                PyObject *where = Py_BuildValue("(nn)", fail_at, ops + fail_ran);
                if (where == NULL || PyObject_SetAttr(run.vm, str_fast_at, where) < 0) {
                    Py_XDECREF(where);
                    Py_XDECREF(type);
                    Py_XDECREF(exc);
                    Py_XDECREF(tb);
                } else {
                    Py_DECREF(where);
                    PyErr_Restore(type, exc, tb);
                }
                PyBuffer_Release(&view);
                return NULL;
            }
            if (status == DECLINED)
                break;
            at = end;
            /* t_ops <= room; the sums are checked all the same (a count that cannot be trusted
             * ends the batch: the loop goes on in Python) */
            Py_ssize_t ops2, extra2, built2;
            if (__builtin_add_overflow(ops, t_ops, &ops2) ||
                __builtin_add_overflow(extra, t_ops - 1, &extra2) ||
                __builtin_add_overflow(built, t_built, &built2)) {
                PyErr_SetString(PyExc_OverflowError, "torch step: opcode count overflows");
                PyBuffer_Release(&view);
                return NULL;
            }
            ops = ops2;
            extra = extra2;
            built = built2;
        } else {
            Py_ssize_t next = simple_op(&run, units[u], at, max_string);
            if (next < 0) {
                if (PyErr_Occurred()) {     /* out of memory: nothing else fails here */
                    PyBuffer_Release(&view);
                    return NULL;
                }
                break;
            }
            at = next;
            ops++;
        }
        used++;
    }
    PyBuffer_Release(&view);
    if (used == 0)
        Py_RETURN_NONE;
    out = Py_BuildValue("(nnnn)", at, ops, built, used);
    return out;
}

/* -- the records of a flat state dict (`torch_zip.build_tensor_list`, listing mode) ---------- */

/* a * b + c of counts >= 0, or -1 when it does not fit */
static int64_t mul_add(int64_t a, int64_t b, int64_t c) {
    int64_t out;
    if (__builtin_mul_overflow(a, b, &out) || __builtin_add_overflow(out, c, &out))
        return -1;
    return out;
}

static int64_t count_of(PyObject *v) {
    /* an int >= 0 that fits int64, else -1 */
    if (!PyLong_CheckExact(v))
        return -1;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || x < 0)
        return -1;
    return x;
}

/* The TensorInfo `torch_pickle.to_tensor_info` makes for `(key,)` and `t` by its first branch,
 * when `tensor_fits(t)` and the dtype is in `itemsizes` (known, whole bytes per element: nbytes,
 * offsets and the storage bound are then element counts times the itemsize); NULL with no error
 * when any of that is not so (the Python code then makes that record). */
static PyObject *plain_info(PyObject *key, PyObject *t, PyObject *fmt, PyObject *file,
                            PyObject *itemsizes) {
    PyObject *s = SLOT(t, tensor_slots, T_STORAGE);
    if (s == NULL || !Py_IS_TYPE(s, storage_type) ||
        SLOT(t, tensor_slots, T_EXTRAS) != no_extras || SLOT(t, tensor_slots, T_GRAD) != Py_False)
        return NULL;
    PyObject *error = SLOT(s, storage_slots, S_ERROR), *data_offset = SLOT(s, storage_slots, S_DATA_OFFSET);
    PyObject *member = SLOT(s, storage_slots, S_MEMBER), *location = SLOT(s, storage_slots, S_LOCATION);
    PyObject *sfile = SLOT(s, storage_slots, S_FILE), *skey = SLOT(s, storage_slots, S_KEY);
    PyObject *snbytes = SLOT(s, storage_slots, S_NBYTES);
    if (error != Py_None || data_offset == NULL || member == NULL || location == NULL ||
        sfile == NULL || skey == NULL || snbytes == NULL || !PyUnicode_CheckExact(member) ||
        PyUnicode_GET_LENGTH(member) == 0 || !PyUnicode_CheckExact(sfile))
        return NULL;
    PyObject *dtype = SLOT(t, tensor_slots, T_DTYPE), *shape = SLOT(t, tensor_slots, T_SHAPE);
    PyObject *stride = SLOT(t, tensor_slots, T_STRIDE), *offset = SLOT(t, tensor_slots, T_OFFSET);
    PyObject *role = SLOT(t, tensor_slots, T_ROLE);
    if (dtype == NULL || shape == NULL || stride == NULL || offset == NULL || role == NULL ||
        !PyUnicode_CheckExact(dtype) || !PyTuple_CheckExact(shape) || !PyTuple_CheckExact(stride) ||
        PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(stride))
        return NULL;
    PyObject *size_obj = PyDict_GetItemWithError(itemsizes, dtype);   /* borrowed */
    if (size_obj == NULL)
        return NULL;
    int64_t itemsize = count_of(size_obj), first = count_of(offset), base = count_of(data_offset);
    if (itemsize <= 0 || first < 0 || base < 0)
        return NULL;
    /* numel (the contiguous bytes) and the last element addressed (`tensor_fits`) */
    int64_t numel = 1, span = 0;
    int empty = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(shape); k++) {
        int64_t d = count_of(PyTuple_GET_ITEM(shape, k)), st = count_of(PyTuple_GET_ITEM(stride, k));
        if (d < 0 || st < 0 || (numel = mul_add(numel, d, 0)) < 0)
            return NULL;
        if (d == 0)
            empty = 1;
        else if ((span = mul_add(d - 1, st, span)) < 0)
            return NULL;
    }
    int64_t nbytes = mul_add(numel, itemsize, 0), byte_offset = mul_add(first, itemsize, base);
    if (nbytes < 0 || byte_offset < 0)
        return NULL;
    if (!empty && snbytes != Py_None) {
        int64_t last, bound = count_of(snbytes);
        if (__builtin_add_overflow(span, 1, &last) || __builtin_add_overflow(first, last, &last))
            return NULL;
        int64_t end = mul_add(last, itemsize, 0);
        if (bound < 0 || end < 0 || end > bound)
            return NULL;   /* out of its storage (an anomaly), or beyond int64: Python's */
    }
    PyObject *extras = frozen_dict_type->tp_new(frozen_dict_type, empty_tuple, NULL);
    if (extras == NULL)
        return NULL;
    if (PyDict_SetItem(extras, str_location, location) < 0 ||
        PyDict_SetItem(extras, str_member, member) < 0) {
        Py_DECREF(extras);
        return NULL;
    }
    PyObject *values[N_INFO] = {
        Py_NewRef(key), Py_NewRef(dtype), Py_NewRef(shape), Py_NewRef(stride), Py_NewRef(offset),
        PyLong_FromLongLong(byte_offset), PyLong_FromLongLong(nbytes),
        Py_NewRef(PyUnicode_GET_LENGTH(sfile) ? sfile : file), Py_NewRef(skey), Py_NewRef(snbytes),
        PyTuple_Pack(1, key), Py_NewRef(fmt), Py_NewRef(role), PyTuple_New(0), extras,
        Py_NewRef(Py_True)};
    return make(info_type, info_slots, N_INFO, values);
}

static PyObject *is_flat(PyObject *self, PyObject *d) {
    /* `torch_pickle.is_flat_state_dict` without its max_items (the caller checks the length) */
    if (!PyDict_CheckExact(d) || tensor_type == NULL || PyDict_GET_SIZE(d) == 0)
        Py_RETURN_FALSE;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &value))
        if (!PyUnicode_CheckExact(key) || !Py_IS_TYPE(value, tensor_type))
            Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

static PyObject *infos(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    /* infos(d, pos, out, fmt, file, itemsizes, consume) */
    if (argc != 7 || !PyDict_CheckExact(argv[0]) || !PyList_CheckExact(argv[2]) ||
        !PyDict_CheckExact(argv[5])) {
        PyErr_SetString(PyExc_TypeError, "infos(dict, pos, list, fmt, file, dict, consume)");
        return NULL;
    }
    if (info_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind_torch() first");
        return NULL;
    }
    PyObject *d = argv[0], *out = argv[2], *fmt = argv[3], *file = argv[4], *itemsizes = argv[5];
    Py_ssize_t pos = PyLong_AsSsize_t(argv[1]);
    int consume = PyObject_IsTrue(argv[6]);
    if ((pos == -1 && PyErr_Occurred()) || consume < 0)
        return NULL;
    PyObject *key, *value;
    while (PyDict_Next(d, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key) || !Py_IS_TYPE(value, tensor_type))
            return Py_BuildValue("(nOO)", pos, key, value);
        PyObject *info = plain_info(key, value, fmt, file, itemsizes);
        if (info == NULL) {
            if (PyErr_Occurred())
                return NULL;
            return Py_BuildValue("(nOO)", pos, key, value);
        }
        if (list_append(out, info) < 0)
            return NULL;
        Py_INCREF(key);     /* held across the store, which may free the value */
        int rc = consume ? PyDict_SetItem(d, key, Py_None) : 0;
        Py_DECREF(key);
        if (rc < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"is_flat", is_flat, METH_O, "is_flat(d): d is a non-empty dict of str keys and TensorRefs."},
    {"infos", (PyCFunction)(void (*)(void))infos, METH_FASTCALL,
     "infos(d, pos, out, fmt, file, itemsizes, consume): build_tensor_list's records of a flat "
     "state dict from dict position pos on; None when done, else (next pos, key, value) of the "
     "first item it leaves to Python."},
    {"bind_vm", bind_vm, METH_VARARGS,
     "bind_vm(Global, _SMALL_TUPLES, _small_tuple, _ordered_dict): the VM's side."},
    {"bind_torch", bind_torch, METH_VARARGS,
     "bind_torch(StorageRef, TensorRef, _rebuild_tensor_v2, _NO_EXTRAS, TensorInfo, FrozenDict): "
     "the tensors' side."},
    {"tensor", (PyCFunction)(void (*)(void))tensor, METH_FASTCALL,
     "tensor(data, pos, n, stack, memo, depth_room, budget, dispatches, max_string, vm, fast, "
     "recording, pids): _VM.torch_tensor at pos, then the dict items that follow (see the "
     "file's comment): None, or (next offset, opcodes, objects built, loop dispatches)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_torchstep",
                                    "The pickle VM's compiled torch step.", -1, methods};

PyMODINIT_FUNC PyInit__torchstep(void) {
    str_storage = PyUnicode_InternFromString("storage");
    str_tensor = PyUnicode_InternFromString("tensor");
    str_fast_at = PyUnicode_InternFromString("fast_at");
    str_load_storage = PyUnicode_InternFromString("load_storage");
    str_reduce_global = PyUnicode_InternFromString("reduce_global");
    str_location = PyUnicode_InternFromString("location");
    str_member = PyUnicode_InternFromString("member");
    empty_tuple = PyTuple_New(0);
    if (!str_storage || !str_tensor || !str_fast_at || !str_load_storage || !str_reduce_global ||
        !str_location || !str_member || !empty_tuple)
        return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    /* FIELDS: the fields of each Python class this file reads or fills, in their order, so that
     * a test fails when one of those classes gains or loses a field (bind_* would refuse it and
     * the step would silently be off) */
    PyObject *fields = PyDict_New();
    int bad = fields == NULL || PyModule_AddIntConstant(mod, "ABI", ABI) < 0;
    struct { const char *cls; const Slot *slots; int count; } all[] = {
        {"Global", global_slots, N_GLOBAL}, {"StorageRef", storage_slots, N_STORAGE},
        {"TensorRef", tensor_slots, N_TENSOR}, {"TensorInfo", info_slots, N_INFO}};
    for (size_t c = 0; !bad && c < sizeof all / sizeof all[0]; c++) {
        PyObject *names = PyTuple_New(all[c].count);
        bad = names == NULL;
        for (int k = 0; !bad && k < all[c].count; k++) {
            PyObject *name = PyUnicode_FromString(all[c].slots[k].name);
            bad = name == NULL;
            if (!bad)
                PyTuple_SET_ITEM(names, k, name);
        }
        bad = bad || PyDict_SetItemString(fields, all[c].cls, names) < 0;
        Py_XDECREF(names);
    }
    if (!bad) {
        PyObject *record = Py_BuildValue("(sssss)", "name", "error", "method", "data_offset",
                                         "size");
        bad = record == NULL || PyDict_SetItemString(fields, "_Record", record) < 0;
        Py_XDECREF(record);
    }
    if (bad || PyModule_AddObjectRef(mod, "FIELDS", fields) < 0) {
        Py_XDECREF(fields);
        Py_DECREF(mod);
        return NULL;
    }
    Py_DECREF(fields);
    return mod;
}
