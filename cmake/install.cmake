# `cmake --install` puts the modules, the libraries and a package config in place, so that another
# project can `find_package(cgt)` and `import cgt; import cgt.host;`.
include(CMakePackageConfigHelpers)
set(CGT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/cgt)
install(TARGETS ${CGT_INSTALLED_TARGETS}
        EXPORT cgtTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        FILE_SET CXX_MODULES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cgt/modules)
install(EXPORT cgtTargets
        NAMESPACE cgt::
        DESTINATION ${CGT_INSTALL_CMAKEDIR}
        CXX_MODULES_DIRECTORY modules)
configure_package_config_file(cmake/cgtConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/cgtConfig.cmake
                              INSTALL_DESTINATION ${CGT_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/cgtConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/cgtConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/cgtConfigVersion.cmake
        DESTINATION ${CGT_INSTALL_CMAKEDIR})
