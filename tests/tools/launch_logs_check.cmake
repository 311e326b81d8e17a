# troupe-launch -n 3 --ranks 1 --log-dir DIR: passes on the launcher's output (checked by the
# caller) and fails unless DIR/rank-<i>.log holds each worker's stdout and stderr, unprefixed.
file(REMOVE_RECURSE "${DIR}")
execute_process(COMMAND "${LAUNCH}" -n 3 --ranks=1 --log-dir "${DIR}" --timeout 30 -- /bin/sh -c
                        "i=\$(echo \"\$TF_CONFIG\" | sed 's/.*index\": \\([0-9]*\\).*/\\1/'); echo \"rank \$i says hi\"; echo \"rank \$i warns\" >&2"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "troupe-launch exited ${rc}")
endif()
foreach(i 0 1 2)
  file(READ "${DIR}/rank-${i}.log" log)
  if(NOT log MATCHES "rank ${i} says hi\n" OR NOT log MATCHES "rank ${i} warns\n" OR log MATCHES "\\[rank")
    message(FATAL_ERROR "${DIR}/rank-${i}.log holds: ${log}")
  endif()
endforeach()
