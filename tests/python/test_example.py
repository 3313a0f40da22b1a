#!/usr/bin/env python3
"""examples/train_torch.py trains through a real zerod: it runs to the end (fp32 stage 2, and
bf16 stage 1 with accumulation), prints one line per optimizer step, and its loss falls (the
final eval loss is below a third of the first step's loss)."""
import os
import re
import subprocess
import sys

import zd_fixture as zf

zf.require_torch()

EXAMPLE = os.path.join(zf.REPO, "examples", "train_torch.py")


def run(cluster, job, args, steps):
    env = dict(os.environ)
    env.update(cluster.env(0, job))
    out = subprocess.run([sys.executable, EXAMPLE, "--steps", str(steps)] + args, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=240)
    assert out.returncode == 0, "train_torch.py %s exited with %d:\n%s" % (
        " ".join(args), out.returncode, out.stdout)
    losses = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", out.stdout, re.M)]
    assert len(losses) == steps, out.stdout
    final = float(re.search(r"^final eval_loss (\S+)", out.stdout, re.M).group(1))
    print("train_torch.py %s: first loss %.4f, final eval loss %.4f"
          % (" ".join(args), losses[0], final))
    assert final < losses[0] / 3, out.stdout


def main():
    with zf.Cluster(1) as c:
        run(c, "example-fp32", [], 40)
        run(c, "example-bf16", ["--dtype", "bf16", "--stage", "1", "--accum", "2"], 30)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
