#!/usr/bin/env bash
# Who may name which paths (docs/checkpoints.md "Who may name which paths"): a daemon running
# as root, a trainer user in allowed_group, and a checkpoint trusted only when all of it
# verifies. Each probe below once let a local user touch what they could not touch themselves,
# hung the daemon, or loaded wrong state silently; each must now be refused with a message that
# names the file, and nothing outside the user's rights may change owner, mode or content.
#   trust.sh ZEROD ZEROCTL TRAINER   (TRAINER: zd_mesh_trainer, with its --ckpt operations)
# Needs root (it makes a user and a group of its own, and removes them); skips (77) otherwise.
set -uo pipefail
zerod=$1 zeroctl=$2 trainer=$3
for c in setpriv useradd groupadd userdel groupdel python3; do
    if [ "$(id -u)" != 0 ] || ! command -v "$c" >/dev/null; then
        echo "SKIP: needs root and $c (the test makes a user and a group of its own)"
        exit 77
    fi
done
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
zd_workdir trust
chmod 755 "$work"
grp=zdt-g$$ usr=zdt-u$$ other=zdt-o$$
declare -a dpids=()
made_users=0
mounted=
cleanup() {
    zd_kill_all "${dpids[@]}"
    [ -n "$mounted" ] && umount -l "$mounted" 2>/dev/null
    if [ "$made_users" = 1 ]; then
        userdel "$usr" 2>/dev/null
        userdel "$other" 2>/dev/null
        groupdel "$grp" 2>/dev/null
    fi
}
on_fail() { zd_show_logs 30 "$work"/*.log "$work"/*.out; }

groupadd "$grp" || fail "groupadd $grp"
made_users=1
useradd -M -N -g "$grp" -s /usr/sbin/nologin "$usr" || fail "useradd $usr"
useradd -M -N -g nogroup -s /usr/sbin/nologin "$other" || fail "useradd $other"
uid=$(id -u "$usr")

# the build tree may sit where other users cannot enter: a copy of what the user runs
mkdir -p "$work/bin"
cp "$trainer" "$zeroctl" "$work/bin/"
cp -L "$(ldd "$trainer" | awk '/libzc/ { print $3 }')" "$work/bin/"
chmod -R a+rX "$work/bin"
export LD_LIBRARY_PATH=$work/bin
trainer=$work/bin/$(basename "$trainer")
uzeroctl=$work/bin/$(basename "$zeroctl")
zd_token "$work/token"
port=$(zd_free_port)

as_user() { setpriv --reuid="$usr" --regid="$grp" --init-groups -- "$@"; }

# start_daemon I [flags...]: root, the user's group allowed
start_daemon() {
    local i=$1
    shift
    zd_spawn "$work/d$i.out" "$work/d$i.log" "$zerod" --socket "$work/z$i.sock" \
        --device "cpu:$i" --allowed-group "$grp" --token-file "$work/token" --job-linger 60s \
        --heartbeat-interval 300ms "$@"
    dpids[i]=$zd_pid
    zd_wait_ready "${dpids[$i]}" "$work/d$i.out" "daemon $i" || fail "daemon $i exited at start"
}

# train NAME AS JOB [trainer args...]: one rank-0 world-1 trainer as AS (user|root); its output in
# $work/NAME.out
train() {
    local name=$1 who=$2 job=$3
    shift 3
    local pre=()
    [ "$who" = user ] && pre=(setpriv --reuid="$usr" --regid="$grp" --init-groups --)
    "${pre[@]}" env RANK=0 WORLD_SIZE=1 ZEROD_SOCKET="$work/z0.sock" ZEROD_JOB="$job" \
        LD_LIBRARY_PATH="$work/bin" "$trainer" --steps 2 "$@" >"$work/$name.out" 2>&1 </dev/null
}

# expect NAME REGEX WHAT: a line of NAME's output matches
expect() {
    grep -qE -- "$2" "$work/$1.out" || fail "$3: no line matching '$2' in $1.out: $(cat "$work/$1.out")"
}

# fingerprint PATH: owner, mode and content of everything under PATH (no link followed)
fingerprint() {
    find "$1" -printf '%p %u %g %m %s %l\n' | sort
    find "$1" -type f -exec sha256sum {} + | sort
}

start_daemon 0
home=$work/home
mkdir -m 755 "$home"
chown "$usr:$grp" "$home"

# ---- trainer paths: the daemon writes only where the user may --------------------------------
mkdir -m 755 "$work/rootdir" # root's, 0755: the user may read, not write
train rootdir user j-rootdir --ckpt "save:$work/rootdir"
expect rootdir "ckpt save:.*ERR_PERMISSION.*may not .*write into" "save into a root 0755 dir"
[ -z "$(ls -A "$work/rootdir")" ] || fail "files appeared in root's directory: $(ls -A "$work/rootdir")"

as_user mkdir "$home/ck"
mkdir "$home/ck/victimdir" # root's directory, not a checkpoint, in the user's directory
echo precious >"$home/ck/victimdir/precious"
before=$(fingerprint "$home/ck/victimdir")
as_user mkdir "$home/ck/mydata" # the user's own directory, not a checkpoint
as_user sh -c "echo data >'$home/ck/mydata/file'"
mine=$(fingerprint "$home/ck/mydata")
train victimdir user j-victim --ckpt "save:$home/ck:victimdir" --ckpt "save:$home/ck:mydata"
expect victimdir "ckpt save:.*:victimdir: ERR_PERMISSION.*belongs to uid 0" "a tag naming root's dir"
expect victimdir "ckpt save:.*:mydata: ERR_EXISTS.*not a checkpoint zerod wrote" "a tag naming a non-checkpoint dir"
[ "$(fingerprint "$home/ck/victimdir")" = "$before" ] || fail "root's directory changed"
[ "$(fingerprint "$home/ck/mydata")" = "$mine" ] || fail "the user's directory changed"

# root's own checkpoint in the user's directory: the user may not replace it, nor root's latest
as_user mkdir "$home/ck2"
train rootckpt root j-rootckpt --ckpt "save:$home/ck2:rootckpt" --ckpt wait
expect rootckpt "ckpt wait: ok" "root's own save"
before=$(fingerprint "$home/ck2")
train replace user j-replace --ckpt "save:$home/ck2:rootckpt" --ckpt "save:$home/ck2:mine"
expect replace "ckpt save:.*:rootckpt: ERR_PERMISSION.*rootckpt belongs to uid 0" "replacing root's checkpoint"
expect replace "ckpt save:.*:mine: ERR_PERMISSION.*latest belongs to uid 0" "replacing root's latest"
[ "$(fingerprint "$home/ck2")" = "$before" ] || fail "root's checkpoint changed"

# a root-only directory: the user cannot load from it
mkdir -m 700 "$work/secret"
train secret root j-secret --ckpt "save:$work/secret:s" --ckpt wait
expect secret "ckpt wait: ok" "root's save into its 0700 dir"
train secretload user j-secretload --ckpt "load:$work/secret:s"
expect secretload "ckpt load:.*ERR_PERMISSION.*$work/secret" "a load from root's 0700 dir"

# the user's own checkpoint: theirs, 0640 files, 0750 directory
train own user j-own --ckpt "save:$home/ck:good" --ckpt wait --ckpt "load:$home/ck:good"
expect own "ckpt load:$home/ck:good: ok" "the user's own save and load"
got=$(stat -c '%U %a' "$home/ck/good" "$home/ck/good/rank_00000.safetensors" \
    "$home/ck/good/manifest.json" "$home/ck/latest" | sort -u | tr '\n' ' ')
[ "$got" = "$usr 640 $usr 750 " ] || fail "the user's checkpoint is '$got', not theirs with 0640 files and a 0750 directory"
echo "[${SECONDS}s] ok: trainer paths (root 0755 dir, foreign tag, root's checkpoint, root 0700 dir refused; own files 0640)"

# ---- races: a swapped name never makes the daemon touch what the user could not --------------
victim=$work/victim
mkdir -m 700 "$victim"
echo "root's secret" >"$victim/file"
chmod 600 "$victim/file"
before=$(fingerprint "$victim")
train keep user j-race --keep # a kept job for the exports
expect keep "attached" "a job for the exports"
racer() { # NAME...: swap each NAME for a link into root's directory, over and over; sets r
    setpriv --reuid="$usr" --regid="$grp" --init-groups -- timeout 20 python3 - "$victim/file" \
        "$@" >/dev/null 2>&1 <<'EOF' &
import os, shutil, sys
target, names = sys.argv[1], sys.argv[2:]
while True:
    for n in names:
        try:
            if os.path.isdir(n) and not os.path.islink(n):
                os.rename(n, n + ".moved")
                shutil.rmtree(n + ".moved", ignore_errors=True)
            else:
                os.unlink(n)
        except OSError:
            pass
        try:
            os.symlink(target, n)
        except OSError:
            pass
EOF
    r=$! # setpriv execs timeout, which passes a SIGTERM on to the racer
}
racer "$home/out.safetensors.zerod-tmp" "$home/out.safetensors"
exported=0
for _ in $(seq 1 150); do
    as_user "$uzeroctl" -s "$work/z0.sock" export "$home/out.safetensors" >/dev/null 2>&1 &&
        exported=$((exported + 1))
    as_user rm -f "$home/out.safetensors"
done
kill "$r" 2>/dev/null
wait "$r" 2>/dev/null
[ "$(fingerprint "$victim")" = "$before" ] || fail "150 exports with a racer changed root's file"
as_user rm -f "$home/out.safetensors" "$home/out.safetensors.zerod-tmp"
as_user "$uzeroctl" -s "$work/z0.sock" export "$home/out.safetensors" >"$work/export.out" 2>&1 ||
    fail "export after the race: $(cat "$work/export.out")"
got=$(stat -c '%U %a' "$home/out.safetensors")
[ "$got" = "$usr 640" ] || fail "the export is '$got', not the user's 0640"
"$zeroctl" -s "$work/z0.sock" job end --all >/dev/null || fail "ending the kept job"
as_user mkdir "$home/race"
racer "$home/race/.zerod-tmp-t" "$home/race/t" "$home/race/latest"
train race user j-race2 --ckpt "save:$home/race:t" --ckpt wait --ckpt-repeat 60
kill "$r" 2>/dev/null
wait "$r" 2>/dev/null
[ "$(fingerprint "$victim")" = "$before" ] || fail "60 saves with a racer changed root's directory"
saved=$(grep -c "ckpt wait: ok /" "$work/race.out")
echo "[${SECONDS}s] ok: races (150 exports, $exported written; 60 saves, $saved committed; a symlink swapper ran throughout: root's files unchanged)"

# ---- special files: a clear error at once, never a wait --------------------------------------
for kind in zero fifo dir link; do
    cp -a "$home/ck/good" "$home/ck/$kind"
    f=$home/ck/$kind/rank_00000.safetensors
    rm -f "$f"
    case $kind in
    zero) ln -s /dev/zero "$f" ;;
    fifo) mkfifo "$f" ;;
    dir) mkdir "$f" ;;
    link) ln -s "$home/ck/good/rank_00000.safetensors" "$f" ;;
    esac
    chown -h "$usr:$grp" "$f"
    t0=$(date +%s%N)
    timeout 5 "$uzeroctl" checkpoint verify "$home/ck/$kind" >"$work/v-$kind.out" 2>&1 &&
        fail "verify accepted a rank file that is a $kind"
    ms=$((($(date +%s%N) - t0) / 1000000))
    [ "$ms" -lt 1000 ] || fail "verify of a $kind rank file took $ms ms"
    grep -q "rank_00000.safetensors" "$work/v-$kind.out" || fail "verify did not name the file: $(cat "$work/v-$kind.out")"
    train "sp-$kind" user "j-$kind" --ckpt "load:$home/ck:$kind"
    expect "sp-$kind" "ckpt load:.*rank_00000.safetensors.*\(([0-9]{1,3}) ms\)$" "a load of a $kind rank file within a second"
done
kill -0 "${dpids[0]}" || fail "the daemon died on special files"
echo "[${SECONDS}s] ok: special files (/dev/zero, FIFO, directory, link as rank file: named within a second)"

# ---- SIGTERM during a load: a 2 GiB (sparse, not cached: ~2 s) rank file is being verified -----
cp -a "$home/ck/good" "$home/ck/big"
truncate -s 2G "$home/ck/big/rank_00000.safetensors"
python3 - "$home/ck/big/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
for f in m["files"]:
    if f["name"] == "rank_00000.safetensors":
        f["bytes"] = 2 << 30
json.dump(m, open(sys.argv[1], "w"), indent=1)
EOF
as_user "$uzeroctl" checkpoint seal "$home/ck/big" >/dev/null || fail "sealing the big checkpoint"
python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$home/ck/big/rank_00000.safetensors"
train bigload user j-big --ckpt "load:$home/ck:big" &
tp=$!
# the signal comes while the daemon holds the big file open, reading it
reading() { ls -l "/proc/${dpids[0]}/fd" 2>/dev/null | grep -q "ck/big/rank_00000"; }
zd_poll 10 reading || fail "the daemon never opened the big rank file"
t0=$(date +%s%N)
zd_stop "${dpids[0]}" "daemon 0 (SIGTERM during a load)" 5
ms=$((($(date +%s%N) - t0) / 1000000))
wait "$tp"
expect bigload "ckpt load:.*ERR_ABORTED.*stopped, the daemon is shutting down" "a load cut short by SIGTERM"
echo "[${SECONDS}s] ok: SIGTERM during the verify of a 2 GiB rank file: the daemon stopped in $ms ms"
rm -rf "$home/ck/big"
start_daemon 0

# ---- the manifest is verified too -------------------------------------------------------------
edit() { # TAG FIELD VALUE: a copy of good with manifest FIELD (a.b for nested) set to VALUE
    cp -a "$home/ck/good" "$home/ck/$1"
    python3 - "$home/ck/$1/manifest.json" "$2" "$3" <<'EOF'
import json, sys
path, field, value = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
m = json.load(open(path))
o = m
keys = field.split(".")
for k in keys[:-1]:
    o = o[k]
o[keys[-1]] = value
json.dump(m, open(path, "w"), indent=1)
EOF
}
n=0
for fv in 'bucket_size 1' 'step 999' 'elem_align 1' 'dtype "bf16"' 'stage 1' \
    'loss_scaler.cur_scale 1024' 'layout_hash "0123456789abcdef"' 'world 2'; do
    set -- $fv
    n=$((n + 1))
    edit "ed$n" "$1" "$2"
    "$zeroctl" checkpoint verify "$home/ck/ed$n" >"$work/ed$n.out" 2>&1 &&
        fail "verify accepted a manifest with $1 edited to $2"
    grep -q "manifest.json" "$work/ed$n.out" || fail "verify of edited $1: $(cat "$work/ed$n.out")"
    train "led$n" user "j-ed$n" --ckpt "load:$home/ck:ed$n"
    expect "led$n" "ckpt load:.*manifest.json (was changed|.*inconsistent)" "a load with $1 edited"
done
# trainer_state.pt corrupt, then missing: verify and load both refuse
cp -a "$home/ck/good" "$home/ck/ts"
printf 'X' | dd of="$home/ck/ts/trainer_state.pt" bs=1 seek=3 conv=notrunc status=none
for what in corrupt missing; do
    [ "$what" = missing ] && rm -f "$home/ck/ts/trainer_state.pt"
    "$zeroctl" checkpoint verify "$home/ck/ts" >"$work/ts-$what.out" 2>&1 &&
        fail "verify accepted a $what trainer_state.pt"
    grep -q trainer_state.pt "$work/ts-$what.out" || fail "verify: $(cat "$work/ts-$what.out")"
    train "lts-$what" user "j-ts-$what" --ckpt "load:$home/ck:ts"
    expect "lts-$what" "ckpt load:.*trainer_state.pt" "a load with a $what trainer_state.pt"
done
echo "[${SECONDS}s] ok: every manifest field and trainer_state.pt checked by verify and by load"

# ---- a full disk: every rank names ENOSPC at once; the previous checkpoint stays --------------
full=$work/full
mkdir "$full"
if mount -t tmpfs -o size=256k,mode=0755 zd-trust "$full" 2>"$work/mount.err"; then
    mounted=$full
    chown "$usr:$grp" "$full"
    start_daemon 1
    export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
    for r in 0 1; do
        setpriv --reuid="$usr" --regid="$grp" --init-groups -- env RANK=$r WORLD_SIZE=2 \
            ZEROD_SOCKET="$work/z$r.sock" ZEROD_JOB=j-full MASTER_ADDR=$MASTER_ADDR \
            MASTER_PORT=$MASTER_PORT LD_LIBRARY_PATH="$work/bin" "$trainer" --steps 2 \
            --ckpt "save:$full/ck:before" --ckpt wait \
            >"$work/full$r.out" 2>&1 </dev/null &
        eval "fp$r=\$!"
    done
    zd_wait_pid "$fp0" 30 "trainer 0"
    zd_wait_pid "$fp1" 30 "trainer 1"
    expect full0 "ckpt wait: ok" "the save before the disk is full"
    # all but one page: the temporary directory is made, one rank file at most fits, and the
    # writers fail in the background (their reports, not the first phase, carry the cause)
    avail=$(df --output=avail -B 4096 "$full" | tail -n 1)
    as_user dd if=/dev/zero of="$full/filler" bs=4k count=$((avail - 1)) status=none 2>/dev/null
    for r in 0 1; do
        setpriv --reuid="$usr" --regid="$grp" --init-groups -- env RANK=$r WORLD_SIZE=2 \
            ZEROD_SOCKET="$work/z$r.sock" ZEROD_JOB=j-full2 MASTER_ADDR=$MASTER_ADDR \
            MASTER_PORT=$MASTER_PORT LD_LIBRARY_PATH="$work/bin" "$trainer" --steps 2 \
            --ckpt "save:$full/ck:after" --ckpt wait >"$work/fullb$r.out" 2>&1 </dev/null &
        eval "fp$r=\$!"
    done
    zd_wait_pid "$fp0" 30 "trainer 0"
    zd_wait_pid "$fp1" 30 "trainer 1"
    for r in 0 1; do
        grep -E "ckpt (save|wait).*No space left on device.*\(([0-9]+) ms\)$" "$work/fullb$r.out" |
            grep -qE "\(([0-9]{1,3}|[1-4][0-9]{3}) ms\)$" ||
            fail "rank $r did not name ENOSPC within 5 s: $(cat "$work/fullb$r.out")"
    done
    "$zeroctl" checkpoint verify "$full/ck/before" >/dev/null || fail "the checkpoint before the full disk does not verify"
    [ "$(cat "$full/ck/latest")" = before ] || fail "latest moved: $(cat "$full/ck/latest")"
    zd_stop "${dpids[1]}" "daemon 1" 5
    unset 'dpids[1]'
    umount "$full" && mounted=
    took=$(grep -hoE "No space left on device.*\(([0-9]+) ms\)$" "$work"/fullb[01].out |
        grep -oE "[0-9]+ ms" | tr '\n' ' ')
    echo "[${SECONDS}s] ok: a full disk: both ranks named ENOSPC (calls of $took); 'before' still verifies"
else
    echo "SKIP part: cannot mount a tmpfs here ($(cat "$work/mount.err")): no full-disk probe"
fi

zd_stop "${dpids[0]}" "daemon 0" 5
dpids=()
echo "PASS: trust model held for every probe"
