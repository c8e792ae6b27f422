# SPDX-License-Identifier: BSD-2-Clause
"""`make install` / `make uninstall` with DESTDIR, the installed sample
config and LICENSE, the man pages (lint clean, they render) and the systemd
unit."""

import os
import re
import shutil
import subprocess

import harness as h

HERE = os.path.dirname(os.path.abspath(__file__))


def _srcdir():
    return os.environ.get("SLUICE_SRCDIR") or os.path.dirname(os.path.dirname(HERE))


def _builddir():
    """The build directory is the one holding $SLUICE_BIN and its Makefile."""
    d = os.path.dirname(os.path.abspath(h.sluice_bin()))
    if not os.path.isfile(os.path.join(d, "Makefile")):
        raise h.HarnessError("no Makefile next to SLUICE_BIN (%s): not a build directory" % d)
    return d


def _make_vars(builddir):
    """The Makefile's simple `name = value` assignments, ${var} expanded."""
    raw = {}
    with open(os.path.join(builddir, "Makefile")) as f:
        for line in f:
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$", line)
            if m and m.group(1) not in raw:
                raw[m.group(1)] = m.group(2)

    def expand(v, depth=0):
        assert depth < 20, "recursive Makefile variable"
        return re.sub(r"\$[{(]([A-Za-z_][A-Za-z0-9_]*)[})]",
                      lambda m: expand(raw.get(m.group(1), ""), depth + 1), v)
    return {k: expand(v) for k, v in raw.items()}


def _run(argv, cwd=None, timeout=240, env=None):
    p = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout, env=env)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def _make(builddir, *targets, destdir):
    rc, out, err = _run(["make", "-s", "-C", builddir, "-j2"] + list(targets) +
                        ["DESTDIR=" + destdir])
    assert rc == 0, "make %s failed (%d):\n%s\n%s" % (" ".join(targets), rc, out[-2000:],
                                                      err[-2000:])


def _admin_listen(path):
    """The admin_listen a configuration file sets (its uncommented line), or None."""
    with open(path) as f:
        found = re.findall(r'^admin_listen:\s*"?([^"\s#]+)"?\s*(?:#.*)?$', f.read(), re.M)
    assert len(found) <= 1, "%s sets admin_listen %d times" % (path, len(found))
    return found[0] if found else None


def _files_under(d):
    found = []
    for root, _, files in os.walk(d):
        found += [os.path.join(root, f) for f in files]
    return sorted(found)


@h.timeout(300)
def test_make_install_puts_program_man_pages_and_sample_under_the_prefix_and_uninstall_removes_them():
    builddir = _builddir()
    v = _make_vars(builddir)
    destdir = os.path.join(h.tmpdir(), "destdir")
    os.makedirs(destdir)
    _make(builddir, "install", destdir=destdir)
    prefix = v["prefix"]
    want = {
        "program": os.path.join(v["sbindir"], "sluice"),
        "sluice.8": os.path.join(v["mandir"], "man8", "sluice.8"),
        "sluice.yaml.5": os.path.join(v["mandir"], "man5", "sluice.yaml.5"),
        "sample": os.path.join(v["sysconfdir"], "sluice", "sluice.yaml"),
        "LICENSE": os.path.join(v["docdir"], "LICENSE"),
    }
    if prefix == "/usr/local":
        assert want == {
            "program": "/usr/local/sbin/sluice",
            "sluice.8": "/usr/local/share/man/man8/sluice.8",
            "sluice.yaml.5": "/usr/local/share/man/man5/sluice.yaml.5",
            "sample": "/usr/local/etc/sluice/sluice.yaml",
            "LICENSE": "/usr/local/share/doc/sluice/LICENSE",
        }, want
    installed = {k: destdir + p for k, p in want.items()}
    for k, p in installed.items():
        assert os.path.isfile(p), "make install did not install %s at %s (prefix %s); got %r" % (
            k, p, prefix, _files_under(destdir))
    assert os.access(installed["program"], os.X_OK)
    src = _srcdir()
    for k, rel in (("sluice.8", "man/sluice.8"), ("sluice.yaml.5", "man/sluice.yaml.5"),
                   ("sample", "etc/sluice.yaml"), ("LICENSE", "LICENSE")):
        with open(installed[k], "rb") as a, open(os.path.join(src, rel), "rb") as b:
            assert a.read() == b.read(), "installed %s differs from %s" % (k, rel)
    # The installed program checks the installed sample.
    rc, out, err = _run([installed["program"], "-t", "-c", installed["sample"]], timeout=10)
    assert rc == 0, "installed sample fails sluice -t (%d): %s%s" % (rc, out, err)
    assert out == "%s: ok\n" % installed["sample"], "sluice -t printed %r" % out
    # The console is on as installed, on loopback only (issue 31): an
    # operator opens http://127.0.0.1:9090/ on the machine.
    assert _admin_listen(installed["sample"]) == "127.0.0.1:9090", \
        "the installed sample's admin_listen is %r, not \"127.0.0.1:9090\"" % \
        _admin_listen(installed["sample"])
    rc, out, err = _run([installed["program"], "-V"], timeout=10)
    assert rc == 0 and out.strip(), (rc, out, err)
    # Nothing else is installed.
    extra = set(_files_under(destdir)) - set(installed.values())
    assert not extra, "unexpected installed files: %r" % sorted(extra)

    _make(builddir, "uninstall", destdir=destdir)
    left = _files_under(destdir)
    assert not left, "make uninstall left files behind: %r" % left
    shutil.rmtree(destdir, ignore_errors=True)


MAN_PAGES = ("man/sluice.8", "man/sluice.yaml.5")


def _require_mandoc():
    # A test that cannot run is not a pass: mandoc is a test dependency
    # (./quickstart installs it, CI runs through it).
    assert shutil.which("mandoc") is not None, \
        "mandoc is not installed (apt-get install mandoc): the man pages cannot be " \
        "checked, and an unchecked page is not a pass"


def test_man_pages_pass_mandoc_lint_without_warnings():
    _require_mandoc()
    for rel in MAN_PAGES:
        path = os.path.join(_srcdir(), rel)
        rc, out, err = _run(["mandoc", "-T", "lint", "-W", "warning", path], timeout=30)
        assert rc == 0 and out == "" and err == "", \
            "mandoc -T lint -W warning %s (exit %d):\n%s%s" % (rel, rc, out, err)


def test_man_pages_render_with_man_and_groff_without_warnings():
    _require_mandoc()
    renderers = 0
    env = dict(os.environ, MANPAGER="cat", PAGER="cat", MANWIDTH="80", LC_ALL="C.UTF-8")
    for rel in MAN_PAGES:
        path = os.path.join(_srcdir(), rel)
        name = os.path.basename(rel).rsplit(".", 1)[0].upper()
        if shutil.which("man") is not None:
            renderers += 1
            rc, out, err = _run(["man", "-l", path], env=env, timeout=30)
            out = re.sub(".\b", "", out)
            assert rc == 0, "man -l %s exit %d: %s" % (rel, rc, err)
            assert err == "", "man -l %s warns: %s" % (rel, err)
            assert "SYNOPSIS" in out and name in out and len(out.split("\n")) > 50, \
                "man -l %s rendered %r" % (rel, out[:300])
        if shutil.which("mandoc") is not None:
            renderers += 1
            rc, out, err = _run(["mandoc", "-T", "utf8", path], timeout=30)
            out = re.sub(".\b", "", out)           # overstrike (bold, underline)
            assert rc == 0 and err == "" and "SYNOPSIS" in out, (rel, rc, err, out[:200])
        if shutil.which("groff") is not None:
            renderers += 1
            rc, out, err = _run(["groff", "-ww", "-z", "-mdoc", path], env=env, timeout=30)
            assert rc == 0 and out == "" and err == "", \
                "groff -ww -z -mdoc %s (exit %d):\n%s%s" % (rel, rc, out, err)
    print("rendered by %d renderer(s) of man, mandoc, groff" % renderers)


def _seconds(v):
    """A systemd time span or a sluice duration, in seconds."""
    total, s = 0.0, v.strip()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+)", s):
        assert unit in units, "unknown time unit %r in %r" % (unit, v)
        total += float(num) * units[unit]
    assert total > 0, "cannot read the time %r" % v
    return total


def test_systemd_unit_reloads_with_hup_and_stops_after_drain_timeout():
    src = _srcdir()
    with open(os.path.join(src, "etc", "sluice.service")) as f:
        unit = f.read()
    with open(os.path.join(src, "etc", "sluice.yaml")) as f:
        sample = f.read()
    keys = {}
    for line in unit.split("\n"):
        m = re.match(r"^([A-Za-z]+)=(.*)$", line.strip())
        if m:
            keys.setdefault(m.group(1), []).append(m.group(2))
    reload_cmds = keys.get("ExecReload", [])
    assert any(re.search(r"\bkill\s+(-HUP|-s\s*HUP|-SIGHUP|-1)\s+\$MAINPID\b", c)
               for c in reload_cmds), "no ExecReload sends HUP to $MAINPID: %r" % reload_cmds
    assert keys.get("KillSignal", ["SIGTERM"])[-1] in ("SIGTERM", "TERM"), keys.get("KillSignal")
    assert "TimeoutStopSec" in keys, "no TimeoutStopSec in the unit"
    stop = _seconds(keys["TimeoutStopSec"][-1])
    m = re.search(r"^drain_timeout:\s*(\S+)", sample, re.M)
    assert m, "the sample sets no drain_timeout"
    drain = _seconds(m.group(1))
    assert stop > drain, "TimeoutStopSec %ss is not above the sample's drain_timeout %ss" % (
        stop, drain)
    starts = keys.get("ExecStart", [])
    assert len(starts) == 1 and re.match(r"^\S*/sbin/sluice\s+-c\s+\S+/sluice/sluice\.yaml$",
                                         starts[0]), starts
