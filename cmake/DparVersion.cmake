# The git commit is read at configure time and written into a generated source, so logs and
# benchmark reports can name the exact build.
execute_process(COMMAND git rev-parse --short=12 HEAD
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
  OUTPUT_VARIABLE DPAR_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT DPAR_GIT_COMMIT)
  set(DPAR_GIT_COMMIT unknown)
endif()
