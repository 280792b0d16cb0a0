// A scheduler clock the test moves by hand (the scheduler tests time requests and steps with it).
#pragma once
#include <atomic>

#include "dhisparse/scheduler.h"

namespace dhs::test {

class TestClock final : public Clock {
 public:
  double now() const override { return t.load(); }
  std::atomic<double> t{0.0};
};

}  // namespace dhs::test
