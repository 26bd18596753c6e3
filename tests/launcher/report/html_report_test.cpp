// The HTML report (launcher/report/html_report.h): a lane per node for a small job, alike
// lanes grouped for a large one, every fault drawn, every string escaped, nothing fetched;
// written from a goodput.json, or an error naming the file and the field; and, where Debian's
// chromium is installed, opened in it.
#include "launcher/report/html_report.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "launcher/report/goodput_json.h"
#include "tests/launcher/report/synthetic_jobs.h"

namespace bt::launcher::report {
namespace {

using testing::Count;
using testing::Hung;
using testing::Ran;
using testing::Saved;
using testing::SyntheticJob;

// A directory of its own, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "bt-report-XXXXXX").string();
    path_ = mkdtemp(pattern.data()) ? pattern : "";
  }
  ~ScratchDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string ReadText(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

Goodput TwoNodesOneFaultOneHang() {
  return ComputeGoodput(SyntheticJob(2, {Ran(1, 10, 100, "failure", 1), Hung(2, 110, 200, 0, 170, 190, "a"),
                                         Ran(3, 210, 400, "success", -1, "b")},
                                     {Saved("a", 80, 82), Saved("b", 150, 151), Saved("c", 300, 302)}, 405, 400));
}

// 256 nodes, alike but for a fault on node 17, a hang on node 200 and a spare promoted in
// place of node 99 (whose lane differs: it joined late).
Goodput ManyNodes(int nodes = 256) {
  JobRecord record = SyntheticJob(nodes,
                                  {Ran(1, 30, 600, "failure", 17), Hung(2, 650, 1450, 200, 1300, 1400, "a"),
                                   Ran(3, 1480, 2000, "promotion", 99, "b"), Ran(4, 2050, 3600, "success", -1, "c")},
                                  {Saved("a", 500, 503), Saved("b", 1200, 1204), Saved("c", 1900, 1906)}, 3610, 3600);
  if (nodes > 99) record.lanes[99].phases.erase(record.lanes[99].phases.begin(), record.lanes[99].phases.begin() + 4);
  return ComputeGoodput(record);
}

std::set<std::string> LaneNodes(const std::string& html) {
  static const std::regex lane("<g class=\"lane[^\"]*\" data-nodes=\"([^\"]*)\"");
  std::set<std::string> nodes;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), lane); it != std::sregex_iterator(); ++it) {
    nodes.insert((*it)[1].str());
  }
  return nodes;
}

size_t FaultsIn(const Goodput& goodput) {
  size_t faults = 0;
  for (const CycleShare& share : goodput.cycles) faults += share.cycle.cause != "success";
  return faults;
}

TEST(HtmlReport, TwoNodesHaveALaneEachAndEveryFault) {
  const Goodput goodput = TwoNodesOneFaultOneHang();
  const std::string html = RenderHtmlReport(goodput);
  EXPECT_EQ(LaneNodes(html), (std::set<std::string>{"0", "1"}));
  EXPECT_EQ(Count(html, "<g class=\"fault "), FaultsIn(goodput));
  EXPECT_EQ(Count(html, "<g class=\"fault hang\""), 1u);
  EXPECT_EQ(Count(html, "class=\"hang-band\""), 1u);
  EXPECT_EQ(Count(html, "<rect class=\"cycle-span\""), goodput.cycles.size());
  for (const CycleShare& share : goodput.cycles) {
    EXPECT_NE(html.find("data-cycle=\"" + std::to_string(share.cycle.cycle) + "\""), std::string::npos);
  }
  EXPECT_EQ(Count(html, "<g class=\"commit\"") + Count(html, "<g class=\"commit kept\""), goodput.commits.size());
  EXPECT_EQ(Count(html, "<g class=\"commit kept\""), 2u);  // "a" and "b" were resumed from
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("class=\"buckets\""), std::string::npos);
}

TEST(HtmlReport, TheTableBelowShowsTheFigures) {
  const Goodput goodput = TwoNodesOneFaultOneHang();
  const std::string html = RenderHtmlReport(goodput);
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.1f%%", 100 * goodput.goodput_ratio);
  EXPECT_NE(html.find(ratio), std::string::npos) << ratio;
  char lost[32];
  std::snprintf(lost, sizeof lost, "<td>%.1f</td>", goodput.badput.lost_work_s);
  EXPECT_NE(html.find(lost), std::string::npos) << lost;
}

TEST(HtmlReport, ManyNodesAreGroupedAndFaultedOnesKeepTheirLane) {
  const Goodput goodput = ManyNodes();
  const std::vector<LaneRow> rows = GroupLanes(goodput);
  EXPECT_LT(rows.size(), 16u);
  size_t covered = 0;
  for (const LaneRow& row : rows) covered += row.members.size();
  EXPECT_EQ(covered, 256u);

  const std::string html = RenderHtmlReport(goodput);
  const std::set<std::string> lanes = LaneNodes(html);
  EXPECT_EQ(lanes.size(), rows.size());
  for (const char* faulted : {"17", "200", "99"}) EXPECT_EQ(lanes.count(faulted), 1u) << faulted;
  EXPECT_EQ(lanes.count("0-16,18-98,100-199,201-255"), 1u) << html.substr(0, 0);
  EXPECT_NE(html.find("nodes 0-16,18-98,100-199,201-255 (253)"), std::string::npos);
  EXPECT_EQ(Count(html, "<g class=\"fault "), FaultsIn(goodput));
  EXPECT_EQ(Count(html, "<g class=\"fault promotion\""), 1u);
  EXPECT_LT(html.size(), 400u * 1024) << "the report of 256 nodes is " << html.size() << " bytes";
}

TEST(HtmlReport, FewNodesAreNeverGrouped) {
  EXPECT_EQ(GroupLanes(ManyNodes(kGroupLanesAbove)).size(), kGroupLanesAbove);
}

TEST(HtmlReport, LanesThatDifferAreNotGrouped) {
  JobRecord record = SyntheticJob(40, {Ran(1, 30, 600, "success")}, {}, 610, 600);
  // Node 7's weights took a minute longer: its lane stands apart.
  for (Phase& phase : record.lanes[7].phases) {
    if (phase.name == "weights") phase.end_s += 60;
  }
  const std::vector<LaneRow> rows = GroupLanes(ComputeGoodput(record));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].nodes, "0-6,8-39");
  EXPECT_EQ(rows[1].nodes, "7");
}

TEST(HtmlReport, EveryStringIsEscaped) {
  JobRecord record = SyntheticJob(2, {Ran(1, 10, 100, "failure", 1), Ran(2, 110, 200, "success", -1, "<b>ck&pt</b>")},
                                  {Saved("<b>ck&pt</b>", 50, 51)}, 201, 200);
  record.lanes[1].host = "<script>alert('x')</script>";
  record.cycles[0].host = record.lanes[1].host;
  record.cycles[0].message = "exit \"1\" <img src=x onerror=alert(1)>";
  const std::string html = RenderHtmlReport(ComputeGoodput(record));
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("<b>ck"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(html.find("&lt;b&gt;ck&amp;pt&lt;/b&gt;"), std::string::npos);
}

TEST(HtmlReport, FetchesNothing) {
  const std::string html = RenderHtmlReport(ManyNodes());
  for (const char* fetch : {"http://", "https://", "<script", "<link", "@import", "url(", "src=", "href="}) {
    EXPECT_EQ(html.find(fetch), std::string::npos) << fetch;
  }
}

TEST(HtmlReport, AZeroLengthJobStillRenders) {
  const std::string html = RenderHtmlReport(ComputeGoodput(SyntheticJob(1, {}, {}, 0)));
  EXPECT_EQ(LaneNodes(html), (std::set<std::string>{"0"}));
  EXPECT_EQ(html.find("nan"), std::string::npos);
}

TEST(WriteReport, WritesTheReportOfAGoodputJson) {
  ScratchDir dir;
  const Goodput goodput = TwoNodesOneFaultOneHang();
  std::string error;
  ASSERT_EQ(WriteGoodputJson(goodput, dir.File("bt-launch/goodput.json"), error), 0) << error;
  ASSERT_EQ(WriteReport(dir.File("bt-launch/goodput.json"), dir.File("report.html"), error), 0) << error;
  EXPECT_EQ(ReadText(dir.File("report.html")), RenderHtmlReport(goodput));
}

TEST(WriteReport, ACorruptJsonIs65NamingTheFileAndTheField) {
  ScratchDir dir;
  nlohmann::json document = GoodputToJson(TwoNodesOneFaultOneHang());
  document["cycles"][0]["cause"] = 3;
  WriteText(dir.File("goodput.json"), document.dump());
  std::string error;
  EXPECT_EQ(WriteReport(dir.File("goodput.json"), dir.File("report.html"), error), 65);
  EXPECT_NE(error.find(dir.File("goodput.json")), std::string::npos) << error;
  EXPECT_NE(error.find("cycles[0].cause"), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists(dir.File("report.html")));
}

TEST(WriteReport, ATruncatedJsonIs65NamingTheFileAndTheField) {
  ScratchDir dir;
  const std::string text = GoodputToJson(TwoNodesOneFaultOneHang()).dump(1);
  WriteText(dir.File("goodput.json"), text.substr(0, text.find("\"lanes\"") + 40));
  std::string error;
  EXPECT_EQ(WriteReport(dir.File("goodput.json"), dir.File("report.html"), error), 65);
  EXPECT_NE(error.find(dir.File("goodput.json")), std::string::npos) << error;
  EXPECT_NE(error.find("lanes[0]"), std::string::npos) << error;
}

TEST(WriteReport, AMissingFileIs74) {
  ScratchDir dir;
  std::string error;
  EXPECT_EQ(WriteReport(dir.File("absent.json"), dir.File("report.html"), error), 74);
  EXPECT_NE(error.find(dir.File("absent.json")), std::string::npos) << error;
}

// The report opened in a real browser: the DOM it builds has every lane and every fault.
TEST(HtmlReportInChromium, TheDomHasEveryLaneAndFault) {
  const char* chromium = nullptr;
  for (const char* candidate : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (access(candidate, X_OK) == 0) chromium = candidate;
  }
  if (!chromium) GTEST_SKIP() << "Debian's chromium is not installed (apt-get install chromium): the report is not opened in a browser";
  ScratchDir dir;
  const Goodput goodput = ManyNodes();
  std::string error;
  ASSERT_EQ(WriteGoodputJson(goodput, dir.File("goodput.json"), error), 0) << error;
  ASSERT_EQ(WriteReport(dir.File("goodput.json"), dir.File("report.html"), error), 0) << error;
  const std::string command = std::string(chromium) + " --headless --no-sandbox --disable-gpu --user-data-dir=" + dir.File("profile") +
                              " --dump-dom file://" + dir.File("report.html") + " > " + dir.File("dom.html") + " 2> " +
                              dir.File("chromium.log");
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadText(dir.File("chromium.log"));
  const std::string dom = ReadText(dir.File("dom.html"));
  std::set<std::string> expected;
  for (const LaneRow& row : GroupLanes(goodput)) expected.insert(row.nodes);
  EXPECT_EQ(LaneNodes(dom), expected);
  EXPECT_EQ(Count(dom, "<g class=\"fault "), FaultsIn(goodput));
}

}  // namespace
}  // namespace bt::launcher::report
