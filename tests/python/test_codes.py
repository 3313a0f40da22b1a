#!/usr/bin/env python3
"""The zerod package's codes (zerod/_codes.py, generated from common's tables) against the libzc
it loads: needs neither torch nor a daemon.

  - every status the package knows has that value's name in libzc (zc_status_name), and its
    ZC_<NAME> constant has that value;
  - a value outside the table is "UNKNOWN" to libzc;
  - every dtype the package knows has that size in libzc (zc_dtype_size), and the package's
    DTYPE_* names are those codes.

The build already checks _codes.py against the tables (client/check_codes.cmake); this catches a
package installed beside a libzc of another version.
"""
import sys

import zerod
from zerod import _codes


def check_status(lib):
    for value, (name, _text) in sorted(_codes.STATUS.items()):
        got = lib.zc_status_name(value).decode()
        assert got == name, "libzc names %d %s, the package %s" % (value, got, name)
        assert getattr(_codes, "ZC_" + name) == value, "ZC_%s is not %d" % (name, value)
    unknown = min(_codes.STATUS) - 1
    assert lib.zc_status_name(unknown).decode() == "UNKNOWN"


def check_dtype(lib):
    for value, (name, size) in sorted(_codes.DTYPE.items()):
        got = lib.zc_dtype_size(value)
        assert got == size, "libzc says %s (%d) has %d bytes, the package %d" % (
            name, value, got, size)
    assert (zerod.DTYPE_F32, zerod.DTYPE_F16, zerod.DTYPE_BF16) == (
        _codes.DTYPE_F32, _codes.DTYPE_F16, _codes.DTYPE_BF16)
    assert lib.zc_dtype_size(max(_codes.DTYPE) + 1) == 0


def main():
    lib = zerod.load_libzc()
    check_status(lib)
    check_dtype(lib)
    print("ok: %d statuses and %d dtypes agree with %s"
          % (len(_codes.STATUS), len(_codes.DTYPE), zerod.libzc_path()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
