/* A fake libnvidia-ml.so.1 for the health tests: the NVML functions the launcher uses,
 * answering from a state file that is read again at every call, so that a test can change
 * a GPU's health while a job (or an Xid reader) runs. The tests point BT_NVML_LIBRARY at it.
 *
 * BT_FAKE_NVML_STATE names the file; a missing file is a node with no GPU. One setting a
 * line, fields separated by blanks, '#' starts a comment. Write it atomically (a temporary
 * file renamed over it): a reader must never see half a file.
 *
 *   init_error <code>              nvmlInit_v2 returns <code> (9: driver not loaded)
 *   driver <version>               nvmlSystemGetDriverVersion ("550.54.15"; default "0.0.fake")
 *   gpus <n>                       nvmlDeviceGetCount_v2 (0 to 64)
 *   gpu <i> uuid <uuid>            default GPU-00000000-0000-0000-0000-0000000000<ii>
 *   gpu <i> pci <bus id>           default 00000000:<i + 0x10, hex>:00.0
 *   gpu <i> lost 1                 every call about GPU i returns NVML_ERROR_GPU_IS_LOST (15),
 *                                  nvmlDeviceGetHandleByIndex_v2 included
 *   gpu <i> lost 2                 the handle, UUID and PCI info still answer (what NVML had
 *                                  when the GPU fell off); every other call is lost
 *   gpu <i> ecc_uncorrected <n>    volatile uncorrected ECC total (default 0)
 *   gpu <i> remap <pending> <failure>   nvmlDeviceGetRemappedRows' flags (default 0 0)
 *   gpu <i> clocks_reasons <mask>  clocks event reasons, hex (0x48) or decimal (default 0)
 *   gpu <i> pcie <gen> <width> <max gen> <max width>   default 5 16 5 16
 *   gpu <i> nvlink <states>        one character a link, 1 up, 0 down ("1110": link 3 down);
 *                                  links past the string are NVML_ERROR_NOT_SUPPORTED; "none"
 *                                  (the default) is a GPU without NVLink, as a PCIe card
 *   xid <seq> <gpu> <xid>          an Xid event for nvmlEventSetWait_v2, delivered once to each
 *                                  event set that registered GPU <gpu> (the fake remembers
 *                                  which <seq> each set was given)
 *
 * Built twice: whole, and with -DFAKE_NVML_MINIMAL, which exports only nvmlInit_v2,
 * nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2 and nvmlDeviceGetUUID (an old or
 * partial driver: every other check must be SKIPPED).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <sys/stat.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlEventSet_st* nvmlEventSet_t;

enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_TIMEOUT = 10,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_MEMORY = 20,
};

#define MAX_GPUS 64
#define MAX_EVENTS 256
#define MAX_LINKS 18
#define XID_CRITICAL_ERROR 0x8ULL

typedef struct {
  char uuid[96];
  char pci[32];
  int lost;
  unsigned long long ecc_uncorrected;
  unsigned remap_pending, remap_failure;
  unsigned long long clocks_reasons;
  unsigned pcie_gen, pcie_width, pcie_max_gen, pcie_max_width;
  char nvlink[MAX_LINKS + 1];
} fake_gpu;

typedef struct {
  long seq;
  int gpu;
  unsigned long long xid;
} fake_event;

typedef struct {
  int init_error;
  char driver[80];
  int gpus;
  fake_gpu gpu[MAX_GPUS];
  int events;
  fake_event event[MAX_EVENTS];
} fake_state;

/* nvmlEventData_t (NVML 11.1 and later). */
typedef struct {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlEventData_t;

/* nvmlPciInfo_t. */
typedef struct {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;

/* An event set: which GPUs registered, and which events it was given. */
struct nvmlEventSet_st {
  int registered[MAX_GPUS];
  long delivered[MAX_EVENTS];
  int delivered_count;
};

/* Device handles point into this array: handle - devices is the index. */
static char devices[MAX_GPUS];

static void default_gpu(fake_gpu* gpu, int index) {
  memset(gpu, 0, sizeof *gpu);
  snprintf(gpu->uuid, sizeof gpu->uuid, "GPU-00000000-0000-0000-0000-0000000000%02d", index);
  snprintf(gpu->pci, sizeof gpu->pci, "00000000:%02X:00.0", (unsigned)(index + 0x10));
  gpu->pcie_gen = gpu->pcie_max_gen = 5;
  gpu->pcie_width = gpu->pcie_max_width = 16;
}

static void parse_gpu_line(fake_state* state, int index, const char* key, const char* rest) {
  if (index < 0 || index >= MAX_GPUS) return;
  fake_gpu* gpu = &state->gpu[index];
  if (strcmp(key, "uuid") == 0) sscanf(rest, "%95s", gpu->uuid);
  else if (strcmp(key, "pci") == 0) sscanf(rest, "%31s", gpu->pci);
  else if (strcmp(key, "lost") == 0) sscanf(rest, "%d", &gpu->lost);
  else if (strcmp(key, "ecc_uncorrected") == 0) sscanf(rest, "%llu", &gpu->ecc_uncorrected);
  else if (strcmp(key, "remap") == 0) sscanf(rest, "%u %u", &gpu->remap_pending, &gpu->remap_failure);
  else if (strcmp(key, "clocks_reasons") == 0) gpu->clocks_reasons = strtoull(rest, NULL, 0);
  else if (strcmp(key, "pcie") == 0)
    sscanf(rest, "%u %u %u %u", &gpu->pcie_gen, &gpu->pcie_width, &gpu->pcie_max_gen, &gpu->pcie_max_width);
  else if (strcmp(key, "nvlink") == 0 && sscanf(rest, "%18s", gpu->nvlink) == 1 && strcmp(gpu->nvlink, "none") == 0)
    gpu->nvlink[0] = '\0';
}

static void parse_line(fake_state* state, const char* line) {
  char key[32];
  int used = 0;
  if (sscanf(line, "%31s %n", key, &used) != 1 || key[0] == '#') return;
  const char* rest = line + used;
  if (strcmp(key, "init_error") == 0) {
    sscanf(rest, "%d", &state->init_error);
  } else if (strcmp(key, "driver") == 0) {
    sscanf(rest, "%79s", state->driver);
  } else if (strcmp(key, "gpus") == 0) {
    sscanf(rest, "%d", &state->gpus);
    if (state->gpus < 0) state->gpus = 0;
    if (state->gpus > MAX_GPUS) state->gpus = MAX_GPUS;
  } else if (strcmp(key, "gpu") == 0) {
    int index = -1;
    char field[32];
    int field_end = 0;
    if (sscanf(rest, "%d %31s %n", &index, field, &field_end) >= 2) parse_gpu_line(state, index, field, rest + field_end);
  } else if (strcmp(key, "xid") == 0 && state->events < MAX_EVENTS) {
    fake_event* event = &state->event[state->events];
    if (sscanf(rest, "%ld %d %llu", &event->seq, &event->gpu, &event->xid) == 3) ++state->events;
  }
}

/* The state file parsed. */
static void parse_state(fake_state* state, const char* path) {
  memset(state, 0, sizeof *state);
  snprintf(state->driver, sizeof state->driver, "0.0.fake");
  for (int i = 0; i < MAX_GPUS; ++i) default_gpu(&state->gpu[i], i);
  FILE* file = path != NULL ? fopen(path, "r") : NULL;
  if (file == NULL) return;
  char line[512];
  while (fgets(line, sizeof line, file) != NULL) parse_line(state, line);
  fclose(file);
}

/* The state file as it is now: parsed again only when it changed (another inode, size or
 * mtime; tests replace it by a rename), so that a sample costs what a driver's calls cost,
 * not a file parse per call (tests/bench/health_sample.cpp). */
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static fake_state cached;
static struct stat cached_stat;
static int cache_valid;

static void read_state(fake_state* state) {
  const char* path = getenv("BT_FAKE_NVML_STATE");
  struct stat now;
  const int exists = path != NULL && stat(path, &now) == 0;
  pthread_mutex_lock(&cache_lock);
  const int same = exists && cache_valid && now.st_ino == cached_stat.st_ino && now.st_dev == cached_stat.st_dev &&
                   now.st_size == cached_stat.st_size && now.st_mtim.tv_sec == cached_stat.st_mtim.tv_sec &&
                   now.st_mtim.tv_nsec == cached_stat.st_mtim.tv_nsec;
  if (!same) {
    parse_state(&cached, exists ? path : NULL);
    cache_valid = exists;
    if (exists) cached_stat = now;
  }
  memcpy(state, &cached, sizeof *state);
  pthread_mutex_unlock(&cache_lock);
}

/* The GPU behind `device` in `state`, or NULL (with *result set) when there is none or it is
 * lost; `identity` calls (handle, UUID, PCI info) still answer for a GPU marked "lost 2". */
static fake_gpu* gpu_of(fake_state* state, nvmlDevice_t device, int identity, nvmlReturn_t* result) {
  const char* handle = (const char*)device;
  if (handle < devices || handle >= devices + MAX_GPUS || handle - devices >= state->gpus) {
    *result = NVML_ERROR_INVALID_ARGUMENT;
    return NULL;
  }
  fake_gpu* gpu = &state->gpu[handle - devices];
  if (gpu->lost == 1 || (gpu->lost == 2 && !identity)) {
    *result = NVML_ERROR_GPU_IS_LOST;
    return NULL;
  }
  *result = NVML_SUCCESS;
  return gpu;
}

/* Reads the state into a heap copy (it is large) and finds the GPU; the caller frees `*state`. */
static fake_gpu* load_gpu_as(nvmlDevice_t device, int identity, fake_state** state, nvmlReturn_t* result) {
  *state = malloc(sizeof **state);
  if (*state == NULL) {
    *result = NVML_ERROR_MEMORY;
    return NULL;
  }
  read_state(*state);
  return gpu_of(*state, device, identity, result);
}

static fake_gpu* load_identity(nvmlDevice_t device, fake_state** state, nvmlReturn_t* result) {
  return load_gpu_as(device, 1, state, result);
}

nvmlReturn_t nvmlInit_v2(void) {
  fake_state* state = malloc(sizeof *state);
  if (state == NULL) return NVML_ERROR_MEMORY;
  read_state(state);
  const nvmlReturn_t result = state->init_error;
  free(state);
  return result;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  fake_state* state = malloc(sizeof *state);
  if (state == NULL) return NVML_ERROR_MEMORY;
  read_state(state);
  *count = (unsigned)state->gpus;
  free(state);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (device == NULL || index >= MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
  fake_state* state = NULL;
  nvmlReturn_t result = NVML_SUCCESS;
  load_identity((nvmlDevice_t)(devices + index), &state, &result);
  free(state);
  if (result == NVML_SUCCESS) *device = (nvmlDevice_t)(devices + index);
  return result;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  fake_state* state = NULL;
  nvmlReturn_t result = NVML_SUCCESS;
  const fake_gpu* gpu = load_identity(device, &state, &result);
  if (gpu != NULL && strlen(gpu->uuid) >= length) result = NVML_ERROR_INSUFFICIENT_SIZE;
  if (gpu != NULL && result == NVML_SUCCESS) memcpy(uuid, gpu->uuid, strlen(gpu->uuid) + 1);
  free(state);
  return result;
}

#ifndef FAKE_NVML_MINIMAL

/* Guards the event sets: an Xid reader waits on one thread while others register or sample. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static fake_gpu* load_gpu(nvmlDevice_t device, fake_state** state, nvmlReturn_t* result) {
  return load_gpu_as(device, 0, state, result);
}

nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    default: return "Unknown Error";
  }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  fake_state* state = malloc(sizeof *state);
  if (state == NULL) return NVML_ERROR_MEMORY;
  read_state(state);
  nvmlReturn_t result = NVML_ERROR_INSUFFICIENT_SIZE;
  if (strlen(state->driver) < length) {
    memcpy(version, state->driver, strlen(state->driver) + 1);
    result = NVML_SUCCESS;
  }
  free(state);
  return result;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  fake_state* state = NULL;
  nvmlReturn_t result = NVML_SUCCESS;
  const fake_gpu* gpu = load_identity(device, &state, &result);
  if (gpu != NULL) {
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", gpu->pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%.15s", gpu->pci + 4);
  }
  free(state);
  return result;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter_type, unsigned long long* count) {
  fake_state* state = NULL;
  nvmlReturn_t result = NVML_SUCCESS;
  const fake_gpu* gpu = load_gpu(device, &state, &result);
  /* Only what the launcher asks for: uncorrected (1), volatile (0). */
  if (gpu != NULL) *count = error_type == 1 && counter_type == 0 ? gpu->ecc_uncorrected : 0;
  free(state);
  return result;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int* corrected, unsigned int* uncorrected,
                                       unsigned int* pending, unsigned int* failure) {
  fake_state* state = NULL;
  nvmlReturn_t result = NVML_SUCCESS;
  const fake_gpu* gpu = load_gpu(device, &state, &result);
  if (gpu != NULL) {
    *corrected = 0;
    *uncorrected = gpu->remap_pending;
    *pending = gpu->remap_pending;
    *failure = gpu->remap_failure;
  }
  free(state);
  return result;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long* reasons) {
  fake_state* state = NULL;
  nvmlReturn_t result = NVML_SUCCESS;
  const fake_gpu* gpu = load_gpu(device, &state, &result);
  if (gpu != NULL) *reasons = gpu->clocks_reasons;
  free(state);
  return result;
}

/* One of the four PCIe readings: which = 0 gen, 1 width, 2 max gen, 3 max width. */
static nvmlReturn_t pcie_reading(nvmlDevice_t device, int which, unsigned int* value) {
  fake_state* state = NULL;
  nvmlReturn_t result = NVML_SUCCESS;
  const fake_gpu* gpu = load_gpu(device, &state, &result);
  if (gpu != NULL) {
    const unsigned readings[4] = {gpu->pcie_gen, gpu->pcie_width, gpu->pcie_max_gen, gpu->pcie_max_width};
    *value = readings[which];
  }
  free(state);
  return result;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int* value) { return pcie_reading(device, 0, value); }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int* value) { return pcie_reading(device, 1, value); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int* value) { return pcie_reading(device, 2, value); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int* value) { return pcie_reading(device, 3, value); }

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int* active) {
  fake_state* state = NULL;
  nvmlReturn_t result = NVML_SUCCESS;
  const fake_gpu* gpu = load_gpu(device, &state, &result);
  if (gpu != NULL && link >= strlen(gpu->nvlink)) result = NVML_ERROR_NOT_SUPPORTED;
  if (gpu != NULL && result == NVML_SUCCESS) *active = gpu->nvlink[link] == '1' ? 1 : 0;
  free(state);
  return result;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *set = calloc(1, sizeof **set);
  return *set != NULL ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
  if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  free(set);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
  if (set == NULL || types != XID_CRITICAL_ERROR) return NVML_ERROR_INVALID_ARGUMENT;
  fake_state* state = NULL;
  nvmlReturn_t result = NVML_SUCCESS;
  const fake_gpu* gpu = load_gpu(device, &state, &result);
  if (gpu != NULL) {
    pthread_mutex_lock(&lock);
    set->registered[(const char*)device - devices] = 1;
    pthread_mutex_unlock(&lock);
  }
  free(state);
  return result;
}

static int was_delivered(const nvmlEventSet_t set, long seq) {
  for (int i = 0; i < set->delivered_count; ++i) {
    if (set->delivered[i] == seq) return 1;
  }
  return 0;
}

/* The first event of `state` that `set` registered for and was not given yet, marked given. */
static const fake_event* take_event(const fake_state* state, nvmlEventSet_t set) {
  const fake_event* taken = NULL;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < state->events && taken == NULL; ++i) {
    const fake_event* event = &state->event[i];
    if (event->gpu < 0 || event->gpu >= MAX_GPUS || !set->registered[event->gpu]) continue;
    if (was_delivered(set, event->seq) || set->delivered_count >= MAX_EVENTS) continue;
    set->delivered[set->delivered_count++] = event->seq;
    taken = event;
  }
  pthread_mutex_unlock(&lock);
  return taken;
}

static long long now_ms(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* Polls the state file every 5 ms until an event is there or `timeout_ms` has passed. */
/* Whether a GPU `set` registered is lost for good ("lost 1"). */
static int registered_gpu_lost(const fake_state* state, const nvmlEventSet_t set) {
  for (int gpu = 0; gpu < state->gpus && gpu < MAX_GPUS; ++gpu) {
    if (set->registered[gpu] && state->gpu[gpu].lost == 1) return 1;
  }
  return 0;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data, unsigned int timeout_ms) {
  if (set == NULL || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  fake_state* state = malloc(sizeof *state);
  if (state == NULL) return NVML_ERROR_MEMORY;
  const long long deadline = now_ms() + timeout_ms;
  nvmlReturn_t result = NVML_ERROR_TIMEOUT;
  for (;;) {
    read_state(state);
    if (registered_gpu_lost(state, set)) {  /* as a driver does: the wait fails at once */
      result = NVML_ERROR_GPU_IS_LOST;
      break;
    }
    const fake_event* event = take_event(state, set);
    if (event != NULL) {
      memset(data, 0, sizeof *data);
      data->device = (nvmlDevice_t)(devices + event->gpu);
      data->eventType = XID_CRITICAL_ERROR;
      data->eventData = event->xid;
      data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
      result = NVML_SUCCESS;
      break;
    }
    if (now_ms() >= deadline) break;
    const struct timespec pause = {0, 5 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  free(state);
  return result;
}

#endif /* FAKE_NVML_MINIMAL */
