/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Configuration values: the text of one scalar -> a number, or a yes/no
 * on whether it is well formed (sizes, durations, integers, decimals,
 * addresses, URL ports, names, keys, paths).
 *
 * The bottom layer of the configuration parser: these functions see only
 * strings, never the YAML document, and report nothing; the callers say
 * what was wrong and where. They call nothing but the C library.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/socket.h>

#include "config_int.h"

/* ---- numbers, sizes, durations ---------------------------------------- */

static const char *
skip_ws(const char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	return s;
}

int
sl_parse_size(const char *s, uint64_t *out)
{
	static const struct { const char *sfx; uint64_t mul; } units[] = {
		{ "B", 1 }, { "KiB", KIB }, { "MiB", MIB }, { "GiB", GIB },
		{ "", 1 }, { NULL, 0 }
	};
	const char *p = skip_ws(s), *u;
	uint64_t v = 0;
	size_t i;

	if (!isdigit((unsigned char)*p))
		return -1;
	while (isdigit((unsigned char)*p)) {
		if (v > (UINT64_MAX - 9) / 10)
			return -1;
		v = v * 10 + (uint64_t)(*p++ - '0');
	}
	u = skip_ws(p);
	for (i = 0; units[i].sfx != NULL; i++) {
		size_t l = strlen(units[i].sfx);

		if (strncmp(u, units[i].sfx, l) == 0 && *skip_ws(u + l) == '\0') {
			if (v != 0 && units[i].mul > UINT64_MAX / v)
				return -1;
			*out = v * units[i].mul;
			return 0;
		}
	}
	return -1;
}

int
sl_parse_duration_ms(const char *s, uint64_t *out_ms)
{
	static const struct { const char *sfx; uint64_t ms; } units[] = {
		{ "ms", 1 }, { "s", SEC }, { "m", MIN }, { "h", HOUR }, { NULL, 0 }
	};
	const char *p = skip_ws(s), *u;
	uint64_t whole = 0, frac = 0, fscale = 1;
	size_t i;

	if (!isdigit((unsigned char)*p))
		return -1;
	while (isdigit((unsigned char)*p)) {
		if (whole > (UINT64_MAX - 9) / 10)
			return -1;
		whole = whole * 10 + (uint64_t)(*p++ - '0');
	}
	if (*p == '.') {
		p++;
		if (!isdigit((unsigned char)*p))
			return -1;
		while (isdigit((unsigned char)*p)) {
			if (fscale < 1000000000ULL) {
				frac = frac * 10 + (uint64_t)(*p - '0');
				fscale *= 10;
			}
			p++;
		}
	}
	u = skip_ws(p);
	for (i = 0; units[i].sfx != NULL; i++) {
		size_t l = strlen(units[i].sfx);

		if (strncmp(u, units[i].sfx, l) == 0 && *skip_ws(u + l) == '\0') {
			uint64_t m = units[i].ms, base, add;

			/* Bounded by INT64_MAX ms, as the size parser's peers. */
			if (whole > (uint64_t)INT64_MAX / m)
				return -1;
			base = whole * m;
			add = frac * m / fscale;   /* frac < 1e9, m <= 3.6e6: fits */
			if (base > (uint64_t)INT64_MAX - add)
				return -1;
			*out_ms = base + add;
			return 0;
		}
	}
	return -1;
}

int
cfg_parse_int(const char *s, int64_t *out)
{
	char *end;
	long long v;

	if (*s == '\0' || isspace((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return -1;
	*out = v;
	return 0;
}

/*
 * "1.5" -> 150: digits, optionally '.' and one or two more digits; no
 * sign, no exponent, no locale. Returns 0, or -1 if s is not that or is
 * over 10^9 hundredths.
 */
int
cfg_parse_hundredths(const char *s, int64_t *out)
{
	int64_t v = 0;
	int nd = 0, nf = 0;

	for (; *s >= '0' && *s <= '9'; s++, nd++) {
		v = v * 10 + (*s - '0');
		if (v > 10000000)
			return -1;
	}
	v *= 100;
	if (*s == '.') {
		for (s++; *s >= '0' && *s <= '9'; s++, nf++) {
			if (nf == 2)
				return -1;
			v += (*s - '0') * (nf == 0 ? 10 : 1);
		}
		if (nf == 0)
			return -1;
	}
	if (*s != '\0' || nd == 0)
		return -1;
	*out = v;
	return 0;
}

/* ---- addresses -------------------------------------------------------- */

/* host:port or [v6]:port with a numeric port 1-65535. */
int
cfg_valid_addr(const char *s)
{
	const char *colon;
	int64_t port;
	char host[64];
	unsigned char a[16];
	size_t hl;

	if (s[0] == '[') {
		const char *rb = strchr(s, ']');

		if (rb == NULL || rb == s + 1 || rb[1] != ':')
			return 0;
		colon = rb + 1;
		hl = (size_t)(rb - s - 1);
		if (hl >= sizeof(host))
			return 0;
		memcpy(host, s + 1, hl);
		host[hl] = '\0';
		if (inet_pton(AF_INET6, host, a) != 1)
			return 0;
	} else {
		colon = strrchr(s, ':');
		if (colon == NULL || colon == s || memchr(s, ':', (size_t)(colon - s)))
			return 0;
		/*
		 * Digits and dots are an IPv4 address, never a name: one that
		 * does not parse (999.1.1.1) would pass -t and fail at start.
		 * inet_aton, as getaddrinfo reads them: "127.1" and "0" pass.
		 */
		hl = (size_t)(colon - s);
		if (strspn(s, "0123456789.") == hl) {
			struct in_addr in4;

			if (hl >= sizeof(host))
				return 0;
			memcpy(host, s, hl);
			host[hl] = '\0';
			if (inet_aton(host, &in4) == 0)
				return 0;
		}
	}
	/* Digits only: strtoll would take "+8080" and " 8080". */
	if (colon[1] == '\0' || strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
	    cfg_parse_int(colon + 1, &port) == -1 || port < 1 || port > 65535)
		return 0;
	return 1;
}

/*
 * The authority of a URL (n bytes, no user info): "host", "host:PORT",
 * "[v6]" or "[v6]:PORT", PORT decimal 1..65535. A typo here would otherwise
 * pass -t and turn every request into a 502. 0 if valid, else -1.
 */
int
cfg_check_url_port(const char *a, size_t n)
{
	const char *end = a + n, *p;
	long port = 0;

	if (*a == '[') {
		p = memchr(a, ']', n);
		if (p == NULL || p == a + 1)
			return -1;
		p++;
	} else {
		p = memchr(a, ':', n);
		if (p == NULL)
			p = end;
	}
	if (p == end)
		return 0;
	if (*p != ':' || ++p == end)
		return -1;
	for (; p < end; p++) {
		if (*p < '0' || *p > '9' || (port = port * 10 + (*p - '0')) > 65535)
			return -1;
	}
	return port == 0 ? -1 : 0;
}

/*
 * "unix:/path", "IP:port" or "[v6]:port" with a numeric address: hiredis
 * 0.14 resolves a host name with a blocking getaddrinfo() inside the loop.
 */
int
cfg_valid_redis_addr(const char *s)
{
	char host[64];
	const char *colon;
	unsigned char bin[16];
	size_t n;

	if (strncmp(s, "unix:", 5) == 0)
		return s[5] == '/' && strlen(s + 5) < 100;
	if (!cfg_valid_addr(s))
		return 0;
	colon = strrchr(s, ':');
	if (s[0] == '[') {
		n = (size_t)(colon - s) - 2;
		if (n >= sizeof(host))
			return 0;
		memcpy(host, s + 1, n);
		host[n] = '\0';
		return inet_pton(AF_INET6, host, bin) == 1;
	}
	n = (size_t)(colon - s);
	if (n >= sizeof(host))
		return 0;
	memcpy(host, s, n);
	host[n] = '\0';
	return inet_pton(AF_INET, host, bin) == 1;
}

/* ---- names, keys, paths, words ---------------------------------------- */

int
cfg_has_control(const char *s)
{
	for (; *s != '\0'; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return 1;
	return 0;
}

/* A node name goes into lease members "NODE:EPOCH:ID": no ':' in it. */
int
cfg_valid_node_name(const char *s)
{
	size_t n = strlen(s), i;

	if (n == 0 || n > 64)
		return 0;
	for (i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '_' &&
		    s[i] != '-')
			return 0;
	return 1;
}

/*
 * A key a client can present as "Authorization: Bearer KEY": visible
 * ASCII or UTF-8 (libyaml has checked the encoding), no space, no control
 * character, no DEL.
 */
int
cfg_valid_api_key(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	if (*p == '\0')
		return 0;
	for (; *p != '\0'; p++)
		if (*p < 0x21 || *p == 0x7f)
			return 0;
	return 1;
}

/* A probe path goes on a request line: '/' first, no space or control. */
int
cfg_valid_probe_path(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	if (*p != '/')
		return 0;
	for (; *p != '\0'; p++)
		if (*p < 0x21 || *p == 0x7f)
			return 0;
	return 1;
}

const char *
sl_redis_down_name(int mode)
{
	static const char *const names[] = { "local_share", "closed", "local_full" };

	return mode >= 0 && mode <= SL_DOWN_LOCAL_FULL ? names[mode] : "?";
}
