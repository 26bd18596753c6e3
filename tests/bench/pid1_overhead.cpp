// Interleaves `CMD`, `tini -- CMD` and `bt-launch run -- CMD` (the watchdog on, as by
// default), round-robin, so that machine noise hits all alike; prints per-exec latency,
// overhead over a plain exec, the ratio to tini's overhead, and peak RSS (wait4's
// ru_maxrss). Two more contenders in the same rounds say what the watchdog costs: `run`
// given a config (BT_JOB_CONFIG) with the watchdog on, and the same config with it off
// (both parse a config, which the headline run does not); and one more, the health checks
// off, says what looking for NVML costs where there is none (launcher.health "auto").
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern char** environ;

namespace {

constexpr const char* kWatchdogOnConfig = R"(BT_JOB_CONFIG={"runtime":{"start_commands":["true"]}})";
constexpr const char* kWatchdogOffConfig =
    R"(BT_JOB_CONFIG={"runtime":{"start_commands":["true"]},"launcher":{"watchdog":{"stall_timeout_s":0,"startup_timeout_s":0}}})";

// Live metrics on (launcher.metrics.port): the plugin loaded, a server started and stopped.
constexpr const char* kMetricsOnConfig =
    R"(BT_JOB_CONFIG={"runtime":{"start_commands":["true"]},"launcher":{"metrics":{"port":31998}}})";

constexpr const char* kHealthOffConfig =
    R"(BT_JOB_CONFIG={"runtime":{"start_commands":["true"]},"launcher":{"health":{"enabled":false}}})";

struct Contender {
  std::string name;
  std::vector<std::string> argv;
  std::string config;  // a BT_JOB_CONFIG=... entry that replaces this process's, or none
  std::vector<double> micros;
  long max_rss_kib = 0;
};

// This process's environment, without BT_JOB_CONFIG, plus the contender's config.
std::vector<char*> EnvironmentOf(Contender& contender) {
  std::vector<char*> entries;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::string(*entry).rfind("BT_JOB_CONFIG=", 0) != 0) entries.push_back(*entry);
  }
  if (!contender.config.empty()) entries.push_back(contender.config.data());
  entries.push_back(nullptr);
  return entries;
}

double RunOnce(Contender& contender) {
  std::vector<char*> argv;
  for (auto& arg : contender.argv) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<char*> environment = EnvironmentOf(contender);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environment.data()) != 0) {
    std::perror(argv[0]);
    std::exit(1);
  }
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  double micros = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  posix_spawn_file_actions_destroy(&actions);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "%s failed (status %d)\n", contender.name.c_str(), status);
    std::exit(1);
  }
  contender.max_rss_kib = std::max(contender.max_rss_kib, usage.ru_maxrss);
  return micros;
}

double Percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  return values[size_t(fraction * double(values.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s BT_LAUNCH TINI ROOT_DIR [RUNS [BASELINE_BT_LAUNCH]]\n", argv[0]);
    return 64;
  }
  const int runs = argc > 4 ? std::atoi(argv[4]) : 2000;
  const std::vector<std::string> run = {argv[1], "run", "--root", argv[3], "--", "/bin/true"};
  std::vector<Contender> contenders = {
      {"/bin/true", {"/bin/true"}, "", {}, 0},
      {"tini -- /bin/true", {argv[2], "-s", "--", "/bin/true"}, "", {}, 0},
      {"bt-launch run -- /bin/true", run, "", {}, 0},
      {"  config, watchdog on", run, kWatchdogOnConfig, {}, 0},
      {"  config, watchdog off", run, kWatchdogOffConfig, {}, 0},
      {"  config, health off", run, kHealthOffConfig, {}, 0},
      {"  config, metrics on", run, kMetricsOnConfig, {}, 0},
  };
  // Another build in the same rounds (the commit before a change): what the change costs.
  if (argc > 5) contenders.push_back({"baseline run -- /bin/true", {argv[5], "run", "--root", argv[3], "--", "/bin/true"}, "", {}, 0});
  for (auto& contender : contenders) RunOnce(contender);  // warm the page cache
  // Each round starts with the next contender: the one that runs right after /bin/true or
  // tini finds colder caches than one that follows another bt-launch, and no contender
  // may always be that one.
  for (int i = 0; i < runs; ++i) {
    for (size_t k = 0; k < contenders.size(); ++k) {
      Contender& contender = contenders[(k + size_t(i)) % contenders.size()];
      contender.micros.push_back(RunOnce(contender));
    }
  }
  const double plain = Percentile(contenders[0].micros, 0.5);
  const double tini_overhead = Percentile(contenders[1].micros, 0.5) - plain;
  std::printf("runs per command: %d (interleaved)\n", runs);
  std::printf("%-28s %10s %10s %12s %10s\n", "command", "median_us", "p90_us", "overhead_us", "maxrss_kib");
  for (auto& contender : contenders) {
    double median = Percentile(contender.micros, 0.5);
    std::printf("%-28s %10.0f %10.0f %12.0f %10ld\n", contender.name.c_str(), median, Percentile(contender.micros, 0.9),
                median - plain, contender.max_rss_kib);
  }
  const double ours = Percentile(contenders[2].micros, 0.5) - plain;
  std::printf("bt-launch overhead - tini overhead: %.0f us (goal: < 1000 us)\n", ours - tini_overhead);
  std::printf("bt-launch overhead / tini overhead: %.2f\n", tini_overhead > 0 ? ours / tini_overhead : 0.0);
  std::printf("the watchdog adds: %.0f us (config, watchdog on - config, watchdog off)\n",
              Percentile(contenders[3].micros, 0.5) - Percentile(contenders[4].micros, 0.5));
  std::printf("health without NVML adds: %.0f us (config, watchdog on - config, health off; goal: < 100 us)\n",
              Percentile(contenders[3].micros, 0.5) - Percentile(contenders[5].micros, 0.5));
  const double metrics = Percentile(contenders[6].micros, 0.5) - Percentile(contenders[3].micros, 0.5);
  std::printf("metrics on adds: %.0f us (config, metrics on - config, watchdog on)\n", metrics);
  const double baseline = argc > 5 ? Percentile(contenders[7].micros, 0.5) - plain : 0;
  if (argc > 5) std::printf("this build - baseline: %.0f us\n", ours - baseline);
  std::printf("bt-launch peak RSS: %.1f MiB (goal: < 8 MiB)\n", double(contenders[2].max_rss_kib) / 1024.0);
  std::printf("{\"runs\": %d, \"overhead_over_tini_us\": %.0f, \"ratio_to_tini\": %.2f, \"metrics_on_adds_us\": %.0f, "
              "\"over_baseline_us\": %.0f, \"peak_rss_kib\": %ld}\n",
              runs, ours - tini_overhead, tini_overhead > 0 ? ours / tini_overhead : 0.0, metrics, ours - baseline,
              contenders[2].max_rss_kib);
  return 0;
}
