# One precompiled <torch/torch.h> for the programs this project builds over cgt.torch (tests,
# examples, benchmarks, README blocks). Each of them parsed libtorch's headers again: about 9 s of
# a 17 s compile on a 2-core machine, for some 30 units. Built once, reused by every such target
# (they all see libtorch's definitions and cgt's flags alike, as REUSE_FROM requires).
# Not used by the library's own units (a precompiled header cannot come before a module unit's
# global module fragment) nor by the header checks (they prove that a header includes what it
# uses). CGT_TORCH_PCH=OFF turns it off.
option(CGT_TORCH_PCH "Precompile <torch/torch.h> once for the project's torch tests, examples and benchmarks" ON)

function(cgt_use_torch_pch target)
  if(NOT CGT_TORCH_PCH OR NOT TARGET cgt_torch)
    return()
  endif()
  if(NOT TARGET cgt_torch_pch)
    add_library(cgt_torch_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cpp)
    target_link_libraries(cgt_torch_pch PRIVATE cgt_torch)
    target_precompile_headers(cgt_torch_pch PRIVATE <torch/torch.h>)
  endif()
  target_precompile_headers(${target} REUSE_FROM cgt_torch_pch)
endfunction()
