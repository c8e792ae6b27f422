# SPDX-License-Identifier: BSD-2-Clause
"""The license (issue 31): LICENSE is the BSD-2-Clause text, every source
file the project wrote says so in an SPDX line, debian/copyright names it in
machine-readable form (DEP-5) with the same text, and README says it. Reads
files only: no build, no process."""

import glob
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))

SPDX = "SPDX-License-Identifier: BSD-2-Clause"

# SPDX's BSD-2-Clause text after its copyright line, words only.
TERMS = """Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:
1. Redistributions of source code must retain the above copyright notice, this
list of conditions and the following disclaimer.
2. Redistributions in binary form must reproduce the above copyright notice,
this list of conditions and the following disclaimer in the documentation
and/or other materials provided with the distribution.
THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS" AND
ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE IMPLIED
WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE FOR
ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL DAMAGES
(INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES;
LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON
ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT
(INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE OF THIS
SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE."""


def srcdir():
    return os.environ.get("SLUICE_SRCDIR") or os.path.dirname(os.path.dirname(HERE))


def read(rel):
    with open(os.path.join(srcdir(), rel), encoding="utf-8") as f:
        return f.read()


def words(text):
    return text.split()


def test_license_is_bsd_2_clause_with_the_projects_copyright_line():
    text = read("LICENSE")
    first, _, rest = text.partition("\n")
    assert re.fullmatch(r"Copyright \(c\) 20\d\d(-20\d\d)? The sluice authors", first), first
    assert words(rest) == words(TERMS), "LICENSE is not SPDX's BSD-2-Clause text"


def _sources(patterns):
    found = []
    for pattern in patterns:
        found += glob.glob(os.path.join(srcdir(), pattern))
    return sorted(os.path.relpath(p, srcdir()) for p in found if os.path.isfile(p))


def test_every_source_file_starts_with_the_spdx_line():
    # C: the first line. Scripts: the first line, or the second after #!.
    c = _sources(["src/*.c", "include/*.h", "bench/*.c", "tests/unit/*.c", "tests/ref/*.[ch]",
                  "tests/fuzz/*.[ch]", "src/console.css"])
    assert "src/exchange.c" in c and "include/sl_h1.h" in c, c
    wrong = [p for p in c if read(p).split("\n", 1)[0] != "/* %s */" % SPDX]
    scripts = {p: "# " for p in _sources(["tests/run.py", "tests/e2e/*.py", "tests/fuzz/run.sh",
                                          "quickstart", "autogen.sh", ".ci/run"])}
    scripts.update({p: "// " for p in _sources(["src/console.js", "tests/js/*.mjs",
                                                "tests/js/*.cjs"])})
    for p, lead in scripts.items():
        lines = read(p).split("\n", 2)
        line = lines[1] if lines[0].startswith("#!") else lines[0]
        if line != lead + SPDX:
            wrong.append(p)
    # The page: right after <!doctype html>, which must stay first.
    if read("src/console.html").split("\n", 2)[:2] != [
            "<!doctype html>", "<!-- %s -->" % SPDX]:
        wrong.append("src/console.html")
    assert wrong == [], "no SPDX line (%r) at the top of: %s" % (SPDX, wrong)


def test_debian_copyright_is_machine_readable_and_names_bsd_2_clause():
    text = read("debian/copyright")
    paras = [p for p in re.split(r"\n\s*\n", text.strip("\n"))]
    head = paras[0].split("\n")
    assert head[0] == \
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/", head
    assert "Upstream-Name: sluice" in head, head

    def fields(p):
        out, key = {}, None
        for line in p.split("\n"):
            if line.startswith((" ", "\t")):
                out[key] += "\n" + line
            else:
                key, _, value = line.partition(":")
                out[key] = value.strip()
        return out
    files = [fields(p) for p in paras[1:] if p.startswith("Files:")]
    assert [f["Files"] for f in files] == ["*"], files
    assert files[0]["License"] == "BSD-2-Clause", files[0]
    assert re.fullmatch(r"20\d\d(-20\d\d)? The sluice authors", files[0]["Copyright"]), files[0]
    standalone = [fields(p) for p in paras[1:] if p.startswith("License:")]
    assert len(standalone) == 1, "want one standalone License paragraph: %r" % standalone
    name, _, body = standalone[0]["License"].partition("\n")
    assert name == "BSD-2-Clause", name
    body = "\n".join(line[1:] for line in body.split("\n"))
    assert [w for w in words(body) if w != "."] == words(TERMS), \
        "debian/copyright's BSD-2-Clause text is not SPDX's"
    assert "all rights reserved" not in text.lower()


def test_readme_names_the_license_and_the_tarball_carries_it():
    readme = read("README.md")
    m = re.search(r"^## License\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    assert m, "README.md has no '## License' section"
    assert "BSD-2-Clause" in m.group(1) and "(LICENSE)" in m.group(1), m.group(1)
    am = read("Makefile.am")
    assert re.search(r"^dist_doc_DATA = LICENSE$", am, re.M), \
        "Makefile.am does not install LICENSE in $(docdir)"
    assert re.search(r"^EXTRA_DIST = .*\bLICENSE\b", am, re.M), \
        "Makefile.am's EXTRA_DIST lacks LICENSE"
