# CO2_FUZZ: instrument everything built from here on for libFuzzer, with
# AddressSanitizer and UndefinedBehaviorSanitizer; any UB aborts, so the
# fuzzer counts it as a crash. Clang only (GCC has no libFuzzer).
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "CO2_FUZZ needs clang (configure with CXX=clang++); "
                      "the compiler is ${CMAKE_CXX_COMPILER_ID}")
endif()
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined
                    -fno-sanitize-recover=all -fno-omit-frame-pointer)
add_link_options(-fsanitize=address,undefined)
