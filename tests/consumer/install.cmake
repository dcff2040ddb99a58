# ctest runs this first (the consumer tests need it): `cmake --install` of the build into a scratch
# prefix, then checks that no installed CMake file names this source tree or build tree, or carries
# cgt's own build flags (warnings, debug format, sanitizers) into the consumer's compile of the
# module interfaces.   -DBUILD_DIR=... -DSOURCE_DIR=<cgt's source> -DPREFIX=...
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc}):\n${out}\n${err}")
endif()
file(GLOB_RECURSE installed ${PREFIX}/*.cmake)
list(LENGTH installed count)
if(count LESS 4)
  message(FATAL_ERROR "expected the package's CMake files under ${PREFIX}, found: ${installed}")
endif()
set(problems "")
foreach(file IN LISTS installed)
  file(READ ${file} text)
  foreach(forbidden IN ITEMS ${SOURCE_DIR} ${BUILD_DIR} -Wall -Wextra -gdwarf -fsanitize)
    string(FIND "${text}" "${forbidden}" at)
    if(at GREATER -1)
      string(APPEND problems "\n  ${file} contains ${forbidden}")
    endif()
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "installed files name a path of this build or carry its flags:${problems}")
endif()
message(STATUS "${count} installed CMake files, none naming ${SOURCE_DIR} or ${BUILD_DIR} or a build flag")
