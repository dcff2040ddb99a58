// The common learning-rate schedules (cgt.torch-optim.inc, namespace lr): host functions of the
// step, which an optimizer's steps evaluate before each call and write to the device.
module;
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>

module cgt.torch;

namespace cgt::torch::lr {

LrSchedule warmup_cosine(double peak, std::int64_t warmup, std::int64_t total, double floor) {
  warmup = std::max<std::int64_t>(warmup, 0);
  total = std::max(total, warmup);
  return [=](std::int64_t step) {
    step = std::max<std::int64_t>(step, 0);  // counts below 0 count as 0 (and warmup 0 divides nothing)
    if (step < warmup) return peak * static_cast<double>(step) / static_cast<double>(warmup);
    if (step >= total) return floor;
    const double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
    return floor + ((peak - floor) * 0.5 * (1 + std::cos(std::numbers::pi * progress)));
  };
}

LrSchedule step_decay(double base, std::int64_t every, double gamma) {
  return [=](std::int64_t step) {
    if (every <= 0) return base;                                           // no period: no decay
    const std::int64_t periods = std::max<std::int64_t>(step, 0) / every;  // whole periods: the rate falls in steps
    return base * std::pow(gamma, static_cast<double>(periods));
  };
}

LrSchedule linear(double from, double to, std::int64_t steps) {
  return [=](std::int64_t step) {
    if (steps <= 0 || step >= steps) return to;
    step = std::max<std::int64_t>(step, 0);  // counts below 0 count as 0
    return from + ((to - from) * static_cast<double>(step) / static_cast<double>(steps));
  };
}

}  // namespace cgt::torch::lr
