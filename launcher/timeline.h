// The phases of one launch and how long each took, printed when the launcher exits so
// that "where did the first 20 minutes go" has an answer in every log.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace bt::launcher {

class Timeline {
 public:
  Timeline();
  void Begin(const std::string& phase);  // ends the phase before it
  // Called with each phase's name as it begins (the live metrics' phase); may be empty.
  void OnBegin(std::function<void(const std::string&)> observer) { on_begin_ = std::move(observer); }
  void End();
  std::string Render() const;            // "identity 0.2 ms, run 1.50 s (...), total 1.51 s"
  void Annotate(const std::string& note);  // appended to the current (or last) phase
  std::string Current() const;             // the current (or last) phase's name; "" before the first

  // Every phase so far, the open one ending now: one lane of the job's report.
  struct Span {
    std::string name;
    std::chrono::steady_clock::time_point start;
    std::chrono::steady_clock::time_point end;
  };
  std::vector<Span> Spans() const;
  std::chrono::steady_clock::time_point start() const { return start_; }

 private:
  struct Phase {
    std::string name;
    std::chrono::steady_clock::time_point start;
    std::chrono::steady_clock::time_point end;
    std::string note;
    bool open = true;
  };
  std::chrono::steady_clock::time_point start_;
  std::vector<Phase> phases_;
  std::function<void(const std::string&)> on_begin_;
};

std::string FormatDuration(std::chrono::steady_clock::duration duration);

}  // namespace bt::launcher
