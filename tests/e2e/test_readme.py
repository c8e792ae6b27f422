# SPDX-License-Identifier: BSD-2-Clause
"""README.md stays true: its layout names every source file, every file,
image and link it points to exists, its commands are quickstart's, its
configuration passes `sluice -t`, and its test-time claim agrees with
quickstart and with the times the last full `./quickstart test` recorded."""

import os
import re

import harness as h

HERE = os.path.dirname(os.path.abspath(__file__))


def srcdir():
    return os.environ.get("SLUICE_SRCDIR") or os.path.dirname(os.path.dirname(HERE))


def read(rel):
    with open(os.path.join(srcdir(), rel), encoding="utf-8") as f:
        return f.read()


def fenced_blocks(text, lang):
    """The bodies of ```LANG ... ``` blocks, in order."""
    return re.findall(r"^```%s\n(.*?)^```$" % re.escape(lang), text, re.M | re.S)


def layout_block(text):
    """The fenced block under '## Layout'."""
    m = re.search(r"^## Layout\n.*?^```\n(.*?)^```$", text, re.M | re.S)
    assert m, "README.md has no '## Layout' section with a fenced block"
    return m.group(1)


def test_readme_layout_names_every_source_file():
    layout = layout_block(read("README.md"))
    named = set(re.findall(r"^src/([a-z0-9_]+\.c)\s+\S", layout, re.M))
    present = set(f for f in os.listdir(os.path.join(srcdir(), "src")) if f.endswith(".c"))
    assert present - named == set(), \
        "src/*.c missing from README's layout (one line each): %s" % sorted(present - named)
    assert named - present == set(), \
        "README's layout names files src/ does not have: %s" % sorted(named - present)
    # Every other entry of the layout (a directory or a file) exists too.
    for line in layout.splitlines():
        entry = line.split()[0] if line.strip() else ""
        if entry:
            assert os.path.exists(os.path.join(srcdir(), entry)), \
                "README's layout names %s, which does not exist" % entry
    # Each file named in a directory's line (etc/, man/, bench/, tests/) exists.
    for line in layout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0].endswith("/"):
            for name in re.findall(r"(?<![\w.])([\w-]+(?:\.[\w-]+)+)", parts[1]):
                assert os.path.exists(os.path.join(srcdir(), parts[0], name)), \
                    "README's layout names %s%s, which does not exist" % (parts[0], name)


LINK_RE = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_images_and_links_exist():
    """Every relative link and image of README.md and of the documents it
    sends a newcomer to points at a file in the repository."""
    missing = []
    for doc in ("README.md", "bench/RESULTS.md", "bench/HISTORY.md", "bench/README.md",
                "tests/README.md"):
        base = os.path.dirname(doc)
        for target in LINK_RE.findall(read(doc)):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = os.path.normpath(os.path.join(base, target.split("#")[0]))
            if not os.path.isfile(os.path.join(srcdir(), path)):
                missing.append("%s -> %s" % (doc, target))
    assert missing == [], "links and images to files that do not exist: %s" % missing
    images = [t for t in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", read("README.md"))]
    assert "docs/console.png" in images and "bench/headline.png" in images, images
    for img in images:
        with open(os.path.join(srcdir(), img), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", "%s is not a PNG" % img


def quickstart_targets():
    """The words of quickstart's top-level `case "${1:-}" in` labels."""
    text = read("quickstart")
    m = re.search(r'^case "\$\{1:-\}" in\n(.*?)^esac', text, re.M | re.S)
    assert m, "quickstart has no top-level case statement"
    return set(w.strip() for label in re.findall(r"^\s*([a-z][a-z| -]*)\)", m.group(1), re.M)
               for w in label.split("|"))


def test_readme_quickstart_commands_exist():
    shown = set(re.findall(r"\./quickstart ([a-z]+)", read("README.md")))
    assert {"demo", "test"} <= shown, shown
    targets = quickstart_targets()
    assert shown - targets == set(), \
        "README shows ./quickstart %s, which quickstart does not have (it has %s)" % (
            sorted(shown - targets), sorted(targets))
    # CI runs exactly the command README calls the whole suite.
    assert re.search(r"^exec \./quickstart test$", read(".ci/run"), re.M), read(".ci/run")
    for page in ("man/sluice.8", "man/sluice.yaml.5"):
        assert "(%s)" % page in read("README.md"), "README does not link %s" % page


def test_readme_configuration_passes_sluice_t():
    blocks = fenced_blocks(read("README.md"), "yaml")
    assert blocks, "README.md has no ```yaml block"
    for i, block in enumerate(blocks):
        path = h.tmpfile("readme", ".yaml")
        with open(path, "w") as f:
            f.write(block)
        os.chmod(path, 0o600)
        rc, out, err = h.run_sluice(["-t", "-c", path])
        assert (rc, out.strip()) == (0, "%s: ok" % path), \
            "README's yaml block %d fails sluice -t:\n%s%s" % (i + 1, out, err)


def test_readme_test_time_claim_is_quickstarts():
    readme = read("README.md")
    quickstart = read("quickstart")
    # The fuzzing part: the number of targets run.sh runs, for quickstart's default.
    m = re.search(r"the (\d+) fuzz targets for (\d+) s each", readme)
    assert m, "README does not say how many fuzz targets run for how long"
    targets = re.search(r'^targets=\$\{FUZZ_TARGETS:-([a-z0-9_ ]+)\}$',
                        read("tests/fuzz/run.sh"), re.M)
    assert targets, "tests/fuzz/run.sh lists no default targets"
    assert int(m.group(1)) == len(targets.group(1).split()), (m.group(0), targets.group(1))
    default = re.search(r'SLUICE_FUZZ_SECONDS:-(\d+)\}" != 0', quickstart)
    assert default and int(m.group(2)) == int(default.group(1)), m.group(0)
    # The suites README lists are the ones quickstart runs.
    suites = re.findall(r"run_suite ([a-z-]+) ", quickstart)
    assert suites == ["check", "check-asan", "check-valgrind", "fuzz"], suites
    for words in ("normal build", "ASan+UBSan build", "under valgrind"):
        assert re.search(r"\s+".join(map(re.escape, words.split())), readme), words
    # The duration: against the times of the last full run, when one was on
    # the kind of machine README names (2 cores). A factor of 2 either way
    # tolerates a busy machine and still catches a claim gone stale.
    d = re.search(r"it took \*\*(\d+) minutes\*\*", readme)
    assert d, "README does not quote the suite's time as 'it took **N minutes**'"
    claimed = int(d.group(1)) * 60
    n = re.search(r"normal pass\s+alone \(`make -C build check`[^)]*\) took \*\*(\d+) minutes\*\*",
                  readme)
    assert n, "README does not quote the normal pass's time as 'took **N minutes**'"
    times_file = os.path.join(srcdir(), "build", "suite-times")
    if not os.path.exists(times_file):
        return
    with open(times_file) as f:
        times = dict(line.split() for line in f if line.strip())
    if times.get("nproc") != "2" or "total" not in times:
        return
    for what, said, took in (("the whole suite", claimed, int(times["total"])),
                             ("the normal pass", int(n.group(1)) * 60, int(times["check"]))):
        assert took / 2 <= said <= took * 2, \
            "README says %s took %d min; the last full run (build/suite-times) took %d min" % (
                what, said // 60, took // 60)


def _words_after(text, var):
    m = re.search(r'^%s="([^"]*)"' % var, text, re.M)
    assert m, "quickstart has no %s=\"...\"" % var
    return set(m.group(1).split())


def test_tests_readme_by_hand_install_list_is_what_configure_and_quickstart_need():
    """tests/README.md's `apt-get install` lines under "Building by hand"
    name every package quickstart installs (PKGS, DEB_PKGS) and every one
    configure.ac asks for, and nothing else."""
    text = read("tests/README.md")
    m = re.search(r"^## Building by hand\n.*?^```sh\n(.*?)^```$", text, re.M | re.S)
    assert m, "tests/README.md has no '## Building by hand' section with a ```sh block"
    listed = set()
    for cmd in re.findall(r"^apt-get install ((?:.*\\\n)*.*)$", m.group(1), re.M):
        listed |= set(cmd.replace("\\\n", " ").split())
    assert listed, "no apt-get install line under 'Building by hand'"
    quickstart = read("quickstart")
    # Node.js comes with npm when quickstart finds no npm (js_deps).
    need = _words_after(quickstart, "PKGS") | _words_after(quickstart, "DEB_PKGS") | \
        {"nodejs", "npm"}
    configure = set(re.findall(r"apt-get install ([a-z0-9][a-z0-9.+-]*)", read("configure.ac")))
    assert configure, "configure.ac names no package to apt-get install"
    assert configure <= _words_after(quickstart, "PKGS"), \
        "configure.ac asks for packages quickstart's PKGS lacks: %s" % sorted(
            configure - _words_after(quickstart, "PKGS"))
    assert need - listed == set(), \
        "tests/README.md's by-hand install lacks %s" % sorted(need - listed)
    assert listed - need == set(), \
        "tests/README.md's by-hand install names %s, which quickstart does not install" % sorted(
            listed - need)
