// A recording whose loops and branches the host decides (backend::ControlFlow::on_host), in
// cgt.cuda and cgt.torch: where its capture is cut (capture_cuts.hpp) and the order of segments
// and decisions (cgt.core:host_decisions). Filled while the function is captured, at each
// loop_while, if_then and switch_on; split once the capture ended.
//
// Included in the purview of a module that imports cgt.core (it names backend::HostDecisions),
// after cuda_status.hpp, with capture_cuts.hpp in its global module fragment.
#pragma once

namespace cgt::kernels {

/// Runs a host-decided recording on `stream`: segment 0 is `first`, segment i `later(i)` (an
/// executable); the host reads each decider there between them. Such a graph is launched
/// directly: in cgt.torch it draws no random numbers (the recording refuses them).
template <class Later>
Result<void> run_segments(const backend::HostDecisions& decisions, cudaGraphExec_t first, const Later& later,
                          cudaStream_t stream) {
  return decisions.run(
      [&](std::size_t i) {
        return checked(cudaGraphLaunch(i == 0 ? first : later(i), stream), "launching a graph segment");
      },
      [&](const void* decider) -> Result<std::int32_t> {
        std::int32_t value = 0;
        if (auto read = checked(read_decider(decider, stream, value), "reading a loop's or branch's decider"); !read) {
          return std::unexpected(std::move(read.error()));
        }
        return value;
      });
}

struct HostSegments {
  CaptureCuts cuts;
  backend::HostDecisions decisions;
  /// Ends the segment captured on `stream` since the last cut; an empty one is left out.
  [[nodiscard]] inline cudaError_t cut(cudaStream_t stream) {
    bool made = false;
    const cudaError_t error = cuts.cut(stream, made);
    if (made) decisions.segment(cuts.segments() - 1);
    return error;
  }
};

}  // namespace cgt::kernels
