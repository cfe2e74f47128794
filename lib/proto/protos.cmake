# gRPC services of libdpar: every lib/proto/*.proto is compiled by protoc + grpc_cpp_plugin into
# the build tree and linked into dpar privately (the generated headers never reach dpar's public
# headers, which use pimpl). Defines DPAR_PROTO_SOURCES and dpar_link_protos(target).
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)

set(DPAR_PROTO_OUT_DIR ${CMAKE_CURRENT_BINARY_DIR}/proto_gen)
file(GLOB DPAR_PROTO_FILES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.proto)
set(DPAR_PROTO_SOURCES)
foreach(proto ${DPAR_PROTO_FILES})
  get_filename_component(name ${proto} NAME_WE)
  set(outputs ${DPAR_PROTO_OUT_DIR}/${name}.pb.cc ${DPAR_PROTO_OUT_DIR}/${name}.pb.h
    ${DPAR_PROTO_OUT_DIR}/${name}.grpc.pb.cc ${DPAR_PROTO_OUT_DIR}/${name}.grpc.pb.h)
  add_custom_command(OUTPUT ${outputs}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${DPAR_PROTO_OUT_DIR}
    COMMAND protobuf::protoc --proto_path=${CMAKE_CURRENT_LIST_DIR}
      --cpp_out=${DPAR_PROTO_OUT_DIR} --grpc_out=${DPAR_PROTO_OUT_DIR}
      --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin> ${proto}
    DEPENDS ${proto} protobuf::protoc gRPC::grpc_cpp_plugin
    COMMENT "Generating C++ for ${name}.proto" VERBATIM)
  list(APPEND DPAR_PROTO_SOURCES ${outputs})
endforeach()
# Generated code is not ours to fix: keep the project's -Werror away from it.
set_source_files_properties(${DPAR_PROTO_SOURCES} PROPERTIES COMPILE_OPTIONS -w)

function(dpar_link_protos target)
  # SYSTEM: our own sources include the generated headers under the project's warning set.
  target_include_directories(${target} SYSTEM PRIVATE ${DPAR_PROTO_OUT_DIR})
  target_link_libraries(${target} PRIVATE gRPC::grpc++ protobuf::libprotobuf)
endfunction()
