// A recording whose loops and branches the host decides (backend::ControlFlow::on_host), in
// cgt.cuda and cgt.torch: where its capture is cut (capture_cuts.hpp) and the order of segments
// and decisions (cgt.core:host_decisions). Filled while the function is captured, at each
// loop_while, if_then and switch_on; split once the capture ended.
//
// Included in the purview of a module that imports cgt.core (it names backend::HostDecisions),
// after capture_cuts.hpp in its global module fragment.
#pragma once

namespace cgt::kernels {

struct HostSegments {
  CaptureCuts cuts;
  backend::HostDecisions decisions;
  /// Ends the segment captured on `stream` since the last cut; an empty one is left out.
  [[nodiscard]] cudaError_t cut(cudaStream_t stream) {
    bool made = false;
    const cudaError_t error = cuts.cut(stream, made);
    if (made) decisions.segment(cuts.segments() - 1);
    return error;
  }
};

}  // namespace cgt::kernels
