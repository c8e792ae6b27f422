/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Docs and code cannot drift: the man pages are checked against the tables
 * and contracts the code and the issues define.
 *
 *   man/sluice.yaml.5  every row of sl_config_keys() has an entry
 *                      ".It Ic PATH" ("*" written as NAME) in the KEYS
 *                      section that states its type, default, range and
 *                      whether SIGHUP applies it exactly as the table does;
 *                      no entry names a key the parser does not know; the
 *                      sample in EXAMPLES is a valid configuration.
 *   man/sluice.8       every metric, signal, error code and access log
 *                      "end" value of the contract is documented in its
 *                      section; so is every metric family the code can
 *                      emit (each "sluice_..." name in a string literal of
 *                      src/ *.c) and every field sl_access_write() writes.
 *
 * The pages are read from $SLUICE_SRCDIR/man (default: ./man). Every
 * mismatch is printed, not only the first, before the test fails.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "sl_config.h"
#include "sl_reply.h"

#define YAML_PAGE "man/sluice.yaml.5"
#define MAIN_PAGE "man/sluice.8"

/* ---- helpers ----------------------------------------------------------- */

/* Read $SLUICE_SRCDIR/rel (or ./rel) whole; fails the test if it cannot. */
static char *
read_page(const char *rel)
{
	const char *dir = getenv("SLUICE_SRCDIR");
	char path[4096];
	FILE *fp;
	char *buf = NULL, *nb;
	size_t len = 0, cap = 0, n;

	if (dir == NULL || dir[0] == '\0')
		dir = ".";
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, rel) >=
	    sizeof(path))
		fail_msg("path too long: %s/%s", dir, rel);
	fp = fopen(path, "r");
	if (fp == NULL)
		fail_msg("cannot open %s: %s (set SLUICE_SRCDIR to the source "
		    "tree)", path, strerror(errno));
	for (;;) {
		if (cap - len < 4096) {
			cap = cap ? cap * 2 : 65536;
			nb = realloc(buf, cap + 1);
			if (nb == NULL) {
				free(buf);
				fclose(fp);
				fail_msg("out of memory reading %s", path);
			}
			buf = nb;
		}
		n = fread(buf + len, 1, cap - len, fp);
		len += n;
		if (n == 0)
			break;
	}
	if (ferror(fp)) {
		free(buf);
		fclose(fp);
		fail_msg("cannot read %s", path);
	}
	fclose(fp);
	buf[len] = '\0';
	if (memchr(buf, '\0', len) != NULL) {
		free(buf);
		fail_msg("%s contains a NUL byte", path);
	}
	return buf;
}

/*
 * The body of section ".Sh NAME" (NAME in full, e.g. "ERROR RESPONSES"):
 * a copy of the text after the header line up to the next ".Sh".
 * NULL if the page has no such section.
 */
static char *
section(const char *page, const char *name)
{
	char hdr[128];
	const char *s, *e;
	size_t hl;
	char *out;

	hl = (size_t)snprintf(hdr, sizeof(hdr), "\n.Sh %s\n", name);
	s = strstr(page, hdr);
	if (s == NULL)
		return NULL;
	s += hl;
	e = strstr(s, "\n.Sh ");
	if (e == NULL)
		e = s + strlen(s);
	out = malloc((size_t)(e - s) + 2);
	if (out == NULL)
		return NULL;
	/* Keep a leading newline so every line, the first too, follows '\n'. */
	out[0] = '\n';
	memcpy(out + 1, s, (size_t)(e - s));
	out[(size_t)(e - s) + 1] = '\0';
	return out;
}

/* Key path as the page writes it: every '*' becomes NAME. */
static void
doc_path(const char *path, char *out, size_t outlen)
{
	size_t o = 0;

	for (; *path != '\0' && o + 5 < outlen; path++) {
		if (*path == '*') {
			memcpy(out + o, "NAME", 4);
			o += 4;
		} else
			out[o++] = *path;
	}
	out[o] = '\0';
}

/*
 * Find the line ".It Ic WORD" or ".It Cm WORD" (WORD followed by the end
 * of the line or a space) in text; returns the start of the line after it,
 * or NULL.
 */
static const char *
find_item(const char *text, const char *word)
{
	static const char *const macros[] = { "\n.It Ic ", "\n.It Cm ", NULL };
	char needle[512];
	const char *p;
	size_t nl;
	int m;

	for (m = 0; macros[m] != NULL; m++) {
		nl = (size_t)snprintf(needle, sizeof(needle), "%s%s", macros[m],
		    word);
		if (nl >= sizeof(needle))
			return NULL;
		for (p = strstr(text, needle); p != NULL;
		    p = strstr(p + 1, needle)) {
			const char *after = p + nl;

			if (*after == '\n')
				return after + 1;
			if (*after == ' ') {
				after = strchr(after, '\n');
				return after != NULL ? after + 1 : after;
			}
		}
	}
	return NULL;
}

/* A copy of an item's text: from body up to the next key item or (sub)section. */
static char *
item_text(const char *body)
{
	static const char *const ends[] = {
		"\n.It Ic ", "\n.It Cm ", "\n.Ss ", "\n.Sh ", NULL
	};
	const char *e = body + strlen(body), *q;
	char *out;
	int i;

	for (i = 0; ends[i] != NULL; i++)
		if ((q = strstr(body, ends[i])) != NULL && q < e)
			e = q;
	out = malloc((size_t)(e - body) + 1);
	if (out == NULL)
		return NULL;
	memcpy(out, body, (size_t)(e - body));
	out[e - body] = '\0';
	return out;
}

static const char *
type_word(enum sl_key_type t)
{
	switch (t) {
	case SL_KEY_STRING:
		return "string";
	case SL_KEY_ADDR:
		return "address";
	case SL_KEY_SIZE:
		return "size";
	case SL_KEY_DURATION:
		return "duration";
	case SL_KEY_INT:
		return "integer";
	case SL_KEY_WORKERS:
		return "integer or auto";
	case SL_KEY_LOGLEVEL:
		return "log level";
	case SL_KEY_LOGDEST:
		return "log destination";
	case SL_KEY_MAP:
		return "mapping";
	case SL_KEY_LIST:
		return "list of strings";
	case SL_KEY_LIST_OF_MAPS:
		return "list of mappings";
	case SL_KEY_REDIS_DOWN:
		return "string";
	case SL_KEY_BOOL:
		return "boolean";
	case SL_KEY_DECIMAL:
		return "decimal";
	}
	return "?";
}

/* Count a problem and print it; the test fails at the end if any. */
static void problem(int *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
problem(int *n, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("[  DRIFT   ] ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	(*n)++;
}

/* Expect "LABEL VALUE;" in an item; report a problem otherwise. */
static void
expect_field(int *n, const char *dpath, const char *item, const char *label,
    const char *value)
{
	char want[512];

	snprintf(want, sizeof(want), "%s %s;", label, value);
	if (strstr(item, want) == NULL)
		problem(n, "%s: %s: entry for %s lacks \"%s\" (the key table "
		    "in src/config_keys.c says so)", YAML_PAGE, "KEYS", dpath, want);
}

/* ---- sluice.yaml(5) ---------------------------------------------------- */

/* Every key of the parser's table is documented, with what the table says. */
static void
test_every_key_documented(void **state)
{
	const struct sl_key_info *k = sl_config_keys();
	char *page = read_page(YAML_PAGE), *keys;
	int n = 0, rows = 0;

	(void)state;
	assert_non_null(k);
	keys = section(page, "KEYS");
	if (keys == NULL) {
		free(page);
		fail_msg("%s has no KEYS section", YAML_PAGE);
	}
	for (; k->path != NULL; k++) {
		char dpath[256], *item;
		const char *body;

		rows++;
		doc_path(k->path, dpath, sizeof(dpath));
		if (strstr(page, dpath) == NULL) {
			problem(&n, "%s: key %s is not mentioned", YAML_PAGE, dpath);
			continue;
		}
		if ((body = find_item(keys, dpath)) == NULL) {
			problem(&n, "%s: KEYS has no \".It Ic %s\" entry",
			    YAML_PAGE, dpath);
			continue;
		}
		if ((item = item_text(body)) == NULL)
			fail_msg("out of memory");
		expect_field(&n, dpath, item, "Type:", type_word(k->type));
		if (k->def != NULL)
			expect_field(&n, dpath, item, "default:", k->def);
		if (k->range != NULL)
			expect_field(&n, dpath, item, "range:", k->range);
		if (k->reloadable && strstr(item, "applied by a reload") == NULL)
			problem(&n, "%s: entry for %s should say \"applied by a "
			    "reload\" (reloadable in the key table)", YAML_PAGE, dpath);
		if (!k->reloadable && strstr(item, "needs a restart") == NULL)
			problem(&n, "%s: entry for %s should say \"needs a "
			    "restart\" (not reloadable in the key table)", YAML_PAGE,
			    dpath);
		if (!k->reloadable && strstr(item, "applied by a reload") != NULL)
			problem(&n, "%s: entry for %s says \"applied by a reload\" "
			    "but the key table says a restart is needed", YAML_PAGE,
			    dpath);
		free(item);
	}
	free(keys);
	free(page);
	assert_true(rows > 0);
	if (n > 0)
		fail_msg("%d mismatch(es) between %s and the key table "
		    "(src/config_keys.c cfg_keys[])", n, YAML_PAGE);
}

/* Every key the page documents is one the parser accepts. */
static void
test_no_unknown_key_documented(void **state)
{
	char *page = read_page(YAML_PAGE), *keys;
	const char *p;
	int n = 0, items = 0;

	(void)state;
	keys = section(page, "KEYS");
	if (keys == NULL) {
		free(page);
		fail_msg("%s has no KEYS section", YAML_PAGE);
	}
	for (p = strstr(keys, "\n.It Ic "); p != NULL;
	    p = strstr(p + 1, "\n.It Ic ")) {
		const struct sl_key_info *k;
		char word[256], dpath[256];
		size_t l = strcspn(p + 8, " \n");

		if (l >= sizeof(word))
			l = sizeof(word) - 1;
		memcpy(word, p + 8, l);
		word[l] = '\0';
		items++;
		for (k = sl_config_keys(); k->path != NULL; k++) {
			doc_path(k->path, dpath, sizeof(dpath));
			if (strcmp(dpath, word) == 0)
				break;
		}
		if (k->path == NULL)
			problem(&n, "%s: KEYS documents \"%s\", which is not in the "
			    "key table", YAML_PAGE, word);
	}
	free(keys);
	free(page);
	assert_true(items > 0);
	if (n > 0)
		fail_msg("%d key(s) documented but unknown to the parser", n);
}

/*
 * The first literal display of EXAMPLES is the sample configuration: once
 * the few roff escapes it may use are undone, the parser must accept it.
 */
static void
test_example_is_valid(void **state)
{
	char *page = read_page(YAML_PAGE), *ex, *yaml, *o, *sample;
	const char *s, *e, *p;
	struct sl_config *cfg = NULL;
	struct sl_errors errs = { NULL, 0 };
	size_t i;
	int rc;

	(void)state;
	ex = section(page, "EXAMPLES");
	if (ex == NULL) {
		free(page);
		fail_msg("%s has no EXAMPLES section", YAML_PAGE);
	}
	s = strstr(ex, "\n.Bd -literal");
	if (s == NULL || (s = strchr(s + 1, '\n')) == NULL)
		fail_msg("%s: EXAMPLES has no literal display", YAML_PAGE);
	s++;
	e = strstr(s, "\n.Ed");
	if (e == NULL)
		fail_msg("%s: EXAMPLES: unterminated literal display", YAML_PAGE);
	yaml = malloc((size_t)(e - s) + 2);
	if (yaml == NULL)
		fail_msg("out of memory");
	for (p = s, o = yaml; p <= e; p++) {
		if (*p != '\\') {
			*o++ = *p;
			continue;
		}
		if (p[1] == 'e') {
			*o++ = '\\';
			p++;
		} else if (p[1] == '&') {
			p++;
		} else if (strncmp(p + 1, "(dq", 3) == 0) {
			*o++ = '"';
			p += 3;
		} else
			fail_msg("%s: EXAMPLES: unexpected roff escape \"%.4s\"",
			    YAML_PAGE, p);
	}
	*o = '\0';
	/* It is the sample file "make install" puts in place, byte for byte. */
	sample = read_page("etc/sluice.yaml");
	if (strcmp(sample, yaml) != 0)
		fail_msg("%s: EXAMPLES: the sample differs from etc/sluice.yaml",
		    YAML_PAGE);
	free(sample);
	rc = sl_config_load_buffer("sluice.yaml(5) EXAMPLES", yaml, strlen(yaml),
	    &cfg, &errs);
	for (i = 0; i < errs.n; i++)
		fprintf(stderr, "[  DRIFT   ] %s\n", errs.msg[i]);
	assert_int_equal(rc, 0);
	assert_int_equal(errs.n, 0);
	assert_non_null(cfg);
	assert_true(cfg->ntenants > 0);
	sl_config_free(cfg);
	sl_errors_free(&errs);
	free(yaml);
	free(ex);
	free(page);
}

/* ---- sluice(8) --------------------------------------------------------- */

static int
is_word_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
	    (ch >= '0' && ch <= '9') || ch == '_';
}

/*
 * Does some line of text that starts with prefix hold word as a whole: right
 * after the prefix or after a space, and not followed by a letter, digit or
 * underscore ("stall" does not match "stalled")?
 */
static int
line_has(const char *text, const char *prefix, const char *word)
{
	size_t pl = strlen(prefix), wl = strlen(word);
	const char *line = text, *eol, *p;

	for (; *line != '\0'; line = *eol != '\0' ? eol + 1 : eol) {
		eol = strchr(line, '\n');
		if (eol == NULL)
			eol = line + strlen(line);
		if (strncmp(line, prefix, pl) != 0)
			continue;
		for (p = line + pl; p + wl <= eol; p++) {
			if (p != line + pl && p[-1] != ' ')
				continue;
			if (strncmp(p, word, wl) == 0 && !is_word_char(p[wl]))
				return 1;
		}
	}
	return 0;
}

/*
 * Each word must be documented in section sec of the page, on a line that
 * starts with prefix (".It Li " for a metric, ".It Dv " for a signal...).
 */
static void
expect_words(const char *page_name, const char *page, const char *sec,
    const char *prefix, const char *const *words)
{
	char *text = section(page, sec);
	int n = 0;

	if (text == NULL)
		fail_msg("%s has no %s section", page_name, sec);
	for (; *words != NULL; words++)
		if (!line_has(text, prefix, *words))
			problem(&n, "%s: %s has no \"%s...\" line naming \"%s\"",
			    page_name, sec, prefix, *words);
	free(text);
	if (n > 0)
		fail_msg("%d name(s) of the contract missing from %s, %s", n,
		    page_name, sec);
}

static void
test_metrics_documented(void **state)
{
	static const char *const metrics[] = {
		"sluice_tenant_streams", "sluice_tenant_max_streams",
		"sluice_requests_total", "sluice_rejected_total",
		"sluice_upstream_paused_streams", "sluice_stream_buffer_bytes",
		"sluice_upstream_errors_total", "sluice_workers",
		"sluice_reloads_total", "sluice_ttfb_seconds",
		"sluice_stream_duration_seconds",
		"sluice_idle_connections_closed_total",
		"sluice_replica_streams", "sluice_replica_up",
		"sluice_replica_ejected", "sluice_replica_requests_total",
		"sluice_upstream_retries_total",
		"sluice_cluster_up", "sluice_cluster_mode", "sluice_cluster_nodes",
		"sluice_cluster_leases", "sluice_cluster_rtt_seconds",
		"sluice_cluster_errors_total", "sluice_cluster_failovers_total",
		"sluice_tenant_tokens_total",
		"sluice_tenant_tokens_window", "sluice_model_requests_total",
		"sluice_model_fallbacks_total",
		"sluice_time_to_first_token_seconds",
		"sluice_time_per_output_token_seconds",
		"sluice_request_duration_seconds", NULL
	};
	static const char *const kinds[] = {
		"connect", "timeout", "reset", "bad_response", "idle", NULL
	};
	char *page = read_page(MAIN_PAGE);

	(void)state;
	expect_words(MAIN_PAGE, page, "ADMIN ENDPOINTS", ".It Li ", metrics);
	expect_words(MAIN_PAGE, page, "ADMIN ENDPOINTS", ".It Cm ", kinds);
	expect_words(MAIN_PAGE, page, "ADMIN ENDPOINTS", ".It Li ",
	    (const char *[]){ "GET /healthz", "GET /metrics", NULL });
	free(page);
}

/* ---- names derived from the code ---------------------------------------- */

struct names {
	char **v;
	size_t n;
};

static void
names_add(struct names *ns, const char *s, size_t len)
{
	size_t i;
	char **nv;

	for (i = 0; i < ns->n; i++)
		if (strlen(ns->v[i]) == len && strncmp(ns->v[i], s, len) == 0)
			return;
	nv = realloc(ns->v, (ns->n + 1) * sizeof(*nv));
	if (nv == NULL || (nv[ns->n] = strndup(s, len)) == NULL)
		fail_msg("out of memory");
	ns->v = nv;
	ns->n++;
}

static void
names_free(struct names *ns)
{
	size_t i;

	for (i = 0; i < ns->n; i++)
		free(ns->v[i]);
	free(ns->v);
}

static int
is_name_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
	    ch == '_';
}

/*
 * Every "sluice_..." word inside a string literal of C source text
 * (comments and character constants skipped, escapes honoured, so the
 * "sluice_x" of "...\nsluice_x %d" counts), as a metric family: the
 * _bucket, _sum and _count series of a histogram name their family. A word
 * ending in '_' is a name completed at run time, which this check cannot
 * follow: it is reported as a problem.
 */
static void
metric_names(const char *file, const char *src, struct names *ns, int *n)
{
	static const char *const suffixes[] = { "_bucket", "_sum", "_count" };
	const char *p = src;
	int boundary;
	size_t len, k, sl;

	while (*p != '\0') {
		if (p[0] == '/' && p[1] == '*') {
			p = strstr(p + 2, "*/");
			p = p != NULL ? p + 2 : src + strlen(src);
		} else if (p[0] == '/' && p[1] == '/') {
			p += strcspn(p, "\n");
		} else if (*p == '\'') {
			for (p++; *p != '\0' && *p != '\''; p++)
				if (*p == '\\' && p[1] != '\0')
					p++;
			if (*p != '\0')
				p++;
		} else if (*p == '"') {
			boundary = 1;
			for (p++; *p != '\0' && *p != '"';) {
				if (*p == '\\' && p[1] != '\0') {
					p += 2;
					boundary = 1;
					continue;
				}
				if (boundary && strncmp(p, "sluice_", 7) == 0) {
					for (len = 7; is_name_char(p[len]); len++)
						;
					if (p[len - 1] == '_')
						problem(n, "%s: metric name built at "
						    "run time from \"%.*s\": name "
						    "it whole so it can be checked",
						    file, (int)len, p);
					else {
						for (k = 0; k < 3; k++) {
							sl = strlen(suffixes[k]);
							if (len > sl && strncmp(p + len -
							    sl, suffixes[k], sl) == 0) {
								len -= sl;
								break;
							}
						}
						names_add(ns, p, len);
					}
					p += len;
					boundary = 0;
					continue;
				}
				boundary = !is_word_char(*p);
				p++;
			}
			if (*p != '\0')
				p++;
		} else
			p++;
	}
}

static void
test_every_metric_in_the_code_documented(void **state)
{
	const char *dir = getenv("SLUICE_SRCDIR");
	char path[4096], rel[512];
	struct names ns = { NULL, 0 };
	struct dirent *de;
	char *page, *text, *src;
	size_t i, len, files = 0;
	int n = 0;
	DIR *d;

	(void)state;
	if (dir == NULL || dir[0] == '\0')
		dir = ".";
	snprintf(path, sizeof(path), "%s/src", dir);
	if ((d = opendir(path)) == NULL)
		fail_msg("cannot open %s: %s (set SLUICE_SRCDIR to the source "
		    "tree)", path, strerror(errno));
	while ((de = readdir(d)) != NULL) {
		len = strlen(de->d_name);
		if (len < 3 || strcmp(de->d_name + len - 2, ".c") != 0)
			continue;
		snprintf(rel, sizeof(rel), "src/%s", de->d_name);
		src = read_page(rel);
		metric_names(rel, src, &ns, &n);
		free(src);
		files++;
	}
	closedir(d);
	/* The scan itself must work: today there are 35 families. */
	if (files < 10 || ns.n < 30)
		fail_msg("found %zu metric families in %zu files of %s: the "
		    "scan is broken", ns.n, files, path);
	page = read_page(MAIN_PAGE);
	if ((text = section(page, "ADMIN ENDPOINTS")) == NULL)
		fail_msg("%s has no ADMIN ENDPOINTS section", MAIN_PAGE);
	for (i = 0; i < ns.n; i++)
		if (!line_has(text, ".It Li ", ns.v[i]))
			problem(&n, "%s: ADMIN ENDPOINTS has no \".It Li %s\" "
			    "(a metric family src/ emits)", MAIN_PAGE, ns.v[i]);
	print_message("%zu metric families in src/*.c\n", ns.n);
	free(text);
	free(page);
	names_free(&ns);
	if (n > 0)
		fail_msg("%d metric famil(y/ies) of the code not documented "
		    "in %s", n, MAIN_PAGE);
}

/*
 * Every field the access log writes: the "\"NAME\":" of the format in
 * sl_access_write() (src/accesslog.c).
 */
static void
test_every_access_log_field_in_the_code_documented(void **state)
{
	struct names ns = { NULL, 0 };
	char *src, *page, *text;
	const char *p, *end, *q;
	size_t i, len;
	int n = 0;

	(void)state;
	src = read_page("src/accesslog.c");
	p = strstr(src, "\nsl_access_write(");
	if (p == NULL)
		fail_msg("src/accesslog.c has no sl_access_write()");
	end = strstr(p, "\n}\n");
	if (end == NULL)
		end = p + strlen(p);
	for (q = p; (q = strstr(q, "\\\"")) != NULL && q < end; ) {
		q += 2;
		for (len = 0; is_name_char(q[len]); len++)
			;
		if (len > 0 && strncmp(q + len, "\\\":", 3) == 0) {
			names_add(&ns, q, len);
			q += len + 3;
		}
	}
	if (ns.n < 15)
		fail_msg("found %zu access log fields in sl_access_write(): "
		    "the scan is broken", ns.n);
	page = read_page(MAIN_PAGE);
	if ((text = section(page, "ACCESS LOG")) == NULL)
		fail_msg("%s has no ACCESS LOG section", MAIN_PAGE);
	for (i = 0; i < ns.n; i++)
		if (!line_has(text, ".It Li ", ns.v[i]))
			problem(&n, "%s: ACCESS LOG has no \".It Li %s\" (a "
			    "field sl_access_write() writes)", MAIN_PAGE,
			    ns.v[i]);
	print_message("%zu access log fields in sl_access_write()\n", ns.n);
	free(text);
	free(page);
	free(src);
	names_free(&ns);
	if (n > 0)
		fail_msg("%d access log field(s) not documented in %s", n,
		    MAIN_PAGE);
}

static void
test_signals_documented(void **state)
{
	static const char *const sigs[] = {
		"SIGHUP", "SIGTERM", "SIGINT", "SIGQUIT", "SIGUSR1", NULL
	};
	char *page = read_page(MAIN_PAGE);

	(void)state;
	expect_words(MAIN_PAGE, page, "SIGNALS", ".It Dv ", sigs);
	free(page);
}

static void
test_errors_documented(void **state)
{
	static const char *const codes[] = {
		"400 Ta Li bad_request", "401 Ta Li invalid_api_key",
		"403 Ta Li tenant_disabled",
		"404 Ta Li not_found", "408 Ta Li request_timeout",
		"413 Ta Li request_too_large",
		"429 Ta Li concurrency_limit_exceeded",
		"431 Ta Li headers_too_large",
		"502 Ta Li upstream_unreachable", "503 Ta Li overloaded",
		"503 Ta Li upstream_unavailable",
		"503 Ta Li cluster_unavailable",
		"429 Ta Li token_budget_exceeded",
		"504 Ta Li upstream_timeout", NULL
	};
	char *page = read_page(MAIN_PAGE);

	(void)state;
	expect_words(MAIN_PAGE, page, "ERROR RESPONSES", ".It ", codes);
	free(page);
}

/* The type sluice.8 says a status's errors have. */
static const char *
doc_type_of(int status)
{
	switch (status) {
	case 429: return "rate_limit_error";
	case 403: return "permission_error";
	case 503: return "server_error";
	case 502: case 504: return "upstream_error";
	default: return "invalid_request_error";
	}
}

/*
 * The table of sluice's own errors (sl_reply.h) against ERROR RESPONSES:
 * every row has its ".It STATUS Ta Li code Ta" entry, the type the page
 * gives its status, and its entry says "Retry-After" (not "no Retry-After")
 * exactly when the row sends it, and "Allow" exactly when the row does.
 */
static void
test_error_table_documented(void **state)
{
	char *page = read_page(MAIN_PAGE);
	char *text = section(page, "ERROR RESPONSES");
	int e, n = 0;

	(void)state;
	if (text == NULL)
		fail_msg("%s has no ERROR RESPONSES section", MAIN_PAGE);
	for (e = 0; e < SL_ERR_COUNT; e++) {
		const struct sl_err_row *r = &sl_errs[e];
		char head[128], entry[2048];
		const char *s, *end;
		size_t len;
		int retry, allow;

		if (strcmp(r->type, doc_type_of(r->status)) != 0)
			problem(&n, "row %d (%d %s): type %s, the page says %s", e,
			    r->status, r->code, r->type, doc_type_of(r->status));
		snprintf(head, sizeof(head), "\n.It %d Ta Li %s Ta", r->status,
		    r->code);
		if ((s = strstr(text, head)) == NULL) {
			problem(&n, "%s: ERROR RESPONSES has no \"%s\" line",
			    MAIN_PAGE, head + 1);
			continue;
		}
		s += strlen(head);
		end = strstr(s, "\n.It ");
		if (end == NULL)
			end = strstr(s, "\n.El");
		if (end == NULL)
			end = s + strlen(s);
		len = (size_t)(end - s) < sizeof(entry) - 1 ?
		    (size_t)(end - s) : sizeof(entry) - 1;
		memcpy(entry, s, len);
		entry[len] = '\0';
		retry = strstr(entry, "Retry-After") != NULL &&
		    strstr(entry, "no\n.Ql Retry-After") == NULL;
		allow = strstr(entry, "Allow") != NULL;
		if (retry != !!(r->flags & SL_ERR_RETRY))
			problem(&n, "%d %s: the page %s Retry-After, the table %s",
			    r->status, r->code, retry ? "sends" : "does not send",
			    (r->flags & SL_ERR_RETRY) ? "does" : "does not");
		if (allow != !!(r->flags & SL_ERR_ALLOW))
			problem(&n, "%d %s: the page %s Allow, the table %s",
			    r->status, r->code, allow ? "sends" : "does not send",
			    (r->flags & SL_ERR_ALLOW) ? "does" : "does not");
	}
	free(text);
	free(page);
	if (n > 0)
		fail_msg("%d row(s) of sluice's errors differ from %s", n,
		    MAIN_PAGE);
}

static void
test_access_log_documented(void **state)
{
	static const char *const fields[] = {
		"time", "worker", "peer", "tenant", "method", "path", "status",
		"bytes_out", "ttfb_ms", "duration_ms", "paused_ms", "end", "replica",
		"tries", "prompt_tokens", "completion_tokens", "usage",
		"affinity", NULL
	};
	static const char *const ends[] = {
		"done", "client_gone", "upstream_error", "timeout", "stall",
		"rejected", "drained", NULL
	};
	char *page = read_page(MAIN_PAGE);

	(void)state;
	expect_words(MAIN_PAGE, page, "ACCESS LOG", ".It Li ", fields);
	expect_words(MAIN_PAGE, page, "ACCESS LOG", ".It Cm ", ends);
	free(page);
}

static void
test_synopsis(void **state)
{
	char *page = read_page(MAIN_PAGE);

	(void)state;
	expect_words(MAIN_PAGE, page, "SYNOPSIS", ".Op ", (const char *[]){
	    "Fl c Ar file", "Fl t", "Fl V", "Fl h", NULL });
	expect_words(MAIN_PAGE, page, "OPTIONS", ".It ", (const char *[]){
	    "Fl c Ar file", "Fl t", "Fl V", "Fl h", NULL });
	free(page);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_key_documented),
		cmocka_unit_test(test_no_unknown_key_documented),
		cmocka_unit_test(test_example_is_valid),
		cmocka_unit_test(test_metrics_documented),
		cmocka_unit_test(test_error_table_documented),
		cmocka_unit_test(test_every_metric_in_the_code_documented),
		cmocka_unit_test(test_every_access_log_field_in_the_code_documented),
		cmocka_unit_test(test_signals_documented),
		cmocka_unit_test(test_errors_documented),
		cmocka_unit_test(test_access_log_documented),
		cmocka_unit_test(test_synopsis),
	};

	return sl_unit_run(tests);
}
