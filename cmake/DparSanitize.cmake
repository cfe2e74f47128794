# Sanitizer and fuzzing builds are options of the one build, never copies of its targets.
#
#   -DDPAR_SANITIZE=address,undefined   ASan + LeakSanitizer + UBSan (GCC or Clang)
#   -DDPAR_SANITIZE=thread              ThreadSanitizer
#   -DDPAR_FUZZ=ON                      libFuzzer targets in tests/fuzz (Clang only); the whole
#                                       build is instrumented for coverage, ASan and UBSan
#
# The flags apply to every C and C++ target (the library, its programs and its tests), so a
# report names dpar's own code with line numbers. CUDA sources are left alone: device code is
# checked with compute-sanitizer on the GPU machine (docs/gpu.md).
set(DPAR_SANITIZE "" CACHE STRING "Sanitizers for every C/C++ target: address,undefined or thread")
option(DPAR_FUZZ "Build the libFuzzer targets in tests/fuzz (Clang; implies address,undefined)" OFF)

if(DPAR_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "DPAR_FUZZ=ON needs Clang (libFuzzer): configure with "
      "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
  endif()
  if(DPAR_SANITIZE STREQUAL "")
    set(DPAR_SANITIZE "address,undefined")
  endif()
endif()

if(NOT DPAR_SANITIZE STREQUAL "")
  string(REPLACE "," ";" dpar_sanitizers "${DPAR_SANITIZE}")
  foreach(s ${dpar_sanitizers})
    if(NOT s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "DPAR_SANITIZE: unknown sanitizer '${s}' (address, undefined, thread, leak)")
    endif()
  endforeach()
  if("thread" IN_LIST dpar_sanitizers AND "address" IN_LIST dpar_sanitizers)
    message(FATAL_ERROR "DPAR_SANITIZE: thread cannot be combined with address")
  endif()

  # -O1 after the build type's -O3: instrumented code builds ~40% faster at -O1 (measured on
  # checkpoint_manager.cpp under ASan: 32 s against 55 s) and it is the level the sanitizers'
  # own documentation recommends; -O3 gains little once every access is checked.
  set(dpar_sanitize_flags -O1 -fsanitize=${DPAR_SANITIZE} -fno-omit-frame-pointer)
  if("undefined" IN_LIST dpar_sanitizers)
    # Undefined behaviour fails the test that hit it instead of scrolling past in a log.
    list(APPEND dpar_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
  if("address" IN_LIST dpar_sanitizers)
    # libstdc++'s bounds checks on operator[] and friends: out-of-range indices into
    # containers that ASan cannot see (inside one allocation) abort too.
    add_compile_definitions($<$<COMPILE_LANGUAGE:C,CXX>:_GLIBCXX_ASSERTIONS>)
  endif()
  # Line tables only: stack traces with file:line at a fraction of full -g's build time.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    list(APPEND dpar_sanitize_flags -gline-tables-only)
  else()
    list(APPEND dpar_sanitize_flags -g1)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${dpar_sanitize_flags}>")
  add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fsanitize=${DPAR_SANITIZE}>")
  message(STATUS "dpar: sanitizers ${DPAR_SANITIZE}")
endif()

if(DPAR_FUZZ)
  # Coverage instrumentation everywhere; only the fuzz targets link libFuzzer's main.
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>")
endif()

# dpar_scale_test_timeouts(): instrumented code runs several times slower (ASan ~2-4x, TSan
# 5-15x), so in sanitizer builds every TIMEOUT a test of the calling directory sets is
# multiplied; the tests' own internal deadlines are the product's and stay as they are. Call at
# the end of each CMakeLists.txt that sets TIMEOUTs (CMake 3.25 reads test properties only in
# the directory that made the test).
function(dpar_scale_test_timeouts)
  if(DPAR_SANITIZE STREQUAL "")
    return()
  endif()
  set(factor 4)
  if(DPAR_SANITIZE MATCHES "thread")
    set(factor 10)
  endif()
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t ${tests})
    get_test_property(${t} TIMEOUT timeout)
    if(timeout)
      math(EXPR timeout "${timeout} * ${factor}")
      set_tests_properties(${t} PROPERTIES TIMEOUT ${timeout})
    endif()
  endforeach()
endfunction()
