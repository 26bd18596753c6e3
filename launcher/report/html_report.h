// The picture of a job (issue 31 §3): one self-contained HTML file (inline CSS and SVG, no
// script, nothing fetched) with a timeline, a lane per node over wall time with its phases,
// the job's buckets, every fault, hang, restart and spare promotion, the checkpoints
// committed, and the goodput table below. What a user opens after a night's run: it reads at
// a glance with 2 nodes and stays legible with 256 (alike lanes grouped, the rest scrolled).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/report/goodput.h"

namespace bt::launcher::report {

// Above this many lanes, lanes alike are drawn as one.
constexpr size_t kGroupLanesAbove = 32;

// One lane of the drawing: one node's, or several alike (same phases in the same order, each
// boundary within what the drawing can show). A node that failed, hung or was replaced, and a
// spare, always keeps a lane of its own.
struct LaneRow {
  std::string label;       // "node 3 (host-3)", "nodes 3-200 (198)", "spare (slot 9)"
  std::string nodes;       // the nodes it stands for: "3", "3-5,7,9-200"
  size_t shown = 0;        // the index in Goodput::lanes of the lane drawn
  std::vector<size_t> members;  // indices in Goodput::lanes
  bool faulted = false;
};

std::vector<LaneRow> GroupLanes(const Goodput& goodput, size_t group_above = kGroupLanesAbove);

// `text` safe inside HTML or SVG text and attribute values.
std::string EscapeXml(std::string_view text);

std::string RenderHtmlReport(const Goodput& goodput);
// The same, with FormatGoodputTable(goodput) already made (node 0 prints it too).
std::string RenderHtmlReport(const Goodput& goodput, const std::string& table);
// A goodput.json's document; throws GoodputJsonError (origin "goodput.json") when it is not one.
std::string RenderHtmlReport(const nlohmann::json& goodput_json);

// `bt-launch report`: reads `json_path`, writes the report to `html_path` (whole or not at
// all: a temporary file renamed). 0; 65 (kExitConfig) when the JSON is corrupt or truncated,
// `error` naming the file and the field; 74 (kExitIo) when a file cannot be read or written.
int WriteReport(const std::string& json_path, const std::string& html_path, std::string& error);

}  // namespace bt::launcher::report
