# The test of extract.py's checks on a page (cmake -P): extracts PAGE's blocks into OUT_DIR and
# fails unless CGT_README_ERRORS names every one of EXPECTED ("|"-separated parts of messages).
execute_process(COMMAND ${PYTHON} ${EXTRACT} blocks ${HARNESS_DIR} ${OUT_DIR} ${PAGE} RESULT_VARIABLE extracted)
if(NOT extracted EQUAL 0)
  message(FATAL_ERROR "extract.py failed on ${PAGE}")
endif()
function(cgt_readme_block)  # the blocks that passed: nothing to build here
endfunction()
include(${OUT_DIR}/blocks.cmake)
string(REPLACE "|" ";" expected "${EXPECTED}")
foreach(part IN LISTS expected)
  string(FIND "${CGT_README_ERRORS}" "${part}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "extract.py did not report '${part}' on ${PAGE}; it reported: ${CGT_README_ERRORS}")
  endif()
endforeach()
message(STATUS "reported as expected: ${CGT_README_ERRORS}")
