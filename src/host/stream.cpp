// Host streams: kernels run at once, or are captured into a graph.
module;
#include <functional>
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
}

void Stream::synchronize() noexcept {
  if (capturing_) broken_ = true;
}

Graph Stream::end_capture() {
  capturing_ = false;
  broken_ = false;
  return std::exchange(capture_, Graph{});
}

Graph Stream::capture_apart(const std::function<void()>& launch_all) {
  Graph outer = std::exchange(capture_, Graph{});
  try {
    launch_all();
  } catch (...) {
    capture_ = std::move(outer);  // the capture in progress goes on (the call then fails)
    throw;
  }
  return std::exchange(capture_, std::move(outer));
}

void Stream::discard_capture() noexcept {
  capturing_ = false;
  broken_ = false;
  capture_ = Graph{};
}

}  // namespace cgt::host
