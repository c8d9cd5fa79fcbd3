/* The safetensors header's fast path (`parsers.safetensors._fast` after `json.loads`) in one
 * compiled pass: a shard of 10^5 tensors spent ~1 µs a tensor in `json.loads`, ~1 µs in the
 * column checks and ~1 µs making its record.
 *
 * `header` reads the header's bytes under a strict subset of JSON: one object whose members are
 * `"__metadata__"` (null, or an object of string values) and tensors, each an object of exactly
 * `dtype` (a string), `shape` (an array of unsigned integers) and `data_offsets` (two unsigned
 * integers), once each, in any order; strings without a backslash or a control character; JSON
 * whitespace between tokens; nothing after the object. On that subset `json.loads` gives the
 * dict `_fast` reads, and `header` makes what `_fast` makes from it: the records in data order
 * (sorted by (begin, end), ties in header order, when the header is not), each tensor's kind from
 * `_kind` (one call per distinct dtype and shape), the tiling and size checks, the index's names
 * shared. Anything else (an escape, a float, a duplicate key anywhere, an unknown dtype, a bad
 * size, holes, overlaps, an integer of 2^64 or more, no tensor at all) returns None, and the
 * Python path reads the header and says what is wrong: this file decides nothing the Python
 * code does not decide the same way (tests/test_stheader.py holds the two to equal records).
 *
 * `index_map` reads a sharded checkpoint's index the same way: the weight map as columns (names,
 * each tensor's shard), the other members' places for json.loads (see there).
 *
 * Every read is bounds-checked against the buffer's length; integers are read with overflow
 * checks; records are made without calling `TensorInfo.__init__`: `bind` is given the class once
 * and finds each field's slot, which `header` fills as `TensorInfo.trusted` would.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ABI 1
#define MAX_DIMS 64   /* a longer shape: the Python path */

typedef struct {
    const char *name;
    Py_ssize_t offset;
} Slot;

/* TensorInfo's fields (tensorscope/model.py), in its declaration order. */
enum { I_NAME, I_DTYPE, I_SHAPE, I_STRIDE, I_STORAGE_OFFSET, I_BYTE_OFFSET, I_NBYTES, I_FILE,
       I_STORAGE_KEY, I_STORAGE_NBYTES, I_PATH, I_FORMAT, I_ROLE, I_CHUNKS, I_EXTRAS, I_HAS_DATA,
       N_INFO };
static Slot info_slots[N_INFO] = {
    {"name"}, {"dtype"}, {"shape"}, {"stride"}, {"storage_offset"}, {"byte_offset"}, {"nbytes"},
    {"file"}, {"storage_key"}, {"storage_nbytes"}, {"path"}, {"source_format"}, {"role"},
    {"chunks"}, {"extras"}, {"has_data"}};
static PyTypeObject *info_type = NULL;

#define SLOT(obj, k) (*(PyObject **)((char *)(obj) + info_slots[k].offset))

static PyObject *bind(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes the TensorInfo class");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    Py_ssize_t offsets[N_INFO];   /* the bound class's stay in force unless all are found */
    for (int k = 0; k < N_INFO; k++) {
        PyObject *descr = PyDict_GetItemString(type->tp_dict, info_slots[k].name);  /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyDescrObject *)descr)->d_type != type) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot of that class", type->tp_name,
                         info_slots[k].name);
            return NULL;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0 ||
            m->offset + (Py_ssize_t)sizeof(PyObject *) > type->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a plain object slot", type->tp_name,
                         info_slots[k].name);
            return NULL;
        }
        offsets[k] = m->offset;
    }
    /* exactly these slots: a field added to TensorInfo and not here would be left unset */
    if (type->tp_itemsize != 0 || type->tp_dictoffset != 0 ||
        type->tp_basicsize != (Py_ssize_t)(sizeof(PyObject) + N_INFO * sizeof(PyObject *))) {
        PyErr_Format(PyExc_TypeError, "%s has other fields than the %d this file sets",
                     type->tp_name, N_INFO);
        return NULL;
    }
    for (int k = 0; k < N_INFO; k++)
        info_slots[k].offset = offsets[k];
    Py_INCREF(type);
    Py_XSETREF(info_type, type);
    Py_RETURN_NONE;
}

/* -- the reader: every function returns 0 when the input is outside the subset ---------------- */

typedef struct {
    const unsigned char *d;
    Py_ssize_t at, end;
} Reader;

static void skip_ws(Reader *r) {
    while (r->at < r->end) {
        unsigned char c = r->d[r->at];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            return;
        r->at++;
    }
}

static int take(Reader *r, unsigned char c) {
    skip_ws(r);
    if (r->at < r->end && r->d[r->at] == c) {
        r->at++;
        return 1;
    }
    return 0;
}

static int peek(Reader *r, unsigned char c) {
    skip_ws(r);
    return r->at < r->end && r->d[r->at] == c;
}

/* A string without escapes or control characters: its bytes are d[*start, *start + *len). */
static int string(Reader *r, Py_ssize_t *start, Py_ssize_t *len) {
    if (!take(r, '"'))
        return 0;
    Py_ssize_t s = r->at;
    const unsigned char *p = r->d;
    while (r->at < r->end) {
        unsigned char c = p[r->at];
        if (c == '"') {
            *start = s;
            *len = r->at - s;
            r->at++;
            return 1;
        }
        if (c == '\\' || c < 0x20)
            return 0;
        r->at++;
    }
    return 0;
}

/* An unsigned JSON integer below 2^64 ("0" or no leading zero; no sign, fraction or exponent:
 * those, and what follows a number, are refused by the caller's next token). */
static int unsigned_int(Reader *r, uint64_t *out) {
    skip_ws(r);
    if (r->at >= r->end)
        return 0;
    const unsigned char *p = r->d;
    if (p[r->at] == '0') {
        r->at++;
        *out = 0;
        return !(r->at < r->end && p[r->at] >= '0' && p[r->at] <= '9');
    }
    uint64_t v = 0;
    Py_ssize_t s = r->at;
    while (r->at < r->end && p[r->at] >= '0' && p[r->at] <= '9') {
        if (__builtin_mul_overflow(v, (uint64_t)10, &v) ||
            __builtin_add_overflow(v, (uint64_t)(p[r->at] - '0'), &v))
            return 0;
        r->at++;
    }
    *out = v;
    return r->at > s;
}

static PyObject *decode(Reader *r, Py_ssize_t start, Py_ssize_t len) {
    /* NULL with no error set: not valid UTF-8 (the Python path says so) */
    PyObject *s = PyUnicode_DecodeUTF8((const char *)r->d + start, len, NULL);
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    return s;
}

typedef struct {
    PyObject *name;          /* a new reference */
    uint64_t begin, end;
    Py_ssize_t kind, order;
} Entry;

static int by_offsets(const void *a, const void *b) {
    const Entry *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static int bytes_eq(Reader *r, Py_ssize_t start, Py_ssize_t len, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)len == n && memcmp(r->d + start, lit, n) == 0;
}

/* header(raw, data_start, file, dtypes, kind_of, known, fmt, role)
 *   -> (records, user metadata or None) | None
 *
 * raw: the header's bytes (any buffer); data_start: 8 + N; file: the records' file; dtypes: the
 * header dtypes known (a dict); kind_of(dtype, shape) -> (dtype, shape, stride, nbytes, extras)
 * or None (`_kind`); known: None or a dict name -> the string object to use (`sharing_names`);
 * fmt, role: the records' source_format and role. */
static PyObject *header(PyObject *self, PyObject *args) {
    Py_buffer buf;
    PyObject *data_start_obj, *file, *dtypes, *kind_of, *known, *fmt, *role;
    if (!PyArg_ParseTuple(args, "y*O!UO!OOUU", &buf, &PyLong_Type, &data_start_obj, &file,
                          &PyDict_Type, &dtypes, &kind_of, &known, &fmt, &role))
        return NULL;
    if (info_type == NULL) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_RuntimeError, "bind() first");
        return NULL;
    }
    if (known != Py_None && !PyDict_Check(known)) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_TypeError, "known must be a dict or None");
        return NULL;
    }
    int overflow = 0;
    long long ds_signed = PyLong_AsLongLongAndOverflow(data_start_obj, &overflow);
    if (ds_signed == -1 && PyErr_Occurred()) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (overflow || ds_signed < 0) {
        PyBuffer_Release(&buf);
        Py_RETURN_NONE;
    }
    uint64_t data_start = (uint64_t)ds_signed;

    Reader r = {(const unsigned char *)buf.buf, 0, buf.len};
    Entry *entries = NULL;
    Py_ssize_t n = 0, cap = 0;
    PyObject *seen = PySet_New(NULL), *kinds = PyList_New(0), *kind_index = PyDict_New();
    PyObject *meta = NULL, *records = NULL, *result = NULL;
    int meta_seen = 0, failed = 0;   /* failed: an exception is set */
    /* the previous tensor's dtype bytes and shape: the same kind when they repeat */
    Py_ssize_t prev_dt_start = 0, prev_dt_len = -1, prev_ndim = -1, prev_kind = -1;
    uint64_t prev_dims[MAX_DIMS];
    if (seen == NULL || kinds == NULL || kind_index == NULL) {
        failed = 1;
        goto done;
    }
    if (!take(&r, '{') || peek(&r, '}'))
        goto done;   /* not an object, or no tensor: Python's */
    for (;;) {
        Py_ssize_t ks, kl;
        if (!string(&r, &ks, &kl) || !take(&r, ':'))
            goto done;
        if (bytes_eq(&r, ks, kl, "__metadata__")) {
            if (meta_seen)
                goto done;
            meta_seen = 1;
            skip_ws(&r);
            if (r.end - r.at >= 4 && memcmp(r.d + r.at, "null", 4) == 0) {
                r.at += 4;
            } else {
                if (!take(&r, '{'))
                    goto done;
                meta = PyDict_New();
                if (meta == NULL) {
                    failed = 1;
                    goto done;
                }
                if (!take(&r, '}')) {
                    for (;;) {
                        Py_ssize_t a, al, b, bl;
                        if (!string(&r, &a, &al) || !take(&r, ':') || !string(&r, &b, &bl))
                            goto done;
                        PyObject *k = decode(&r, a, al);
                        if (k == NULL) {
                            failed = PyErr_Occurred() != NULL;
                            goto done;
                        }
                        PyObject *v = decode(&r, b, bl);
                        if (v == NULL) {
                            Py_DECREF(k);
                            failed = PyErr_Occurred() != NULL;
                            goto done;
                        }
                        int has = PyDict_Contains(meta, k);
                        int bad = has != 0 || PyDict_SetItem(meta, k, v) < 0;
                        Py_DECREF(k);
                        Py_DECREF(v);
                        if (bad) {   /* a duplicate key (has == 1), or an error */
                            failed = has != 1 && PyErr_Occurred() != NULL;
                            goto done;
                        }
                        if (take(&r, '}'))
                            break;
                        if (!take(&r, ','))
                            goto done;
                    }
                }
            }
        } else {
            /* a tensor: {dtype, shape, data_offsets}, once each, in any order */
            Py_ssize_t dt_start = 0, dt_len = -1, ndim = -1;
            uint64_t dims[MAX_DIMS], offs[2];
            int fields = 0;
            if (!take(&r, '{'))
                goto done;
            for (;;) {
                Py_ssize_t fs, fl;
                if (!string(&r, &fs, &fl) || !take(&r, ':'))
                    goto done;
                if (bytes_eq(&r, fs, fl, "dtype")) {
                    if (fields & 1 || !string(&r, &dt_start, &dt_len))
                        goto done;
                    fields |= 1;
                } else if (bytes_eq(&r, fs, fl, "shape")) {
                    if (fields & 2 || !take(&r, '['))
                        goto done;
                    fields |= 2;
                    ndim = 0;
                    if (!take(&r, ']')) {
                        for (;;) {
                            if (ndim == MAX_DIMS || !unsigned_int(&r, &dims[ndim]))
                                goto done;
                            ndim++;
                            if (take(&r, ']'))
                                break;
                            if (!take(&r, ','))
                                goto done;
                        }
                    }
                } else if (bytes_eq(&r, fs, fl, "data_offsets")) {
                    if (fields & 4 || !take(&r, '[') || !unsigned_int(&r, &offs[0]) || !take(&r, ',') ||
                        !unsigned_int(&r, &offs[1]) || !take(&r, ']'))
                        goto done;
                    fields |= 4;
                } else {
                    goto done;   /* a field the reference reader ignores: Python's anomaly */
                }
                if (take(&r, '}'))
                    break;
                if (!take(&r, ','))
                    goto done;
            }
            if (fields != 7)
                goto done;
            Py_ssize_t kind;
            if (prev_kind >= 0 && dt_len == prev_dt_len && ndim == prev_ndim &&
                memcmp(r.d + dt_start, r.d + prev_dt_start, (size_t)dt_len) == 0 &&
                memcmp(dims, prev_dims, (size_t)ndim * sizeof(uint64_t)) == 0) {
                kind = prev_kind;
            } else {
                PyObject *dt = decode(&r, dt_start, dt_len);
                if (dt == NULL) {
                    failed = PyErr_Occurred() != NULL;
                    goto done;
                }
                int known_dtype = PyDict_Contains(dtypes, dt);
                PyObject *shape = known_dtype == 1 ? PyTuple_New(ndim) : NULL;
                for (Py_ssize_t k = 0; shape != NULL && k < ndim; k++) {
                    PyObject *d = PyLong_FromUnsignedLongLong(dims[k]);
                    if (d == NULL)
                        Py_CLEAR(shape);
                    else
                        PyTuple_SET_ITEM(shape, k, d);
                }
                PyObject *key = shape != NULL ? PyTuple_Pack(2, dt, shape) : NULL;
                PyObject *got = key != NULL ? PyDict_GetItemWithError(kind_index, key) : NULL;
                if (got != NULL) {
                    kind = PyLong_AsSsize_t(got);
                } else if (key != NULL && !PyErr_Occurred()) {
                    PyObject *k5 = PyObject_CallFunctionObjArgs(kind_of, dt, shape, NULL);
                    kind = -1;
                    if (k5 != NULL && PyTuple_CheckExact(k5) && PyTuple_GET_SIZE(k5) == 5 &&
                        PyLong_CheckExact(PyTuple_GET_ITEM(k5, 3))) {
                        int nb_over = 0;
                        long long nb = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(k5, 3),
                                                                    &nb_over);
                        if (!nb_over && nb >= 0) {
                            PyObject *idx = PyLong_FromSsize_t(PyList_GET_SIZE(kinds));
                            if (idx != NULL && PyDict_SetItem(kind_index, key, idx) == 0 &&
                                PyList_Append(kinds, k5) == 0)
                                kind = PyList_GET_SIZE(kinds) - 1;
                            Py_XDECREF(idx);
                        }
                    }
                    Py_XDECREF(k5);
                } else {
                    kind = -1;
                }
                Py_XDECREF(key);
                Py_XDECREF(shape);
                Py_DECREF(dt);
                if (known_dtype < 0 || PyErr_Occurred()) {
                    failed = 1;
                    goto done;
                }
                if (kind < 0)
                    goto done;   /* an unknown dtype, a shape `_kind` refuses: Python's */
                prev_kind = kind;
                prev_dt_start = dt_start;
                prev_dt_len = dt_len;
                prev_ndim = ndim;
                memcpy(prev_dims, dims, (size_t)ndim * sizeof(uint64_t));
            }
            PyObject *name = decode(&r, ks, kl);
            if (name == NULL) {
                failed = PyErr_Occurred() != NULL;
                goto done;
            }
            Py_ssize_t before = PySet_GET_SIZE(seen);
            if (PySet_Add(seen, name) < 0) {
                Py_DECREF(name);
                failed = 1;
                goto done;
            }
            if (PySet_GET_SIZE(seen) == before) {   /* a name twice: Python's anomaly */
                Py_DECREF(name);
                goto done;
            }
            if (n == cap) {
                Py_ssize_t grown = cap ? cap * 2 : 1024;
                Entry *e = grown <= PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(Entry)
                               ? realloc(entries, (size_t)grown * sizeof(Entry)) : NULL;
                if (e == NULL) {
                    Py_DECREF(name);
                    PyErr_NoMemory();
                    failed = 1;
                    goto done;
                }
                entries = e;
                cap = grown;
            }
            entries[n].name = name;
            entries[n].begin = offs[0];
            entries[n].end = offs[1];
            entries[n].kind = kind;
            entries[n].order = n;
            n++;
        }
        if (take(&r, '}'))
            break;
        if (!take(&r, ','))
            goto done;
    }
    skip_ws(&r);
    if (r.at != r.end || n == 0)
        goto done;   /* text after the object, or no tensor */
    /* data order: as the reference reader sorts, by (begin, end), ties in header order */
    int ordered = entries[0].begin == 0;
    for (Py_ssize_t i = 1; ordered && i < n; i++)
        ordered = entries[i].begin == entries[i - 1].end;
    if (!ordered)
        qsort(entries, (size_t)n, sizeof(Entry), by_offsets);
    /* tiling, and each tensor's size */
    if (entries[0].begin != 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        Entry *e = &entries[i];
        if (e->end < e->begin || (i && e->begin != entries[i - 1].end))
            goto done;
        PyObject *k5 = PyList_GET_ITEM(kinds, e->kind);
        if ((uint64_t)PyLong_AsLongLong(PyTuple_GET_ITEM(k5, 3)) != e->end - e->begin)
            goto done;
    }
    records = PyList_New(n);
    if (records == NULL) {
        failed = 1;
        goto done;
    }
    PyObject *zero = PyLong_FromLong(0), *empty = PyTuple_New(0);
    if (zero == NULL || empty == NULL) {
        Py_XDECREF(zero);
        Py_XDECREF(empty);
        failed = 1;
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Entry *e = &entries[i];
        PyObject *name = e->name;
        if (known != Py_None) {
            PyObject *same = PyDict_GetItemWithError(known, name);   /* borrowed */
            if (same == NULL && PyErr_Occurred()) {
                failed = 1;
                break;
            }
            if (same != NULL && PyUnicode_CheckExact(same)) {
                Py_INCREF(same);
                Py_SETREF(e->name, same);
                name = same;
            }
        }
        uint64_t at;
        PyObject *offset = __builtin_add_overflow(data_start, e->begin, &at) ? NULL
                           : PyLong_FromUnsignedLongLong(at);
        if (offset == NULL && !PyErr_Occurred()) {   /* past 2^64: Python's int */
            PyObject *b = PyLong_FromUnsignedLongLong(e->begin);
            offset = b != NULL ? PyNumber_Add(data_start_obj, b) : NULL;
            Py_XDECREF(b);
        }
        PyObject *path = PyTuple_Pack(1, name);
        PyObject *rec = offset != NULL && path != NULL ? info_type->tp_alloc(info_type, 0) : NULL;
        if (rec == NULL) {
            Py_XDECREF(offset);
            Py_XDECREF(path);
            failed = 1;
            break;
        }
        PyObject *k5 = PyList_GET_ITEM(kinds, e->kind);
        PyObject *nbytes = PyTuple_GET_ITEM(k5, 3);
        SLOT(rec, I_NAME) = Py_NewRef(name);
        SLOT(rec, I_DTYPE) = Py_NewRef(PyTuple_GET_ITEM(k5, 0));
        SLOT(rec, I_SHAPE) = Py_NewRef(PyTuple_GET_ITEM(k5, 1));
        SLOT(rec, I_STRIDE) = Py_NewRef(PyTuple_GET_ITEM(k5, 2));
        SLOT(rec, I_STORAGE_OFFSET) = Py_NewRef(zero);
        SLOT(rec, I_BYTE_OFFSET) = offset;
        SLOT(rec, I_NBYTES) = Py_NewRef(nbytes);
        SLOT(rec, I_FILE) = Py_NewRef(file);
        SLOT(rec, I_STORAGE_KEY) = Py_NewRef(Py_None);
        SLOT(rec, I_STORAGE_NBYTES) = Py_NewRef(nbytes);
        SLOT(rec, I_PATH) = path;
        SLOT(rec, I_FORMAT) = Py_NewRef(fmt);
        SLOT(rec, I_ROLE) = Py_NewRef(role);
        SLOT(rec, I_CHUNKS) = Py_NewRef(empty);
        SLOT(rec, I_EXTRAS) = Py_NewRef(PyTuple_GET_ITEM(k5, 4));
        SLOT(rec, I_HAS_DATA) = Py_NewRef(Py_True);
        PyList_SET_ITEM(records, i, rec);
    }
    Py_DECREF(zero);
    Py_DECREF(empty);
    if (!failed) {
        PyObject *m = meta != NULL ? Py_NewRef(meta) : Py_NewRef(Py_None);
        result = PyTuple_Pack(2, records, m);
        Py_DECREF(m);
        failed = result == NULL;
    }
done:
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(entries[i].name);
    free(entries);
    Py_XDECREF(records);
    Py_XDECREF(meta);
    Py_XDECREF(seen);
    Py_XDECREF(kinds);
    Py_XDECREF(kind_index);
    PyBuffer_Release(&buf);
    if (failed) {
        Py_XDECREF(result);
        return NULL;
    }
    if (result == NULL)
        Py_RETURN_NONE;
    return result;
}

/* -- a sharded checkpoint's index: {"weight_map": {name: shard}, ...} ------------------------ */

/* Skip any JSON value (for json.loads to read on its own); counts its string tokens. 0 when the
 * text cannot be a value there (or nests deeper than 64). */
static int skip_value(Reader *r, Py_ssize_t *strings, int depth) {
    skip_ws(r);
    if (r->at >= r->end || depth > 64)
        return 0;
    unsigned char c = r->d[r->at];
    if (c == '"') {
        r->at++;
        while (r->at < r->end) {
            unsigned char x = r->d[r->at++];
            if (x == '"') {
                (*strings)++;
                return 1;
            }
            if (x == '\\') {
                if (r->at >= r->end)
                    return 0;
                r->at++;
            } else if (x < 0x20) {
                return 0;
            }
        }
        return 0;
    }
    if (c == '{' || c == '[') {
        unsigned char close = c == '{' ? '}' : ']';
        r->at++;
        if (take(r, close))
            return 1;
        for (;;) {
            if (c == '{') {
                if (!peek(r, '"') || !skip_value(r, strings, depth + 1) || !take(r, ':'))
                    return 0;
            }
            if (!skip_value(r, strings, depth + 1))
                return 0;
            if (take(r, close))
                return 1;
            if (!take(r, ','))
                return 0;
        }
    }
    /* a number or a literal: up to the next delimiter (json.loads checks it) */
    Py_ssize_t s = r->at;
    while (r->at < r->end) {
        unsigned char x = r->d[r->at];
        if (x == ',' || x == '}' || x == ']' || x == ' ' || x == '\t' || x == '\n' || x == '\r' ||
            x == '"' || x == '{' || x == '[' || x == ':')
            break;
        r->at++;
    }
    return r->at > s;
}

/* index_map(raw) -> (names, shards, others) | None
 *
 * raw: an index file's bytes (UTF-8). names: {tensor name: the same string} in the weight map's
 * order; shards: each tensor's shard name (one str object per distinct name); others: the other
 * members as (key, start, end, string tokens) for json.loads to read raw[start:end]. None when
 * the text is outside the subset: the weight map must be an object of strings without escapes or
 * control characters, no key may repeat in it or at the top, and the document must be one object
 * with nothing after it. */
static PyObject *index_map(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf))
        return NULL;
    Reader r = {(const unsigned char *)buf.buf, 0, buf.len};
    PyObject *names = NULL, *shards = NULL, *others = PyList_New(0), *keys = PySet_New(NULL);
    PyObject *result = NULL;
    PyObject *recent[8] = {NULL};   /* the last shard names made, by their bytes */
    Py_ssize_t recent_at[8] = {0}, recent_len[8] = {0};
    int next = 0, failed = others == NULL || keys == NULL;
    if (failed || !take(&r, '{') || take(&r, '}'))
        goto done;
    for (;;) {
        Py_ssize_t ks, kl;
        if (!string(&r, &ks, &kl) || !take(&r, ':'))
            goto done;
        PyObject *key = decode(&r, ks, kl);
        if (key == NULL) {
            failed = PyErr_Occurred() != NULL;
            goto done;
        }
        Py_ssize_t before = PySet_GET_SIZE(keys);
        if (PySet_Add(keys, key) < 0) {
            Py_DECREF(key);
            failed = 1;
            goto done;
        }
        if (PySet_GET_SIZE(keys) == before) {
            Py_DECREF(key);
            goto done;   /* a top-level key twice */
        }
        if (bytes_eq(&r, ks, kl, "weight_map")) {
            Py_DECREF(key);
            names = PyDict_New();
            shards = PyList_New(0);
            if (names == NULL || shards == NULL) {
                failed = 1;
                goto done;
            }
            if (!take(&r, '{'))
                goto done;
            if (!take(&r, '}')) {
                for (;;) {
                    Py_ssize_t a, al, b, bl;
                    if (!string(&r, &a, &al) || !take(&r, ':') || !string(&r, &b, &bl))
                        goto done;
                    PyObject *name = decode(&r, a, al);
                    if (name == NULL) {
                        failed = PyErr_Occurred() != NULL;
                        goto done;
                    }
                    Py_ssize_t had = PyDict_GET_SIZE(names);
                    if (PyDict_SetDefault(names, name, name) == NULL) {
                        Py_DECREF(name);
                        failed = 1;
                        goto done;
                    }
                    Py_DECREF(name);
                    if (PyDict_GET_SIZE(names) == had)
                        goto done;   /* a name twice */
                    PyObject *shard = NULL;
                    for (int k = 0; k < 8; k++)
                        if (recent[k] != NULL && recent_len[k] == bl &&
                            memcmp(r.d + recent_at[k], r.d + b, (size_t)bl) == 0) {
                            shard = recent[k];
                            break;
                        }
                    if (shard == NULL) {
                        shard = decode(&r, b, bl);
                        if (shard == NULL) {
                            failed = PyErr_Occurred() != NULL;
                            goto done;
                        }
                        Py_XSETREF(recent[next], shard);
                        recent_at[next] = b;
                        recent_len[next] = bl;
                        next = (next + 1) % 8;
                    }
                    if (PyList_Append(shards, shard) < 0) {
                        failed = 1;
                        goto done;
                    }
                    if (take(&r, '}'))
                        break;
                    if (!take(&r, ','))
                        goto done;
                }
            }
        } else {
            skip_ws(&r);
            Py_ssize_t start = r.at, strings = 0;
            if (!skip_value(&r, &strings, 0)) {
                Py_DECREF(key);
                goto done;
            }
            PyObject *item = Py_BuildValue("(Nnnn)", key, start, r.at, strings);
            if (item == NULL || PyList_Append(others, item) < 0) {
                Py_XDECREF(item);
                failed = 1;
                goto done;
            }
            Py_DECREF(item);
        }
        if (take(&r, '}'))
            break;
        if (!take(&r, ','))
            goto done;
    }
    skip_ws(&r);
    if (r.at != r.end || names == NULL)
        goto done;
    result = PyTuple_Pack(3, names, shards, others);
    failed = result == NULL;
done:
    for (int k = 0; k < 8; k++)
        Py_XDECREF(recent[k]);
    Py_XDECREF(names);
    Py_XDECREF(shards);
    Py_XDECREF(others);
    Py_XDECREF(keys);
    PyBuffer_Release(&buf);
    if (failed) {
        Py_XDECREF(result);
        return NULL;
    }
    if (result == NULL)
        Py_RETURN_NONE;
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(TensorInfo): the class header makes records of."},
    {"header", header, METH_VARARGS,
     "header(raw, data_start, file, dtypes, kind_of, known, fmt, role): `_fast`'s result, or "
     "None (see the file's comment)."},
    {"index_map", index_map, METH_VARARGS,
     "index_map(raw): an index file's weight map as columns, or None (see index_map)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_stheader",
                                    "The safetensors header's compiled fast path.", -1, methods};

PyMODINIT_FUNC PyInit__stheader(void) {
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    /* FIELDS: TensorInfo's fields as this file fills them (a test holds the class to them) */
    PyObject *fields = PyTuple_New(N_INFO);
    int bad = fields == NULL || PyModule_AddIntConstant(mod, "ABI", ABI) < 0;
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
