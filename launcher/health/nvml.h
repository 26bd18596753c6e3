// NVML (libnvidia-ml), loaded with dlopen so that the launcher neither builds nor runs
// against it: a container without a GPU driver starts as before. Only the functions below
// are looked up, each on its own: a driver that lacks one makes the checks that need it
// SKIPPED, never a failure. Types and values are nvml.h's (NVML API 12), declared here
// because the header is not installed where the launcher builds.
#pragma once

#include <memory>
#include <string>

namespace bt::launcher::health {

namespace nvml {

using Return = int;  // nvmlReturn_t (an enum)
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorUninitialized = 1;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;
inline constexpr Return kErrorTimeout = 10;
inline constexpr Return kErrorFunctionNotFound = 13;
inline constexpr Return kErrorGpuIsLost = 15;

struct DeviceHandle;
using Device = DeviceHandle*;  // nvmlDevice_t: struct nvmlDevice_st*
struct EventSetHandle;
using EventSet = EventSetHandle*;  // nvmlEventSet_t: struct nvmlEventSet_st*

inline constexpr unsigned kUuidBufferSize = 96;           // NVML_DEVICE_UUID_V2_BUFFER_SIZE
inline constexpr unsigned kDriverVersionBufferSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
inline constexpr unsigned kMaxNvLinks = 18;               // NVML_NVLINK_MAX_LINKS

// nvmlPciInfo_t, as nvmlDeviceGetPciInfo_v3 fills it.
struct PciInfo {
  char busIdLegacy[16];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE: "00000000:18:00.0"
};

// nvmlEventData_t as NVML 11.1 and later define it; older drivers write only the first three
// fields, which are the ones read.
struct EventData {
  Device device;
  unsigned long long eventType;
  unsigned long long eventData;  // the Xid for nvmlEventTypeXidCriticalError (999: unknown)
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

inline constexpr unsigned long long kEventTypeXidCriticalError = 0x8;  // nvmlEventTypeXidCriticalError

inline constexpr int kMemoryErrorTypeUncorrected = 1;  // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
inline constexpr int kVolatileEcc = 0;                 // NVML_VOLATILE_ECC
inline constexpr int kFeatureEnabled = 1;              // NVML_FEATURE_ENABLED (nvmlEnableState_t)

// nvmlClocksEventReason* bits.
inline constexpr unsigned long long kClocksEventGpuIdle = 0x1;
inline constexpr unsigned long long kClocksEventHwSlowdown = 0x8;
inline constexpr unsigned long long kClocksEventSwThermalSlowdown = 0x20;
inline constexpr unsigned long long kClocksEventHwThermalSlowdown = 0x40;
inline constexpr unsigned long long kClocksEventHwPowerBrakeSlowdown = 0x80;

// Every function used; a null pointer is a symbol the library does not have.
struct Functions {
  Return (*Init_v2)() = nullptr;
  Return (*Shutdown)() = nullptr;
  const char* (*ErrorString)(Return) = nullptr;
  Return (*SystemGetDriverVersion)(char*, unsigned) = nullptr;
  Return (*DeviceGetCount_v2)(unsigned*) = nullptr;
  Return (*DeviceGetHandleByIndex_v2)(unsigned, Device*) = nullptr;
  Return (*DeviceGetUUID)(Device, char*, unsigned) = nullptr;
  Return (*DeviceGetPciInfo_v3)(Device, PciInfo*) = nullptr;
  Return (*DeviceGetTotalEccErrors)(Device, int, int, unsigned long long*) = nullptr;
  Return (*DeviceGetRemappedRows)(Device, unsigned*, unsigned*, unsigned*, unsigned*) = nullptr;
  Return (*DeviceGetCurrentClocksEventReasons)(Device, unsigned long long*) = nullptr;
  Return (*DeviceGetCurrPcieLinkGeneration)(Device, unsigned*) = nullptr;
  Return (*DeviceGetCurrPcieLinkWidth)(Device, unsigned*) = nullptr;
  Return (*DeviceGetMaxPcieLinkGeneration)(Device, unsigned*) = nullptr;
  Return (*DeviceGetMaxPcieLinkWidth)(Device, unsigned*) = nullptr;
  Return (*DeviceGetNvLinkState)(Device, unsigned, int*) = nullptr;
  Return (*EventSetCreate)(EventSet*) = nullptr;
  Return (*DeviceRegisterEvents)(Device, unsigned long long, EventSet) = nullptr;
  Return (*EventSetWait_v2)(EventSet, EventData*, unsigned) = nullptr;
  Return (*EventSetFree)(EventSet) = nullptr;
};

}  // namespace nvml

// The library loaded and initialised; shut down and unloaded when destroyed. NVML is
// thread-safe, so one Nvml may serve a sampling thread and an Xid-reading thread at once.
class Nvml {
 public:
  // BT_NVML_LIBRARY when set, else "libnvidia-ml.so.1" (found as the dynamic loader finds
  // it, which is where the NVIDIA container toolkit mounts it).
  static std::string DefaultLibrary();

  // dlopen(`library`) and nvmlInit_v2. nullptr when either fails, with `error` set to
  // "NVML not available: <why>": whether that fails the node is the caller's decision.
  static std::unique_ptr<Nvml> Open(const std::string& library, std::string& error);

  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  const nvml::Functions& functions() const { return functions_; }
  const std::string& library() const { return library_; }

  // nvmlErrorString's text, or "NVML error <n>" without it.
  std::string ErrorText(nvml::Return result) const;

  // The driver version ("550.54.15"), "" when it cannot be read.
  std::string DriverVersion() const;

 private:
  Nvml(void* handle, std::string library, const nvml::Functions& functions);

  void* handle_;
  std::string library_;
  nvml::Functions functions_;
};

}  // namespace bt::launcher::health
