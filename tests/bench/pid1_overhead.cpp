// Interleaves `CMD`, `tini -- CMD` and `bt-launch run -- CMD`, round-robin, so that
// machine noise hits all three alike; prints per-exec latency, overhead over a plain
// exec, the ratio to tini's overhead, and peak RSS (wait4's ru_maxrss).
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

struct Contender {
  std::string name;
  std::vector<std::string> argv;
  std::vector<double> micros;
  long max_rss_kib = 0;
};

double RunOnce(Contender& contender) {
  std::vector<char*> argv;
  for (auto& arg : contender.argv) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
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
    std::fprintf(stderr, "usage: %s BT_LAUNCH TINI ROOT_DIR [RUNS]\n", argv[0]);
    return 64;
  }
  const int runs = argc > 4 ? std::atoi(argv[4]) : 2000;
  std::vector<Contender> contenders = {
      {"/bin/true", {"/bin/true"}, {}, 0},
      {"tini -- /bin/true", {argv[2], "-s", "--", "/bin/true"}, {}, 0},
      {"bt-launch run -- /bin/true", {argv[1], "run", "--root", argv[3], "--", "/bin/true"}, {}, 0},
  };
  for (auto& contender : contenders) RunOnce(contender);  // warm the page cache
  for (int i = 0; i < runs; ++i) {
    for (auto& contender : contenders) contender.micros.push_back(RunOnce(contender));
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
  std::printf("bt-launch peak RSS: %.1f MiB (goal: < 8 MiB)\n", double(contenders[2].max_rss_kib) / 1024.0);
  return 0;
}
