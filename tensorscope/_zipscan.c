/* The zip reader's plain-member step (`parsers.zip_reader._Reader.regular_member`) in one compiled
 * loop over the central directory: a torch archive has one member per tensor (10^5 and more),
 * and the Python step costs ~5 µs a member.
 *
 * `scan` walks central-directory entries from a position and appends a `ZipMember` for each
 * entry that passes exactly `regular_member`'s acceptance checks (STORED, not encrypted, no
 * central extra, disk 0, equal sizes without zip64 sentinels, an ASCII or valid UTF-8 name with
 * no NUL, ':', '\\', ".." or leading '/', a local header that agrees with the central entry, data
 * inside the file and clear of the central directory). It stops at the first entry it does not
 * accept, or that is cut short, badly signed or beyond the member limit: the Python loop reads
 * that entry (and reports whatever is odd about it, from the one place that reports), then calls
 * `scan` again. So this file decides nothing the Python code does not decide the same way; the
 * tests hold the two to identical members and anomalies. Every read is bounds-checked against
 * the buffers' lengths.
 *
 * Along the way it does what `check_layout` and the small-CRC check would do per member: the
 * data descriptor's length (`_Reader.descriptor_length`'s forms, in its order), whether the
 * members lie end to end, and the CRC-32 of STORED members of at most `crc_limit` bytes.
 *
 * Members are made without calling the dataclass's `__init__` (~1 µs a call): `bind` is given
 * the class once and finds the slot of each field (a slots dataclass: one object pointer per
 * field), which `scan` fills as `__init__` would.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define ABI 1

#if PY_VERSION_HEX < 0x030C0000
#define STR_NOT_READY(s) (PyUnicode_READY(s) < 0)
#else
#define STR_NOT_READY(s) 0   /* every str is "ready" from 3.12 on */
#endif
#define CENTRAL_SIZE 46
#define LOCAL_SIZE 30
#define U32_MAX 0xFFFFFFFFu
#define FLAG_DESCRIPTOR 0x0008u
#define FLAG_UTF8 0x0800u
#define IRREGULAR_FLAGS (0x0001u | 0x0040u | 0x2000u) /* encrypted, strong, masked local */

/* ZipMember's fields, in its declaration order. */
enum { F_NAME, F_RAW_NAME, F_INDEX, F_HEADER, F_DATA, F_CSIZE, F_SIZE, F_CRC, F_METHOD, F_FLAGS,
       F_LOCAL_NAME, F_ERROR, N_FIELDS };
static const char *const FIELD_NAMES[N_FIELDS] = {
    "name", "raw_name", "index", "header_offset", "data_offset", "compressed_size", "size",
    "crc32", "method", "flags", "local_name", "error"};
static PyTypeObject *member_type = NULL;
static Py_ssize_t field_offset[N_FIELDS];

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            crc_table[t][n] = crc_table[0][crc_table[t - 1][n] & 0xFF] ^ (crc_table[t - 1][n] >> 8);
}

/* zlib's crc32 (the zip polynomial), slicing by 8. */
static uint32_t crc32_of(const unsigned char *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^
            crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static inline uint32_t u16(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static inline uint32_t u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t u64(const unsigned char *p) { return u32(p) | (uint64_t)u32(p + 4) << 32; }

/* `_IRREGULAR_NAME` (rb"[\x00:\\]|\.\.|\A/"): names `make_member` reports something about. */
static int irregular_name(const unsigned char *s, Py_ssize_t n, int *ascii) {
    unsigned char all = 0;
    if (n && s[0] == '/')
        return 1;
    for (Py_ssize_t k = 0; k < n; k++) {
        unsigned char c = s[k];
        all |= c;
        if (c == 0 || c == ':' || c == '\\' || (c == '.' && k + 1 < n && s[k + 1] == '.'))
            return 1;
    }
    *ascii = all < 0x80;
    return 0;
}

/* `_Reader.descriptor_length` on a local map: the length of the data descriptor at `end` that
 * matches the member (signed 24 and 16 bytes, then unsigned 20 and 12), -1 when flag bit 3 is set
 * and none matches (Python then reports it, if the member is not empty). */
static Py_ssize_t descriptor_length(const unsigned char *f, Py_ssize_t size, Py_ssize_t end,
                                    uint32_t crc, uint64_t csize, uint64_t usize) {
    static const int sig_of[4] = {1, 1, 0, 0}, width_of[4] = {8, 4, 8, 4};
    for (int k = 0; k < 4; k++) {
        int sig = sig_of[k], width = width_of[k];
        Py_ssize_t length = (sig ? 4 : 0) + 4 + 2 * width;
        if (length > size - end)
            continue;
        const unsigned char *p = f + end;
        if (sig) {
            if (memcmp(p, "PK\x07\x08", 4) != 0)
                continue;
            p += 4;
        }
        uint64_t cs = width == 8 ? u64(p + 4) : u32(p + 4);
        uint64_t us = width == 8 ? u64(p + 4 + width) : u32(p + 4 + width);
        if (u32(p) == crc && cs == csize && us == usize)
            return length;
    }
    return -1;
}

static int set_field(PyObject *obj, int field, PyObject *value) {
    /* value: a new reference, stolen; NULL (an allocation failed) is passed on */
    if (value == NULL)
        return -1;
    *(PyObject **)((char *)obj + field_offset[field]) = value;
    return 0;
}

static PyObject *bind(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes the ZipMember class");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    Py_ssize_t offsets[N_FIELDS];   /* the bound class's stay in force unless all are found */
    for (int k = 0; k < N_FIELDS; k++) {
        PyObject *descr = PyDict_GetItemString(type->tp_dict, FIELD_NAMES[k]);  /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyDescrObject *)descr)->d_type != type) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot of that class", type->tp_name,
                         FIELD_NAMES[k]);
            return NULL;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0 ||
            m->offset + (Py_ssize_t)sizeof(PyObject *) > type->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a plain object slot", type->tp_name,
                         FIELD_NAMES[k]);
            return NULL;
        }
        offsets[k] = m->offset;
    }
    /* exactly these slots: a field added to ZipMember and not here would be left unset */
    if (type->tp_itemsize != 0 ||
        type->tp_basicsize != (Py_ssize_t)(sizeof(PyObject) + N_FIELDS * sizeof(PyObject *))) {
        PyErr_Format(PyExc_TypeError, "%s has other fields than the %d this file sets",
                     type->tp_name, N_FIELDS);
        return NULL;
    }
    memcpy(field_offset, offsets, sizeof offsets);
    Py_INCREF(type);
    Py_XSETREF(member_type, type);
    Py_RETURN_NONE;
}

/* scan(file, size, cd, cd_start, pos, members, prepended, max_members, crc_limit, crc_bad)
 *   -> (pos, first, end)
 *
 * file: the whole file (buffer, `size` bytes); cd: the central directory (buffer), which starts
 * at byte cd_start of the file; pos: where in cd to start. Appends to the list `members`
 * (indices continue from its length), and to the list `crc_bad` the index of each appended
 * member of at most crc_limit bytes (-1: none) whose data's CRC-32 differs from the central
 * directory's. Returns the position of the first entry not read, the header offset of the first
 * member appended (-1: none), and the end of its layout span when every member appended lies
 * right after the one before (data descriptor included) and none lacks its descriptor (-1
 * otherwise). */
static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer fb, cb;
    Py_ssize_t size, cd_start, pos, prepended, max_members, crc_limit;
    PyObject *members, *crc_bad;
    if (member_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind() the ZipMember class first");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*ny*nnO!nnnO!", &fb, &size, &cb, &cd_start, &pos,
                          &PyList_Type, &members, &prepended, &max_members, &crc_limit,
                          &PyList_Type, &crc_bad))
        return NULL;
    const unsigned char *f = fb.buf, *cd = cb.buf;
    Py_ssize_t cd_size = cb.len;
    Py_ssize_t first = -1, chain = -1, cd_end;
    int contiguous = 1;
    PyObject *flags_obj = NULL;   /* the last flags value made: torch's are all 0x0808 */
    uint32_t flags_cached = 0;
    PyObject *result = NULL;

    /* Nothing to do unless the buffers are what the Python code reads through. */
    if (fb.len != size || prepended < 0 || cd_start < 0 || cd_start > size ||
        cd_size > size - cd_start || pos < 0)
        goto finish;
    cd_end = cd_start + cd_size;
    for (;;) {
        Py_ssize_t i = PyList_GET_SIZE(members);
        if (cd_size - pos < CENTRAL_SIZE || i >= max_members)
            break;
        const unsigned char *e = cd + pos;
        if (memcmp(e, "PK\x01\x02", 4) != 0)
            break;
        uint32_t flags = u16(e + 8), method = u16(e + 10), crc = u32(e + 16);
        uint32_t csize = u32(e + 20), usize = u32(e + 24);
        Py_ssize_t n = u16(e + 28), extra_len = u16(e + 30), comment_len = u16(e + 32);
        uint32_t disk = u16(e + 34), offset = u32(e + 42);
        /* n, extra_len, comment_len < 2^16: this sum cannot overflow; cd_size - pos >= 46 */
        if (CENTRAL_SIZE + n + extra_len + comment_len > cd_size - pos)
            break;
        if (extra_len || method != 0 || (flags & IRREGULAR_FLAGS) || disk || csize != usize ||
            csize == U32_MAX || offset == U32_MAX)
            break;
        const unsigned char *raw = e + CENTRAL_SIZE;
        int ascii = 0;
        if (irregular_name(raw, n, &ascii) || (!ascii && !(flags & FLAG_UTF8)))
            break;
        /* the local header: every offset sum checked (prepended comes from the caller) */
        Py_ssize_t header, start, name_end;
        if (__builtin_add_overflow((Py_ssize_t)offset, prepended, &header) ||
            __builtin_add_overflow(header, (Py_ssize_t)LOCAL_SIZE, &start) ||
            __builtin_add_overflow(start, n, &name_end) || name_end > size)
            break;
        const unsigned char *l = f + header;
        if (memcmp(l, "PK\x03\x04", 4) != 0 || (Py_ssize_t)u16(l + 26) != n ||
            u16(l + 6) != flags || u16(l + 8) != 0 || memcmp(f + start, raw, n) != 0)
            break;
        uint32_t l_crc = u32(l + 14), l_csize = u32(l + 18), l_usize = u32(l + 22);
        if (!((l_crc == crc && l_csize == csize && l_usize == csize) ||
              ((flags & FLAG_DESCRIPTOR) && !(l_crc | l_csize | l_usize))))
            break;
        Py_ssize_t data, end;
        if (__builtin_add_overflow(name_end, (Py_ssize_t)u16(l + 28), &data) ||
            __builtin_add_overflow(data, (Py_ssize_t)csize, &end) || end > size ||
            (header < cd_end && end > cd_start))
            break;

        PyObject *name;
        if (ascii) {
            name = PyUnicode_New(n, 127);
            if (name == NULL)
                goto done;
            memcpy(PyUnicode_DATA(name), raw, n);
        } else {
            name = PyUnicode_DecodeUTF8((const char *)raw, n, NULL);
            if (name == NULL) {   /* not valid UTF-8: make_member reports it */
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                    goto done;
                PyErr_Clear();
                break;
            }
        }
        /* layout: the span of this member (data descriptor included) */
        Py_ssize_t span_end = end;
        if (flags & FLAG_DESCRIPTOR) {
            Py_ssize_t d = descriptor_length(f, size, end, crc, csize, csize);
            if (d < 0 && csize)
                contiguous = 0;   /* Python reports the missing descriptor */
            else if (d > 0)
                span_end += d;
        }
        if (first < 0)
            first = header;
        else if (header != chain)
            contiguous = 0;
        chain = span_end;

        PyObject *m = member_type->tp_alloc(member_type, 0);
        if (m == NULL) {
            Py_DECREF(name);
            goto done;
        }
        /* (A ZipMember is mutable: it stays tracked by the cyclic collector, as any instance
         * made by calling the class is; an untracked one given a cycle later would leak.) */
        if (flags_obj == NULL || flags != flags_cached) {
            Py_XDECREF(flags_obj);
            flags_obj = PyLong_FromUnsignedLong(flags);
            flags_cached = flags;
        }
        PyObject *raw_name = PyBytes_FromStringAndSize((const char *)raw, n);
        PyObject *csize_obj = PyLong_FromUnsignedLong(csize);
        int bad = set_field(m, F_NAME, name) | set_field(m, F_RAW_NAME, raw_name) |
                  set_field(m, F_INDEX, PyLong_FromSsize_t(i)) |
                  set_field(m, F_HEADER, PyLong_FromSsize_t(header)) |
                  set_field(m, F_DATA, PyLong_FromSsize_t(data)) |
                  set_field(m, F_CSIZE, csize_obj) | set_field(m, F_CRC, PyLong_FromUnsignedLong(crc)) |
                  set_field(m, F_METHOD, PyLong_FromLong(0));
        if (!bad && flags_obj != NULL) {
            Py_INCREF(csize_obj);
            set_field(m, F_SIZE, csize_obj);
            Py_INCREF(flags_obj);
            set_field(m, F_FLAGS, flags_obj);
            Py_INCREF(raw_name);
            set_field(m, F_LOCAL_NAME, raw_name);
            Py_INCREF(Py_None);
            set_field(m, F_ERROR, Py_None);
        } else {
            bad = 1;
        }
        if (bad || PyList_Append(members, m) < 0) {
            Py_DECREF(m);   /* frees the fields set (NULL slots are skipped) */
            goto done;
        }
        Py_DECREF(m);
        if (crc_limit >= 0 && (Py_ssize_t)csize <= crc_limit && crc32_of(f + data, csize) != crc) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyList_Append(crc_bad, index) < 0) {
                Py_XDECREF(index);
                goto done;
            }
            Py_DECREF(index);
        }
        pos += CENTRAL_SIZE + n + comment_len;   /* <= cd_size: checked above */
    }
finish:
    result = Py_BuildValue("nnn", pos, first, first >= 0 && contiguous ? chain : (Py_ssize_t)-1);
done:
    Py_XDECREF(flags_obj);
    PyBuffer_Release(&fb);
    PyBuffer_Release(&cb);
    return result;
}

/* Open addressing over up to `n` (< 2^32) keys: each slot holds the high half of a key's hash
 * (the low bits place it) and its index + 1 (0: empty), so that keys are compared only when
 * their hashes agree. Eight bytes a slot: the table is a transient 2 MB for 10^5 members. */
typedef struct {
    uint32_t tag;
    uint32_t index;
} Slot;

typedef struct {
    Slot *slot;
    size_t mask;
} Table;

static int table_init(Table *t, Py_ssize_t n) {
    size_t cap = 8;
    if ((uint64_t)n >= 0x7FFFFFFFu) {
        PyErr_SetString(PyExc_OverflowError, "too many members");
        return -1;
    }
    while (cap < (size_t)n * 2)
        cap <<= 1;
    t->slot = PyMem_Calloc(cap, sizeof(Slot));
    t->mask = cap - 1;
    if (t->slot == NULL)
        PyErr_NoMemory();
    return t->slot == NULL ? -1 : 0;
}

static inline unsigned char ascii_lower(unsigned char c) {
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c;
}

/* Eight bytes with their ASCII capitals lowercased (what bytes.lower() does to each byte). */
static inline uint64_t lower8(uint64_t x) {
    const uint64_t ones = 0x0101010101010101ull;
    uint64_t low7 = x & (0x7F * ones);
    uint64_t above_z = low7 + (0x7F - 'Z') * ones;   /* bit 7 set where the low 7 bits > 'Z' */
    uint64_t from_a = low7 + (0x80 - 'A') * ones;    /* bit 7 set where they are >= 'A' */
    uint64_t upper = from_a & ~above_z & ~x & (0x80 * ones);  /* and the byte is ASCII */
    return x | (upper >> 2);                         /* 0x80 >> 2 = 0x20 */
}

/* A hash of the lowercased bytes, eight at a time (any two equal once lowercased hash equal). */
static uint64_t lower_hash(const unsigned char *b, Py_ssize_t len) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)len, w;
    while (len >= 8) {
        memcpy(&w, b, 8);
        h = (h ^ lower8(w)) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        b += 8;
        len -= 8;
    }
    w = 0;
    memcpy(&w, b, (size_t)len);
    h = (h ^ lower8(w)) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 29);
}

/* Insert `index` with `hash`; returns 1 when an entry `same` calls equal was there already. */
static inline int table_add(Table *t, uint64_t hash, Py_ssize_t index, PyObject *members,
                            int (*same)(PyObject *, PyObject *)) {
    for (size_t at = (size_t)hash & t->mask;; at = (at + 1) & t->mask) {
        Slot *s = &t->slot[at];
        if (s->index == 0) {
            s->tag = (uint32_t)(hash >> 32);
            s->index = (uint32_t)index + 1;
            return 0;
        }
        if (s->tag == (uint32_t)(hash >> 32) && same(PyList_GET_ITEM(members, s->index - 1),
                                    PyList_GET_ITEM(members, index)))
            return 1;
    }
}

#define FIELD(m, f) (*(PyObject **)((char *)(m) + field_offset[f]))

static int same_lowered(PyObject *a, PyObject *b) {
    PyObject *x = FIELD(a, F_RAW_NAME), *y = FIELD(b, F_RAW_NAME);
    Py_ssize_t len = PyBytes_GET_SIZE(x);
    if (PyBytes_GET_SIZE(y) != len)
        return 0;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(x);
    const unsigned char *q = (const unsigned char *)PyBytes_AS_STRING(y);
    for (Py_ssize_t k = 0; k < len; k++)
        if (ascii_lower(p[k]) != ascii_lower(q[k]))
            return 0;
    return 1;
}

static int same_name(PyObject *a, PyObject *b) {
    return PyUnicode_Compare(FIELD(a, F_NAME), FIELD(b, F_NAME)) == 0;
}

/* distinct(members, visible, names) -> True, False, or None (not all are bound ZipMembers: the
 * caller decides) -- `check_duplicates`'s test that nothing needs reporting: among the first
 * `visible` members no two raw names are equal once ASCII letters are lowercased (bytes.lower(),
 * miniz's comparison) and, when `names` is true, every decoded name differs from the others and
 * holds no NUL. (The caller passes names=False when that follows: every member made by `scan`,
 * whose names are the strict decoding of raw names without NUL, and all of them visible.) */
static PyObject *distinct(PyObject *self, PyObject *args) {
    PyObject *members;
    Py_ssize_t visible;
    int names;
    if (!PyArg_ParseTuple(args, "O!np", &PyList_Type, &members, &visible, &names))
        return NULL;
    if (member_type == NULL)
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(members);
    visible = visible < 0 ? 0 : visible > n ? n : visible;
    if (n >= 0x7FFFFFFF)
        Py_RETURN_NONE;   /* beyond the table's indices */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(members, i);
        if (Py_TYPE(m) != member_type)
            Py_RETURN_NONE;
        PyObject *name = FIELD(m, F_NAME), *raw = FIELD(m, F_RAW_NAME);
        if (name == NULL || raw == NULL || !PyUnicode_CheckExact(name) ||
            STR_NOT_READY(name) || !PyBytes_CheckExact(raw))
            Py_RETURN_NONE;
    }
    Table t;
    if (table_init(&t, n) < 0)
        return NULL;
    PyObject *answer = Py_True;
    for (Py_ssize_t i = 0; i < visible && answer == Py_True; i++) {
        PyObject *raw = FIELD(PyList_GET_ITEM(members, i), F_RAW_NAME);
        uint64_t h = lower_hash((const unsigned char *)PyBytes_AS_STRING(raw),
                                PyBytes_GET_SIZE(raw));
        if (table_add(&t, h, i, members, same_lowered))
            answer = Py_False;
    }
    if (names && answer == Py_True) {
        memset(t.slot, 0, (t.mask + 1) * sizeof(Slot));
        for (Py_ssize_t i = 0; i < n && answer == Py_True; i++) {
            PyObject *name = FIELD(PyList_GET_ITEM(members, i), F_NAME);
            /* FindChar: -1 not found (-2, an error, needs a bad range); a str's hash: no error */
            if (PyUnicode_FindChar(name, 0, 0, PyUnicode_GET_LENGTH(name), 1) != -1 ||
                table_add(&t, (uint64_t)PyObject_Hash(name), i, members, same_name))
                answer = Py_False;
        }
    }
    PyMem_Free(t.slot);
    return Py_NewRef(answer);
}

/* exact(members, visible) -> dict, or None (not all are bound ZipMembers): `_exact_table`'s
 * {name: member} over the first `visible` members whose raw name is ASCII without NUL. */
static PyObject *exact(PyObject *self, PyObject *args) {
    PyObject *members;
    Py_ssize_t visible;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &members, &visible))
        return NULL;
    if (member_type == NULL)
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(members);
    visible = visible < 0 ? 0 : visible > n ? n : visible;
    for (Py_ssize_t i = 0; i < visible; i++) {
        PyObject *m = PyList_GET_ITEM(members, i);
        /* the name is hashed into the table: an exact str (no Python __hash__/__eq__ to call
         * back and change the borrowed list meanwhile) */
        if (Py_TYPE(m) != member_type || FIELD(m, F_NAME) == NULL || FIELD(m, F_RAW_NAME) == NULL
            || !PyUnicode_CheckExact(FIELD(m, F_NAME)) || !PyBytes_CheckExact(FIELD(m, F_RAW_NAME)))
            Py_RETURN_NONE;
    }
    PyObject *table = PyDict_New();
    if (table == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < visible; i++) {
        PyObject *m = PyList_GET_ITEM(members, i), *raw = FIELD(m, F_RAW_NAME);
        const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(raw);
        Py_ssize_t len = PyBytes_GET_SIZE(raw), k = 0;
        while (k < len && b[k] && b[k] < 0x80)
            k++;
        if (k == len && PyDict_SetItem(table, FIELD(m, F_NAME), m) < 0) {
            Py_DECREF(table);
            return NULL;
        }
    }
    return table;
}

/* Does `name` (a str) match `data_records`' test: it starts with `start`, or its first `cut`
 * characters, lowercased (str.lower: Unicode rules), equal `low_start`? -1 on an error. */
static int under(PyObject *name, PyObject *start, PyObject *low_start, Py_ssize_t cut) {
    Py_ssize_t len = PyUnicode_GET_LENGTH(name);
    if (PyUnicode_IS_ASCII(name)) {   /* start and low_start are ASCII (the caller checks) */
        if (len < cut)
            return 0;
        const unsigned char *p = PyUnicode_1BYTE_DATA(name);
        const unsigned char *a = PyUnicode_1BYTE_DATA(start), *b = PyUnicode_1BYTE_DATA(low_start);
        if (memcmp(p, a, cut) == 0)
            return 1;
        for (Py_ssize_t k = 0; k < cut; k++)
            if (ascii_lower(p[k]) != b[k])
                return 0;
        return 1;
    }
    Py_ssize_t hit = PyUnicode_Tailmatch(name, start, 0, PY_SSIZE_T_MAX, -1);
    if (hit != 0)
        return (int)hit;
    PyObject *head = PyUnicode_Substring(name, 0, cut < len ? cut : len);
    PyObject *low = head ? PyObject_CallMethod(head, "lower", NULL) : NULL;
    Py_XDECREF(head);
    if (low == NULL)
        return -1;
    int same = PyUnicode_Compare(low, low_start) == 0;
    Py_DECREF(low);
    return same;
}

/* records(members, visible, start, record) -> dict, None, or NotImplemented
 *
 * `ZipArchive.records_under`'s loop (torch_zip's `data_records`): over the first `visible`
 * members, those whose name starts with the ASCII `start`, or does once lowercased, become
 * record(name, error, method, data_offset, size) (a tuple subclass, made without calling it)
 * keyed by the lowercased name. None when such a name is not ASCII or holds a NUL;
 * NotImplemented when the arguments are not what this expects (the caller's loop decides). */
static PyObject *records(PyObject *self, PyObject *args) {
    PyObject *members, *start, *record;
    Py_ssize_t visible;
    if (!PyArg_ParseTuple(args, "O!nUO!", &PyList_Type, &members, &visible, &start,
                          &PyType_Type, &record))
        return NULL;
    PyTypeObject *rtype = (PyTypeObject *)record;
    Py_ssize_t n = PyList_GET_SIZE(members);
    visible = visible < 0 ? 0 : visible > n ? n : visible;
    if (member_type == NULL || !PyType_IsSubtype(rtype, &PyTuple_Type) ||
        rtype->tp_basicsize != PyTuple_Type.tp_basicsize ||
        rtype->tp_itemsize != PyTuple_Type.tp_itemsize || rtype->tp_dictoffset ||
        rtype->tp_weaklistoffset || !PyUnicode_CheckExact(start) ||
        STR_NOT_READY(start) || !PyUnicode_IS_ASCII(start))
        Py_RETURN_NOTIMPLEMENTED;
    for (Py_ssize_t i = 0; i < visible; i++) {
        PyObject *m = PyList_GET_ITEM(members, i);
        if (Py_TYPE(m) != member_type || FIELD(m, F_NAME) == NULL ||
            !PyUnicode_CheckExact(FIELD(m, F_NAME)) || STR_NOT_READY(FIELD(m, F_NAME)) ||
            FIELD(m, F_ERROR) == NULL ||
            FIELD(m, F_METHOD) == NULL || FIELD(m, F_DATA) == NULL || FIELD(m, F_SIZE) == NULL)
            Py_RETURN_NOTIMPLEMENTED;
    }
    Py_ssize_t cut = PyUnicode_GET_LENGTH(start);
    PyObject *low_start = PyObject_CallMethod(start, "lower", NULL);
    PyObject *out = low_start ? PyDict_New() : NULL;
    if (out == NULL) {
        Py_XDECREF(low_start);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < visible; i++) {
        PyObject *m = PyList_GET_ITEM(members, i), *name = FIELD(m, F_NAME);
        int hit = under(name, start, low_start, cut);
        if (hit < 0)
            goto fail;
        if (!hit)
            continue;
        Py_ssize_t len = PyUnicode_GET_LENGTH(name);
        const unsigned char *p = PyUnicode_1BYTE_DATA(name);
        if (!PyUnicode_IS_ASCII(name) || memchr(p, 0, len) != NULL) {
            Py_DECREF(low_start);
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        Py_ssize_t k = 0;
        while (k < len && !(p[k] >= 'A' && p[k] <= 'Z'))
            k++;
        PyObject *key;
        if (k == len) {
            key = Py_NewRef(name);
        } else {
            key = PyUnicode_New(len, 127);
            if (key == NULL)
                goto fail;
            unsigned char *q = PyUnicode_1BYTE_DATA(key);
            for (Py_ssize_t j = 0; j < len; j++)
                q[j] = ascii_lower(p[j]);
        }
        PyObject *r = rtype->tp_alloc(rtype, 5);
        if (r == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        if (PyObject_GC_IsTracked(r))   /* strings, ints and None: as CPython untracks tuples */
            PyObject_GC_UnTrack(r);
        PyObject *items[5] = {name, FIELD(m, F_ERROR), FIELD(m, F_METHOD), FIELD(m, F_DATA),
                              FIELD(m, F_SIZE)};
        for (int j = 0; j < 5; j++)
            PyTuple_SET_ITEM(r, j, Py_NewRef(items[j]));
        int bad = PyDict_SetItem(out, key, r);
        Py_DECREF(key);
        Py_DECREF(r);
        if (bad < 0)
            goto fail;
    }
    Py_DECREF(low_start);
    return out;
fail:
    Py_DECREF(low_start);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"records", records, METH_VARARGS,
     "records(members, visible, start, record): ZipArchive.records_under's dict."},
    {"exact", exact, METH_VARARGS, "exact(members, visible): _exact_table's dict."},
    {"distinct", distinct, METH_VARARGS,
     "distinct(members, visible, names): nothing for check_duplicates to report (see the comment)."},
    {"bind", bind, METH_O, "bind(ZipMember): the class scan makes members of."},
    {"scan", scan, METH_VARARGS, "Read plain central-directory entries (see the file's comment)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_zipscan",
                                    "The zip reader's compiled plain-member step.", -1, methods};

PyMODINIT_FUNC PyInit__zipscan(void) {
    crc_init();
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    /* FIELDS: the fields of the classes this file fills or reads, in their order (a test holds
     * ZipMember and the record class to them: a field more or less would turn `scan` off) */
    PyObject *member = PyTuple_New(N_FIELDS), *fields = PyDict_New();
    int bad = member == NULL || fields == NULL || PyModule_AddIntConstant(mod, "ABI", ABI) < 0;
    for (int k = 0; !bad && k < N_FIELDS; k++) {
        PyObject *name = PyUnicode_FromString(FIELD_NAMES[k]);
        bad = name == NULL;
        if (!bad)
            PyTuple_SET_ITEM(member, k, name);
    }
    PyObject *record = bad ? NULL : Py_BuildValue("(sssss)", "name", "error", "method",
                                                  "data_offset", "size");
    bad = bad || record == NULL || PyDict_SetItemString(fields, "ZipMember", member) < 0 ||
          PyDict_SetItemString(fields, "_Record", record) < 0 ||
          PyModule_AddObjectRef(mod, "FIELDS", fields) < 0;
    Py_XDECREF(member);
    Py_XDECREF(record);
    Py_XDECREF(fields);
    if (bad) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
