/* gpuwarden.collector.remote_write._rwflat: a remote-write 1.0 request read as columns.
 *
 * The request (snappy already inflated) is parsed by protobuf-c, through the code protoc-c
 * generates from rwflat.proto at build time (setup.py): no wire format is read here. What this
 * file adds is the walk over the parsed request that Python would pay an object per series,
 * label and sample for:
 *
 *   read(raw, index) -> (ids, timestamps_ms, values) | None
 *
 * ``index`` (an ``Index``) maps a label set's *key* (each of its labels' encoded bytes, as sent,
 * after that length as 4 bytes little-endian: ``wire_flat.native_key``) to its number in the
 * decoder's table. The answer is three bytearrays of n native-endian int64 / int64 / float64
 * (each series' number, time in ms and value, in request order) when every series holds exactly
 * one sample and no field but its labels and that sample, and every key is in ``index``.
 * Anything else (a request that does not parse, a series of several samples or none, exemplars
 * or histograms, a label set not seen yet) answers None and the caller parses the request
 * series by series, which also remembers the new keys.
 *
 * The parse runs without the GIL; its memory comes from an arena kept by each thread (protobuf-c
 * allocates each message, label and array apart) and reused by its next request. ``Index`` is
 * an open-addressing table of keys hashed with xxHash (XXH3), read and written with the GIL held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "rwflat.pb-c.h"

typedef struct Block {
    struct Block *next;
    size_t used;
    size_t cap;
} Block;

#define ALIGN 16u
#define HEADER ((sizeof(Block) + ALIGN - 1u) & ~(size_t)(ALIGN - 1u))
#define FIRST_BLOCK ((size_t)1 << 16)
#define KEPT_BLOCK ((size_t)1 << 24) /* the most a thread keeps between requests */

typedef struct {
    Block *head;
    size_t first;
} Arena;

static _Thread_local Block *kept; /* this thread's block, reused by its next request */

static void *arena_alloc(void *data, size_t size)
{
    Arena *arena = data;
    if (size > ((size_t)1 << 40)) {
        return NULL;
    }
    size = (size + ALIGN - 1u) & ~(size_t)(ALIGN - 1u);
    Block *block = arena->head;
    if (block == NULL || block->cap - block->used < size) {
        size_t cap = block == NULL ? arena->first : block->cap * 2u;
        if (cap < size) {
            cap = size;
        }
        Block *grown = NULL;
        if (block == NULL && kept != NULL && kept->cap >= cap) {
            grown = kept;
            kept = NULL;
        } else {
            grown = malloc(HEADER + cap);
            if (grown == NULL) {
                return NULL;
            }
            grown->cap = cap;
        }
        grown->next = block;
        grown->used = 0;
        arena->head = grown;
        block = grown;
    }
    void *out = (char *)block + HEADER + block->used;
    block->used += size;
    return out;
}

static void arena_free(void *data, void *pointer)
{
    (void)data;
    (void)pointer; /* freed with the whole arena */
}

/* Frees the arena's blocks but the largest one under KEPT_BLOCK, which this thread keeps. */
static void arena_release(Arena *arena)
{
    Block *block = arena->head;
    while (block != NULL) {
        Block *next = block->next;
        if (block->cap <= KEPT_BLOCK && (kept == NULL || kept->cap < block->cap)) {
            free(kept);
            kept = block;
        } else {
            free(block);
        }
        block = next;
    }
    arena->head = NULL;
}

/* ---- Index: key bytes -> number ---------------------------------------------------------- */

typedef struct {
    uint64_t hash;
    size_t at; /* the key's offset in keys */
    size_t len;
    int64_t number; /* -1: an empty slot */
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t mask; /* slots - 1 (a power of two) */
    size_t count;
    char *keys;
    size_t keys_used;
    size_t keys_cap;
} Index;

static int64_t index_find(const Index *index, const char *key, size_t len, uint64_t hash)
{
    if (index->slots == NULL) {
        return -1;
    }
    for (size_t at = (size_t)hash & index->mask;; at = (at + 1u) & index->mask) {
        const Slot *slot = &index->slots[at];
        if (slot->number < 0) {
            return -1;
        }
        if (slot->hash == hash && slot->len == len
            && memcmp(index->keys + slot->at, key, len) == 0) {
            return slot->number;
        }
    }
}

static int index_grow(Index *index)
{
    size_t size = index->slots == NULL ? 1024u : (index->mask + 1u) * 2u;
    Slot *slots = PyMem_Malloc(size * sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < size; i++) {
        slots[i].number = -1;
    }
    if (index->slots != NULL) {
        for (size_t i = 0; i <= index->mask; i++) {
            Slot *old = &index->slots[i];
            if (old->number < 0) {
                continue;
            }
            size_t at = (size_t)old->hash & (size - 1u);
            while (slots[at].number >= 0) {
                at = (at + 1u) & (size - 1u);
            }
            slots[at] = *old;
        }
        PyMem_Free(index->slots);
    }
    index->slots = slots;
    index->mask = size - 1u;
    return 0;
}

/* Adds key -> number unless the key is there; 1 added, 0 there already, -1 error. */
static int index_add(Index *index, const char *key, size_t len, int64_t number)
{
    uint64_t hash = XXH3_64bits(key, len);
    if (index_find(index, key, len, hash) >= 0) {
        return 0;
    }
    if (index->slots == NULL || (index->count + 1u) * 2u > index->mask + 1u) {
        if (index_grow(index) < 0) {
            return -1;
        }
    }
    if (index->keys_cap - index->keys_used < len) {
        size_t cap = index->keys_cap == 0 ? 65536u : index->keys_cap;
        while (cap - index->keys_used < len) {
            cap *= 2u;
        }
        char *keys = PyMem_Realloc(index->keys, cap);
        if (keys == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        index->keys = keys;
        index->keys_cap = cap;
    }
    memcpy(index->keys + index->keys_used, key, len);
    size_t at = (size_t)hash & index->mask;
    while (index->slots[at].number >= 0) {
        at = (at + 1u) & index->mask;
    }
    index->slots[at] = (Slot){hash, index->keys_used, len, number};
    index->keys_used += len;
    index->count++;
    return 1;
}

static void index_dealloc(Index *index)
{
    PyMem_Free(index->slots);
    PyMem_Free(index->keys);
    Py_TYPE(index)->tp_free((PyObject *)index);
}

static PyObject *index_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (!PyArg_ParseTuple(args, ":Index") || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Index() takes no arguments");
        return NULL;
    }
    Index *index = (Index *)type->tp_alloc(type, 0);
    return (PyObject *)index; /* tp_alloc zeroes: no slots, no keys */
}

static PyObject *index_py_add(Index *index, PyObject *args)
{
    Py_buffer key;
    long long number;
    if (!PyArg_ParseTuple(args, "y*L:add", &key, &number)) {
        return NULL;
    }
    if (number < 0) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "a number must be >= 0");
        return NULL;
    }
    int added = index_add(index, key.buf, (size_t)key.len, (int64_t)number);
    PyBuffer_Release(&key);
    if (added < 0) {
        return NULL;
    }
    return PyBool_FromLong(added);
}

static PyObject *index_py_get(Index *index, PyObject *args)
{
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "y*:get", &key)) {
        return NULL;
    }
    int64_t number = index_find(index, key.buf, (size_t)key.len, XXH3_64bits(key.buf, (size_t)key.len));
    PyBuffer_Release(&key);
    if (number < 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong(number);
}

static Py_ssize_t index_len(Index *index)
{
    return (Py_ssize_t)index->count;
}

static PyMethodDef index_methods[] = {
    {"add", (PyCFunction)index_py_add, METH_VARARGS,
     "add(key, number) -> bool: remember key's number unless the key is known (whether added)."},
    {"get", (PyCFunction)index_py_get, METH_VARARGS, "get(key) -> int | None: key's number."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods index_sequence = {.sq_length = (lenfunc)index_len};

static PyTypeObject IndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpuwarden.collector.remote_write._rwflat.Index",
    .tp_basicsize = sizeof(Index),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Index(): label-set keys (bytes) -> their numbers, for read().",
    .tp_new = index_new,
    .tp_dealloc = (destructor)index_dealloc,
    .tp_methods = index_methods,
    .tp_as_sequence = &index_sequence,
};

/* ---- read --------------------------------------------------------------------------------- */

/* The key's length for one series, or 0 when the series is not one sample and its labels
 * alone (or a label is too long for the key's 4-byte lengths). */
static size_t key_size(const Gpuwarden__Rwflat__Series *series)
{
    if (series->n_samples != 1 || series->base.n_unknown_fields != 0
        || series->samples[0]->base.n_unknown_fields != 0) {
        return 0;
    }
    size_t size = 0;
    for (size_t i = 0; i < series->n_labels; i++) {
        if (series->labels[i].len > UINT32_MAX) {
            return 0;
        }
        size += 4u + series->labels[i].len;
    }
    return size == 0 ? (size_t)-1 : size; /* no labels: an empty key, still flat */
}

static void put_key(char *out, const Gpuwarden__Rwflat__Series *series)
{
    for (size_t i = 0; i < series->n_labels; i++) {
        uint32_t len = (uint32_t)series->labels[i].len;
        out[0] = (char)(len & 0xffu);
        out[1] = (char)((len >> 8) & 0xffu);
        out[2] = (char)((len >> 16) & 0xffu);
        out[3] = (char)((len >> 24) & 0xffu);
        memcpy(out + 4, series->labels[i].data, len);
        out += 4 + len;
    }
}

/* Parses raw and, when every series is one sample and its labels, writes each series' key into
 * keys (each at its offset in at) and its time and value; 1 flat, 0 not. No GIL needed. */
static int parse(Arena *arena, const uint8_t *raw, size_t len, size_t *count, char **keys,
                 size_t **at, int64_t **times, double **values)
{
    ProtobufCAllocator allocator = {arena_alloc, arena_free, arena};
    Gpuwarden__Rwflat__Request *request = gpuwarden__rwflat__request__unpack(&allocator, len, raw);
    if (request == NULL) {
        return 0;
    }
    size_t n = request->n_timeseries;
    size_t *offsets = arena_alloc(arena, (n + 1u) * sizeof(size_t));
    if (offsets == NULL) {
        return 0;
    }
    offsets[0] = 0;
    for (size_t i = 0; i < n; i++) {
        size_t size = key_size(request->timeseries[i]);
        if (size == 0) {
            return 0;
        }
        offsets[i + 1] = offsets[i] + (size == (size_t)-1 ? 0 : size);
    }
    char *out = arena_alloc(arena, offsets[n] + 1u);
    int64_t *t = arena_alloc(arena, (n + 1u) * sizeof(int64_t));
    double *v = arena_alloc(arena, (n + 1u) * sizeof(double));
    if (out == NULL || t == NULL || v == NULL) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        const Gpuwarden__Rwflat__Series *series = request->timeseries[i];
        put_key(out + offsets[i], series);
        t[i] = series->samples[0]->timestamp;
        v[i] = series->samples[0]->value;
    }
    *count = n;
    *keys = out;
    *at = offsets;
    *times = t;
    *values = v;
    return 1;
}

static PyObject *column(const void *data, size_t n)
{
    return PyByteArray_FromStringAndSize(data, (Py_ssize_t)(n * 8u));
}

static PyObject *rwflat_read(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer raw;
    Index *index;
    if (!PyArg_ParseTuple(args, "y*O!:read", &raw, &IndexType, &index)) {
        return NULL;
    }
    Arena arena = {NULL, FIRST_BLOCK};
    if ((size_t)raw.len > FIRST_BLOCK / 4u) {
        arena.first = (size_t)raw.len * 4u;
    }
    size_t n = 0;
    char *keys = NULL;
    size_t *at = NULL;
    int64_t *times = NULL;
    double *values = NULL;
    int flat;
    Py_BEGIN_ALLOW_THREADS
    flat = parse(&arena, raw.buf, (size_t)raw.len, &n, &keys, &at, &times, &values);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&raw);
    PyObject *out = NULL;
    PyObject *ids = flat ? PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * 8u)) : NULL;
    if (ids != NULL) {
        int64_t *numbers = (int64_t *)PyByteArray_AS_STRING(ids);
        for (size_t i = 0; i < n && flat; i++) {
            size_t len = at[i + 1] - at[i];
            const char *key = keys + at[i];
            numbers[i] = index_find(index, key, len, XXH3_64bits(key, len));
            flat = numbers[i] >= 0;
        }
        if (flat) {
            PyObject *t = column(times, n);
            PyObject *v = t == NULL ? NULL : column(values, n);
            if (v != NULL) {
                out = PyTuple_Pack(3, ids, t, v);
            }
            Py_XDECREF(t);
            Py_XDECREF(v);
        }
        Py_DECREF(ids);
    }
    arena_release(&arena);
    if (out == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"read", rwflat_read, METH_VARARGS,
     "read(raw, index) -> (ids, timestamps_ms, values) | None: a remote-write request as "
     "columns (module docstring)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_rwflat",
    "A remote-write 1.0 request read as columns, parsed by protobuf-c (native/rwflat.c).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__rwflat(void)
{
    if (PyType_Ready(&IndexType) < 0) {
        return NULL;
    }
    PyObject *created = PyModule_Create(&module);
    if (created == NULL) {
        return NULL;
    }
    Py_INCREF(&IndexType);
    if (PyModule_AddObject(created, "Index", (PyObject *)&IndexType) < 0) {
        Py_DECREF(&IndexType);
        Py_DECREF(created);
        return NULL;
    }
    return created;
}
