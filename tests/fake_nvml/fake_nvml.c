/*
 * A fake libnvidia-ml.so.1 for the metrics tests (the NVML calls the exporter makes through
 * nvidia-ml-py) and for NVIDIA's real nvidia-smi (the calls it makes for the agent's command
 * lines, its private export table included: see the end of this file), answering from a
 * description file (env FAKE_NVML_DESCRIPTION), one "key value" per line:
 *
 *   driver_version 550.54.15     init_error 9 (nvmlInit fails with it)
 *   cc.feature 1  cc.devtools 0  cc.multigpu 0  cc.ready 1  cc.error 3
 *   gpus 2
 *   gpu.0.uuid GPU-...  gpu.0.name NVIDIA H100 80GB HBM3  gpu.0.pci 00000000:04:00.0
 *   gpu.0.temp 41  gpu.0.temp.slowdown 90  gpu.0.temp.shutdown 95  gpu.0.temp.gpu_max 87
 *   gpu.0.ecc.sbe_vol ..sbe_agg ..dbe_vol ..dbe_agg  gpu.0.retired.sbe 0 ..dbe 0 ..pending 0
 *   gpu.0.remap.correctable 0 ..uncorrectable 0 ..pending 0 ..failure 0  gpu.0.pcie_replay 0
 *   gpu.0.power_mw 70000  gpu.0.energy_mj 123  gpu.0.clock.sm 1980  gpu.0.clock.mem 2619
 *   gpu.0.util.gpu 3 ..memory 1 ..encoder 0 ..decoder 0
 *   gpu.0.mem.total (bytes) ..free ..used ..reserved   gpu.0.lost 1 (fallen off the bus)
 *   gpu.0.fabric.state 3 (NVML_GPU_FABRIC_STATE_*: 0 not supported .. 3 completed)
 *   gpu.0.fabric.status 0 (an nvmlReturn_t)   gpu.0.fabric.clique 1
 *   gpu.0.recovery_action 1 (nvmlDeviceGpuRecoveryAction_t, through nvmlDeviceGetFieldValues)
 *   error.<function>[.<gpu>] <NVML return code>     hang.<function>[.<gpu>] 1
 *   log <path>  (each call appends "<function> <gpu or ->")
 *   for NVIDIA's real nvidia-smi (tests/test_real_nvidia_smi.py): nvml_version 12.535.261.03
 *   (nvmlSystemGetNVMLVersion, also before init; 535 or later picks error 28's name),
 *   gpu.0.arch 9 (NVML_DEVICE_ARCH_*, Hopper by default), gpu.0.mig 0|1,
 *   gpu.0.mig.instances 2, cc.ready_file <path> (the CC ready state, kept across runs)
 *
 * A key given twice: the last line counts.
 *
 * A field a GPU lacks answers NVML_ERROR_NOT_SUPPORTED, as a GPU without the feature does.
 * Built with -DFAKE_NVML_BRANCH=535, it lacks what Debian 12's real 535.309.01 library lacks of
 * these calls (nvmlDeviceGetTemperatureV, nvmlSystemGetConfComputeSettings,
 * nvmlDeviceGetGpuFabricInfoV: 535.261.03 exports only nvmlDeviceGetGpuFabricInfo), so nvidia-ml-py
 * raises FunctionNotFound for them. Error strings and the before-init answers are those of that
 * real library (tests/test_metrics_nvml_real.py compares them).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SUCCESS 0
#define ERR_UNINITIALIZED 1
#define ERR_INVALID_ARGUMENT 2
#define ERR_NOT_SUPPORTED 3
#define ERR_INSUFFICIENT_SIZE 7
#define ERR_GPU_IS_LOST 15
#define ERR_ARGUMENT_VERSION_MISMATCH 25

#define MAX_ENTRIES 2048
#define MAX_GPUS 64

typedef struct { int opaque; } device_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} pci_info_t;
typedef struct { unsigned long long total, free, used; } memory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } memory_v2_t;
typedef struct { unsigned int gpu, memory; } utilization_t;
typedef struct { unsigned int environment, ccFeature, devToolsMode; } cc_state_t;
typedef struct { unsigned int version, environment, ccFeature, devToolsMode, multiGpuMode; } cc_settings_t;
typedef struct { unsigned int version; int sensorType; int temperature; } temperature_v1_t;
/* nvml.h nvmlGpuFabricInfo_t and nvmlGpuFabricInfo_v2_t (nvmlGpuFabricInfoV_t) */
typedef struct { unsigned char clusterUuid[16]; unsigned int status, cliqueId, state; } fabric_info_t;
typedef struct {
    unsigned int version; unsigned char clusterUuid[16]; unsigned int status, cliqueId, state, healthMask;
} fabric_info_v2_t;

/* struct versions as nvml.h makes them: sizeof | version << 24 */
#define MEMORY_V2 (unsigned int)(sizeof(memory_v2_t) | 2 << 24)
#define CC_SETTINGS_V1 (unsigned int)(sizeof(cc_settings_t) | 1 << 24)
#define TEMPERATURE_V1 (unsigned int)(sizeof(temperature_v1_t) | 1 << 24)
#define FABRIC_INFO_V2 (unsigned int)(sizeof(fabric_info_v2_t) | 2 << 24)

static char *keys[MAX_ENTRIES], *values[MAX_ENTRIES];
static int entries, initialised;
static device_t devices[MAX_GPUS];

/* Without FAKE_NVML_DESCRIPTION, the description beside the library itself
 * (<dir of libnvidia-ml.so.1>/fake-nvml.description): nvidia-ctk passes its children, and gets
 * from the agent, only PATH, LD_LIBRARY_PATH and LD_PRELOAD (issue 36), so a world puts the
 * library and its description in its root. */
static const char *description_path(char *buffer, size_t size) {
    const char *path = getenv("FAKE_NVML_DESCRIPTION");
    Dl_info info;
    char *slash;
    if (path) return path;
    if (!dladdr((void *)description_path, &info) || !info.dli_fname) return NULL;
    snprintf(buffer, size, "%s", info.dli_fname);
    slash = strrchr(buffer, '/');
    if (!slash) return NULL;
    snprintf(slash + 1, size - (size_t)(slash + 1 - buffer), "fake-nvml.description");
    return buffer;
}

static void load(void) {
    char beside[PATH_MAX];
    const char *path = description_path(beside, sizeof beside);
    char line[1024];
    FILE *f = path ? fopen(path, "r") : NULL;
    for (int i = 0; i < entries; i++) { free(keys[i]); free(values[i]); }
    entries = 0;
    if (!f) return;
    while (entries < MAX_ENTRIES && fgets(line, sizeof line, f)) {
        char *space = strchr(line, ' ');
        line[strcspn(line, "\n")] = 0;
        if (!space || line[0] == '#') continue;
        *space = 0;
        keys[entries] = strdup(line);
        values[entries++] = strdup(space + 1);
    }
    fclose(f);
}

/* The last line with the key counts: a test appends what it overrides. */
static const char *get(const char *key) {
    for (int i = entries - 1; i >= 0; i--)
        if (strcmp(keys[i], key) == 0) return values[i];
    return NULL;
}

static const char *gpu_get(int gpu, const char *field) {
    char key[160];
    snprintf(key, sizeof key, "gpu.%d.%s", gpu, field);
    return get(key);
}

static const char *call_get(const char *what, const char *function, int gpu) {
    char key[160];
    const char *value;
    snprintf(key, sizeof key, "%s.%s.%d", what, function, gpu);
    if (gpu >= 0 && (value = get(key))) return value;
    snprintf(key, sizeof key, "%s.%s", what, function);
    return get(key);
}

/* Every call starts here: log it, hang or fail as described. */
static int enter(const char *function, int gpu) {
    const char *log = get("log"), *error;
    if (log) {
        FILE *f = fopen(log, "a");
        if (f) {
            if (gpu >= 0) fprintf(f, "%s %d\n", function, gpu); else fprintf(f, "%s -\n", function);
            fclose(f);
        }
    }
    if (call_get("hang", function, gpu))
        for (;;) sleep(1000); /* a wedged GPU: the call never returns */
    if ((error = call_get("error", function, gpu))) return atoi(error);
    return SUCCESS;
}

static int index_of(device_t *device) {
    long i = device - devices;
    return (device && i >= 0 && i < MAX_GPUS) ? (int)i : -1;
}

/* The start of every device call: `gpu` is the GPU's index; returns an NVML error code when the
 * call must fail. */
#define DEVICE_CALL(name, device) \
    int gpu = index_of(device); \
    if (!initialised) return ERR_UNINITIALIZED; \
    if (gpu < 0) return ERR_INVALID_ARGUMENT; \
    { int rc = enter(name, gpu); if (rc) return rc; } \
    if (gpu_get(gpu, "lost")) return ERR_GPU_IS_LOST;

static int number(int gpu, const char *field, unsigned long long *out) {
    const char *value = gpu_get(gpu, field);
    if (!value) return ERR_NOT_SUPPORTED;
    *out = strtoull(value, NULL, 10);
    return SUCCESS;
}

static int number_u(int gpu, const char *field, unsigned int *out) {
    unsigned long long v;
    int rc = number(gpu, field, &v);
    if (rc == SUCCESS) *out = (unsigned int)v;
    return rc;
}

static int text(const char *value, char *out, unsigned int length) {
    if (!value) return ERR_NOT_SUPPORTED;
    if (strlen(value) + 1 > length) return ERR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return SUCCESS;
}

static int system_number(const char *key, unsigned int *out) {
    const char *value = get(key);
    *out = value ? (unsigned int)strtoul(value, NULL, 10) : 0;
    return SUCCESS;
}

int nvmlInitWithFlags(unsigned int flags) {
    const char *error;
    (void)flags;
    load();
    if ((error = get("init_error")) && atoi(error)) return atoi(error);
    enter("nvmlInit", -1);
    initialised++;
    return SUCCESS;
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    if (initialised) initialised--;
    return SUCCESS; /* the real 535 library answers 0 also when it was never initialised */
}

const char *nvmlErrorString(int result) {
    static const char *strings[] = {
        "Success", "Uninitialized", "Invalid Argument", "Not Supported",
        "Insufficient Permissions", "Already Initialized", "Not Found", "Insufficient Size",
        "Insufficient External Power", "Driver Not Loaded", "Timeout", "Interrupt Request Issue",
        "NVML Shared Library Not Found", "Function Not Found", "Corrupted infoROM", "GPU is lost",
        "GPU requires reset", "GPU access blocked by the operating system",
        "Driver/library version mismatch", "In use by another client", "Insufficient Memory",
        "No data", "vGPU ECC not supported", "Insufficient Resources", "Invalid Frequency",
        "Argument version mismatch", "Requested functionality has been deprecated",
        "System is not in ready state"};
    const char *version = get("nvml_version");
    if (result >= 0 && result < (int)(sizeof strings / sizeof *strings)) return strings[result];
    /* NVML_ERROR_GPU_NOT_FOUND: the 550 and 555 libraries name it, 535's does not
     * (nvidia-smi-real.md, nvmlInit -> 28) */
    if (result == 28 && version && strncmp(version, "12.535.", 7) != 0) return "No supported GPUs were found";
    return "Unknown Error";
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    int rc;
    if (!initialised) return ERR_UNINITIALIZED;
    if ((rc = enter("nvmlSystemGetDriverVersion", -1))) return rc;
    return text(get("driver_version"), version, length);
}

#if FAKE_NVML_BRANCH != 535
int nvmlSystemGetConfComputeSettings(cc_settings_t *settings) {
    int rc;
    if (!initialised) return ERR_UNINITIALIZED;
    if ((rc = enter("nvmlSystemGetConfComputeSettings", -1))) return rc;
    if (get("cc.error")) return atoi(get("cc.error"));
    if (!settings) return ERR_INVALID_ARGUMENT;
    if (settings->version != CC_SETTINGS_V1) return ERR_ARGUMENT_VERSION_MISMATCH;
    system_number("cc.environment", &settings->environment);
    system_number("cc.feature", &settings->ccFeature);
    system_number("cc.devtools", &settings->devToolsMode);
    return system_number("cc.multigpu", &settings->multiGpuMode);
}
#endif

int nvmlSystemGetConfComputeState(cc_state_t *state) {
    int rc;
    if (!initialised) return ERR_UNINITIALIZED;
    if ((rc = enter("nvmlSystemGetConfComputeState", -1))) return rc;
    if (get("cc.error")) return atoi(get("cc.error"));
    if (!state) return ERR_INVALID_ARGUMENT;
    system_number("cc.environment", &state->environment);
    system_number("cc.feature", &state->ccFeature);
    return system_number("cc.devtools", &state->devToolsMode);
}

int nvmlSystemGetConfComputeGpusReadyState(unsigned int *accepting) {
    int rc;
    if (!initialised) return ERR_UNINITIALIZED;
    if ((rc = enter("nvmlSystemGetConfComputeGpusReadyState", -1))) return rc;
    if (get("cc.error")) return atoi(get("cc.error"));
    if (get("cc.ready_file")) {
        FILE *f = fopen(get("cc.ready_file"), "r");
        if (f) {
            int read = fscanf(f, "%u", accepting);
            fclose(f);
            if (read == 1) return SUCCESS;
        }
    }
    return system_number("cc.ready", accepting);
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    int rc;
    if (!initialised) return ERR_UNINITIALIZED;
    if ((rc = enter("nvmlDeviceGetCount", -1))) return rc;
    return system_number("gpus", count);
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, device_t **device) {
    unsigned int count;
    int rc;
    if (!initialised) return ERR_UNINITIALIZED;
    if ((rc = enter("nvmlDeviceGetHandleByIndex", (int)index))) return rc;
    system_number("gpus", &count);
    if (index >= count || index >= MAX_GPUS) return ERR_INVALID_ARGUMENT;
    if (gpu_get((int)index, "lost")) return ERR_GPU_IS_LOST;
    *device = &devices[index];
    return SUCCESS;
}

/* What nvidia-ctk's cdi generate calls besides (../shared/nvidia-ctk-real.md, issue 36): a
 * missing one kills it (symbol lookup error, exit 127). The minor is gpu.N.minor, else N. */
int nvmlDeviceGetMinorNumber(device_t *device, unsigned int *minor) {
    DEVICE_CALL("nvmlDeviceGetMinorNumber", device)
    if (number_u(gpu, "minor", minor) != SUCCESS) *minor = (unsigned int)gpu;
    return SUCCESS;
}

int nvmlDeviceGetHandleByUUID(const char *uuid, device_t **device) {
    const char *count = get("gpus");
    int n = count ? atoi(count) : 0, rc;
    if (!initialised) return ERR_UNINITIALIZED;
    if (!uuid || !device) return ERR_INVALID_ARGUMENT;
    if ((rc = enter("nvmlDeviceGetHandleByUUID", -1))) return rc;
    for (int i = 0; i < n && i < MAX_GPUS; i++) {
        const char *value = gpu_get(i, "uuid");
        if (value && strcmp(value, uuid) == 0) {
            *device = &devices[i];
            return SUCCESS;
        }
    }
    return 6; /* NVML_ERROR_NOT_FOUND */
}

int nvmlDeviceIsMigDeviceHandle(device_t *device, unsigned int *isMigDevice) {
    DEVICE_CALL("nvmlDeviceIsMigDeviceHandle", device)
    *isMigDevice = 0; /* every handle here is a whole GPU's */
    return SUCCESS;
}

int nvmlDeviceGetUUID(device_t *device, char *uuid, unsigned int length) {
    DEVICE_CALL("nvmlDeviceGetUUID", device)
    return text(gpu_get(gpu, "uuid"), uuid, length);
}

int nvmlDeviceGetName(device_t *device, char *name, unsigned int length) {
    DEVICE_CALL("nvmlDeviceGetName", device)
    return text(gpu_get(gpu, "name"), name, length);
}

int nvmlDeviceGetPciInfo_v3(device_t *device, pci_info_t *pci) {
    const char *bus_id;
    DEVICE_CALL("nvmlDeviceGetPciInfo", device)
    if (!(bus_id = gpu_get(gpu, "pci"))) return ERR_NOT_SUPPORTED;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", bus_id + 4);
    sscanf(bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    return SUCCESS;
}

#if FAKE_NVML_BRANCH != 535
int nvmlDeviceGetTemperatureV(device_t *device, temperature_v1_t *temperature) {
    unsigned int value;
    int rc;
    DEVICE_CALL("nvmlDeviceGetTemperatureV", device)
    if (temperature->version != TEMPERATURE_V1) return ERR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != 0) return ERR_INVALID_ARGUMENT;
    if ((rc = number_u(gpu, "temp", &value))) return rc;
    temperature->temperature = (int)value;
    return SUCCESS;
}
#endif

int nvmlDeviceGetTemperature(device_t *device, int sensor, unsigned int *temp) {
    DEVICE_CALL("nvmlDeviceGetTemperature", device)
    if (sensor != 0) return ERR_INVALID_ARGUMENT;
    return number_u(gpu, "temp", temp);
}

int nvmlDeviceGetTemperatureThreshold(device_t *device, int threshold, unsigned int *temp) {
    static const char *fields[] = {"temp.shutdown", "temp.slowdown", "temp.mem_max", "temp.gpu_max"};
    DEVICE_CALL("nvmlDeviceGetTemperatureThreshold", device)
    if (threshold < 0 || threshold > 3) return ERR_NOT_SUPPORTED;
    return number_u(gpu, fields[threshold], temp);
}

int nvmlDeviceGetTotalEccErrors(device_t *device, int error_type, int counter_type,
                                unsigned long long *count) {
    static const char *fields[2][2] = {{"ecc.sbe_vol", "ecc.sbe_agg"}, {"ecc.dbe_vol", "ecc.dbe_agg"}};
    DEVICE_CALL("nvmlDeviceGetTotalEccErrors", device)
    if (error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1)
        return ERR_INVALID_ARGUMENT;
    return number(gpu, fields[error_type][counter_type], count);
}

int nvmlDeviceGetRetiredPages(device_t *device, int cause, unsigned int *page_count,
                              unsigned long long *addresses) {
    unsigned int pages;
    int rc;
    DEVICE_CALL("nvmlDeviceGetRetiredPages", device)
    if (cause < 0 || cause > 1) return ERR_INVALID_ARGUMENT;
    if ((rc = number_u(gpu, cause ? "retired.dbe" : "retired.sbe", &pages))) return rc;
    if (*page_count < pages || (pages && !addresses)) {
        *page_count = pages;
        return ERR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < pages; i++) addresses[i] = 0x1000ULL * (i + 1);
    *page_count = pages;
    return SUCCESS;
}

int nvmlDeviceGetRetiredPagesPendingStatus(device_t *device, int *pending) {
    unsigned int value;
    int rc;
    DEVICE_CALL("nvmlDeviceGetRetiredPagesPendingStatus", device)
    if ((rc = number_u(gpu, "retired.pending", &value))) return rc;
    *pending = (int)value;
    return SUCCESS;
}

int nvmlDeviceGetRemappedRows(device_t *device, unsigned int *correctable, unsigned int *uncorrectable,
                              unsigned int *pending, unsigned int *failure) {
    int rc;
    DEVICE_CALL("nvmlDeviceGetRemappedRows", device)
    if ((rc = number_u(gpu, "remap.correctable", correctable))) return rc;
    if ((rc = number_u(gpu, "remap.uncorrectable", uncorrectable))) return rc;
    if ((rc = number_u(gpu, "remap.pending", pending))) return rc;
    return number_u(gpu, "remap.failure", failure);
}

int nvmlDeviceGetPcieReplayCounter(device_t *device, unsigned int *value) {
    DEVICE_CALL("nvmlDeviceGetPcieReplayCounter", device)
    return number_u(gpu, "pcie_replay", value);
}

int nvmlDeviceGetPowerUsage(device_t *device, unsigned int *milliwatts) {
    DEVICE_CALL("nvmlDeviceGetPowerUsage", device)
    return number_u(gpu, "power_mw", milliwatts);
}

int nvmlDeviceGetTotalEnergyConsumption(device_t *device, unsigned long long *millijoules) {
    DEVICE_CALL("nvmlDeviceGetTotalEnergyConsumption", device)
    return number(gpu, "energy_mj", millijoules);
}

int nvmlDeviceGetClockInfo(device_t *device, int type, unsigned int *mhz) {
    DEVICE_CALL("nvmlDeviceGetClockInfo", device)
    if (type == 1) return number_u(gpu, "clock.sm", mhz);
    if (type == 2) return number_u(gpu, "clock.mem", mhz);
    return ERR_NOT_SUPPORTED;
}

int nvmlDeviceGetUtilizationRates(device_t *device, utilization_t *utilization) {
    int rc;
    DEVICE_CALL("nvmlDeviceGetUtilizationRates", device)
    if ((rc = number_u(gpu, "util.gpu", &utilization->gpu))) return rc;
    return number_u(gpu, "util.memory", &utilization->memory);
}

int nvmlDeviceGetEncoderUtilization(device_t *device, unsigned int *utilization, unsigned int *period_us) {
    DEVICE_CALL("nvmlDeviceGetEncoderUtilization", device)
    *period_us = 167000;
    return number_u(gpu, "util.encoder", utilization);
}

int nvmlDeviceGetDecoderUtilization(device_t *device, unsigned int *utilization, unsigned int *period_us) {
    DEVICE_CALL("nvmlDeviceGetDecoderUtilization", device)
    *period_us = 167000;
    return number_u(gpu, "util.decoder", utilization);
}

int nvmlDeviceGetMemoryInfo(device_t *device, memory_t *memory) {
    int rc;
    DEVICE_CALL("nvmlDeviceGetMemoryInfo", device)
    if ((rc = number(gpu, "mem.total", &memory->total))) return rc;
    if ((rc = number(gpu, "mem.free", &memory->free))) return rc;
    return number(gpu, "mem.used", &memory->used);
}

int nvmlDeviceGetMemoryInfo_v2(device_t *device, memory_v2_t *memory) {
    int rc;
    DEVICE_CALL("nvmlDeviceGetMemoryInfo_v2", device)
    if (memory->version != MEMORY_V2) return ERR_ARGUMENT_VERSION_MISMATCH;
    if ((rc = number(gpu, "mem.total", &memory->total))) return rc;
    if ((rc = number(gpu, "mem.reserved", &memory->reserved))) return rc;
    if ((rc = number(gpu, "mem.free", &memory->free))) return rc;
    return number(gpu, "mem.used", &memory->used);
}

/* The fabric: state and status from the description; a GPU without fabric.state answers
 * NOT_SUPPORTED. */
static int fabric(int gpu, unsigned int *status, unsigned int *clique, unsigned int *state) {
    int rc;
    if ((rc = number_u(gpu, "fabric.state", state))) return rc;
    if (number_u(gpu, "fabric.status", status)) *status = SUCCESS;
    if (number_u(gpu, "fabric.clique", clique)) *clique = 0;
    return SUCCESS;
}

int nvmlDeviceGetGpuFabricInfo(device_t *device, fabric_info_t *info) {
    DEVICE_CALL("nvmlDeviceGetGpuFabricInfo", device)
    memset(info->clusterUuid, 0, sizeof info->clusterUuid);
    return fabric(gpu, &info->status, &info->cliqueId, &info->state);
}

#if FAKE_NVML_BRANCH != 535
int nvmlDeviceGetGpuFabricInfoV(device_t *device, fabric_info_v2_t *info) {
    DEVICE_CALL("nvmlDeviceGetGpuFabricInfoV", device)
    if (info->version != FABRIC_INFO_V2) return ERR_ARGUMENT_VERSION_MISMATCH;
    memset(info->clusterUuid, 0, sizeof info->clusterUuid);
    info->healthMask = 0;
    return fabric(gpu, &info->status, &info->cliqueId, &info->state);
}
#endif

#include "smi_calls.c"
/* nvml.h nvmlFieldValue_t (issue 28): the field-values call, for NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
 * (230, driver 565+) only, answered from gpu.N.recovery_action (an nvmlDeviceGpuRecoveryAction_t
 * number); without that key, or for any other field id, the entry's nvmlReturn is NOT_SUPPORTED
 * (the call itself succeeds, as NVML's does: each field has its own return). */
#define FI_DEV_GET_GPU_RECOVERY_ACTION 230
#define VALUE_TYPE_UNSIGNED_INT 1
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType, nvmlReturn;
    union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; long long sll;
            int si; unsigned short us; } value;
} field_value_t;

int nvmlDeviceGetFieldValues(device_t *device, int count, field_value_t *values) {
    DEVICE_CALL("nvmlDeviceGetFieldValues", device)
    if (count < 0 || (count > 0 && !values)) return ERR_INVALID_ARGUMENT;
    for (int i = 0; i < count; i++) {
        unsigned int action;
        values[i].timestamp = 0;
        values[i].latencyUsec = 0;
        if (values[i].fieldId == FI_DEV_GET_GPU_RECOVERY_ACTION &&
                number_u(gpu, "recovery_action", &action) == SUCCESS) {
            values[i].valueType = VALUE_TYPE_UNSIGNED_INT;
            values[i].value.ull = 0;
            values[i].value.ui = action;
            values[i].nvmlReturn = SUCCESS;
        } else {
            values[i].nvmlReturn = ERR_NOT_SUPPORTED;
        }
    }
    return SUCCESS;
}
