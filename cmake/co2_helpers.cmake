# co2_library(NAME SRCS a.cc ... DEPS target ...): one library per unit.
function(co2_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_library(${name} ${ARG_SRCS})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}>
    $<INSTALL_INTERFACE:include/co2>)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  # No fused multiply-adds: GCC fuses a·b + c by default where the target
  # has FMA (AArch64 always; x86-64 with -march=native), and in some kernel
  # variants and not others, while workers and shards on different machines
  # must compute the same bits (common/kernel_isa.h).
  target_compile_options(${name} PRIVATE -Wall -Wextra -ffp-contract=off)
endfunction()

# co2_test(NAME DEPS target ... [LABELS long ...] [TIMEOUT s]): tests/NAME.cc
# linked with GoogleTest, registered with ctest under NAME.
function(co2_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "DEPS;LABELS" ${ARGN})
  add_executable(${name} ${name}.cc)
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock
                        GTest::gtest_main)
  target_compile_options(${name} PRIVATE -Wall -Wextra)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(labels unit)
  if(ARG_LABELS)
    set(labels ${ARG_LABELS})
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT}
                       LABELS "${labels}")
endfunction()
