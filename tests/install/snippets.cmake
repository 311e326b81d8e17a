# Every ```cpp block of README.md and docs/*.md compiles and links against the installed package,
# so the documentation stays true to the code. A block with its own main() is compiled as it
# stands; any other block becomes the body of a function `snippet(troupe::Runtime& rt)` in a file
# that includes <troupe/troupe.hpp> with `using namespace troupe; using namespace troupe::distribute;`.
# Arguments: BUILD_DIR, REPO_DIR, WORK_DIR, CXX.
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs troupe RESULT_VARIABLE rc OUTPUT_VARIABLE flags
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs troupe failed: ${rc}")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")

file(GLOB docs "${REPO_DIR}/docs/*.md")
set(blocks 0)
set(failures "")
foreach(doc "${REPO_DIR}/README.md" ${docs})
  file(RELATIVE_PATH name "${REPO_DIR}" "${doc}")
  set(in_block FALSE)
  set(line_no 0)
  file(READ "${doc}" text)
  string(REPLACE ";" "\\;" text "${text}")
  string(REPLACE "\n" ";" all_lines "${text}")
  foreach(line IN LISTS all_lines)
    math(EXPR line_no "${line_no} + 1")
    if(NOT in_block AND line MATCHES "^```(cpp|c\\+\\+)[ \t]*$")
      set(in_block TRUE)
      set(start ${line_no})
      set(code "")
    elseif(in_block AND line MATCHES "^```")
      set(in_block FALSE)
      math(EXPR blocks "${blocks} + 1")
      string(MAKE_C_IDENTIFIER "${name}_${start}" id)
      set(src "${WORK_DIR}/${id}.cpp")
      math(EXPR first "${start} + 1")  # the block's first line, after the fence
      if(code MATCHES "int main\\(")
        file(WRITE "${src}" "#line ${first} \"${name}\"\n${code}")
      else()
        file(WRITE "${src}" "#include <memory>\n#include <troupe/troupe.hpp>\n"
                            "using namespace troupe;\nusing namespace troupe::distribute;\n"
                            "void snippet(troupe::Runtime& rt) {\n{\n#line ${first} \"${name}\"\n${code}}\n}\n"
                            "int main() { return 0; }\n")
      endif()
      execute_process(COMMAND ${CXX} -std=c++17 -Wall -Wno-unused-variable -Wno-unused-parameter -Wno-unused-result "${src}" ${flags}
                              -o "${WORK_DIR}/${id}"
                      RESULT_VARIABLE rc ERROR_VARIABLE err)
      if(rc EQUAL 0)
        message(STATUS "${name}:${start}: compiles")
      else()
        message(STATUS "${name}:${start}: does not compile:\n${err}")
        list(APPEND failures "${name}:${start}")
      endif()
    elseif(in_block)
      string(APPEND code "${line}\n")
    endif()
  endforeach()
endforeach()
if(blocks EQUAL 0)
  message(FATAL_ERROR "no ```cpp block found in README.md or docs/")
endif()
if(failures)
  message(FATAL_ERROR "these C++ blocks of the documentation do not compile: ${failures}")
endif()
message(STATUS "${blocks} C++ blocks of the documentation compile against the installed package")
