# ONNX Runtime (onnxruntime-node, installed into tests/ort/node_modules by scripts/setup.sh)
# as a test client. Included by tests/CMakeLists.txt before the test folders, so any of them
# can register a test with
#   qt_add_ort_test(NAME COMMAND cmd args... [LABELS l...] [ENVIRONMENT VAR=value...] [DEPENDS t...])
# The command runs through tests/ort/ort_test.sh: the test SKIPs (exit 77, with a message) only
# when node is absent, and FAILs when node is present but node_modules is not installed from
# tests/ort/package-lock.json. The command sees QT_NODE (the node binary), QT_ORT_RUN
# (tests/ort/ort_run.js), QT_SOURCE_DIR; tests/ort/ortlib.py wraps the runner for Python.
find_program(QT_NODE node)
set(QT_ORT_DIR ${CMAKE_SOURCE_DIR}/tests/ort)
if(NOT QT_NODE)
  message(STATUS "ONNX Runtime tests: node not found; they will be skipped (scripts/setup.sh installs Node.js)")
elseif(NOT EXISTS ${QT_ORT_DIR}/node_modules/onnxruntime-node/package.json)
  message(STATUS "ONNX Runtime tests: node ${QT_NODE}, onnxruntime-node not installed in "
                 "${QT_ORT_DIR}/node_modules: they will fail until scripts/setup.sh installs it")
else()
  file(STRINGS ${QT_ORT_DIR}/node_modules/onnxruntime-node/package.json QT_ORT_VERSION
       REGEX "^  \"version\": ")
  string(REGEX REPLACE ".*\"version\": \"([^\"]*)\".*" "\\1" QT_ORT_VERSION "${QT_ORT_VERSION}")
  message(STATUS "ONNX Runtime tests: node ${QT_NODE}, onnxruntime-node ${QT_ORT_VERSION}")
endif()

function(qt_add_ort_test name)
  cmake_parse_arguments(T "" "" "COMMAND;LABELS;ENVIRONMENT;DEPENDS" ${ARGN})
  if(NOT T_COMMAND)
    message(FATAL_ERROR "qt_add_ort_test(${name}): COMMAND is required")
  endif()
  add_test(NAME ${name} COMMAND sh ${QT_ORT_DIR}/ort_test.sh "${QT_NODE}" -- ${T_COMMAND}
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set(env QT_SOURCE_DIR=${CMAKE_SOURCE_DIR} QT_ORT_RUN=${QT_ORT_DIR}/ort_run.js OMP_NUM_THREADS=2
      OMP_WAIT_POLICY=PASSIVE ${T_ENVIRONMENT})
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 LABELS "ort;${T_LABELS}"
                       ENVIRONMENT "${env}")
  if(T_DEPENDS)
    set_tests_properties(${name} PROPERTIES DEPENDS "${T_DEPENDS}")
  endif()
endfunction()
