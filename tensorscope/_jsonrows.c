/* `tensorscope.model.json_texts` (the JSON text of each record of `inspect --json`) in one
 * compiled loop: 10^5-10^6 rows a listing, ~1 µs a row in Python.
 *
 * `texts` runs the Python loop's steps in its order: a record whose kind (dtype, shape, stride,
 * file, format, role, size, extras, or the location of a torch storage's extras) is the previous
 * record's reuses its parts, else `parts_of(record)` (`model._parts_of`) gives them (None: the row
 * is None, for the general encoder). The row is then the same string joins: the byte offset, the
 * kind's head, the name, the middle, the path, the tail, the storage key, the storage offset and
 * the stride. Names and keys are escaped as `json.encoder.encode_basestring_ascii` does: printable
 * ASCII other than '"' and '\\' is copied between quotes, anything else is passed to `escape` (that
 * function). A row with anything the Python loop would not make by those joins (a field of another
 * type, a text that is not ASCII, a record of another class) is returned as NotImplemented, and
 * the Python loop makes it: this file decides nothing the Python code does not decide the same way
 * (tests/test_jsonrows.py holds the two to equal texts).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ABI 1

typedef struct {
    const char *name;
    Py_ssize_t offset;
} Slot;

/* TensorInfo's fields (tensorscope/model.py), in its declaration order. */
enum { I_NAME, I_DTYPE, I_SHAPE, I_STRIDE, I_STORAGE_OFFSET, I_BYTE_OFFSET, I_NBYTES, I_FILE,
       I_STORAGE_KEY, I_STORAGE_NBYTES, I_PATH, I_FORMAT, I_ROLE, I_CHUNKS, I_EXTRAS, I_HAS_DATA,
       N_INFO };
static Slot info_slots[N_INFO] = {
    {"name", 0}, {"dtype", 0}, {"shape", 0}, {"stride", 0}, {"storage_offset", 0},
    {"byte_offset", 0}, {"nbytes", 0}, {"file", 0}, {"storage_key", 0}, {"storage_nbytes", 0},
    {"path", 0}, {"source_format", 0}, {"role", 0}, {"chunks", 0}, {"extras", 0},
    {"has_data", 0}};
static PyTypeObject *info_type = NULL, *frozen_type = NULL;
static PyObject *str_member = NULL, *str_location = NULL;

#define SLOT(obj, k) (*(PyObject **)((char *)(obj) + info_slots[k].offset))

static PyObject *bind(PyObject *self, PyObject *args) {
    PyObject *cls, *frozen;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &cls, &PyType_Type, &frozen))
        return NULL;
    PyTypeObject *type = (PyTypeObject *)cls;
    Py_ssize_t offsets[N_INFO];
    for (int k = 0; k < N_INFO; k++) {
        PyObject *descr = PyDict_GetItemString(type->tp_dict, info_slots[k].name);  /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyDescrObject *)descr)->d_type != type) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot of that class", type->tp_name,
                         info_slots[k].name);
            return NULL;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || m->offset <= 0 ||
            m->offset + (Py_ssize_t)sizeof(PyObject *) > type->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a plain object slot", type->tp_name,
                         info_slots[k].name);
            return NULL;
        }
        offsets[k] = m->offset;
    }
    if (type->tp_itemsize != 0 || type->tp_dictoffset != 0 ||
        type->tp_basicsize != (Py_ssize_t)(sizeof(PyObject) + N_INFO * sizeof(PyObject *))) {
        PyErr_Format(PyExc_TypeError, "%s has other fields than the %d this file reads",
                     type->tp_name, N_INFO);
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)frozen, &PyDict_Type)) {
        PyErr_SetString(PyExc_TypeError, "FrozenDict must be a dict subclass");
        return NULL;
    }
    for (int k = 0; k < N_INFO; k++)
        info_slots[k].offset = offsets[k];
    Py_INCREF(type);
    Py_XSETREF(info_type, type);
    Py_INCREF(frozen);
    Py_XSETREF(frozen_type, (PyTypeObject *)frozen);
    Py_RETURN_NONE;
}

/* -- a growing ASCII buffer ------------------------------------------------------------------ */

typedef struct {
    char *d;
    Py_ssize_t len, cap;
} Buf;

static int reserve(Buf *b, Py_ssize_t more) {
    if (more > PY_SSIZE_T_MAX - b->len)
        return -1;
    Py_ssize_t need = b->len + more;
    if (need <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 512;
    while (cap < need)
        cap = cap > PY_SSIZE_T_MAX / 2 ? need : cap * 2;
    char *d = realloc(b->d, (size_t)cap);
    if (d == NULL)
        return -1;
    b->d = d;
    b->cap = cap;
    return 0;
}

static int put(Buf *b, const char *s, Py_ssize_t n) {
    if (n == 0)   /* nothing (and no memcpy into a buffer not yet made) */
        return 0;
    if (reserve(b, n) < 0)
        return -1;
    memcpy(b->d + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

#define PUT_LIT(b, lit) put((b), (lit), (Py_ssize_t)(sizeof(lit) - 1))

/* The joined rows' buffer, kept between calls (a batch of 2,048 rows is ~1 MB: a fresh one per
 * batch costs its pages' faults every time); at most KEEP_MAX bytes are kept. */
#define KEEP_MAX ((Py_ssize_t)16 << 20)
static Buf kept = {NULL, 0, 0};

/* 1: an ASCII str, appended; 0: not an ASCII str (the row goes to Python) */
static int put_ascii(Buf *b, PyObject *s) {
    if (!PyUnicode_CheckExact(s) || !PyUnicode_IS_ASCII(s))
        return 0;
    return put(b, (const char *)PyUnicode_1BYTE_DATA(s), PyUnicode_GET_LENGTH(s)) < 0 ? -1 : 1;
}

/* a str as encode_basestring_ascii writes it; 1 done, 0 not a str (Python's), -1 error */
static int put_json_str(Buf *b, PyObject *s, PyObject *escape) {
    if (!PyUnicode_CheckExact(s))
        return 0;
    if (PyUnicode_IS_ASCII(s)) {
        const unsigned char *p = PyUnicode_1BYTE_DATA(s);
        Py_ssize_t n = PyUnicode_GET_LENGTH(s), i = 0;
        while (i < n && p[i] >= 0x20 && p[i] <= 0x7e && p[i] != '"' && p[i] != '\\')
            i++;
        if (i == n) {
            if (reserve(b, n + 2) < 0)
                return -1;
            b->d[b->len++] = '"';
            memcpy(b->d + b->len, p, (size_t)n);
            b->len += n;
            b->d[b->len++] = '"';
            return 1;
        }
    }
    PyObject *e = PyObject_CallOneArg(escape, s);
    if (e == NULL)
        return -1;
    int got = put_ascii(b, e);
    Py_DECREF(e);
    return got;
}

/* int.__repr__ of an exact int; 1 done, 0 not an exact int, -1 error */
static int put_int(Buf *b, PyObject *v) {
    if (!PyLong_CheckExact(v))
        return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (!overflow) {   /* as "%lld" writes it */
        char tmp[24];
        int n = 0;
        unsigned long long u = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
        do {
            tmp[sizeof tmp - 1 - n++] = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        if (x < 0)
            tmp[sizeof tmp - 1 - n++] = '-';
        return put(b, tmp + sizeof tmp - n, n) < 0 ? -1 : 1;
    }
    PyObject *r = PyObject_Repr(v);
    if (r == NULL)
        return -1;
    int got = put_ascii(b, r);
    Py_DECREF(r);
    return got;
}

/* The Python loop's kind test for `t` against `prev` (the previous record with parts) and the
 * location of its kind (NULL: not a member kind). 1 the same kind, 0 not, -1 error. */
static int same_kind(PyObject *t, PyObject *prev, PyObject *location) {
    if (prev == NULL || SLOT(t, I_SHAPE) != SLOT(prev, I_SHAPE))
        return 0;
    PyObject *ex = SLOT(t, I_EXTRAS);
    if (ex != SLOT(prev, I_EXTRAS)) {
        if (location == NULL || !Py_IS_TYPE(ex, frozen_type) || PyDict_GET_SIZE(ex) != 2)
            return 0;
        PyObject *member = PyDict_GetItemWithError(ex, str_member);
        if (member == NULL || !PyUnicode_CheckExact(member))
            return PyErr_Occurred() ? -1 : 0;
        PyObject *loc = PyDict_GetItemWithError(ex, str_location);
        if (loc == NULL || !PyUnicode_CheckExact(loc))
            return PyErr_Occurred() ? -1 : 0;
        int eq = PyObject_RichCompareBool(loc, location, Py_EQ);
        if (eq <= 0)
            return eq;
    }
    if (SLOT(t, I_DTYPE) != SLOT(prev, I_DTYPE) || SLOT(t, I_FILE) != SLOT(prev, I_FILE) ||
        SLOT(t, I_STRIDE) != SLOT(prev, I_STRIDE) || !PyLong_CheckExact(SLOT(t, I_NBYTES)))
        return 0;
    int eq = PyObject_RichCompareBool(SLOT(t, I_NBYTES), SLOT(prev, I_NBYTES), Py_EQ);
    if (eq <= 0)
        return eq;
    if (SLOT(t, I_ROLE) != SLOT(prev, I_ROLE) || SLOT(t, I_FORMAT) != SLOT(prev, I_FORMAT))
        return 0;
    int has = PyObject_IsTrue(SLOT(t, I_HAS_DATA));
    if (has <= 0)
        return has;
    int chunks = PyObject_IsTrue(SLOT(t, I_CHUNKS));
    return chunks < 0 ? -1 : !chunks;
}

/* One row into `b` (emptied first): 1 done, 0 Python's (NotImplemented), -1 error. */
static int row(Buf *b, PyObject *t, PyObject *parts, PyObject *escape) {
    b->len = 0;
    PyObject *bo = SLOT(t, I_BYTE_OFFSET), *so = SLOT(t, I_STORAGE_OFFSET);
    PyObject *sk = SLOT(t, I_STORAGE_KEY), *name = SLOT(t, I_NAME), *path = SLOT(t, I_PATH);
    PyObject *head = PyTuple_GET_ITEM(parts, 0), *mid = PyTuple_GET_ITEM(parts, 1);
    PyObject *tail = PyTuple_GET_ITEM(parts, 2), *stride = PyTuple_GET_ITEM(parts, 3);
    PyObject *after = PyTuple_GET_ITEM(parts, 5);
    if ((bo != Py_None && !PyLong_CheckExact(bo)) || !PyLong_CheckExact(so) ||
        !PyTuple_CheckExact(path) || !PyUnicode_CheckExact(name))
        return 0;
    int got;
    if (PUT_LIT(b, "{\"byte_offset\": ") < 0)
        return -1;
    if (bo == Py_None)
        got = PUT_LIT(b, "null") < 0 ? -1 : 1;
    else
        got = put_int(b, bo);
    if (got <= 0)
        return got;
    if (PUT_LIT(b, ", ") < 0 || (got = put_ascii(b, head)) <= 0)
        return got < 0 ? -1 : 0;
    if (after != Py_None) {
        PyObject *member = PyDict_GetItemWithError(SLOT(t, I_EXTRAS), str_member);
        if (member == NULL)
            return PyErr_Occurred() ? -1 : 0;
        if ((got = put_json_str(b, member, escape)) <= 0 || (got = put_ascii(b, after)) <= 0)
            return got;
    }
    Py_ssize_t name_at = b->len;
    if ((got = put_json_str(b, name, escape)) <= 0)
        return got;
    Py_ssize_t name_len = b->len - name_at;
    if ((got = put_ascii(b, mid)) <= 0)
        return got;
    if (PUT_LIT(b, "[") < 0)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(path);
    int same = 0;
    if (n == 1) {
        same = PyObject_RichCompareBool(PyTuple_GET_ITEM(path, 0), name, Py_EQ);
        if (same < 0)
            return -1;
    }
    if (same) {
        if (reserve(b, name_len) < 0)
            return -1;
        memcpy(b->d + b->len, b->d + name_at, (size_t)name_len);
        b->len += name_len;
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i && PUT_LIT(b, ", ") < 0)
                return -1;
            if ((got = put_json_str(b, PyTuple_GET_ITEM(path, i), escape)) <= 0)
                return got;
        }
    }
    if (PUT_LIT(b, "]") < 0 || (got = put_ascii(b, tail)) <= 0)
        return got < 0 ? -1 : 0;
    if (sk == Py_None)
        got = PUT_LIT(b, "null") < 0 ? -1 : 1;
    else
        got = put_json_str(b, sk, escape);
    if (got <= 0)
        return got;
    if (PUT_LIT(b, ", \"storage_offset\": ") < 0 || (got = put_int(b, so)) <= 0)
        return got < 0 ? -1 : 0;
    if ((got = put_ascii(b, stride)) <= 0)
        return got;
    return 1;
}

/* texts(records, parts_of, escape) -> (list of str | None | NotImplemented, NotImplemented count) */
static PyObject *run(PyObject *args, int joined) {
    PyObject *records, *parts_of, *escape;
    if (!PyArg_ParseTuple(args, "O!OO", &PyList_Type, &records, &parts_of, &escape))
        return NULL;
    if (info_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind() first");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(records);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)   /* filled below; a list must hold objects throughout */
        PyList_SET_ITEM(out, i, Py_NewRef(Py_NotImplemented));
    Buf b = {NULL, 0, 0};
    Buf all = kept;   /* the rows joined (joined mode): the buffer of the last call, emptied */
    all.len = 0;
    kept.d = NULL;
    kept.cap = 0;
    int declined = 0;                            /* joined mode: a row Python makes, or None */
    PyObject *prev = NULL, *parts = NULL, *location = NULL;   /* owned references */
    int failed = 0;
    Py_ssize_t made = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records) && i < n; i++) {
        PyObject *t = PyList_GET_ITEM(records, i);
        if (!Py_IS_TYPE(t, info_type)) {
            Py_CLEAR(prev);   /* the Python loop makes this row, and compares the next anew */
            declined = 1;
            if (joined)
                break;
            continue;
        }
        Py_INCREF(t);
        int same = same_kind(t, prev, location);
        if (same < 0) {
            Py_DECREF(t);
            failed = 1;
            break;
        }
        if (!same) {
            Py_CLEAR(prev);
            Py_CLEAR(parts);
            Py_CLEAR(location);
            PyObject *p = PyObject_CallOneArg(parts_of, t);
            if (p == NULL) {
                Py_DECREF(t);
                failed = 1;
                break;
            }
            if (p == Py_None) {
                Py_DECREF(p);
                Py_DECREF(t);
                PyList_SetItem(out, i, Py_NewRef(Py_None));   /* steals; drops the placeholder */
                made++;
                declined = 1;
                if (joined)
                    break;
                continue;
            }
            if (!PyTuple_CheckExact(p) || PyTuple_GET_SIZE(p) != 6) {
                Py_DECREF(p);
                Py_DECREF(t);
                declined = 1;
                if (joined)
                    break;
                continue;   /* not parts this file knows: Python's */
            }
            parts = p;
            prev = Py_NewRef(t);
            if (PyTuple_GET_ITEM(p, 5) != Py_None) {
                PyObject *ex = SLOT(t, I_EXTRAS);
                PyObject *loc = PyDict_Check(ex) ? PyDict_GetItemWithError(ex, str_location) : NULL;
                if (loc == NULL) {
                    Py_DECREF(t);
                    if (PyErr_Occurred()) {
                        failed = 1;
                        break;
                    }
                    Py_CLEAR(prev);
                    Py_CLEAR(parts);
                    declined = 1;
                    if (joined)
                        break;
                    continue;
                }
                location = Py_NewRef(loc);
            }
        }
        int got = row(&b, t, parts, escape);
        Py_DECREF(t);
        if (got < 0) {
            if (!PyErr_Occurred())
                PyErr_NoMemory();
            failed = 1;
            break;
        }
        if (got == 0) {
            declined = 1;
            if (joined)
                break;
            continue;
        }
        if (joined) {
            if ((i && PUT_LIT(&all, ", ") < 0) || put(&all, b.d, b.len) < 0) {
                PyErr_NoMemory();
                failed = 1;
                break;
            }
            continue;
        }
        PyObject *s = PyUnicode_New(b.len, 127);
        if (s == NULL) {
            failed = 1;
            break;
        }
        memcpy(PyUnicode_1BYTE_DATA(s), b.d, (size_t)b.len);
        PyList_SetItem(out, i, s);
        made++;
    }
    free(b.d);
    Py_XDECREF(prev);
    Py_XDECREF(parts);
    Py_XDECREF(location);
    if (all.cap <= KEEP_MAX) {   /* kept for the next batch: no fresh pages per batch */
        kept = all;
    } else {
        free(all.d);
    }
    if (failed) {
        Py_DECREF(out);
        return NULL;
    }
    if (joined) {
        Py_DECREF(out);
        PyObject *text = NULL;
        if (declined) {
            text = Py_NewRef(Py_None);
        } else if ((text = PyUnicode_New(all.len, 127)) != NULL && all.len) {
            memcpy(PyUnicode_1BYTE_DATA(text), all.d, (size_t)all.len);
        }
        return text;
    }
    return Py_BuildValue("(Nn)", out, n - made);
}

static PyObject *texts(PyObject *self, PyObject *args) {
    return run(args, 0);
}

/* joined(records, parts_of, escape) -> ", ".join(the texts) when this file makes every row, else
 * None (a row Python makes, or one for the general encoder) */
static PyObject *joined(PyObject *self, PyObject *args) {
    return run(args, 1);
}



static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(TensorInfo, FrozenDict): the classes texts reads."},
    {"texts", texts, METH_VARARGS,
     "texts(records, parts_of, escape): json_texts' rows, NotImplemented where Python makes one."},
    {"joined", joined, METH_VARARGS,
     "joined(records, parts_of, escape): the rows joined by ', ', or None (Python's, row by row)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jsonrows",
                                    "The JSON rows of inspect --json, compiled.", -1, methods};

PyMODINIT_FUNC PyInit__jsonrows(void) {
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    str_member = PyUnicode_InternFromString("member");
    str_location = PyUnicode_InternFromString("location");
    PyObject *fields = PyTuple_New(N_INFO);
    int bad = str_member == NULL || str_location == NULL || fields == NULL ||
              PyModule_AddIntConstant(mod, "ABI", ABI) < 0;
    for (int k = 0; !bad && k < N_INFO; k++) {
        PyObject *name = PyUnicode_FromString(info_slots[k].name);
        bad = name == NULL;
        if (!bad)
            PyTuple_SET_ITEM(fields, k, name);
    }
    bad = bad || PyModule_AddObjectRef(mod, "FIELDS", fields) < 0;
    Py_XDECREF(fields);
    if (bad) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
