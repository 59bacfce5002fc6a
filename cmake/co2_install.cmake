# `cmake --install` of the client library as a CMake package (docs/usage.md):
#
#   <prefix>/include/co2/{client,common}/**.h, co2/v1/*.pb.h  the units' headers
#   <prefix>/lib/libco2_*.a                                 one archive per unit
#   <prefix>/lib/cmake/co2/co2Config.cmake, co2Targets.cmake
#   <prefix>/bin/co2-aggregator, co2-train, co2-checkpoint, co2-admin
#
# A trainer writes find_package(co2 CONFIG REQUIRED), links co2::client and
# includes <co2/client/...>. co2::client is an
# INTERFACE target over the client units; the units themselves are exported
# as co2::<unit> (co2_flat_params -> co2::flat_params) so that their
# dependencies between each other, and on absl, gRPC, Protobuf, Gloo, Torch,
# zlib (and CUDA/NCCL when built), travel with them. The static archives keep
# the package one link line for the user and need no RPATH.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(NOT TARGET co2_optimizer)
  message(STATUS "co2: the client (LibTorch, Gloo) is not built; nothing to install")
  return()
endif()

# The units a trainer links, closed under their co2 dependencies.
set(co2_install_units
  co2_proto co2_logging co2_clock co2_layout co2_codec co2_payload_pieces co2_fnv_hash
  co2_grpc_status co2_tls_config co2_tls_probe co2_job_config co2_wire_frames co2_worker_wire co2_send_buffers
  co2_shard_calls co2_shard_stream co2_aggregator_client co2_algo co2_anchor_exchange
  co2_torch_status co2_flat_params co2_gloo_group co2_process_group
  co2_optimizer co2_data_shard co2_fashion_mnist co2_batches)
if(TARGET co2_nccl_group)
  list(APPEND co2_install_units co2_nccl_group)
  set(CO2_INSTALL_WITH_NCCL ON)
  # Where the consumer finds CUDA::cudart (client/CMakeLists.txt's default).
  set(CO2_INSTALL_CUDA_ROOT /usr/local/cuda)
else()
  set(CO2_INSTALL_WITH_NCCL OFF)
endif()

add_library(co2_client INTERFACE)
add_library(co2::client ALIAS co2_client)
set_target_properties(co2_client PROPERTIES EXPORT_NAME client)
target_link_libraries(co2_client INTERFACE
  co2_optimizer co2_aggregator_client co2_flat_params co2_process_group
  co2_fashion_mnist co2_batches co2_data_shard co2_job_config co2_codec
  co2_logging)
# <co2/...> for the user; the headers include each other as "client/...",
# "common/..." (the units' own include directory is <prefix>/include/co2).
target_include_directories(co2_client INTERFACE
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

foreach(unit IN LISTS co2_install_units)
  string(REGEX REPLACE "^co2_" "" export_name ${unit})
  set_target_properties(${unit} PROPERTIES EXPORT_NAME ${export_name})
  # The header of each source, at its path in the source tree.
  get_target_property(unit_dir ${unit} SOURCE_DIR)
  get_target_property(unit_sources ${unit} SOURCES)
  foreach(src IN LISTS unit_sources)
    get_filename_component(stem ${src} NAME_WE)
    if(EXISTS ${unit_dir}/${stem}.h)
      file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${unit_dir})
      install(FILES ${unit_dir}/${stem}.h
              DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/co2/${rel})
    endif()
  endforeach()
endforeach()
# Header-only pieces the units' headers include.
install(FILES ${PROJECT_SOURCE_DIR}/common/status_macros.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/co2/common)
install(FILES ${PROJECT_SOURCE_DIR}/client/collectives/store.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/co2/client/collectives)
install(DIRECTORY ${PROJECT_BINARY_DIR}/co2/v1/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/co2/v1
        FILES_MATCHING PATTERN "*.pb.h")

install(TARGETS co2_client ${co2_install_units}
  EXPORT co2Targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/co2)
install(TARGETS co2-aggregator co2-train co2-checkpoint co2-admin
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT co2Targets
  NAMESPACE co2::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/co2)

configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/co2Config.cmake.in
  ${PROJECT_BINARY_DIR}/co2Config.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/co2
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/co2ConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/co2Config.cmake
              ${PROJECT_BINARY_DIR}/co2ConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/co2)
