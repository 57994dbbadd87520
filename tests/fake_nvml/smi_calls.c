/*
 * The fake NVML's calls for NVIDIA's real nvidia-smi (tests/test_real_nvidia_smi.py): included
 * by fake_nvml.c, whose helpers (get, gpu_get, enter, DEVICE_CALL, number_u, text) it uses.
 */

/* ---- what NVIDIA's real nvidia-smi needs beyond nvidia-ml-py (tests/test_real_nvidia_smi.py) ---- */

/* The private export table nvidia-smi asks for right after init (../shared/nvidia-smi-real.md):
 * a size word, then function pointers. Every slot is a stub answering NOT_SUPPORTED, but for 80,
 * which formats GPU n's PCI bus id as "%04X:%02X:%02X.0" (nvidia-smi uses it in "Unable to
 * determine the device handle for GPU0000:18:00.0"). */
#define EXPORT_SLOTS 256
static const unsigned char EXPORT_TABLE_ID[16] = {
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};
static void *export_table[EXPORT_SLOTS];

/* One stub per table entry (named in octal: entry stub_0121 is slot 80), logging "slot <n>";
 * slots count from the first pointer, after the size word, as nvidia-smi-real.md numbers them. */
static int slot_stub(int entry) {
    char name[32];
    snprintf(name, sizeof name, "slot %d", entry - 1);
    enter(name, -1);
    return ERR_NOT_SUPPORTED;
}
#define STUB(n) static int stub_##n(void) { return slot_stub(n); }
#define SET(n) export_table[n] = (void *)stub_##n;
#define EIGHT(M, a) M(a##0) M(a##1) M(a##2) M(a##3) M(a##4) M(a##5) M(a##6) M(a##7)
#define ALL(M) EIGHT(M, 00) EIGHT(M, 01) EIGHT(M, 02) EIGHT(M, 03) EIGHT(M, 04) EIGHT(M, 05) \
    EIGHT(M, 06) EIGHT(M, 07) EIGHT(M, 010) EIGHT(M, 011) EIGHT(M, 012) EIGHT(M, 013) \
    EIGHT(M, 014) EIGHT(M, 015) EIGHT(M, 016) EIGHT(M, 017) EIGHT(M, 020) EIGHT(M, 021) \
    EIGHT(M, 022) EIGHT(M, 023) EIGHT(M, 024) EIGHT(M, 025) EIGHT(M, 026) EIGHT(M, 027) \
    EIGHT(M, 030) EIGHT(M, 031) EIGHT(M, 032) EIGHT(M, 033) EIGHT(M, 034) EIGHT(M, 035) \
    EIGHT(M, 036) EIGHT(M, 037)
ALL(STUB)

static int bus_id_of(unsigned int index, char *out, unsigned int length) {
    unsigned int domain = 0, bus = 0, device = 0;
    const char *pci = gpu_get((int)index, "pci");
    if (!pci || !out) return ERR_INVALID_ARGUMENT;
    sscanf(pci, "%x:%x:%x", &domain, &bus, &device);
    snprintf(out, length, "%04X:%02X:%02X.0", domain, bus, device);
    return SUCCESS;
}

int nvmlInternalGetExportTable(const void **table, const unsigned char *id) {
    enter("nvmlInternalGetExportTable", -1);
    if (!table || !id || memcmp(id, EXPORT_TABLE_ID, sizeof EXPORT_TABLE_ID)) return ERR_INVALID_ARGUMENT;
    ALL(SET)
    export_table[0] = (void *)(sizeof export_table);
    export_table[1 + 80] = (void *)bus_id_of;
    *table = export_table;
    return SUCCESS;
}

/* "12.535.261.03": answered before init too, as the genuine library does (nvidia-smi prints
 * "NVML library version: 535.261" from it after init error 18). */
int nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    char made[96];
    const char *value;
    if (!entries) load();
    if (!(value = get("nvml_version"))) {
        snprintf(made, sizeof made, "12.%s", get("driver_version") ? get("driver_version") : "0.0");
        value = made;
    }
    return text(value, version, length);
}

/* NVML_DEVICE_ARCH_*: 9 Hopper unless gpu.N.arch says otherwise. */
int nvmlDeviceGetArchitecture(device_t *device, unsigned int *arch) {
    DEVICE_CALL("nvmlDeviceGetArchitecture", device)
    if (number_u(gpu, "arch", arch)) *arch = 9;
    return SUCCESS;
}

int nvmlDeviceGetIndex(device_t *device, unsigned int *index) {
    DEVICE_CALL("nvmlDeviceGetIndex", device)
    *index = (unsigned int)gpu;
    return SUCCESS;
}

int nvmlDeviceGetMaxMigDeviceCount(device_t *device, unsigned int *count) {
    DEVICE_CALL("nvmlDeviceGetMaxMigDeviceCount", device)
    *count = 0;
    return SUCCESS;
}

/* gpu.N.mig 0|1: the current and pending MIG mode; absent: a GPU without MIG. */
int nvmlDeviceGetMigMode(device_t *device, unsigned int *current, unsigned int *pending) {
    int rc;
    DEVICE_CALL("nvmlDeviceGetMigMode", device)
    if ((rc = number_u(gpu, "mig", current))) return rc;
    *pending = *current;
    return SUCCESS;
}

/* nvml.h nvmlPciInfoExt_v1_t (550 and later ask with it for pci.bus_id). */
typedef struct {
    unsigned int version, domain, bus, device, pciDeviceId, pciSubSystemId, baseClass, subClass;
    char busId[32];
} pci_info_ext_t;
#define PCI_INFO_EXT_V1 (unsigned int)(sizeof(pci_info_ext_t) | 1 << 24)

int nvmlDeviceGetPciInfoExt(device_t *device, pci_info_ext_t *pci) {
    const char *bus_id;
    DEVICE_CALL("nvmlDeviceGetPciInfoExt", device)
    if (pci->version != PCI_INFO_EXT_V1) return ERR_ARGUMENT_VERSION_MISMATCH;
    if (!(bus_id = gpu_get(gpu, "pci"))) return ERR_NOT_SUPPORTED;
    memset(&pci->domain, 0, sizeof *pci - sizeof pci->version);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
    sscanf(bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    pci->baseClass = 3;
    pci->subClass = 2;
    return SUCCESS;
}

/* The CC ready state outlives one process (`-srs 1`, then `-grs`): with cc.ready_file <path> it
 * is read from and written to that file ("0" or "1"), else it is cc.ready. */
int nvmlSystemSetConfComputeGpusReadyState(unsigned int accepting) {
    const char *path;
    FILE *f;
    int rc;
    if (!initialised) return ERR_UNINITIALIZED;
    if ((rc = enter("nvmlSystemSetConfComputeGpusReadyState", -1))) return rc;
    if (accepting > 1) return ERR_INVALID_ARGUMENT;
    if (!(path = get("cc.ready_file"))) return ERR_NOT_SUPPORTED;
    if (!(f = fopen(path, "w"))) return ERR_NOT_SUPPORTED;
    fprintf(f, "%u\n", accepting);
    fclose(f);
    return SUCCESS;
}

/* MIG GPU instances for `nvidia-smi mig -lgi`: with gpu.N.mig 1, profile 0 (1 slice, profile id
 * 19, "MIG 1g.10gb") is the only one supported, and gpu.N.mig.instances of it exist (0 unless
 * given). nvml.h nvmlGpuInstanceProfileInfo_v2_t / _v3_t, nvmlGpuInstanceInfo_t. */
typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} gi_profile_v2_t;
typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
    unsigned int capabilities;
} gi_profile_v3_t;
typedef struct { int gpu, id; } gpu_instance_t;
typedef struct { unsigned int start, size; } gi_placement_t;
typedef struct { device_t *device; unsigned int id, profileId; gi_placement_t placement; } gi_info_t;
#define GI_PROFILE_V2 (unsigned int)(sizeof(gi_profile_v2_t) | 2 << 24)
#define GI_PROFILE_V3 (unsigned int)(sizeof(gi_profile_v3_t) | 3 << 24)
#define GI_PROFILE_ID 19
#define MAX_INSTANCES 7
static gpu_instance_t instances[MAX_GPUS][MAX_INSTANCES];

static int mig_on(int gpu) {
    unsigned int on = 0;
    return number_u(gpu, "mig", &on) == SUCCESS && on;
}

int nvmlDeviceGetGpuInstanceProfileInfoV(device_t *device, unsigned int profile, void *info) {
    unsigned int version = *(unsigned int *)info;
    DEVICE_CALL("nvmlDeviceGetGpuInstanceProfileInfoV", device)
    if (!mig_on(gpu) || profile != 0) return ERR_NOT_SUPPORTED;
    if (version == GI_PROFILE_V2) {
        gi_profile_v2_t *p = info;
        memset(p, 0, sizeof *p);
        p->version = version; p->id = GI_PROFILE_ID; p->sliceCount = 1;
        p->instanceCount = MAX_INSTANCES; p->multiprocessorCount = 16; p->memorySizeMB = 9856;
        snprintf(p->name, sizeof p->name, "MIG 1g.10gb");
        return SUCCESS;
    }
    if (version == GI_PROFILE_V3) {
        gi_profile_v3_t *p = info;
        memset(p, 0, sizeof *p);
        p->version = version; p->id = GI_PROFILE_ID; p->sliceCount = 1;
        p->instanceCount = MAX_INSTANCES; p->multiprocessorCount = 16; p->memorySizeMB = 9856;
        snprintf(p->name, sizeof p->name, "MIG 1g.10gb");
        return SUCCESS;
    }
    return ERR_ARGUMENT_VERSION_MISMATCH;
}

int nvmlDeviceGetGpuInstances(device_t *device, unsigned int profile, gpu_instance_t **out,
                              unsigned int *count) {
    unsigned int wanted = 0;
    DEVICE_CALL("nvmlDeviceGetGpuInstances", device)
    if (!mig_on(gpu) || profile != GI_PROFILE_ID) return ERR_NOT_SUPPORTED;
    if (number_u(gpu, "mig.instances", &wanted)) wanted = 0;
    if (wanted > MAX_INSTANCES) wanted = MAX_INSTANCES;
    for (unsigned int i = 0; i < wanted; i++) {
        instances[gpu][i].gpu = gpu;
        instances[gpu][i].id = (int)i + 1;
        out[i] = &instances[gpu][i];
    }
    *count = wanted;
    return SUCCESS;
}

int nvmlGpuInstanceGetInfo(gpu_instance_t *instance, gi_info_t *info) {
    int rc;
    if (!initialised) return ERR_UNINITIALIZED;
    if (!instance || !info) return ERR_INVALID_ARGUMENT;
    if ((rc = enter("nvmlGpuInstanceGetInfo", instance->gpu))) return rc;
    info->device = &devices[instance->gpu];
    info->id = (unsigned int)instance->id;
    info->profileId = GI_PROFILE_ID;
    info->placement.start = (unsigned int)instance->id - 1;
    info->placement.size = 1;
    return SUCCESS;
}
