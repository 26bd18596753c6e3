#include "launcher/report/html_report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <cstring>

#include "launcher/exit_codes.h"
#include "launcher/report/goodput_json.h"
#include "storage/durable_file.h"

namespace bt::launcher::report {
namespace {

// The drawing's geometry, in SVG user units (pixels at 100% zoom).
constexpr double kLabelWidth = 230;
constexpr double kPlotWidth = 1000;
constexpr double kRightMargin = 24;
constexpr double kFaultRowHeight = 34;  // fault labels above the rows
constexpr double kRowHeight = 16;
constexpr double kRowGap = 4;
constexpr double kAxisHeight = 30;
constexpr size_t kHostInLabel = 28;  // characters of a host name in a lane's label
constexpr double kFaultLabelSpacing = 90;  // fewer labels than markers when faults crowd

// Two lanes are alike when each of their phase boundaries is within this share of the wall
// time (about 5 px of the plot) or this many seconds, whichever is larger.
constexpr double kAlikeShareOfWall = 0.005;
constexpr double kAlikeMinimumS = 0.5;

std::string Fixed(double value, int decimals) { return FormatFixed(value, decimals); }

// Seconds to the plot's x.
class Scale {
 public:
  explicit Scale(double wall_s) : wall_s_(wall_s) {}
  double X(double seconds) const {
    if (wall_s_ <= 0) return kLabelWidth;
    return kLabelWidth + std::clamp(seconds / wall_s_, 0.0, 1.0) * kPlotWidth;
  }
  std::string XText(double seconds) const { return Fixed(X(seconds), 1); }
  std::string WidthText(double from_s, double to_s) const { return Fixed(std::max(0.0, X(to_s) - X(from_s)), 1); }
  double wall_s() const { return wall_s_; }

 private:
  double wall_s_;
};

// Phases by kind: one colour each (the CSS classes p-*).
std::string PhaseKind(const std::string& phase) {
  static const std::map<std::string, std::string> kinds = {
      {"identity", "setup"},       {"environment", "setup"},    {"weights", "prepare"},
      {"rendezvous", "prepare"},   {"fabric", "prepare"},       {"health", "prepare"},
      {"nccl preflight", "prepare"}, {"resume", "load"},        {"load checkpoints", "load"},
      {"ready", "ready"},          {"cache seed", "ready"},     {"run", "run"},
      {"drain", "end"},            {"exit barrier", "end"}};
  const auto kind = kinds.find(phase);
  return kind == kinds.end() ? "other" : kind->second;
}

bool IsFault(const Cycle& cycle) { return cycle.cause != "success"; }

// When a cycle's fault was called: a hang at its detection, anything else at its end.
double FaultTime(const Cycle& cycle) {
  if (cycle.cause == "hang" && cycle.detected_s) return *cycle.detected_s;
  return cycle.end_s;
}

std::string CauseClass(const std::string& cause) {
  if (cause == "hang" || cause == "promotion" || cause == "stopped" || cause == "lost" || cause == "unhealthy") return cause;
  return "failure";
}

// "3-5,7,9-200": sorted nodes as ranges.
std::string NodeRanges(std::vector<int> nodes) {
  std::sort(nodes.begin(), nodes.end());
  std::string text;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j + 1 < nodes.size() && nodes[j + 1] == nodes[j] + 1) ++j;
    if (!text.empty()) text += ",";
    text += std::to_string(nodes[i]);
    if (j > i) {
      text += '-';
      text += std::to_string(nodes[j]);
    }
    i = j + 1;
  }
  return text;
}

bool Alike(const NodeLane& a, const NodeLane& b, double tolerance_s) {
  if (a.phases.size() != b.phases.size()) return false;
  for (size_t i = 0; i < a.phases.size(); ++i) {
    const Phase& pa = a.phases[i];
    const Phase& pb = b.phases[i];
    if (pa.name != pb.name) return false;
    if (std::fabs(pa.start_s - pb.start_s) > tolerance_s || std::fabs(pa.end_s - pb.end_s) > tolerance_s) return false;
  }
  return true;
}

std::string LaneLabel(const NodeLane& lane) {
  const std::string host = lane.host.size() > kHostInLabel ? lane.host.substr(0, kHostInLabel - 1) + "\u2026" : lane.host;
  const std::string who = lane.node >= 0 ? "node " + std::to_string(lane.node) : "spare (slot " + std::to_string(lane.slot) + ")";
  return host.empty() ? who : who + " \u00b7 " + host;
}

// The nodes that must keep a lane of their own: every fault's, and spares.
std::set<int> NodesToKeepApart(const Goodput& goodput) {
  std::set<int> apart;
  for (const CycleShare& share : goodput.cycles) {
    if (IsFault(share.cycle) && share.cycle.node >= 0) apart.insert(share.cycle.node);
  }
  return apart;
}

// ---- the SVG ------------------------------------------------------------------------------

struct Layout {
  double rows_top = kFaultRowHeight;
  size_t rows = 0;  // the job's buckets, the checkpoints, then the lanes
  double RowY(size_t row) const { return rows_top + double(row) * (kRowHeight + kRowGap); }
  double RowsBottom() const { return RowY(rows); }
  double Height() const { return RowsBottom() + kAxisHeight; }
};

void AppendRect(std::string& svg, const std::string& css_class, const Scale& scale, double from_s, double to_s, double y,
                double height, const std::string& title) {
  svg += "<rect class=\"" + css_class + "\" x=\"" + scale.XText(from_s) + "\" y=\"" + Fixed(y, 1) + "\" width=\"" +
         scale.WidthText(from_s, to_s) + "\" height=\"" + Fixed(height, 1) + "\"><title>" + EscapeXml(title) +
         "</title></rect>";
}

void AppendRowLabel(std::string& svg, double y, const std::string& label, const std::string& css_class) {
  svg += "<text class=\"" + css_class + "\" x=\"" + Fixed(kLabelWidth - 8, 1) + "\" y=\"" + Fixed(y + kRowHeight - 4, 1) +
         "\" text-anchor=\"end\">" + EscapeXml(label) + "</text>";
}

std::string Span(const std::string& what, double from_s, double to_s) {
  return what + ": " + Fixed(from_s, 1) + " s \u2192 " + Fixed(to_s, 1) + " s (" + FormatSeconds(to_s - from_s) + ")";
}

// The job's own row: its wall time split into the buckets, in the order the walk laid them.
void AppendJobRow(std::string& svg, const Goodput& goodput, const Scale& scale, double y) {
  svg += "<g class=\"job-row\">";
  AppendRowLabel(svg, y, "job: goodput " + Fixed(100 * goodput.goodput_ratio, 1) + "%", "row-label");
  double at_s = 0;
  auto segment = [&](const char* bucket, const std::string& what, double seconds) {
    if (seconds <= 0) return;
    AppendRect(svg, std::string("b-") + bucket, scale, at_s, at_s + seconds, y, kRowHeight, Span(what, at_s, at_s + seconds));
    at_s += seconds;
  };
  segment("prepare", "prepare", goodput.badput.prepare_s);
  for (const CycleShare& share : goodput.cycles) {
    const std::string cycle = "cycle " + std::to_string(share.cycle.cycle) + " ";
    segment("goodput", cycle + "goodput" + (share.kept.empty() ? "" : " (kept in " + share.kept + ")"), share.goodput_s);
    segment("lost_work", cycle + "lost work", share.lost_work_s);
    segment("hang", cycle + "hang", share.hang_s);
    segment("restart", cycle + "restart", share.restart_s);
  }
  segment("drain", "drain", goodput.badput.drain_s);
  // Each cycle's run outlined over its buckets, so where one cycle ends reads at a glance.
  for (const CycleShare& share : goodput.cycles) {
    const Cycle& cycle = share.cycle;
    if (cycle.end_s <= cycle.start_s) continue;
    AppendRect(svg, "cycle-span", scale, cycle.start_s, cycle.end_s, y, kRowHeight,
               Span("cycle " + std::to_string(cycle.cycle) + " (" + cycle.cause + ")", cycle.start_s, cycle.end_s));
  }
  svg += "</g>";
}

// Checkpoints: a line from the save to its commit, a tick at the commit; kept ones stand out.
void AppendCommitRow(std::string& svg, const Goodput& goodput, const Scale& scale, double y) {
  std::set<std::string> kept;
  for (const CycleShare& share : goodput.cycles) kept.insert(share.kept);
  svg += "<g class=\"commit-row\">";
  AppendRowLabel(svg, y, "checkpoints (" + std::to_string(goodput.commits.size()) + ")", "row-label");
  const double middle = y + kRowHeight / 2;
  for (const Commit& commit : goodput.commits) {
    const std::string title = commit.name + ": saved " + Fixed(commit.saved_s, 1) + " s, committed " +
                              Fixed(commit.committed_s, 1) + " s" + (kept.count(commit.name) ? ", resumed from" : "");
    svg += "<g class=\"commit" + std::string(kept.count(commit.name) ? " kept" : "") + "\"><title>" + EscapeXml(title) +
           "</title><line x1=\"" + scale.XText(commit.saved_s) + "\" x2=\"" + scale.XText(commit.committed_s) +
           "\" y1=\"" + Fixed(middle, 1) + "\" y2=\"" + Fixed(middle, 1) + "\"/><rect x=\"" +
           Fixed(scale.X(commit.committed_s) - 1.5, 1) + "\" y=\"" + Fixed(y + 2, 1) + "\" width=\"3\" height=\"" +
           Fixed(kRowHeight - 4, 1) + "\"/></g>";
  }
  svg += "</g>";
}

void AppendLane(std::string& svg, const Goodput& goodput, const LaneRow& row, const Scale& scale, double y) {
  const NodeLane& lane = goodput.lanes[row.shown];
  svg += "<g class=\"lane" + std::string(row.faulted ? " faulted" : "") + "\" data-nodes=\"" + EscapeXml(row.nodes) +
         "\" data-count=\"" + std::to_string(row.members.size()) + "\">";
  AppendRowLabel(svg, y, row.label, "lane-label");
  for (const Phase& phase : lane.phases) {
    AppendRect(svg, "p-" + PhaseKind(phase.name), scale, phase.start_s, phase.end_s, y, kRowHeight,
               Span(row.label + " " + phase.name, phase.start_s, phase.end_s));
  }
  svg += "</g>";
}

// Hangs as a band over every row, from the stall to its detection.
void AppendHangBands(std::string& svg, const Goodput& goodput, const Scale& scale, const Layout& layout) {
  for (const CycleShare& share : goodput.cycles) {
    const Cycle& cycle = share.cycle;
    if (cycle.cause != "hang" || !cycle.stall_start_s) continue;
    const double until_s = cycle.detected_s.value_or(cycle.end_s);
    AppendRect(svg, "hang-band", scale, *cycle.stall_start_s, until_s, layout.rows_top, layout.RowsBottom() - layout.rows_top,
               Span("cycle " + std::to_string(cycle.cycle) + " hang on node " + std::to_string(cycle.node), *cycle.stall_start_s,
                    until_s));
  }
}

// Every fault: a line across the rows at the moment it was called, a marker above them, a
// label where there is room, and a cross on the failed node's own lane.
void AppendFaults(std::string& svg, const Goodput& goodput, const std::vector<LaneRow>& rows, size_t first_lane_row,
                  const Scale& scale, const Layout& layout) {
  std::map<int, size_t> row_of_node;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t member : rows[i].members) {
      if (goodput.lanes[member].node >= 0) row_of_node[goodput.lanes[member].node] = first_lane_row + i;
    }
  }
  double last_label_x = -1e9;
  for (const CycleShare& share : goodput.cycles) {
    const Cycle& cycle = share.cycle;
    if (!IsFault(cycle)) continue;
    const double x = scale.X(FaultTime(cycle));
    const std::string who = cycle.node >= 0 ? "node " + std::to_string(cycle.node) : "the job";
    const std::string title = "cycle " + std::to_string(cycle.cycle) + ": " + cycle.cause + " on " + who +
                              (cycle.host.empty() ? "" : " (" + cycle.host + ")") + " at " + Fixed(FaultTime(cycle), 1) +
                              " s" + (cycle.message.empty() ? "" : ": " + cycle.message);
    svg += "<g class=\"fault " + CauseClass(cycle.cause) + "\" data-cycle=\"" + std::to_string(cycle.cycle) + "\" data-node=\"" +
           std::to_string(cycle.node) + "\"><title>" + EscapeXml(title) + "</title>";
    svg += "<line x1=\"" + Fixed(x, 1) + "\" x2=\"" + Fixed(x, 1) + "\" y1=\"" + Fixed(layout.rows_top - 6, 1) + "\" y2=\"" +
           Fixed(layout.RowsBottom(), 1) + "\"/>";
    svg += "<path d=\"M" + Fixed(x - 5, 1) + " " + Fixed(layout.rows_top - 12, 1) + "h10l-5 7z\"/>";
    if (x - last_label_x >= kFaultLabelSpacing) {
      // Near the right edge the label ends at its marker instead of running off the drawing.
      const char* anchor = x > kLabelWidth + kPlotWidth - kFaultLabelSpacing / 2 ? "end" : "middle";
      svg += "<text x=\"" + Fixed(x, 1) + "\" y=\"" + Fixed(layout.rows_top - 16, 1) + "\" text-anchor=\"" + anchor + "\">" +
             EscapeXml(cycle.cause + " " + who) + "</text>";
      last_label_x = x;
    }
    const auto row = row_of_node.find(cycle.node);
    if (row != row_of_node.end()) {
      const double y = layout.RowY(row->second) + kRowHeight / 2;
      svg += "<path class=\"cross\" d=\"M" + Fixed(x - 4, 1) + " " + Fixed(y - 4, 1) + "l8 8m0 -8l-8 8\"/>";
    }
    svg += "</g>";
  }
}

// An axis step that gives at most ten ticks, in steps a reader counts in.
double AxisStep(double wall_s) {
  static const double steps[] = {0.1,  0.2,  0.5,  1,    2,    5,     10,    15,    30,    60,    120,   300,
                                 600,  900,  1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800};
  for (double step : steps) {
    if (wall_s / step <= 10) return step;
  }
  return std::ceil(wall_s / 10 / 604800) * 604800;
}

std::string AxisLabel(double seconds, double step) {
  if (seconds == 0) return "0";
  if (step < 1) return Fixed(seconds, 1) + " s";
  if (step < 60) return Fixed(seconds, 0) + " s";
  const long long whole = std::llround(seconds);
  if (step < 3600) return std::to_string(whole / 60) + "m" + (whole % 60 ? std::to_string(whole % 60) + "s" : "");
  return std::to_string(whole / 3600) + "h" + (whole / 60 % 60 ? std::to_string(whole / 60 % 60) + "m" : "");
}

void AppendAxis(std::string& svg, const Scale& scale, const Layout& layout) {
  const double y = layout.RowsBottom();
  svg += "<g class=\"axis\"><line x1=\"" + Fixed(kLabelWidth, 1) + "\" x2=\"" + Fixed(kLabelWidth + kPlotWidth, 1) +
         "\" y1=\"" + Fixed(y, 1) + "\" y2=\"" + Fixed(y, 1) + "\"/>";
  if (scale.wall_s() > 0) {
    const double step = AxisStep(scale.wall_s());
    for (double t = 0; t <= scale.wall_s() + step * 1e-9; t += step) {
      const std::string x = scale.XText(t);
      svg += "<line class=\"grid\" x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + Fixed(layout.rows_top, 1) + "\" y2=\"" +
             Fixed(y + 4, 1) + "\"/><text x=\"" + x + "\" y=\"" + Fixed(y + 18, 1) + "\" text-anchor=\"middle\">" +
             AxisLabel(t, step) + "</text>";
    }
  }
  svg += "</g>";
}

std::string RenderSvg(const Goodput& goodput) {
  const Scale scale(goodput.wall_s);
  const std::vector<LaneRow> rows = GroupLanes(goodput);
  constexpr size_t kFirstLaneRow = 2;
  Layout layout;
  layout.rows = kFirstLaneRow + rows.size();
  const double width = kLabelWidth + kPlotWidth + kRightMargin;
  std::string svg = "<svg class=\"timeline\" width=\"" + Fixed(width, 0) + "\" height=\"" + Fixed(layout.Height(), 0) +
                    "\" viewBox=\"0 0 " + Fixed(width, 0) + " " + Fixed(layout.Height(), 0) +
                    "\" role=\"img\" aria-label=\"the job's timeline\">";
  AppendAxis(svg, scale, layout);
  AppendJobRow(svg, goodput, scale, layout.RowY(0));
  AppendCommitRow(svg, goodput, scale, layout.RowY(1));
  for (size_t i = 0; i < rows.size(); ++i) AppendLane(svg, goodput, rows[i], scale, layout.RowY(kFirstLaneRow + i));
  AppendHangBands(svg, goodput, scale, layout);
  AppendFaults(svg, goodput, rows, kFirstLaneRow, scale, layout);
  return svg + "</svg>";
}

// ---- the page around it ------------------------------------------------------------------

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1d2630;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
.summary{font-size:15px;margin-bottom:12px}.summary b{font-size:22px}
.scroll{overflow:auto;max-height:80vh;border:1px solid #d8dee4;border-radius:4px}
svg text{font-size:11px;fill:#1d2630}.row-label{font-weight:600}
.p-setup{fill:#aab4bf}.p-prepare{fill:#5b8def}.p-load{fill:#f0a030}.p-ready{fill:#41b3a3}.p-run{fill:#2e9e44}
.p-end{fill:#8e7cc3}.p-other{fill:#cfd6dd}
.b-goodput{fill:#2e9e44}.b-prepare{fill:#5b8def}.b-restart{fill:#aab4bf}.b-lost_work{fill:#d64545}.b-hang{fill:#8e44ad}
.b-drain{fill:#c8a2c8}
.commit line{stroke:#7a8794;stroke-width:1}.commit rect{fill:#44505c}.commit.kept rect{fill:#0b6e2a}
.lane.faulted .lane-label{fill:#b02a2a;font-weight:600}
.hang-band{fill:#8e44ad;opacity:.18}.cycle-span{fill:none;stroke:#1d2630;stroke-width:1.2}
.fault line{stroke-width:1.5;stroke-dasharray:4 3}.fault text{font-weight:600}
.fault.failure line,.fault.lost line,.fault.unhealthy line{stroke:#d64545}
.fault.failure path,.fault.lost path,.fault.unhealthy path{fill:#d64545}
.fault.failure text,.fault.lost text,.fault.unhealthy text{fill:#b02a2a}
.fault.hang line{stroke:#8e44ad}.fault.hang path{fill:#8e44ad}.fault.hang text{fill:#8e44ad}
.fault.promotion line{stroke:#e08a00}.fault.promotion path{fill:#e08a00}.fault.promotion text{fill:#b36b00}
.fault.stopped line{stroke:#555}.fault.stopped path{fill:#555}.fault.stopped text{fill:#555}
.fault path.cross{fill:none;stroke:#fff;stroke-width:2.5}
.axis line{stroke:#44505c}.axis line.grid{stroke:#e3e8ed}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
table{border-collapse:collapse;margin:4px 0}th,td{padding:3px 10px;text-align:right;border-bottom:1px solid #e3e8ed}
th:first-child,td:first-child{text-align:left}td.text{text-align:left}
.notes li{color:#7a4b00}
)";

std::string Percent(double seconds, double wall_s) { return wall_s > 0 ? Fixed(100 * seconds / wall_s, 1) + "%" : "-"; }

std::string LegendItem(const std::string& colour, const std::string& what) {
  return "<span><i style=\"background:" + colour + "\"></i>" + EscapeXml(what) + "</span>";
}

std::string Legend() {
  return "<div class=\"legend\">" + LegendItem("#2e9e44", "run / goodput") + LegendItem("#aab4bf", "identity, environment / restart") +
         LegendItem("#5b8def", "weights, rendezvous, fabric, health, preflight / prepare") +
         LegendItem("#f0a030", "resume, load checkpoints") + LegendItem("#41b3a3", "ready, cache seed") +
         LegendItem("#8e7cc3", "drain, exit barrier") + LegendItem("#d64545", "lost work, failure") +
         LegendItem("#8e44ad", "hang") + LegendItem("#e08a00", "spare promotion") + LegendItem("#0b6e2a", "checkpoint resumed from") +
         "</div>";
}

std::string BucketTable(const Goodput& goodput) {
  std::string html = "<table class=\"buckets\"><tr><th>where the time went</th><th>time</th><th>seconds</th><th>share</th></tr>";
  auto row = [&](const std::string& name, double seconds) {
    html += "<tr><td>" + name + "</td><td>" + EscapeXml(FormatSeconds(seconds)) + "</td><td>" + Fixed(seconds, 1) + "</td><td>" +
            Percent(seconds, goodput.wall_s) + "</td></tr>";
  };
  row("goodput", goodput.goodput_s);
  row("prepare", goodput.badput.prepare_s);
  row("restart", goodput.badput.restart_s);
  row("lost work", goodput.badput.lost_work_s);
  row("hang", goodput.badput.hang_s);
  row("drain", goodput.badput.drain_s);
  row("<b>wall</b>", goodput.wall_s);
  return html + "</table>";
}

std::string CycleTable(const Goodput& goodput) {
  if (goodput.cycles.empty()) return "<p>No cycle reached its run.</p>";
  std::string html =
      "<table class=\"cycles\"><tr><th>cycle</th><th>cause</th><th>node</th><th>host</th><th>start s</th><th>end s</th>"
      "<th>goodput</th><th>lost work</th><th>hang</th><th>restart</th><th>kept</th><th>message</th></tr>";
  for (const CycleShare& share : goodput.cycles) {
    const Cycle& cycle = share.cycle;
    html += "<tr class=\"cycle\" data-cycle=\"" + std::to_string(cycle.cycle) + "\"><td>" + std::to_string(cycle.cycle) +
            "</td><td class=\"text\">" + EscapeXml(cycle.cause) + "</td><td>" +
            (cycle.node >= 0 ? std::to_string(cycle.node) : "-") + "</td><td class=\"text\">" + EscapeXml(cycle.host) +
            "</td><td>" + Fixed(cycle.start_s, 1) + "</td><td>" + Fixed(cycle.end_s, 1) + "</td><td>" +
            EscapeXml(FormatSeconds(share.goodput_s)) + "</td><td>" + EscapeXml(FormatSeconds(share.lost_work_s)) + "</td><td>" +
            EscapeXml(FormatSeconds(share.hang_s)) + "</td><td>" + EscapeXml(FormatSeconds(share.restart_s)) +
            "</td><td class=\"text\">" + EscapeXml(share.kept.empty() ? "-" : share.kept) + "</td><td class=\"text\">" +
            EscapeXml(cycle.message) + "</td></tr>";
  }
  return html + "</table>";
}

std::string StepSection(const Goodput& goodput) {
  if (!goodput.steps) return "";
  const StepStats& steps = *goodput.steps;
  std::string html = "<h2>Steps</h2><p>" + std::to_string(steps.steps_done) + " steps done, " +
                     std::to_string(steps.steps_redone) + " redone after faults; step time p50 " +
                     EscapeXml(FormatSeconds(steps.step_p50_s)) + ", p95 " + EscapeXml(FormatSeconds(steps.step_p95_s)) + ".";
  if (steps.straggler_node) {
    html += " <b>Straggler: node " + std::to_string(*steps.straggler_node) + "</b> (median step " +
            Fixed(steps.straggler_ratio, 2) + "\u00d7 the other nodes').";
  }
  return html + "</p>";
}

std::string NoteSection(const Goodput& goodput) {
  if (goodput.notes.empty()) return "";
  std::string html = "<h2>Notes on the input</h2><ul class=\"notes\">";
  for (const std::string& note : goodput.notes) html += "<li>" + EscapeXml(note) + "</li>";
  return html + "</ul>";
}

std::string Summary(const Goodput& goodput) {
  size_t faults = 0;
  for (const CycleShare& share : goodput.cycles) faults += IsFault(share.cycle) ? 1 : 0;
  return "<p class=\"summary\"><b>" + Fixed(100 * goodput.goodput_ratio, 1) + "%</b> goodput: " +
         EscapeXml(FormatSeconds(goodput.goodput_s)) + " of " + EscapeXml(FormatSeconds(goodput.wall_s)) +
         " wall time kept as training progress; " + std::to_string(goodput.cycles.size()) + " cycles, " +
         std::to_string(faults) + " faults, " + std::to_string(goodput.lanes.size()) + " launchers, " +
         std::to_string(goodput.commits.size()) + " checkpoints committed.</p>";
}

std::string ReadWhole(const std::string& path, std::string& error) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    error = "cannot read " + path + ": " + std::strerror(errno);
    return "";
  }
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) error = "cannot read " + path;
  return text.str();
}

}  // namespace

std::vector<LaneRow> GroupLanes(const Goodput& goodput, size_t group_above) {
  const std::set<int> apart = NodesToKeepApart(goodput);
  const bool grouping = goodput.lanes.size() > group_above;
  const double tolerance_s = std::max(kAlikeMinimumS, kAlikeShareOfWall * goodput.wall_s);
  std::vector<LaneRow> rows;
  std::vector<size_t> groupable_rows;  // rows that alike lanes may join
  for (size_t i = 0; i < goodput.lanes.size(); ++i) {
    const NodeLane& lane = goodput.lanes[i];
    const bool keep_apart = lane.node < 0 || apart.count(lane.node) > 0;
    if (grouping && !keep_apart) {
      const auto joined = std::find_if(groupable_rows.begin(), groupable_rows.end(), [&](size_t row) {
        return Alike(goodput.lanes[rows[row].shown], lane, tolerance_s);
      });
      if (joined != groupable_rows.end()) {
        rows[*joined].members.push_back(i);
        continue;
      }
      groupable_rows.push_back(rows.size());
    }
    rows.push_back(LaneRow{"", "", i, {i}, lane.node >= 0 && apart.count(lane.node) > 0});
  }
  for (LaneRow& row : rows) {
    std::vector<int> nodes;
    for (size_t member : row.members) nodes.push_back(goodput.lanes[member].node);
    row.nodes = NodeRanges(nodes);
    row.label = row.members.size() == 1 ? LaneLabel(goodput.lanes[row.shown])
                                        : "nodes " + row.nodes + " (" + std::to_string(row.members.size()) + ")";
  }
  return rows;
}

std::string EscapeXml(std::string_view text) {
  std::string escaped;
  escaped.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      case '\'': escaped += "&#39;"; break;
      default: escaped += c;
    }
  }
  return escaped;
}

std::string RenderHtmlReport(const Goodput& goodput) { return RenderHtmlReport(goodput, FormatGoodputTable(goodput)); }

std::string RenderHtmlReport(const Goodput& goodput, const std::string& table) {
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                     "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
                     "<title>bt-launch job report</title><style>";
  html += kStyle;
  html += "</style></head><body><h1>bt-launch: what the job's time became</h1>";
  html += Summary(goodput);
  html += Legend();
  html += "<div class=\"scroll\">" + RenderSvg(goodput) + "</div>";
  html += "<h2>Goodput</h2>" + BucketTable(goodput);
  html += "<h2>Cycles</h2>" + CycleTable(goodput);
  html += StepSection(goodput);
  html += NoteSection(goodput);
  html += "<details><summary>as printed by the launcher</summary><pre>" + EscapeXml(table) +
          "</pre></details>";
  return html + "</body></html>\n";
}

std::string RenderHtmlReport(const nlohmann::json& goodput_json) {
  return RenderHtmlReport(GoodputFromJson(goodput_json, "goodput.json"));
}

int WriteReport(const std::string& json_path, const std::string& html_path, std::string& error) {
  const std::string text = ReadWhole(json_path, error);
  if (!error.empty()) return kExitIo;
  Goodput goodput;
  try {
    goodput = ParseGoodputJson(text, json_path);
  } catch (const GoodputJsonError& bad) {
    error = bad.what();
    return kExitConfig;
  }
  try {
    storage::WriteFileAtomically(html_path, RenderHtmlReport(goodput));
  } catch (const std::exception& failure) {
    error = failure.what();
    return kExitIo;
  }
  return 0;
}

}  // namespace bt::launcher::report
