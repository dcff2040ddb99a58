# Decides which optional backends are built, and remembers why, so that a build says plainly
# which backends it has (CGT_WITH_TORCH / CGT_WITH_CUDA: AUTO, ON or OFF).
set(CGT_BUILT_BACKENDS "host")
set(CGT_SKIPPED_BACKENDS "")

function(cgt_skip_backend name why)
  set(CGT_SKIPPED_BACKENDS "${CGT_SKIPPED_BACKENDS};${name} (${why})" PARENT_SCOPE)
endfunction()

# cgt.cuda: the CUDA runtime and nvcc for the test kernels.
set(CGT_HAVE_CUDA OFF)
if(NOT CGT_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  include(CheckLanguage)
  check_language(CUDA)
  if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_STANDARD 20)  # nvcc has no C++23; CUDA sources are plain kernels
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)  # Hopper (H100, H200): the GPU machine
    endif()
    enable_language(CUDA)
    set(CGT_HAVE_CUDA ON)
    list(APPEND CGT_BUILT_BACKENDS "cuda")
  elseif(CGT_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CGT_WITH_CUDA=ON but the CUDA toolkit (runtime and nvcc) was not found")
  else()
    cgt_skip_backend(cuda "no CUDA toolkit found")
  endif()
else()
  cgt_skip_backend(cuda "CGT_WITH_CUDA=OFF")
endif()

# cgt.torch: a CUDA-enabled libtorch.
set(CGT_HAVE_TORCH OFF)
if(NOT CGT_WITH_TORCH STREQUAL "OFF")
  if(CGT_HAVE_CUDA)
    # Torch's CMake config probes the GPU's architecture unless told which to build for, and
    # would take the C++ standard for CUDA too (nvcc has no C++23).
    if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
      set(TORCH_CUDA_ARCH_LIST "9.0")
    endif()
    find_package(Torch QUIET)
  endif()
  if(Torch_FOUND AND TARGET torch_cuda)
    set(CGT_HAVE_TORCH ON)
    list(APPEND CGT_BUILT_BACKENDS "torch")
  elseif(CGT_WITH_TORCH STREQUAL "ON" AND NOT CGT_HAVE_CUDA)
    # cgt.torch builds cgt's input-copy kernel with nvcc, and Torch's own CMake config enables CUDA.
    if(CGT_WITH_CUDA STREQUAL "OFF")
      message(FATAL_ERROR "CGT_WITH_TORCH=ON needs the CUDA compiler and toolkit, which CGT_WITH_CUDA=OFF turns off: "
                          "set CGT_WITH_CUDA=ON (or AUTO), or CGT_WITH_TORCH=OFF")
    endif()
    message(FATAL_ERROR "CGT_WITH_TORCH=ON needs the CUDA compiler (nvcc) and toolkit, which were not found: "
                        "install the CUDA toolkit, or set CGT_WITH_TORCH=OFF")
  elseif(CGT_WITH_TORCH STREQUAL "ON")
    message(FATAL_ERROR "CGT_WITH_TORCH=ON but no CUDA-enabled Torch was found: set CMAKE_PREFIX_PATH to "
                        "`python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'` or an unpacked libtorch")
  elseif(NOT CGT_HAVE_CUDA)
    cgt_skip_backend(torch "needs the CUDA compiler and toolkit")
  elseif(NOT Torch_FOUND)
    cgt_skip_backend(torch "no Torch found on CMAKE_PREFIX_PATH")
  else()
    cgt_skip_backend(torch "the Torch found has no CUDA")
  endif()
else()
  cgt_skip_backend(torch "CGT_WITH_TORCH=OFF")
endif()

function(cgt_report_backends)
  message(STATUS "cgt backends built: ${CGT_BUILT_BACKENDS}")
  foreach(skipped IN LISTS CGT_SKIPPED_BACKENDS)
    if(skipped)
      message(STATUS "cgt backend not built: ${skipped}")
    endif()
  endforeach()
endfunction()
