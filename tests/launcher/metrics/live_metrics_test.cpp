// The live metrics' snapshot (launcher/metrics/live_metrics.h): names only from the
// catalogue, families in its order, a source gone once its handle is, BT_METRICS_PORT read
// strictly. The server itself is tested with a real Prometheus (multinode_test.cpp, Metrics).
#include "launcher/metrics/live_metrics.h"

#include <stdlib.h>

#include <set>
#include <stdexcept>

#include <gtest/gtest.h>

namespace bt::launcher::metrics {
namespace {

TEST(SampleSink, RefusesANameOutsideTheCatalogue) {
  SampleSink sink;
  EXPECT_THROW(sink.Add("bt_launch_checkpoint_named_x", 1), std::logic_error);
  sink.Add("bt_launch_cycle", 2);
  ASSERT_EQ(sink.Take().size(), 1u);
}

TEST(SampleSink, EveryFamilyIsNamedOnceWithHelp) {
  std::set<std::string_view> names;
  for (const Family& family : Catalogue()) {
    const std::string_view name = family.name;
    const std::string_view help = family.help;
    EXPECT_TRUE(names.insert(name).second) << name;
    EXPECT_TRUE(name.starts_with("bt_launch_")) << name;
    EXPECT_FALSE(help.empty()) << name;
    EXPECT_EQ(family.counter, name.ends_with("_total")) << name;
  }
}

// No plugin where it is looked for: the server never comes up, the snapshots are still built.
TEST(LiveMetrics, ASourceAddsToEverySnapshotUntilItsHandleIsGone) {
  setenv("BT_METRICS_PLUGIN", "/nonexistent/libbt_metrics.so", 1);
  LiveMetrics live(0, {3, "host"});
  int calls = 0;
  auto handle = live.Read([&calls](SampleSink& sink) {
    ++calls;
    sink.Add("bt_launch_upload_bytes_total", 5);
    sink.Add("bt_launch_cycle", 1);
  });
  live.SetPhase("run");
  std::vector<Sample> samples = live.Snapshot();
  ASSERT_EQ(samples.size(), 3u);
  // The catalogue's order, whatever the sources' order.
  EXPECT_EQ(samples[0].name, "bt_launch_phase");
  EXPECT_EQ(samples[0].labels, (Labels{{"phase", "run"}}));
  EXPECT_EQ(samples[1].name, "bt_launch_cycle");
  EXPECT_EQ(samples[2].name, "bt_launch_upload_bytes_total");
  handle.reset();
  EXPECT_EQ(live.Snapshot().size(), 1u);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(live.served());
  unsetenv("BT_METRICS_PLUGIN");
}

TEST(LiveMetrics, AFailingSourceLosesOnlyItsOwnSamples) {
  setenv("BT_METRICS_PLUGIN", "/nonexistent/libbt_metrics.so", 1);
  LiveMetrics live(0, {0, "host"});
  auto failing = live.Read([](SampleSink&) { throw std::runtime_error("gone"); });
  auto working = live.Read([](SampleSink& sink) { sink.Add("bt_launch_cycle", 4); });
  EXPECT_EQ(live.Snapshot().size(), 2u);
  unsetenv("BT_METRICS_PLUGIN");
}

TEST(MetricsPort, TheVariableOverridesTheConfigAndIsReadStrictly) {
  unsetenv("BT_METRICS_PORT");
  EXPECT_EQ(MetricsPort(9400), 9400);
  setenv("BT_METRICS_PORT", "9500", 1);
  EXPECT_EQ(MetricsPort(9400), 9500);
  setenv("BT_METRICS_PORT", "0", 1);
  EXPECT_EQ(MetricsPort(9400), 0);  // off for this process
  for (const char* bad : {"9x", "-1", "65536", " 1"}) {
    setenv("BT_METRICS_PORT", bad, 1);
    EXPECT_THROW(MetricsPort(9400), std::invalid_argument) << bad;
  }
  unsetenv("BT_METRICS_PORT");
}

}  // namespace
}  // namespace bt::launcher::metrics
