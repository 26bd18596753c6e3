// A call at the end of a job that must not hold the launcher's exit (storage/bounded_call.h).
#include "storage/bounded_call.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

namespace bt::storage {
namespace {

using namespace std::chrono_literals;

TEST(FinishesWithin, ACallThatEndsInTimeIsWaitedFor) {
  auto ran = std::make_shared<std::atomic<bool>>(false);
  EXPECT_TRUE(FinishesWithin(5s, [ran] { *ran = true; }));
  EXPECT_TRUE(*ran);
}

TEST(FinishesWithin, ACallThatHangsIsLeftBehindAtTheBound) {
  auto release = std::make_shared<std::atomic<bool>>(false);
  const auto started = std::chrono::steady_clock::now();
  EXPECT_FALSE(FinishesWithin(200ms, [release] {
    while (!*release) std::this_thread::sleep_for(10ms);
  }));
  const auto waited = std::chrono::steady_clock::now() - started;
  EXPECT_GE(waited, 200ms);
  EXPECT_LT(waited, 2s);
  *release = true;  // the call it left behind ends on its own
}

TEST(FinishesWithin, WhatTheCallThrowsStaysInIt) {
  EXPECT_TRUE(FinishesWithin(5s, [] { throw std::runtime_error("destination unreachable"); }));
}

}  // namespace
}  // namespace bt::storage
