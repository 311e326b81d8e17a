# Configures troupe with TROUPE_ENABLE_CUDA=OFF in a scratch build tree, builds the library and
# the seed examples, and runs them: the CPU-only build (gpu_none.cpp, nccl_none.cpp) keeps working
# on machines where the main build found CUDA.
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}" -DCMAKE_BUILD_TYPE=Release
                        -DTROUPE_ENABLE_CUDA=OFF -DTROUPE_BUILD_TESTS=OFF -DTROUPE_BUILD_BENCH=OFF
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring without CUDA failed (${rc}): ${out} ${err}")
endif()
if(NOT out MATCHES "CUDA/NCCL support: OFF")
  message(FATAL_ERROR "the scratch build still found CUDA: ${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}" --target seed_examples -j2 RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building without CUDA failed: ${rc}")
endif()
execute_process(COMMAND "${WORK_DIR}/examples/seed_examples" 2 RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "all_reduce\\(SUM\\) of replica ids -> \\(1, 1\\)")
  message(FATAL_ERROR "seed_examples built without CUDA failed (${rc}): ${out}")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
