#include "launcher/health/nvml.h"

#include <dlfcn.h>

#include <cstdlib>

namespace bt::launcher::health {
namespace {

constexpr const char* kDefaultLibrary = "libnvidia-ml.so.1";

// dlsym into a typed pointer; null when the library lacks the symbol.
template <typename Function>
void Resolve(void* handle, const char* name, Function& function) {
  function = reinterpret_cast<Function>(dlsym(handle, name));
}

nvml::Functions ResolveAll(void* handle) {
  nvml::Functions f;
  Resolve(handle, "nvmlInit_v2", f.Init_v2);
  Resolve(handle, "nvmlShutdown", f.Shutdown);
  Resolve(handle, "nvmlErrorString", f.ErrorString);
  Resolve(handle, "nvmlSystemGetDriverVersion", f.SystemGetDriverVersion);
  Resolve(handle, "nvmlDeviceGetCount_v2", f.DeviceGetCount_v2);
  Resolve(handle, "nvmlDeviceGetHandleByIndex_v2", f.DeviceGetHandleByIndex_v2);
  Resolve(handle, "nvmlDeviceGetUUID", f.DeviceGetUUID);
  Resolve(handle, "nvmlDeviceGetPciInfo_v3", f.DeviceGetPciInfo_v3);
  Resolve(handle, "nvmlDeviceGetTotalEccErrors", f.DeviceGetTotalEccErrors);
  Resolve(handle, "nvmlDeviceGetRemappedRows", f.DeviceGetRemappedRows);
  Resolve(handle, "nvmlDeviceGetCurrentClocksEventReasons", f.DeviceGetCurrentClocksEventReasons);
  Resolve(handle, "nvmlDeviceGetCurrPcieLinkGeneration", f.DeviceGetCurrPcieLinkGeneration);
  Resolve(handle, "nvmlDeviceGetCurrPcieLinkWidth", f.DeviceGetCurrPcieLinkWidth);
  Resolve(handle, "nvmlDeviceGetMaxPcieLinkGeneration", f.DeviceGetMaxPcieLinkGeneration);
  Resolve(handle, "nvmlDeviceGetMaxPcieLinkWidth", f.DeviceGetMaxPcieLinkWidth);
  Resolve(handle, "nvmlDeviceGetNvLinkState", f.DeviceGetNvLinkState);
  Resolve(handle, "nvmlEventSetCreate", f.EventSetCreate);
  Resolve(handle, "nvmlDeviceRegisterEvents", f.DeviceRegisterEvents);
  Resolve(handle, "nvmlEventSetWait_v2", f.EventSetWait_v2);
  Resolve(handle, "nvmlEventSetFree", f.EventSetFree);
  return f;
}

std::string ErrorTextOf(const nvml::Functions& functions, nvml::Return result) {
  const char* text = functions.ErrorString != nullptr ? functions.ErrorString(result) : nullptr;
  return text != nullptr ? text : "NVML error " + std::to_string(result);
}

}  // namespace

std::string Nvml::DefaultLibrary() {
  const char* named = std::getenv("BT_NVML_LIBRARY");
  return named != nullptr && *named != '\0' ? named : kDefaultLibrary;
}

std::unique_ptr<Nvml> Nvml::Open(const std::string& library, std::string& error) {
  // RTLD_LOCAL: NVML's symbols must not satisfy anything else the launcher loads later.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    error = "NVML not available: " + std::string(why != nullptr ? why : library + ": cannot be loaded");
    return nullptr;
  }
  const nvml::Functions functions = ResolveAll(handle);
  if (functions.Init_v2 == nullptr) {
    error = "NVML not available: " + library + " has no nvmlInit_v2";
    dlclose(handle);
    return nullptr;
  }
  const nvml::Return result = functions.Init_v2();
  if (result != nvml::kSuccess) {
    error = "NVML not available: nvmlInit_v2: " + ErrorTextOf(functions, result);
    dlclose(handle);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(handle, library, functions));
}

Nvml::Nvml(void* handle, std::string library, const nvml::Functions& functions)
    : handle_(handle), library_(std::move(library)), functions_(functions) {}

Nvml::~Nvml() {
  // nvmlShutdown's result changes nothing here: the library is unloaded either way.
  if (functions_.Shutdown != nullptr) functions_.Shutdown();
  dlclose(handle_);
}

std::string Nvml::ErrorText(nvml::Return result) const { return ErrorTextOf(functions_, result); }

std::string Nvml::DriverVersion() const {
  if (functions_.SystemGetDriverVersion == nullptr) return "";
  char version[nvml::kDriverVersionBufferSize] = {};
  if (functions_.SystemGetDriverVersion(version, sizeof version) != nvml::kSuccess) return "";
  return version;
}

}  // namespace bt::launcher::health
