# CO2_THREAD_SAFETY=ON: clang's thread-safety analysis (-Wthread-safety, the
# stable set) checks the ABSL_GUARDED_BY / ABSL_*LOCKS_* annotations of every
# unit compiled, and a violation is an error. `make thread-safety` configures
# such a build in build-tsa and builds only the target co2_thread_safety: the
# libraries whose sources hold an absl::Mutex and its annotations.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "CO2_THREAD_SAFETY=ON needs clang (-Wthread-safety), "
    "but the C++ compiler is ${CMAKE_CXX_COMPILER_ID} (${CMAKE_CXX_COMPILER}): "
    "configure a fresh build directory with -DCMAKE_CXX_COMPILER=clang++")
endif()
add_compile_options(-Wthread-safety -Werror=thread-safety)
# A static library's objects then wait only for the headers they include
# (co2_proto's generated ones), not for every library it links: building
# co2_thread_safety compiles its own units and the proto, nothing else.
set(CMAKE_OPTIMIZE_DEPENDENCIES ON)

# The analysis looks at function bodies, so a class's annotations are checked
# where its members are defined: these are the libraries whose .cc files
# define annotated classes' members or lock an absl::Mutex (grep
# 'ABSL_GUARDED_BY\|LOCKS_REQUIRED\|ABSL_LOCKS_EXCLUDED\|absl::Mutex').
set(CO2_THREAD_SAFETY_TARGETS
  co2_clock                # common/clock: FakeClock
  co2_job_shard            # server/job/job_shard*.cc: JobShard
  co2_job_registry         # server/job/job_registry: JobRegistry
  co2_read_thread          # server/service/read_thread: ReadThread
  co2_refused_calls        # server/service/refused_calls: RefusedCalls
  co2_shard_metrics        # server/service/shard_metrics: ShardMetrics
  co2_aggregator_service   # server/service/aggregator_service: its reactors
  co2_shard_stream         # client/shard_stream: ShardStream
  co2_aggregator_client)   # client/aggregator_client: AggregatorClient

function(co2_thread_safety_target)
  add_custom_target(co2_thread_safety)
  add_dependencies(co2_thread_safety ${CO2_THREAD_SAFETY_TARGETS})
endfunction()
