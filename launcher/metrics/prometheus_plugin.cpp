// libbt_metrics.so: bt-launch's metrics served with prometheus-cpp's pull exposer (civetweb).
// The launcher's metrics thread publishes a snapshot; a scrape returns the latest one, so a
// scrape never waits for, nor touches, the launcher's state.
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include "launcher/metrics/metrics_abi.h"

namespace {

class Snapshot : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard lock(mutex_);
    return families_;
  }

  void Replace(std::vector<prometheus::MetricFamily> families) {
    std::lock_guard lock(mutex_);
    families_ = std::move(families);
  }

 private:
  mutable std::mutex mutex_;
  std::vector<prometheus::MetricFamily> families_;
};

struct Server {
  std::shared_ptr<Snapshot> snapshot = std::make_shared<Snapshot>();
  std::unique_ptr<prometheus::Exposer> exposer;
};

prometheus::ClientMetric MetricOf(const bt_metric_sample& sample) {
  prometheus::ClientMetric metric;
  for (size_t i = 0; i < sample.label_count; ++i) metric.label.push_back({sample.labels[i].name, sample.labels[i].value});
  if (sample.type == BT_METRIC_COUNTER) {
    metric.counter.value = sample.value;
  } else {
    metric.gauge.value = sample.value;
  }
  return metric;
}

std::vector<prometheus::MetricFamily> FamiliesOf(const bt_metric_sample* samples, size_t count) {
  std::vector<prometheus::MetricFamily> families;
  for (size_t i = 0; i < count; ++i) {
    const bt_metric_sample& sample = samples[i];
    if (families.empty() || families.back().name != sample.name) {
      prometheus::MetricFamily family;
      family.name = sample.name;
      family.help = sample.help;
      family.type = sample.type == BT_METRIC_COUNTER ? prometheus::MetricType::Counter : prometheus::MetricType::Gauge;
      families.push_back(std::move(family));
    }
    families.back().metric.push_back(MetricOf(sample));
  }
  return families;
}

void CopyError(const std::string& what, char* error, size_t error_size) {
  if (error_size == 0) return;
  std::strncpy(error, what.c_str(), error_size - 1);
  error[error_size - 1] = '\0';
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* bt_metrics_serve(const char* bind_address, char* error, size_t error_size) {
  try {
    auto server = std::make_unique<Server>();
    // A scrape copies a few dozen samples, but a client that connects and says nothing holds
    // a thread until the request timeout: with one thread and civetweb's 30 s, one idle
    // connection stopped every scrape for 30 s (review 11). Four threads, 2 s.
    server->exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", bind_address, "num_threads", "4", "request_timeout_ms", "2000"});
    server->exposer->RegisterCollectable(server->snapshot);
    return server.release();
  } catch (const std::exception& failure) {
    CopyError(failure.what(), error, error_size);
  } catch (...) {
    CopyError("an unknown error", error, error_size);
  }
  return nullptr;
}

__attribute__((visibility("default"))) void bt_metrics_publish(void* server, const bt_metric_sample* samples, size_t count) {
  try {
    static_cast<Server*>(server)->snapshot->Replace(FamiliesOf(samples, count));
  } catch (...) {  // out of memory: the scrapes keep the snapshot before
  }
}

}  // extern "C"
