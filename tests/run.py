#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
"""The single test runner of sluice (`make check` calls it).

1. Runs each cmocka unit-test binary listed in $UNIT_TESTS and counts its
   tests from the `[       OK ] NAME` / `[  FAILED  ] NAME` lines. When
   $UNIT_TESTS_MISSING says why they were not built (no cmocka at configure
   time), that is printed as a FAIL and counted as one failure.
   With -k, each binary runs only its cases whose name BINARY::CASE
   contains one of the substrings (tests/unit/unit.h reads them from
   $SLUICE_TEST_FILTER); a binary none of whose cases match runs none and
   counts nothing.
2. Discovers tests/e2e/test_*.py and runs every top-level `test_*`
   function, in file order, each in its own process group with a watchdog.
   The e2e tests start $SLUICE_BIN and $STUB_BIN on 127.0.0.1.
3. Prints `N passed, N failed` as the last line; exits 0 iff nothing failed
   and something passed.

Options: -k SUBSTR (repeatable; run only tests whose name contains one of
them: FILE::TEST for an end-to-end test, BINARY::CASE for a unit test
case), --unit-only, --e2e-only, -v, --timeout SECONDS (default per-test
watchdog, 120).

$SLUICE_UNDER names the tools the gateway runs under (comma separated:
"sanitizers", "valgrind"). A test decorated @harness.skip_under("valgrind")
measures something such a tool distorts (RSS, fd counts, timing): it is
reported as SKIP with its reason and counted in ", N skipped".
A test that calls harness.skip("REASON") at run time (something it needs is
missing here, e.g. a browser) is reported the same way.
A test decorated @harness.pending("REASON") pins a known defect whose fix
is another change's: it is reported as SKIP with the reason unless
$SLUICE_RUN_PENDING is set.
"""

import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
E2E_DIR = os.path.join(HERE, "e2e")
DEFAULT_TIMEOUT = 120.0
UNIT_TIMEOUT = 300.0


def out(msg=""):
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def indent(text, prefix="    "):
    return "\n".join(prefix + line for line in text.rstrip("\n").split("\n"))


def tail(text, nlines=30):
    lines = text.rstrip("\n").split("\n")
    return "\n".join(lines[-nlines:])


# ------------------------------------------------------------------ processes

def become_subreaper():
    """Orphans of a killed test (its gateway, workers, stub) are re-parented
    to this runner, which then ends and reaps them by pid."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_CHILD_SUBREAPER = 36
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def our_children():
    kids = []
    me = os.getpid()
    try:
        for t in os.listdir("/proc/%d/task" % me):
            try:
                with open("/proc/%d/task/%s/children" % (me, t)) as f:
                    kids += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return kids


def reap_orphans(timeout=5.0):
    """Kill (by pid) and reap every process left re-parented to us."""
    deadline = time.monotonic() + timeout
    while True:
        kids = our_children()
        for k in kids:
            try:
                os.kill(k, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
        if not our_children() or time.monotonic() > deadline:
            return
        time.sleep(0.02)


def kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_in_group(argv, env, timeout, stdout_path):
    """Run argv in a new session (its own process group), output to a file.
    Returns (returncode or None on timeout, elapsed). Whatever the group
    still holds at the end is killed by the group id (the leader's pid, kept
    reserved by not reaping the leader before the kill)."""
    t0 = time.monotonic()
    with open(stdout_path, "wb") as f:
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
    pgid = p.pid
    deadline = t0 + timeout
    timed_out = False
    try:
        while True:
            try:
                r = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                r = True
            if r is not None:
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(0.05)
    finally:
        # The leader is unreaped (or still running): its pid is still our
        # group's id, so this reaches only what this run started.
        kill_group(pgid)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        reap_orphans()
    return (None if timed_out else p.returncode), time.monotonic() - t0


# ------------------------------------------------------------------ unit tests

OK_RE = re.compile(r"^\[\s+OK\s+\]\s+(\S.*?)\s*$")
FAIL_RE = re.compile(r"^\[\s+FAILED\s+\]\s+(\S.*?)\s*$")
SUMMARY_RE = re.compile(r"^\d+ test\(s\)")
# tests/unit/unit.h, when $SLUICE_TEST_FILTER is set: how many cases it chose.
FILTER_RE = re.compile(r"^\[\s+FILTER\s+\]\s+(\d+) of (\d+) test\(s\)")


def failure_blocks(text, failed):
    """The output of each failed cmocka test, from its RUN line to its
    FAILED line (all of the output if that cannot be found)."""
    lines = text.splitlines()
    blocks = []
    start = None
    for i, line in enumerate(lines):
        if re.match(r"^\[ RUN\s+\]", line):
            start = i
        m = FAIL_RE.match(line)
        if m and m.group(1) in failed and start is not None:
            blocks.extend(lines[start:i + 1])
            start = None
    return "\n".join(blocks) if blocks else tail(text, 80)


def run_unit(binaries, filters, verbose, results):
    """Each binary, its cases selected by filters (every case when there
    are none, or when one is empty: it is in every name)."""
    if "" in filters:
        filters = []
    for path in binaries:
        name = os.path.basename(path)
        if not os.access(path, os.X_OK):
            out("FAIL %s: not an executable file" % name)
            results["failed"] += 1
            continue
        env = dict(os.environ, CMOCKA_MESSAGE_OUTPUT="STDOUT")
        env.pop("SLUICE_TEST_FILTER", None)
        if filters:
            env["SLUICE_TEST_FILTER"] = "\n".join(filters)
        fd, log = tempfile.mkstemp(prefix="sluice-unit-", suffix=".log")
        os.close(fd)
        try:
            rc, elapsed = run_in_group([path], env, UNIT_TIMEOUT, log)
            with open(log, "rb") as f:
                text = f.read().decode("utf-8", "replace")
        finally:
            os.unlink(log)
        oks = []
        failed = []
        selected = None
        for line in text.splitlines():
            m = FILTER_RE.match(line)
            if m:
                selected = int(m.group(1))
                continue
            m = OK_RE.match(line)
            if m:
                oks.append(m.group(1))
                continue
            m = FAIL_RE.match(line)
            if m and not SUMMARY_RE.match(m.group(1)) and m.group(1) not in failed:
                failed.append(m.group(1))
        # A test both OK and FAILED (cannot happen in cmocka) counts failed.
        oks = [t for t in oks if t not in failed]
        nfail = len(failed)
        problem = None
        if rc is None:
            problem = "timed out after %.0fs" % UNIT_TIMEOUT
        elif rc < 0:
            problem = "killed by signal %s" % signal.Signals(-rc).name
        elif rc != 0 and not failed:
            problem = "exit status %d without FAILED lines" % rc
        elif filters and selected is None:
            problem = "ran without reading -k (its main() must return " \
                "sl_unit_run(tests), tests/unit/unit.h)"
        elif rc == 0 and not oks and not failed and selected != 0:
            problem = "ran no tests"
        if problem and not failed:
            nfail = 1
            failed = [name]
        elif problem:
            failed.append("%s (%s)" % (name, problem))
            nfail += 1
        results["passed"] += len(oks)
        results["failed"] += nfail
        for t in oks:
            if verbose:
                out("PASS %s::%s" % (name, t))
        for t in failed:
            if problem and t == name:
                out("FAIL %s: %s" % (name, problem))
            else:
                out("FAIL %s::%s" % (name, t))
        if failed:
            out(indent(failure_blocks(text, failed) if not problem else tail(text, 80)))
        elif selected == 0:
            if verbose:
                out("---- %s: no case matches -k" % name)
        else:
            out("PASS %s (%d tests, %.1fs)" % (name, len(oks), elapsed))


# ------------------------------------------------------------------ e2e tests

def discover(filters):
    """[(file, test, timeout)] in file order, without importing (parsing the
    module is enough to find top-level test functions and their timeouts)."""
    found = []
    for fn in sorted(os.listdir(E2E_DIR)):
        if not (fn.startswith("test_") and fn.endswith(".py")):
            continue
        path = os.path.join(E2E_DIR, fn)
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                tmo = DEFAULT_TIMEOUT
                skip = None
                under = set(filter(None, os.environ.get("SLUICE_UNDER", "").split(",")))
                for d in node.decorator_list:
                    if isinstance(d, ast.Call) and getattr(d.func, "attr",
                                                           getattr(d.func, "id", "")) == "skip_under":
                        tools = [a.value for a in d.args if isinstance(a, ast.Constant)]
                        hit = [t for t in tools if t in under]
                        if hit:
                            skip = "measures what %s distorts" % hit[0]
                    if isinstance(d, ast.Call) and getattr(d.func, "attr",
                                                           getattr(d.func, "id", "")) == "pending" \
                            and d.args and isinstance(d.args[0], ast.Constant) \
                            and not os.environ.get("SLUICE_RUN_PENDING"):
                        skip = "pending: %s" % d.args[0].value
                    if isinstance(d, ast.Call) and getattr(d.func, "attr",
                                                           getattr(d.func, "id", "")) == "timeout" \
                            and d.args and isinstance(d.args[0], ast.Constant):
                        tmo = float(d.args[0].value)
                full = "%s::%s" % (fn, node.name)
                if filters and not any(f in full for f in filters):
                    continue
                found.append((fn, node.name, tmo, skip))
    return found


def child_main(fn, test, result_path):
    """Run one e2e test in this process; write {"ok", "message"} to
    result_path."""
    sys.path.insert(0, E2E_DIR)
    res = {"ok": False, "message": "did not finish"}
    harness = None
    try:
        import harness  # noqa: F401
        modname = fn[:-3]
        mod = __import__(modname)
        func = getattr(mod, test)
        func()
        res = {"ok": True, "message": ""}
    except BaseException as e:  # noqa: B902 - report everything
        if harness is not None and isinstance(e, getattr(harness, "Skip", ())):
            res = {"ok": True, "message": "", "skip": str(e)}
        else:
            msg = "%s: %s" % (type(e).__name__, e) if not isinstance(e, AssertionError) \
                else (str(e) or "AssertionError")
            frames = traceback.extract_tb(e.__traceback__)
            where = ["%s:%d in %s" % (os.path.basename(f.filename), f.lineno, f.name)
                     for f in frames
                     if os.path.dirname(os.path.abspath(f.filename)) == E2E_DIR]
            res = {"ok": False, "message": msg, "where": where,
                   "traceback": "".join(traceback.format_exception(e))}
    finally:
        if harness is not None:
            try:
                harness.kill_started()
            except Exception:
                traceback.print_exc()
        with open(result_path, "w") as f:
            json.dump(res, f)
    sys.stdout.flush()
    return 0 if res["ok"] else 1


def stderr_tails(tmp):
    parts = []
    for fn in sorted(os.listdir(tmp)):
        if fn.endswith(".stderr"):
            try:
                with open(os.path.join(tmp, fn), "rb") as f:
                    text = f.read().decode("utf-8", "replace")
            except OSError:
                continue
            if text.strip():
                parts.append("--- %s (tail)\n%s" % (fn, tail(text, 25)))
    return "\n".join(parts)


def run_e2e(tests, default_timeout, verbose, results):
    for fn, test, tmo, skip in tests:
        if tmo == DEFAULT_TIMEOUT:
            tmo = default_timeout
        name = "%s::%s" % (fn, test)
        if skip:
            results["skipped"] += 1
            out("SKIP %s (%s)" % (name, skip))
            continue
        tmp = tempfile.mkdtemp(prefix="sluice-e2e-")
        result_path = os.path.join(tmp, "result.json")
        log_path = os.path.join(tmp, "test.log")
        env = dict(os.environ, SLUICE_E2E_TMPDIR=tmp, PYTHONDONTWRITEBYTECODE="1")
        argv = [sys.executable, os.path.abspath(__file__), "--child", fn, test, result_path]
        rc, elapsed = run_in_group(argv, env, tmo, log_path)
        res = None
        try:
            with open(result_path) as f:
                res = json.load(f)
        except (OSError, ValueError):
            pass
        with open(log_path, "rb") as f:
            log = f.read().decode("utf-8", "replace")
        if rc is None:
            ok, msg = False, "timed out after %.0fs (watchdog)" % tmo
        elif res is None:
            ok, msg = False, "test process ended with status %s and no result" % rc
        else:
            ok, msg = res["ok"], res["message"]
        where = (res or {}).get("where") or []
        if ok and res.get("skip"):
            results["skipped"] += 1
            out("SKIP %s (%s)" % (name, res["skip"]))
            shutil.rmtree(tmp, ignore_errors=True)
        elif ok:
            results["passed"] += 1
            out("PASS %s (%.1fs)" % (name, elapsed))
            if verbose and log.strip():
                out(indent(log))
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            results["failed"] += 1
            first, _, rest = msg.partition("\n")
            out("FAIL %s: %s" % (name, first))
            if rest.strip():
                out(indent(rest))
            if where:
                out("    at " + " <- ".join(reversed(where)))
            if verbose and res and res.get("traceback"):
                out(indent(res["traceback"]))
            if log.strip():
                out("    --- test output (tail)")
                out(indent(tail(log, 40 if not verbose else 400)))
            tails = stderr_tails(tmp)
            if tails:
                out(indent(tails))
            if verbose:
                out("    (files kept in %s)" % tmp)
            else:
                shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------ main

def main(argv):
    if len(argv) >= 2 and argv[1] == "--child":
        return child_main(argv[2], argv[3], argv[4])
    ap = argparse.ArgumentParser(description="Run sluice's unit and end-to-end tests.")
    ap.add_argument("-k", action="append", default=[], metavar="SUBSTR",
                    help="run only tests whose name contains SUBSTR (repeatable): "
                    "FILE::TEST for end-to-end tests, BINARY::CASE for unit test cases")
    ap.add_argument("--unit-only", action="store_true")
    ap.add_argument("--e2e-only", action="store_true")
    ap.add_argument("-v", action="store_true", help="verbose")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                    help="default per-test watchdog in seconds")
    args = ap.parse_args(argv[1:])
    for v in ("SLUICE_BIN", "STUB_BIN"):
        if os.environ.get(v):
            os.environ[v] = os.path.abspath(os.environ[v])
    become_subreaper()
    results = {"passed": 0, "failed": 0, "skipped": 0}
    t0 = time.monotonic()
    if not args.e2e_only:
        units = os.environ.get("UNIT_TESTS", "").split()
        missing_units = os.environ.get("UNIT_TESTS_MISSING", "").strip()
        if missing_units:
            # Unit tests that were not built are not a pass: say so, count it.
            out("FAIL unit tests: %s" % missing_units)
            results["failed"] += 1
        run_unit(units, args.k, args.v, results)
    if not args.unit_only:
        missing = [v for v in ("SLUICE_BIN", "STUB_BIN")
                   if not os.environ.get(v) or not os.access(os.environ[v], os.X_OK)]
        tests = discover(args.k)
        if missing and tests:
            for fn, test, _, _ in tests:
                out("FAIL %s::%s: %s not set or not executable" % (fn, test, " and ".join(missing)))
            results["failed"] += len(tests)
        else:
            run_e2e(tests, args.timeout, args.v, results)
    if args.v:
        out("(%.1fs)" % (time.monotonic() - t0))
    if results["skipped"]:
        out("%d passed, %d failed, %d skipped" % (results["passed"], results["failed"],
                                                  results["skipped"]))
    else:
        out("%d passed, %d failed" % (results["passed"], results["failed"]))
    return 0 if results["failed"] == 0 and results["passed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
