#!/usr/bin/env bash
# The generated man pages (deploy/gen_man.c) render without a roff warning, and say everything
# the programs say: every option of each --help, every key of zerod --print-config, and the
# same "NAME VERSION" from each --version.
#   man_pages.sh MAN_DIR ZEROD ZEROCTL ZERORUN
set -euo pipefail
man_dir=$1 zerod=$2 zeroctl=$3 zerorun=$4
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
zd_workdir man_pages

if command -v man >/dev/null; then
    render() { LC_ALL=C MANWIDTH=120 man -l "$1" 2>"$work/render.err" | col -bx; }
    how="man -l"
elif command -v groff >/dev/null; then
    render() { LC_ALL=C groff -man -Tascii -rLL=120n "$1" 2>"$work/render.err" | col -bx; }
    how="groff -man -Tascii"
else
    echo "SKIP: neither man nor groff is installed: cannot render the pages"
    exit 77
fi

# check PAGE: renders, has its sections, and (groff at hand) no roff warning
check() {
    local page=$1
    [ -s "$page" ] || fail "$page: missing or empty"
    render "$page" >"$work/page.txt" || fail "$how $page failed: $(cat "$work/render.err")"
    [ ! -s "$work/render.err" ] || fail "$how $page: $(cat "$work/render.err")"
    for s in NAME SYNOPSIS DESCRIPTION "SEE ALSO"; do
        grep -q "^$s" "$work/page.txt" || fail "$page has no $s section"
    done
    if command -v groff >/dev/null; then
        groff -man -ww -z "$page" 2>"$work/groff.err" || true
        [ ! -s "$work/groff.err" ] || fail "$page: groff warns: $(cat "$work/groff.err")"
    fi
}

# options PROG: every -x and --long-option of PROG --help
options() {
    "$1" --help | grep -oE -- '(^|[ ,[])--?[a-zA-Z][a-zA-Z0-9-]*' | grep -oE -- '--?[a-zA-Z].*' |
        sort -u
}

for p in "zerod:8:$zerod" "zeroctl:1:$zeroctl" "zerorun:1:$zerorun"; do
    name=${p%%:*} rest=${p#*:}
    section=${rest%%:*} prog=${rest#*:}
    page="$man_dir/$name.$section"
    check "$page"
    n=0
    while read -r opt; do
        grep -qF -- "$opt" "$work/page.txt" || fail "$name($section) lacks $opt of '$name --help'"
        n=$((n + 1))
    done < <(options "$prog")
    [ "$n" -ge 3 ] || fail "found only $n options in '$name --help'"
    version=$("$prog" --version)
    [[ $version =~ ^$name\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "$name --version says '$version'"
    grep -qE "^ *$name - " "$work/page.txt" || fail "$name($section) has no NAME line '$name - ...'"
    echo "$name($section): $n options, $version"
done

# all three tell the same version
v=$("$zerod" --version | cut -d' ' -f2)
if [ "$("$zeroctl" --version)" != "zeroctl $v" ] || [ "$("$zerorun" --version)" != "zerorun $v" ]
then
    fail "zerod, zeroctl and zerorun --version disagree"
fi

check "$man_dir/zerod.conf.5"
n=0
while read -r key; do
    grep -qE "^ +$key = " "$work/page.txt" || fail "zerod.conf(5) lacks the key $key"
    n=$((n + 1))
done < <(env -u ZEROD_CONFIG "$zerod" --config /dev/null --print-config |
    sed -n 's/^\([a-z_][a-z0-9_]*\) *=.*/\1/p')
[ "$n" -ge 10 ] || fail "found only $n keys in zerod --print-config"
echo "zerod.conf(5): $n keys (rendered by $how)"
