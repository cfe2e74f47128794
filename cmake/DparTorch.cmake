# libtorch (Debian's libtorch-dev here; a libtorch from PyTorch's wheels or downloads elsewhere,
# found through CMAKE_PREFIX_PATH or Torch_DIR) for dpar::torch. DPAR_WITH_TORCH=AUTO builds it
# when libtorch is found and says in one line why not otherwise; ON makes a missing libtorch an
# error.
set(DPAR_TORCH_ENABLED OFF)
if(NOT DPAR_WITH_TORCH STREQUAL "OFF")
  if(DPAR_FUZZ)
    message(STATUS "dpar::torch: off (DPAR_FUZZ: the fuzz targets do not use it)")
  elseif(DPAR_SANITIZE)
    # libtorch is not built with the sanitizers: its allocations and threads would be invisible
    # to them, so the sanitizer builds leave dpar::torch out.
    message(STATUS "dpar::torch: off (DPAR_SANITIZE=${DPAR_SANITIZE}: libtorch is not instrumented)")
  else()
    find_package(Torch QUIET)
    if(Torch_FOUND)
      set(DPAR_TORCH_ENABLED ON)
      message(STATUS "dpar::torch: on (libtorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX})")
    elseif(DPAR_WITH_TORCH STREQUAL "ON")
      message(FATAL_ERROR "DPAR_WITH_TORCH=ON but libtorch was not found (install Debian's "
        "libtorch-dev, or set Torch_DIR to a libtorch's share/cmake/Torch)")
    else()
      message(STATUS "dpar::torch: off (libtorch not found: install libtorch-dev, or set Torch_DIR)")
    endif()
  endif()
else()
  message(STATUS "dpar::torch: off (DPAR_WITH_TORCH=OFF)")
endif()
