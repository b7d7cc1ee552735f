/* recon._kernel: the few per-id loops an audit runs over every id of every record, in C.
 *
 * Why: on cold data an audit touches each id a handful of times (validate it, look its bytes up,
 * copy it into the chunk's array), and in Python each touch is an interpreter step: together
 * about a quarter of the audit's time on cold data. Each function here is one such loop, with the same answer
 * as its pure-Python twin in recon/kernel.py (the fallback where this file was not compiled,
 * and the reference the tests compare it with). Nothing here calls back into Python, so the
 * lists can't change while they are read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <string.h>

/* An exact int's value as PyLong_AsLongLongAndOverflow gives it (*overflow -1 or 1 past a long
 * long), read straight from the one digit CPython keeps a small int in (every id): the general
 * call cost more than the rest of a join or a flatten. */
static inline long long id_value(PyObject *item, int *overflow) {
    *overflow = 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)item))
        return (long long)PyUnstable_Long_CompactValue((PyLongObject *)item);
#else
    Py_ssize_t size = Py_SIZE(item);
    if (size == 1)
        return (long long)((PyLongObject *)item)->ob_digit[0];
    if (size == 0)
        return 0;
#endif
    return PyLong_AsLongLongAndOverflow(item, overflow);
}

/* ids_ok(value, vocab_size) -> bool: value is a non-empty list whose every item is an int
 * (exactly: not a bool) in 0..vocab_size-1, or >= 0 where vocab_size is negative (unknown). */
static PyObject *ids_ok(PyObject *self, PyObject *args) {
    PyObject *value;
    long long vocab;
    if (!PyArg_ParseTuple(args, "OL", &value, &vocab))
        return NULL;
    if (!PyList_CheckExact(value) || PyList_GET_SIZE(value) == 0)
        Py_RETURN_FALSE;
    Py_ssize_t n = PyList_GET_SIZE(value);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PyList_GET_ITEM(value, k);
        if (!PyLong_CheckExact(item))
            Py_RETURN_FALSE;
        int overflow; /* -1 below, 1 above what a long long holds */
        long long id = id_value(item, &overflow);
        if (overflow < 0 || (!overflow && id < 0) || (vocab >= 0 && (overflow > 0 || id >= vocab)))
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* The bytes of ids joined from table (a list of bytes, or None where a token must not be joined):
 * the joined length, or -1 where some id is not an int in range or its entry is not bytes. */
static Py_ssize_t joined_size(PyObject **items, Py_ssize_t n, PyObject *table) {
    Py_ssize_t size = 0, entries = PyList_GET_SIZE(table);
    for (Py_ssize_t k = 0; k < n; k++) {
        if (!PyLong_CheckExact(items[k]))
            return -1;
        int overflow;
        long long id = id_value(items[k], &overflow);
        if (overflow || id < 0 || id >= entries)
            return -1;
        PyObject *entry = PyList_GET_ITEM(table, id);
        if (!PyBytes_CheckExact(entry))
            return -1;
        size += PyBytes_GET_SIZE(entry);
    }
    return size;
}

static void copy_joined(char *out, PyObject **items, Py_ssize_t n, PyObject *table) {
    for (Py_ssize_t k = 0; k < n; k++) {
        int overflow; /* (none: joined_size checked every id) */
        PyObject *entry = PyList_GET_ITEM(table, id_value(items[k], &overflow));
        Py_ssize_t size = PyBytes_GET_SIZE(entry);
        memcpy(out, PyBytes_AS_STRING(entry), size);
        out += size;
    }
}

/* join(ids, table, text) -> bytes, or str (UTF-8 decoded, invalid bytes replaced) where text is
 * true; None where an id is not an int indexing a bytes entry of table (the caller asks the
 * tokenizer then). ids: a list or tuple. */
static PyObject *join_one(PyObject *ids, PyObject *table, int text) {
    if (!PyList_CheckExact(ids) && !PyTuple_CheckExact(ids))
        Py_RETURN_NONE;
    PyObject **items = PySequence_Fast_ITEMS(ids);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
    Py_ssize_t size = joined_size(items, n, table);
    if (size < 0)
        Py_RETURN_NONE;
    if (!text) {
        PyObject *out = PyBytes_FromStringAndSize(NULL, size);
        if (out != NULL)
            copy_joined(PyBytes_AS_STRING(out), items, n, table);
        return out;
    }
    char *buffer = PyMem_Malloc(size ? size : 1);
    if (buffer == NULL)
        return PyErr_NoMemory();
    copy_joined(buffer, items, n, table);
    PyObject *out = PyUnicode_DecodeUTF8(buffer, size, "replace");
    PyMem_Free(buffer);
    return out;
}

static PyObject *join(PyObject *self, PyObject *args) {
    PyObject *ids, *table;
    int text;
    if (!PyArg_ParseTuple(args, "OO!p", &ids, &PyList_Type, &table, &text))
        return NULL;
    return join_one(ids, table, text);
}

/* join_each(lists, table, text) -> list: join(ids, table, text) for each ids of the list lists
 * (one call for a batch: a chunk's samples, or the stretches it learns). */
static PyObject *join_each(PyObject *self, PyObject *args) {
    PyObject *lists, *table;
    int text;
    if (!PyArg_ParseTuple(args, "O!O!p", &PyList_Type, &lists, &PyList_Type, &table, &text))
        return NULL;
    Py_ssize_t m = PyList_GET_SIZE(lists);
    PyObject *out = PyList_New(m);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *joined = join_one(PyList_GET_ITEM(lists, j), table, text);
        if (joined == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, j, joined);
    }
    return out;
}

/* flatten(lists) -> bytes: every int of every list (or tuple) in lists, in order, as native int64.
 * Raises TypeError for an item that is not an exact int, OverflowError past int64 (the caller
 * takes the slow way then). */
static PyObject *flatten(PyObject *self, PyObject *args) {
    PyObject *lists;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &lists))
        return NULL;
    Py_ssize_t count = 0, m = PyList_GET_SIZE(lists);
    for (Py_ssize_t j = 0; j < m; j++) { /* every type first: a TypeError wins over an OverflowError */
        PyObject *ids = PyList_GET_ITEM(lists, j);
        if (!PyList_CheckExact(ids) && !PyTuple_CheckExact(ids))
            goto not_ints;
        PyObject **items = PySequence_Fast_ITEMS(ids);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
        for (Py_ssize_t k = 0; k < n; k++)
            if (!PyLong_CheckExact(items[k]))
                goto not_ints;
        count += n;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(long long));
    if (out == NULL)
        return NULL;
    long long *at = (long long *)PyBytes_AS_STRING(out);
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *ids = PyList_GET_ITEM(lists, j);
        PyObject **items = PySequence_Fast_ITEMS(ids);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
        for (Py_ssize_t k = 0; k < n; k++) {
            int overflow;
            long long id = id_value(items[k], &overflow);
            if (overflow) {
                PyLong_AsLongLong(items[k]); /* (its OverflowError) */
                Py_DECREF(out);
                return NULL;
            }
            *at++ = id;
        }
    }
    return out;
not_ints:
    PyErr_SetString(PyExc_TypeError, "flatten: expected lists or tuples of ints");
    return NULL;
}

/* Whether needle overlaps itself (some proper prefix is also its suffix, as in "aa" or "abab"):
 * str.count skips such overlaps, a scan that counts every position would not. */
static int overlaps_itself(PyObject *needle) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(needle);
    if (n == 0)
        return 1;
    for (Py_ssize_t b = 1; b < n; b++) {
        Py_ssize_t i = 0;
        while (i < b && PyUnicode_READ_CHAR(needle, i) == PyUnicode_READ_CHAR(needle, n - b + i))
            i++;
        if (i == b)
            return 1;
    }
    return 0;
}

/* How often needles occur in text, each position where one starts counted: one pass over the
 * text (the needles are few and overlap none of themselves, so this is str.count's answer).
 * starts[c]: whether some needle starts with character c (c < 256; others are checked in full). */
static long long count_scan(PyObject *text, PyObject *needles, const char *starts) {
    Py_ssize_t length = PyUnicode_GET_LENGTH(text), m = PyList_GET_SIZE(needles);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    long long total = 0;
    for (Py_ssize_t i = 0; i < length; i++) {
        /* the first place from i a needle may start, in a loop of the text's own width (reading
         * through PyUnicode_READ tests the width at every character) */
#define SKIP(T)                                                     \
        {                                                           \
            const T *chars = (const T *)data;                       \
            while (i < length && chars[i] < 256 && !starts[chars[i]]) \
                i++;                                                \
        }
        if (kind == PyUnicode_1BYTE_KIND)
            SKIP(Py_UCS1)
        else if (kind == PyUnicode_2BYTE_KIND)
            SKIP(Py_UCS2)
        else
            SKIP(Py_UCS4)
#undef SKIP
        if (i >= length)
            break;
        for (Py_ssize_t j = 0; j < m; j++) {
            PyObject *needle = PyList_GET_ITEM(needles, j);
            Py_ssize_t n = PyUnicode_GET_LENGTH(needle);
            if (n > length - i)
                continue;
            Py_ssize_t r = 0;
            while (r < n && PyUnicode_READ(kind, data, i + r) == PyUnicode_READ_CHAR(needle, r))
                r++;
            total += r == n;
        }
    }
    return total;
}

/* count_in(texts, needles) -> bytes: per text (a str), how often the needles (strs) occur in it,
 * each counted as str.count counts (non-overlapping), summed; native int64. */
static PyObject *count_in(PyObject *self, PyObject *args) {
    PyObject *texts, *needles;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &texts, &PyList_Type, &needles))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(texts), m = PyList_GET_SIZE(needles);
    int scan = m <= 16;
    char starts[256] = {0};
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *needle = PyList_GET_ITEM(needles, j);
        if (!PyUnicode_Check(needle)) {
            PyErr_SetString(PyExc_TypeError, "count_in: expected lists of str");
            return NULL;
        }
        scan = scan && !overlaps_itself(needle);
        if (scan && PyUnicode_READ_CHAR(needle, 0) < 256)
            starts[PyUnicode_READ_CHAR(needle, 0)] = 1;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(long long));
    if (out == NULL)
        return NULL;
    long long *at = (long long *)PyBytes_AS_STRING(out);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *text = PyList_GET_ITEM(texts, k);
        if (!PyUnicode_Check(text)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "count_in: expected lists of str");
            return NULL;
        }
        if (scan) {
            at[k] = count_scan(text, needles, starts);
            continue;
        }
        long long total = 0;
        for (Py_ssize_t j = 0; j < m; j++) {
            Py_ssize_t found = PyUnicode_Count(text, PyList_GET_ITEM(needles, j), 0, PY_SSIZE_T_MAX);
            if (found < 0) {
                Py_DECREF(out);
                return NULL;
            }
            total += found;
        }
        at[k] = total;
    }
    return out;
}

/* slices(flat, starts, sizes) -> list[list[int]]: flat[starts[k]:starts[k] + sizes[k]] for each k,
 * as lists of ints; all three native int64 buffers (C-contiguous), every slice inside flat. */
static PyObject *slices(PyObject *self, PyObject *args) {
    Py_buffer flat, starts, sizes;
    if (!PyArg_ParseTuple(args, "y*y*y*", &flat, &starts, &sizes))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t total = flat.len / 8, n = starts.len / 8;
    const long long *ids = flat.buf, *first = starts.buf, *size = sizes.buf;
    if (flat.len % 8 || starts.len % 8 || sizes.len != starts.len) {
        PyErr_SetString(PyExc_ValueError, "slices: expected int64 buffers, as many sizes as starts");
        goto done;
    }
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (first[k] < 0 || size[k] < 0 || first[k] > total - size[k]) {
            PyErr_SetString(PyExc_IndexError, "slices: a slice runs outside the ids");
            Py_CLEAR(out);
            goto done;
        }
        PyObject *row = PyList_New(size[k]);
        if (row == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, k, row);
        for (long long j = 0; j < size[k]; j++) {
            PyObject *id = PyLong_FromLongLong(ids[first[k] + j]);
            if (id == NULL) {
                Py_CLEAR(out);
                goto done;
            }
            PyList_SET_ITEM(row, j, id);
        }
    }
done:
    PyBuffer_Release(&flat);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&sizes);
    return out;
}

/* parse_ranks(data) -> (dict, lines) | None: a tiktoken ranks file, every line exactly
 * "BASE64 RANK" ([A-Za-z0-9+/]+ then at most two '=', one space, 1-10 digits, an optional '\r'
 * and '\n', which the last line may lack), as {token bytes: rank} and the number of lines; None
 * where a line is not of that form or its base64 is not whole quanta (the caller reads it the
 * slow way, which says where). Duplicates are the caller's to count (the dict holds the last). */
static signed char b64[256];

static PyObject *parse_ranks(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf))
        return NULL;
    const unsigned char *p = buf.buf, *end = p + buf.len;
    unsigned char *token = PyMem_Malloc(buf.len / 4 * 3 + 4);
    PyObject *ranks = PyDict_New(), *result = NULL;
    Py_ssize_t lines = 0;
    if (token == NULL || ranks == NULL) {
        if (token == NULL)
            PyErr_NoMemory();
        goto done;
    }
    while (p < end) {
        const unsigned char *t = p;
        while (p < end && b64[*p] >= 0)
            p++;
        Py_ssize_t n = p - t, pads = 0;
        while (p < end && *p == '=' && pads < 2)
            p++, pads++;
        if (n == 0 || (n + pads) % 4 || p >= end || *p != ' ')
            goto not_clean;
        p++;
        const unsigned char *d = p;
        long long rank = 0;
        while (p < end && *p >= '0' && *p <= '9' && p - d < 10)
            rank = rank * 10 + (*p++ - '0');
        if (p == d)
            goto not_clean;
        if (p < end && *p == '\r')
            p++;
        if (p < end && *p++ != '\n')
            goto not_clean;
        Py_ssize_t size = 0;
        unsigned int bits = 0, held = 0;
        for (Py_ssize_t k = 0; k < n; k++) { /* (the bits past the last whole byte are dropped) */
            bits = (bits << 6) | (unsigned int)b64[t[k]];
            held += 6;
            if (held >= 8) {
                held -= 8;
                token[size++] = (unsigned char)(bits >> held);
                bits &= (1u << held) - 1;
            }
        }
        PyObject *key = PyBytes_FromStringAndSize((const char *)token, size);
        PyObject *value = key ? PyLong_FromLongLong(rank) : NULL;
        int failed = value == NULL || PyDict_SetItem(ranks, key, value) < 0;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (failed)
            goto done;
        lines++;
    }
    result = Py_BuildValue("(On)", ranks, lines);
    goto done;
not_clean:
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(token);
    Py_XDECREF(ranks);
    PyBuffer_Release(&buf);
    return result;
}

/* ascii_texts(table) -> list: for each item of the list table, its text where it is non-empty
 * bytes of ASCII only, else None (a table of 150k-250k tokens, built at every start). */
static PyObject *ascii_texts(PyObject *self, PyObject *args) {
    PyObject *table;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &table))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(table);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PyList_GET_ITEM(table, k), *text = Py_None;
        if (PyBytes_CheckExact(item) && PyBytes_GET_SIZE(item) > 0) {
            const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(item);
            Py_ssize_t size = PyBytes_GET_SIZE(item), i = 0;
            while (i < size && data[i] < 128)
                i++;
            if (i == size && (text = PyUnicode_DecodeASCII((const char *)data, size, NULL)) == NULL) {
                Py_DECREF(out);
                return NULL;
            }
        }
        if (text == Py_None)
            Py_INCREF(text);
        PyList_SET_ITEM(out, k, text);
    }
    return out;
}

/* digit_run(data, n) -> bool: whether bytes data hold n ASCII digits in a row (a JSON line with
 * an integer too long for 64 bits, which the fast JSON reader would make a float). Each window of
 * n bytes is read from its end back to its last non-digit, and the next window starts past that
 * (no run of n can hold a non-digit): on a line of ids a few bytes a window, not every byte. */
static PyObject *digit_run(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &n))
        return NULL;
    const unsigned char *data = buf.buf;
    int found = n <= 0;
    for (Py_ssize_t start = 0; !found && start <= buf.len - n;) {
        Py_ssize_t j = start + n - 1;
        while (j >= start && data[j] >= '0' && data[j] <= '9')
            j--;
        found = j < start;
        start = j + 1;
    }
    PyBuffer_Release(&buf);
    return PyBool_FromLong(found);
}

/* KeySet: a set of uint64 keys (a packed stretch of ids each), open addressing with linear
 * probing, 8 bytes a slot, at most 4/5 full (it doubles past that). find(keys) -> bytes (one 0/1
 * per key), add(keys), keys(); keys are any C-contiguous buffer of native uint64 (a NumPy array). Why:
 * an audit looks up every packed stretch of every chunk, ~100k a chunk, in a store of up to a
 * million; a sorted array needs a sort of the look-ups and a copy of the store per insert. */
typedef struct {
    PyObject_HEAD
    unsigned long long *slots; /* 0: empty (key 0 is held by has_zero) */
    Py_ssize_t mask, used;
    int has_zero;
} KeySet;

static inline Py_ssize_t keyset_home(unsigned long long key, Py_ssize_t mask) {
    return (Py_ssize_t)((key * 0x9E3779B97F4A7C15ULL) >> 20) & mask;
}

static void keyset_put(unsigned long long *slots, Py_ssize_t mask, unsigned long long key, Py_ssize_t *used) {
    Py_ssize_t at = keyset_home(key, mask);
    while (slots[at] != 0) {
        if (slots[at] == key)
            return;
        at = (at + 1) & mask;
    }
    slots[at] = key;
    (*used)++;
}

static int keyset_reserve(KeySet *ks, Py_ssize_t more) {
    Py_ssize_t size = ks->mask + 1;
    while ((ks->used + more) * 5 > size * 4)
        size *= 2;
    if (size == ks->mask + 1)
        return 0;
    unsigned long long *slots = PyMem_Calloc((size_t)size, sizeof *slots);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t used = 0;
    for (Py_ssize_t k = 0; k <= ks->mask; k++)
        if (ks->slots[k] != 0)
            keyset_put(slots, size - 1, ks->slots[k], &used);
    PyMem_Free(ks->slots);
    ks->slots = slots;
    ks->mask = size - 1;
    ks->used = used;
    return 0;
}

static int keyset_keys(PyObject *args, Py_buffer *buf) {
    if (!PyArg_ParseTuple(args, "y*", buf))
        return -1;
    if (buf->len % (Py_ssize_t)sizeof(unsigned long long)) {
        PyBuffer_Release(buf);
        PyErr_SetString(PyExc_ValueError, "KeySet: expected a buffer of uint64 keys");
        return -1;
    }
    return 0;
}

static PyObject *keyset_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (!_PyArg_NoKeywords("KeySet", kwds) || !PyArg_ParseTuple(args, ":KeySet"))
        return NULL;
    KeySet *ks = (KeySet *)type->tp_alloc(type, 0);
    if (ks == NULL)
        return NULL;
    ks->mask = (1 << 12) - 1;
    ks->slots = PyMem_Calloc((size_t)ks->mask + 1, sizeof *ks->slots);
    if (ks->slots == NULL) {
        Py_DECREF(ks);
        return PyErr_NoMemory();
    }
    return (PyObject *)ks;
}

static void keyset_dealloc(KeySet *ks) {
    PyMem_Free(ks->slots);
    Py_TYPE(ks)->tp_free((PyObject *)ks);
}

static PyObject *keyset_add(KeySet *ks, PyObject *args) {
    Py_buffer buf;
    if (keyset_keys(args, &buf) < 0)
        return NULL;
    const unsigned long long *keys = buf.buf;
    Py_ssize_t n = buf.len / (Py_ssize_t)sizeof *keys;
    if (keyset_reserve(ks, n) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (keys[k] == 0)
            ks->has_zero = 1;
        else
            keyset_put(ks->slots, ks->mask, keys[k], &ks->used);
    }
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

static PyObject *keyset_find(KeySet *ks, PyObject *args) {
    Py_buffer buf;
    if (keyset_keys(args, &buf) < 0)
        return NULL;
    const unsigned long long *keys = buf.buf;
    Py_ssize_t n = buf.len / (Py_ssize_t)sizeof *keys;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out != NULL) {
        char *hit = PyBytes_AS_STRING(out);
        for (Py_ssize_t k = 0; k < n; k++) {
            unsigned long long key = keys[k];
            if (key == 0) {
                hit[k] = (char)ks->has_zero;
                continue;
            }
            Py_ssize_t at = keyset_home(key, ks->mask);
            while (ks->slots[at] != 0 && ks->slots[at] != key)
                at = (at + 1) & ks->mask;
            hit[k] = ks->slots[at] == key;
        }
    }
    PyBuffer_Release(&buf);
    return out;
}

static PyObject *keyset_keys_held(KeySet *ks, PyObject *unused) {
    Py_ssize_t n = ks->used + ks->has_zero, k = 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(unsigned long long));
    if (out == NULL)
        return NULL;
    unsigned long long *at = (unsigned long long *)PyBytes_AS_STRING(out);
    if (ks->has_zero)
        at[k++] = 0;
    for (Py_ssize_t j = 0; j <= ks->mask; j++)
        if (ks->slots[j] != 0)
            at[k++] = ks->slots[j];
    return out;
}

static Py_ssize_t keyset_len(KeySet *ks) {
    return ks->used + ks->has_zero;
}

static PyMethodDef keyset_methods[] = {
    {"add", (PyCFunction)keyset_add, METH_VARARGS, "add(keys): every key of a uint64 buffer into the set"},
    {"find", (PyCFunction)keyset_find, METH_VARARGS, "find(keys) -> bytes: 1 where a key of the uint64 buffer is in the set"},
    {"keys", (PyCFunction)keyset_keys_held, METH_NOARGS, "keys() -> bytes: every key held, as native uint64, in no order"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods keyset_sequence = {.sq_length = (lenfunc)keyset_len};

static PyTypeObject KeySetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "recon._kernel.KeySet",
    .tp_basicsize = sizeof(KeySet),
    .tp_dealloc = (destructor)keyset_dealloc,
    .tp_as_sequence = &keyset_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "KeySet(): a set of uint64 keys; add(keys), find(keys) -> bytes, len()",
    .tp_methods = keyset_methods,
    .tp_new = keyset_new,
};

/* The stretches CanonicalCheck cuts a batch of samples' ids into: before each sample's first id,
 * and between ids a and b where rules[last(a) * C + first(b)] (rules: C*C bytes, each 0 or 1),
 * where a or b is an added token, or where a ends with whitespace and b starts a word a space may
 * open. flat: every sample's ids, native int64; starts: where each sample begins, int64, strictly
 * increasing from 0; table: one uint32 per id, its first character's class in bits 0-7, its
 * last's in bits 8-15, then flags: bit 16 an added token, 17 ends with whitespace, 18 a word a
 * space may open. A stretch of 2..pack ids has a key: one uint64, id + 1 in each `bits` bits from
 * the low end (never 0). Why in C: one pass over every id of a chunk, one table read per id,
 * where NumPy made about ten passes (gathers, a 2-D gather, masks) and then more per stretch. */
typedef struct {
    Py_buffer flat, starts, table, rules;
    int bits, pack;
    Py_ssize_t n, samples, vocab, classes;
    unsigned char *fresh; /* fresh[k]: a stretch starts at id k */
    Py_ssize_t count;     /* how many stretches */
} Cut;

static void cut_release(Cut *c) {
    PyMem_Free(c->fresh);
    PyBuffer_Release(&c->flat);
    PyBuffer_Release(&c->starts);
    PyBuffer_Release(&c->table);
    PyBuffer_Release(&c->rules);
}

/* Checks the buffers (every id in the table, every class in the rules, starts as above) and marks
 * where each stretch starts; -1 with an error set (the buffers released) where they are wrong. */
static int cut_marks(Cut *c) {
    const long long *restrict ids = c->flat.buf, *restrict begin = c->starts.buf;
    const unsigned int *restrict entry = c->table.buf;
    const unsigned char *restrict rule = c->rules.buf;
    Py_ssize_t n = c->n = c->flat.len / 8, samples = c->samples = c->starts.len / 8, classes = 0;
    Py_ssize_t vocab = c->vocab = c->table.len / 4;
    while ((classes + 1) * (classes + 1) <= c->rules.len)
        classes++;
    c->classes = classes;
    c->fresh = NULL;
    if (c->flat.len % 8 || c->starts.len % 8 || c->table.len % 4 || classes * classes != c->rules.len
            || classes > 256 || c->bits < 1 || c->pack < 1 || (long long)c->bits * c->pack > 64) {
        PyErr_SetString(PyExc_ValueError, "cut: expected int64 ids and starts, a uint32 entry per id, a square "
                                          "rules table of at most 256 classes, bits * pack <= 64");
        goto fail;
    }
    for (Py_ssize_t v = 0; v < vocab; v++)
        if ((entry[v] & 0xFF) >= classes || ((entry[v] >> 8) & 0xFF) >= classes) {
            PyErr_Format(PyExc_ValueError, "cut: the class of id %zd is not in the rules", v);
            goto fail;
        }
    for (Py_ssize_t r = 0; r < c->rules.len; r++)
        if (rule[r] > 1) {
            PyErr_SetString(PyExc_ValueError, "cut: the rules must be 0 or 1");
            goto fail;
        }
    for (Py_ssize_t s = 1; s < samples; s++)
        if (begin[s] <= begin[s - 1] || begin[s] >= n) {
            PyErr_SetString(PyExc_ValueError, "cut: starts must increase from 0 and stay inside the ids");
            goto fail;
        }
    if ((samples == 0) != (n == 0) || (samples && begin[0] != 0)) {
        PyErr_SetString(PyExc_ValueError, "cut: starts must increase from 0 and stay inside the ids");
        goto fail;
    }
    unsigned char *restrict fresh = c->fresh = PyMem_Malloc(n ? (size_t)n : 1);
    if (fresh == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t count = 0;
    for (Py_ssize_t s = 0; s < samples; s++) {
        Py_ssize_t lo = begin[s], hi = s + 1 < samples ? begin[s + 1] : n;
        unsigned int before = 0;
        for (Py_ssize_t k = lo; k < hi; k++) { /* (no branches but one never taken: cuts are too frequent to predict) */
            if ((unsigned long long)ids[k] >= (unsigned long long)vocab) {
                PyErr_Format(PyExc_ValueError, "cut: id %lld is not in the table", ids[k]);
                goto fail;
            }
            unsigned int now = entry[ids[k]], flags = before >> 16, next = now >> 16;
            unsigned int cuts = (rule[((before >> 8) & 0xFF) * classes + (now & 0xFF)] | flags | next
                                 | ((flags >> 1) & (next >> 2)) | (k == lo)) & 1;
            fresh[k] = (unsigned char)cuts;
            count += cuts;
            before = now;
        }
    }
    c->count = count;
    return 0;
fail:
    cut_release(c);
    return -1;
}

/* The stretch from id lo, n ids long, packed into a key (where it holds 2..pack ids). */
static inline unsigned long long cut_key(const long long *ids, Py_ssize_t lo, Py_ssize_t size, int bits) {
    unsigned long long key = 0;
    for (Py_ssize_t j = 0; j < size; j++)
        key |= (unsigned long long)(ids[lo + j] + 1) << (bits * j);
    return key;
}

/* cut(flat, starts, table, rules, bits, pack) -> (at, size, keys) as bytes: every stretch's first
 * index and length (int64) and key (uint64; 0 for a stretch of one id, or of more than pack). */
static PyObject *cut(PyObject *self, PyObject *args) {
    Cut c;
    if (!PyArg_ParseTuple(args, "y*y*y*y*ii", &c.flat, &c.starts, &c.table, &c.rules, &c.bits, &c.pack))
        return NULL;
    if (cut_marks(&c) < 0)
        return NULL;
    PyObject *result = NULL;
    PyObject *at_out = PyBytes_FromStringAndSize(NULL, c.count * 8);
    PyObject *size_out = PyBytes_FromStringAndSize(NULL, c.count * 8);
    PyObject *keys_out = PyBytes_FromStringAndSize(NULL, c.count * 8);
    if (at_out != NULL && size_out != NULL && keys_out != NULL) {
        long long *at = (long long *)PyBytes_AS_STRING(at_out), *size = (long long *)PyBytes_AS_STRING(size_out);
        unsigned long long *key = (unsigned long long *)PyBytes_AS_STRING(keys_out);
        const long long *ids = c.flat.buf;
        const unsigned char *fresh = c.fresh;
        Py_ssize_t s = 0;
        for (Py_ssize_t k = 0; k < c.n; k++)
            if (fresh[k])
                at[s++] = k;
        for (s = 0; s < c.count; s++) {
            size[s] = (s + 1 < c.count ? at[s + 1] : c.n) - at[s];
            key[s] = size[s] >= 2 && size[s] <= c.pack ? cut_key(ids, at[s], size[s], c.bits) : 0;
        }
        result = PyTuple_Pack(3, at_out, size_out, keys_out);
    }
    Py_XDECREF(at_out);
    Py_XDECREF(size_out);
    Py_XDECREF(keys_out);
    cut_release(&c);
    return result;
}

/* Which listed row first held each stretch (by its key or ids): open addressing over
 * (hash, row + 1) slots, row 0 empty, at most half full (doubled past that). */
typedef struct {
    unsigned long long hash;
    long long row; /* row + 1 */
} First;

typedef struct {
    First *slots;
    Py_ssize_t mask, used;
} Firsts;

static int firsts_grow(Firsts *f) {
    Py_ssize_t size = f->slots ? 2 * (f->mask + 1) : 4096;
    First *slots = PyMem_Calloc((size_t)size, sizeof *slots);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; f->slots && k <= f->mask; k++)
        if (f->slots[k].row) {
            Py_ssize_t at = keyset_home(f->slots[k].hash, size - 1);
            while (slots[at].row)
                at = (at + 1) & (size - 1);
            slots[at] = f->slots[k];
        }
    PyMem_Free(f->slots);
    f->slots = slots;
    f->mask = size - 1;
    return 0;
}

/* The first row listed with this hash and the same ids (the rows' stretches compared in flat;
 * at and size: the listed rows' columns so far), or `row` itself, now listed; -1 on no memory. */
static long long firsts_of(Firsts *f, unsigned long long hash, long long row, const long long *flat,
                           const long long *at, const long long *size) {
    if ((f->used + 1) * 2 > (f->slots ? f->mask + 1 : 0) && firsts_grow(f) < 0)
        return -1;
    Py_ssize_t slot = keyset_home(hash, f->mask);
    for (; f->slots[slot].row; slot = (slot + 1) & f->mask) {
        long long other = f->slots[slot].row - 1;
        if (f->slots[slot].hash == hash && size[other] == size[row]
                && memcmp(flat + at[other], flat + at[row], (size_t)size[row] * sizeof *flat) == 0)
            return other;
    }
    f->slots[slot].hash = hash;
    f->slots[slot].row = row + 1;
    f->used++;
    return row;
}

/* unsettled(flat, starts, table, rules, bits, pack, single, runs) -> (at, size, sample, key, kind, first)
 * as int64 bytes: the stretches not known to be their own text's encoding, in order. Known are an
 * added token alone, a lone id whose single[id] (int8 per id) is 1, a packed stretch whose key is
 * in runs (a KeySet). The rest, by kind: 0 a lone id whose single[id] is 0 (not its text's
 * encoding), 1 a lone id whose single[id] is neither (not known yet), 2 a packed stretch not in
 * runs, 3 a stretch of more than pack ids; with its first index, length, sample, key (0 where
 * not packed) and the row that first lists the same ids (itself, the first time). Why: on an
 * audit's data most stretches are known, and the caller then handles a few percent of them,
 * and learns each new one once. */
static PyObject *unsettled(PyObject *self, PyObject *args) {
    Cut c;
    Py_buffer single;
    PyObject *runs_obj;
    if (!PyArg_ParseTuple(args, "y*y*y*y*iiy*O!", &c.flat, &c.starts, &c.table, &c.rules, &c.bits, &c.pack,
                          &single, &KeySetType, &runs_obj))
        return NULL;
    if (cut_marks(&c) < 0) {
        PyBuffer_Release(&single);
        return NULL;
    }
    PyObject *result = NULL;
    /* the columns, room for every stretch (the pages never written are never touched), and
     * the first row of each lone id (by id), packed key and longer stretch (hashed) */
    long long *column = PyMem_Malloc((size_t)(6 * c.count + 1) * sizeof *column), *lone_first = NULL;
    Firsts firsts[2] = {{0}}; /* packed, long */
    if (column == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (single.len != c.vocab) {
        PyErr_SetString(PyExc_ValueError, "unsettled: expected one int8 in single per id of the table");
        goto done;
    }
    long long *col_at = column, *col_size = column + c.count, *col_sample = column + 2 * c.count;
    long long *col_key = column + 3 * c.count, *col_kind = column + 4 * c.count, *col_first = column + 5 * c.count;
    KeySet *runs = (KeySet *)runs_obj;
    const long long *ids = c.flat.buf, *begin = c.starts.buf;
    const unsigned int *entry = c.table.buf;
    const signed char *known = single.buf;
    const unsigned char *fresh = c.fresh;
    Py_ssize_t sample = -1, n = c.n, rows = 0;
    for (Py_ssize_t lo = 0; lo < n;) {
        Py_ssize_t hi = lo + 1;
        while (hi < n && !fresh[hi])
            hi++;
        if (sample + 1 < c.samples && begin[sample + 1] == lo)
            sample++;
        Py_ssize_t size = hi - lo;
        long long kind = -1; /* known */
        unsigned long long key = 0;
        if (size == 1) {
            if (!((entry[ids[lo]] >> 16) & 1) && known[ids[lo]] != 1)
                kind = known[ids[lo]] == 0 ? 0 : 1;
        } else if (size <= c.pack) {
            key = cut_key(ids, lo, size, c.bits);
            Py_ssize_t at = keyset_home(key, runs->mask);
            while (runs->slots[at] != 0 && runs->slots[at] != key)
                at = (at + 1) & runs->mask;
            if (runs->slots[at] != key)
                kind = 2;
        } else {
            kind = 3;
        }
        if (kind >= 0) {
            long long row = rows++, first = row;
            col_at[row] = lo;
            col_size[row] = size;
            col_sample[row] = sample;
            col_key[row] = (long long)key;
            col_kind[row] = kind;
            if (kind == 1) {
                if (lone_first == NULL) {
                    lone_first = PyMem_Malloc((size_t)c.vocab * sizeof *lone_first);
                    if (lone_first == NULL) {
                        PyErr_NoMemory();
                        goto done;
                    }
                    memset(lone_first, 0xFF, (size_t)c.vocab * sizeof *lone_first); /* -1: none yet */
                }
                if (lone_first[ids[lo]] < 0)
                    lone_first[ids[lo]] = row;
                first = lone_first[ids[lo]];
            } else if (kind >= 2) {
                unsigned long long hash = key;
                if (kind == 3) {
                    hash = (unsigned long long)ids[lo];
                    for (Py_ssize_t j = 1; j < size; j++)
                        hash = (hash ^ (unsigned long long)ids[lo + j]) * 0x100000001B3ULL;
                }
                first = firsts_of(&firsts[kind - 2], hash, row, ids, col_at, col_size);
                if (first < 0)
                    goto done;
            }
            col_first[row] = first;
        }
        lo = hi;
    }
    result = PyTuple_New(6);
    if (result == NULL)
        goto done;
    for (int j = 0; j < 6; j++) {
        PyObject *part = PyBytes_FromStringAndSize((const char *)(column + j * c.count), rows * 8);
        if (part == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, j, part);
    }
done:
    PyMem_Free(column);
    PyMem_Free(lone_first);
    for (int j = 0; j < 2; j++)
        PyMem_Free(firsts[j].slots);
    PyBuffer_Release(&single);
    cut_release(&c);
    return result;
}

/* unglue_check(ids, stretches, lengths, glue_id, glue_size) -> bytes | None. ids: one encoding of
 * the texts of `stretches` (lists of ids) glued together, a glue of glue_size bytes between each
 * two; lengths: each id's byte length (native int64 per id). Cut back apart where the glues lie
 * (by bytes: a stretch's text is its ids' bytes), per stretch 1 where the ids between its glues
 * are exactly the stretch, else 0. None where the ids don't come apart there: a token running
 * across a glue's edge, a glue place not held by glue_id alone, ids left over, or an id with no
 * length. Why: learning whether each of a chunk's new stretches is its text's encoding cut the
 * encoding into a list per stretch and compared lists, ~100k of each a chunk on cold data. */
static PyObject *unglue_check(PyObject *self, PyObject *args) {
    PyObject *ids, *stretches;
    Py_buffer lengths;
    long long glue_id, glue_size;
    if (!PyArg_ParseTuple(args, "O!O!y*LL", &PyList_Type, &ids, &PyList_Type, &stretches, &lengths, &glue_id,
                          &glue_size))
        return NULL;
    PyObject *out = NULL;
    const long long *length = lengths.buf;
    Py_ssize_t known = lengths.len / 8, n = PyList_GET_SIZE(ids), m = PyList_GET_SIZE(stretches), at = 0;
    if (lengths.len % 8) {
        PyErr_SetString(PyExc_ValueError, "unglue_check: expected native int64 lengths");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, m);
    if (out == NULL)
        goto done;
    char *same = PyBytes_AS_STRING(out);
    for (Py_ssize_t k = 0; k < m; k++) {
        PyObject *want = PyList_GET_ITEM(stretches, k);
        if (!PyList_CheckExact(want))
            goto apart;
        Py_ssize_t size = PyList_GET_SIZE(want), from = at;
        long long bytes = 0, got = 0;
        int equal = 1;
        for (Py_ssize_t j = 0; j < size; j++) {
            long long id = PyLong_AsLongLong(PyList_GET_ITEM(want, j));
            if (id < 0 || id >= known)
                goto apart; /* (an error from a non-int is cleared there) */
            bytes += length[id];
        }
        while (got < bytes && at < n) { /* the ids that spell this stretch's bytes */
            long long id = PyLong_AsLongLong(PyList_GET_ITEM(ids, at));
            if (id < 0 || id >= known)
                goto apart;
            if (at - from >= size || PyLong_AsLongLong(PyList_GET_ITEM(want, at - from)) != id)
                equal = 0; /* (each of want was checked an int in range above) */
            got += length[id];
            at++;
        }
        if (got != bytes)
            goto apart;
        same[k] = (char)(equal && at - from == size);
        if (k + 1 < m) { /* then the glue, alone */
            if (at >= n || glue_id < 0 || glue_id >= known || length[glue_id] != glue_size
                    || PyLong_AsLongLong(PyList_GET_ITEM(ids, at)) != glue_id)
                goto apart;
            at++;
        }
    }
    if (at != n)
        goto apart;
    goto done;
apart:
    PyErr_Clear();
    Py_CLEAR(out);
    out = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&lengths);
    return out;
}

/* BPE by byte ranks, as tiktoken runs it on one piece (its _encode_single_piece): a piece that is
 * a token is that token; else the piece's bytes are merged, again and again, at the leftmost
 * adjacent pair of parts whose joined bytes have the lowest rank (the rank is the token's id).
 * Why here: a run of CJK tokens is confirmed by its adjacent pairs (recon.tokenizers.fast.cjkruns),
 * and in a vocabulary with tens of thousands of CJK tokens a cold audit tests ~250,000 new pairs;
 * through the core each cost about what re-encoding their text costs, here a few hash look-ups.
 *
 * The vocabulary: data (every token's bytes end to end), offsets (native int64, n + 1: token i is
 * data[offsets[i]:offsets[i + 1]]) and the table bpe_table built of them (the ids a merge may make:
 * 65,536 int32 slots, id + 1 of each two-byte token by its bytes, 0 for none; then an
 * open-addressed hash of all of them by their bytes, a uint64 per slot: id + 1 in the low half,
 * the hash's high half above, 0 empty). */
#define BPE_PAIRS 65536

static inline unsigned long long bpe_hash(const unsigned char *p, Py_ssize_t n) {
    unsigned long long h = 0x9E3779B97F4A7C15ULL ^ ((unsigned long long)n * 0xD6E8FEB86659FD93ULL), w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
    }
    w = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        w |= (unsigned long long)p[k] << (8 * k);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 29);
}

typedef struct {
    const unsigned char *data;
    const long long *offsets;
    Py_ssize_t n;
    const int *two;
    const unsigned long long *slots;
    Py_ssize_t mask;
} Bpe;

/* The id whose bytes are p[0:len], or -1. */
static inline long long bpe_find(const Bpe *v, const unsigned char *p, Py_ssize_t len) {
    if (len == 2)
        return (long long)v->two[p[0] << 8 | p[1]] - 1;
    unsigned long long h = bpe_hash(p, len), tag = h >> 32 << 32;
    Py_ssize_t at = (Py_ssize_t)(h & (unsigned long long)v->mask);
    while (v->slots[at] != 0) {
        unsigned long long slot = v->slots[at];
        if ((slot & 0xFFFFFFFF00000000ULL) == tag) {
            long long id = (long long)(slot & 0xFFFFFFFFULL) - 1;
            if (v->offsets[id + 1] - v->offsets[id] == len && memcmp(v->data + v->offsets[id], p, (size_t)len) == 0)
                return id;
        }
        at = (at + 1) & v->mask;
    }
    return -1;
}

static int bpe_vocab(Bpe *v, Py_buffer *data, Py_buffer *offsets, Py_buffer *table) {
    Py_ssize_t slots = (table->len - BPE_PAIRS * 4) / 8;
    if (offsets->len % 8 || offsets->len < 8 || table->len < BPE_PAIRS * 4 + 8 || (table->len - BPE_PAIRS * 4) % 8
            || (slots & (slots - 1))) {
        PyErr_SetString(PyExc_ValueError, "bpe: expected int64 offsets and a table from bpe_table");
        return -1;
    }
    v->data = data->buf;
    v->offsets = offsets->buf;
    v->n = offsets->len / 8 - 1;
    v->two = table->buf;
    v->slots = (const unsigned long long *)((const char *)table->buf + BPE_PAIRS * 4);
    v->mask = slots - 1;
    for (Py_ssize_t i = 0; i <= v->n; i++)
        if (v->offsets[i] < 0 || v->offsets[i] > data->len || (i && v->offsets[i] < v->offsets[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "bpe: offsets out of order or past the data");
            return -1;
        }
    for (Py_ssize_t k = 0; k < BPE_PAIRS; k++)
        if (v->two[k] < 0 || v->two[k] > v->n) {
            PyErr_SetString(PyExc_ValueError, "bpe: a table slot holds no id");
            return -1;
        }
    for (Py_ssize_t k = 0; k <= v->mask; k++)
        if ((long long)(v->slots[k] & 0xFFFFFFFFULL) > v->n) {
            PyErr_SetString(PyExc_ValueError, "bpe: a table slot holds no id");
            return -1;
        }
    return 0;
}

/* bpe_table(data, offsets, include) -> bytes: the table of the ids whose include byte is 1
 * (include: n bytes); the first of equal bytes is kept. */
static PyObject *bpe_table(PyObject *self, PyObject *args) {
    Py_buffer data, offsets, include;
    if (!PyArg_ParseTuple(args, "y*y*y*", &data, &offsets, &include))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = offsets.len / 8 - 1, size = 1;
    if (offsets.len % 8 || n < 0 || include.len != n || n >= 0x7FFFFFFF) {
        PyErr_SetString(PyExc_ValueError, "bpe_table: expected int64 offsets and a byte per id");
        goto done;
    }
    while (size < 2 * n + 2)
        size *= 2;
    out = PyBytes_FromStringAndSize(NULL, BPE_PAIRS * 4 + size * 8);
    if (out == NULL)
        goto done;
    int *two = (int *)PyBytes_AS_STRING(out);
    unsigned long long *slots = (unsigned long long *)(PyBytes_AS_STRING(out) + BPE_PAIRS * 4);
    memset(two, 0, BPE_PAIRS * 4 + (size_t)size * 8);
    Bpe v = {data.buf, offsets.buf, n, two, slots, size - 1};
    const long long *off = offsets.buf;
    const char *keep = include.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (off[i] < 0 || off[i + 1] < off[i] || off[i + 1] > data.len) {
            PyErr_SetString(PyExc_ValueError, "bpe_table: offsets out of order or past the data");
            Py_CLEAR(out);
            goto done;
        }
        const unsigned char *p = v.data + off[i];
        Py_ssize_t len = off[i + 1] - off[i];
        if (!keep[i] || bpe_find(&v, p, len) >= 0)
            continue;
        if (len == 2)
            two[p[0] << 8 | p[1]] = (int)(i + 1);
        unsigned long long h = bpe_hash(p, len);
        Py_ssize_t at = (Py_ssize_t)(h & (unsigned long long)v.mask);
        while (slots[at] != 0)
            at = (at + 1) & v.mask;
        slots[at] = (h >> 32 << 32) | (unsigned long long)(i + 1);
    }
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&include);
    return out;
}

/* A token's own BPE, step by step: the rank of each merge, and after it where the first part
 * ends and where the last part starts. A pair's BPE is its two tokens' own, interleaved by rank,
 * until a merge crosses their edge: merges inside a token only see that token's parts, so they
 * come in the same order as when it is alone; the candidate across the edge is the rank of a's
 * last part joined to b's first part, and it is taken where it is the leftmost lowest (a's
 * candidates lie left of it, b's right: a tie goes to a's merge, or to the crossing one before
 * b's). So the pair's BPE is [a, b] iff each token's own ends in itself and no crossing
 * candidate is ever taken; the whole piece being a token (tiktoken's look-up) is the crossing
 * candidate once both are whole. Each candidate is looked up when a's last part or b's first
 * part changes: a few look-ups a pair, not a BPE of its bytes. */
typedef struct {
    long long *rank;        /* per merge */
    int *first_end, *last_start;
    Py_ssize_t used, room;
} Traces;

static int traces_grow(Traces *t, Py_ssize_t more) {
    if (t->used + more <= t->room)
        return 0;
    Py_ssize_t room = t->room ? t->room : 1024;
    while (room < t->used + more)
        room *= 2;
    long long *rank = PyMem_Realloc(t->rank, (size_t)room * sizeof *rank);
    if (rank == NULL)
        return -1;
    t->rank = rank;
    int *first_end = PyMem_Realloc(t->first_end, (size_t)room * sizeof *first_end);
    if (first_end == NULL)
        return -1;
    t->first_end = first_end;
    int *last_start = PyMem_Realloc(t->last_start, (size_t)room * sizeof *last_start);
    if (last_start == NULL)
        return -1;
    t->last_start = last_start;
    t->room = room;
    return 0;
}

/* Token id's own BPE (no whole-piece look-up) appended to t; *count: its merges; returns 1 where
 * it ends in the token itself, 0 where not, -1 out of memory. pos, rank: room for len + 1. */
static int bpe_trace(const Bpe *v, long long id, Traces *t, Py_ssize_t *count, Py_ssize_t *pos, long long *rank) {
    const long long none = LLONG_MAX;
    const unsigned char *p = v->data + v->offsets[id];
    Py_ssize_t len = v->offsets[id + 1] - v->offsets[id], parts = len + 1;
    *count = 0;
    if (traces_grow(t, len) < 0)
        return -1;
    for (Py_ssize_t k = 0; k <= len; k++)
        pos[k] = k;
    for (Py_ssize_t k = 0; k + 1 < len; k++) {
        long long r = bpe_find(v, p + k, 2);
        rank[k] = r < 0 ? none : r;
    }
    rank[len - 1] = rank[len] = none;
    for (;;) {
        long long best = none;
        Py_ssize_t i = -1;
        for (Py_ssize_t k = 0; k + 1 < parts; k++)
            if (rank[k] < best)
                best = rank[k], i = k;
        if (i < 0)
            break;
        memmove(pos + i + 1, pos + i + 2, (size_t)(parts - i - 2) * sizeof *pos);
        memmove(rank + i + 1, rank + i + 2, (size_t)(parts - i - 2) * sizeof *rank);
        parts--;
        for (Py_ssize_t k = i > 0 ? i - 1 : 0; k <= i; k++) {
            if (k + 2 < parts) {
                long long r = bpe_find(v, p + pos[k], pos[k + 2] - pos[k]);
                rank[k] = r < 0 ? none : r;
            } else
                rank[k] = none;
        }
        t->rank[t->used] = best;
        t->first_end[t->used] = (int)pos[1];
        t->last_start[t->used] = (int)pos[parts - 2];
        t->used++;
        (*count)++;
    }
    return parts == 2 && bpe_find(v, p, len) == id;
}

/* The rank of p[0:la] joined to q[0:lb], or LLONG_MAX (buf: room for la + lb). */
static inline long long bpe_joined(const Bpe *v, const unsigned char *p, Py_ssize_t la, const unsigned char *q,
                                   Py_ssize_t lb, unsigned char *buf) {
    memcpy(buf, p, (size_t)la);
    memcpy(buf + la, q, (size_t)lb);
    long long r = bpe_find(v, buf, la + lb);
    return r < 0 ? LLONG_MAX : r;
}

/* bpe_pairs(a, b, data, offsets, table) -> bytes: per pair (a[k], b[k], native int64 ids), 1 where
 * tiktoken's single-piece encode of a's bytes then b's is exactly [a, b], else 0 (an id out of
 * range, or of no bytes: 0). */
static PyObject *bpe_pairs(PyObject *self, PyObject *args) {
    Py_buffer a, b, data, offsets, table;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*", &a, &b, &data, &offsets, &table))
        return NULL;
    PyObject *out = NULL;
    Bpe v;
    Traces t = {NULL, NULL, NULL, 0, 0};
    Py_ssize_t n = a.len / 8, longest = 0;
    Py_ssize_t *pos = NULL, *at = NULL, *many = NULL; /* per id: where its trace starts, -1 not yet; its merges */
    long long *rank = NULL;
    signed char *whole = NULL; /* per id: its own BPE ends in itself */
    unsigned char *buf = NULL;
    if (a.len % 8 || b.len != a.len) {
        PyErr_SetString(PyExc_ValueError, "bpe_pairs: expected two int64 buffers of one length");
        goto done;
    }
    if (bpe_vocab(&v, &data, &offsets, &table) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < v.n; i++)
        if (v.offsets[i + 1] - v.offsets[i] > longest)
            longest = v.offsets[i + 1] - v.offsets[i];
    pos = PyMem_Malloc((size_t)(longest + 2) * sizeof *pos);
    rank = PyMem_Malloc((size_t)(longest + 2) * sizeof *rank);
    buf = PyMem_Malloc((size_t)(2 * longest + 2));
    at = PyMem_Malloc((size_t)(v.n + 1) * sizeof *at);
    many = PyMem_Malloc((size_t)(v.n + 1) * sizeof *many);
    whole = PyMem_Malloc((size_t)(v.n + 1));
    if (pos == NULL || rank == NULL || buf == NULL || at == NULL || many == NULL || whole == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i <= v.n; i++)
        at[i] = -1;
    out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL)
        goto done;
    char *ok = PyBytes_AS_STRING(out);
    const long long *x = a.buf, *y = b.buf;
    for (Py_ssize_t k = 0; k < n; k++) {
        ok[k] = 0;
        long long ids[2] = {x[k], y[k]};
        int fine = 1;
        for (int s = 0; s < 2 && fine; s++) {
            long long id = ids[s];
            if (id < 0 || id >= v.n || v.offsets[id + 1] == v.offsets[id]) {
                fine = 0;
                break;
            }
            if (at[id] < 0) {
                Py_ssize_t from = t.used, count;
                int got = bpe_trace(&v, id, &t, &count, pos, rank);
                if (got < 0) {
                    Py_CLEAR(out);
                    PyErr_NoMemory();
                    goto done;
                }
                at[id] = from, many[id] = count, whole[id] = (signed char)got;
            }
            fine = whole[ids[s]];
        }
        if (!fine)
            continue;
        const unsigned char *p = v.data + v.offsets[x[k]], *q = v.data + v.offsets[y[k]];
        Py_ssize_t la = v.offsets[x[k] + 1] - v.offsets[x[k]];
        Py_ssize_t i = 0, j = 0, na = many[x[k]], nb = many[y[k]], ia = at[x[k]], jb = at[y[k]];
        Py_ssize_t last = la - 1, first = 1; /* a's last part starts at last, b's first part ends at first */
        long long cross = bpe_joined(&v, p + last, la - last, q, first, buf);
        for (;;) {
            long long na_rank = i < na ? t.rank[ia + i] : LLONG_MAX, nb_rank = j < nb ? t.rank[jb + j] : LLONG_MAX;
            if (cross != LLONG_MAX && cross < na_rank && cross <= nb_rank)
                break; /* the merge across the edge comes first */
            if (na_rank == LLONG_MAX && nb_rank == LLONG_MAX) {
                ok[k] = 1;
                break;
            }
            if (na_rank <= nb_rank) {
                Py_ssize_t now = t.last_start[ia + i++];
                if (now != last) {
                    last = now;
                    cross = bpe_joined(&v, p + last, la - last, q, first, buf);
                }
            } else {
                Py_ssize_t now = t.first_end[jb + j++];
                if (now != first) {
                    first = now;
                    cross = bpe_joined(&v, p + last, la - last, q, first, buf);
                }
            }
        }
    }
done:
    PyMem_Free(pos);
    PyMem_Free(rank);
    PyMem_Free(buf);
    PyMem_Free(at);
    PyMem_Free(many);
    PyMem_Free(whole);
    PyMem_Free(t.rank);
    PyMem_Free(t.first_end);
    PyMem_Free(t.last_start);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&table);
    return out;
}

static PyMethodDef methods[] = {
    {"ids_ok", ids_ok, METH_VARARGS, "ids_ok(value, vocab_size) -> bool"},
    {"join", join, METH_VARARGS, "join(ids, table, text) -> bytes | str | None"},
    {"join_each", join_each, METH_VARARGS, "join_each(lists, table, text) -> list[bytes | str | None]"},
    {"flatten", flatten, METH_VARARGS, "flatten(lists) -> bytes (native int64)"},
    {"count_in", count_in, METH_VARARGS, "count_in(texts, needles) -> bytes (native int64)"},
    {"slices", slices, METH_VARARGS, "slices(flat, starts, sizes) -> list[list[int]]"},
    {"parse_ranks", parse_ranks, METH_VARARGS, "parse_ranks(data) -> (dict, lines) | None"},
    {"ascii_texts", ascii_texts, METH_VARARGS, "ascii_texts(table) -> list[str | None]"},
    {"digit_run", digit_run, METH_VARARGS, "digit_run(data, n) -> bool"},
    {"cut", cut, METH_VARARGS, "cut(flat, starts, table, rules, bits, pack) -> (at, size, keys) as bytes"},
    {"unglue_check", unglue_check, METH_VARARGS, "unglue_check(ids, stretches, lengths, glue_id, glue_size) -> bytes | None"},
    {"bpe_table", bpe_table, METH_VARARGS, "bpe_table(data, offsets, include) -> bytes (int32 hash slots)"},
    {"bpe_pairs", bpe_pairs, METH_VARARGS, "bpe_pairs(a, b, data, offsets, table) -> bytes (1 where the pair is its own BPE)"},
    {"unsettled", unsettled, METH_VARARGS,
     "unsettled(flat, starts, table, rules, bits, pack, single, runs) -> (at, size, sample, key, kind, first) as bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernel(void) {
    const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    memset(b64, -1, sizeof b64);
    for (int k = 0; k < 64; k++)
        b64[(unsigned char)alphabet[k]] = (signed char)k;
    if (PyType_Ready(&KeySetType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "KeySet", (PyObject *)&KeySetType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
