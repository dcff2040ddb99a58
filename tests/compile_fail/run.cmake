# Builds one target of the build tree and checks how the compiler answered:
#   EXPECT=compile: the target builds.
#   EXPECT=errors:  the build fails, and every error is of the kind ERRORS names on a line of SOURCE
#                   marked `// expect-error`, one per marked line (so it cannot fail for another reason):
#     ERRORS=borrow (the default): a deleted borrow from a temporary;
#     ERRORS=hidden: a name that the imported modules do not export.
# Usage: cmake -DBUILD_DIR=... -DTARGET=... -DSOURCE=... -DEXPECT=compile|errors [-DERRORS=hidden] -P run.cmake
# TARGET may list several targets (one per marked line, where one error could hide the next):
# each is built on its own, and their outputs are checked together.
set(output "")
set(built "")
foreach(target IN LISTS TARGET)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${target}
                  RESULT_VARIABLE status OUTPUT_VARIABLE target_output ERROR_VARIABLE target_output)
  string(APPEND output "${target_output}")
  if(status EQUAL 0)
    list(APPEND built ${target})
  endif()
endforeach()
if(EXPECT STREQUAL "compile")
  if(NOT built STREQUAL TARGET)
    message(FATAL_ERROR "${TARGET} must compile, but the build failed:\n${output}")
  endif()
  message(STATUS "${TARGET} compiles")
  return()
endif()

if(built)
  message(FATAL_ERROR "${built} must not compile, but it did:\n${output}")
endif()
# Counted as list lengths: a `;` in the echoed source would split an entry, so none is left.
string(REPLACE ";" "," output "${output}")
file(READ ${SOURCE} source)
string(REGEX MATCHALL "// expect-error" marked "${source}")
list(LENGTH marked expected)
string(REGEX MATCHALL "[^\n]*error: [^\n]*" errors "${output}")
list(LENGTH errors total)
# Clang says "call to deleted member function 'get': <why>", or "attempt to use a deleted
# function: <why>" when the call goes through `->`; <why> is the message of the deleted borrow.
string(REGEX MATCHALL "error: (call to deleted member function '(get|device)'|attempt to use a deleted function): [^\n]*(dangles|dies with it)[^\n]*"
       deleted "${output}")
set(what "deleted-borrow")
if(ERRORS STREQUAL "hidden")
  # Clang says "declaration of 'X' must be imported from module 'M' before it is required" for a
  # name that exists in a module the TU reaches but that no import makes visible.
  # A member the program's view of a device does not have is "no member named".
  string(REGEX MATCHALL "error: (declaration of '[^']+' must be imported from module 'cgt\\.(core|host|cuda|torch)[^']*' before it is required|no member named '(adopt|HostDevice|shutdown|checkpoint|live_blocks|run)' in [^\n]*)"
         deleted "${output}")
  set(what "not-exported-name")
endif()
list(LENGTH deleted borrows)
# Clang echoes the source line of each error: the marked lines, and nothing else.
string(REGEX MATCHALL "\n *[0-9]+ \\|[^\n]*// expect-error" echoed "${output}")
list(LENGTH echoed on_marked)
if(NOT expected GREATER 0 OR NOT total EQUAL expected OR NOT borrows EQUAL expected OR NOT on_marked EQUAL expected)
  message(FATAL_ERROR "expected ${expected} ${what} errors, one on each marked line of ${SOURCE}; got ${total} "
                      "errors, ${borrows} of them ${what} errors, ${on_marked} on marked lines:\n${output}")
endif()
message(STATUS "${TARGET}: the ${expected} marked lines are rejected (${what})")
