# SPDX-License-Identifier: BSD-2-Clause
"""The house by role: the modules' #include graph has no circle, every file
of src/ stays under 1,500 lines and every function under 150, but those
listed below with the size they may not pass (a list that only shrinks, as
rooms are split). Reads files only: no build, no process.

A module is a .c of src/ with the header named after it (include/sl_X.h
or src/X.h for src/X.c), or a family of them by role (config_*.c, shm_*.c); a
header with no .c of its name is a module of its own (shared definitions:
sl_worker_state.h's struct sl_worker). Module A needs module B when A's .c
or header includes B's header."""

import glob
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))

FILE_LINES = 1500
FUNCTION_LINES = 150

# Files not yet split, with the lines they have now: they may shrink, not
# grow. (Generated tables and the console's assets are not src/*.c.)
BIG_FILES = {
}

# Functions over FUNCTION_LINES, with their length now. The usage
# scanner's three loops stay whole: cutting sl_usage_scan_feed cost 2-6 %
# per byte in bench/scan-micro (100-byte reads).
BIG_FUNCTIONS = {
    ("src/usage_scan.c", "lex_fast"): 325,
    ("src/usage_scan.c", "sl_usage_scan_feed"): 185,
    ("src/usage_scan.c", "lex_run"): 175,
}


def srcdir():
    return os.environ.get("SLUICE_SRCDIR") or os.path.dirname(os.path.dirname(HERE))


def read(rel):
    with open(os.path.join(srcdir(), rel), encoding="utf-8") as f:
        return f.read()


def sources():
    found = glob.glob(os.path.join(srcdir(), "src", "*.[ch]"))
    found += glob.glob(os.path.join(srcdir(), "include", "*.h"))
    rels = sorted(os.path.relpath(p, srcdir()) for p in found)
    return [r for r in rels if not r.endswith("_assets.h")]


# Modules whose rooms are several files by role (config_keys.c, ...):
# one module, the files' names starting with its name and "_".
FAMILIES = ("config", "usage", "shm", "model", "cluster", "exchange")


def module_of(rel):
    base = os.path.basename(rel)
    stem = base[:-2]
    if base.endswith(".h") and stem.startswith("sl_"):
        stem = stem[3:]
    for family in FAMILIES:
        if stem.startswith(family + "_"):
            return family
    return stem


def include_graph():
    edges = {}
    for rel in sources():
        a = module_of(rel)
        edges.setdefault(a, set())
        for inc in re.findall(r'^#include "([^"]+)"', read(rel), re.M):
            if inc == "config.h" or inc.endswith("_assets.h"):
                continue
            b = module_of(inc)
            if b != a:
                edges[a].add(b)
    return edges


def circles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_modules_include_graph_has_no_circle():
    edges = include_graph()
    assert "relay" in edges or "exchange" in edges, sorted(edges)   # the scan works
    found = circles(edges)
    detail = ["%s: %s" % (c, {m: sorted(edges[m] & set(c)) for m in c}) for c in found]
    assert found == [], "\n".join(detail)


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_file_of_src_over_1500_lines_but_those_not_yet_split():
    over = {}
    for rel in sources():
        n = read(rel).count("\n")
        cap = BIG_FILES.get(rel, FILE_LINES)
        if n > cap:
            over[rel] = (n, cap)
    assert over == {}, over
    # The list shrinks: a file split below the bar leaves it.
    stale = [rel for rel in BIG_FILES
             if not os.path.exists(os.path.join(srcdir(), rel))
             or read(rel).count("\n") <= FILE_LINES]
    assert stale == [], "under %d lines now, drop from BIG_FILES: %r" % (FILE_LINES, stale)


FUNC_RE = re.compile(r"^([a-z_][a-z0-9_]*)\([^;]*?\)\n\{\n(.*?)^\}\n", re.M | re.S)


def functions(text):
    """(name, lines) of each function defined at the left margin, BSD style:
    the name at the start of its line, the body's braces at the margin."""
    for m in FUNC_RE.finditer(text):
        yield m.group(1), m.group(0).count("\n")


def test_the_function_scan_sees_functions():
    text = "static int\nf(int a,\n    int b)\n{\n\treturn a;\n}\n\nvoid\ng(void)\n{\n}\n"
    assert list(functions(text)) == [("f", 5), ("g", 3)]


def test_no_function_over_150_lines_but_the_hot_lexers():
    seen, over = 0, {}
    for rel in sources():
        if not rel.endswith(".c"):
            continue
        for name, n in functions(read(rel)):
            seen += 1
            cap = BIG_FUNCTIONS.get((rel, name), FUNCTION_LINES)
            if n > cap:
                over["%s:%s" % (rel, name)] = (n, cap)
    assert seen > 500, seen   # the scan works
    assert over == {}, over


def test_the_exchange_reaches_its_framings_only_through_their_function_table():
    """h1.c and h2.c call the exchange (sl_exchange.h); the exchange calls
    neither by name, and its struct holds no socket, TLS or HTTP/2 state."""
    rooms = [r for r in sources() if os.path.basename(r).startswith("exchange")]
    assert "src/exchange.c" in rooms and "src/exchange_int.h" in rooms, rooms
    named = {}
    for rel in rooms:
        text = read(rel)
        found = sorted(set(re.findall(r'\bsl_h[12]_\w+|"sl_h[12]\.h"|"sl_tls\.h"|'
                                      r'\bnghttp2_\w+|\bsl_tls_\w+', text)))
        if found:
            named[rel] = found
    assert named == {}, named
    struct = re.search(r"^struct sl_conn \{\n(.*?)^\};", read("src/exchange_int.h"),
                       re.M | re.S).group(1)
    fields = re.findall(r"^\t[^/*\n][^;]*?\b(\w+)(?:\[[^\]]*\])?;", struct, re.M)
    assert len(fields) > 50, fields   # the scan works
    framing_state = [f for f in fields
                     if re.match(r"(ssl|tls_|xin|x_|h2|in$|in_len|nreq|rio|wio|reading|hup_)", f)]
    assert framing_state == [], framing_state
    for framing in ("src/h1.c", "src/h2.c"):
        assert '#include "sl_exchange.h"' in read(framing), framing


# The exchange's rooms, top floor first: each calls only those after it.
EXCHANGE_FLOORS = ["src/exchange_framing.c", "src/exchange.c", "src/exchange_response.c",
                   "src/exchange_tries.c", "src/exchange_core.c"]


def calls_up(floors):
    """(caller, name, callee) for each function a room uses from a room above it."""
    text = {f: re.sub(r"/\*.*?\*/", "", read(f), flags=re.S) for f in floors}
    defined = {}
    for f in floors:
        for name, _ in functions(text[f]):
            defined.setdefault(name, f)
    return sorted((f, name, g) for f in floors for name, g in defined.items()
                  if floors.index(f) > floors.index(g)
                  and re.search(r"\b%s\b" % name, text[f]))


def test_the_exchanges_rooms_call_one_way_down():
    rooms = sorted(r for r in sources()
                   if re.match(r"src/exchange.*\.c$", r))
    assert rooms == sorted(EXCHANGE_FLOORS), rooms   # a new room takes a floor
    assert len(list(functions(read("src/exchange.c")))) > 20   # the scan works
    assert calls_up(EXCHANGE_FLOORS) == []
    # ... and it would see one: the core's set_state is called from above.
    assert calls_up(["src/exchange_core.c", "src/exchange.c"]) != []
