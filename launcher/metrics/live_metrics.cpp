#include "launcher/metrics/live_metrics.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "launcher/metrics/metrics_abi.h"
#include "launcher/plugin.h"

namespace bt::launcher::metrics {
namespace {

// What a scrape can find. Node 0 adds the job's (bt_launch_job_*, goodput, badput, nodes).
const std::vector<Family> kCatalogue = {
    {"bt_launch_phase", "The launcher's current phase (1 for the phase it is in)", false},
    {"bt_launch_cycle", "The restart cycle the job runs (0 before any restart)", false},
    {"bt_launch_restarts_used", "Restarts in place spent so far (node 0's decisions)", false},
    {"bt_launch_restarts_allowed", "launcher.restart.max_restarts", false},
    {"bt_launch_seconds_since_progress",
     "Seconds since this node's job last made progress (output, heartbeat file, checkpoint; launcher.watchdog on); -1 before any", false},
    {"bt_launch_checkpoints_committed_total", "This node's checkpoint parts committed", true},
    {"bt_launch_checkpoints_failed_total", "This node's checkpoint parts never committed (abandoned)", true},
    {"bt_launch_checkpoints_in_flight", "This node's checkpoint parts handed off and not committed yet", false},
    {"bt_launch_upload_bytes_total", "Bytes of this node's checkpoint parts uploaded", true},
    {"bt_launch_upload_seconds_total", "Seconds from each part's handoff to the end of its upload, summed", true},
    {"bt_launch_health_findings", "Health findings on this node so far, by severity", false},
    {"bt_launch_nodes", "Node 0: the job's nodes by state (ready: running a rank; lost: a rank without a launcher; spare)",
     false},
    {"bt_launch_job_checkpoints_committed_total", "Node 0: checkpoints of the job committed (`latest` moved)", true},
    {"bt_launch_latest_checkpoint_age_seconds", "Node 0: seconds since the newest committed checkpoint was committed",
     false},
    {"bt_launch_wall_seconds", "Node 0: seconds since the job's first launcher started", false},
    {"bt_launch_goodput_seconds", "Node 0: the job's time so far whose training progress is kept (committed)", false},
    {"bt_launch_badput_seconds", "Node 0: the job's time so far lost, by cause", false},
    {"bt_launch_uncommitted_seconds",
     "Node 0: the running cycle's training since its last committed checkpoint (lost if it fails now)", false},
};

const Family* FindFamily(std::string_view name) {
  for (const Family& family : kCatalogue) {
    if (name == family.name) return &family;
  }
  return nullptr;
}

size_t CatalogueIndex(std::string_view name) {
  return size_t(FindFamily(name) - kCatalogue.data());
}

}  // namespace

const std::vector<Family>& Catalogue() { return kCatalogue; }

void SampleSink::Add(std::string_view name, double value, Labels labels) {
  const Family* family = FindFamily(name);
  if (family == nullptr) throw std::logic_error("metric " + std::string(name) + " is not in the catalogue");
  samples_.push_back({family->name, std::move(labels), value});
}

uint16_t MetricsPort(uint16_t configured) {
  const char* text = std::getenv("BT_METRICS_PORT");
  if (text == nullptr || *text == '\0') return configured;
  const std::string digits = text;
  const bool numeric = digits.size() <= 5 && digits.find_first_not_of("0123456789") == std::string::npos;
  const long port = numeric ? std::stol(digits) : -1;
  if (port < 0 || port > 65535) {
    throw std::invalid_argument(std::string("BT_METRICS_PORT: expected a port in [1, 65535], or 0 for off; got \"") +
                                text + "\"");
  }
  return uint16_t(port);
}

struct LiveMetrics::Plugin {
  void* library = nullptr;
  void* server = nullptr;
  bt_metrics_publish_fn publish = nullptr;

  // Neither the server nor the library is stopped: the launcher is exiting, and civetweb's
  // stop waits for its listening thread's next poll timeout, which added 2 s to every job's
  // end (measured with `pid1_overhead`). The exit ends its threads; the server's state is
  // never freed, so a scrape in that moment reads valid memory.
  ~Plugin() = default;

  // Empty on success, else why the server is not up.
  std::string Serve(uint16_t port) {
    const std::string path = PluginPath("BT_METRICS_PLUGIN", "libbt_metrics.so");
    library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      return std::string("cannot load the metrics plugin: ") + dlerror() +
             " (bt-launch built without prometheus-cpp: install prometheus-cpp-dev and build again)";
    }
    auto serve = reinterpret_cast<bt_metrics_serve_fn>(dlsym(library, "bt_metrics_serve"));
    publish = reinterpret_cast<bt_metrics_publish_fn>(dlsym(library, "bt_metrics_publish"));
    if (serve == nullptr || publish == nullptr) return path + " lacks bt_metrics_serve or bt_metrics_publish";
    char error[512] = {};
    server = serve(("0.0.0.0:" + std::to_string(port)).c_str(), error, sizeof error);
    if (server == nullptr) return std::string("cannot serve on port ") + std::to_string(port) + ": " + error;
    return "";
  }
};

LiveMetrics::LiveMetrics(uint16_t port, NodeLabels node, std::chrono::milliseconds every)
    : port_(port), node_(std::move(node)), every_(every), plugin_(std::make_unique<Plugin>()) {
  thread_ = std::thread([this] { Run(); });
}

LiveMetrics::~LiveMetrics() {
  {
    std::lock_guard lock(stop_mutex_);
    stopping_ = true;
  }
  stop_changed_.notify_all();
  thread_.join();
}

std::shared_ptr<void> LiveMetrics::Read(Source source) {
  std::lock_guard lock(sources_mutex_);
  auto entry = sources_.insert(sources_.end(), std::move(source));
  return std::shared_ptr<void>(nullptr, [this, entry](void*) {
    std::lock_guard lock(sources_mutex_);
    sources_.erase(entry);
  });
}

void LiveMetrics::SetPhase(const std::string& phase) {
  std::lock_guard lock(phase_mutex_);
  phase_ = phase;
}

std::vector<Sample> LiveMetrics::Snapshot() {
  SampleSink sink;
  {
    std::lock_guard lock(phase_mutex_);
    sink.Add("bt_launch_phase", 1, {{"phase", phase_}});
  }
  {
    std::lock_guard lock(sources_mutex_);
    for (const Source& source : sources_) {
      // A source that fails loses its samples of this snapshot, never the thread.
      try {
        source(sink);
      } catch (const std::exception& error) {
        spdlog::debug("metrics: a source failed: {}", error.what());
      }
    }
  }
  std::vector<Sample> samples = sink.Take();
  std::stable_sort(samples.begin(), samples.end(),
                   [](const Sample& a, const Sample& b) { return CatalogueIndex(a.name) < CatalogueIndex(b.name); });
  return samples;
}

// The samples as the plugin takes them: C strings that live until it returns.
void LiveMetrics::Publish(const std::vector<Sample>& samples) {
  const std::string rank = std::to_string(rank_.load(std::memory_order_relaxed));
  const std::string slot = std::to_string(node_.slot);
  std::vector<std::vector<bt_metric_label>> labels(samples.size());
  std::vector<bt_metric_sample> plain;
  plain.reserve(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& sample = samples[i];
    const Family& family = *FindFamily(sample.name);
    labels[i] = {{"node", rank.c_str()}, {"slot", slot.c_str()}, {"host", node_.host.c_str()}};
    for (const auto& [name, value] : sample.labels) labels[i].push_back({name.c_str(), value.c_str()});
    plain.push_back({family.name, family.help, family.counter ? BT_METRIC_COUNTER : BT_METRIC_GAUGE, labels[i].data(),
                     labels[i].size(), sample.value});
  }
  plugin_->publish(plugin_->server, plain.data(), plain.size());
}

void LiveMetrics::Run() {
  const std::string why = plugin_->Serve(port_);
  if (!why.empty()) {
    spdlog::error("metrics: not served: {}; the job runs without them", why);
    return;
  }
  served_ = true;
  spdlog::info("metrics: serving Prometheus text on port {} (/metrics)", port_);
  std::unique_lock lock(stop_mutex_);
  while (!stopping_) {
    lock.unlock();
    Publish(Snapshot());
    lock.lock();
    stop_changed_.wait_for(lock, every_, [&] { return stopping_; });
  }
}

}  // namespace bt::launcher::metrics
