#!/usr/bin/env bash
# `cmake --install --prefix X` of a build: every file where it belongs, each naming X (not the
# configure-time prefix): the unit's ExecStart, zerod.pc's prefix; the unit passes
# `systemd-analyze verify` and rates <= 2.0 in `systemd-analyze security --offline=yes`, with
# and without the CUDA drop-in; sysusers.d and tmpfiles.d entries apply (to a scratch root).
# Checks that need a tool or root this machine lacks print "skipped: <why>" and pass.
#   install.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
zd_workdir install
prefix=$work/prefix # /tmp/zd-install-XXXXXX/prefix: nothing like the configure-time prefix
zd_outdir=$work
on_fail() {
    zd_show_logs 40 "$work/out" "$work/err"
}

zd_expect_rc 0 cmake --install "$build" --prefix "$prefix"

libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$build/CMakeCache.txt")
libdir=${libdir:-lib}
unit=$prefix/lib/systemd/system/zerod@.service
for f in bin/zerod bin/zeroctl bin/zerorun include/zerod/zc.h "$libdir/libzc.so" \
    "$libdir/pkgconfig/zerod.pc" lib/systemd/system/zerod@.service lib/sysusers.d/zerod.conf \
    lib/tmpfiles.d/zerod.conf share/doc/zerod/zerod.conf.example share/doc/zerod/zerod-cuda.conf \
    share/doc/zerod/README.md share/doc/zerod/LICENSE share/man/man8/zerod.8 \
    share/man/man1/zeroctl.1 share/man/man1/zerorun.1 share/man/man5/zerod.conf.5 \
    share/bash-completion/completions/zerod share/bash-completion/completions/zeroctl \
    share/bash-completion/completions/zerorun; do
    [ -s "$prefix/$f" ] || fail "not installed: $f"
done
grep -q 'Apache License' "$prefix/share/doc/zerod/LICENSE" || fail "LICENSE is not Apache-2.0"

# the install prefix, not the configure-time one
grep -qx "ExecStart=$prefix/bin/zerod --device %i" "$unit" ||
    fail "ExecStart does not name $prefix/bin/zerod: $(grep ExecStart "$unit")"
if grep -n '@[A-Z_]*@' "$unit" "$prefix/$libdir/pkgconfig/zerod.pc"; then
    fail "unreplaced @VARIABLES@ in the installed files"
fi
got=$(PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig" pkg-config --variable=prefix zerod)
[ "$got" = "$prefix" ] || fail "pkg-config --variable=prefix zerod says '$got', not $prefix"
PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig" pkg-config --libs --cflags zerod >"$work/pc" 2>&1
if ! grep -q -- "-L$prefix/$libdir" "$work/pc" || ! grep -q -- "-I$prefix/include" "$work/pc"; then
    fail "zerod.pc's flags do not point into $prefix: $(cat "$work/pc")"
fi

# the installed programs run and agree on the version
v=$("$prefix/bin/zerod" --version)
if [ "$("$prefix/bin/zeroctl" --version)" != "zeroctl ${v#zerod }" ] ||
    [ "$("$prefix/bin/zerorun" --version)" != "zerorun ${v#zerod }" ]; then
    fail "the installed programs' --version disagree with '$v'"
fi

# the completion file loads and completes all three
bash -c ". '$prefix/share/bash-completion/completions/zeroctl' && complete -p zerod zeroctl \
    zerorun" >"$work/out" 2>&1 || fail "the bash completion does not load: $(cat "$work/out")"
bash -c ". '$prefix/share/bash-completion/completions/zeroctl'
    PATH='$prefix/bin':\$PATH COMP_WORDS=(zeroctl --j) COMP_CWORD=1; _zeroctl
    printf '%s\n' \"\${COMPREPLY[@]}\"" >"$work/out" 2>&1
grep -qx -- --json "$work/out" || fail "zeroctl --j does not complete to --json: $(cat "$work/out")"

# systemd-analyze, when it can run here (it needs no running systemd for these)
if ! command -v systemd-analyze >/dev/null; then
    echo "skipped: systemd-analyze verify and security (systemd-analyze not installed)"
    exit 0
fi
printf '[Service]\nExecStart=/bin/true\n' >"$work/probe.service"
if ! systemd-analyze verify --man=no "$work/probe.service" >"$work/out" 2>&1; then
    echo "skipped: systemd-analyze verify and security (it cannot run here:" \
        "$(head -n 1 "$work/out"))"
    exit 0
fi
# with the installed man pages in MANPATH, Documentation=man:... is checked too
MANPATH="$prefix/share/man" zd_expect_rc 0 systemd-analyze verify --man=yes "$unit"
[ ! -s "$work/err" ] || fail "systemd-analyze verify: $(cat "$work/err")"
mkdir -p "$work/cuda/zerod@.service.d"
cp "$unit" "$work/cuda/"
cp "$prefix/share/doc/zerod/zerod-cuda.conf" "$work/cuda/zerod@.service.d/cuda.conf"
zd_expect_rc 0 systemd-analyze verify --man=no "$work/cuda/zerod@.service"
[ ! -s "$work/err" ] || fail "systemd-analyze verify with the CUDA drop-in: $(cat "$work/err")"

# exposure SCORE of a unit file (the CUDA drop-in merged into a copy: --offline reads one file)
exposure() {
    systemd-analyze security --offline=yes --no-pager "$1" 2>&1 |
        sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p'
}
mkdir -p "$work/cuda-merged"
awk -v dropin="$work/cuda/zerod@.service.d/cuda.conf" '
    /^\[Install\]/ { while ((getline l < dropin) > 0) if (l !~ /^\[Service\]/) print l }
    { print }' "$unit" >"$work/cuda-merged/zerod@.service"
for u in "$unit" "$work/cuda-merged/zerod@.service"; do
    score=$(exposure "$u")
    if [ -z "$score" ]; then
        echo "skipped: systemd-analyze security --offline=yes $u printed no score" \
            "(offline review unsupported by this systemd?)"
        continue
    fi
    awk -v s="$score" 'BEGIN { exit !(s <= 2.0) }' ||
        fail "systemd-analyze security rates $u $score, above 2.0"
    echo "systemd-analyze security --offline=yes $u: $score"
done

# the sysusers and tmpfiles entries, applied to a scratch root
if command -v systemd-sysusers >/dev/null; then
    mkdir -p "$work/root/etc"
    zd_expect_rc 0 systemd-sysusers --root="$work/root" "$prefix/lib/sysusers.d/zerod.conf"
    if ! grep -q '^zerod:' "$work/root/etc/passwd" || ! grep -q '^zerod:' "$work/root/etc/group"
    then
        fail "systemd-sysusers made no user and group zerod"
    fi
    if [ "$(id -u)" = 0 ] && command -v systemd-tmpfiles >/dev/null; then
        zd_expect_rc 0 systemd-tmpfiles --root="$work/root" --create \
            "$prefix/lib/tmpfiles.d/zerod.conf"
        for d in run/zerod var/lib/zerod var/lib/zerod/checkpoints; do
            [ -d "$work/root/$d" ] || fail "systemd-tmpfiles did not make /$d"
        done
    else
        echo "skipped: systemd-tmpfiles --create (needs root to chown, or is missing)"
    fi
else
    echo "skipped: systemd-sysusers (not installed)"
fi
echo "install: OK ($prefix)"
