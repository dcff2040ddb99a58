# NCCL for the multi-GPU tests and the tensor-parallel benchmark (tests/multi, bench/tp_bench.cpp):
# never a dependency of the cgt libraries, which need nothing to run a collective inside a graph.
# Found, in this order, next to the Torch in use (pip's nvidia-nccl package, the library that
# libtorch_cuda loads), under $NCCL_ROOT / NCCL_ROOT, and in the CUDA toolkit. Sets CGT_HAVE_NCCL
# and the imported target cgt::nccl; without NCCL the targets that need it are skipped, with a
# message.
set(CGT_HAVE_NCCL OFF)
if(CGT_HAVE_CUDA)
  set(nccl_hints "")
  if(DEFINED NCCL_ROOT)
    list(APPEND nccl_hints "${NCCL_ROOT}")
  endif()
  if(DEFINED ENV{NCCL_ROOT})
    list(APPEND nccl_hints "$ENV{NCCL_ROOT}")
  endif()
  if(CGT_HAVE_TORCH AND DEFINED Torch_DIR)
    # <site-packages>/torch/share/cmake/Torch -> <site-packages>/nvidia/nccl (or nvidia/cu13)
    get_filename_component(nccl_site "${Torch_DIR}/../../../.." ABSOLUTE)
    list(PREPEND nccl_hints "${nccl_site}/nvidia/nccl" "${nccl_site}/nvidia/cu13")
  endif()
  get_filename_component(nccl_toolkit "${CUDAToolkit_LIBRARY_DIR}/.." ABSOLUTE)
  list(APPEND nccl_hints ${CUDAToolkit_TARGET_DIR} ${nccl_toolkit})
  find_path(CGT_NCCL_INCLUDE_DIR nccl.h HINTS ${nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  # pip's package has only the versioned name.
  find_library(CGT_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
  if(CGT_NCCL_INCLUDE_DIR AND CGT_NCCL_LIBRARY)
    set(CGT_HAVE_NCCL ON)
    if(NOT TARGET cgt::nccl)
      add_library(cgt::nccl INTERFACE IMPORTED)
      set_target_properties(cgt::nccl PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${CGT_NCCL_INCLUDE_DIR}"
                                                 INTERFACE_LINK_LIBRARIES "${CGT_NCCL_LIBRARY}")
    endif()
    message(STATUS "cgt: NCCL for the multi-GPU tests and benchmark: ${CGT_NCCL_LIBRARY}")
  else()
    message(STATUS "cgt: NCCL not found (nccl.h and libnccl; set NCCL_ROOT): the NCCL tests and "
                   "bench/tp_bench are not built")
  endif()
endif()
