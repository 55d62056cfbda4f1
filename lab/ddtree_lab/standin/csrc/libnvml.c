/*
 * Lab stand-in for the NVIDIA management library libnvidia-ml.so.1 (NVML), the library
 * nvidia-smi itself uses. The lab has no GPU: this answers the NVML calls the facts probe
 * makes from the same inputs as the nvidia-smi stand-in (standin/nvidia_smi.py), so both
 * tell the same story:
 *   GPU spec   $DDTREE_LAB_GPU_SPEC, default /etc/ddtree-lab/gpus.json (written by the lab;
 *              read with a small scanner that knows its flat shape, not a JSON parser)
 *   claims     $DDTREE_LAB_GPU_CLAIMS, default /run/ddtree-lab/gpu-claims/<pid>.json; a claim
 *              counts while /proc/<pid>/stat field 22 equals its "starttime"
 * Memory: used = live claims + baseline (9 MiB) while any claim is live, else 0;
 * reserved = memory_reserved_mib or total*615/143771; free = total - reserved - used.
 * A dead GPU keeps its handle, name, UUID, bus id and memory, and answers temperature,
 * utilization and performance state with NVML_ERROR_UNKNOWN ("Unknown Error"), as the real
 * driver does for the GPU nvidia-smi shows with "ERR!". No spec: nvmlInit fails with
 * NVML_ERROR_DRIVER_NOT_LOADED. Return codes and struct layouts are those of nvml.h.
 * Two failures of a real driver, for tests: $DDTREE_LAB_NVML_HANG=N makes nvmlInit take N
 * seconds (a driver stuck on a failed GPU), $DDTREE_LAB_NVML_CRASH=1 makes it abort.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
#define OK 0
#define E_UNINIT 1
#define E_ARG 2
#define E_NOT_SUPPORTED 3
#define E_NOT_FOUND 6
#define E_SIZE 7
#define E_NO_DRIVER 9
#define E_UNKNOWN 999
#define MIB (1024ULL * 1024ULL)
#define MAX_GPUS 16
#define MAX_PROCS 64

typedef struct { unsigned long long total, free, used; } Memory;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } MemoryV2;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} PciInfo;
typedef struct { unsigned int gpu, memory; } Utilization;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } ProcessV1;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} ProcessV3;

typedef struct {
    unsigned int pid;
    unsigned long long used_mib;
    char name[256];
} Proc;

typedef struct {
    int index, dead, cc_major, cc_minor;
    unsigned long long total_mib, reserved_mib, baseline_mib, used_mib;
    char name[96], uuid[96], bus_id[32];
    Proc procs[MAX_PROCS];
    int nprocs;
} Gpu;

static int ready;
static Gpu gpus[MAX_GPUS];
static int ngpus;
static char driver[80];
static int cuda_version;

/* ---- a scanner for the flat JSON the lab writes ------------------------------------- */

static int read_file(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    ssize_t n;
    while (got + 1 < size && (n = read(fd, buf + got, size - 1 - got)) > 0)
        got += (size_t)n;
    close(fd);
    buf[got] = 0;
    return (int)got;
}

/* The value after "key": within [from, to), or NULL. */
static const char *value_of(const char *from, const char *to, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    size_t len = strlen(pat);
    for (const char *p = from; p && p + len <= to; p++) {
        p = strstr(p, pat);
        if (!p || p + len > to)
            return NULL;
        const char *v = p + len;
        while (v < to && (*v == ' ' || *v == '\n' || *v == '\t' || *v == '\r'))
            v++;
        if (v < to && *v == ':') {
            v++;
            while (v < to && (*v == ' ' || *v == '\n' || *v == '\t' || *v == '\r'))
                v++;
            return v;
        }
    }
    return NULL;
}

static long long num_of(const char *from, const char *to, const char *key, long long dflt)
{
    const char *v = value_of(from, to, key);
    if (!v)
        return dflt;
    if (*v == '"')
        v++;
    char *end;
    long long n = strtoll(v, &end, 10);
    return end == v ? dflt : n;
}

static int str_of(const char *from, const char *to, const char *key, char *out, size_t size)
{
    const char *v = value_of(from, to, key);
    out[0] = 0;
    if (!v || *v != '"')
        return 0;
    v++;
    size_t i = 0;
    while (v < to && *v != '"' && i + 1 < size) {
        if (*v == '\\' && v + 1 < to)
            v++;
        out[i++] = *v++;
    }
    out[i] = 0;
    return 1;
}

/* ---- the GPU spec and the claims -------------------------------------------------------- */

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static int load_spec(void)
{
    static char buf[65536];
    if (read_file(env_or("DDTREE_LAB_GPU_SPEC", "/etc/ddtree-lab/gpus.json"), buf, sizeof buf) < 0)
        return E_NO_DRIVER;
    const char *end = buf + strlen(buf);
    str_of(buf, end, "driver_version", driver, sizeof driver);
    char cuda[16];
    str_of(buf, end, "cuda_version", cuda, sizeof cuda);
    cuda_version = atoi(cuda) * 1000 + (strchr(cuda, '.') ? atoi(strchr(cuda, '.') + 1) * 10 : 0);
    const char *p = value_of(buf, end, "gpus");
    ngpus = 0;
    while (p && ngpus < MAX_GPUS && (p = strchr(p, '{')) != NULL) {
        const char *q = strchr(p, '}');
        if (!q)
            break;
        Gpu *g = &gpus[ngpus++];
        memset(g, 0, sizeof *g);
        g->index = (int)num_of(p, q, "index", ngpus - 1);
        str_of(p, q, "name", g->name, sizeof g->name);
        str_of(p, q, "uuid", g->uuid, sizeof g->uuid);
        str_of(p, q, "pci_bus_id", g->bus_id, sizeof g->bus_id);
        for (char *c = g->bus_id; *c; c++)
            if (*c >= 'a' && *c <= 'f')
                *c = (char)(*c - 'a' + 'A');
        g->total_mib = (unsigned long long)num_of(p, q, "memory_total_mib", 0);
        g->reserved_mib = (unsigned long long)num_of(p, q, "memory_reserved_mib",
                                                     (long long)(g->total_mib * 615 / 143771));
        g->baseline_mib = (unsigned long long)num_of(p, q, "memory_baseline_mib", 9);
        char cc[16];
        str_of(p, q, "compute_cap", cc, sizeof cc);
        g->cc_major = atoi(cc);
        g->cc_minor = strchr(cc, '.') ? atoi(strchr(cc, '.') + 1) : 0;
        const char *dead = value_of(p, q, "dead");
        g->dead = dead && strncmp(dead, "true", 4) == 0;
        p = q + 1;
    }
    return OK;
}

/* Field 22 of /proc/PID/stat (start time), as the nvidia-smi stand-in compares it. */
static int starttime_of(unsigned int pid, char *out, size_t size)
{
    char path[64], stat[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    if (read_file(path, stat, sizeof stat) < 0)
        return 0;
    char *p = strrchr(stat, ')');
    if (!p)
        return 0;
    p += 2; /* fields 3.. */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    if (!p)
        return 0;
    size_t n = strcspn(p, " \n");
    if (n + 1 > size)
        return 0;
    memcpy(out, p, n);
    out[n] = 0;
    return 1;
}

static void load_claims(void)
{
    const char *folder = env_or("DDTREE_LAB_GPU_CLAIMS", "/run/ddtree-lab/gpu-claims");
    DIR *dir = opendir(folder);
    if (!dir)
        return;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len < 6 || strcmp(e->d_name + len - 5, ".json") != 0)
            continue;
        char path[4096], buf[4096], want[32], now[32];
        snprintf(path, sizeof path, "%s/%s", folder, e->d_name);
        if (read_file(path, buf, sizeof buf) <= 0)
            continue;
        const char *end = buf + strlen(buf);
        long long pid = num_of(buf, end, "pid", -1), index = num_of(buf, end, "gpu_index", -1);
        long long used = num_of(buf, end, "used_mib", -1);
        if (pid <= 0 || index < 0 || used < 0 || !starttime_of((unsigned int)pid, now, sizeof now))
            continue;
        if (str_of(buf, end, "starttime", want, sizeof want) && strcmp(want, now) != 0)
            continue; /* the PID was reused */
        for (int i = 0; i < ngpus; i++) {
            Gpu *g = &gpus[i];
            if (g->index != index || g->dead || g->nprocs >= MAX_PROCS)
                continue;
            Proc *proc = &g->procs[g->nprocs++];
            proc->pid = (unsigned int)pid;
            proc->used_mib = (unsigned long long)used;
            if (!str_of(buf, end, "process_name", proc->name, sizeof proc->name) || !proc->name[0])
                strcpy(proc->name, "python3");
        }
    }
    closedir(dir);
    for (int i = 0; i < ngpus; i++) {
        Gpu *g = &gpus[i];
        unsigned long long sum = 0;
        for (int k = 0; k < g->nprocs; k++)
            sum += g->procs[k].used_mib;
        g->used_mib = g->nprocs ? sum + g->baseline_mib : 0;
    }
}

/* ---- the API ------------------------------------------------------------------------------ */

API int nvmlInit_v2(void)
{
    const char *hang = getenv("DDTREE_LAB_NVML_HANG");
    if (hang && atoi(hang) > 0)
        sleep((unsigned int)atoi(hang));
    if (getenv("DDTREE_LAB_NVML_CRASH"))
        abort();
    int rc = load_spec();
    if (rc != OK)
        return rc;
    load_claims();
    ready = 1;
    return OK;
}

API int nvmlInit(void) { return nvmlInit_v2(); }

API int nvmlShutdown(void)
{
    if (!ready)
        return E_UNINIT;
    ready = 0;
    return OK;
}

API const char *nvmlErrorString(int rc)
{
    switch (rc) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_ARG: return "Invalid Argument";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_NOT_FOUND: return "Not Found";
    case E_SIZE: return "Insufficient Size";
    case E_NO_DRIVER: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

static int copy_out(const char *text, char *out, unsigned int size)
{
    if (!out)
        return E_ARG;
    if (strlen(text) + 1 > size)
        return E_SIZE;
    strcpy(out, text);
    return OK;
}

API int nvmlSystemGetDriverVersion(char *out, unsigned int size)
{
    return ready ? copy_out(driver, out, size) : E_UNINIT;
}

API int nvmlSystemGetCudaDriverVersion(int *out)
{
    if (!out)
        return E_ARG;
    *out = cuda_version;
    return OK;
}

API int nvmlSystemGetCudaDriverVersion_v2(int *out) { return nvmlSystemGetCudaDriverVersion(out); }

API int nvmlSystemGetProcessName(unsigned int pid, char *out, unsigned int size)
{
    if (!ready)
        return E_UNINIT;
    for (int i = 0; i < ngpus; i++)
        for (int k = 0; k < gpus[i].nprocs; k++)
            if (gpus[i].procs[k].pid == pid)
                return copy_out(gpus[i].procs[k].name, out, size);
    return E_NOT_FOUND;
}

API int nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!ready)
        return E_UNINIT;
    if (!count)
        return E_ARG;
    *count = (unsigned int)ngpus;
    return OK;
}

API int nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

API int nvmlDeviceGetHandleByIndex_v2(unsigned int index, Gpu **handle)
{
    if (!ready)
        return E_UNINIT;
    if (!handle || index >= (unsigned int)ngpus)
        return E_ARG;
    *handle = &gpus[index];
    return OK;
}

API int nvmlDeviceGetHandleByIndex(unsigned int index, Gpu **handle)
{
    return nvmlDeviceGetHandleByIndex_v2(index, handle);
}

API int nvmlDeviceGetName(Gpu *g, char *out, unsigned int size)
{
    return g ? copy_out(g->name, out, size) : E_ARG;
}

API int nvmlDeviceGetUUID(Gpu *g, char *out, unsigned int size)
{
    return g ? copy_out(g->uuid, out, size) : E_ARG;
}

API int nvmlDeviceGetPciInfo_v3(Gpu *g, PciInfo *pci)
{
    if (!g || !pci)
        return E_ARG;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->bus_id);
    /* "00000000:00:06.0" -> legacy "0000:00:06.0" */
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", strlen(g->bus_id) > 4 ? g->bus_id + 4 : g->bus_id);
    sscanf(g->bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    return OK;
}

API int nvmlDeviceGetMemoryInfo_v2(Gpu *g, MemoryV2 *mem)
{
    if (!g || !mem)
        return E_ARG;
    if (mem->version != (unsigned int)(sizeof(MemoryV2) | (2u << 24)))
        return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    unsigned long long used = g->used_mib, rsv = g->reserved_mib, total = g->total_mib;
    mem->total = total * MIB;
    mem->reserved = rsv * MIB;
    mem->used = used * MIB;
    mem->free = total > rsv + used ? (total - rsv - used) * MIB : 0;
    return OK;
}

API int nvmlDeviceGetMemoryInfo(Gpu *g, Memory *mem)
{
    if (!g || !mem)
        return E_ARG;
    unsigned long long used = g->used_mib + g->reserved_mib, total = g->total_mib;
    mem->total = total * MIB;
    mem->used = used * MIB; /* v1 counts the driver's reserve as used */
    mem->free = total > used ? (total - used) * MIB : 0;
    return OK;
}

API int nvmlDeviceGetCudaComputeCapability(Gpu *g, int *major, int *minor)
{
    if (!g || !major || !minor)
        return E_ARG;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return OK;
}

API int nvmlDeviceGetTemperature(Gpu *g, int sensor, unsigned int *out)
{
    if (!g || !out || sensor != 0)
        return E_ARG;
    if (g->dead)
        return E_UNKNOWN;
    *out = 35;
    return OK;
}

API int nvmlDeviceGetUtilizationRates(Gpu *g, Utilization *out)
{
    if (!g || !out)
        return E_ARG;
    if (g->dead)
        return E_UNKNOWN;
    out->gpu = out->memory = 0;
    return OK;
}

API int nvmlDeviceGetPerformanceState(Gpu *g, int *out)
{
    if (!g || !out)
        return E_ARG;
    if (g->dead)
        return E_UNKNOWN;
    *out = 0;
    return OK;
}

static int processes(Gpu *g, unsigned int *count, void *infos, int v3)
{
    if (!g || !count)
        return E_ARG;
    if (g->dead)
        return E_UNKNOWN;
    if (*count < (unsigned int)g->nprocs || (!infos && g->nprocs)) {
        *count = (unsigned int)g->nprocs;
        return E_SIZE;
    }
    for (int k = 0; k < g->nprocs; k++) {
        if (v3) {
            ProcessV3 *p = (ProcessV3 *)infos + k;
            p->pid = g->procs[k].pid;
            p->usedGpuMemory = g->procs[k].used_mib * MIB;
            p->gpuInstanceId = p->computeInstanceId = 0xFFFFFFFFu;
        } else {
            ProcessV1 *p = (ProcessV1 *)infos + k;
            p->pid = g->procs[k].pid;
            p->usedGpuMemory = g->procs[k].used_mib * MIB;
        }
    }
    *count = (unsigned int)g->nprocs;
    return OK;
}

API int nvmlDeviceGetComputeRunningProcesses_v3(Gpu *g, unsigned int *count, ProcessV3 *infos)
{
    return processes(g, count, infos, 1);
}

API int nvmlDeviceGetComputeRunningProcesses_v2(Gpu *g, unsigned int *count, ProcessV3 *infos)
{
    return processes(g, count, infos, 1);
}

API int nvmlDeviceGetComputeRunningProcesses(Gpu *g, unsigned int *count, ProcessV1 *infos)
{
    return processes(g, count, infos, 0);
}
