# Fails when an instruction-set path's kernel object defines a symbol with vague linkage (weak,
# unique or a COMDAT template instance) outside its own namespaces: the linker keeps one copy of
# each such symbol for the whole library, so a copy built for AVX-512 could serve a baseline CPU.
# Usage: cmake -DNM=nm -DPATH_NAME=avx2 -DOBJECTS="a.o;b.o" -P check_symbols.cmake
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND ${NM} -C --defined-only ${object} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "nm failed on ${object}")
  endif()
  string(REPLACE "\n" ";" lines "${symbols}")
  set(count 0)
  foreach(line IN LISTS lines)
    if(line MATCHES "^[0-9a-f]+ ([WVu]) (.*)$")
      set(name "${CMAKE_MATCH_2}")
      math(EXPR count "${count} + 1")
      if(NOT name MATCHES "troupe_eigen_${PATH_NAME}::|troupe::detail::cpu::${PATH_NAME}::" AND
         NOT name STREQUAL "DW.ref.__gxx_personality_v0")
        message(FATAL_ERROR "${PATH_NAME} kernels: ${object} defines '${name}' with vague linkage outside its namespaces")
      endif()
    endif()
  endforeach()
  if(count EQUAL 0)
    message(FATAL_ERROR "${PATH_NAME} kernels: no Eigen template instances in ${object}: is it the kernel object?")
  endif()
  message(STATUS "${PATH_NAME}: ${count} vague-linkage symbols, all in troupe_eigen_${PATH_NAME}")
endforeach()
