// The state of a CUDA generator, which CUDAGeneratorImpl keeps private. A capture that fails
// inside CUDAGraph::capture_end never reaches the generator's capture_epilogue(), and libtorch has
// no public way to call it: the generator then stays in capture mode, and every later random draw
// in the process throws ("Offset increment outside graph capture"). cgt ends that capture mode
// itself, reaching the member through an explicit instantiation (which ignores access, C++20
// [temp.spec.general]/6). Include in one translation unit only.
#pragma once

#include <ATen/cuda/CUDAGeneratorImpl.h>

namespace cgt_torch_generator_access {
namespace {

using StateMember = c10::intrusive_ptr<at::CUDAGeneratorState> at::CUDAGeneratorImpl::*;

struct Tag {
  friend StateMember member_of(Tag /*tag*/);
};

template <StateMember Member>
struct Expose {
  friend StateMember member_of(Tag /*tag*/) { return Member; }
};

template struct Expose<&at::CUDAGeneratorImpl::state_>;

}  // namespace

/// The shared state behind a CUDA generator (call with the generator's mutex held).
inline at::CUDAGeneratorState* state_of(at::CUDAGeneratorImpl& generator) {
  return (generator.*member_of(Tag{})).get();
}

}  // namespace cgt_torch_generator_access
