# The installed package, used the ways an application uses it:
#  1. an installed program starts from a scratch prefix with no LD_LIBRARY_PATH (install RPATH);
#  2. a CMake project with find_package(troupe CONFIG REQUIRED COMPONENTS caf) builds and runs two
#     programs: one that lets troupe own its actor system, one that embeds troupe into its own;
#  3. the same first program built with nothing but `pkg-config --cflags --libs troupe`;
#  4. the example programs are installed (PREFIX/libexec/troupe/examples) and run from there.
# Arguments: BUILD_DIR, SOURCE_DIR (tests/install), WORK_DIR, CXX, HAVE_CUDA, HAVE_EXAMPLES.
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()

# 1. Installed programs.
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH "${prefix}/bin/troupe-ckpt" --help
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "usage: troupe-ckpt")
  message(FATAL_ERROR "PREFIX/bin/troupe-ckpt --help failed (${rc}): ${out}${err}")
endif()
message(STATUS "PREFIX/bin/troupe-ckpt starts from the scratch prefix")
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH "${prefix}/bin/troupe-doctor" --help
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "Usage: troupe-doctor")
  message(FATAL_ERROR "PREFIX/bin/troupe-doctor --help failed (${rc}): ${out}${err}")
endif()
message(STATUS "PREFIX/bin/troupe-doctor starts from the scratch prefix")
if(HAVE_EXAMPLES)
  set(examples "${prefix}/libexec/troupe/examples")
  foreach(program seed_examples quickstart custom_loop mlp_classifier multi_worker_trainer digits_cnn)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH "${examples}/${program}" --help
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0 OR NOT out MATCHES "Usage: ${program}")
      message(FATAL_ERROR "PREFIX/libexec/troupe/examples/${program} --help failed (${rc}): ${out}${err}")
    endif()
  endforeach()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH "${examples}/quickstart" --replicas 2
                          --epochs 2 --steps 5
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "MirroredStrategy over 2 CPU replicas.*loss .* \\(falls\\)")
    message(FATAL_ERROR "the installed quickstart failed (${rc}): ${out}${err}")
  endif()
  message(STATUS "the installed examples start and quickstart trains")
endif()

# 2. find_package.
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}/consumer" -B "${WORK_DIR}/build"
                        "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_BUILD_TYPE=Release "-DEXPECT_CUDA=${HAVE_CUDA}"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND "${WORK_DIR}/build/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "consumer printed: ${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "sum over 3 replicas: 6")
  message(FATAL_ERROR "the consumer failed (${rc}): ${out}")
endif()
execute_process(COMMAND "${WORK_DIR}/build/embedding" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 60)
message(STATUS "embedding printed: ${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "mirrored in the application's system: 10"
   OR NOT out MATCHES "multi-worker over 1 replica\\(s\\): 7"
   OR NOT out MATCHES "the application's actor answered 42 after troupe ran")
  message(FATAL_ERROR "the embedding consumer failed (${rc}): ${out}${err}")
endif()

# 3. pkg-config.
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs troupe RESULT_VARIABLE rc OUTPUT_VARIABLE flags
                ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs troupe failed (${rc}): ${err}")
endif()
execute_process(COMMAND ${PKG_CONFIG} --variable=libdir troupe OUTPUT_VARIABLE libdir OUTPUT_STRIP_TRAILING_WHITESPACE)
execute_process(COMMAND ${PKG_CONFIG} --variable=cuda troupe OUTPUT_VARIABLE pc_cuda OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT pc_cuda STREQUAL HAVE_CUDA)
  message(FATAL_ERROR "troupe.pc says cuda=${pc_cuda}, the build says ${HAVE_CUDA}")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
execute_process(COMMAND ${CXX} -std=c++17 "${SOURCE_DIR}/consumer/main.cpp" ${flags} -o "${WORK_DIR}/pc_consumer"
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building with pkg-config's flags (${flags}) failed (${rc}): ${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${libdir}" "${WORK_DIR}/pc_consumer"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "pkg-config consumer printed: ${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "sum over 3 replicas: 6")
  message(FATAL_ERROR "the pkg-config consumer failed (${rc}): ${out}${err}")
endif()
