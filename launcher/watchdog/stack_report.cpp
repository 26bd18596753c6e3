#include "launcher/watchdog/stack_report.h"

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>

namespace bt::launcher::watchdog {
namespace {

struct Thread {
  bool current = false;                // "Current thread ...": the one that ran the handler
  std::vector<std::string> frames;     // innermost first, as "function (file:line)"
  bool module_body = false;            // its outermost frame is "<module>"
};

// faulthandler writes, per thread: a header "Thread 0x... (most recent call first):" or
// "Current thread 0x... ...", then one line per frame: `  File "PATH", line N in NAME`.
std::vector<Thread> ParseThreads(const std::string& dump) {
  static const std::regex kFrame(R"re(^\s+File "(.*)", line (\d+) in (.*)$)re");
  std::vector<Thread> threads;
  std::istringstream lines(dump);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("Thread ", 0) == 0 || line.rfind("Current thread ", 0) == 0) {
      threads.push_back({line.rfind("Current", 0) == 0, {}, false});
      continue;
    }
    std::smatch frame;
    if (threads.empty() || !std::regex_match(line, frame, kFrame)) continue;
    const std::string path = frame[1];
    const std::string file = path.substr(path.rfind('/') + 1);
    threads.back().frames.push_back(frame[3].str() + " (" + file + ":" + frame[2].str() + ")");
    threads.back().module_body = frame[3] == "<module>";
  }
  return threads;
}

const Thread* MainThread(const std::vector<Thread>& threads) {
  for (const Thread& thread : threads) {
    if (thread.module_body) return &thread;
  }
  for (const Thread& thread : threads) {
    if (thread.current && !thread.frames.empty()) return &thread;
  }
  return threads.empty() ? nullptr : &threads.front();
}

std::string Label(const ProcessStack& stack, const char* name) {
  auto found = stack.labels.find(name);
  return found == stack.labels.end() ? "?" : found->second;
}

std::string Members(const StackGroup& group) {
  std::string text;
  for (const ProcessStack* member : group.members) text += (text.empty() ? "" : ", ") + DescribeProcess(*member);
  return text;
}

}  // namespace

std::string InnermostFrames(const std::string& dump, int frames) {
  const std::vector<Thread> threads = ParseThreads(dump);
  const Thread* main = MainThread(threads);
  if (main == nullptr) return "";
  std::string text;
  for (int index = 0; index < frames && index < int(main->frames.size()); ++index) {
    text += (text.empty() ? "" : " < ") + main->frames[size_t(index)];
  }
  return text;
}

std::vector<StackGroup> GroupByInnermostFrames(const std::vector<ProcessStack>& stacks, int frames) {
  std::map<std::string, StackGroup> by_frames;
  for (const ProcessStack& stack : stacks) {
    if (!stack.answered) continue;
    const std::string key = InnermostFrames(stack.dump, frames);
    by_frames[key].frames = key;
    by_frames[key].members.push_back(&stack);
  }
  std::vector<StackGroup> groups;
  for (auto& [key, group] : by_frames) groups.push_back(std::move(group));
  std::stable_sort(groups.begin(), groups.end(),
                   [](const StackGroup& a, const StackGroup& b) { return a.members.size() > b.members.size(); });
  return groups;
}

std::string DescribeProcess(const ProcessStack& stack) {
  if (!stack.labels.contains("RANK")) {  // one process a node, started without torchrun
    std::string text = "pid " + std::to_string(stack.pid) + " (node " + Label(stack, "BT_NODE_RANK");
    if (stack.labels.contains("host")) text += ", host " + stack.labels.at("host");
    return text + ")";
  }
  std::string text = "rank " + Label(stack, "RANK") + " (node " + Label(stack, "BT_NODE_RANK");
  if (stack.labels.contains("host")) text += ", host " + stack.labels.at("host");
  return text + ", local rank " + Label(stack, "LOCAL_RANK") + ", pid " + std::to_string(stack.pid) + ")";
}

std::vector<std::string> SummarizeStacks(const std::vector<ProcessStack>& stacks, int frames) {
  std::vector<std::string> lines;
  const std::vector<StackGroup> groups = GroupByInnermostFrames(stacks, frames);
  for (size_t index = 0; index < groups.size(); ++index) {
    const StackGroup& group = groups[index];
    const std::string where = group.frames.empty() ? "no Python frame" : group.frames;
    if (index == 0 && groups.size() > 1 && group.members.size() > groups[1].members.size()) {
      lines.push_back(std::to_string(group.members.size()) + " of " + std::to_string(stacks.size()) +
                      " ranks in " + where);
    } else {
      lines.push_back((groups.size() > 1 ? "differs: " : "") + std::to_string(group.members.size()) + " in " + where +
                      ": " + Members(group));
    }
  }
  for (const ProcessStack& stack : stacks) {
    if (stack.answered) continue;
    auto state = stack.labels.find("state");
    lines.push_back("no stack from " + DescribeProcess(stack) + ": it did not answer in time" +
                    (state == stack.labels.end() ? "" : " (" + state->second + ")"));
  }
  return lines;
}

}  // namespace bt::launcher::watchdog
