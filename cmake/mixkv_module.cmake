# mixkv_module(NAME SOURCES ... [DEPENDS module ...] [PUBLIC_LIBS ...] [PRIVATE_LIBS ...])
#
# Defines the library target mixkv_NAME for the module in src/NAME/ with public headers in
# include/mixkv/NAME/, links the modules it depends on, and records its dependency closure. A
# module may only depend on modules defined before it, so the order of the calls is the layering.
# mixkv_check_layering() then adds a build step that fails when any file of a module includes a
# header of a module outside that closure.
function(mixkv_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPENDS;PUBLIC_LIBS;PRIVATE_LIBS" ${ARGN})
  add_library(mixkv_${name} ${ARG_SOURCES})
  # MIXKV_UNITY_LIBRARIES (CMakeLists.txt): the module's files compile as unity batches. CMake
  # leaves out of the batches any file with its own compile options or definitions.
  set_target_properties(mixkv_${name} PROPERTIES UNITY_BUILD ${MIXKV_UNITY_LIBRARIES}
                        UNITY_BUILD_BATCH_SIZE ${MIXKV_LIBRARY_UNITY_BATCH})
  target_include_directories(mixkv_${name}
    PUBLIC ${PROJECT_SOURCE_DIR}/include
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  set(closure ${name})
  foreach(dep IN LISTS ARG_DEPENDS)
    get_property(defined GLOBAL PROPERTY MIXKV_CLOSURE_${dep} DEFINED)
    if(NOT defined)
      message(FATAL_ERROR "module '${name}' depends on '${dep}', which is not defined before it: "
                          "modules depend only on lower modules (src/CMakeLists.txt lists them in order)")
    endif()
    get_property(dep_closure GLOBAL PROPERTY MIXKV_CLOSURE_${dep})
    list(APPEND closure ${dep_closure})
    target_link_libraries(mixkv_${name} PUBLIC mixkv_${dep})
  endforeach()
  list(REMOVE_DUPLICATES closure)
  define_property(GLOBAL PROPERTY MIXKV_CLOSURE_${name} BRIEF_DOCS "modules ${name} may include"
                  FULL_DOCS "modules ${name} may include")
  set_property(GLOBAL PROPERTY MIXKV_CLOSURE_${name} ${closure})
  set_property(GLOBAL APPEND PROPERTY MIXKV_MODULE_NAMES ${name})
  if(ARG_PUBLIC_LIBS)
    target_link_libraries(mixkv_${name} PUBLIC ${ARG_PUBLIC_LIBS})
  endif()
  if(ARG_PRIVATE_LIBS)
    target_link_libraries(mixkv_${name} PRIVATE ${ARG_PRIVATE_LIBS})
  endif()
  set(MIXKV_MODULES ${MIXKV_MODULES} mixkv_${name} PARENT_SCOPE)
endfunction()

# Adds the target mixkv_layering (part of every build): it runs cmake/check_layering.cmake over
# every module's files, so a lower module that includes a higher one fails the build.
function(mixkv_check_layering)
  get_property(names GLOBAL PROPERTY MIXKV_MODULE_NAMES)
  set(spec "")
  foreach(name IN LISTS names)
    get_property(closure GLOBAL PROPERTY MIXKV_CLOSURE_${name})
    string(REPLACE ";" "," closure "${closure}")
    list(APPEND spec "${name}=${closure}")
  endforeach()
  string(REPLACE ";" " " spec "${spec}")
  set(stamp ${CMAKE_CURRENT_BINARY_DIR}/layering.ok)
  add_custom_target(mixkv_layering ALL
    COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR} "-DMODULES=${spec}"
            -P ${PROJECT_SOURCE_DIR}/cmake/check_layering.cmake
    COMMENT "Checking that every module includes only the modules it depends on"
    VERBATIM)
endfunction()
