#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Run the libFuzzer targets for a bounded time each; usable from CI.
#
#   tests/fuzz/run.sh [SECONDS] [BUILD_DIR]
#
# SECONDS    per target, default 60.
# BUILD_DIR  default build-fuzz under the source tree (git-ignored). When it
#            has no Makefile it is configured there, out of tree, with
#            --enable-fuzzing CC=clang (CC overrides); the targets are then
#            made (a no-op when current). A directory holding only prebuilt
#            tests/fuzz/fuzz_* binaries is used as it is.
#
# First every file in tests/fuzz/crashes/ (named <target>-<what>) is replayed
# against its target: these are findings pinned as regression checks, and
# each must now pass. Then each target runs on a fresh copy of its committed
# corpus (tests/fuzz/corpus/<target>/) with its dictionary, if any. Output
# goes to BUILD_DIR/fuzz-out/<target>/ (log, grown corpus, crash artifacts).
# Prints a table and exits non-zero if any replay or target failed.
#
# SL_FUZZ_ALLOW=name,name lets named invariants pass (see tests/fuzz/fuzz.h);
# FUZZ_TARGETS="fuzz_request ..." runs a subset; FUZZ_FLAGS adds libFuzzer
# flags (e.g. -jobs=2).
set -euo pipefail

secs=${1:-60}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${2:-$src/build-fuzz}
targets=${FUZZ_TARGETS:-fuzz_request fuzz_config fuzz_upstream fuzz_values fuzz_usage fuzz_metrics fuzz_model fuzz_h2 fuzz_upframe}

case $secs in
'' | *[!0-9]*) echo "usage: $0 [SECONDS] [BUILD_DIR]" >&2; exit 2 ;;
esac

# ---- build ----
have_all=1
for t in $targets; do
	[ -x "$build/tests/fuzz/$t" ] || have_all=0
done
if [ ! -f "$build/Makefile" ] && [ $have_all = 0 ]; then
	if [ ! -x "$src/configure" ]; then
		(cd "$src" && ./autogen.sh)
	fi
	mkdir -p "$build"
	echo "== configuring $build (--enable-fuzzing CC=${CC:-clang})"
	(cd "$build" && "$src/configure" -q --enable-fuzzing CC="${CC:-clang}")
fi
if [ -f "$build/Makefile" ]; then
	goals=()
	for t in $targets; do
		goals+=("tests/fuzz/$t")
	done
	make -C "$build" -s -j"$(nproc 2>/dev/null || echo 2)" "${goals[@]}"
fi
for t in $targets; do
	if [ ! -x "$build/tests/fuzz/$t" ]; then
		echo "$build/tests/fuzz/$t missing (configure with --enable-fuzzing CC=clang?)" >&2
		exit 2
	fi
done

failed=0
npass=0
nfail=0
out=$build/fuzz-out
mkdir -p "$out"

# ---- replay pinned findings ----
shopt -s nullglob
crashes=("$here"/crashes/*)
if [ ${#crashes[@]} -gt 0 ]; then
	echo "== replaying ${#crashes[@]} file(s) from tests/fuzz/crashes"
	for f in "${crashes[@]}"; do
		name=$(basename "$f")
		t=${name%%-*}
		case " $targets " in
		*" $t "*) ;;
		*) continue ;;
		esac
		if "$build/tests/fuzz/$t" -runs=1 "$f" >"$out/replay-$name.log" 2>&1; then
			printf '   %-50s ok\n' "$name"
			npass=$((npass + 1))
		else
			printf '   %-50s FAILS (see %s)\n' "$name" "$out/replay-$name.log"
			grep -m1 -E "invariant|ERROR: (Address|Leak|libFuzzer)|runtime error" \
			    "$out/replay-$name.log" | sed 's/^/      /' || true
			failed=1
			nfail=$((nfail + 1))
		fi
	done
fi

# ---- fuzz ----
final_stat() {   # final_stat NAME LOG: value of libFuzzer's final "stat::NAME: V"
	sed -n "s/^stat::$1: *//p" "$2" | tail -1
}

rows=()
for t in $targets; do
	dir=$out/$t
	rm -rf "$dir"
	mkdir -p "$dir/corpus"
	if [ -d "$here/corpus/$t" ]; then
		cp "$here/corpus/$t"/* "$dir/corpus/" 2>/dev/null || true
	fi
	dict=()
	if [ -f "$here/$t.dict" ]; then
		dict=(-dict="$here/$t.dict")
	fi
	echo "== $t: ${secs}s"
	rc=0
	# shellcheck disable=SC2086
	"$build/tests/fuzz/$t" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
	    -print_final_stats=1 -artifact_prefix="$dir/" "${dict[@]}" ${FUZZ_FLAGS:-} \
	    "$dir/corpus" >"$dir/log" 2>&1 || rc=$?
	execs=$(final_stat number_of_executed_units "$dir/log")
	rate=$(final_stat average_exec_per_sec "$dir/log")
	last=$(grep -E '^#[0-9]+' "$dir/log" | tail -1 || true)
	if [ -z "$execs" ]; then
		execs=$(printf '%s\n' "$last" | sed -n 's/^#\([0-9]*\).*/\1/p')
	fi
	cov=$(printf '%s\n' "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
	ft=$(printf '%s\n' "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
	corp=$(printf '%s\n' "$last" | sed -n 's/.* corp: \([^ ]*\).*/\1/p')
	if [ $rc -eq 0 ]; then
		result=ok
	else
		failed=1
		art=$(find "$dir" -maxdepth 1 \( -name 'crash-*' -o -name 'leak-*' -o \
		    -name 'timeout-*' -o -name 'oom-*' \) -print -quit)
		result="FAILED rc=$rc ${art:-see $dir/log}"
		grep -m1 -E "invariant|ERROR: (Address|Leak|libFuzzer)|runtime error" "$dir/log" \
		    | sed 's/^/   /' || true
	fi
	rows+=("$(printf '%-14s | %12s | %8s | %6s | %6s | %-10s | %s' "$t" "${execs:-?}" \
	    "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result")")
done

echo
printf '%-14s | %12s | %8s | %6s | %6s | %-10s | %s\n' target execs exec/s cov ft corpus result
printf '%s\n' "---------------+--------------+----------+--------+--------+------------+-------"
for r in "${rows[@]}"; do
	printf '%s\n' "$r"
	case "$r" in
	*"| ok") npass=$((npass + 1)) ;;
	*) nfail=$((nfail + 1)) ;;
	esac
done
echo
echo "fuzz: $npass passed, $nfail failed"
exit $failed
