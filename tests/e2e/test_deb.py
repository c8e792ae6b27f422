# SPDX-License-Identifier: BSD-2-Clause
"""The Debian package (debian/, `./quickstart deb`): built from the tree
with dpkg-buildpackage, unpacked into a throw-away root (never the real
one), its files, modes, conffile and unit checked, the shipped binary run
on the shipped configuration, the maintainer scripts run against stubs of
the commands they call; lintian reports no error.

Skipped where dpkg-buildpackage is not installed; `./quickstart test`
installs it (CI runs through it)."""

import gzip
import os
import re
import shutil
import stat
import subprocess

import harness as h

HERE = os.path.dirname(os.path.abspath(__file__))

CONF = "/etc/sluice/sluice.yaml"
UNIT = "/lib/systemd/system/sluice.service"


def _srcdir():
    return os.environ.get("SLUICE_SRCDIR") or os.path.dirname(os.path.dirname(HERE))


def _run(argv, cwd=None, timeout=60, env=None):
    p = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout, env=env)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def _read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def _version(src):
    m = re.search(r"^AC_INIT\(\[sluice\],\s*\[([^]]+)\]", _read(os.path.join(src, "configure.ac")),
                  re.M)
    assert m, "no AC_INIT([sluice], [VERSION]) in configure.ac"
    return m.group(1)


def _git_status(src):
    if shutil.which("git") is None or not os.path.exists(os.path.join(src, ".git")):
        return None
    rc, out, _ = _run(["git", "-C", src, "status", "--porcelain", "--ignored",
                       "--untracked-files=all"])
    if rc != 0:
        return None
    # tests/e2e/__pycache__ and the like come and go with the test run itself.
    return sorted(line for line in out.split("\n")
                  if line and "__pycache__" not in line and not line.endswith(".pyc"))


def _admin_listen(path):
    """The admin_listen a configuration file sets (its uncommented line), or None."""
    found = re.findall(r'^admin_listen:\s*"?([^"\s#]+)"?\s*(?:#.*)?$', _read(path), re.M)
    assert len(found) <= 1, "%s sets admin_listen %d times" % (path, len(found))
    return found[0] if found else None


def _unit_keys(text):
    keys = {}
    for line in text.split("\n"):
        m = re.match(r"^([A-Za-z]+)=(.*)$", line.strip())
        if m:
            keys.setdefault(m.group(1), []).append(m.group(2))
    return keys


# Commands the maintainer scripts may call, stubbed: each appends its name
# and arguments to $STUB_LOG. The questions (getent, dpkg-statoverride
# --list, deb-systemd-helper was-enabled and debian-installed, systemctl
# is-*) answer "no" on a first install, "yes" when $STUB_KNOWN is set (an
# upgrade: user, override and an enabled unit exist).
STUBBED = ("getent", "addgroup", "adduser", "useradd", "groupadd", "dpkg-statoverride",
           "chown", "chmod", "chgrp", "rm", "systemctl", "deb-systemd-helper",
           "deb-systemd-invoke", "systemd-sysusers", "systemd-tmpfiles", "deluser", "delgroup")


def _stub_dir(d):
    os.makedirs(d)
    for name in STUBBED:
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write('#!/bin/sh\n'
                    'echo "${0##*/} $*" >> "$STUB_LOG"\n'
                    'case "${0##*/} $*" in\n'
                    '"getent "*|"dpkg-statoverride --list"*|*" was-enabled "*|'
                    '*" debian-installed "*|"systemctl "*is-*)\n'
                    '    [ -n "$STUB_KNOWN" ] && exit 0; exit 2 ;;\n'
                    'esac\n'
                    'exit 0\n')
        os.chmod(path, 0o755)
    return d


def _run_script(script, args, stubs, known):
    """Run a maintainer script with PATH holding only the stubs, so that
    nothing it calls can reach the real system; [its calls]."""
    log = h.tmpfile("stub", ".log")
    open(log, "w").close()
    env = {"PATH": stubs, "STUB_LOG": log, "STUB_KNOWN": "1" if known else "",
           "DPKG_MAINTSCRIPT_PACKAGE": "sluice", "DPKG_MAINTSCRIPT_NAME":
           os.path.basename(script), "LC_ALL": "C"}
    rc, out, err = _run(["/bin/sh", script] + list(args), env=env, timeout=30)
    assert rc == 0, "%s %s exit %d:\n%s%s" % (os.path.basename(script), " ".join(args), rc,
                                              out, err)
    assert "not found" not in err, \
        "%s calls a command that is not stubbed (add it to STUBBED): %s" % (script, err)
    return [line for line in _read(log).split("\n") if line]


@h.skip_under("valgrind", "sanitizers")
@h.timeout(900)
def test_deb_package_builds_lintian_clean_with_program_man_pages_conffile_user_and_unit():
    if shutil.which("dpkg-buildpackage") is None:
        h.skip("dpkg-buildpackage is not installed: the Debian package cannot be built here "
               "(apt-get install dpkg-dev debhelper lintian; ./quickstart test does)")
    for tool in ("dh", "lintian", "dpkg-deb", "dpkg-checkbuilddeps"):
        assert shutil.which(tool) is not None, \
            "dpkg-buildpackage is installed but %s is not (apt-get install dpkg-dev debhelper " \
            "lintian): the package cannot be checked, and an unchecked package is not a pass" % tool
    src = _srcdir()
    version = _version(src)
    rc, out, err = _run(["dpkg-checkbuilddeps"], cwd=src)
    assert rc == 0, "the package's Build-Depends are not installed (apt-get build-dep %s):\n%s%s" % (
        src, out, err)
    changelog = _read(os.path.join(src, "debian", "changelog"))
    assert changelog.startswith("sluice (%s) " % version), \
        "debian/changelog's first entry is not version %s (configure.ac's AC_INIT): %r" % (
            version, changelog.split("\n")[0])

    # ./quickstart deb DIR: the operator's command, from a copy of the tree.
    before = _git_status(src)
    outdir = os.path.join(h.tmpdir(), "deb")
    rc, out, err = _run([os.path.join(src, "quickstart"), "deb", outdir], timeout=840)
    assert rc == 0, "./quickstart deb failed (%d):\n%s\n%s" % (rc, out[-3000:], err[-3000:])
    arch = _run(["dpkg", "--print-architecture"])[1].strip()
    deb = os.path.join(outdir, "sluice_%s_%s.deb" % (version, arch))
    assert os.path.isfile(deb), "no %s; %s holds %r" % (deb, outdir, sorted(os.listdir(outdir)))
    lines = out.rstrip("\n").split("\n")
    assert lines[-2:] == [deb, "install it with:  apt install %s" % deb], lines[-4:]
    assert _git_status(src) == before, \
        "building the package changed the source tree: %r -> %r" % (before, _git_status(src))

    lint = _read(os.path.join(outdir, "lintian.txt"))
    errors = [line for line in lint.split("\n") if line.startswith("E:")]
    assert not errors, "lintian reports errors:\n%s" % lint
    print("lintian:\n%s" % lint)

    # The control fields.
    rc, fields, err = _run(["dpkg-deb", "-f", deb, "Package", "Version", "Architecture",
                            "Depends"])
    assert rc == 0, err
    f = dict(line.split(": ", 1) for line in fields.strip().split("\n"))
    assert (f["Package"], f["Version"], f["Architecture"]) == ("sluice", version, arch), f
    depends = [d.strip().split(" ")[0] for d in f["Depends"].split(",")]
    for lib in ("adduser", "libc6", "libcurl4", "libev4", "libyaml-0-2", "libjansson4"):
        assert lib in depends, "Depends lacks %s: %s" % (lib, f["Depends"])

    # The archive's members: paths, modes and owners as dpkg will unpack them.
    rc, listing, err = _run(["dpkg-deb", "-c", deb])
    assert rc == 0, err
    members = {}
    for line in listing.strip().split("\n"):
        perms, owner, _, _, _, path = line.split(None, 5)
        members[path[1:].rstrip("/") or "/"] = (perms, owner)
    want = {
        "/usr/sbin/sluice": ("-rwxr-xr-x", "root/root"),
        "/usr/share/man/man8/sluice.8.gz": ("-rw-r--r--", "root/root"),
        "/usr/share/man/man5/sluice.yaml.5.gz": ("-rw-r--r--", "root/root"),
        # Never world-readable: the sample names API keys; postinst gives
        # it to group sluice.
        CONF: ("-rw-r-----", "root/root"),
        UNIT: ("-rw-r--r--", "root/root"),
        "/usr/share/doc/sluice/copyright": ("-rw-r--r--", "root/root"),
    }
    for path, pw in want.items():
        assert members.get(path) == pw, "%s: want %r, the package has %r\n%s" % (
            path, pw, members.get(path), listing)
    files = sorted(p for p, (perms, _) in members.items() if not perms.startswith("d"))
    assert not [p for p in files if p.startswith("/usr/local")], files
    extra = [p for p in files if p not in want and not p.startswith("/usr/share/doc/sluice/")
             and p != "/usr/share/lintian/overrides/sluice"]
    assert not extra, "unexpected files in the package: %r" % extra

    # Unpacked into a throw-away root.
    root = os.path.join(h.tmpdir(), "root")
    ctrl = os.path.join(h.tmpdir(), "DEBIAN")
    for argv in (["dpkg-deb", "-x", deb, root], ["dpkg-deb", "-e", deb, ctrl]):
        rc, out, err = _run(argv)
        assert rc == 0, "%s: %s" % (" ".join(argv), err)
    assert _read(os.path.join(ctrl, "conffiles")).split() == [CONF], \
        "DEBIAN/conffiles: %r" % _read(os.path.join(ctrl, "conffiles"))
    st = os.stat(root + "/usr/sbin/sluice")
    assert stat.S_IMODE(st.st_mode) == 0o755, oct(st.st_mode)
    assert stat.S_IMODE(os.stat(root + CONF).st_mode) == 0o640
    assert _read(root + CONF, "rb") == _read(os.path.join(src, "etc", "sluice.yaml"), "rb"), \
        "the packaged %s is not etc/sluice.yaml" % CONF
    # Installed from the package, the console is on, on loopback only.
    assert _admin_listen(root + CONF) == "127.0.0.1:9090", \
        "the packaged %s has admin_listen %r, not \"127.0.0.1:9090\"" % (
            CONF, _admin_listen(root + CONF))
    # The license, once: debian/copyright, machine-readable, naming it.
    assert _read(root + "/usr/share/doc/sluice/copyright", "rb") == \
        _read(os.path.join(src, "debian", "copyright"), "rb")
    assert "\nLicense: BSD-2-Clause\n" in _read(root + "/usr/share/doc/sluice/copyright")
    assert not os.path.exists(root + "/usr/share/doc/sluice/LICENSE"), \
        "the package carries LICENSE beside its copyright file"
    for page, rel in (("man8/sluice.8.gz", "man/sluice.8"),
                      ("man5/sluice.yaml.5.gz", "man/sluice.yaml.5")):
        with gzip.open(root + "/usr/share/man/" + page, "rb") as g:
            assert g.read() == _read(os.path.join(src, rel), "rb"), "%s is not %s" % (page, rel)

    # The packaged program: built with --sysconfdir=/etc, it checks the
    # packaged configuration.
    prog = root + "/usr/sbin/sluice"
    rc, out, err = _run([prog, "-t", "-c", root + CONF], timeout=10)
    assert rc == 0 and out == "%s: ok\n" % (root + CONF), (rc, out, err)
    rc, out, err = _run([prog, "-V"], timeout=10)
    assert rc == 0 and out.startswith("sluice %s " % version), (rc, out, err)
    rc, out, err = _run([prog, "-h"], timeout=10)
    assert rc == 0 and "(default %s)" % CONF in out, "sluice -h: %r" % out

    # The unit: runs as sluice, checks before starting and reloading, HUP.
    unit = _read(root + UNIT)
    keys = _unit_keys(unit)
    assert keys.get("User") == ["sluice"] and keys.get("Group") == ["sluice"], keys
    assert keys.get("ExecStartPre") == ["/usr/sbin/sluice -t -c %s" % CONF], keys
    assert keys.get("ExecStart") == ["/usr/sbin/sluice -c %s" % CONF], keys
    assert keys.get("ExecReload") == ["/usr/sbin/sluice -t -c %s" % CONF,
                                      "/bin/kill -HUP $MAINPID"], keys
    for k, v in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                 ("ProtectHome", "yes"), ("PrivateTmp", "yes"), ("LogsDirectory", "sluice"),
                 ("AmbientCapabilities", "CAP_NET_BIND_SERVICE"),
                 ("CapabilityBoundingSet", "CAP_NET_BIND_SERVICE"),
                 ("WantedBy", "multi-user.target")):
        assert keys.get(k) == [v], "%s=%r, want %s" % (k, keys.get(k), v)
    # The same unit as etc/sluice.service (the one for `make install`) but
    # for the paths and the user: the two must not drift apart.
    src_keys = _unit_keys(_read(os.path.join(src, "etc", "sluice.service")))
    mapped = {k: [v.replace("/usr/local/sbin/", "/usr/sbin/").replace("/usr/local/etc/", "/etc/")
                  for v in vs] for k, vs in src_keys.items()}
    own = ("User", "Group", "AmbientCapabilities")
    assert {k: v for k, v in keys.items() if k not in own} == \
        {k: v for k, v in mapped.items() if k not in own}, \
        "debian/sluice.service and etc/sluice.service differ beyond paths and user"
    if shutil.which("systemd-analyze") is not None:
        # Its commands pointed at the unpacked program (verify wants them to
        # exist); an unknown key or a bad value is printed, so nothing may be.
        vdir = os.path.join(h.tmpdir(), "verify")
        os.makedirs(vdir)
        with open(os.path.join(vdir, "sluice.service"), "w") as f:
            f.write(unit.replace("/usr/sbin/sluice", prog))
        rc, out, err = _run(["systemd-analyze", "verify", "--man=no",
                             os.path.join(vdir, "sluice.service")], timeout=60)
        assert rc == 0 and out + err == "", "systemd-analyze verify: %d\n%s%s" % (rc, out, err)

    # The maintainer scripts: valid sh, then run with every command they
    # call stubbed (PATH holds only the stubs).
    scripts = [s for s in ("preinst", "postinst", "prerm", "postrm")
               if os.path.exists(os.path.join(ctrl, s))]
    assert "postinst" in scripts and "postrm" in scripts, scripts
    for s in scripts:
        rc, out, err = _run(["sh", "-n", os.path.join(ctrl, s)])
        assert rc == 0, "sh -n %s: %s" % (s, err)
        assert os.access(os.path.join(ctrl, s), os.X_OK), s
    stubs = _stub_dir(os.path.join(h.tmpdir(), "stubs"))
    postinst = os.path.join(ctrl, "postinst")
    postrm = os.path.join(ctrl, "postrm")

    calls = _run_script(postinst, ["configure", ""], stubs, known=False)
    print("postinst configure (first install):\n  " + "\n  ".join(calls))
    adds = [c.split() for c in calls if c.startswith(("addgroup ", "adduser "))]
    assert adds and adds[0][0] == "addgroup" and "--system" in adds[0] and adds[0][-1] == "sluice", \
        calls
    assert len(adds) == 2 and adds[1][0] == "adduser" and "--system" in adds[1] \
        and adds[1][-1] == "sluice" and adds[1][adds[1].index("--ingroup") + 1] == "sluice" \
        and adds[1][adds[1].index("--home") + 1] == "/nonexistent", calls
    assert "dpkg-statoverride --update --add root sluice 0640 %s" % CONF in calls, calls
    assert not [c for c in calls if re.match(r"(deb-systemd-invoke|systemctl) .*\bstart\b", c)], \
        "postinst starts the service on a first install: %r" % calls
    assert not [c for c in calls if c.startswith("deb-systemd-helper enable")], \
        "postinst enables the service on a first install: %r" % calls

    # Upgrade: the user and the override exist; nothing is made again and an
    # administrator's override is kept.
    calls = _run_script(postinst, ["configure", version], stubs, known=True)
    assert not [c for c in calls if c.startswith(("addgroup", "adduser", "chmod", "chown"))
                or c.startswith("dpkg-statoverride --update")], calls

    calls = _run_script(postrm, ["remove"], stubs, known=True)
    assert not [c for c in calls if c.startswith(("rm ", "dpkg-statoverride --remove",
                                                  "deluser", "delgroup"))], calls
    calls = _run_script(postrm, ["purge"], stubs, known=True)
    print("postrm purge:\n  " + "\n  ".join(calls))
    assert "dpkg-statoverride --remove %s" % CONF in calls, calls
    assert "rm -rf /var/log/sluice" in calls, calls
    for s in ("preinst", "prerm"):
        if s in scripts:
            _run_script(os.path.join(ctrl, s), ["upgrade", version], stubs, known=True)
