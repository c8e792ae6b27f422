/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Shared by the libFuzzer targets in tests/fuzz (one translation unit each,
 * so the few non-static definitions here are defined once per program).
 *
 * A target checks invariants with fz_check(): when one fails it names the
 * invariant on stderr and traps, and libFuzzer saves the input. Findings
 * already reported (and pinned in tests/fuzz/crashes/) can be let through
 * with SL_FUZZ_ALLOW=name,name so a campaign goes on past them; CI leaves
 * it unset (it is for findings still open in tests/fuzz/open/).
 */
#ifndef SL_FUZZ_H
#define SL_FUZZ_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
const char *__ubsan_default_options(void);

/*
 * UBSan only prints by default; halting turns undefined behaviour into a
 * crash that libFuzzer records. UBSAN_OPTIONS still overrides this.
 */
const char *
__ubsan_default_options(void)
{
	return "halt_on_error=1:print_stacktrace=1";
}

/* 1 if name is listed in SL_FUZZ_ALLOW (comma separated). */
static inline int
fz_allowed(const char *name)
{
	static const char *allow;
	static int init;
	const char *p;
	size_t nl = strlen(name);

	if (!init) {
		allow = getenv("SL_FUZZ_ALLOW");
		init = 1;
	}
	for (p = allow; p != NULL; p = strchr(p, ',')) {
		if (*p == ',')
			p++;
		if (strncmp(p, name, nl) == 0 && (p[nl] == ',' || p[nl] == '\0'))
			return 1;
	}
	return 0;
}

static inline void fz_check(int ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Check one invariant; name is short and stable (it is what SL_FUZZ_ALLOW lists). */
static inline void
fz_check(int ok, const char *name, const char *fmt, ...)
{
	va_list ap;

	if (ok || fz_allowed(name))
		return;
	fprintf(stderr, "\n*** invariant '%s' violated: ", name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	__builtin_trap();
}

/* A growable byte string; the fuzzer's own bookkeeping, freed by the caller. */
struct fz_buf {
	unsigned char *p;
	size_t len, cap;
};

static inline void
fz_add(struct fz_buf *b, const void *p, size_t n)
{
	if (b->len + n > b->cap) {
		size_t ncap = b->cap ? b->cap : 256;
		unsigned char *np;

		while (ncap < b->len + n)
			ncap *= 2;
		if ((np = realloc(b->p, ncap)) == NULL)
			abort();
		b->p = np;
		b->cap = ncap;
	}
	if (n > 0)
		memcpy(b->p + b->len, p, n);
	b->len += n;
}

static inline void fz_addf(struct fz_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static inline void
fz_addf(struct fz_buf *b, const char *fmt, ...)
{
	char tmp[256];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n > 0)
		fz_add(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

static inline void
fz_free(struct fz_buf *b)
{
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
}

/* Print len bytes escaped, for the message of a failed check. */
static inline void
fz_dump(const char *label, const void *p, size_t len)
{
	const unsigned char *s = p;
	size_t i;

	fprintf(stderr, "%s (%zu bytes): \"", label, len);
	for (i = 0; i < len && i < 512; i++) {
		if (s[i] >= 0x20 && s[i] < 0x7f && s[i] != '"' && s[i] != '\\')
			fputc(s[i], stderr);
		else
			fprintf(stderr, "\\x%02x", s[i]);
	}
	fprintf(stderr, "%s\"\n", i < len ? "..." : "");
}

/* A small deterministic generator, seeded from input bytes. */
static inline uint32_t
fz_rand(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

/* RFC 9110 token characters. */
static inline int
fz_tchar(unsigned char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
	    (ch >= '0' && ch <= '9') || (ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

#endif
