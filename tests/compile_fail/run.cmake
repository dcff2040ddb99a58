# Builds one target of the build tree and checks how the compiler answered:
#   EXPECT=compile: the target builds.
#   EXPECT=errors:  the build fails, and every error is a deleted borrow on a line of SOURCE marked
#                   `// expect-error`, one per marked line (so it cannot fail for another reason).
# Usage: cmake -DBUILD_DIR=... -DTARGET=... -DSOURCE=... -DEXPECT=compile|errors -P run.cmake
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
if(EXPECT STREQUAL "compile")
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${TARGET} must compile, but the build failed:\n${output}")
  endif()
  message(STATUS "${TARGET} compiles")
  return()
endif()

if(status EQUAL 0)
  message(FATAL_ERROR "${TARGET} must not compile, but it did:\n${output}")
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
list(LENGTH deleted borrows)
# Clang echoes the source line of each error: the marked lines, and nothing else.
string(REGEX MATCHALL "\n *[0-9]+ \\|[^\n]*// expect-error" echoed "${output}")
list(LENGTH echoed on_marked)
if(NOT expected GREATER 0 OR NOT total EQUAL expected OR NOT borrows EQUAL expected OR NOT on_marked EQUAL expected)
  message(FATAL_ERROR "expected ${expected} deleted-borrow errors, one on each marked line of ${SOURCE}; got ${total} "
                      "errors, ${borrows} of them deleted borrows, ${on_marked} on marked lines:\n${output}")
endif()
message(STATUS "${TARGET}: the ${expected} borrows from temporaries are rejected")
