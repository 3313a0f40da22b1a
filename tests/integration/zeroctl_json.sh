#!/usr/bin/env bash
# zeroctl --json is the stable interface for scripts: it parses, has
# schema_version 1, and its numbers agree with train_mlp's layout; exit codes 0/1/2/7.
#   zeroctl_json.sh ZEROD TRAIN_MLP ZEROCTL RUNDIR
set -euo pipefail
zerod=$1 train=$2 zeroctl=$3 rundir=$4
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
py=/usr/bin/python3
export ZEROD_SOCKET="$rundir/zerod.sock"

zd_outdir=$rundir # zd_expect_rc's out and err
on_fail() {
    zd_show_logs +1 "$rundir/out" "$rundir/err"
}

zd_ctl_start "$zerod" "$rundir" --job-linger 30s --max-shard-bytes 256MiB

# usage errors: 2, with a message on stderr naming the problem
zd_expect_rc 2 "$zeroctl" --json frobnicate
grep -q "unknown command 'frobnicate'" "$rundir/err" || fail "no message for a bad command"
zd_expect_rc 2 "$zeroctl" --json
zd_expect_rc 2 "$zeroctl" --timeout 0 status
# unreachable: 7
zd_expect_rc 7 "$zeroctl" --json -s "$rundir/nothing-here.sock" status
zd_expect_rc 7 "$zeroctl" --json -s /nonexistent-dir/zerod.sock shard

# no job yet: status says so, shard is a daemon error (1)
zd_expect_rc 0 "$zeroctl" --json status
"$py" -c '
import json, os, sys
s = json.load(open(sys.argv[1]))
assert s["schema_version"] == 1, s
assert s["command"] == "status", s
assert s["has_job"] is False and s["job"] is None, s
assert s["memory"] == [], s
# sanitizer allocators answer mallinfo2 with zeros: 0 means "cannot say"
sanitized = os.environ.get("ASAN_OPTIONS") or os.environ.get("TSAN_OPTIONS")
assert isinstance(s["heap_in_use_bytes"], int), s
assert s["heap_in_use_bytes"] > 0 or sanitized, s
' "$rundir/out" || fail "status --json without a job"
zd_expect_rc 1 "$zeroctl" --json shard
grep -q "no job on this daemon" "$rundir/err" || fail "shard without a job: no message"

# a job left behind by --keep, 3 steps done
ZEROD_JOB=ctl_json "$train" --steps 3 --keep >"$rundir/train.out" 2>&1 ||
    { cat "$rundir/train.out"; fail "train_mlp failed"; }
cat "$rundir/train.out"
elements=$(sed -n 's/.* \([0-9][0-9]*\) elements, step 0$/\1/p' "$rundir/train.out")
[ -n "$elements" ] || fail "train_mlp did not print its element count"

zd_expect_rc 0 "$zeroctl" --json status
cp "$rundir/out" "$rundir/status.json"
zd_expect_rc 0 "$zeroctl" --json shard
cp "$rundir/out" "$rundir/shard.json"

"$py" - "$rundir/status.json" "$rundir/shard.json" "$elements" <<'EOF'
import json, math, re, sys

st = json.load(open(sys.argv[1]))
sh = json.load(open(sys.argv[2]))
elements = int(sys.argv[3])

def check(cond, what):
    if not cond:
        print("mismatch: " + what, file=sys.stderr)
        sys.exit(1)

# train_mlp: b2 4 + W2 128 + b1 32 + W1 512 = 676, laid out at 0, 16, 144, 176 (aligned to 16):
# 688 elements cut into buckets of 256 (W1 split): 3 buckets, of 256, 256 and 176
PSI = 4 + 4 * 32 + 32 + 32 * 16
check(PSI == 676, "Ψ")
for d, cmd in ((st, "status"), (sh, "shard")):
    check(d["schema_version"] == 1, cmd + " schema_version")
    check(d["command"] == cmd, cmd + " command")

job = st["job"]
check(st["has_job"] is True, "has_job")
check(job["id"] == "ctl_json", "job id")
check(job["step"] == 3, "job step %r" % job["step"])
check(job["skipped_steps"] == 0, "skipped_steps")
check(job["stage"] == 2 and job["dtype"] == "fp32", "stage/dtype")
check(job["rank"] == 0 and job["world"] == 1, "rank/world")
check(job["trainer_attached"] is False, "trainer_attached after --keep")
check(job["param_numel"] == PSI, "status param_numel %r" % job["param_numel"])
check(re.fullmatch(r"0x[0-9a-f]{16}", job["layout_hash"]) is not None, "layout_hash format")
check(job["layout_hash"] == sh["layout_hash"], "layout_hash status vs shard")
check(job["grad_norm"] > 0 and job["loss_scale"] == 1, "grad_norm / loss_scale")
check(job["collectives"] == "local (world 1)", "collectives %r" % job["collectives"])

check(sh["job_id"] == "ctl_json" and sh["rank"] == 0 and sh["world"] == 1, "shard job")
check(sh["param_numel"] == PSI, "shard param_numel")
check(sh["total_numel"] == elements == 688, "total_numel %r vs train_mlp %r" % (sh["total_numel"], elements))
check(sh["shard_numel"] * sh["world"] == sh["total_numel"], "shard_numel x world = total_numel")
check(sh["n_buckets"] == 3 and sh["max_bucket_numel"] == 256, "buckets")
check(sh["bucket_size"] == 256, "bucket_size")
check(math.isfinite(sh["master_sumsq"]) and sh["master_sumsq"] > 0, "master_sumsq")

# groups: contiguous ranges that cover the flat vector and the shard
flat = shard = 0
for i, g in enumerate(sh["groups"]):
    check(g["group"] == i, "group index")
    check(g["flat_offset"] == flat and g["shard_offset"] == shard, "group %d not contiguous" % i)
    flat += g["flat_numel"]
    shard += g["shard_numel"]
check(len(sh["groups"]) == 1 and sh["groups"][0]["n_params"] == 4, "one group of 4 params")
check(sh["groups"][0]["n_buckets"] == sh["n_buckets"], "group buckets")
check(abs(sh["groups"][0]["lr"] - 0.01) < 1e-12, "group lr")
check(flat == sh["total_numel"], "groups cover total_numel")
check(shard == sh["shard_numel"], "groups cover shard_numel")

# memory terms: measured bytes against the layout, formulas of docs/semantics.md §1
mem = {t["name"]: t for t in st["memory"]}
check(set(mem) == {"params", "slots", "grads", "master", "m", "v", "accumulator"}, "memory names")
for name in ("m", "v", "accumulator"):
    check(mem[name]["bytes"] == 4 * sh["shard_numel"], name + " bytes = 4 x shard_numel")
    check(mem[name]["formula_bytes"] == 4 * PSI // sh["world"], name + " formula 4Ψ/N")
# fp32: the master is this rank's slices of the params region, no bytes of its own
check(mem["master"]["bytes"] == 0 and mem["master"]["formula_bytes"] == 0, "fp32 master shared")
check("params region" in mem["master"]["formula"], "the master's formula says where it is")
check(mem["params"]["bytes"] == 4 * sh["total_numel"], "params bytes = 4 x total_numel")
check(mem["params"]["formula_bytes"] == 4 * PSI, "params formula 4Ψ")
check(mem["grads"]["bytes"] == 0, "stage 2 has no grads region")
check(mem["slots"]["bytes"] % (4 * sh["max_bucket_numel"]) == 0 and mem["slots"]["bytes"] > 0,
      "slots = n x largest bucket")
print("zeroctl --json: status and shard agree with the layout (Ψ = %d, shard %d)"
      % (PSI, sh["shard_numel"]))
EOF

# the human table is there too, with units in the header
zd_expect_rc 0 "$zeroctl" status
grep -q 'MEASURED (B)' "$rundir/out" || fail "status table has no units"

# the job's resolved training config, each value with its source
zd_expect_rc 0 "$zeroctl" --json config
"$py" -c '
import json, sys
c = json.load(open(sys.argv[1]))
assert c["command"] == "config" and c["job_id"] == "ctl_json", c
keys = {k["key"]: k for k in c["keys"]}
assert keys["zero_optimization.stage"]["source"] in ("config", "default"), keys
assert keys["gradient_accumulation_steps"]["value"] >= 1, keys
assert all(k["source"] in ("config", "default", "derived") for k in c["keys"]), c
' "$rundir/out" || fail "config --json"
zd_expect_rc 0 "$zeroctl" config
grep -q '^optimizer.params.lr  *[0-9.e-]*  *\(config\|default\)$' "$rundir/out" ||
    fail "config table lacks optimizer.params.lr"

zd_ctl_stop
echo "PASS"
