/* `tensorscope.grouping.GroupCollector.add_tensors` in one compiled loop: every listing of
 * 10^5-10^6 tensors is grouped (`inspect`, the architecture summary), ~1 µs a tensor in Python.
 *
 * `add` files each record as the Python loop does: its text is its path's one component (or its
 * name when the path is empty); the pattern is that text with every all-digit component (ASCII
 * digits between dots, or at an end: what `grouping._INDEX` splits on) written `#`, and the index
 * values are those components' digit strings, in order; the group of (pattern, dtype, shape) in
 * `groups` is made as `[1, bytes, name, [{digits}, ...]]` or counted (+1, + bytes, each position's
 * set gains its digits); bytes are `nbytes` when `has_data`, else 0. A record this file does not
 * read that way (another class, a path of several components, a text that is not ASCII, a group
 * entry of another shape) is given to `slow(record)`, the Python step, in its turn, so groups keep
 * their first-seen order: this file decides nothing the Python code does not decide the same way
 * (tests/test_groupscan.py holds the two to equal groups).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define ABI 1
#define MAX_INDICES 32   /* more index components: the Python step */

typedef struct {
    const char *name;
    Py_ssize_t offset;
} Slot;

enum { R_NAME, R_DTYPE, R_SHAPE, R_NBYTES, R_PATH, R_HAS_DATA, N_READ };
static Slot slots[N_READ] = {{"name", 0}, {"dtype", 0}, {"shape", 0}, {"nbytes", 0},
                             {"path", 0}, {"has_data", 0}};
static PyTypeObject *record_type = NULL;

#define SLOT(obj, k) (*(PyObject **)((char *)(obj) + slots[k].offset))

static PyObject *bind(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes a record class");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    Py_ssize_t offsets[N_READ];
    for (int k = 0; k < N_READ; k++) {
        PyObject *descr = PyDict_GetItemString(type->tp_dict, slots[k].name);  /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyDescrObject *)descr)->d_type != type) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot of that class", type->tp_name,
                         slots[k].name);
            return NULL;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || m->offset <= 0 ||
            m->offset + (Py_ssize_t)sizeof(PyObject *) > type->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a plain object slot", type->tp_name,
                         slots[k].name);
            return NULL;
        }
        offsets[k] = m->offset;
    }
    for (int k = 0; k < N_READ; k++)
        slots[k].offset = offsets[k];
    Py_INCREF(type);
    Py_XSETREF(record_type, type);
    Py_RETURN_NONE;
}

/* The last patterns made, by their text: consecutive records repeat a few. */
#define CACHE 8
typedef struct {
    char *text;
    Py_ssize_t len, cap;
    PyObject *pattern;
} Cached;

static void cache_clear(Cached *c) {
    for (int k = 0; k < CACHE; k++) {
        PyMem_Free(c[k].text);
        Py_XDECREF(c[k].pattern);
    }
}

static PyObject *pattern_of(Cached *c, int *next, const char *p, Py_ssize_t n) {
    /* a new reference to the str of p[0:n] */
    for (int k = 0; k < CACHE; k++)
        if (c[k].pattern != NULL && c[k].len == n &&
            (n == 0 || memcmp(c[k].text, p, (size_t)n) == 0))
            return Py_NewRef(c[k].pattern);
    PyObject *s = PyUnicode_FromStringAndSize(p, n);
    if (s == NULL)
        return NULL;
    Cached *slot = &c[*next];
    *next = (*next + 1) % CACHE;
    if (slot->cap < n) {
        char *t = PyMem_Realloc(slot->text, (size_t)(n ? n : 1));
        if (t == NULL) {   /* not cached: still the right pattern */
            return s;
        }
        slot->text = t;
        slot->cap = n;
    }
    if (n)   /* (an empty pattern: no text, and memcpy is not given a null pointer) */
        memcpy(slot->text, p, (size_t)n);
    slot->len = n;
    Py_XSETREF(slot->pattern, Py_NewRef(s));
    return s;
}

/* One record: 1 filed, 0 the Python step's, -1 error. */
static int file_one(PyObject *groups, PyObject *t, Cached *cache, int *next, char **buf,
                    Py_ssize_t *bufcap) {
    PyObject *path = SLOT(t, R_PATH), *name = SLOT(t, R_NAME), *dtype = SLOT(t, R_DTYPE);
    PyObject *shape = SLOT(t, R_SHAPE), *nbytes_obj = SLOT(t, R_NBYTES);
    PyObject *has = SLOT(t, R_HAS_DATA);
    if (path == NULL || name == NULL || dtype == NULL || shape == NULL || nbytes_obj == NULL ||
        has == NULL || !PyTuple_CheckExact(path))
        return 0;
    PyObject *text;
    if (PyTuple_GET_SIZE(path) == 1)
        text = PyTuple_GET_ITEM(path, 0);
    else if (PyTuple_GET_SIZE(path) == 0)
        text = name;
    else
        return 0;
    if (!PyUnicode_CheckExact(text) || !PyUnicode_IS_ASCII(text))
        return 0;
    const char *p = (const char *)PyUnicode_1BYTE_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (n >= *bufcap) {   /* never a null buffer, even for an empty text */
        char *b = PyMem_Realloc(*buf, (size_t)n + 1);
        if (b == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *buf = b;
        *bufcap = n + 1;
    }
    /* the pattern into buf, the index components' places */
    Py_ssize_t starts[MAX_INDICES], lens[MAX_INDICES];
    int count = 0;
    Py_ssize_t out = 0, i = 0;
    for (;;) {
        Py_ssize_t j = i;
        int digits = 1;
        while (j < n && p[j] != '.') {
            if (p[j] < '0' || p[j] > '9')
                digits = 0;
            j++;
        }
        if (digits && j > i) {
            if (count == MAX_INDICES)
                return 0;
            starts[count] = i;
            lens[count] = j - i;
            count++;
            (*buf)[out++] = '#';
        } else {
            memcpy(*buf + out, p + i, (size_t)(j - i));
            out += j - i;
        }
        if (j >= n)
            break;
        (*buf)[out++] = '.';
        i = j + 1;
    }
    int has_data = PyObject_IsTrue(has);
    if (has_data < 0)
        return -1;
    PyObject *pattern = pattern_of(cache, next, *buf, out);
    if (pattern == NULL)
        return -1;
    PyObject *key = PyTuple_Pack(3, pattern, dtype, shape);
    Py_DECREF(pattern);
    if (key == NULL)
        return -1;
    PyObject *nbytes = has_data ? nbytes_obj : NULL;   /* NULL: 0 */
    PyObject *g = PyDict_GetItemWithError(groups, key);   /* borrowed */
    if (g == NULL) {
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
        PyObject *sets = PyList_New(count);
        for (int k = 0; sets != NULL && k < count; k++) {
            PyObject *d = PyUnicode_FromStringAndSize(p + starts[k], lens[k]);
            PyObject *s = d != NULL ? PySet_New(NULL) : NULL;
            if (s == NULL || PySet_Add(s, d) < 0) {
                Py_XDECREF(d);
                Py_XDECREF(s);
                Py_CLEAR(sets);
                break;
            }
            Py_DECREF(d);
            PyList_SET_ITEM(sets, k, s);
        }
        PyObject *nb = sets == NULL ? NULL : nbytes != NULL ? Py_NewRef(nbytes) : PyLong_FromLong(0);
        PyObject *entry = nb != NULL ? Py_BuildValue("[iNNN]", 1, nb, Py_NewRef(name), sets)
                                     : NULL;
        if (nb == NULL)
            Py_XDECREF(sets);
        int bad = entry == NULL || PyDict_SetItem(groups, key, entry) < 0;
        Py_XDECREF(entry);
        Py_DECREF(key);
        return bad ? -1 : 1;
    }
    Py_DECREF(key);
    if (!PyList_CheckExact(g) || PyList_GET_SIZE(g) != 4 ||
        !PyList_CheckExact(PyList_GET_ITEM(g, 3)))
        return 0;
    PyObject *sets = PyList_GET_ITEM(g, 3);
    Py_ssize_t positions = PyList_GET_SIZE(sets) < count ? PyList_GET_SIZE(sets) : count;
    for (Py_ssize_t k = 0; k < positions; k++)
        if (!PySet_CheckExact(PyList_GET_ITEM(sets, k)))
            return 0;
    PyObject *one = PyLong_FromLong(1);
    PyObject *c = one != NULL ? PyNumber_Add(PyList_GET_ITEM(g, 0), one) : NULL;
    Py_XDECREF(one);
    if (c == NULL)
        return -1;
    PyList_SetItem(g, 0, c);   /* steals c */
    if (nbytes != NULL) {
        PyObject *b = PyNumber_Add(PyList_GET_ITEM(g, 1), nbytes);
        if (b == NULL)
            return -1;
        PyList_SetItem(g, 1, b);
    }
    for (Py_ssize_t k = 0; k < positions; k++) {
        PyObject *d = PyUnicode_FromStringAndSize(p + starts[k], lens[k]);
        if (d == NULL || PySet_Add(PyList_GET_ITEM(sets, k), d) < 0) {
            Py_XDECREF(d);
            return -1;
        }
        Py_DECREF(d);
    }
    return 1;
}

/* add(groups, records, slow): see the file's comment. */
static PyObject *add(PyObject *self, PyObject *args) {
    PyObject *groups, *records, *slow;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyDict_Type, &groups, &PyList_Type, &records, &slow))
        return NULL;
    Cached cache[CACHE];
    memset(cache, 0, sizeof cache);
    int next = 0, failed = 0;
    char *buf = NULL;
    Py_ssize_t bufcap = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *t = Py_NewRef(PyList_GET_ITEM(records, i));
        int got = record_type != NULL && Py_IS_TYPE(t, record_type)
                      ? file_one(groups, t, cache, &next, &buf, &bufcap) : 0;
        if (got == 0) {
            PyObject *r = PyObject_CallOneArg(slow, t);
            got = r == NULL ? -1 : 1;
            Py_XDECREF(r);
        }
        Py_DECREF(t);
        if (got < 0) {
            failed = 1;
            break;
        }
    }
    PyMem_Free(buf);
    cache_clear(cache);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(record class): the class whose slots add reads."},
    {"add", add, METH_VARARGS, "add(groups, records, slow): GroupCollector.add_tensors."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_groupscan",
                                    "The grouping pass over records, compiled.", -1, methods};

PyMODINIT_FUNC PyInit__groupscan(void) {
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    if (PyModule_AddIntConstant(mod, "ABI", ABI) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
