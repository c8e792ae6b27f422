/*
 * fuzz_config: the configuration loader, bytes -> config or errors.
 *
 * sl_config_load_buffer() must either return 0 with a config that keeps
 * every promise of sl_config.h and the key table (ranges, required keys,
 * tenants with keys and a valid upstream, keys unique across tenants), or
 * -1 with no config and at least one message of the form
 * "NAME:LINE:COL: message", LINE and COL positive, in file order. Leaks of
 * either path show up through LeakSanitizer.
 */
#include "config.h"

#include <inttypes.h>
#include <yaml.h>

#include "sl_config.h"
#include "fuzz.h"

#define NAME "fuzz.yaml"

/* The ranges of config.c's key table, restated. */
#define KIB 1024ULL
#define MIB (1024 * KIB)
#define GIB (1024 * MIB)
#define SEC 1000ULL
#define MINUTE (60 * SEC)
#define HOUR (60 * MINUTE)

static void
in_range(uint64_t v, uint64_t lo, uint64_t hi, const char *key)
{
	fz_check(v >= lo && v <= hi, "range", "%s = %" PRIu64 " outside %" PRIu64 "-%" PRIu64,
	    key, v, lo, hi);
}

static int
blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static void
check_config(const struct sl_config *cfg)
{
	size_t i, j, t, u;

	fz_check(cfg->file != NULL && strcmp(cfg->file, NAME) == 0, "file", "file name lost");
	fz_check(cfg->listen != NULL && cfg->listen[0] != '\0', "listen", "no listen address");
	fz_check(cfg->workers == SL_WORKERS_AUTO ||
	    (cfg->workers >= 1 && cfg->workers <= SL_MAX_WORKERS), "range",
	    "workers = %d", cfg->workers);
	fz_check(cfg->log_level >= SL_LOG_ERROR && cfg->log_level <= SL_LOG_DEBUG, "range",
	    "log_level = %d", (int)cfg->log_level);
	in_range(cfg->stream_buffer, 16 * KIB, GIB, "stream_buffer");
	in_range(cfg->drain_timeout_ms, 0, 24 * HOUR, "drain_timeout");
	in_range(cfg->timeouts.upstream_connect_ms, 1, 10 * MINUTE, "timeouts.upstream_connect");
	in_range(cfg->timeouts.upstream_first_byte_ms, 1, 24 * HOUR,
	    "timeouts.upstream_first_byte");
	in_range(cfg->timeouts.upstream_idle_ms, 1, 24 * HOUR, "timeouts.upstream_idle");
	in_range(cfg->timeouts.client_header_ms, 1, HOUR, "timeouts.client_header");
	in_range(cfg->timeouts.client_stall_ms, 1, 24 * HOUR, "timeouts.client_stall");
	in_range(cfg->timeouts.keepalive_ms, 0, HOUR, "timeouts.keepalive");
	in_range(cfg->limits.max_header_bytes, KIB, MIB, "limits.max_header_bytes");
	in_range(cfg->limits.max_body_bytes, 0, GIB, "limits.max_body_bytes");
	in_range(cfg->limits.max_connections, 1, 1000000, "limits.max_connections");

	fz_check(cfg->nupstreams >= 1 && cfg->upstreams != NULL, "upstreams", "no upstream");
	for (u = 0; u < cfg->nupstreams; u++) {
		const struct sl_upstream_conf *up = &cfg->upstreams[u];
		size_t l;

		fz_check(up->name != NULL && up->url != NULL, "upstreams",
		    "upstream #%zu without name or url", u);
		fz_check(strncmp(up->url, "http://", 7) == 0 || strncmp(up->url, "https://", 8) == 0,
		    "upstream-url", "url '%s'", up->url);
		fz_check(strpbrk(up->url, "?# \t\r\n") == NULL, "upstream-url", "url '%s'", up->url);
		l = strlen(up->url);
		fz_check(l > 0 && up->url[l - 1] != '/', "upstream-url", "trailing '/' in '%s'",
		    up->url);
		fz_check(up->api_key == NULL || strpbrk(up->api_key, "\r\n") == NULL,
		    "upstream-key", "CR or LF in an upstream api_key");
		for (j = 0; j < u; j++)
			fz_check(strcmp(cfg->upstreams[j].name, up->name) != 0, "upstreams",
			    "two upstreams named '%s'", up->name);
	}

	fz_check(cfg->ntenants >= 1 && cfg->tenants != NULL, "tenants", "no tenant");
	for (t = 0; t < cfg->ntenants; t++) {
		const struct sl_tenant_conf *tc = &cfg->tenants[t];

		fz_check(tc->name != NULL, "tenants", "tenant #%zu without a name", t);
		fz_check(sl_config_tenant_index(cfg, tc->name) == (int)t, "tenants",
		    "tenant '%s' is not found at its own index", tc->name);
		fz_check(tc->nkeys >= 1 && tc->keys != NULL, "tenant-keys",
		    "tenant '%s' has no key", tc->name);
		for (i = 0; i < tc->nkeys; i++) {
			const char *k = tc->keys[i];

			fz_check(k != NULL && k[0] != '\0', "tenant-keys", "empty key in '%s'",
			    tc->name);
			for (j = 0; k[j] != '\0'; j++)
				fz_check(!blank(k[j]), "tenant-keys", "blank in a key of '%s'",
				    tc->name);
			/* A key names exactly one tenant. */
			for (u = 0; u <= t; u++)
				for (j = 0; j < (u == t ? i : cfg->tenants[u].nkeys); j++)
					fz_check(strcmp(cfg->tenants[u].keys[j], k) != 0,
					    "tenant-keys", "key shared by '%s' and '%s'",
					    cfg->tenants[u].name, tc->name);
		}
		in_range((uint64_t)tc->max_streams, 0, 1000000, "tenants.*.max_streams");
		in_range((uint64_t)tc->retry_after, 1, 86400, "tenants.*.retry_after");
		fz_check(tc->upstream_idx < cfg->nupstreams, "tenant-upstream",
		    "tenant '%s': upstream index %zu of %zu", tc->name, tc->upstream_idx,
		    cfg->nupstreams);
		if (tc->upstream != NULL)
			fz_check(strcmp(tc->upstream, cfg->upstreams[tc->upstream_idx].name) == 0,
			    "tenant-upstream", "tenant '%s' names '%s' but uses '%s'", tc->name,
			    tc->upstream, cfg->upstreams[tc->upstream_idx].name);
		else
			fz_check(cfg->nupstreams == 1, "tenant-upstream",
			    "tenant '%s' without upstream among %zu", tc->name, cfg->nupstreams);
	}
}

/*
 * 1 if a scalar of the input holds a NUL ("\0", "\x00" or "\u0000" in a
 * double-quoted string). Every scalar of an accepted config is a key or a
 * value; as C strings such a value would be cut short ("sk-\0long-secret"
 * would become the key "sk-"), so the loader must refuse it.
 */
static int
has_nul_scalar(const uint8_t *data, size_t size)
{
	yaml_parser_t p;
	yaml_event_t ev;
	int found = 0, done = 0;

	if (!yaml_parser_initialize(&p))
		abort();
	yaml_parser_set_input_string(&p, data, size);
	while (!done && !found) {
		if (!yaml_parser_parse(&p, &ev))
			break;
		if (ev.type == YAML_SCALAR_EVENT &&
		    memchr(ev.data.scalar.value, '\0', ev.data.scalar.length) != NULL)
			found = 1;
		done = ev.type == YAML_STREAM_END_EVENT;
		yaml_event_delete(&ev);
	}
	yaml_parser_delete(&p);
	return found;
}

/* "NAME:LINE:COL: message"; returns LINE and COL through the pointers. */
static void
check_message(const char *msg, size_t len, unsigned long *line, unsigned long *col)
{
	size_t nl = strlen(NAME);
	const char *p;
	char *end;

	fz_check(msg != NULL, "message", "NULL message");
	fz_check(strncmp(msg, NAME ":", nl + 1) == 0, "message", "'%s' does not name the file",
	    msg);
	p = msg + nl + 1;
	fz_check(*p >= '1' && *p <= '9', "message", "'%s': no line", msg);
	*line = strtoul(p, &end, 10);
	fz_check(*end == ':' && end[1] >= '1' && end[1] <= '9', "message", "'%s': no column",
	    msg);
	*col = strtoul(end + 1, &end, 10);
	fz_check(end[0] == ':' && end[1] == ' ' && end[2] != '\0', "message",
	    "'%s': no ': message'", msg);
	/* One problem, one line: a value quoted in a message must not break it. */
	fz_check(strpbrk(msg, "\r\n") == NULL, "message-oneline",
	    "message spans lines: '%s'", msg);
	/* Marks point into the input (or just past its end). */
	fz_check(*line <= len + 1 && *col <= len + 1, "message",
	    "'%s' points past %zu bytes", msg, len);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sl_config *cfg = (struct sl_config *)&cfg;   /* must be reset */
	struct sl_errors errs = { 0 };
	unsigned long line, col, pline = 0, pcol = 0;
	char *copy;
	size_t i;
	int rc;

	/* Exactly the input's size, so ASan sees any read past its end. */
	if ((copy = malloc(size ? size : 1)) == NULL)
		abort();
	memcpy(copy, data, size);
	rc = sl_config_load_buffer(NAME, copy, size, &cfg, &errs);
	if (rc == 0) {
		fz_check(cfg != NULL && errs.n == 0, "result", "0 with %zu errors or no config",
		    errs.n);
		check_config(cfg);
		sl_config_free(cfg);
		fz_check(!has_nul_scalar(data, size), "nul-scalar",
		    "a value holding NUL was accepted (cut at the NUL)");
	} else {
		fz_check(rc == -1 && cfg == NULL, "result", "rc %d, config %p", rc, (void *)cfg);
		fz_check(errs.n >= 1 && errs.msg != NULL, "result", "failure without a message");
		for (i = 0; i < errs.n; i++) {
			check_message(errs.msg[i], size, &line, &col);
			fz_check(line > pline || (line == pline && col >= pcol), "message-order",
			    "'%s' after line %lu col %lu", errs.msg[i], pline, pcol);
			pline = line;
			pcol = col;
		}
	}
	sl_errors_free(&errs);
	free(copy);
	return 0;
}
