# gRPC services of libdpar: every lib/proto/*.proto is compiled by protoc + grpc_cpp_plugin into
# the build tree and linked into dpar privately (the generated headers never reach dpar's public
# headers, which use pimpl). Defines DPAR_PROTO_SOURCES, dpar_link_protos(target), and
# dpar_generate_protos() for protos outside the library (bench/ has one).
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)

# dpar_generate_protos(<sources var> <output dir> <proto>...): C++ and gRPC stubs of each proto
# into <output dir>; the generated files are appended to <sources var>.
function(dpar_generate_protos sources_var out_dir)
  set(generated)
  foreach(proto ${ARGN})
    get_filename_component(name ${proto} NAME_WE)
    get_filename_component(proto_dir ${proto} DIRECTORY)
    set(outputs ${out_dir}/${name}.pb.cc ${out_dir}/${name}.pb.h
      ${out_dir}/${name}.grpc.pb.cc ${out_dir}/${name}.grpc.pb.h)
    add_custom_command(OUTPUT ${outputs}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${out_dir}
      COMMAND protobuf::protoc --proto_path=${proto_dir}
        --cpp_out=${out_dir} --grpc_out=${out_dir}
        --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin> ${proto}
      DEPENDS ${proto} protobuf::protoc gRPC::grpc_cpp_plugin
      COMMENT "Generating C++ for ${name}.proto" VERBATIM)
    list(APPEND generated ${outputs})
  endforeach()
  # Generated code is not ours to fix: keep the project's -Werror away from it.
  set_source_files_properties(${generated} PROPERTIES COMPILE_OPTIONS -w)
  set(${sources_var} ${${sources_var}} ${generated} PARENT_SCOPE)
endfunction()

set(DPAR_PROTO_OUT_DIR ${CMAKE_CURRENT_BINARY_DIR}/proto_gen)
file(GLOB DPAR_PROTO_FILES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.proto)
set(DPAR_PROTO_SOURCES)
dpar_generate_protos(DPAR_PROTO_SOURCES ${DPAR_PROTO_OUT_DIR} ${DPAR_PROTO_FILES})

function(dpar_link_protos target)
  # SYSTEM: our own sources include the generated headers under the project's warning set.
  target_include_directories(${target} SYSTEM PRIVATE ${DPAR_PROTO_OUT_DIR})
  target_link_libraries(${target} PRIVATE gRPC::grpc++ protobuf::libprotobuf)
endfunction()
