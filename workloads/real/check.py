#!/usr/bin/env python3
"""Run the real-program suite (workloads/real/suite.toml) on a wasmtime CLI
and check every program's `expect` / `expect_sha256`.

Usage: workloads/real/check.py [--size test|bench] [--wasmtime PATH]
                               [--precompile] [name...]

Prints one line per program: PASS/FAIL, the wall time of `wasmtime run`
(with --precompile, the module is compiled ahead with `wasmtime compile`
and the time excludes compilation), and the sha256 of the compared output.
Exits 1 if any program fails. Needs Python 3.11 (tomllib) and the modules
built by workloads/real/build.sh. Stock wasmtime for comparison:
`cargo install --locked wasmtime-cli --version '^48'`.
"""
import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "target", "workloads", "real")


def compared(prog, stdout):
    """The part of stdout that must match: all of it, or the matching lines."""
    if prog["compare"] == "stdout":
        return stdout
    pat = re.compile(prog["lines"])
    keep = [l for l in stdout.decode("utf-8", "replace").splitlines() if pat.search(l)]
    return "".join(l + "\n" for l in keep).encode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["test", "bench"], default="test")
    ap.add_argument("--wasmtime", default="wasmtime")
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    with open(os.path.join(ROOT, "workloads", "real", "suite.toml"), "rb") as f:
        suite = tomllib.load(f)
    failed = 0
    tmp = tempfile.mkdtemp(prefix="roam-real-")
    for prog in suite["program"]:
        if a.names and prog["name"] not in a.names:
            continue
        run = prog.get(a.size)
        if run is None:
            print(f"SKIP {prog['name']:12} (no {a.size} size)")
            continue
        wasm = os.path.join(OUT, prog["wasm"])
        if a.precompile:
            cwasm = os.path.join(tmp, prog["name"] + ".cwasm")
            subprocess.run([a.wasmtime, "compile", "-o", cwasm, wasm], check=True)
            cmd = [a.wasmtime, "run", "--allow-precompiled"]
            module = cwasm
        else:
            cmd = [a.wasmtime, "run"]
            module = wasm
        if "dir" in run:
            scratch = os.path.join(tmp, prog["name"] + "-data")
            os.makedirs(scratch, exist_ok=True)
            cmd += ["--dir", f"{scratch}::{run['dir']}"]
        cmd += [module] + run["args"]
        stdin = open(os.path.join(OUT, run["stdin"]), "rb") if "stdin" in run else subprocess.DEVNULL
        t0 = time.monotonic()
        p = subprocess.run(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        dt = time.monotonic() - t0
        out = compared(prog, p.stdout)
        sha = hashlib.sha256(out).hexdigest()
        why = ""
        if p.returncode != 0:
            why = f"exit status {p.returncode}: {p.stderr.decode(errors='replace').strip()[-300:]}"
        elif "expect" in run and not re.search(run["expect"], p.stdout.decode("utf-8", "replace")):
            why = f"stdout does not match {run['expect']!r}"
        elif "expect_sha256" in run and sha != run["expect_sha256"]:
            why = f"sha256 {sha} != {run['expect_sha256']}"
        status = "FAIL" if why else "PASS"
        failed += bool(why)
        print(f"{status} {prog['name']:12} {a.size:5} {dt:7.3f}s  {sha[:16]}  {why}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
