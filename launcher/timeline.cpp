#include "launcher/timeline.h"

#include <cstdio>

namespace bt::launcher {

using Clock = std::chrono::steady_clock;

std::string FormatDuration(Clock::duration duration) {
  double seconds = std::chrono::duration<double>(duration).count();
  char text[32];
  if (seconds < 1) {
    std::snprintf(text, sizeof text, "%.1f ms", seconds * 1e3);
  } else if (seconds < 120) {
    std::snprintf(text, sizeof text, "%.2f s", seconds);
  } else {
    std::snprintf(text, sizeof text, "%dm%02ds", int(seconds) / 60, int(seconds) % 60);
  }
  return text;
}

Timeline::Timeline() : start_(Clock::now()) {}

void Timeline::Begin(const std::string& phase) {
  End();
  phases_.push_back(Phase{phase, Clock::now(), {}, "", true});
  if (on_begin_) on_begin_(phase);
}

void Timeline::End() {
  if (phases_.empty() || !phases_.back().open) return;
  phases_.back().end = Clock::now();
  phases_.back().open = false;
}

void Timeline::Annotate(const std::string& note) {
  if (!phases_.empty()) phases_.back().note = note;
}

std::string Timeline::Current() const { return phases_.empty() ? "" : phases_.back().name; }

std::vector<Timeline::Span> Timeline::Spans() const {
  const auto now = Clock::now();
  std::vector<Span> spans;
  for (const Phase& phase : phases_) spans.push_back({phase.name, phase.start, phase.open ? now : phase.end});
  return spans;
}

std::string Timeline::Render() const {
  std::string text;
  auto now = Clock::now();
  for (const Phase& phase : phases_) {
    text += phase.name + " " + FormatDuration((phase.open ? now : phase.end) - phase.start);
    if (!phase.note.empty()) text += " (" + phase.note + ")";
    text += ", ";
  }
  return text + "total " + FormatDuration(now - start_);
}

}  // namespace bt::launcher
