/*
 * A fake libnvidia-ml.so.1 for tests: the real pynvml loads it and calls it as it would call NVML.
 *
 * Build:   gcc -shared -fPIC -O2 -o libnvidia-ml.so.1 fake_nvml.c
 * Variant: -DFAKE_NVML_NO_PROCESSES_V3 leaves out nvmlDeviceGetComputeRunningProcesses_v3, so
 *          pynvml's unversioned wrapper raises NVMLLibraryMismatchError (an old driver's library).
 *
 * State for up to FAKE_MAX_GPUS GPUs lives in static memory. On load the library describes eight
 * H100-like GPUs with distinct values (see fake_reset), so it also works behind LD_LIBRARY_PATH in
 * a subprocess. Tests drive it through the fake_* control functions at the end of this file
 * (wrapped by tests/fakenvml/control.py).
 *
 * Semantics kept from NVML because the agent relies on them:
 *   - every device call fails with NVML_ERROR_UNINITIALIZED before nvmlInit / after the last
 *     nvmlShutdown (init is reference counted);
 *   - nvmlDeviceGetMemoryInfo (v1) reports used = allocated + reserved, v2 splits them;
 *   - GetComputeRunningProcesses_v3 and GetProcessUtilization use the INSUFFICIENT_SIZE handshake;
 *     GetProcessUtilization returns NOT_FOUND when no sample is newer than lastSeenTimeStamp;
 *   - GetUtilizationRates and GetProcessUtilization are NOT_SUPPORTED while MIG mode is on;
 *   - each nvmlFieldValue_t carries its own nvmlReturn; the NVLink throughput fields use scopeId
 *     UINT_MAX for "all links" and a link index otherwise (the total split evenly over the links);
 *   - nvmlEventSetWait_v2 never blocks: an empty queue returns NVML_ERROR_TIMEOUT at once, whatever
 *     the timeout (tests must never wait).
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#define FAKE_MAX_GPUS 16
#define FAKE_MAX_MIG 7
#define FAKE_MAX_PROCS 64
#define FAKE_MAX_FIELDS 320 /* NVML_FI_MAX is 308 in nvidia-ml-py 13 */
#define FAKE_MAX_ERRORS 64
#define FAKE_MAX_EVENT_SETS 4
#define FAKE_EVENT_QUEUE 256
#define FAKE_STR 96
#define FAKE_NA_ULL ULLONG_MAX /* NVML_VALUE_NOT_AVAILABLE for unsigned long long */

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

enum { VT_DOUBLE = 0, VT_UINT = 1, VT_ULONG = 2, VT_ULL = 3, VT_SLL = 4, VT_SINT = 5, VT_USHORT = 6 };

enum {
    FI_ECC_SBE_VOL_TOTAL = 3,
    FI_ECC_DBE_VOL_TOTAL = 4,
    FI_MEMORY_TEMP = 82,
    FI_TOTAL_ENERGY = 83,
    FI_NVLINK_TX = 138,
    FI_NVLINK_RX = 139,
    FI_REMAPPED_COR = 142,
    FI_REMAPPED_UNC = 143,
    FI_REMAPPED_PENDING = 144,
    FI_REMAPPED_FAILURE = 145,
    FI_POWER_AVERAGE = 185,
    FI_POWER_INSTANT = 186,
};

#define EVENT_XID 0x8ULL
#define EVENT_MIG_CONFIG_CHANGE 0x100ULL
#define MEMORY_V2_VERSION 0x02000028u
#define TEMPERATURE_V1_VERSION 0x100000Cu
#define NO_INSTANCE 0xFFFFFFFFu

/* ---- structures, laid out as pynvml's ctypes classes ------------------------------------ */

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    unsigned pid;
    unsigned long long timeStamp;
    unsigned smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
typedef struct { unsigned version; int sensorType; int temperature; } nvmlTemperature_t;
typedef union {
    double dVal;
    unsigned uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t layout");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "sample layout");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t layout");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t layout");

/* ---- exported symbols: names, call counters, error injection ------------------------------ */

#define FAKE_SYMBOLS(X)                                                                        \
    X(nvmlInit_v2) X(nvmlInitWithFlags) X(nvmlShutdown) X(nvmlErrorString)                     \
    X(nvmlSystemGetDriverVersion) X(nvmlSystemGetNVMLVersion) X(nvmlDeviceGetCount_v2)         \
    X(nvmlDeviceGetHandleByIndex_v2) X(nvmlDeviceGetHandleByUUID) X(nvmlDeviceGetIndex)        \
    X(nvmlDeviceGetName) X(nvmlDeviceGetUUID) X(nvmlDeviceGetPciInfo_v3)                       \
    X(nvmlDeviceGetUtilizationRates) X(nvmlDeviceGetMemoryInfo) X(nvmlDeviceGetMemoryInfo_v2)  \
    X(nvmlDeviceGetPowerUsage) X(nvmlDeviceGetTotalEnergyConsumption)                          \
    X(nvmlDeviceGetTemperature) X(nvmlDeviceGetTemperatureV) X(nvmlDeviceGetClockInfo)         \
    X(nvmlDeviceGetCurrentClocksEventReasons) X(nvmlDeviceGetCurrentClocksThrottleReasons)     \
    X(nvmlDeviceGetPcieThroughput) X(nvmlDeviceGetCurrPcieLinkGeneration)                      \
    X(nvmlDeviceGetCurrPcieLinkWidth) X(nvmlDeviceGetFieldValues)                              \
    X(nvmlDeviceGetTotalEccErrors) X(nvmlDeviceGetRemappedRows)                                \
    X(nvmlDeviceGetComputeRunningProcesses_v3) X(nvmlDeviceGetProcessUtilization)              \
    X(nvmlDeviceGetMigMode) X(nvmlDeviceGetMaxMigDeviceCount)                                  \
    X(nvmlDeviceGetMigDeviceHandleByIndex) X(nvmlDeviceGetDeviceHandleFromMigDeviceHandle)     \
    X(nvmlDeviceIsMigDeviceHandle) X(nvmlDeviceGetGpuInstanceId)                               \
    X(nvmlDeviceGetComputeInstanceId) X(nvmlEventSetCreate) X(nvmlDeviceGetSupportedEventTypes) \
    X(nvmlDeviceRegisterEvents) X(nvmlEventSetWait_v2) X(nvmlEventSetFree)

#define FAKE_ENUM(name) SYM_##name,
#define FAKE_NAME(name) #name,
enum fake_sym { FAKE_SYMBOLS(FAKE_ENUM) SYM_COUNT };
static const char *const sym_names[SYM_COUNT] = {FAKE_SYMBOLS(FAKE_NAME)};

#define SYM_ANY (-1) /* "*": every call that concerns one GPU */

/* calls[sym][gpu]; the last column counts calls that concern no GPU (or an invalid handle). */
static unsigned long long calls[SYM_COUNT][FAKE_MAX_GPUS + 1];

typedef struct { int sym, gpu, code; } fake_error_t;
static fake_error_t errors[FAKE_MAX_ERRORS];
static int n_errors;

static int sym_index(const char *name) {
    if (name == NULL) return -2;
    if (strcmp(name, "*") == 0) return SYM_ANY;
    for (int i = 0; i < SYM_COUNT; i++)
        if (strcmp(name, sym_names[i]) == 0) return i;
    return -2;
}

static void count_call(int sym, int gpu) {
    calls[sym][(gpu >= 0 && gpu < FAKE_MAX_GPUS) ? gpu : FAKE_MAX_GPUS]++;
}

static nvmlReturn_t injected(int sym, int gpu) {
    for (int i = 0; i < n_errors; i++) {
        const fake_error_t *e = &errors[i];
        int sym_ok = e->sym == sym || (e->sym == SYM_ANY && gpu >= 0);
        int gpu_ok = e->gpu == -1 || e->gpu == gpu;
        if (sym_ok && gpu_ok) return e->code;
    }
    return NVML_SUCCESS;
}

/* ---- device state ------------------------------------------------------------------------- */

enum { KIND_GPU = 1, KIND_MIG = 2 };
typedef struct { int kind, gpu, mig; } fake_handle_t;

typedef struct {
    int set;
    nvmlReturn_t ret; /* per-entry nvmlReturn; 0 = value below is returned */
    unsigned valueType;
    nvmlValue_t value;
} fake_field_t;

typedef struct {
    unsigned pid, sm, memutil, gi, ci;
    unsigned long long mem, ts;
} fake_proc_t;

typedef struct {
    fake_handle_t h;
    char uuid[FAKE_STR], name[FAKE_STR];
    unsigned gi, ci;
    unsigned long long mem_total, mem_used, mem_reserved;
} fake_mig_t;

/* Scalar per-GPU values addressed by name through fake_set_u64 / fake_get_u64. */
#define FAKE_KEYS(X)                                                                            \
    X(util_gpu) X(util_mem) X(mem_total) X(mem_used) X(mem_reserved) X(power_mw) X(energy_mj)  \
    X(temp_c) X(clock_graphics_mhz) X(clock_sm_mhz) X(clock_mem_mhz) X(clock_video_mhz)        \
    X(clock_event_reasons) X(pcie_tx_kbps) X(pcie_rx_kbps) X(pcie_gen) X(pcie_width)           \
    X(ecc_cor_volatile) X(ecc_unc_volatile) X(ecc_cor_aggregate) X(ecc_unc_aggregate)          \
    X(mig_mode) X(mig_pending) X(max_mig) X(supported_events) X(nvlink_links) X(last_util_ts)  \
    X(last_field_count) X(pci_domain) X(pci_bus) X(pci_device) X(pci_device_id)                \
    X(pci_subsystem_id)
#define KEY_ENUM(name) KEY_##name,
#define KEY_NAME(name) #name,
enum fake_key { FAKE_KEYS(KEY_ENUM) KEY_COUNT };
static const char *const key_names[KEY_COUNT] = {FAKE_KEYS(KEY_NAME)};

typedef struct {
    fake_handle_t h;
    char name[FAKE_STR], uuid[FAKE_STR], pci_bus_id[32];
    unsigned long long v[KEY_COUNT];
    fake_field_t fields[FAKE_MAX_FIELDS];
    int n_procs;
    fake_proc_t procs[FAKE_MAX_PROCS];
    int n_mig;
    fake_mig_t mig[FAKE_MAX_MIG];
} fake_gpu_t;

typedef struct {
    int used;
    unsigned long long mask[FAKE_MAX_GPUS];
    struct { int gpu; unsigned long long type, data; } queue[FAKE_EVENT_QUEUE];
    int head, len;
} fake_event_set_t;

static fake_gpu_t gpus[FAKE_MAX_GPUS];
static int n_gpus;
static int init_refcount;
static char driver_version[FAKE_STR];
static unsigned long long sample_clock_us; /* timestamps of per-process utilisation samples */
static fake_event_set_t event_sets[FAKE_MAX_EVENT_SETS];
static unsigned long long last_wait_timeout_ms = ULLONG_MAX; /* ULLONG_MAX: never called */

static void copy_str(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src);
}

static void set_field_ull(fake_gpu_t *g, unsigned fid, unsigned vt, unsigned long long v) {
    fake_field_t *f = &g->fields[fid];
    f->set = 1;
    f->ret = NVML_SUCCESS;
    f->valueType = vt;
    memset(&f->value, 0, sizeof f->value);
    switch (vt) {
    case VT_UINT: f->value.uiVal = (unsigned)v; break;
    case VT_ULONG: f->value.ulVal = (unsigned long)v; break;
    case VT_SLL: f->value.sllVal = (long long)v; break;
    case VT_SINT: f->value.siVal = (int)v; break;
    case VT_USHORT: f->value.usVal = (unsigned short)v; break;
    default: f->value.ullVal = v; break;
    }
}

static void default_mig(fake_gpu_t *g, int gpu, int i) {
    fake_mig_t *m = &g->mig[i];
    m->h.kind = KIND_MIG;
    m->h.gpu = gpu;
    m->h.mig = i;
    snprintf(m->uuid, sizeof m->uuid, "MIG-%08x-%04x-4000-8000-%012x", 0x5a000000u + gpu * 16 + i,
             i, gpu);
    copy_str(m->name, sizeof m->name, "NVIDIA H100 80GB HBM3 MIG 1g.10gb");
    m->gi = 7 + (unsigned)i;
    m->ci = 0;
    m->mem_total = 10ULL << 30;
    m->mem_used = (1ULL + (unsigned long long)i) << 28;
    m->mem_reserved = 32ULL << 20;
}

static const unsigned h100_buses[8] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

static void default_gpu(int i) {
    fake_gpu_t *g = &gpus[i];
    unsigned long long u = (unsigned long long)i;
    memset(g, 0, sizeof *g);
    g->h.kind = KIND_GPU;
    g->h.gpu = i;
    g->h.mig = -1;
    copy_str(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3");
    snprintf(g->uuid, sizeof g->uuid, "GPU-%08x-7b3c-4d2e-9f10-%012x", 0xc0ffee00u + i, 0xa11ce + i);
    unsigned bus = i < 8 ? h100_buses[i] : 0xe0u + (unsigned)i;
    snprintf(g->pci_bus_id, sizeof g->pci_bus_id, "00000000:%02X:00.0", bus);
    unsigned long long *v = g->v;
    v[KEY_pci_domain] = 0;
    v[KEY_pci_bus] = bus;
    v[KEY_pci_device] = 0;
    v[KEY_pci_device_id] = 0x233010deULL;
    v[KEY_pci_subsystem_id] = 0x16c110deULL;
    v[KEY_util_gpu] = 35 + 7 * u;
    v[KEY_util_mem] = 12 + 3 * u;
    v[KEY_mem_total] = 80ULL << 30;
    v[KEY_mem_used] = (10 + 5 * u) << 30;
    v[KEY_mem_reserved] = (512 + u) << 20;
    v[KEY_power_mw] = 300000 + 12345 * u;
    v[KEY_energy_mj] = 1000000000ULL + 1000000ULL * u + 123;
    v[KEY_temp_c] = 40 + u;
    v[KEY_clock_sm_mhz] = 1980 - 15 * u;
    v[KEY_clock_graphics_mhz] = v[KEY_clock_sm_mhz];
    v[KEY_clock_mem_mhz] = 2619;
    v[KEY_clock_video_mhz] = 1755;
    v[KEY_clock_event_reasons] = (i % 2) ? 0x4 : 0x0;
    v[KEY_pcie_tx_kbps] = 1000 * (u + 1) + 17;
    v[KEY_pcie_rx_kbps] = 2000 * (u + 1) + 29;
    v[KEY_pcie_gen] = 5;
    v[KEY_pcie_width] = 16;
    v[KEY_ecc_cor_volatile] = 3 * u;
    v[KEY_ecc_unc_volatile] = 0;
    v[KEY_ecc_cor_aggregate] = 100 + 3 * u;
    v[KEY_ecc_unc_aggregate] = 1;
    v[KEY_mig_mode] = 0;
    v[KEY_mig_pending] = 0;
    v[KEY_max_mig] = FAKE_MAX_MIG;
    v[KEY_supported_events] = 0x1 | 0x2 | 0x4 | EVENT_XID | 0x10 | EVENT_MIG_CONFIG_CHANGE;
    v[KEY_nvlink_links] = 18;
    set_field_ull(g, FI_POWER_INSTANT, VT_UINT, v[KEY_power_mw] + 1500);
    set_field_ull(g, FI_POWER_AVERAGE, VT_UINT, v[KEY_power_mw]);
    set_field_ull(g, FI_MEMORY_TEMP, VT_UINT, 50 + u);
    set_field_ull(g, FI_TOTAL_ENERGY, VT_ULL, v[KEY_energy_mj]);
    set_field_ull(g, FI_NVLINK_TX, VT_ULL, 180000000ULL + 1000000ULL * u);
    set_field_ull(g, FI_NVLINK_RX, VT_ULL, 360000000ULL + 2000000ULL * u);
    set_field_ull(g, FI_REMAPPED_COR, VT_UINT, u);
    set_field_ull(g, FI_REMAPPED_UNC, VT_UINT, 0);
    set_field_ull(g, FI_REMAPPED_PENDING, VT_UINT, 0);
    set_field_ull(g, FI_REMAPPED_FAILURE, VT_UINT, 0);
    set_field_ull(g, FI_ECC_SBE_VOL_TOTAL, VT_ULL, v[KEY_ecc_cor_volatile]);
    set_field_ull(g, FI_ECC_DBE_VOL_TOTAL, VT_ULL, v[KEY_ecc_unc_volatile]);
    g->n_procs = 1;
    g->procs[0].pid = 41000 + (unsigned)i;
    g->procs[0].mem = (2 + u) << 30;
    g->procs[0].sm = 30 + (unsigned)i;
    g->procs[0].memutil = 10 + (unsigned)i;
    g->procs[0].gi = NO_INSTANCE;
    g->procs[0].ci = NO_INSTANCE;
    g->procs[0].ts = ++sample_clock_us;
    for (int m = 0; m < FAKE_MAX_MIG; m++) default_mig(g, i, m);
}

/* ---- handle validation -------------------------------------------------------------------- */

/* Returns the handle if it points into our tables and is still valid, else NULL. */
static const fake_handle_t *resolve(const void *p) {
    const char *c = (const char *)p, *base = (const char *)gpus;
    if (p == NULL || c < base || c >= base + sizeof gpus) return NULL;
    size_t gi = (size_t)(c - base) / sizeof(fake_gpu_t);
    const fake_gpu_t *g = &gpus[gi];
    if ((int)gi >= n_gpus) return NULL;
    if (p == (const void *)&g->h) return &g->h;
    for (int m = 0; m < g->n_mig; m++)
        if (p == (const void *)&g->mig[m].h) return &g->mig[m].h;
    return NULL;
}

static fake_event_set_t *resolve_set(const void *p) {
    for (int i = 0; i < FAKE_MAX_EVENT_SETS; i++)
        if (p == (const void *)&event_sets[i] && event_sets[i].used) return &event_sets[i];
    return NULL;
}

/* Prologue of every call on a device handle: count, check init, handle, injected error. */
#define DEVICE_CALL(SYM, HANDLE)                                                                \
    const fake_handle_t *h = resolve(HANDLE);                                                   \
    count_call(SYM_##SYM, h ? h->gpu : -1);                                                     \
    if (init_refcount <= 0) return NVML_ERROR_UNINITIALIZED;                                   \
    if (h == NULL) return NVML_ERROR_INVALID_ARGUMENT;                                         \
    {                                                                                           \
        nvmlReturn_t injected_ = injected(SYM_##SYM, h->gpu);                                   \
        if (injected_ != NVML_SUCCESS) return injected_;                                        \
    }                                                                                           \
    fake_gpu_t *g = &gpus[h->gpu];                                                              \
    (void)g;

/* For calls that NVML does not support on MIG device handles. */
#define GPU_ONLY()                                                                              \
    if (h->kind != KIND_GPU) return NVML_ERROR_NOT_SUPPORTED;

#define GLOBAL_CALL(SYM)                                                                        \
    count_call(SYM_##SYM, -1);                                                                  \
    if (init_refcount <= 0) return NVML_ERROR_UNINITIALIZED;                                   \
    {                                                                                           \
        nvmlReturn_t injected_ = injected(SYM_##SYM, -1);                                       \
        if (injected_ != NVML_SUCCESS) return injected_;                                        \
    }

static nvmlReturn_t put_str(char *dst, unsigned len, const char *src) {
    if (dst == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- init, system ------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    count_call(SYM_nvmlInitWithFlags, -1);
    nvmlReturn_t e = injected(SYM_nvmlInitWithFlags, -1);
    if (e != NVML_SUCCESS) return e;
    init_refcount++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    count_call(SYM_nvmlInit_v2, -1);
    nvmlReturn_t e = injected(SYM_nvmlInit_v2, -1);
    if (e != NVML_SUCCESS) return e;
    init_refcount++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    count_call(SYM_nvmlShutdown, -1);
    if (init_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t e = injected(SYM_nvmlShutdown, -1);
    if (e != NVML_SUCCESS) return e;
    init_refcount--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    count_call(SYM_nvmlErrorString, -1);
    switch (result) {
    case 0: return "Success";
    case 15: return "GPU is lost";
    case 28: return "GPU not found";
    case 29: return "Invalid state";
    case 999: return "Unknown Error";
    default: return "Fake NVML error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned len) {
    GLOBAL_CALL(nvmlSystemGetDriverVersion)
    return put_str(version, len, driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned len) {
    GLOBAL_CALL(nvmlSystemGetNVMLVersion)
    return put_str(version, len, "13.580.65.06");
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    GLOBAL_CALL(nvmlDeviceGetCount_v2)
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)n_gpus;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device) {
    int gpu = index < FAKE_MAX_GPUS ? (int)index : -1;
    count_call(SYM_nvmlDeviceGetHandleByIndex_v2, gpu);
    if (init_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || (int)index >= n_gpus) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t e = injected(SYM_nvmlDeviceGetHandleByIndex_v2, gpu);
    if (e != NVML_SUCCESS) return e;
    *device = &gpus[index].h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
    GLOBAL_CALL(nvmlDeviceGetHandleByUUID)
    if (uuid == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < n_gpus; i++) {
        if (strcmp(uuid, gpus[i].uuid) == 0) {
            *device = &gpus[i].h;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- identity ----------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetIndex(void *device, unsigned *index) {
    DEVICE_CALL(nvmlDeviceGetIndex, device)
    GPU_ONLY()
    *index = (unsigned)h->gpu;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned len) {
    DEVICE_CALL(nvmlDeviceGetName, device)
    return put_str(name, len, h->kind == KIND_MIG ? g->mig[h->mig].name : g->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned len) {
    DEVICE_CALL(nvmlDeviceGetUUID, device)
    return put_str(uuid, len, h->kind == KIND_MIG ? g->mig[h->mig].uuid : g->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci) {
    DEVICE_CALL(nvmlDeviceGetPciInfo_v3, device)
    if (pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0",
             (unsigned)g->v[KEY_pci_domain], (unsigned)g->v[KEY_pci_bus],
             (unsigned)g->v[KEY_pci_device]);
    pci->domain = (unsigned)g->v[KEY_pci_domain];
    pci->bus = (unsigned)g->v[KEY_pci_bus];
    pci->device = (unsigned)g->v[KEY_pci_device];
    pci->pciDeviceId = (unsigned)g->v[KEY_pci_device_id];
    pci->pciSubSystemId = (unsigned)g->v[KEY_pci_subsystem_id];
    copy_str(pci->busId, sizeof pci->busId, g->pci_bus_id);
    return NVML_SUCCESS;
}

/* ---- per-round readings ------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *util) {
    DEVICE_CALL(nvmlDeviceGetUtilizationRates, device)
    GPU_ONLY()
    if (g->v[KEY_mig_mode]) return NVML_ERROR_NOT_SUPPORTED;
    util->gpu = (unsigned)g->v[KEY_util_gpu];
    util->memory = (unsigned)g->v[KEY_util_mem];
    return NVML_SUCCESS;
}

static void memory_of(const fake_handle_t *h, const fake_gpu_t *g, unsigned long long *total,
                      unsigned long long *used, unsigned long long *reserved) {
    if (h->kind == KIND_MIG) {
        const fake_mig_t *m = &g->mig[h->mig];
        *total = m->mem_total, *used = m->mem_used, *reserved = m->mem_reserved;
    } else {
        *total = g->v[KEY_mem_total], *used = g->v[KEY_mem_used],
        *reserved = g->v[KEY_mem_reserved];
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    DEVICE_CALL(nvmlDeviceGetMemoryInfo, device)
    unsigned long long total, used, reserved;
    memory_of(h, g, &total, &used, &reserved);
    memory->total = total;
    memory->used = used + reserved; /* v1 counts reserved memory as used */
    memory->free = total - used - reserved;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *memory) {
    DEVICE_CALL(nvmlDeviceGetMemoryInfo_v2, device)
    if (memory->version != MEMORY_V2_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, used, reserved;
    memory_of(h, g, &total, &used, &reserved);
    memory->total = total;
    memory->used = used;
    memory->reserved = reserved;
    memory->free = total - used - reserved;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(void *device, unsigned *milliwatts) {
    DEVICE_CALL(nvmlDeviceGetPowerUsage, device)
    GPU_ONLY()
    *milliwatts = (unsigned)g->v[KEY_power_mw];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(void *device, unsigned long long *mj) {
    DEVICE_CALL(nvmlDeviceGetTotalEnergyConsumption, device)
    GPU_ONLY()
    *mj = g->v[KEY_energy_mj];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(void *device, int sensor, unsigned *temp) {
    DEVICE_CALL(nvmlDeviceGetTemperature, device)
    GPU_ONLY()
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = (unsigned)g->v[KEY_temp_c];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(void *device, nvmlTemperature_t *temp) {
    DEVICE_CALL(nvmlDeviceGetTemperatureV, device)
    GPU_ONLY()
    if (temp->version != TEMPERATURE_V1_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temp->sensorType != 0) return NVML_ERROR_INVALID_ARGUMENT;
    temp->temperature = (int)g->v[KEY_temp_c];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(void *device, int type, unsigned *mhz) {
    DEVICE_CALL(nvmlDeviceGetClockInfo, device)
    GPU_ONLY()
    static const int keys[4] = {KEY_clock_graphics_mhz, KEY_clock_sm_mhz, KEY_clock_mem_mhz,
                                KEY_clock_video_mhz};
    if (type < 0 || type > 3) return NVML_ERROR_INVALID_ARGUMENT;
    *mhz = (unsigned)g->v[keys[type]];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *device,
                                                           unsigned long long *reasons) {
    DEVICE_CALL(nvmlDeviceGetCurrentClocksEventReasons, device)
    GPU_ONLY()
    *reasons = g->v[KEY_clock_event_reasons];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *device,
                                                              unsigned long long *reasons) {
    DEVICE_CALL(nvmlDeviceGetCurrentClocksThrottleReasons, device)
    GPU_ONLY()
    *reasons = g->v[KEY_clock_event_reasons];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(void *device, int counter, unsigned *value) {
    DEVICE_CALL(nvmlDeviceGetPcieThroughput, device)
    GPU_ONLY()
    if (counter == 0) *value = (unsigned)g->v[KEY_pcie_tx_kbps];
    else if (counter == 1) *value = (unsigned)g->v[KEY_pcie_rx_kbps];
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(void *device, unsigned *gen) {
    DEVICE_CALL(nvmlDeviceGetCurrPcieLinkGeneration, device)
    GPU_ONLY()
    *gen = (unsigned)g->v[KEY_pcie_gen];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(void *device, unsigned *width) {
    DEVICE_CALL(nvmlDeviceGetCurrPcieLinkWidth, device)
    GPU_ONLY()
    *width = (unsigned)g->v[KEY_pcie_width];
    return NVML_SUCCESS;
}

static int is_nvlink_throughput(unsigned fid) { return fid >= FI_NVLINK_TX && fid <= 141; }

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(void *device, int count, nvmlFieldValue_t *values) {
    DEVICE_CALL(nvmlDeviceGetFieldValues, device)
    GPU_ONLY()
    if (count < 0 || (count > 0 && values == NULL)) return NVML_ERROR_INVALID_ARGUMENT;
    g->v[KEY_last_field_count] = (unsigned long long)count;
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *out = &values[i];
        unsigned fid = out->fieldId;
        memset(&out->value, 0, sizeof out->value);
        out->timestamp = 1700000000000000LL + (long long)sample_clock_us;
        out->latencyUsec = 0;
        const fake_field_t *f = fid < FAKE_MAX_FIELDS ? &g->fields[fid] : NULL;
        if (f == NULL || !f->set) {
            out->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        if (f->ret != NVML_SUCCESS) {
            out->nvmlReturn = f->ret;
            continue;
        }
        out->valueType = f->valueType;
        out->value = f->value;
        out->nvmlReturn = NVML_SUCCESS;
        if (is_nvlink_throughput(fid) && out->scopeId != UINT_MAX) {
            unsigned long long links = g->v[KEY_nvlink_links];
            if (out->scopeId >= links) {
                out->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
                continue;
            }
            out->value.ullVal = f->value.ullVal / links;
        }
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *device, int type, int counter,
                                                unsigned long long *count) {
    DEVICE_CALL(nvmlDeviceGetTotalEccErrors, device)
    GPU_ONLY()
    if (type < 0 || type > 1 || counter < 0 || counter > 1) return NVML_ERROR_INVALID_ARGUMENT;
    static const int keys[2][2] = {{KEY_ecc_cor_volatile, KEY_ecc_cor_aggregate},
                                   {KEY_ecc_unc_volatile, KEY_ecc_unc_aggregate}};
    *count = g->v[keys[type][counter]];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(void *device, unsigned *corr, unsigned *unc,
                                              unsigned *pending, unsigned *failure) {
    DEVICE_CALL(nvmlDeviceGetRemappedRows, device)
    GPU_ONLY()
    *corr = g->fields[FI_REMAPPED_COR].value.uiVal;
    *unc = g->fields[FI_REMAPPED_UNC].value.uiVal;
    *pending = g->fields[FI_REMAPPED_PENDING].value.uiVal;
    *failure = g->fields[FI_REMAPPED_FAILURE].value.uiVal;
    return NVML_SUCCESS;
}

/* ---- processes ---------------------------------------------------------------------------- */

#ifndef FAKE_NVML_NO_PROCESSES_V3
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned *count,
                                                            nvmlProcessInfo_t *infos) {
    DEVICE_CALL(nvmlDeviceGetComputeRunningProcesses_v3, device)
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    const fake_proc_t *selected[FAKE_MAX_PROCS];
    unsigned n = 0;
    for (int i = 0; i < g->n_procs; i++) {
        const fake_proc_t *p = &g->procs[i];
        if (h->kind == KIND_MIG && (p->gi != g->mig[h->mig].gi || p->ci != g->mig[h->mig].ci))
            continue;
        selected[n++] = p;
    }
    if (infos == NULL || *count < n) {
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        infos[i].pid = selected[i]->pid;
        infos[i].usedGpuMemory = selected[i]->mem;
        infos[i].gpuInstanceId = selected[i]->gi;
        infos[i].computeInstanceId = selected[i]->ci;
    }
    *count = n;
    return NVML_SUCCESS;
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(void *device,
                                                    nvmlProcessUtilizationSample_t *samples,
                                                    unsigned *count,
                                                    unsigned long long last_seen) {
    DEVICE_CALL(nvmlDeviceGetProcessUtilization, device)
    GPU_ONLY()
    if (g->v[KEY_mig_mode]) return NVML_ERROR_NOT_SUPPORTED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    g->v[KEY_last_util_ts] = last_seen;
    unsigned n = 0;
    for (int i = 0; i < g->n_procs; i++)
        if (g->procs[i].ts > last_seen) n++;
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (samples == NULL || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned k = 0;
    for (int i = 0; i < g->n_procs; i++) {
        const fake_proc_t *p = &g->procs[i];
        if (p->ts <= last_seen) continue;
        samples[k].pid = p->pid;
        samples[k].timeStamp = p->ts;
        samples[k].smUtil = p->sm;
        samples[k].memUtil = p->memutil;
        samples[k].encUtil = 0;
        samples[k].decUtil = 0;
        k++;
    }
    *count = k;
    return NVML_SUCCESS;
}

/* ---- MIG ---------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(void *device, unsigned *current, unsigned *pending) {
    DEVICE_CALL(nvmlDeviceGetMigMode, device)
    GPU_ONLY()
    *current = (unsigned)g->v[KEY_mig_mode];
    *pending = (unsigned)g->v[KEY_mig_pending];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *device, unsigned *count) {
    DEVICE_CALL(nvmlDeviceGetMaxMigDeviceCount, device)
    GPU_ONLY()
    *count = (unsigned)g->v[KEY_max_mig];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *device, unsigned index,
                                                        void **mig) {
    DEVICE_CALL(nvmlDeviceGetMigDeviceHandleByIndex, device)
    if (h->kind != KIND_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->v[KEY_mig_mode]) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= g->v[KEY_max_mig]) return NVML_ERROR_INVALID_ARGUMENT;
    if ((int)index >= g->n_mig) return NVML_ERROR_NOT_FOUND;
    *mig = &g->mig[index].h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *mig, void **device) {
    DEVICE_CALL(nvmlDeviceGetDeviceHandleFromMigDeviceHandle, mig)
    if (h->kind != KIND_MIG) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g->h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *device, unsigned *is_mig) {
    DEVICE_CALL(nvmlDeviceIsMigDeviceHandle, device)
    *is_mig = h->kind == KIND_MIG;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *device, unsigned *id) {
    DEVICE_CALL(nvmlDeviceGetGpuInstanceId, device)
    if (h->kind != KIND_MIG) return NVML_ERROR_INVALID_ARGUMENT;
    *id = g->mig[h->mig].gi;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *device, unsigned *id) {
    DEVICE_CALL(nvmlDeviceGetComputeInstanceId, device)
    if (h->kind != KIND_MIG) return NVML_ERROR_INVALID_ARGUMENT;
    *id = g->mig[h->mig].ci;
    return NVML_SUCCESS;
}

/* ---- events ------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlEventSetCreate(void **set) {
    GLOBAL_CALL(nvmlEventSetCreate)
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < FAKE_MAX_EVENT_SETS; i++) {
        if (!event_sets[i].used) {
            memset(&event_sets[i], 0, sizeof event_sets[i]);
            event_sets[i].used = 1;
            *set = &event_sets[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_UNKNOWN;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *device, unsigned long long *types) {
    DEVICE_CALL(nvmlDeviceGetSupportedEventTypes, device)
    GPU_ONLY()
    *types = g->v[KEY_supported_events];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set) {
    DEVICE_CALL(nvmlDeviceRegisterEvents, device)
    GPU_ONLY()
    fake_event_set_t *s = resolve_set(set);
    if (s == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~g->v[KEY_supported_events]) return NVML_ERROR_NOT_SUPPORTED;
    s->mask[h->gpu] |= types;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned timeout_ms) {
    GLOBAL_CALL(nvmlEventSetWait_v2)
    last_wait_timeout_ms = timeout_ms; /* recorded, but never waited for: see the header */
    fake_event_set_t *s = resolve_set(set);
    if (s == NULL || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (s->len == 0) return NVML_ERROR_TIMEOUT;
    int gpu = s->queue[s->head].gpu;
    data->device = &gpus[gpu].h;
    data->eventType = s->queue[s->head].type;
    data->eventData = s->queue[s->head].data;
    data->gpuInstanceId = NO_INSTANCE;
    data->computeInstanceId = NO_INSTANCE;
    s->head = (s->head + 1) % FAKE_EVENT_QUEUE;
    s->len--;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(void *set) {
    count_call(SYM_nvmlEventSetFree, -1);
    fake_event_set_t *s = resolve_set(set);
    if (s == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t e = injected(SYM_nvmlEventSetFree, -1);
    if (e != NVML_SUCCESS) return e;
    s->used = 0;
    return NVML_SUCCESS;
}

/* ======================================================================================== */
/* Control API for tests (not part of NVML). Functions return 0 on success, a negative value  */
/* for a bad argument: -1 unknown key or symbol, -2 GPU index out of range, -3 other.          */
/* ======================================================================================== */

static int valid_gpu(int gpu) { return gpu >= 0 && gpu < n_gpus; }

EXPORT void fake_reset(int n) {
    if (n < 0) n = 0;
    if (n > FAKE_MAX_GPUS) n = FAKE_MAX_GPUS;
    n_gpus = n;
    sample_clock_us = 0;
    for (int i = 0; i < FAKE_MAX_GPUS; i++) default_gpu(i);
    copy_str(driver_version, sizeof driver_version, "580.65.06");
    n_errors = 0;
    memset(calls, 0, sizeof calls);
    memset(event_sets, 0, sizeof event_sets);
    last_wait_timeout_ms = ULLONG_MAX;
}

__attribute__((constructor)) static void fake_load(void) { fake_reset(8); }

EXPORT int fake_max_gpus(void) { return FAKE_MAX_GPUS; }

EXPORT int fake_set_u64(int gpu, const char *key, unsigned long long value) {
    if (!valid_gpu(gpu)) return -2;
    for (int k = 0; k < KEY_COUNT; k++) {
        if (strcmp(key, key_names[k]) == 0) {
            gpus[gpu].v[k] = value;
            return 0;
        }
    }
    return -1;
}

/* gpu = -1 reads global state: "init_refcount", "event_sets" (open sets), "n_gpus",
 * "last_wait_timeout_ms" (of the last nvmlEventSetWait_v2). */
EXPORT int fake_get_u64(int gpu, const char *key, unsigned long long *out) {
    if (gpu == -1) {
        if (strcmp(key, "init_refcount") == 0) *out = (unsigned long long)init_refcount;
        else if (strcmp(key, "last_wait_timeout_ms") == 0) *out = last_wait_timeout_ms;
        else if (strcmp(key, "n_gpus") == 0) *out = (unsigned long long)n_gpus;
        else if (strcmp(key, "event_sets") == 0) {
            *out = 0;
            for (int i = 0; i < FAKE_MAX_EVENT_SETS; i++) *out += (unsigned)event_sets[i].used;
        } else return -1;
        return 0;
    }
    if (!valid_gpu(gpu)) return -2;
    for (int k = 0; k < KEY_COUNT; k++) {
        if (strcmp(key, key_names[k]) == 0) {
            *out = gpus[gpu].v[k];
            return 0;
        }
    }
    return -1;
}

/* Keys: "name", "uuid", "pci_bus_id"; with gpu = -1: "driver_version". */
EXPORT int fake_set_str(int gpu, const char *key, const char *value) {
    if (gpu == -1 && strcmp(key, "driver_version") == 0) {
        copy_str(driver_version, sizeof driver_version, value);
        return 0;
    }
    if (!valid_gpu(gpu)) return -2;
    fake_gpu_t *g = &gpus[gpu];
    if (strcmp(key, "name") == 0) copy_str(g->name, sizeof g->name, value);
    else if (strcmp(key, "uuid") == 0) copy_str(g->uuid, sizeof g->uuid, value);
    else if (strcmp(key, "pci_bus_id") == 0) copy_str(g->pci_bus_id, sizeof g->pci_bus_id, value);
    else return -1;
    return 0;
}

EXPORT int fake_get_str(int gpu, const char *key, char *out, unsigned len) {
    if (gpu == -1 && strcmp(key, "driver_version") == 0) return put_str(out, len, driver_version) ? -3 : 0;
    if (!valid_gpu(gpu)) return -2;
    const fake_gpu_t *g = &gpus[gpu];
    const char *src;
    if (strcmp(key, "name") == 0) src = g->name;
    else if (strcmp(key, "uuid") == 0) src = g->uuid;
    else if (strcmp(key, "pci_bus_id") == 0) src = g->pci_bus_id;
    else return -1;
    return put_str(out, len, src) ? -3 : 0;
}

/* An integer-typed field value (value_type one of NVML_VALUE_TYPE_* except DOUBLE). */
EXPORT int fake_set_field_u64(int gpu, unsigned field_id, unsigned value_type,
                              unsigned long long value) {
    if (!valid_gpu(gpu)) return -2;
    if (field_id >= FAKE_MAX_FIELDS || value_type == VT_DOUBLE || value_type > VT_USHORT) return -3;
    set_field_ull(&gpus[gpu], field_id, value_type, value);
    return 0;
}

EXPORT int fake_set_field_double(int gpu, unsigned field_id, double value) {
    if (!valid_gpu(gpu)) return -2;
    if (field_id >= FAKE_MAX_FIELDS) return -3;
    fake_field_t *f = &gpus[gpu].fields[field_id];
    f->set = 1;
    f->ret = NVML_SUCCESS;
    f->valueType = VT_DOUBLE;
    f->value.dVal = value;
    return 0;
}

/* The nvmlReturn of one field's entry (0 restores the value). */
EXPORT int fake_set_field_return(int gpu, unsigned field_id, int code) {
    if (!valid_gpu(gpu)) return -2;
    if (field_id >= FAKE_MAX_FIELDS) return -3;
    gpus[gpu].fields[field_id].set = 1;
    gpus[gpu].fields[field_id].ret = code;
    return 0;
}

EXPORT int fake_set_field_unsupported(int gpu, unsigned field_id) {
    return fake_set_field_return(gpu, field_id, NVML_ERROR_NOT_SUPPORTED);
}

/* Replaces the GPU's compute processes. mem[i] = ULLONG_MAX means "not available". Every call
 * stamps a fresh utilisation sample per process (newer than any earlier one). */
EXPORT int fake_set_processes(int gpu, int n, const unsigned *pids, const unsigned long long *mem,
                              const unsigned *sm_util, const unsigned *mem_util) {
    if (!valid_gpu(gpu)) return -2;
    if (n < 0 || n > FAKE_MAX_PROCS) return -3;
    fake_gpu_t *g = &gpus[gpu];
    g->n_procs = n;
    ++sample_clock_us;
    for (int i = 0; i < n; i++) {
        g->procs[i].pid = pids[i];
        g->procs[i].mem = mem[i];
        g->procs[i].sm = sm_util[i];
        g->procs[i].memutil = mem_util[i];
        g->procs[i].gi = NO_INSTANCE;
        g->procs[i].ci = NO_INSTANCE;
        g->procs[i].ts = sample_clock_us;
    }
    return 0;
}

/* Places process i (as set by fake_set_processes) in a MIG GPU/compute instance. */
EXPORT int fake_set_process_instance(int gpu, int i, unsigned gi, unsigned ci) {
    if (!valid_gpu(gpu)) return -2;
    if (i < 0 || i >= gpus[gpu].n_procs) return -3;
    gpus[gpu].procs[i].gi = gi;
    gpus[gpu].procs[i].ci = ci;
    return 0;
}

/* MIG mode on with n default devices (n = 0: MIG mode off). */
EXPORT int fake_set_mig(int gpu, int n) {
    if (!valid_gpu(gpu)) return -2;
    if (n < 0 || n > FAKE_MAX_MIG) return -3;
    fake_gpu_t *g = &gpus[gpu];
    g->n_mig = n;
    g->v[KEY_mig_mode] = n > 0;
    g->v[KEY_mig_pending] = n > 0;
    for (int i = 0; i < FAKE_MAX_MIG; i++) default_mig(g, gpu, i);
    return 0;
}

EXPORT int fake_set_mig_device(int gpu, int i, const char *uuid, const char *name, unsigned gi,
                               unsigned ci, unsigned long long mem_total,
                               unsigned long long mem_used, unsigned long long mem_reserved) {
    if (!valid_gpu(gpu)) return -2;
    if (i < 0 || i >= gpus[gpu].n_mig) return -3;
    fake_mig_t *m = &gpus[gpu].mig[i];
    copy_str(m->uuid, sizeof m->uuid, uuid);
    copy_str(m->name, sizeof m->name, name);
    m->gi = gi;
    m->ci = ci;
    m->mem_total = mem_total;
    m->mem_used = mem_used;
    m->mem_reserved = mem_reserved;
    return 0;
}

/* Queues an event on every open event set where the GPU registered for its type. Returns the
 * number of sets it was queued on (0: nobody listens), or a negative error. */
EXPORT int fake_push_event(int gpu, unsigned long long type, unsigned long long data) {
    if (!valid_gpu(gpu)) return -2;
    int queued = 0;
    for (int i = 0; i < FAKE_MAX_EVENT_SETS; i++) {
        fake_event_set_t *s = &event_sets[i];
        if (!s->used || !(s->mask[gpu] & type) || s->len == FAKE_EVENT_QUEUE) continue;
        int tail = (s->head + s->len) % FAKE_EVENT_QUEUE;
        s->queue[tail].gpu = gpu;
        s->queue[tail].type = type;
        s->queue[tail].data = data;
        s->len++;
        queued++;
    }
    return queued;
}

EXPORT int fake_push_xid(int gpu, unsigned long long xid) {
    return fake_push_event(gpu, EVENT_XID, xid);
}

/* symbol: an exported NVML name or "*" (every call that concerns one GPU); gpu: index or -1 for
 * all; code: the nvmlReturn_t to return (0 removes the rule). Later rules for the same
 * (symbol, gpu) replace earlier ones. */
EXPORT int fake_set_error(const char *symbol, int gpu, int code) {
    int sym = sym_index(symbol);
    if (sym == -2) return -1;
    if (gpu < -1 || gpu >= FAKE_MAX_GPUS) return -2;
    for (int i = 0; i < n_errors; i++) {
        if (errors[i].sym == sym && errors[i].gpu == gpu) {
            if (code == 0) errors[i] = errors[--n_errors];
            else errors[i].code = code;
            return 0;
        }
    }
    if (code == 0) return 0;
    if (n_errors == FAKE_MAX_ERRORS) return -3;
    errors[n_errors++] = (fake_error_t){sym, gpu, code};
    return 0;
}

EXPORT void fake_clear_errors(void) { n_errors = 0; }

/* Calls of one symbol: gpu = -1 sums every GPU and the calls that concern none. */
EXPORT long long fake_calls_gpu(const char *symbol, int gpu) {
    int sym = sym_index(symbol);
    if (sym < 0) return -1;
    if (gpu == -1) {
        unsigned long long total = 0;
        for (int i = 0; i <= FAKE_MAX_GPUS; i++) total += calls[sym][i];
        return (long long)total;
    }
    if (gpu < 0 || gpu >= FAKE_MAX_GPUS) return -2;
    return (long long)calls[sym][gpu];
}

EXPORT long long fake_calls(const char *symbol) { return fake_calls_gpu(symbol, -1); }

EXPORT void fake_reset_calls(void) { memset(calls, 0, sizeof calls); }

/* The name of symbol i (for listing counters); NULL past the end. */
EXPORT const char *fake_symbol_name(int i) {
    return (i >= 0 && i < SYM_COUNT) ? sym_names[i] : NULL;
}
