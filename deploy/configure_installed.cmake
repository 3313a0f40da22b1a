# Run by `cmake --install` (deploy/CMakeLists.txt, zd_install_configured): configures ZD_SRC into
# ZD_OUT with the paths of this install -- CMAKE_INSTALL_PREFIX is --prefix's here, not the
# configure-time one. ZD_<DIR>_REL are the GNUInstallDirs values (relative or absolute).
set(ZD_PREFIX "${CMAKE_INSTALL_PREFIX}")
foreach(_d BINDIR LIBDIR INCLUDEDIR DOCDIR)
    if(IS_ABSOLUTE "${ZD_${_d}_REL}")
        set(ZD_${_d} "${ZD_${_d}_REL}")
        set(ZD_PC_${_d} "${ZD_${_d}_REL}")
    else()
        set(ZD_${_d} "${ZD_PREFIX}/${ZD_${_d}_REL}")
        set(ZD_PC_${_d} "\${prefix}/${ZD_${_d}_REL}") # zerod.pc: relative to its prefix
    endif()
endforeach()
configure_file("${ZD_SRC}" "${ZD_OUT}" @ONLY)
