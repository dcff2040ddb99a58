// Host streams: kernels run at once, or are captured into a graph.
module;
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

void Stream::discard_capture() noexcept {
  capturing_ = false;
  broken_ = false;
  capture_ = Graph{};
}

}  // namespace cgt::host
