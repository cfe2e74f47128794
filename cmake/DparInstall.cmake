include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
# libdpar_cuda (CUDA builds) goes beside libdpar, where libdpar looks for it at run time.
set(DPAR_INSTALLED_LIBRARIES dpar)
if(TARGET dpar_cuda)
  list(APPEND DPAR_INSTALLED_LIBRARIES dpar_cuda)
endif()
install(TARGETS ${DPAR_INSTALLED_LIBRARIES} EXPORT dparTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/lib/include/dpar DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT dparTargets NAMESPACE dpar:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dpar)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/dparConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dparConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dpar)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dparConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dparConfig.cmake ${PROJECT_BINARY_DIR}/dparConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dpar)

# dpar::torch: its own export set, loaded by find_package(dpar COMPONENTS torch).
if(DPAR_TORCH_ENABLED)
  install(TARGETS dpar_torch EXPORT dparTorchTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT dparTorchTargets NAMESPACE dpar:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dpar)
endif()
