# Use ccache when present: the test suite rebuilds often on 2 cores. Paths under the source
# folder are hashed relative to it (CCACHE_BASEDIR), so another checkout or worktree of the
# same code (CI's fresh clone, a second worktree) hits the same cache entries.
find_program(DPAR_CCACHE ccache)
if(DPAR_CCACHE)
  set(DPAR_CCACHE_LAUNCHER ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}
      CCACHE_NOHASHDIR=1 ${DPAR_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${DPAR_CCACHE_LAUNCHER})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${DPAR_CCACHE_LAUNCHER})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${DPAR_CCACHE_LAUNCHER})
endif()
