# The core owners below the engine (the tree, the path, the ledger) never name the engine: what they
# need of the device or the pool comes through narrow interfaces (a backend::Device, a function's
# id, LedgerEffects). A line of code (comments left out) that names `Engine` or imports the engine's
# partition fails the test, naming the file and the line.
#   cmake -DSOURCE_DIR=<the project> -P tests/core/no_back_edges.cmake
set(owners src/core/tree.cppm src/core/tree.cpp src/core/tree_node.cpp src/core/path.cppm src/core/path.cpp
           src/core/ledger.cppm src/core/ledger.cpp)
set(found "")
foreach(file IN LISTS owners)
  file(STRINGS "${SOURCE_DIR}/${file}" lines)
  set(number 0)
  foreach(line IN LISTS lines)
    math(EXPR number "${number} + 1")
    string(REGEX REPLACE "//.*$" "" code "${line}")
    if(code MATCHES "(^|[^A-Za-z_])Engine([^A-Za-z_]|$)" OR code MATCHES "import[ \t]+:engine")
      string(APPEND found "\n  ${file}:${number}: ${line}")
    endif()
  endforeach()
endforeach()
if(found)
  message(FATAL_ERROR "the tree, the path and the ledger name the engine:${found}")
endif()
message(STATUS "no back-edges: the tree, the path and the ledger never name the engine")
