// Host streams: kernels run at once, or are captured into a graph.
module;
#include <functional>
#include <string>
#include <utility>

module cgt.host;

namespace cgt::host {

void Stream::launch(Kernel kernel) {
  if (capturing_) {
    capture_.kernels_.push_back(std::move(kernel));
  } else {
    kernel();
  }
}

void Stream::begin_capture() {
  capture_ = Graph{};
  capturing_ = true;
  broken_ = false;
  bodies_ = 0;
  forbidden_.clear();
}

void Stream::forbid_in_body(std::string why) {
  if (forbidden_.empty()) forbidden_ = std::move(why);
}

void Stream::synchronize() noexcept {
  if (capturing_) broken_ = true;
}

Graph Stream::end_capture() {
  capturing_ = false;
  broken_ = false;
  forbidden_.clear();
  return std::exchange(capture_, Graph{});
}

Graph Stream::capture_apart(const std::function<void()>& launch_all) {
  Graph outer = std::exchange(capture_, Graph{});
  ++bodies_;
  try {
    launch_all();
  } catch (...) {
    --bodies_;
    capture_ = std::move(outer);  // the capture in progress goes on (the call then fails)
    throw;
  }
  --bodies_;
  return std::exchange(capture_, std::move(outer));
}

void Stream::discard_capture() noexcept {
  capturing_ = false;
  broken_ = false;
  bodies_ = 0;
  forbidden_.clear();
  capture_ = Graph{};
}

}  // namespace cgt::host
