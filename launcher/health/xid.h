// Xid events: what the NVIDIA driver reports when a GPU fails (NVIDIA's Xid catalog). The
// reader registers nvmlEventTypeXidCriticalError on every GPU, as NVIDIA's k8s device plugin
// does: it works inside a container, where the kernel log usually cannot be read.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "launcher/health/findings.h"
#include "launcher/health/nvml.h"

namespace bt::launcher::health {

struct XidClass {
  Severity severity = Severity::kFatal;
  std::string description;  // "GPU has fallen off the bus"
  std::string fix;          // the catalog's immediate action, in words
};

// Whether `xid` is one the application causes (13, 31, 43, 45, 68, 109: the ones the device
// plugin skips): a restart in place can help, so it is a warning.
bool IsApplicationXid(unsigned long long xid);

// Severity, description and fix of `xid`. Every Xid that is not an application's is fatal: its
// catalog action is a GPU reset, a node reboot or a replacement, none of which a restart in
// place gives. An Xid missing from the table is fatal too, with the catalog as its fix.
XidClass ClassifyXid(unsigned long long xid);

// The finding an Xid on `gpu` makes (finding.xid set).
Finding XidFinding(unsigned long long xid, int gpu, const std::string& uuid, const std::string& pci_bus_id);

// Registered on every GPU at Open; Wait blocks in nvmlEventSetWait_v2 (the driver wakes it),
// so a thread of its own runs `while (!stopping) for (auto& f : reader.Wait(1000)) …`. One
// thread may Wait at a time; sampling on another thread at once is safe (NVML is thread-safe).
class XidReader {
 public:
  // `nvml` must outlive the reader. nullptr when no GPU could be registered; `findings` then says why (SKIPPED, or a lost
  // GPU). A GPU that cannot be registered while others can is a SKIPPED finding of its own.
  static std::unique_ptr<XidReader> Open(const Nvml& nvml, std::vector<Finding>& findings);

  ~XidReader();
  XidReader(const XidReader&) = delete;
  XidReader& operator=(const XidReader&) = delete;

  // Waits up to `timeout_ms` for an event, then takes every event already queued without
  // waiting again. One finding per Xid; an empty list after a timeout. A wait that fails
  // (a GPU lost, the driver gone) is a finding too: fatal when a GPU is lost.
  std::vector<Finding> Wait(unsigned timeout_ms);

  // The GPUs registered, by NVML index.
  const std::vector<int>& registered() const { return registered_indices_; }

 private:
  struct Gpu {
    nvml::Device device;
    int index;
    std::string uuid;
    std::string pci_bus_id;
  };

  XidReader(const Nvml& nvml, nvml::EventSet set, std::vector<Gpu> gpus);
  // The finding of one event; a device not registered (cannot happen with a sane driver)
  // still yields the Xid, with the GPU unknown.
  Finding FindingOf(const nvml::EventData& event) const;

  const Nvml& nvml_;
  nvml::EventSet set_;
  std::vector<Gpu> gpus_;
  std::vector<int> registered_indices_;
};

}  // namespace bt::launcher::health
