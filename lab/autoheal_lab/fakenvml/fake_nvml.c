/*
 * fake_nvml.c - a fake libnvidia-ml.so.1 for tests and the local lab cluster.
 *
 * Built against NVIDIA's own nvml.h (PyPI package nvidia-nvml-dev), so every
 * exported function has the exact signature and struct layout of the real
 * library.  The unmodified pynvml loads it via dlopen("libnvidia-ml.so.1").
 *
 * State
 * -----
 * The GPUs come from a per-node state file named by the environment variable
 * AUTOHEAL_FAKE_NVML_STATE: one "key=value" per line, '#' starts a comment,
 * unknown keys are ignored.  Global keys:
 *     driver_loaded=1            0 -> nvmlInit* returns NVML_ERROR_DRIVER_NOT_LOADED
 *     init_hang_ms=0             nvmlInit* sleeps this long first
 *     driver_version=550.54.15
 *     nvml_version=12.550.54.15
 *     cuda_driver_version=12040
 *     gpu_count=8
 * Per GPU (i = state index, 0-based): gpu.<i>.<field>=value, see parse_gpu_key()
 * and lab/autoheal_lab/fakenvml/state.py for the full list.
 *
 * The path may contain "{node}": the node this process runs on, as autoheal's hooks decide it (its
 * --node argument, e.g. `autoheal check --node gpu1`, else $SLURMD_NODENAME, else $AUTOHEAL_NODE), so
 * one exported value serves a whole lab (`autoheal lab env`).
 *
 * A missing or unreadable state file (or an unset variable) makes nvmlInit*
 * return NVML_ERROR_DRIVER_NOT_LOADED, as on a node whose kernel module is not
 * loaded.  After a successful init, an unreadable file keeps the last state.
 * The file is re-read whenever its inode, size or mtime changes (writers
 * replace it atomically), so tests change state live without re-init.
 *
 * Events
 * ------
 * "<state file>.events" is append-only, one event per line:
 *     <seq> <gpu state index> <xid> [<event type, default 0x8 = XID>]
 * seq increases strictly.  An event set only delivers events whose seq is
 * greater than the largest seq in the file when the device was registered
 * (events that happened before registration are not recorded, like the real
 * driver), and delivers each event once per set.
 *
 * Locking: one mutex guards all state; it is never held while sleeping
 * (nvmlEventSetWait_v2 polling, per-GPU hang_ms, init_hang_ms).
 *
 * Functions that are not implemented are not exported, so pynvml raises
 * NVMLError_FunctionNotFound exactly as with an old driver.
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#define FAKE_STATE_ENV "AUTOHEAL_FAKE_NVML_STATE"
#define FAKE_MAX_GPUS 64
#define FAKE_POLL_MS 20
#define FAKE_SET_MAGIC 0x4e564d4cu /* "NVML" */
#define FAKE_DEV_MAGIC 0x46414b45u /* "FAKE" */
#define FAKE_MAX_FILE (4u << 20)

/* features that can be marked unsupported (NVML_ERROR_NOT_SUPPORTED) */
enum {
    FEAT_ECC = 1u << 0,
    FEAT_REMAPPED_ROWS = 1u << 1,
    FEAT_RETIRED_PAGES = 1u << 2,
    FEAT_NVLINK = 1u << 3,
    FEAT_PCIE = 1u << 4,
    FEAT_TEMPERATURE = 1u << 5,
    FEAT_POWER = 1u << 6,
    FEAT_UTILIZATION = 1u << 7,
    FEAT_PERSISTENCE = 1u << 8,
    FEAT_CLOCKS = 1u << 9,
    FEAT_RECOVERY_ACTION = 1u << 10,
    FEAT_SERIAL = 1u << 11,
    FEAT_EVENTS = 1u << 12,
    FEAT_MEMORY = 1u << 13,
};

static const struct {
    const char *name;
    unsigned bit;
} feature_names[] = {
    {"ecc", FEAT_ECC},
    {"remapped_rows", FEAT_REMAPPED_ROWS},
    {"retired_pages", FEAT_RETIRED_PAGES},
    {"nvlink", FEAT_NVLINK},
    {"pcie", FEAT_PCIE},
    {"temperature", FEAT_TEMPERATURE},
    {"power", FEAT_POWER},
    {"utilization", FEAT_UTILIZATION},
    {"persistence_mode", FEAT_PERSISTENCE},
    {"clocks_event_reasons", FEAT_CLOCKS},
    {"recovery_action", FEAT_RECOVERY_ACTION},
    {"serial", FEAT_SERIAL},
    {"events", FEAT_EVENTS},
    {"memory", FEAT_MEMORY},
};

typedef struct {
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char serial[NVML_DEVICE_SERIAL_BUFFER_SIZE];
    char arch[32];
    unsigned pci_domain, pci_bus, pci_device, pci_function;
    unsigned pci_device_id, pci_subsystem_id;
    unsigned minor_number;
    int present, lost;
    unsigned hang_ms;
    int temperature;
    int persistence_mode, ecc_mode;
    unsigned long long ecc[2][2]; /* [errorType][counterType] */
    unsigned remap_correctable, remap_uncorrectable, remap_pending, remap_failure;
    unsigned retired_sbe, retired_dbe, retired_pending;
    unsigned pcie_max_gen, pcie_max_width, pcie_curr_gen, pcie_curr_width;
    unsigned nvlink_count;
    unsigned char nvlink_down[NVML_NVLINK_MAX_LINKS];
    unsigned long long clocks_event_reasons;
    unsigned recovery_action;
    unsigned long long memory_total, memory_reserved, memory_used;
    unsigned power_mw, util_gpu, util_memory;
    unsigned long long supported_events;
    unsigned unsupported_explicit; /* from gpu.<i>.unsupported */
    unsigned unsupported;          /* effective: explicit + arch defaults */
} fake_gpu_t;

typedef struct {
    int driver_loaded;
    unsigned init_hang_ms;
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml_version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    int cuda_driver_version;
    unsigned gpu_count;
    fake_gpu_t gpus[FAKE_MAX_GPUS];
} fake_state_t;

struct nvmlDevice_st {
    unsigned magic;
    unsigned index; /* state index */
};

struct nvmlEventSet_st {
    unsigned magic;
    struct nvmlEventSet_st *next;
    unsigned long long last_seq;                  /* every seq <= this is consumed */
    unsigned long long reg_types[FAKE_MAX_GPUS];  /* registered event mask per GPU */
    unsigned long long reg_seq[FAKE_MAX_GPUS];    /* max seq when registered */
};

typedef struct {
    unsigned long long seq;
    unsigned gpu;
    unsigned long long xid;
    unsigned long long type;
} fake_event_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_init_count;
static fake_state_t g_state;
static fake_state_t g_scratch;
static int g_have_state;
static char g_state_path[4096];
static dev_t g_st_dev;
static ino_t g_st_ino;
static off_t g_st_size;
static struct timespec g_st_mtime;
static struct nvmlDevice_st g_devs[FAKE_MAX_GPUS];
static struct nvmlEventSet_st *g_sets;

/* ------------------------------------------------------------------ utils */

static unsigned long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000ull + (unsigned long long)ts.tv_nsec / 1000000ull;
}

static long long now_usec_realtime(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000ll + ts.tv_nsec / 1000;
}

static void sleep_ms(unsigned long long ms)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1000ull);
    ts.tv_nsec = (long)((ms % 1000ull) * 1000000ull);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static nvmlReturn_t put_str(char *dst, unsigned int length, const char *src)
{
    size_t n = strlen(src);
    if (dst == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((size_t)length < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

static unsigned long long parse_ull(const char *v)
{
    return strtoull(v, NULL, 0);
}

static unsigned parse_uint(const char *v)
{
    return (unsigned)strtoul(v, NULL, 0);
}

static int parse_pci(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn)
{
    unsigned a, b, c, d;
    char tail;
    if (s == NULL)
        return -1;
    while (*s == ' ')
        s++;
    if (sscanf(s, "%x:%x:%x.%x%c", &a, &b, &c, &d, &tail) == 4) {
        *dom = a; *bus = b; *dev = c; *fn = d;
        return 0;
    }
    if (sscanf(s, "%x:%x.%x%c", &b, &c, &d, &tail) == 3) {
        *dom = 0; *bus = b; *dev = c; *fn = d;
        return 0;
    }
    if (sscanf(s, "%x:%x:%x%c", &a, &b, &c, &tail) == 3) {
        *dom = a; *bus = b; *dev = c; *fn = 0;
        return 0;
    }
    return -1;
}

static int is_pre_ampere(const char *arch)
{
    static const char *const old[] = {"kepler", "maxwell", "pascal", "volta", "turing"};
    size_t i;
    for (i = 0; i < sizeof(old) / sizeof(old[0]); i++)
        if (strcasecmp(arch, old[i]) == 0)
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ state */

static void gpu_defaults(fake_gpu_t *g, unsigned i)
{
    static const unsigned buses[8] = {0x1b, 0x3b, 0x4c, 0x5d, 0x9b, 0xbb, 0xcb, 0xdb};
    memset(g, 0, sizeof(*g));
    copy_str(g->name, sizeof(g->name), "NVIDIA H100 80GB HBM3");
    snprintf(g->uuid, sizeof(g->uuid), "GPU-00000000-0000-0000-0000-%012x", i);
    snprintf(g->serial, sizeof(g->serial), "%013u", 1654922000u + i);
    copy_str(g->arch, sizeof(g->arch), "hopper");
    g->pci_bus = i < 8 ? buses[i] : (0x10 + i) & 0xff;
    g->pci_device_id = 0x233010DEu;
    g->pci_subsystem_id = 0x16C110DEu;
    g->minor_number = i;
    g->present = 1;
    g->temperature = 35;
    g->persistence_mode = 1;
    g->ecc_mode = 1;
    g->pcie_max_gen = g->pcie_curr_gen = 5;
    g->pcie_max_width = g->pcie_curr_width = 16;
    g->nvlink_count = 18;
    g->clocks_event_reasons = nvmlClocksEventReasonGpuIdle;
    g->memory_total = 85520809984ull;
    g->memory_reserved = 607125504ull;
    g->power_mw = 69000;
    g->supported_events = nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError |
                          nvmlEventTypePState | nvmlEventTypeXidCriticalError | nvmlEventTypeClock;
}

static void state_defaults(fake_state_t *s)
{
    unsigned i;
    memset(s, 0, sizeof(*s));
    s->driver_loaded = 1;
    copy_str(s->driver_version, sizeof(s->driver_version), "550.54.15");
    copy_str(s->nvml_version, sizeof(s->nvml_version), "12.550.54.15");
    s->cuda_driver_version = 12040;
    for (i = 0; i < FAKE_MAX_GPUS; i++)
        gpu_defaults(&s->gpus[i], i);
}

static unsigned parse_features(const char *v)
{
    unsigned mask = 0;
    char buf[512];
    char *save = NULL, *tok;
    size_t k;
    copy_str(buf, sizeof(buf), v);
    for (tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save))
        for (k = 0; k < sizeof(feature_names) / sizeof(feature_names[0]); k++)
            if (strcmp(tok, feature_names[k].name) == 0)
                mask |= feature_names[k].bit;
    return mask;
}

static void parse_link_list(unsigned char *down, const char *v)
{
    char buf[512];
    char *save = NULL, *tok;
    memset(down, 0, NVML_NVLINK_MAX_LINKS);
    copy_str(buf, sizeof(buf), v);
    for (tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        unsigned l = parse_uint(tok);
        if (l < NVML_NVLINK_MAX_LINKS)
            down[l] = 1;
    }
}

static void parse_gpu_key(fake_gpu_t *g, const char *k, const char *v)
{
#define UINT_FIELD(key, field) else if (strcmp(k, key) == 0) g->field = parse_uint(v)
#define ULL_FIELD(key, field) else if (strcmp(k, key) == 0) g->field = parse_ull(v)
#define STR_FIELD(key, field) else if (strcmp(k, key) == 0) copy_str(g->field, sizeof(g->field), v)
    if (0) {
    }
    STR_FIELD("name", name);
    STR_FIELD("uuid", uuid);
    STR_FIELD("serial", serial);
    STR_FIELD("arch", arch);
    else if (strcmp(k, "pci_bus_id") == 0) {
        unsigned d, b, dv, f;
        if (parse_pci(v, &d, &b, &dv, &f) == 0) {
            g->pci_domain = d; g->pci_bus = b; g->pci_device = dv; g->pci_function = f;
        }
    }
    UINT_FIELD("pci_device_id", pci_device_id);
    UINT_FIELD("pci_subsystem_id", pci_subsystem_id);
    UINT_FIELD("minor_number", minor_number);
    else if (strcmp(k, "present") == 0) g->present = parse_uint(v) != 0;
    else if (strcmp(k, "lost") == 0) g->lost = parse_uint(v) != 0;
    UINT_FIELD("hang_ms", hang_ms);
    else if (strcmp(k, "temperature") == 0) g->temperature = (int)strtol(v, NULL, 0);
    else if (strcmp(k, "persistence_mode") == 0) g->persistence_mode = parse_uint(v) != 0;
    else if (strcmp(k, "ecc_mode") == 0) g->ecc_mode = parse_uint(v) != 0;
    ULL_FIELD("ecc_volatile_corrected", ecc[NVML_MEMORY_ERROR_TYPE_CORRECTED][NVML_VOLATILE_ECC]);
    ULL_FIELD("ecc_volatile_uncorrected", ecc[NVML_MEMORY_ERROR_TYPE_UNCORRECTED][NVML_VOLATILE_ECC]);
    ULL_FIELD("ecc_aggregate_corrected", ecc[NVML_MEMORY_ERROR_TYPE_CORRECTED][NVML_AGGREGATE_ECC]);
    ULL_FIELD("ecc_aggregate_uncorrected", ecc[NVML_MEMORY_ERROR_TYPE_UNCORRECTED][NVML_AGGREGATE_ECC]);
    UINT_FIELD("remapped_rows_correctable", remap_correctable);
    UINT_FIELD("remapped_rows_uncorrectable", remap_uncorrectable);
    else if (strcmp(k, "remap_pending") == 0) g->remap_pending = parse_uint(v) != 0;
    else if (strcmp(k, "remap_failure") == 0) g->remap_failure = parse_uint(v) != 0;
    UINT_FIELD("retired_pages_sbe", retired_sbe);
    UINT_FIELD("retired_pages_dbe", retired_dbe);
    else if (strcmp(k, "retired_pages_pending") == 0) g->retired_pending = parse_uint(v) != 0;
    UINT_FIELD("pcie_max_gen", pcie_max_gen);
    UINT_FIELD("pcie_max_width", pcie_max_width);
    UINT_FIELD("pcie_curr_gen", pcie_curr_gen);
    UINT_FIELD("pcie_curr_width", pcie_curr_width);
    else if (strcmp(k, "nvlink_count") == 0) {
        g->nvlink_count = parse_uint(v);
        if (g->nvlink_count > NVML_NVLINK_MAX_LINKS)
            g->nvlink_count = NVML_NVLINK_MAX_LINKS;
    }
    else if (strcmp(k, "nvlink_down") == 0) parse_link_list(g->nvlink_down, v);
    ULL_FIELD("clocks_event_reasons", clocks_event_reasons);
    UINT_FIELD("recovery_action", recovery_action);
    ULL_FIELD("memory_total", memory_total);
    ULL_FIELD("memory_reserved", memory_reserved);
    ULL_FIELD("memory_used", memory_used);
    UINT_FIELD("power_mw", power_mw);
    UINT_FIELD("util_gpu", util_gpu);
    UINT_FIELD("util_memory", util_memory);
    ULL_FIELD("supported_events", supported_events);
    else if (strcmp(k, "unsupported") == 0) g->unsupported_explicit = parse_features(v);
#undef UINT_FIELD
#undef ULL_FIELD
#undef STR_FIELD
}

static void parse_line(fake_state_t *s, char *line)
{
    char *eq, *k, *v, *end;
    while (*line == ' ' || *line == '\t')
        line++;
    if (*line == '#' || *line == '\0')
        return;
    eq = strchr(line, '=');
    if (eq == NULL)
        return;
    *eq = '\0';
    k = line;
    v = eq + 1;
    end = eq;
    while (end > k && (end[-1] == ' ' || end[-1] == '\t'))
        *--end = '\0';
    end = v + strlen(v);
    while (end > v && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
        *--end = '\0';

    if (strncmp(k, "gpu.", 4) == 0) {
        char *p;
        unsigned long idx = strtoul(k + 4, &p, 10);
        if (p == k + 4 || *p != '.' || idx >= FAKE_MAX_GPUS)
            return;
        parse_gpu_key(&s->gpus[idx], p + 1, v);
    } else if (strcmp(k, "driver_loaded") == 0) {
        s->driver_loaded = parse_uint(v) != 0;
    } else if (strcmp(k, "init_hang_ms") == 0) {
        s->init_hang_ms = parse_uint(v);
    } else if (strcmp(k, "driver_version") == 0) {
        copy_str(s->driver_version, sizeof(s->driver_version), v);
    } else if (strcmp(k, "nvml_version") == 0) {
        copy_str(s->nvml_version, sizeof(s->nvml_version), v);
    } else if (strcmp(k, "cuda_driver_version") == 0) {
        s->cuda_driver_version = (int)strtol(v, NULL, 0);
    } else if (strcmp(k, "gpu_count") == 0) {
        s->gpu_count = parse_uint(v);
        if (s->gpu_count > FAKE_MAX_GPUS)
            s->gpu_count = FAKE_MAX_GPUS;
    }
}

/* Read a whole file (NUL-terminated). Returns NULL on error. */
static char *read_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, len = 0;
    if (f == NULL)
        return NULL;
    for (;;) {
        size_t n;
        if (len + 4096 + 1 > cap) {
            char *nb;
            cap = cap ? cap * 2 : 8192;
            if (cap > FAKE_MAX_FILE + 8192) {
                free(buf);
                fclose(f);
                return NULL;
            }
            nb = realloc(buf, cap);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[len] = '\0';
    if (len_out)
        *len_out = len;
    return buf;
}

static int parse_state_file(const char *path, fake_state_t *s)
{
    char *buf = read_file(path, NULL);
    char *line, *save = NULL;
    unsigned i;
    if (buf == NULL)
        return -1;
    state_defaults(s);
    for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        parse_line(s, line);
    free(buf);
    for (i = 0; i < FAKE_MAX_GPUS; i++) {
        fake_gpu_t *g = &s->gpus[i];
        g->unsupported = g->unsupported_explicit;
        g->unsupported |= is_pre_ampere(g->arch) ? FEAT_REMAPPED_ROWS : FEAT_RETIRED_PAGES;
        if (g->nvlink_count == 0)
            g->unsupported |= FEAT_NVLINK;
    }
    return 0;
}

/* A node name usable in a path: letters, digits, '.', '_', '-' (no '/', not "." or ".."). */
static int valid_node_name(const char *s)
{
    size_t i, n = strlen(s);
    if (n == 0 || n > 255 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return 0;
    for (i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* The --node argument of this process (`autoheal check --node gpu1`), read once from
 * /proc/self/cmdline: "--node NAME" or "--node=NAME". Empty when there is none. Caller holds g_lock. */
static const char *cmdline_node_locked(void)
{
    static int done;
    static char node[256];
    size_t len, i;
    char *buf;
    if (done)
        return node;
    done = 1;
    buf = read_file("/proc/self/cmdline", &len);
    if (buf == NULL)
        return node;
    for (i = 0; i < len;) {
        const char *arg = buf + i;
        size_t alen = strnlen(arg, len - i);
        const char *val = NULL;
        if (strcmp(arg, "--node") == 0 && i + alen + 1 < len)
            val = arg + alen + 1;
        else if (strncmp(arg, "--node=", 7) == 0)
            val = arg + 7;
        if (val != NULL && valid_node_name(val)) {
            copy_str(node, sizeof(node), val);
            break;
        }
        i += alen + 1;
    }
    free(buf);
    return node;
}

/* The state file path: $AUTOHEAL_FAKE_NVML_STATE, in which "{node}" stands for the node this process
 * runs on, decided as autoheal's hooks do: its --node argument, else $SLURMD_NODENAME, else
 * $AUTOHEAL_NODE. Returns 0 and fills out, or -1 (no variable, no usable node name, too long).
 * Caller holds g_lock. */
static int state_path_locked(char *out, size_t cap)
{
    const char *tmpl = getenv(FAKE_STATE_ENV);
    const char *mark, *node;
    int n;
    if (tmpl == NULL || *tmpl == '\0')
        return -1;
    mark = strstr(tmpl, "{node}");
    if (mark == NULL) {
        if (strlen(tmpl) >= cap)
            return -1;
        copy_str(out, cap, tmpl);
        return 0;
    }
    node = cmdline_node_locked();
    if (*node == '\0')
        node = getenv("SLURMD_NODENAME");
    if (node == NULL || !valid_node_name(node))
        node = getenv("AUTOHEAL_NODE");
    if (node == NULL || !valid_node_name(node))
        return -1;
    n = snprintf(out, cap, "%.*s%s%s", (int)(mark - tmpl), tmpl, node, mark + 6);
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}

/* Re-read the state file if it changed. Caller holds g_lock.
 * Returns 0 when the current file was read (or is unchanged), -1 otherwise;
 * on -1 the previous state (if any) stays in place. */
static int refresh_locked(void)
{
    static char path[sizeof(g_state_path)];
    struct stat sb;
    if (state_path_locked(path, sizeof(path)) != 0)
        return -1;
    if (stat(path, &sb) != 0)
        return -1;
    if (g_have_state && strcmp(path, g_state_path) == 0 && sb.st_dev == g_st_dev &&
        sb.st_ino == g_st_ino && sb.st_size == g_st_size &&
        sb.st_mtim.tv_sec == g_st_mtime.tv_sec && sb.st_mtim.tv_nsec == g_st_mtime.tv_nsec)
        return 0;
    if (parse_state_file(path, &g_scratch) != 0)
        return -1;
    memcpy(&g_state, &g_scratch, sizeof(g_state));
    copy_str(g_state_path, sizeof(g_state_path), path);
    g_st_dev = sb.st_dev;
    g_st_ino = sb.st_ino;
    g_st_size = sb.st_size;
    g_st_mtime = sb.st_mtim;
    g_have_state = 1;
    return 0;
}

/* ----------------------------------------------------------------- events */

/* Iterate over complete lines of the events file. cb returns nonzero to stop. */
typedef int (*event_cb)(const fake_event_t *ev, void *ctx);

static void scan_events_locked(event_cb cb, void *ctx)
{
    char path[sizeof(g_state_path) + 16];
    char *buf, *p;
    size_t len;
    if (!g_have_state)
        return;
    snprintf(path, sizeof(path), "%s.events", g_state_path);
    buf = read_file(path, &len);
    if (buf == NULL)
        return;
    p = buf;
    for (;;) {
        char *nl = strchr(p, '\n');
        fake_event_t ev;
        char *q;
        if (nl == NULL) /* partial trailing line: not yet complete */
            break;
        *nl = '\0';
        ev.seq = strtoull(p, &q, 10);
        if (q != p) {
            char *r;
            ev.gpu = (unsigned)strtoul(q, &r, 10);
            if (r != q) {
                ev.xid = strtoull(r, &q, 10);
                if (q != r) {
                    ev.type = strtoull(q, &r, 0);
                    if (r == q)
                        ev.type = nvmlEventTypeXidCriticalError;
                    if (cb(&ev, ctx))
                        break;
                }
            }
        }
        p = nl + 1;
    }
    free(buf);
}

static int max_seq_cb(const fake_event_t *ev, void *ctx)
{
    unsigned long long *m = ctx;
    if (ev->seq > *m)
        *m = ev->seq;
    return 0;
}

static unsigned long long max_seq_locked(void)
{
    unsigned long long m = 0;
    scan_events_locked(max_seq_cb, &m);
    return m;
}

struct next_ctx {
    struct nvmlEventSet_st *set;
    int found;
    fake_event_t ev;
};

static int next_event_cb(const fake_event_t *ev, void *ctx)
{
    struct next_ctx *c = ctx;
    struct nvmlEventSet_st *set = c->set;
    if (ev->seq <= set->last_seq)
        return 0;
    set->last_seq = ev->seq; /* consumed by this set, delivered or not */
    if (ev->gpu < FAKE_MAX_GPUS && ev->gpu < g_state.gpu_count &&
        (set->reg_types[ev->gpu] & ev->type) != 0 && ev->seq > set->reg_seq[ev->gpu]) {
        c->found = 1;
        c->ev = *ev;
        return 1;
    }
    return 0;
}

static int set_valid_locked(struct nvmlEventSet_st *set)
{
    struct nvmlEventSet_st *s;
    for (s = g_sets; s; s = s->next)
        if (s == set)
            return s->magic == FAKE_SET_MAGIC;
    return 0;
}

/* -------------------------------------------------------------- dev helpers */

static int handle_index(nvmlDevice_t device)
{
    uintptr_t p = (uintptr_t)device, base = (uintptr_t)&g_devs[0];
    if (device == NULL || p < base || p >= (uintptr_t)&g_devs[FAKE_MAX_GPUS])
        return -1;
    if ((p - base) % sizeof(g_devs[0]) != 0)
        return -1;
    return (int)((p - base) / sizeof(g_devs[0]));
}

static nvmlDevice_t handle_for(unsigned idx)
{
    g_devs[idx].magic = FAKE_DEV_MAGIC;
    g_devs[idx].index = idx;
    return &g_devs[idx];
}

/*
 * Common prologue of every device call: library initialized, valid handle,
 * output pointers present (args_ok), then a snapshot of the GPU's state taken
 * under the lock, then the GPU's hang (outside the lock), then GPU_IS_LOST.
 */
static nvmlReturn_t dev_begin(nvmlDevice_t device, int args_ok, fake_gpu_t *out, unsigned *idx_out)
{
    int idx;
    unsigned hang;
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    idx = handle_index(device);
    if (idx < 0 || device->magic != FAKE_DEV_MAGIC) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    (void)refresh_locked();
    if ((unsigned)idx >= g_state.gpu_count) {
        /* the GPU disappeared from the state file since the handle was taken */
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_GPU_IS_LOST;
    }
    if (!args_ok) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *out = g_state.gpus[idx];
    pthread_mutex_unlock(&g_lock);
    if (idx_out)
        *idx_out = (unsigned)idx;
    hang = out->hang_ms;
    if (hang)
        sleep_ms(hang);
    if (out->lost || !out->present)
        return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

#define DEV_BEGIN(device, args_ok)                                   \
    fake_gpu_t g;                                                    \
    unsigned gidx = 0;                                               \
    nvmlReturn_t rc_ = dev_begin((device), (args_ok), &g, &gidx);    \
    (void)gidx;                                                      \
    if (rc_ != NVML_SUCCESS)                                         \
        return rc_

#define REQUIRE_FEATURE(feat)                                        \
    do {                                                             \
        if (g.unsupported & (feat))                                  \
            return NVML_ERROR_NOT_SUPPORTED;                         \
    } while (0)

/* Map an NVML index (over present GPUs) to a state index; -1 if none. */
static int nvml_to_state_index_locked(unsigned nvml_index)
{
    unsigned i, n = 0;
    for (i = 0; i < g_state.gpu_count; i++) {
        if (!g_state.gpus[i].present)
            continue;
        if (n == nvml_index)
            return (int)i;
        n++;
    }
    return -1;
}

static unsigned present_count_locked(void)
{
    unsigned i, n = 0;
    for (i = 0; i < g_state.gpu_count; i++)
        n += g_state.gpus[i].present ? 1u : 0u;
    return n;
}

/* Finish a handle lookup for state index idx (lock NOT held). */
static nvmlReturn_t finish_lookup(int idx, unsigned hang, int lost, nvmlDevice_t *device)
{
    if (hang)
        sleep_ms(hang);
    if (lost)
        return NVML_ERROR_GPU_IS_LOST;
    pthread_mutex_lock(&g_lock);
    *device = handle_for((unsigned)idx);
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------ init / misc */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    unsigned hang;
    int ok;
    (void)flags;
    pthread_mutex_lock(&g_lock);
    ok = refresh_locked() == 0;
    hang = ok ? g_state.init_hang_ms : 0;
    pthread_mutex_unlock(&g_lock);
    if (hang)
        sleep_ms(hang);
    pthread_mutex_lock(&g_lock);
    ok = refresh_locked() == 0 && g_state.driver_loaded;
    if (ok)
        g_init_count++;
    pthread_mutex_unlock(&g_lock);
    return ok ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
}

nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        g_init_count--;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "The requested frequency is not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "The requested functionality has been deprecated";
    case NVML_ERROR_NOT_READY: return "The system is not ready for the request";
    case NVML_ERROR_GPU_NOT_FOUND: return "No GPUs were found";
    case NVML_ERROR_INVALID_STATE: return "Resource not in correct state to perform requested operation";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    char v[sizeof(g_state.driver_version)];
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    (void)refresh_locked();
    copy_str(v, sizeof(v), g_state.driver_version);
    pthread_mutex_unlock(&g_lock);
    return put_str(version, length, v);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    char v[sizeof(g_state.nvml_version)];
    pthread_mutex_lock(&g_lock);
    if (refresh_locked() != 0 && !g_have_state)
        copy_str(v, sizeof(v), "12.550.54.15");
    else
        copy_str(v, sizeof(v), g_state.nvml_version);
    pthread_mutex_unlock(&g_lock);
    return put_str(version, length, v);
}

static nvmlReturn_t cuda_version(int *out)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    if (refresh_locked() != 0 && !g_have_state)
        *out = 12040;
    else
        *out = g_state.cuda_driver_version;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    return cuda_version(cudaDriverVersion);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return cuda_version(cudaDriverVersion);
}

/* ---------------------------------------------------------- enumeration */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    if (deviceCount == NULL) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    (void)refresh_locked();
    *deviceCount = present_count_locked();
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    int idx;
    unsigned hang;
    int lost;
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    (void)refresh_locked();
    idx = nvml_to_state_index_locked(index);
    if (device == NULL || idx < 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    hang = g_state.gpus[idx].hang_ms;
    lost = g_state.gpus[idx].lost;
    pthread_mutex_unlock(&g_lock);
    return finish_lookup(idx, hang, lost, device);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    int idx = -1;
    unsigned i, hang = 0;
    int lost = 0;
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    if (uuid == NULL || device == NULL) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    (void)refresh_locked();
    for (i = 0; i < g_state.gpu_count; i++) {
        if (g_state.gpus[i].present && strcasecmp(g_state.gpus[i].uuid, uuid) == 0) {
            idx = (int)i;
            hang = g_state.gpus[i].hang_ms;
            lost = g_state.gpus[i].lost;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (idx < 0)
        return NVML_ERROR_NOT_FOUND;
    return finish_lookup(idx, hang, lost, device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    unsigned d, b, dv, f, i, hang = 0;
    int idx = -1, lost = 0;
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    if (pciBusId == NULL || device == NULL || parse_pci(pciBusId, &d, &b, &dv, &f) != 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    (void)refresh_locked();
    for (i = 0; i < g_state.gpu_count; i++) {
        const fake_gpu_t *g = &g_state.gpus[i];
        if (g->present && g->pci_domain == d && g->pci_bus == b && g->pci_device == dv &&
            g->pci_function == f) {
            idx = (int)i;
            hang = g->hang_ms;
            lost = g->lost;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (idx < 0)
        return NVML_ERROR_NOT_FOUND;
    return finish_lookup(idx, hang, lost, device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* ------------------------------------------------------- identification */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    DEV_BEGIN(device, name != NULL);
    return put_str(name, length, g.name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    DEV_BEGIN(device, uuid != NULL);
    return put_str(uuid, length, g.uuid);
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    DEV_BEGIN(device, serial != NULL);
    REQUIRE_FEATURE(FEAT_SERIAL);
    return put_str(serial, length, g.serial);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    unsigned i, n = 0;
    DEV_BEGIN(device, index != NULL);
    pthread_mutex_lock(&g_lock);
    for (i = 0; i < gidx && i < g_state.gpu_count; i++)
        n += g_state.gpus[i].present ? 1u : 0u;
    pthread_mutex_unlock(&g_lock);
    *index = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    DEV_BEGIN(device, minorNumber != NULL);
    *minorNumber = g.minor_number;
    return NVML_SUCCESS;
}

static void fill_pci(const fake_gpu_t *g, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof(*pci));
    pci->domain = g->pci_domain;
    pci->bus = g->pci_bus;
    pci->device = g->pci_device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
             g->pci_domain & 0xffffu, g->pci_bus & 0xffu, g->pci_device & 0xffu);
    snprintf(pci->busId, sizeof(pci->busId), NVML_DEVICE_PCI_BUS_ID_FMT,
             g->pci_domain, g->pci_bus & 0xffu, g->pci_device & 0xffu);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEV_BEGIN(device, pci != NULL);
    fill_pci(&g, pci);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
    DEV_BEGIN(device, pci != NULL);
    if (pci->version != nvmlPciInfoExt_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    pci->domain = g.pci_domain;
    pci->bus = g.pci_bus;
    pci->device = g.pci_device;
    pci->pciDeviceId = g.pci_device_id;
    pci->pciSubSystemId = g.pci_subsystem_id;
    pci->baseClass = 0x03; /* display controller */
    pci->subClass = 0x02;  /* 3D controller */
    snprintf(pci->busId, sizeof(pci->busId), NVML_DEVICE_PCI_BUS_ID_FMT,
             g.pci_domain, g.pci_bus & 0xffu, g.pci_device & 0xffu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    DEV_BEGIN(device, mode != NULL);
    REQUIRE_FEATURE(FEAT_PERSISTENCE);
    *mode = g.persistence_mode ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- thermal */

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                      unsigned int *temp)
{
    DEV_BEGIN(device, temp != NULL && (unsigned)sensorType < NVML_TEMPERATURE_COUNT);
    REQUIRE_FEATURE(FEAT_TEMPERATURE);
    *temp = g.temperature < 0 ? 0u : (unsigned)g.temperature;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    DEV_BEGIN(device, temperature != NULL);
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if ((unsigned)temperature->sensorType >= NVML_TEMPERATURE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    REQUIRE_FEATURE(FEAT_TEMPERATURE);
    temperature->temperature = g.temperature;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                    unsigned long long *clocksEventReasons)
{
    DEV_BEGIN(device, clocksEventReasons != NULL);
    REQUIRE_FEATURE(FEAT_CLOCKS);
    *clocksEventReasons = g.clocks_event_reasons;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *clocksThrottleReasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(device, clocksThrottleReasons);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    DEV_BEGIN(device, power != NULL);
    REQUIRE_FEATURE(FEAT_POWER);
    *power = g.power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    DEV_BEGIN(device, utilization != NULL);
    REQUIRE_FEATURE(FEAT_UTILIZATION);
    utilization->gpu = g.util_gpu;
    utilization->memory = g.util_memory;
    return NVML_SUCCESS;
}

/* ----------------------------------------------------------------- memory */

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    unsigned long long used;
    DEV_BEGIN(device, memory != NULL);
    REQUIRE_FEATURE(FEAT_MEMORY);
    used = g.memory_reserved + g.memory_used;
    if (used > g.memory_total)
        used = g.memory_total;
    memory->total = g.memory_total;
    memory->used = used;
    memory->free = g.memory_total - used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    unsigned long long taken;
    DEV_BEGIN(device, memory != NULL);
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    REQUIRE_FEATURE(FEAT_MEMORY);
    taken = g.memory_reserved + g.memory_used;
    memory->total = g.memory_total;
    memory->reserved = g.memory_reserved;
    memory->used = g.memory_used;
    memory->free = taken > g.memory_total ? 0 : g.memory_total - taken;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                  nvmlEnableState_t *pending)
{
    DEV_BEGIN(device, current != NULL && pending != NULL);
    REQUIRE_FEATURE(FEAT_ECC);
    *current = *pending = g.ecc_mode ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType,
                                         unsigned long long *eccCounts)
{
    DEV_BEGIN(device, eccCounts != NULL && (unsigned)errorType < NVML_MEMORY_ERROR_TYPE_COUNT &&
                          (unsigned)counterType < NVML_ECC_COUNTER_TYPE_COUNT);
    REQUIRE_FEATURE(FEAT_ECC);
    if (!g.ecc_mode)
        return NVML_ERROR_NOT_SUPPORTED;
    *eccCounts = g.ecc[errorType][counterType];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                       unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred)
{
    DEV_BEGIN(device, corrRows && uncRows && isPending && failureOccurred);
    REQUIRE_FEATURE(FEAT_REMAPPED_ROWS);
    *corrRows = g.remap_correctable;
    *uncRows = g.remap_uncorrectable;
    *isPending = g.remap_pending ? 1u : 0u;
    *failureOccurred = g.remap_failure ? 1u : 0u;
    return NVML_SUCCESS;
}

static nvmlReturn_t retired_pages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                  unsigned int *pageCount, unsigned long long *addresses,
                                  unsigned long long *timestamps)
{
    unsigned n, i;
    DEV_BEGIN(device, pageCount != NULL && (unsigned)cause < NVML_PAGE_RETIREMENT_CAUSE_COUNT);
    REQUIRE_FEATURE(FEAT_RETIRED_PAGES);
    n = cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR ? g.retired_dbe : g.retired_sbe;
    if (*pageCount < n || (n > 0 && addresses == NULL)) {
        *pageCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i = 0; i < n; i++) {
        if (addresses)
            addresses[i] = 0x7f0000ull + ((unsigned long long)cause << 20) + (unsigned long long)i * 0x40ull;
        if (timestamps)
            timestamps[i] = 1700000000ull + i;
    }
    *pageCount = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                       unsigned int *pageCount, unsigned long long *addresses)
{
    return retired_pages(device, cause, pageCount, addresses, NULL);
}

nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                          unsigned int *pageCount, unsigned long long *addresses,
                                          unsigned long long *timestamps)
{
    return retired_pages(device, cause, pageCount, addresses, timestamps);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending)
{
    DEV_BEGIN(device, isPending != NULL);
    REQUIRE_FEATURE(FEAT_RETIRED_PAGES);
    *isPending = g.retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------ PCIe / NVLink */

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen)
{
    DEV_BEGIN(device, maxLinkGen != NULL);
    REQUIRE_FEATURE(FEAT_PCIE);
    *maxLinkGen = g.pcie_max_gen;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGenDevice)
{
    return nvmlDeviceGetMaxPcieLinkGeneration(device, maxLinkGenDevice);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth)
{
    DEV_BEGIN(device, maxLinkWidth != NULL);
    REQUIRE_FEATURE(FEAT_PCIE);
    *maxLinkWidth = g.pcie_max_width;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen)
{
    DEV_BEGIN(device, currLinkGen != NULL);
    REQUIRE_FEATURE(FEAT_PCIE);
    *currLinkGen = g.pcie_curr_gen;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth)
{
    DEV_BEGIN(device, currLinkWidth != NULL);
    REQUIRE_FEATURE(FEAT_PCIE);
    *currLinkWidth = g.pcie_curr_width;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    DEV_BEGIN(device, isActive != NULL && link < NVML_NVLINK_MAX_LINKS);
    REQUIRE_FEATURE(FEAT_NVLINK);
    if (link >= g.nvlink_count)
        return NVML_ERROR_NOT_SUPPORTED;
    *isActive = g.nvlink_down[link] ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

/* ----------------------------------------------------------- field values */

static void fv_uint(nvmlFieldValue_t *v, unsigned x)
{
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    v->value.uiVal = x;
    v->nvmlReturn = NVML_SUCCESS;
}

static void fv_ull(nvmlFieldValue_t *v, unsigned long long x)
{
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->value.ullVal = x;
    v->nvmlReturn = NVML_SUCCESS;
}

static void fill_field(const fake_gpu_t *g, nvmlFieldValue_t *v)
{
    int ecc_ok = !(g->unsupported & FEAT_ECC) && g->ecc_mode;
    int remap_ok = !(g->unsupported & FEAT_REMAPPED_ROWS);
    int retired_ok = !(g->unsupported & FEAT_RETIRED_PAGES);
    v->timestamp = now_usec_realtime();
    v->latencyUsec = 0;
    memset(&v->value, 0, sizeof(v->value));
    v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    switch (v->fieldId) {
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL:
        if (ecc_ok) fv_ull(v, g->ecc[NVML_MEMORY_ERROR_TYPE_CORRECTED][NVML_VOLATILE_ECC]);
        break;
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL:
        if (ecc_ok) fv_ull(v, g->ecc[NVML_MEMORY_ERROR_TYPE_UNCORRECTED][NVML_VOLATILE_ECC]);
        break;
    case NVML_FI_DEV_ECC_SBE_AGG_TOTAL:
        if (ecc_ok) fv_ull(v, g->ecc[NVML_MEMORY_ERROR_TYPE_CORRECTED][NVML_AGGREGATE_ECC]);
        break;
    case NVML_FI_DEV_ECC_DBE_AGG_TOTAL:
        if (ecc_ok) fv_ull(v, g->ecc[NVML_MEMORY_ERROR_TYPE_UNCORRECTED][NVML_AGGREGATE_ECC]);
        break;
    case NVML_FI_DEV_RETIRED_SBE:
        if (retired_ok) fv_ull(v, g->retired_sbe);
        break;
    case NVML_FI_DEV_RETIRED_DBE:
        if (retired_ok) fv_ull(v, g->retired_dbe);
        break;
    case NVML_FI_DEV_RETIRED_PENDING:
    case NVML_FI_DEV_RETIRED_PENDING_DBE:
        if (retired_ok) fv_uint(v, g->retired_pending ? 1u : 0u);
        break;
    case NVML_FI_DEV_RETIRED_PENDING_SBE:
        if (retired_ok) fv_uint(v, 0u);
        break;
    case NVML_FI_DEV_NVLINK_LINK_COUNT:
        if (!(g->unsupported & FEAT_NVLINK)) fv_uint(v, g->nvlink_count);
        break;
    case NVML_FI_DEV_REMAPPED_COR:
        if (remap_ok) fv_uint(v, g->remap_correctable);
        break;
    case NVML_FI_DEV_REMAPPED_UNC:
        if (remap_ok) fv_uint(v, g->remap_uncorrectable);
        break;
    case NVML_FI_DEV_REMAPPED_PENDING:
        if (remap_ok) fv_uint(v, g->remap_pending ? 1u : 0u);
        break;
    case NVML_FI_DEV_REMAPPED_FAILURE:
        if (remap_ok) fv_uint(v, g->remap_failure ? 1u : 0u);
        break;
#ifdef NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
        if (!(g->unsupported & FEAT_RECOVERY_ACTION)) fv_uint(v, g->recovery_action);
        break;
#endif
#ifdef NVML_FI_DEV_GPU_TEMP
    case NVML_FI_DEV_GPU_TEMP:
        if (!(g->unsupported & FEAT_TEMPERATURE)) {
            v->valueType = NVML_VALUE_TYPE_DOUBLE;
            v->value.dVal = (double)g->temperature;
            v->nvmlReturn = NVML_SUCCESS;
        }
        break;
#endif
    default:
        break;
    }
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    int i;
    DEV_BEGIN(device, values != NULL && valuesCount > 0);
    for (i = 0; i < valuesCount; i++)
        fill_field(&g, &values[i]);
    return NVML_SUCCESS;
}

/* -------------------------------------------------------------- processes */

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    (void)infos;
    DEV_BEGIN(device, infoCount != NULL);
    *infoCount = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos)
{
    (void)infos;
    DEV_BEGIN(device, infoCount != NULL);
    *infoCount = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    (void)infos;
    DEV_BEGIN(device, infoCount != NULL);
    *infoCount = 0;
    return NVML_SUCCESS;
}

/* ----------------------------------------------------------------- events */

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    DEV_BEGIN(device, eventTypes != NULL);
    *eventTypes = (g.unsupported & FEAT_EVENTS) ? 0ull : g.supported_events;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    struct nvmlEventSet_st *s;
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    if (set == NULL) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_MEMORY;
    }
    (void)refresh_locked();
    s->magic = FAKE_SET_MAGIC;
    s->last_seq = max_seq_locked();
    s->next = g_sets;
    g_sets = s;
    *set = s;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    unsigned long long supported;
    DEV_BEGIN(device, set != NULL);
    supported = (g.unsupported & FEAT_EVENTS) ? 0ull : g.supported_events;
    if (eventTypes == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((eventTypes & ~supported) != 0)
        return NVML_ERROR_NOT_SUPPORTED; /* nothing registered, set stays usable */
    pthread_mutex_lock(&g_lock);
    if (!set_valid_locked(set)) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (set->reg_types[gidx] == 0)
        set->reg_seq[gidx] = max_seq_locked();
    set->reg_types[gidx] |= eventTypes;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

static nvmlReturn_t event_wait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms, int v2)
{
    unsigned long long deadline = now_ms() + timeoutms;
    for (;;) {
        struct next_ctx c;
        int lost = 0;
        unsigned i;
        unsigned long long now, left;
        pthread_mutex_lock(&g_lock);
        if (g_init_count == 0) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_UNINITIALIZED;
        }
        if (set == NULL || data == NULL || !set_valid_locked(set)) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        (void)refresh_locked();
        memset(&c, 0, sizeof(c));
        c.set = set;
        scan_events_locked(next_event_cb, &c);
        if (c.found) {
            data->device = handle_for(c.ev.gpu);
            data->eventType = c.ev.type;
            data->eventData = c.ev.type == nvmlEventTypeXidCriticalError ? c.ev.xid : 0ull;
            if (v2) {
                data->gpuInstanceId = 0xFFFFFFFFu;
                data->computeInstanceId = 0xFFFFFFFFu;
            }
            pthread_mutex_unlock(&g_lock);
            return NVML_SUCCESS;
        }
        for (i = 0; i < g_state.gpu_count && i < FAKE_MAX_GPUS; i++)
            if (set->reg_types[i] && (g_state.gpus[i].lost || !g_state.gpus[i].present))
                lost = 1;
        pthread_mutex_unlock(&g_lock);
        if (lost)
            return NVML_ERROR_GPU_IS_LOST;
        now = now_ms();
        if (now >= deadline)
            return NVML_ERROR_TIMEOUT;
        left = deadline - now;
        sleep_ms(left < FAKE_POLL_MS ? left : FAKE_POLL_MS);
    }
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return event_wait(set, data, timeoutms, 1);
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    /* v1 callers have the old, shorter nvmlEventData_t: don't write the instance ids */
    return event_wait(set, data, timeoutms, 0);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    struct nvmlEventSet_st **pp;
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    for (pp = &g_sets; *pp; pp = &(*pp)->next) {
        if (*pp == set) {
            *pp = set->next;
            set->magic = 0;
            free(set);
            pthread_mutex_unlock(&g_lock);
            return NVML_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return NVML_ERROR_INVALID_ARGUMENT;
}
