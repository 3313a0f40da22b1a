# Sanitizer builds: ZEROD_SANITIZE=address,undefined (either or both) or ZEROD_SANITIZE=thread.
#
# Compiles every C and C++ target with -fsanitize=<list> and sets the runtime options of every
# process a test starts (the test's environment, inherited by the daemons, trainers and tools
# it runs; zs_sanitize_test() below):
#   ASan     halt_on_error=1, detect_leaks=1 (suppressions only in the Python tests, below)
#   UBSan    halt_on_error=1, print_stacktrace=1 (and -fno-sanitize-recover: UB always aborts)
#   TSan     halt_on_error=1; UCX's memory hooks off (they crash under TSan's interceptors);
#            zerod's suppressions are built in (daemon/src/tsan_suppressions.c)
# A report aborts the process, which fails the test that started it.
# Tests labelled `python` run an uninstrumented interpreter that loads libzc.so: under ASan they
# get the runtimes in LD_PRELOAD (`${CMAKE_C_COMPILER} -print-file-name=libasan.so`), so that
# the runtime is the first library of the process. Under TSan, see tests/CMakeLists.txt.
#
# Outputs: ZEROD_SANITIZE (normalized list), ZEROD_SANITIZE_THREAD (ON for thread).

set(_zd_san_given "${ZEROD_SANITIZE}")
string(REPLACE "," ";" ZEROD_SANITIZE "${ZEROD_SANITIZE}")
list(REMOVE_DUPLICATES ZEROD_SANITIZE)
set(ZEROD_SANITIZE_THREAD OFF)
set(_zd_san_libs)
foreach(_san IN LISTS ZEROD_SANITIZE)
    if(_san STREQUAL "address")
        list(APPEND _zd_san_libs libasan.so)
    elseif(_san STREQUAL "undefined")
        list(APPEND _zd_san_libs libubsan.so)
    elseif(_san STREQUAL "thread")
        list(APPEND _zd_san_libs libtsan.so)
        set(ZEROD_SANITIZE_THREAD ON)
    else()
        message(FATAL_ERROR "ZEROD_SANITIZE: unknown sanitizer '${_san}' in '${_zd_san_given}' "
                            "(use address,undefined or thread)")
    endif()
endforeach()
if(ZEROD_SANITIZE_THREAD AND NOT ZEROD_SANITIZE STREQUAL "thread")
    message(FATAL_ERROR "ZEROD_SANITIZE: 'thread' cannot be combined with other sanitizers "
                        "(got '${_zd_san_given}'); build it in its own build tree")
endif()

if(ZEROD_SANITIZE)
    list(JOIN ZEROD_SANITIZE "," _zd_san_flag)
    set(_zd_san_c_cxx $<OR:$<COMPILE_LANGUAGE:C>,$<COMPILE_LANGUAGE:CXX>>)
    add_compile_options($<${_zd_san_c_cxx}:-fsanitize=${_zd_san_flag}>
                        $<${_zd_san_c_cxx}:-fno-sanitize-recover=all>
                        $<${_zd_san_c_cxx}:-fno-omit-frame-pointer>)
    add_link_options(-fsanitize=${_zd_san_flag})

    # the runtimes an uninstrumented interpreter must preload (address before undefined)
    set(ZEROD_SANITIZE_PRELOAD)
    foreach(_lib IN LISTS _zd_san_libs)
        execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=${_lib}
                        OUTPUT_VARIABLE _path OUTPUT_STRIP_TRAILING_WHITESPACE)
        if(NOT IS_ABSOLUTE "${_path}" OR NOT EXISTS "${_path}")
            message(FATAL_ERROR "ZEROD_SANITIZE=${_zd_san_flag}: ${CMAKE_C_COMPILER} has no "
                                "${_lib} (Debian: the compiler's libasan/libubsan/libtsan package)")
        endif()
        list(APPEND ZEROD_SANITIZE_PRELOAD ${_path})
    endforeach()
    list(JOIN ZEROD_SANITIZE_PRELOAD ":" ZEROD_SANITIZE_PRELOAD)
endif()

set(_zd_supp ${PROJECT_SOURCE_DIR}/tests/sanitize)
# abort_on_error=1: a report ends the process with SIGABRT, not exit(1). A Criterion worker's
# exit status after its test is ignored (the leak check runs at exit), its crash is not.
# Only the options of the sanitizers built in: a script can tell which build it runs in.
set(ZEROD_SANITIZE_ENV)
if("address" IN_LIST ZEROD_SANITIZE)
    list(APPEND ZEROD_SANITIZE_ENV "ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=1")
endif()
if("undefined" IN_LIST ZEROD_SANITIZE)
    list(APPEND ZEROD_SANITIZE_ENV "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:abort_on_error=1")
endif()
if(ZEROD_SANITIZE_THREAD)
    list(APPEND ZEROD_SANITIZE_ENV "TSAN_OPTIONS=halt_on_error=1:abort_on_error=1:second_deadlock_stack=1")
    # UCX 1.13 patches malloc/mmap/madvise (ucm) to invalidate its registration cache; under
    # TSan a thread's exit crashes in it (glibc madvises the dead thread's stack, ucm_madvise
    # takes a lock TSan intercepts after TSan tore the thread down). Host memory on one
    # machine needs no hooks; `ucx_info -c` shows the values UCX took.
    list(APPEND ZEROD_SANITIZE_ENV UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none
         UCX_MEM_EVENTS=no)
endif()

# zs_sanitize_test(TEST...): add the sanitizer environment to these tests of the current
# directory (once; LD_PRELOAD too for tests labelled `python`). zs_sanitize_tests(): to every
# test declared so far in the current directory. CMake 3.25 sets test properties only from the
# directory that declared the test, so each CMakeLists.txt that calls add_test() ends with
# zs_sanitize_tests().
function(zs_sanitize_test)
    if(NOT ZEROD_SANITIZE)
        return()
    endif()
    foreach(_t IN LISTS ARGN)
        get_property(_env TEST ${_t} PROPERTY ENVIRONMENT)
        if("${_env}" MATCHES "SAN_OPTIONS=")
            continue()
        endif()
        set_property(TEST ${_t} APPEND PROPERTY ENVIRONMENT ${ZEROD_SANITIZE_ENV})
        get_property(_labels TEST ${_t} PROPERTY LABELS)
        if("python" IN_LIST _labels AND NOT ZEROD_SANITIZE_THREAD)
            # An interpreter leaks at exit by design (CPython, torch and numpy do not free
            # their caches), and a leak suppression matches any frame of the recorded stack,
            # which in a Python process always has python3.11 at the bottom. So record only 3
            # frames: a leak is suppressed when Python's, torch's or numpy's own code called the
            # allocator (lsan-python.supp); one that libzc allocated is in libzc at #1 and libzc
            # or libffi at #2, and is reported. use_tls=0: gcc 12's LSan reads a bogus dynamic
            # TLS range of one of torch's threads and dies ("Tracer caught signal 11"); not
            # scanning TLS can only add reports (a block reachable from TLS alone), never hide
            # one. The daemons such a test starts inherit these options; they run with full
            # stacks and TLS scanning in every other test.
            set_property(TEST ${_t} APPEND PROPERTY ENVIRONMENT
                         "LD_PRELOAD=${ZEROD_SANITIZE_PRELOAD}"
                         "LSAN_OPTIONS=suppressions=${_zd_supp}/lsan-python.supp:malloc_context_size=3:use_tls=0:print_suppressions=0")
        endif()
    endforeach()
endfunction()

function(zs_sanitize_tests)
    get_property(_tests DIRECTORY PROPERTY TESTS)
    zs_sanitize_test(${_tests})
endfunction()
