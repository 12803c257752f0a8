# ONNX Runtime and the current onnx (the test environment: .venv, which scripts/setup.sh makes
# from tests/requirements.txt) as test clients. Included by tests/CMakeLists.txt before the test
# folders, so any of them can register a test with
#   qt_add_ort_test(NAME COMMAND cmd args... [LABELS l...] [ENVIRONMENT VAR=value...] [DEPENDS t...])
# In COMMAND, QT_TEST_PYTHON names the environment's interpreter. The command runs through
# tests/ort/ort_test.sh, which FAILs (never skips) when that interpreter is missing or holds
# other versions than tests/requirements.txt pins. The command sees QT_PYTHON (the interpreter),
# QT_ORT_RUN (tests/ort/ort_run.py), QT_SOURCE_DIR; tests/ort/ortlib.py wraps ORT for Python.
set(QT_TEST_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python CACHE FILEPATH
    "The test environment's Python (ONNX Runtime, onnx, numpy, h5py; scripts/setup.sh makes it)")
set(QT_ORT_DIR ${CMAKE_SOURCE_DIR}/tests/ort)
if(EXISTS ${QT_TEST_PYTHON})
  message(STATUS "ONNX Runtime tests: ${QT_TEST_PYTHON}")
else()
  message(STATUS "ONNX Runtime tests: ${QT_TEST_PYTHON} does not exist: they will fail until "
                 "scripts/setup.sh makes the test environment")
endif()

function(qt_add_ort_test name)
  cmake_parse_arguments(T "" "" "COMMAND;LABELS;ENVIRONMENT;DEPENDS" ${ARGN})
  if(NOT T_COMMAND)
    message(FATAL_ERROR "qt_add_ort_test(${name}): COMMAND is required")
  endif()
  add_test(NAME ${name} COMMAND sh ${QT_ORT_DIR}/ort_test.sh "${QT_TEST_PYTHON}" -- ${T_COMMAND}
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set(env QT_SOURCE_DIR=${CMAKE_SOURCE_DIR} QT_ORT_RUN=${QT_ORT_DIR}/ort_run.py OMP_NUM_THREADS=2
      OMP_WAIT_POLICY=PASSIVE ${T_ENVIRONMENT})
  set_tests_properties(${name} PROPERTIES LABELS "ort;${T_LABELS}" ENVIRONMENT "${env}")
  if(T_DEPENDS)
    set_tests_properties(${name} PROPERTIES DEPENDS "${T_DEPENDS}")
  endif()
endfunction()
