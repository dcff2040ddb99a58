# ctest runs this: configures, builds and (maybe) runs one consumer project against the cgt that
# tests/consumer/install.cmake installed, as a user's project would.
#   -DPREFIX=<installed cgt> -DWORK_DIR=<scratch> -DCXX=<compiler>
#   -DSOURCE_DIR=<project>, or -DREADME=<README.md> -DPROJECT=<name> -DEXTRACT=<extract.py> -DPYTHON=...
#     (the project is the README's `<!-- cgt-test: file NAME/... -->` blocks)
#   -DEXTRA_PREFIX=<more of CMAKE_PREFIX_PATH, e.g. Torch>  -DCONFIGURE_ARGS=<more -D...>
#   -DRUN=always|gpu|never   (gpu: only where nvidia-smi sees a GPU)
#   -DEXPECT_CONFIGURE_ERROR=<regex>: the configure must fail with a message matching it
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok\n${out}")
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
unset(ENV{CMAKE_PREFIX_PATH})  # the prefix path is exactly what the test gives
unset(ENV{TORCH_CUDA_ARCH_LIST})
if(README)
  set(SOURCE_DIR ${WORK_DIR}/source)
  step("extract project ${PROJECT} from the README" ${PYTHON} ${EXTRACT} project ${README} ${PROJECT} ${SOURCE_DIR})
endif()
set(prefix_path "${PREFIX}")
if(EXTRA_PREFIX)
  list(APPEND prefix_path ${EXTRA_PREFIX})
endif()
# Only the generator, compiler and prefix path are given, as a user's command line would: the rest
# is the project's and cgt's config's business. (Written out, not through a list variable: the
# prefix path is a list itself.)
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G Ninja -DCMAKE_CXX_COMPILER=${CXX}
                        "-DCMAKE_PREFIX_PATH=${prefix_path}" ${CONFIGURE_ARGS}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(DEFINED EXPECT_CONFIGURE_ERROR)
  if(rc EQUAL 0)
    message(FATAL_ERROR "the configure must fail, but it succeeded:\n${out}\n${err}")
  endif()
  string(REGEX REPLACE "[ \n]+" " " flat "${err}")
  if(NOT flat MATCHES "${EXPECT_CONFIGURE_ERROR}")
    message(FATAL_ERROR "the configure failed, but without a message matching '${EXPECT_CONFIGURE_ERROR}':\n${err}")
  endif()
  message(STATUS "the configure fails as it should:\n${err}")
  return()
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure the consumer failed (${rc}):\n${out}\n${err}")
endif()
message(STATUS "configure the consumer: ok\n${out}")
step("build the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
if(RUN STREQUAL "gpu")
  execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE no_gpu OUTPUT_QUIET ERROR_QUIET)
  if(NOT no_gpu EQUAL 0)
    message(STATUS "no GPU: the consumer is built, not run")
    return()
  endif()
endif()
if(NOT RUN STREQUAL "never")
  file(GLOB program ${WORK_DIR}/build/consumer ${WORK_DIR}/build/app)
  step("run the consumer" ${program})
endif()
