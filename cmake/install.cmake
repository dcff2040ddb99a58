# `cmake --install` puts the modules, the libraries and a package config in place, so that another
# project can `find_package(cgt COMPONENTS host cuda torch)` and `import cgt; import cgt.host; ...`.
# One export set per component: a consumer of `host` loads neither the CUDA nor the Torch targets,
# so it needs neither on its prefix path.
include(CMakePackageConfigHelpers)
set(CGT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/cgt)
set(CGT_INSTALLED_COMPONENTS host)

function(cgt_install_component export)
  install(TARGETS ${ARGN}
          EXPORT ${export}
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          FILE_SET CXX_MODULES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cgt/modules)
  install(EXPORT ${export}
          NAMESPACE cgt::
          DESTINATION ${CGT_INSTALL_CMAKEDIR}
          CXX_MODULES_DIRECTORY modules-${export})
endfunction()

# host: the engine (cgt::cgt) and the host backend, and any other target src/ installs.
set(cgt_host_targets ${CGT_INSTALLED_TARGETS})
list(REMOVE_ITEM cgt_host_targets cgt_cuda cgt_torch)
cgt_install_component(cgtTargets ${cgt_host_targets})
if(TARGET cgt_cuda)
  cgt_install_component(cgtCudaTargets cgt_cuda)
  list(APPEND CGT_INSTALLED_COMPONENTS cuda)
endif()
if(TARGET cgt_torch)
  cgt_install_component(cgtTorchTargets cgt_torch)
  # The parts cgt.torch-api.cppm includes in its purview, beside it (a quoted include finds them).
  file(GLOB cgt_torch_interface_parts ${PROJECT_SOURCE_DIR}/modules/cgt.torch-*.inc)
  install(FILES ${cgt_torch_interface_parts} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cgt/modules)
  list(APPEND CGT_INSTALLED_COMPONENTS torch)
endif()

# CMake (3.28-3.31) records each module's source path in the installed modules-*/target-*.cmake
# (IMPORTED_CXX_MODULES_<CONFIG>): point those at the installed copies instead, so that no
# installed file names this source tree (tests/consumer checks).
install(CODE "
  file(GLOB cgt_module_lists \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CGT_INSTALL_CMAKEDIR}/modules-*/target-*.cmake\")
  foreach(list IN LISTS cgt_module_lists)
    file(READ \"\${list}\" text)
    string(REPLACE \"=${PROJECT_SOURCE_DIR}/modules/\" \"=\\\${_IMPORT_PREFIX}/${CMAKE_INSTALL_INCLUDEDIR}/cgt/modules/\" text \"\${text}\")
    file(WRITE \"\${list}\" \"\${text}\")
  endforeach()
")

configure_package_config_file(cmake/cgtConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/cgtConfig.cmake
                              INSTALL_DESTINATION ${CGT_INSTALL_CMAKEDIR})
# find_package(cgt 0.2) accepts 0.2.x only: while the major version is 0, a new minor version may
# change the interface (CHANGELOG.md says how), so neither an older nor a newer minor version
# stands in for the one asked for; a patch version never changes the interface. (From 1.0 on,
# SameMajorVersion would be the rule.) tests/consumer/version checks both sides.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/cgtConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/cgtConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/cgtConfigVersion.cmake
        DESTINATION ${CGT_INSTALL_CMAKEDIR})
