// One sample of this node's GPUs through NVML (issue 30, point 1): the GPU count against
// the expected one, and per GPU: lost, uncorrectable ECC, row remapping, NVLink, clocks
// slowed by the hardware, PCIe link below its maximum. Cheap enough to run every
// `interval_s`: a few NVML calls per GPU, no allocation beyond the findings.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/health/findings.h"
#include "launcher/health/nvml.h"

namespace bt::launcher::health {

// What was read of one GPU (for `doctor` and the docs): an empty optional is a reading that
// was not available (no such function, not supported, or the GPU was lost before it).
struct GpuReadings {
  int index = 0;
  std::string uuid;
  std::string pci_bus_id;
  bool lost = false;
  std::optional<unsigned long long> ecc_uncorrected_volatile;
  std::optional<bool> remap_pending;
  std::optional<bool> remap_failure;
  std::optional<unsigned long long> clocks_event_reasons;
  std::optional<unsigned> pcie_generation;
  std::optional<unsigned> pcie_max_generation;
  std::optional<unsigned> pcie_width;
  std::optional<unsigned> pcie_max_width;
  int nvlinks = 0;     // links that exist
  int nvlinks_up = 0;  // of those, active
};

struct NodeSample {
  std::string driver_version;  // "" when it cannot be read
  std::optional<unsigned> gpu_count;
  std::vector<GpuReadings> gpus;
  std::vector<Finding> findings;
};

// Samples every GPU NVML sees. `expected_gpus` (from launcher.health.expect_gpus, resolved
// by the caller) makes fewer GPUs a fatal finding; nullopt skips that comparison.
NodeSample SampleGpus(const Nvml& nvml, std::optional<unsigned> expected_gpus);

// "HW slowdown, HW thermal slowdown": the names of the slowdown bits set in `reasons`
// (those a health check warns about), "" when none is.
std::string DescribeSlowdown(unsigned long long reasons);

}  // namespace bt::launcher::health
