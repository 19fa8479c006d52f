/* gpuwarden.collector.remote_write._rwflat: a remote-write 1.0 request read as columns.
 *
 * Every byte is parsed by protobuf-c, through the code protoc-c generates from rwflat.proto at
 * build time (setup.py): no wire format is read here. What this file adds is the walk over a
 * request that Python would pay an object per series and sample for:
 *
 *   learn(raw, index, numbers) -> int
 *   read(raw, index) -> (ids, timestamps_ms, values) | None
 *
 * A series is known by its *key*: its bytes as sent less its one sample field, i.e. its labels'
 * fields (the same key as the Python flat read's, remote_write.wire_flat). ``learn`` (on a
 * request the caller parsed series by series) remembers a series' key under its label set's
 * number in ``index`` (an ``Index``) when the series is exactly that key followed by its sample
 * field as protobuf-c packs it, and the key parses as a series of labels alone. ``read`` splits
 * a request into its series' bytes; a series is read when its bytes are a remembered key
 * followed by one sample field and nothing else: a learned field's tag and length (the bytes
 * protobuf-c packs before a sample of that length) and a sample protobuf-c parses, or else bytes
 * protobuf-c parses as a series of one sample and nothing else. The key tried first is the one
 * of the series that followed the previous series last time (senders repeat their order:
 * a memcmp, no hash); then the lengths of sample fields learned are tried, most seen first, each
 * a hash lookup. Protobuf reads two messages one after the other as their merge, so such a
 * series *is* the key's labels and that sample. The answer is three bytearrays
 * of n native-endian int64 / int64 / float64 (each series' number, time in ms and value, in
 * request order); None when the request does not parse or a series is not read so (a new label
 * set, several samples or none, exemplars or histograms, an unusual encoding), and the caller
 * parses it series by series, then learns.
 *
 * The split runs without the GIL; the memory of both calls comes from an arena kept by each
 * thread and reused by its next request (protobuf-c allocates each message and bytes field
 * apart). ``Index`` is an open-addressing table of keys hashed with xxHash (XXH3), with each
 * number's key and the number read after it last time; read and written with the GIL held.
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

#define TAILS 8
#define MAX_KNOWN ((int64_t)1 << 26) /* numbers beyond are looked up by hash only */

/* A sample field's length as learned, and its first bytes (the field's tag and length, as
 * protobuf-c packs them) before the sample's own. */
typedef struct {
    size_t len;
    size_t head_len;
    uint8_t head[16];
    uint64_t count;
} Tail;

/* A number's key (the last one added for it) and the number read after it last time. */
typedef struct {
    size_t at;
    size_t len_1;  /* the key's length + 1 (0: no key) */
    int64_t next_1; /* the next series' number + 1 (0: none seen) */
} Known;

typedef struct {
    PyObject_HEAD
    Known *known; /* by number */
    int64_t n_known;
    int64_t first_1; /* the number of the last request's first series + 1 (0: none) */
    Slot *slots;
    size_t mask; /* slots - 1 (a power of two) */
    size_t count;
    char *keys;
    size_t keys_used;
    size_t keys_cap;
    Tail tails[TAILS]; /* the sample fields learned, by length, most seen first */
    int n_tails;
} Index;

/* Counts a learned series' sample field (``field``: its ``len`` bytes as protobuf-c packs them,
 * of which the last ``sample_len`` are the sample's own), kept in order: most seen first; seen
 * 0 adds a length not seen yet, to be tried last. */
static void index_note_tail(Index *index, const uint8_t *field, size_t len, size_t sample_len,
                            uint64_t seen)
{
    if (sample_len > len || len - sample_len > sizeof(index->tails[0].head)) {
        return;
    }
    int at = 0;
    while (at < index->n_tails && index->tails[at].len != len) {
        at++;
    }
    if (at == index->n_tails) {
        if (index->n_tails == TAILS) {
            return; /* a ninth length: its series stay on the caller's path */
        }
        Tail *tail = &index->tails[at];
        tail->len = len;
        tail->head_len = len - sample_len;
        memcpy(tail->head, field, tail->head_len);
        tail->count = 0;
        index->n_tails++;
    }
    index->tails[at].count += seen;
    while (at > 0 && index->tails[at].count > index->tails[at - 1].count) {
        Tail tail = index->tails[at];
        index->tails[at] = index->tails[at - 1];
        index->tails[at - 1] = tail;
        at--;
    }
}

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
    if (number < MAX_KNOWN) {
        if (number >= index->n_known) {
            int64_t size = index->n_known == 0 ? 1024 : index->n_known;
            while (size <= number) {
                size *= 2;
            }
            Known *known = PyMem_Realloc(index->known, (size_t)size * sizeof(Known));
            if (known == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            memset(known + index->n_known, 0, (size_t)(size - index->n_known) * sizeof(Known));
            index->known = known;
            index->n_known = size;
        }
        index->known[number].at = index->keys_used;
        index->known[number].len_1 = len + 1u;
    }
    index->keys_used += len;
    index->count++;
    return 1;
}

static void index_dealloc(Index *index)
{
    PyMem_Free(index->known);
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

/* ---- learn and read --------------------------------------------------------------------- */

static int only_one_sample(const Gpuwarden__Rwflat__Series *series)
{
    return series != NULL && series->base.n_unknown_fields == 0 && series->n_samples == 1
           && series->samples[0]->base.n_unknown_fields == 0;
}

static Gpuwarden__Rwflat__SeriesBytes *split(Arena *arena, const Py_buffer *raw)
{
    ProtobufCAllocator allocator = {arena_alloc, arena_free, arena};
    return gpuwarden__rwflat__series_bytes__unpack(&allocator, (size_t)raw->len,
                                                   (const uint8_t *)raw->buf);
}

static Arena arena_for(const Py_buffer *raw)
{
    Arena arena = {NULL, FIRST_BLOCK};
    if ((size_t)raw->len > FIRST_BLOCK / 2u) {
        arena.first = (size_t)raw->len * 2u;
    }
    return arena;
}

/* learn(raw, index, numbers) -> int: remember each one-sample series' labels' bytes (its key)
 * under its number (numbers: n native-endian int64, one a series; < 0 skips one). A key is the
 * series' bytes less its sample field, and is remembered only where the series ends with that
 * field exactly as protobuf-c packs it (the canonical encoding) and the rest parses as a series
 * of labels alone. Answers how many keys were new (none when protobuf-c does not split the
 * request into as many series as there are numbers). */
static PyObject *rwflat_learn(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer raw, numbers;
    Index *index;
    if (!PyArg_ParseTuple(args, "y*O!y*:learn", &raw, &IndexType, &index, &numbers)) {
        return NULL;
    }
    Arena arena = arena_for(&raw);
    ProtobufCAllocator allocator = {arena_alloc, arena_free, &arena};
    Gpuwarden__Rwflat__SeriesBytes *request = split(&arena, &raw);
    PyObject *out = NULL;
    if (request == NULL || (size_t)numbers.len != request->n_timeseries * sizeof(int64_t)) {
        out = PyLong_FromLong(0); /* protobuf-c does not read it as the caller did: learn none */
        goto done;
    }
    const int64_t *number = numbers.buf;
    long learned = 0;
    for (size_t i = 0; i < request->n_timeseries; i++) {
        const ProtobufCBinaryData *bytes = &request->timeseries[i];
        if (number[i] < 0) {
            continue;
        }
        Gpuwarden__Rwflat__Series *full =
            gpuwarden__rwflat__series__unpack(&allocator, bytes->len, bytes->data);
        if (!only_one_sample(full)) {
            continue;
        }
        Gpuwarden__Rwflat__Series only = GPUWARDEN__RWFLAT__SERIES__INIT;
        only.n_samples = 1;
        only.samples = full->samples;
        uint8_t tail[64];
        size_t tail_len = gpuwarden__rwflat__series__get_packed_size(&only);
        if (tail_len > sizeof(tail) || tail_len > bytes->len) {
            continue;
        }
        gpuwarden__rwflat__series__pack(&only, tail);
        size_t key_len = bytes->len - tail_len;
        if (memcmp(bytes->data + key_len, tail, tail_len) != 0) {
            continue; /* not the canonical encoding: stays on the caller's path */
        }
        Gpuwarden__Rwflat__Series *labels =
            gpuwarden__rwflat__series__unpack(&allocator, key_len, bytes->data);
        if (labels == NULL || labels->n_samples != 0 || labels->base.n_unknown_fields != 0) {
            continue;
        }
        int added = index_add(index, (const char *)bytes->data, key_len, number[i]);
        if (added < 0) {
            goto done;
        }
        size_t sample_len = gpuwarden__rwflat__sample__get_packed_size(full->samples[0]);
        index_note_tail(index, tail, tail_len, sample_len, 1);
        /* the same sample field with a value of 0 (left out) or not, from this series' next one */
        Gpuwarden__Rwflat__Sample other = *full->samples[0];
        other.value = other.value == 0.0 ? 1.0 : 0.0;
        Gpuwarden__Rwflat__Sample *others[1] = {&other};
        only.samples = others;
        size_t other_len = gpuwarden__rwflat__series__get_packed_size(&only);
        if (other_len <= sizeof(tail)) {
            gpuwarden__rwflat__series__pack(&only, tail);
            index_note_tail(index, tail, other_len,
                            gpuwarden__rwflat__sample__get_packed_size(&other), 0);
        }
        learned += added;
    }
    out = PyLong_FromLong(learned);
done:
    arena_release(&arena);
    PyBuffer_Release(&raw);
    PyBuffer_Release(&numbers);
    return out;
}

/* The bytes after a key: 1 when they are one sample field and nothing else (its time and value
 * set), 0 not. A learned field's first bytes (its tag and length, as protobuf-c packs them) are
 * compared and protobuf-c parses the sample after them; other bytes are parsed whole, as a
 * series that must hold one sample and nothing else. */
static int one_sample(ProtobufCAllocator *allocator, const uint8_t *data, size_t len,
                      const Tail *tails, int n_tails, int64_t *time, double *value)
{
    for (int k = 0; k < n_tails; k++) {
        const Tail *known = &tails[k];
        if (known->len != len || memcmp(data, known->head, known->head_len) != 0) {
            continue;
        }
        Gpuwarden__Rwflat__Sample *sample = gpuwarden__rwflat__sample__unpack(
            allocator, len - known->head_len, data + known->head_len);
        if (sample != NULL && sample->base.n_unknown_fields == 0) {
            *time = sample->timestamp;
            *value = sample->value;
            return 1;
        }
        break;
    }
    Gpuwarden__Rwflat__Series *tail = gpuwarden__rwflat__series__unpack(allocator, len, data);
    if (!only_one_sample(tail) || tail->n_labels != 0) {
        return 0;
    }
    *time = tail->samples[0]->timestamp;
    *value = tail->samples[0]->value;
    return 1;
}

/* One series by its key: its number, time and value; 1 found, 0 not. The series' bytes are a
 * remembered key (labels alone, as learn proved) followed by bytes that parse as one sample and
 * nothing else, so protobuf reads the whole as those labels and that sample. The key tried
 * first is ``guess``'s (the series that followed the previous one last time: no hash), then
 * each learned sample-field length's. */
static int find(const Index *index, ProtobufCAllocator *allocator, const ProtobufCBinaryData *bytes,
                int64_t guess, const Tail *tails, int n_tails, int64_t *number, int64_t *time,
                double *value)
{
    if (guess >= 0 && guess < index->n_known && index->known[guess].len_1 != 0) {
        const Known *known = &index->known[guess];
        size_t key_len = known->len_1 - 1u;
        if (key_len < bytes->len && memcmp(bytes->data, index->keys + known->at, key_len) == 0
            && one_sample(allocator, bytes->data + key_len, bytes->len - key_len, tails, n_tails,
                          time, value)) {
            *number = guess;
            return 1;
        }
    }
    for (int k = 0; k < n_tails; k++) {
        if (tails[k].len > bytes->len) {
            continue;
        }
        size_t key_len = bytes->len - tails[k].len;
        const char *key = (const char *)bytes->data;
        int64_t found = index_find(index, key, key_len, XXH3_64bits(key, key_len));
        if (found >= 0 && one_sample(allocator, bytes->data + key_len, tails[k].len, tails, n_tails,
                                     time, value)) {
            *number = found;
            return 1;
        }
    }
    return 0;
}

/* The number expected after ``previous`` (-1: the request's first series); -1: none. */
static int64_t guess_after(const Index *index, int64_t previous)
{
    if (previous < 0) {
        return index->first_1 - 1;
    }
    return previous < index->n_known ? index->known[previous].next_1 - 1 : -1;
}

/* Remembers that ``number`` followed ``previous`` (-1: came first). */
static void note_after(Index *index, int64_t previous, int64_t number)
{
    if (previous < 0) {
        index->first_1 = number + 1;
    } else if (previous < index->n_known) {
        index->known[previous].next_1 = number + 1;
    }
}

static PyObject *rwflat_read(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer raw;
    Index *index;
    if (!PyArg_ParseTuple(args, "y*O!:read", &raw, &IndexType, &index)) {
        return NULL;
    }
    Arena arena = arena_for(&raw);
    ProtobufCAllocator allocator = {arena_alloc, arena_free, &arena};
    Gpuwarden__Rwflat__SeriesBytes *request;
    Py_BEGIN_ALLOW_THREADS
    request = split(&arena, &raw); /* each series' bytes, copied into the arena */
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&raw);
    PyObject *out = NULL;
    size_t n = request == NULL ? 0 : request->n_timeseries;
    PyObject *ids = NULL, *times = NULL, *values = NULL;
    if (request == NULL || index->count == 0) {
        goto done;
    }
    ids = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * 8u));
    times = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * 8u));
    values = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * 8u));
    if (ids == NULL || times == NULL || values == NULL) {
        goto done;
    }
    int64_t *number = (int64_t *)PyByteArray_AS_STRING(ids);
    int64_t *time = (int64_t *)PyByteArray_AS_STRING(times);
    double *value = (double *)PyByteArray_AS_STRING(values);
    Tail tails[TAILS];
    int n_tails = index->n_tails;
    memcpy(tails, index->tails, sizeof(tails));
    int64_t previous = -1;
    for (size_t i = 0; i < n; i++) {
        if (!find(index, &allocator, &request->timeseries[i], guess_after(index, previous), tails,
                  n_tails, &number[i], &time[i], &value[i])) {
            goto done;
        }
        note_after(index, previous, number[i]);
        previous = number[i];
    }
    out = PyTuple_Pack(3, ids, times, values);
done:
    arena_release(&arena);
    Py_XDECREF(ids);
    Py_XDECREF(times);
    Py_XDECREF(values);
    if (out == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"learn", rwflat_learn, METH_VARARGS,
     "learn(raw, index, numbers) -> int: remember the keys of a request's series (module "
     "docstring)."},
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
