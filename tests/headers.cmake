# Every test header compiles on its own: one object file per header, whose source includes that
# header and nothing else, so a header that leans on its includer's includes or imports fails here.
#   cgt_check_headers(<target> <library to link> <header>...)
function(cgt_check_headers target library)
  set(sources)
  foreach(header IN LISTS ARGN)
    string(MAKE_C_IDENTIFIER "${header}" name)
    set(source "${CMAKE_CURRENT_BINARY_DIR}/header_check/${name}.cpp")
    file(CONFIGURE OUTPUT "${source}" CONTENT "#include \"${header}\"\n")
    list(APPEND sources "${source}")
  endforeach()
  add_library(${target} OBJECT ${sources})
  target_link_libraries(${target} PRIVATE ${library} Catch2::Catch2)
  target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
endfunction()

cgt_check_headers(cgt_test_headers_host cgt_host
  scenario/spec.hpp scenario/scenarios.hpp scenario/property.hpp scenario/register.hpp host/harness.hpp host/values.hpp
  host/forwarding.hpp host/host_test.hpp
  stress/config.hpp stress/model.hpp stress/functions.hpp stress/graveyard.hpp stress/records.hpp)
if(CGT_HAVE_CUDA)
  cgt_check_headers(cgt_test_headers_cuda cgt_cuda cuda/kernels.hpp cuda/harness.hpp launch/memset_script.hpp
                    gpu_context.hpp)
endif()
if(CGT_HAVE_TORCH)
  cgt_check_headers(cgt_test_headers_torch cgt_torch torch/harness.hpp torch/training_harness.hpp
                    torch/training_checks.hpp)
endif()
