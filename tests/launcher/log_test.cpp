// The launcher's own lines, as the watchdog tells them from the job's in a shared output
// file: whatever the formatters write (either format, any node, secrets redacted) is
// recognised, and a job's lines that merely look alike are not.
#include "launcher/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/launcher_process.h"

namespace bt::log {
namespace {

// The lines the installed logger writes for `messages` (its stderr sent to a file meanwhile).
std::vector<std::string> LoggedLines(Format format, int rank, const std::vector<std::string>& messages) {
  bt::testing::TempDir dir;
  const std::string path = dir.path() + "/stderr";
  const int file = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int saved = dup(STDERR_FILENO);
  dup2(file, STDERR_FILENO);
  Init(format, spdlog::level::info);
  SetNodeRank(rank);
  for (const std::string& message : messages) spdlog::warn("{}", message);
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(file);
  Init(Format::kText, spdlog::level::info);
  std::vector<std::string> lines;
  std::istringstream text(bt::testing::ReadFile(path));
  for (std::string line; std::getline(text, line);) lines.push_back(line);
  return lines;
}

const std::vector<std::string> kMessages = {"plain", "with \"quotes\" and \\ and a tab\t", "non-UTF-8 \xff\xfe",
                                             std::string(5000, 'x'), "{\"level\":\"info\"}", "",
                                             "a table:\nrow 1\n\nrow 3\n"};

TEST(LauncherLines, EveryLineTheFormattersWriteIsRecognised) {
  for (const Format format : {Format::kText, Format::kJson}) {
    for (const int rank : {-1, 0, 12345}) {
      const std::vector<std::string> lines = LoggedLines(format, rank, kMessages);
      ASSERT_EQ(lines.size(), kMessages.size() + (format == Format::kText ? 3 : 0)) << "each line of a message is a line";
      for (const std::string& line : lines) {
        EXPECT_TRUE(IsLauncherLine(line)) << line;
        for (size_t length = 0; length < line.size(); length += 7) {
          EXPECT_TRUE(MayBecomeLauncherLine(line.substr(0, length))) << line.substr(0, length);
        }
      }
    }
  }
}

TEST(LauncherLines, AJobsLinesAreNot) {
  for (const std::string line :
       {"step 10 loss 0.25", "2026-11-26T23:01:01.123Z INFO rank 0: step 7", "2026-11-26 23:01:01 bt-launch[node 0]",
        "{\"level\":\"info\",\"msg\":\"structlog\",\"ts\":\"2026-11-26T23:01:01.123Z\"}", " bt-launch", "",
        "Traceback (most recent call last):", "\r 10%|#   |"}) {
    EXPECT_FALSE(IsLauncherLine(line)) << line;
  }
  for (const std::string start : {"step", "2026-11-26T23:01:01.123Z INFO", "\r 10%", "{\"msg\""}) {
    EXPECT_FALSE(MayBecomeLauncherLine(start)) << start;
  }
}

}  // namespace
}  // namespace bt::log
