// The C interface between bt-launch and its metrics plugin (libbt_metrics.so, which serves
// them with prometheus-cpp's pull exposer). C, not C++: the binary carries its own
// libstdc++ (linked statically) and the plugin uses the system's, as prometheus-cpp does;
// only plain data crosses, and no exception.
#pragma once

#include <stddef.h>

extern "C" {

enum bt_metric_type { BT_METRIC_GAUGE = 0, BT_METRIC_COUNTER = 1 };

struct bt_metric_label {
  const char* name;
  const char* value;
};

// One sample. Samples of one family (same name) come one after the other, with the same
// help and type.
struct bt_metric_sample {
  const char* name;
  const char* help;
  int type;  // bt_metric_type
  const bt_metric_label* labels;
  size_t label_count;
  double value;
};

// Serves /metrics on `bind_address` ("0.0.0.0:9400"). Returns a handle, or null with why in
// `error` (a port in use, a bad address).
typedef void* (*bt_metrics_serve_fn)(const char* bind_address, char* error, size_t error_size);
// What the next scrapes return: a copy of `samples`, taken whole (a scrape sees one snapshot).
// There is no stop: civetweb's stop waits up to its poll timeout (about 2 s), so the launcher
// leaves the server to its exit.
typedef void (*bt_metrics_publish_fn)(void* server, const bt_metric_sample* samples, size_t count);

}  // extern "C"
