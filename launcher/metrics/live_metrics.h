// Live metrics (issue 31 §2, docs/GOODPUT.md): with launcher.metrics.port (or BT_METRICS_PORT)
// every node serves Prometheus text on /metrics. A thread of its own builds a snapshot once a
// second from the sources the launcher registers and hands it to the plugin
// (libbt_metrics.so, prometheus-cpp's pull exposer); a scrape reads only that snapshot, so
// scrapes never reach the job's state or slow it. Off (no port): nothing is loaded, no thread.
// Every sample carries the node's labels (node: its training rank, slot, host); any other
// label has a fixed set of values (a phase, a cause, a severity): never a name or a message.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace bt::launcher::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

struct Sample {
  std::string_view name;  // one of the catalogue's (live_metrics.cpp)
  Labels labels;          // besides the node's
  double value = 0;
};

// What a source adds to one snapshot.
class SampleSink {
 public:
  // Throws std::logic_error for a name outside the catalogue: every name is declared once,
  // with its help and type.
  void Add(std::string_view name, double value, Labels labels = {});
  std::vector<Sample> Take() { return std::move(samples_); }

 private:
  std::vector<Sample> samples_;
};

// The catalogue's families in the order they are served; and each one's help and type.
struct Family {
  const char* name;  // C strings: what the plugin takes
  const char* help;
  bool counter = false;
};
const std::vector<Family>& Catalogue();

// The node's own labels, on every sample.
struct NodeLabels {
  int slot = 0;
  std::string host;
};

// The port launcher.metrics.port asks for, BT_METRICS_PORT overriding it (one per process when
// several nodes share a host); 0: off. Throws std::invalid_argument naming BT_METRICS_PORT.
uint16_t MetricsPort(uint16_t configured);

class LiveMetrics {
 public:
  using Source = std::function<void(SampleSink&)>;

  // Starts the metrics thread, which loads the plugin and serves on `port` (every address).
  // Never throws for the server: a port in use or a missing plugin is logged (the job runs
  // without metrics), and served() says so.
  LiveMetrics(uint16_t port, NodeLabels node, std::chrono::milliseconds every = std::chrono::seconds(1));
  ~LiveMetrics();
  LiveMetrics(const LiveMetrics&) = delete;
  LiveMetrics& operator=(const LiveMetrics&) = delete;

  // `source` adds its samples to every snapshot until the handle returned is destroyed; the
  // handle's destruction waits for a snapshot in progress. Keep the handle beside what the
  // source reads, declared after it, so that it goes first.
  [[nodiscard]] std::shared_ptr<void> Read(Source source);
  // The training rank this node runs now (-1: a spare): the `node` label.
  void SetRank(int rank) { rank_.store(rank, std::memory_order_relaxed); }
  void SetPhase(const std::string& phase);
  // Whether the server came up (after the thread's first turn; false while it starts).
  bool served() const { return served_.load(); }
  // Builds one snapshot now (tests; the thread does it every `every`).
  std::vector<Sample> Snapshot();

 private:
  void Run();
  void Publish(const std::vector<Sample>& samples);

  uint16_t port_;
  NodeLabels node_;
  std::chrono::milliseconds every_;
  std::atomic<int> rank_{-1};
  std::atomic<bool> served_{false};
  std::mutex phase_mutex_;
  std::string phase_ = "identity";
  std::mutex sources_mutex_;  // held while a snapshot reads the sources
  std::list<Source> sources_;
  std::mutex stop_mutex_;
  std::condition_variable stop_changed_;
  bool stopping_ = false;
  struct Plugin;
  std::unique_ptr<Plugin> plugin_;
  std::thread thread_;
};

}  // namespace bt::launcher::metrics
