// What one health sample costs the node (issue 30: goal < 1 ms of CPU per interval): the
// launcher's own reading of every GPU (launcher/health/gpu_checks) and of the used NIC
// ports, timed in this thread's CPU time over many samples. Usage:
//   health_sample NVML_LIBRARY SYSFS_ROOT [SAMPLES]
// With the tests' fake NVML (tests/health/fake_nvml.c, which parses its state file at every
// call) the figure is an upper bound of the NVML side; on a GPU host pass the driver's
// libnvidia-ml.so.1. Prints a table, then one JSON line.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "launcher/health/gpu_checks.h"
#include "launcher/health/ports.h"

namespace {

double ThreadCpuMicros() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return double(now.tv_sec) * 1e6 + double(now.tv_nsec) / 1e3;
}

double Percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  return values[size_t(fraction * double(values.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace bt::launcher::health;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s NVML_LIBRARY SYSFS_ROOT [SAMPLES]\n", argv[0]);
    return 64;
  }
  const int samples = argc > 3 ? std::atoi(argv[3]) : 1000;
  std::string error;
  std::unique_ptr<Nvml> nvml = Nvml::Open(argv[1], error);
  if (!nvml) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 69;
  }
  const std::vector<UsedPort> ports = {{"mlx5_0", 1, ""}, {"mlx5_1", 1, ""}};
  std::vector<PortCounters> baseline = ReadPortCounters(argv[2], ports);
  std::vector<double> gpu_cpu, port_cpu, wall;
  size_t gpus = 0;
  for (int i = 0; i < samples; ++i) {
    const auto started = std::chrono::steady_clock::now();
    double cpu = ThreadCpuMicros();
    NodeSample sample = SampleGpus(*nvml, std::nullopt);
    gpu_cpu.push_back(ThreadCpuMicros() - cpu);
    gpus = sample.gpus.size();
    cpu = ThreadCpuMicros();
    PortCheck check = CheckPorts(argv[2], baseline);
    baseline = std::move(check.counters);
    port_cpu.push_back(ThreadCpuMicros() - cpu);
    wall.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started).count());
  }
  std::printf("samples: %d, GPUs: %zu, ports: %zu, NVML: %s\n", samples, gpus, ports.size(), argv[1]);
  std::printf("%-22s %10s %10s\n", "part", "median_us", "p99_us");
  std::printf("%-22s %10.1f %10.1f\n", "GPUs (CPU time)", Percentile(gpu_cpu, 0.5), Percentile(gpu_cpu, 0.99));
  std::printf("%-22s %10.1f %10.1f\n", "ports (CPU time)", Percentile(port_cpu, 0.5), Percentile(port_cpu, 0.99));
  std::printf("%-22s %10.1f %10.1f\n", "sample (wall)", Percentile(wall, 0.5), Percentile(wall, 0.99));
  std::printf("{\"bench\":\"health_sample\",\"gpus\":%zu,\"ports\":%zu,\"gpu_cpu_us_p50\":%.1f,\"port_cpu_us_p50\":%.1f,"
              "\"wall_us_p50\":%.1f,\"goal_cpu_us\":1000}\n",
              gpus, ports.size(), Percentile(gpu_cpu, 0.5), Percentile(port_cpu, 0.5), Percentile(wall, 0.5));
  return 0;
}
