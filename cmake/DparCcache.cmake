# Use ccache when present: the test suite rebuilds often on 2 cores.
find_program(DPAR_CCACHE ccache)
if(DPAR_CCACHE)
  set(CMAKE_C_COMPILER_LAUNCHER ${DPAR_CCACHE})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${DPAR_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${DPAR_CCACHE})
endif()
