# ctest runs this: fails for README or docs/ blocks without a usable `<!-- cgt-test: ... -->`
# comment, then builds every extracted block (target cgt_readme_blocks; compiler errors point at the
# pages' lines).
#   -DBUILD_DIR=... -DCOMPILED=<count> -DLEFT_OUT=<a|b|...> -DERRORS=<a|b|...>
if(ERRORS)
  string(REPLACE "|" "\n  " errors "${ERRORS}")
  message(FATAL_ERROR "README.md or docs/ have code blocks the test cannot compile (see tests/readme/extract.py):\n  ${errors}")
endif()
if(NOT COMPILED GREATER 0)
  message(FATAL_ERROR "no README or docs/ block was extracted for this build")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target cgt_readme_blocks
                RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "a README or docs/ block does not compile:\n${output}")
endif()
message(STATUS "${COMPILED} README and docs/ blocks compile")
if(LEFT_OUT)
  string(REPLACE "|" ", " left_out "${LEFT_OUT}")
  message(STATUS "left out (their backend is not built here): ${left_out}")
endif()
