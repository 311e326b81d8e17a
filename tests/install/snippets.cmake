# Every ```cpp block of README.md and docs/*.md compiles and links against the installed package,
# so the documentation stays true to the code. A block with its own main() is compiled as it
# stands; every other block becomes the body of its own function `snippet_<id>(troupe::Runtime& rt)`,
# all of them in one file that includes <troupe/troupe.hpp> with `using namespace troupe; using
# namespace troupe::distribute;` (a failure there recompiles them one by one to name the blocks).
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
set(bodies "")       # "id|name:start" of every block that is a function body
set(bodies_src "#include <memory>\n#include <troupe/troupe.hpp>\n"
               "using namespace troupe;\nusing namespace troupe::distribute;\n")

# Compiles and links one source file; on failure appends LABEL to `failures` and prints the errors.
function(compile_one src out label)
  execute_process(COMMAND ${CXX} -std=c++17 -Wall -Wno-unused-variable -Wno-unused-parameter -Wno-unused-result
                          "${src}" ${flags} -o "${out}"
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(STATUS "${label}: compiles")
  else()
    message(STATUS "${label}: does not compile:\n${err}")
    set(failures ${failures} "${label}" PARENT_SCOPE)
  endif()
endfunction()

# A body block wrapped as the function snippet_<id>; `#line` makes errors name the document.
function(body_source id name first code result)
  set(${result} "void snippet_${id}(troupe::Runtime& rt) {\n{\n#line ${first} \"${name}\"\n${code}}\n}\n"
      PARENT_SCOPE)
endfunction()

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
      math(EXPR first "${start} + 1")  # the block's first line, after the fence
      if(code MATCHES "int main\\(")
        # A whole program: compiled and linked as it stands.
        file(WRITE "${WORK_DIR}/${id}.cpp" "#line ${first} \"${name}\"\n${code}")
        compile_one("${WORK_DIR}/${id}.cpp" "${WORK_DIR}/${id}" "${name}:${start}")
      else()
        # Function bodies share one translation unit (troupe.hpp parsed once): each is its own
        # function, so names declared in one cannot reach another.
        body_source("${id}" "${name}" "${first}" "${code}" body)
        string(APPEND bodies_src "${body}")
        file(WRITE "${WORK_DIR}/${id}.body" "${code}")
        list(APPEND bodies "${id}|${name}|${start}|${first}")
      endif()
    elseif(in_block)
      string(APPEND code "${line}\n")
    endif()
  endforeach()
endforeach()
if(blocks EQUAL 0)
  message(FATAL_ERROR "no ```cpp block found in README.md or docs/")
endif()

if(bodies)
  list(LENGTH bodies n_bodies)
  file(WRITE "${WORK_DIR}/bodies.cpp" "${bodies_src}int main() { return 0; }\n")
  set(before "${failures}")
  compile_one("${WORK_DIR}/bodies.cpp" "${WORK_DIR}/bodies" "${n_bodies} function-body blocks together")
  if(NOT "${failures}" STREQUAL "${before}")
    # Name each failing block: compile them one by one (only on failure, so a passing run stays fast).
    set(failures "${before}")
    foreach(entry IN LISTS bodies)
      string(REPLACE "|" ";" parts "${entry}")
      list(GET parts 0 id)
      list(GET parts 1 name)
      list(GET parts 2 start)
      list(GET parts 3 first)
      file(READ "${WORK_DIR}/${id}.body" code)
      body_source("${id}" "${name}" "${first}" "${code}" body)
      file(WRITE "${WORK_DIR}/${id}.cpp" "#include <memory>\n#include <troupe/troupe.hpp>\n"
                 "using namespace troupe;\nusing namespace troupe::distribute;\n${body}"
                 "int main() { return 0; }\n")
      compile_one("${WORK_DIR}/${id}.cpp" "${WORK_DIR}/${id}" "${name}:${start}")
    endforeach()
    if("${failures}" STREQUAL "${before}")
      list(APPEND failures "the function-body blocks together (each compiles alone: two of them clash)")
    endif()
  endif()
endif()
if(failures)
  message(FATAL_ERROR "these C++ blocks of the documentation do not compile: ${failures}")
endif()
message(STATUS "${blocks} C++ blocks of the documentation compile against the installed package")
