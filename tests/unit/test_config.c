/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for the configuration loader (src/config.c).
 *
 * Every error test writes out a YAML text whose line and column numbers are
 * given in the comment next to it, and asserts the exact "NAME:LINE:COL: "
 * prefix of each message (1-based), the number of messages, and either the
 * whole message or the part that names the problem.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "unit.h"

#include "sl_config.h"

#define NAME "t.yaml"

#define KIB 1024ULL
#define MIB (1024ULL * KIB)
#define GIB (1024ULL * MIB)

/* The sample configuration of issue 2, comments and all. */
static const char sample_yaml[] =
    "listen: \"127.0.0.1:8080\"          # required; host:port or [v6]:port\n"
    "workers: auto                     # integer or auto (= CPUs)\n"
    "admin_listen: \"127.0.0.1:9090\"    # optional; /metrics and /healthz (operations issue)\n"
    "stream_buffer: 64KiB              # per-stream bound on bytes waiting for a client\n"
    "drain_timeout: 30s\n"
    "timeouts:\n"
    "  upstream_connect: 5s            # -> 502\n"
    "  upstream_first_byte: 120s       # request sent, no response head -> 504\n"
    "  upstream_idle: 120s             # no upstream bytes mid-stream -> stream cut\n"
    "  client_header: 10s              # request head incomplete -> 408, close\n"
    "  client_stall: 30s               # client accepts no bytes while its buffer is full -> cut\n"
    "  keepalive: 60s\n"
    "limits:\n"
    "  max_header_bytes: 32KiB         # -> 431\n"
    "  max_body_bytes: 16MiB           # -> 413\n"
    "  max_connections: 20000          # per worker\n"
    "upstreams:\n"
    "  main:\n"
    "    url: \"http://127.0.0.1:9000\"  # base URL; the client's path is appended\n"
    "    api_key: \"secret\"             # optional; sent upstream as Authorization: Bearer\n"
    "tenants:\n"
    "  acme:\n"
    "    keys: [\"sk-acme-1\", \"sk-acme-2\"]\n"
    "    max_streams: 100              # concurrent requests in flight, across all workers\n"
    "    retry_after: 1                # seconds, sent with 429\n"
    "    upstream: main\n";

/* Smallest valid file: only the required keys. Tests append to it. */
#define MINIMAL_UPSTREAMS_TENANTS                                       \
    "upstreams:\n"                                                      \
    "  main:\n"                                                         \
    "    url: \"http://127.0.0.1:9000\"\n"                              \
    "tenants:\n"                                                        \
    "  acme:\n"                                                         \
    "    keys: [\"k1\"]\n"                                              \
    "    max_streams: 2\n"

/* What a test loaded; freed by the teardown even when an assert fails. */
struct fx {
	struct sl_config *cfg;
	struct sl_errors errs;
	char tmp[64];
};

static int
setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	if (f == NULL)
		return -1;
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fx *f = *state;

	sl_config_free(f->cfg);
	sl_errors_free(&f->errs);
	if (f->tmp[0] != '\0')
		unlink(f->tmp);
	free(f);
	return 0;
}

static int
load(struct fx *f, const char *yaml)
{
	sl_config_free(f->cfg);
	f->cfg = NULL;
	sl_errors_free(&f->errs);
	return sl_config_load_buffer(NAME, yaml, strlen(yaml), &f->cfg, &f->errs);
}

static void
dump_errors(const struct fx *f)
{
	size_t i;

	print_error("  %zu message(s):\n", f->errs.n);
	for (i = 0; i < f->errs.n; i++)
		print_error("    [%zu] %s\n", i, f->errs.msg[i]);
}

/* Loading yaml must succeed with no message. */
static void
expect_ok(struct fx *f, const char *yaml)
{
	int rc = load(f, yaml);

	if (rc != 0 || f->errs.n != 0 || f->cfg == NULL) {
		print_error("expected the config to load, rc=%d\n", rc);
		dump_errors(f);
		fail();
	}
}

/*
 * Loading yaml must fail with exactly n messages; message i must start with
 * want[2*i] (the "NAME:LINE:COL: " prefix, or the whole message) and the rest
 * must contain want[2*i+1] (NULL: the prefix is the whole message).
 */
static void
expect_errors(struct fx *f, const char *yaml, size_t n, const char *const *want)
{
	int rc = load(f, yaml), bad = 0;
	size_t i;

	if (rc != -1 || f->cfg != NULL) {
		print_error("expected load to fail, rc=%d cfg=%p\n", rc,
		    (void *)f->cfg);
		bad = 1;
	}
	if (f->errs.n != n) {
		print_error("expected %zu message(s), got %zu\n", n, f->errs.n);
		bad = 1;
	}
	for (i = 0; i < n && i < f->errs.n; i++) {
		const char *msg = f->errs.msg[i], *pre = want[2 * i];
		const char *needle = want[2 * i + 1];
		size_t pl = strlen(pre);

		if (needle == NULL ? strcmp(msg, pre) != 0 :
		    strncmp(msg, pre, pl) != 0 || strstr(msg + pl, needle) == NULL) {
			print_error("message %zu:\n  got      '%s'\n"
			    "  expected '%s%s%s'\n", i, msg, pre,
			    needle ? "...' containing '" : "", needle ? needle : "");
			bad = 1;
		}
	}
	if (bad) {
		dump_errors(f);
		fail();
	}
}

static void
expect_error(struct fx *f, const char *yaml, const char *prefix,
    const char *needle)
{
	const char *want[2] = { prefix, needle };

	expect_errors(f, yaml, 1, want);
}

/* ---- successful loads ------------------------------------------------ */

static void
test_sample_config_loads_every_field(void **state)
{
	struct fx *f = *state;
	const struct sl_config *c;

	expect_ok(f, sample_yaml);
	c = f->cfg;
	assert_string_equal(c->file, NAME);
	assert_string_equal(c->listen, "127.0.0.1:8080");
	assert_int_equal(c->workers, SL_WORKERS_AUTO);
	assert_non_null(c->admin_listen);
	assert_string_equal(c->admin_listen, "127.0.0.1:9090");
	assert_int_equal(c->stream_buffer, 64 * KIB);
	assert_int_equal(c->drain_timeout_ms, 30000);
	assert_int_equal(c->timeouts.upstream_connect_ms, 5000);
	assert_int_equal(c->timeouts.upstream_first_byte_ms, 120000);
	assert_int_equal(c->timeouts.upstream_idle_ms, 120000);
	assert_int_equal(c->timeouts.client_header_ms, 10000);
	assert_int_equal(c->timeouts.client_stall_ms, 30000);
	assert_int_equal(c->timeouts.keepalive_ms, 60000);
	assert_int_equal(c->limits.max_header_bytes, 32 * KIB);
	assert_int_equal(c->limits.max_body_bytes, 16 * MIB);
	assert_int_equal(c->limits.max_connections, 20000);
	assert_int_equal(c->limits.upstream_rcvbuf, 256 * KIB);
	assert_int_equal(c->limits.client_sndbuf, 0);
	assert_null(c->access_log);
	assert_int_equal(c->log_level, SL_LOG_INFO);

	assert_int_equal(c->nupstreams, 1);
	assert_string_equal(c->upstreams[0].name, "main");
	assert_string_equal(c->upstreams[0].url, "http://127.0.0.1:9000");
	assert_non_null(c->upstreams[0].api_key);
	assert_string_equal(c->upstreams[0].api_key, "secret");

	assert_int_equal(c->ntenants, 1);
	assert_string_equal(c->tenants[0].name, "acme");
	assert_int_equal(c->tenants[0].nkeys, 2);
	assert_string_equal(c->tenants[0].keys[0], "sk-acme-1");
	assert_string_equal(c->tenants[0].keys[1], "sk-acme-2");
	assert_int_equal(c->tenants[0].max_streams, 100);
	assert_int_equal(c->tenants[0].retry_after, 1);
	assert_non_null(c->tenants[0].upstream);
	assert_string_equal(c->tenants[0].upstream, "main");
	assert_int_equal(c->tenants[0].upstream_idx, 0);
	assert_int_equal(sl_config_tenant_index(c, "acme"), 0);
	assert_int_equal(sl_config_tenant_index(c, "nobody"), -1);
}

static void
test_omitted_keys_take_defaults(void **state)
{
	struct fx *f = *state;
	const struct sl_config *c;

	expect_ok(f, "listen: \"127.0.0.1:8080\"\n" MINIMAL_UPSTREAMS_TENANTS);
	c = f->cfg;
	assert_string_equal(c->listen, "127.0.0.1:8080");
	assert_null(c->admin_listen);
	assert_int_equal(c->workers, SL_WORKERS_AUTO);
	assert_int_equal(c->stream_buffer, 64 * KIB);
	assert_int_equal(c->drain_timeout_ms, 30000);
	assert_int_equal(c->timeouts.upstream_connect_ms, 5000);
	assert_int_equal(c->timeouts.upstream_first_byte_ms, 120000);
	assert_int_equal(c->timeouts.upstream_idle_ms, 120000);
	assert_int_equal(c->timeouts.client_header_ms, 10000);
	assert_int_equal(c->timeouts.client_stall_ms, 30000);
	assert_int_equal(c->timeouts.keepalive_ms, 60000);
	assert_int_equal(c->limits.max_header_bytes, 32 * KIB);
	assert_int_equal(c->limits.max_body_bytes, 16 * MIB);
	assert_int_equal(c->limits.max_connections, 20000);
	assert_null(c->access_log);
	assert_int_equal(c->log_level, SL_LOG_INFO);

	assert_int_equal(c->nupstreams, 1);
	assert_null(c->upstreams[0].api_key);
	assert_int_equal(c->ntenants, 1);
	assert_int_equal(c->tenants[0].retry_after, 1);
	assert_int_equal(c->tenants[0].max_streams, 2);
	/* One upstream: a tenant that names none is served by it. */
	assert_null(c->tenants[0].upstream);
	assert_int_equal(c->tenants[0].upstream_idx, 0);
}

static void
test_explicit_values_and_second_upstream_index(void **state)
{
	struct fx *f = *state;
	const struct sl_config *c;

	expect_ok(f,
	    "listen: \"[::1]:8443\"\n"
	    "workers: 4\n"
	    "stream_buffer: 1 MiB\n"
	    "drain_timeout: 1.5s\n"
	    "access_log: stderr\n"
	    "log_level: debug\n"
	    "admin_listen: ~\n"
	    "timeouts:\n"
	    "  upstream_connect: 250ms\n"
	    "  keepalive: 0s\n"
	    "limits:\n"
	    "  max_body_bytes: 0\n"
	    "  max_connections: 7\n"
	    "  upstream_rcvbuf: 0\n"
	    "  client_sndbuf: 64KiB\n"
	    "upstreams:\n"
	    "  a:\n"
	    "    url: \"http://10.0.0.1:9000\"\n"
	    "  b:\n"
	    "    url: \"https://runner.example:8443/base//\"\n"
	    "    api_key: \"up-key\"\n"
	    "tenants:\n"
	    "  t1:\n"
	    "    keys: [\"k1\"]\n"
	    "    max_streams: 0\n"
	    "    upstream: a\n"
	    "  t2:\n"
	    "    keys:\n"
	    "      - \"k2\"\n"
	    "      - \"k3\"\n"
	    "    max_streams: 1000000\n"
	    "    retry_after: 30\n"
	    "    upstream: b\n");
	c = f->cfg;
	assert_string_equal(c->listen, "[::1]:8443");
	assert_int_equal(c->workers, 4);
	assert_int_equal(c->stream_buffer, MIB);
	assert_int_equal(c->drain_timeout_ms, 1500);
	assert_non_null(c->access_log);
	assert_string_equal(c->access_log, "stderr");
	assert_int_equal(c->log_level, SL_LOG_DEBUG);
	assert_null(c->admin_listen);
	assert_int_equal(c->timeouts.upstream_connect_ms, 250);
	assert_int_equal(c->timeouts.keepalive_ms, 0);
	assert_int_equal(c->timeouts.client_header_ms, 10000);
	assert_int_equal(c->limits.max_body_bytes, 0);
	assert_int_equal(c->limits.max_connections, 7);
	assert_int_equal(c->limits.max_header_bytes, 32 * KIB);
	assert_int_equal(c->limits.upstream_rcvbuf, 0);
	assert_int_equal(c->limits.client_sndbuf, 64 * KIB);

	assert_int_equal(c->nupstreams, 2);
	assert_string_equal(c->upstreams[0].url, "http://10.0.0.1:9000");
	assert_null(c->upstreams[0].api_key);
	assert_string_equal(c->upstreams[1].name, "b");
	/* Every trailing '/' goes: the client's path starts with one. */
	assert_string_equal(c->upstreams[1].url, "https://runner.example:8443/base");
	assert_string_equal(c->upstreams[1].api_key, "up-key");

	assert_int_equal(c->ntenants, 2);
	assert_int_equal(c->tenants[0].max_streams, 0);
	assert_int_equal(c->tenants[0].upstream_idx, 0);
	assert_string_equal(c->tenants[1].name, "t2");
	assert_int_equal(c->tenants[1].nkeys, 2);
	assert_string_equal(c->tenants[1].keys[0], "k2");
	assert_string_equal(c->tenants[1].keys[1], "k3");
	assert_int_equal(c->tenants[1].max_streams, 1000000);
	assert_int_equal(c->tenants[1].retry_after, 30);
	assert_string_equal(c->tenants[1].upstream, "b");
	assert_int_equal(c->tenants[1].upstream_idx, 1);
	assert_int_equal(sl_config_tenant_index(c, "t2"), 1);
}

static void
test_access_log_off_is_null(void **state)
{
	struct fx *f = *state;

	expect_ok(f, "listen: \"127.0.0.1:8080\"\naccess_log: \"off\"\n"
	    MINIMAL_UPSTREAMS_TENANTS);
	assert_null(f->cfg->access_log);
	expect_ok(f, "listen: \"127.0.0.1:8080\"\naccess_log: /var/log/x.log\n"
	    MINIMAL_UPSTREAMS_TENANTS);
	assert_string_equal(f->cfg->access_log, "/var/log/x.log");
}

static void
test_workers_bounds_accepted(void **state)
{
	struct fx *f = *state;

	expect_ok(f, "listen: \"127.0.0.1:8080\"\nworkers: 1\n"
	    MINIMAL_UPSTREAMS_TENANTS);
	assert_int_equal(f->cfg->workers, 1);
	expect_ok(f, "listen: \"127.0.0.1:8080\"\nworkers: 64\n"
	    MINIMAL_UPSTREAMS_TENANTS);
	assert_int_equal(f->cfg->workers, SL_MAX_WORKERS);
}

static void
test_load_file_reads_sample(void **state)
{
	struct fx *f = *state;
	FILE *fp;
	int fd;

	snprintf(f->tmp, sizeof(f->tmp), "/tmp/sl-test-config-XXXXXX");
	fd = mkstemp(f->tmp);
	assert_true(fd >= 0);
	fp = fdopen(fd, "w");
	assert_non_null(fp);
	assert_int_equal(fwrite(sample_yaml, 1, strlen(sample_yaml), fp),
	    strlen(sample_yaml));
	assert_int_equal(fclose(fp), 0);

	assert_int_equal(sl_config_load_file(f->tmp, &f->cfg, &f->errs), 0);
	assert_int_equal(f->errs.n, 0);
	assert_non_null(f->cfg);
	assert_string_equal(f->cfg->file, f->tmp);
	assert_int_equal(f->cfg->tenants[0].max_streams, 100);
}

static void
test_load_file_missing_reports_path(void **state)
{
	struct fx *f = *state;
	const char *path = "/nonexistent/sluice-test/none.yaml";
	struct sl_config *cfg = (struct sl_config *)&path;  /* must be reset */
	int rc;

	rc = sl_config_load_file(path, &cfg, &f->errs);
	assert_int_equal(rc, -1);
	assert_null(cfg);
	assert_int_equal(f->errs.n, 1);
	assert_string_equal(f->errs.msg[0],
	    "/nonexistent/sluice-test/none.yaml:1:1: cannot open: "
	    "No such file or directory");
}

/* ---- unknown keys ----------------------------------------------------- */

static void
test_unknown_top_level_key_reports_line(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "bogus: 1\n"                        /* 2: key at col 1 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:1: unknown key 'bogus'", NULL);
}

static void
test_unknown_timeouts_key_reports_line(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "timeouts:\n"                       /* 2 */
	    "  client_header: 5s\n"             /* 3 */
	    "  bogus: 5s\n"                     /* 4: key at col 3 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":4:3: unknown key 'timeouts.bogus'", NULL);
}

static void
test_unknown_limits_key_reports_line(void **state)
{
	/* A misspelt limit must never silently become "unlimited". */
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "limits:\n"                         /* 2 */
	    "  max_body_byte: 1MiB\n"           /* 3: key at col 3 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":3:3: unknown key 'limits.max_body_byte'", NULL);
}

static void
test_unknown_tenant_key_reports_line(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    MINIMAL_UPSTREAMS_TENANTS           /* 2-8 */
	    "    burst: 3\n",                   /* 9: key at col 5 */
	    NAME ":9:5: unknown key 'burst' in tenant 'acme'", NULL);
}

static void
test_unknown_upstream_key_reports_line(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "    timeout: 5s\n"                 /* 5: key at col 5 */
	    "tenants:\n"
	    "  acme:\n"
	    "    keys: [\"k1\"]\n"
	    "    max_streams: 2\n",
	    NAME ":5:5: unknown key 'timeout' in upstream 'main'", NULL);
}

static void
test_dotted_top_level_key_is_unknown(void **state)
{
	/*
	 * "timeouts.client_header" names a row of the key table, but it is not
	 * a key of the file's schema: written flat at the top level it must be
	 * refused like any other unknown key, not applied.
	 */
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "timeouts.client_header: 1s\n"      /* 2: key at col 1 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:1: unknown key 'timeouts.client_header'", NULL);
}

static void
test_wildcard_key_path_is_unknown(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "tenants.*.keys: [\"x\"]\n"         /* 2: key at col 1 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:1: ", "unknown key 'tenants.*.keys'");
}

/* ---- wrong types ------------------------------------------------------ */

static void
test_mapping_where_scalar_expected_reports_value(void **state)
{
	expect_error(*state,
	    "listen:\n"                         /* 1 */
	    "  host: 127.0.0.1\n"               /* 2: mapping starts col 3 */
	    "  port: 8080\n"
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:3: ", "listen: expected a value, got a mapping");
}

static void
test_flow_mapping_where_scalar_expected_reports_value(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "stream_buffer: {size: 64KiB}\n"    /* 2: value at col 16 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:16: ", "stream_buffer: expected a value, got a mapping");
}

static void
test_scalar_where_list_expected_reports_value(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "tenants:\n"                        /* 5 */
	    "  acme:\n"                         /* 6 */
	    "    keys: \"k1\"\n"                /* 7: value at col 11 */
	    "    max_streams: 2\n",
	    NAME ":7:11: ", "tenants.acme.keys: expected a list of strings, got a scalar");
}

static void
test_scalar_where_mapping_expected_reports_value(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "timeouts: 5s\n"                    /* 2: value at col 11 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:11: ", "timeouts: expected a mapping, got a scalar");
}

static void
test_list_where_mapping_expected_reports_value(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  - \"http://127.0.0.1:9000\"\n"   /* 3: list at col 3 */
	    "tenants:\n"
	    "  acme:\n"
	    "    keys: [\"k1\"]\n"
	    "    max_streams: 2\n",
	    NAME ":3:3: ", "upstreams: expected a mapping, got a list");
}

static void
test_empty_value_for_required_scalar_is_null(void **state)
{
	expect_error(*state,
	    "listen:\n"                         /* 1: empty value after ':' */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":1:8: ", "listen: expected a value, got null");
}

/* ---- bad sizes, durations, integers ----------------------------------- */

static void
test_bad_size_reports_value(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "stream_buffer: 64KB\n"             /* 2: value at col 16 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:16: ", "stream_buffer: '64KB' is not a size");
}

static void
test_bad_nested_size_reports_value(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "limits:\n"                         /* 2 */
	    "  max_body_bytes: lots\n"          /* 3: value at col 19 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":3:19: ", "limits.max_body_bytes: 'lots' is not a size");
}

static void
test_bad_duration_reports_value(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "drain_timeout: 30 sec\n"           /* 2: value at col 16 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:16: ", "drain_timeout: '30 sec' is not a duration");
}

static void
test_duration_without_unit_is_rejected(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "timeouts:\n"                       /* 2 */
	    "  client_header: 10\n"             /* 3: value at col 18 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":3:18: ", "timeouts.client_header: '10' is not a duration");
}

static void
test_non_integer_max_streams_reports_value(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    MINIMAL_UPSTREAMS_TENANTS           /* 2-8 */
	    "    retry_after: soon\n",          /* 9: value at col 18 */
	    NAME ":9:18: ", "tenants.acme.retry_after: 'soon' is not an integer");
}

static void
test_bad_log_level_reports_value(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "log_level: verbose\n"              /* 2: value at col 12 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:12: ", "log_level: 'verbose' must be one of");
}

/* ---- out of range ----------------------------------------------------- */

static void
test_negative_max_streams_out_of_range(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "tenants:\n"                        /* 5 */
	    "  acme:\n"                         /* 6 */
	    "    keys: [\"k1\"]\n"              /* 7 */
	    "    max_streams: -1\n",            /* 8: value at col 18 */
	    NAME ":8:18: ", "tenants.acme.max_streams: -1 is out of range 0-1000000");
}

static void
test_max_streams_above_range(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "tenants:\n"                        /* 5 */
	    "  acme:\n"                         /* 6 */
	    "    keys: [\"k1\"]\n"              /* 7 */
	    "    max_streams: 1000001\n",       /* 8: value at col 18 */
	    NAME ":8:18: ", "out of range");
}

static void
test_stream_buffer_below_minimum_out_of_range(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "stream_buffer: 1KiB\n"             /* 2: value at col 16 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:16: ", "stream_buffer: 1KiB is out of range");
}

static void
test_socket_buffer_above_range(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "limits:\n"                         /* 2 */
	    "  client_sndbuf: 65MiB\n"          /* 3: value at col 18 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":3:18: ", "limits.client_sndbuf: 65MiB is out of range 0-64MiB");
}

static void
test_workers_zero_out_of_range(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "workers: 0\n"                      /* 2: value at col 10 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:10: ", "workers: '0' must be auto or an integer in 1-64");
}

static void
test_workers_65_out_of_range(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "workers: 65\n"                     /* 2: value at col 10 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:10: ", "workers: '65' must be auto or an integer in 1-64");
}

static void
test_retry_after_zero_out_of_range(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    MINIMAL_UPSTREAMS_TENANTS           /* 2-8 */
	    "    retry_after: 0\n",             /* 9: value at col 18 */
	    NAME ":9:18: ", "tenants.acme.retry_after: 0 is out of range 1-86400");
}

static void
test_max_header_bytes_above_range(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "limits:\n"                         /* 2 */
	    "  max_header_bytes: 2MiB\n"        /* 3: value at col 21 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":3:21: ", "limits.max_header_bytes: 2MiB is out of range 1KiB-1MiB");
}

static void
test_zero_client_header_timeout_out_of_range(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "timeouts:\n"                       /* 2 */
	    "  client_header: 0s\n"             /* 3: value at col 18 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":3:18: ", "timeouts.client_header: 0s is out of range 1ms-1h");
}

/* ---- duplicates and aliases ------------------------------------------- */

static void
test_duplicate_top_level_key_reports_line(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "listen: \"127.0.0.1:8081\"\n"      /* 2: second key at col 1 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:1: duplicate key 'listen' (first at line 1)", NULL);
}

static void
test_duplicate_key_within_tenant_reports_line(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    MINIMAL_UPSTREAMS_TENANTS           /* 2-8; max_streams on 8 */
	    "    max_streams: 3\n",             /* 9: second key at col 5 */
	    NAME ":9:5: duplicate key 'max_streams' (first at line 8)", NULL);
}

static void
test_duplicate_tenant_name_reports_line(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    MINIMAL_UPSTREAMS_TENANTS           /* 2-8; acme on 6 */
	    "  acme:\n"                         /* 9: second name at col 3 */
	    "    keys: [\"k9\"]\n"
	    "    max_streams: 2\n",
	    NAME ":9:3: duplicate key 'acme' (first at line 6)", NULL);
}

static void
test_alias_use_reports_alias_position(void **state)
{
	/*
	 * The message must point at the alias (line 2), where the file does
	 * something forbidden, not only at the anchor it refers to.
	 */
	expect_error(*state,
	    "listen: &addr \"127.0.0.1:8080\"\n" /* 1: anchor at col 9 */
	    "admin_listen: *addr\n"             /* 2: alias at col 15 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:15: ", "aliases are not allowed");
}

static void
test_alias_of_tenant_keys_is_one_error(void **state)
{
	/*
	 * One problem, one message: the alias. The aliased "keys" is present,
	 * so no "missing required key 'keys'" may follow it.
	 */
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "tenants:\n"                        /* 5 */
	    "  a:\n"                            /* 6 */
	    "    keys: &k [\"k1\"]\n"           /* 7: anchor at col 11 */
	    "    max_streams: 1\n"              /* 8 */
	    "  b:\n"                            /* 9 */
	    "    keys: *k\n"                    /* 10: alias at col 11 */
	    "    max_streams: 1\n",
	    NAME ":10:11: ", "aliases are not allowed");
}

static void
test_alias_is_rejected_even_if_otherwise_valid(void **state)
{
	struct fx *f = *state;
	size_t i;
	int found = 0;

	/* Whatever the position, an alias must fail the load. */
	assert_int_equal(load(f,
	    "listen: \"127.0.0.1:8080\"\n"
	    "timeouts:\n"
	    "  upstream_connect: &t 5s\n"
	    "  client_header: *t\n"
	    MINIMAL_UPSTREAMS_TENANTS), -1);
	assert_null(f->cfg);
	for (i = 0; i < f->errs.n; i++)
		if (strstr(f->errs.msg[i], "aliases are not allowed") != NULL)
			found = 1;
	assert_true(found);
}

/* ---- missing required keys -------------------------------------------- */

static void
test_missing_top_level_required_keys_all_reported(void **state)
{
	static const char *const want[] = {
		NAME ":1:1: missing required key 'listen'", NULL,
		NAME ":1:1: missing required key 'upstreams'", NULL,
		NAME ":1:1: missing required key 'tenants'", NULL,
	};

	expect_errors(*state, "workers: 2\n", 3, want);
}

static void
test_missing_listen_reported(void **state)
{
	expect_error(*state, MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":1:1: missing required key 'listen'", NULL);
}

static void
test_missing_tenant_keys_and_max_streams(void **state)
{
	/* Reported where the tenant's mapping starts (its first key). */
	static const char *const want[] = {
		NAME ":7:5: ", "tenant 'acme': missing required key 'keys'",
		NAME ":7:5: ", "tenant 'acme': missing required key 'max_streams'",
	};

	expect_errors(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "tenants:\n"                        /* 5 */
	    "  acme:\n"                         /* 6 */
	    "    retry_after: 2\n",             /* 7: mapping at col 5 */
	    2, want);
}

static void
test_missing_tenant_keys_only(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "tenants:\n"                        /* 5 */
	    "  acme:\n"                         /* 6 */
	    "    max_streams: 2\n",             /* 7: mapping at col 5 */
	    NAME ":7:5: ", "tenant 'acme': missing required key 'keys'");
}

static void
test_empty_upstreams_and_tenants_rejected(void **state)
{
	static const char *const want[] = {
		NAME ":2:12: ", "upstreams: at least one is required",
		NAME ":3:10: ", "tenants: at least one is required",
	};

	expect_errors(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams: {}\n"                   /* 2: '{' at col 12 */
	    "tenants: {}\n",                    /* 3: '{' at col 10 */
	    2, want);
}

static void
test_empty_tenant_key_list_rejected(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "tenants:\n"                        /* 5 */
	    "  acme:\n"                         /* 6 */
	    "    keys: []\n"                    /* 7: '[' at col 11 */
	    "    max_streams: 2\n",
	    NAME ":7:11: ", "tenants.acme.keys: must hold at least one key");
}

static void
test_tenant_key_with_space_rejected(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "tenants:\n"                        /* 5 */
	    "  acme:\n"                         /* 6 */
	    "    keys: [\"ok\", \"a b\"]\n"     /* 7: second item at col 18 */
	    "    max_streams: 2\n",
	    NAME ":7:18: ", "a key must be non-empty, without spaces");
}

/* ---- cross references -------------------------------------------------- */

static void
test_tenant_naming_unknown_upstream(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    MINIMAL_UPSTREAMS_TENANTS           /* 2-8 */
	    "    upstream: other\n",            /* 9: value at col 15 */
	    NAME ":9:15: ", "tenants.acme.upstream: no upstream named 'other'");
}

static void
test_tenant_without_upstream_when_several(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  a:\n"                            /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "  b:\n"                            /* 5 */
	    "    url: \"http://127.0.0.1:9001\"\n" /* 6 */
	    "tenants:\n"                        /* 7 */
	    "  acme:\n"                         /* 8 */
	    "    keys: [\"k1\"]\n"              /* 9: mapping at col 5 */
	    "    max_streams: 2\n",
	    NAME ":9:5: ", "tenant 'acme': missing key 'upstream'");
}

static void
test_key_shared_by_two_tenants_reports_second_use(void **state)
{
	/*
	 * The file is wrong where the second tenant lists a key the first
	 * already has: that is the position the operator must be sent to.
	 */
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "tenants:\n"                        /* 5 */
	    "  a:\n"                            /* 6 */
	    "    keys: [\"k1\", \"k2\"]\n"      /* 7 */
	    "    max_streams: 1\n"              /* 8 */
	    "  b:\n"                            /* 9 */
	    "    keys: [\"k3\", \"k2\"]\n"      /* 10: "k2" at col 18 */
	    "    max_streams: 1\n",
	    NAME ":10:18: ", "tenants 'a' and 'b' share a key");
}

static void
test_key_shared_by_two_tenants_is_rejected(void **state)
{
	struct fx *f = *state;

	/* Whatever position is reported, the load fails with one message. */
	assert_int_equal(load(f,
	    "listen: \"127.0.0.1:8080\"\n"
	    "upstreams:\n"
	    "  main:\n"
	    "    url: \"http://127.0.0.1:9000\"\n"
	    "tenants:\n"
	    "  a:\n"
	    "    keys: [\"k1\", \"k2\"]\n"
	    "    max_streams: 1\n"
	    "  b:\n"
	    "    keys: [\"k3\", \"k2\"]\n"
	    "    max_streams: 1\n"), -1);
	assert_null(f->cfg);
	assert_int_equal(f->errs.n, 1);
	assert_non_null(strstr(f->errs.msg[0], "tenants 'a' and 'b' share a key"));
}

static void
test_key_repeated_within_one_tenant_is_rejected(void **state)
{
	struct fx *f = *state;

	assert_int_equal(load(f,
	    "listen: \"127.0.0.1:8080\"\n"
	    MINIMAL_UPSTREAMS_TENANTS
	    "  other:\n"
	    "    keys: [\"z\", \"z\"]\n"
	    "    max_streams: 1\n"), -1);
	assert_int_equal(f->errs.n, 1);
	assert_non_null(strstr(f->errs.msg[0], "lists the same key twice"));
}

/* ---- addresses and URLs ------------------------------------------------ */

static void
test_invalid_listen_address_reports_value(void **state)
{
	static const struct { const char *yaml, *needle; } cases[] = {
		{ "listen: localhost\n", "listen: 'localhost' is not host:port" },
		{ "listen: \"127.0.0.1:0\"\n", "'127.0.0.1:0' is not host:port" },
		{ "listen: \"127.0.0.1:65536\"\n", "'127.0.0.1:65536' is not" },
		{ "listen: \"127.0.0.1:http\"\n", "'127.0.0.1:http' is not" },
		{ "listen: \":8080\"\n", "':8080' is not" },
		{ "listen: \"127.0.0.1:+8080\"\n", "'127.0.0.1:+8080' is not" },
		{ "listen: \"::1:8080\"\n", "'::1:8080' is not" },
		{ "listen: \"[::1]\"\n", "'[::1]' is not" },
		{ "listen: \"[]:80\"\n", "'[]:80' is not" },
		{ "listen: 8080\n", "'8080' is not" },
	};
	struct fx *f = *state;
	char yaml[512];
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(yaml, sizeof(yaml), "%s%s", cases[i].yaml,
		    MINIMAL_UPSTREAMS_TENANTS);
		/* Line 1, the value at col 9. */
		expect_error(f, yaml, NAME ":1:9: ", cases[i].needle);
	}
}

static void
test_valid_listen_addresses_accepted(void **state)
{
	static const char *const addrs[] = {
		"127.0.0.1:1", "0.0.0.0:65535", "localhost:8080", "[::1]:8080",
		"[::]:443",
	};
	struct fx *f = *state;
	char yaml[512];
	size_t i;

	for (i = 0; i < sizeof(addrs) / sizeof(addrs[0]); i++) {
		snprintf(yaml, sizeof(yaml), "listen: \"%s\"\n%s", addrs[i],
		    MINIMAL_UPSTREAMS_TENANTS);
		expect_ok(f, yaml);
		assert_string_equal(f->cfg->listen, addrs[i]);
	}
}

static void
test_invalid_admin_listen_reports_value(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "admin_listen: \"nowhere\"\n"       /* 2: value at col 15 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":2:15: ", "admin_listen: 'nowhere' is not host:port");
}

static void
test_upstream_url_scheme_checked(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"ftp://127.0.0.1:9000\"\n" /* 4: value at col 10 */
	    "tenants:\n"
	    "  acme:\n"
	    "    keys: [\"k1\"]\n"
	    "    max_streams: 2\n",
	    NAME ":4:10: ", "must start with http:// or https://");
}

static void
test_upstream_url_with_query_rejected(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://h:1/x?y=1\"\n"   /* 4: value at col 10 */
	    "tenants:\n"
	    "  acme:\n"
	    "    keys: [\"k1\"]\n"
	    "    max_streams: 2\n",
	    NAME ":4:10: ", "must not contain a query");
}

/* ---- upstream pools (issue 10) ----------------------------------------- */

/*
 * Lines 1-5 of every pool test; the upstream "llama" continues at line 6,
 * its keys at column 5.
 */
#define POOL_HEAD                                                       \
    "listen: \"127.0.0.1:8080\"\n"          /* 1 */                     \
    "tenants:\n"                            /* 2 */                     \
    "  acme: {keys: [k1], max_streams: 2, upstream: llama}\n" /* 3 */   \
    "upstreams:\n"                          /* 4 */                     \
    "  llama:\n"                            /* 5 */

/* Two plain replicas at lines 6-8, for tests that add one key after them. */
#define POOL_TWO_REPLICAS                                               \
    POOL_HEAD                                                           \
    "    replicas:\n"                       /* 6 */                     \
    "      - url: \"http://10.0.0.1:8000\"\n" /* 7 */                   \
    "      - url: \"http://10.0.0.2:8000\"\n" /* 8 */

/* ---- fair queue (issue 24) ---------------------------------------------- */

static void
test_queue_keys_default_and_parse(void **state)
{
	struct fx *f = *state;
	const struct sl_upstream_conf *u;
	const struct sl_tenant_conf *t;

	expect_ok(f, POOL_TWO_REPLICAS);
	u = &f->cfg->upstreams[0];
	t = &f->cfg->tenants[0];
	assert_int_equal(u->queue.enabled, 0);
	assert_int_equal(u->queue.max, 1000);
	assert_int_equal(u->queue.timeout_ms, 30000);
	assert_int_equal(u->queue.fairness, SL_FAIRNESS_TOKENS);
	assert_int_equal(u->inject_priority, 0);
	assert_int_equal(t->weight, 1);
	assert_int_equal(t->priority, 0);

	expect_ok(f, POOL_TWO_REPLICAS
	    "    queue: {max: 5, timeout: 250ms, fairness: fifo}\n"
	    "    inject_priority: true\n"
	    "  other:\n"
	    "    url: \"http://10.0.0.3:8000\"\n"
	    "    queue: {}\n");
	u = &f->cfg->upstreams[0];
	assert_int_equal(u->queue.enabled, 1);
	assert_int_equal(u->queue.max, 5);
	assert_int_equal(u->queue.timeout_ms, 250);
	assert_int_equal(u->queue.fairness, SL_FAIRNESS_FIFO);
	assert_int_equal(u->inject_priority, 1);
	u = &f->cfg->upstreams[1];
	assert_int_equal(u->queue.enabled, 1);
	assert_int_equal(u->queue.max, 1000);
	assert_int_equal(u->queue.fairness, SL_FAIRNESS_TOKENS);
	assert_int_equal(u->inject_priority, 0);
}

static void
test_tenant_weight_and_priority_parse(void **state)
{
	struct fx *f = *state;

	expect_ok(f,
	    "listen: \"127.0.0.1:8080\"\n"
	    "upstreams: {main: {url: \"http://127.0.0.1:9000\"}}\n"
	    "tenants:\n"
	    "  a: {keys: [k1], max_streams: 2, weight: 1000, priority: -100}\n"
	    "  b: {keys: [k2], max_streams: 2, weight: 3, priority: 100}\n");
	assert_int_equal(f->cfg->tenants[0].weight, 1000);
	assert_int_equal(f->cfg->tenants[0].priority, -100);
	assert_int_equal(f->cfg->tenants[1].weight, 3);
	assert_int_equal(f->cfg->tenants[1].priority, 100);
}

static void
test_queue_errors_name_file_line_col(void **state)
{
	struct fx *f = *state;
	const char *want[] = {
		NAME ":9:18: ", "upstreams.llama.queue.max: 0 is out of range 1-1000000",
		NAME ":9:30: ", "upstreams.llama.queue.timeout: 5ms is out of range "
		    "10ms-1h",
		NAME ":9:45: ", "upstreams.llama.queue.fairness: 'lifo' must be one of "
		    "tokens, fifo",
		NAME ":9:51: ", "unknown key 'size' in upstreams.llama.queue",
		NAME ":10:22: ", "upstreams.llama.inject_priority: 'yes' must be true "
		    "or false",
	};

	/*        col 5      18          30            45    51 */
	expect_errors(f, POOL_TWO_REPLICAS
	    "    queue: {max: 0, timeout: 5ms, fairness: lifo, size: 1}\n" /* 9 */
	    "    inject_priority: yes\n",                                  /* 10 */
	    5, want);
}

static void
test_tenant_weight_priority_out_of_range(void **state)
{
	struct fx *f = *state;
	const char *want[] = {
		NAME ":4:43: ", "tenants.a.weight: 0 is out of range 1-1000",
		NAME ":4:56: ", "tenants.a.priority: 101 is out of range -100-100",
		NAME ":5:43: ", "tenants.b.weight: 1001 is out of range 1-1000",
		NAME ":5:59: ", "tenants.b.priority: -101 is out of range -100-100",
	};

	expect_errors(f,
	    "listen: \"127.0.0.1:8080\"\n"                              /* 1 */
	    "upstreams: {main: {url: \"http://127.0.0.1:9000\"}}\n"      /* 2 */
	    "tenants:\n"                                                 /* 3 */
	    "  a: {keys: [k1], max_streams: 2, weight: 0, priority: 101}\n"
	    "  b: {keys: [k2], max_streams: 2, weight: 1001, priority: -101}\n",
	    4, want);
}

/* What every upstream gets when it writes none of the pool keys. */
static void
assert_pool_defaults(const struct sl_upstream_conf *u)
{
	assert_int_equal(u->balance, SL_BALANCE_LEAST_LOADED);
	assert_int_equal(u->retries, 2);
	assert_int_equal(u->retry_on, SL_RETRY_CONNECT | SL_RETRY_BUSY);
	assert_non_null(u->health.path);
	assert_string_equal(u->health.path, "/health");
	assert_int_equal(u->health.interval_ms, 2000);
	assert_int_equal(u->health.timeout_ms, 1000);
	assert_int_equal(u->health.fall, 3);
	assert_int_equal(u->health.rise, 2);
	assert_int_equal(u->eject.failures, 5);
	assert_int_equal(u->eject.duration_ms, 30000);
	assert_int_equal(u->eject.max_percent, 50);
}

static void
test_url_alone_is_a_pool_of_one_with_defaults(void **state)
{
	struct fx *f = *state;
	const struct sl_upstream_conf *u;

	expect_ok(f, POOL_HEAD "    url: \"http://10.0.0.1:8000/\"\n");
	u = &f->cfg->upstreams[0];
	assert_string_equal(u->url, "http://10.0.0.1:8000");
	assert_int_equal(u->nreplicas, 1);
	assert_non_null(u->replicas);
	assert_string_equal(u->replicas[0].url, "http://10.0.0.1:8000");
	/* Its own copy: sl_config_free frees both. */
	assert_ptr_not_equal(u->replicas[0].url, u->url);
	assert_int_equal(u->replicas[0].weight, 1);
	assert_int_equal(u->replicas[0].max_streams, 0);
	assert_int_equal(u->health.enabled, 0);
	assert_pool_defaults(u);
}

static void
test_pool_parses_every_field(void **state)
{
	struct fx *f = *state;
	const struct sl_upstream_conf *u;

	expect_ok(f, POOL_HEAD
	    "    replicas:\n"
	    "      - url: \"http://10.0.0.1:8000\"\n"
	    "        weight: 2\n"
	    "        max_streams: 64\n"
	    "      - url: \"https://10.0.0.2:8443/v//\"\n"
	    "      - {url: \"http://10.0.0.3:8000\", weight: 100, max_streams: 0}\n"
	    "    api_key: \"secret\"\n"
	    "    balance: round_robin\n"
	    "    retries: 10\n"
	    "    retry_on: [connect, busy, empty]\n"
	    "    health:\n"
	    "      path: /ready?deep=1\n"
	    "      interval: 5s\n"
	    "      timeout: 1500ms\n"
	    "      fall: 100\n"
	    "      rise: 1\n"
	    "    eject:\n"
	    "      failures: 0\n"
	    "      duration: 5m\n"
	    "      max_percent: 100\n");
	u = &f->cfg->upstreams[0];
	assert_string_equal(u->name, "llama");
	assert_null(u->url);
	assert_int_equal(u->nreplicas, 3);
	assert_string_equal(u->replicas[0].url, "http://10.0.0.1:8000");
	assert_int_equal(u->replicas[0].weight, 2);
	assert_int_equal(u->replicas[0].max_streams, 64);
	assert_string_equal(u->replicas[1].url, "https://10.0.0.2:8443/v");
	assert_int_equal(u->replicas[1].weight, 1);
	assert_int_equal(u->replicas[1].max_streams, 0);
	assert_string_equal(u->replicas[2].url, "http://10.0.0.3:8000");
	assert_int_equal(u->replicas[2].weight, 100);
	assert_int_equal(u->replicas[2].max_streams, 0);
	assert_string_equal(u->api_key, "secret");
	assert_int_equal(u->balance, SL_BALANCE_ROUND_ROBIN);
	assert_int_equal(u->retries, 10);
	assert_int_equal(u->retry_on,
	    SL_RETRY_CONNECT | SL_RETRY_BUSY | SL_RETRY_EMPTY);
	assert_int_equal(u->health.enabled, 1);
	assert_string_equal(u->health.path, "/ready?deep=1");
	assert_int_equal(u->health.interval_ms, 5000);
	assert_int_equal(u->health.timeout_ms, 1500);
	assert_int_equal(u->health.fall, 100);
	assert_int_equal(u->health.rise, 1);
	assert_int_equal(u->eject.failures, 0);
	assert_int_equal(u->eject.duration_ms, 5 * 60000);
	assert_int_equal(u->eject.max_percent, 100);
	assert_int_equal(f->cfg->tenants[0].upstream_idx, 0);
}

static void
test_pool_without_health_or_eject_takes_defaults(void **state)
{
	struct fx *f = *state;
	const struct sl_upstream_conf *u;

	expect_ok(f, POOL_TWO_REPLICAS);
	u = &f->cfg->upstreams[0];
	assert_null(u->url);
	assert_int_equal(u->nreplicas, 2);
	assert_int_equal(u->replicas[1].weight, 1);
	assert_int_equal(u->replicas[1].max_streams, 0);
	assert_null(u->api_key);
	assert_int_equal(u->health.enabled, 0);
	assert_pool_defaults(u);
}

static void
test_empty_health_mapping_enables_the_probe_with_defaults(void **state)
{
	struct fx *f = *state;
	const struct sl_upstream_conf *u;

	expect_ok(f, POOL_TWO_REPLICAS "    health: {}\n    eject: {}\n");
	u = &f->cfg->upstreams[0];
	assert_int_equal(u->health.enabled, 1);
	assert_pool_defaults(u);
}

static void
test_balance_and_retry_on_words(void **state)
{
	struct fx *f = *state;

	expect_ok(f, POOL_TWO_REPLICAS "    balance: random\n    retry_on: []\n");
	assert_int_equal(f->cfg->upstreams[0].balance, SL_BALANCE_RANDOM);
	assert_int_equal(f->cfg->upstreams[0].retry_on, 0);
	expect_ok(f, POOL_TWO_REPLICAS
	    "    balance: least_loaded\n    retry_on: [empty]\n");
	assert_int_equal(f->cfg->upstreams[0].balance, SL_BALANCE_LEAST_LOADED);
	assert_int_equal(f->cfg->upstreams[0].retry_on, SL_RETRY_EMPTY);
}

static void
test_upstream_without_url_or_replicas_rejected(void **state)
{
	expect_error(*state,
	    POOL_HEAD
	    "    api_key: \"x\"\n",             /* 6: mapping at col 5 */
	    NAME ":6:5: upstream 'llama': missing required key 'url' or "
	    "'replicas'", NULL);
}

static void
test_pool_empty_replicas_list_rejected(void **state)
{
	expect_error(*state,
	    POOL_HEAD
	    "    replicas: []\n",               /* 6: '[' at col 15 */
	    NAME ":6:15: upstreams.llama.replicas: must hold at least one "
	    "replica", NULL);
}

static void
test_pool_url_and_replicas_both_rejected_at_the_second(void **state)
{
	expect_error(*state,
	    POOL_TWO_REPLICAS
	    "    url: \"http://10.0.0.3:8000\"\n", /* 9: key at col 5 */
	    NAME ":9:5: upstream 'llama': give 'url' or 'replicas', not both",
	    NULL);
	expect_error(*state,
	    POOL_HEAD
	    "    url: \"http://10.0.0.3:8000\"\n" /* 6 */
	    "    replicas:\n"                   /* 7: key at col 5 */
	    "      - url: \"http://10.0.0.1:8000\"\n",
	    NAME ":7:5: upstream 'llama': give 'url' or 'replicas', not both",
	    NULL);
}

static void
test_pool_more_than_64_replicas_rejected_at_the_65th(void **state)
{
	char yaml[8192];
	size_t o;
	int i;

	o = (size_t)snprintf(yaml, sizeof(yaml), "%s", POOL_HEAD
	    "    replicas:\n");                 /* 6 */
	for (i = 1; i <= SL_MAX_REPLICAS + 2; i++)   /* lines 7.. */
		o += (size_t)snprintf(yaml + o, sizeof(yaml) - o,
		    "      - url: \"http://10.0.0.%d:8000\"\n", i);
	assert_true(o < sizeof(yaml));
	/* The 65th entry is on line 6 + 65; its mapping starts at col 9. */
	expect_error(*state, yaml,
	    NAME ":71:9: upstreams.llama.replicas: more than 64 replicas", NULL);
}

static void
test_pool_duplicate_url_after_slash_stripping_reported_at_the_second(
    void **state)
{
	expect_error(*state,
	    POOL_TWO_REPLICAS               /* 7: the first */
	    "      - url: \"http://10.0.0.1:8000//\"\n", /* 9: value at col 14 */
	    NAME ":9:14: upstreams.llama.replicas[2].url: duplicate URL "
	    "'http://10.0.0.1:8000' (first at line 7)", NULL);
}

static void
test_pool_same_url_in_two_upstreams_is_allowed(void **state)
{
	expect_ok(*state, POOL_TWO_REPLICAS
	    "  qwen:\n"
	    "    replicas: [{url: \"http://10.0.0.1:8000\"}]\n");
}

static void
test_pool_values_out_of_range_rejected(void **state)
{
	static const char *const want[] = {
		NAME ":7:18: upstreams.llama.replicas[0].weight: 0 is out of "
		    "range 1-100", NULL,
		NAME ":7:51: upstreams.llama.replicas[0].max_streams: -1 is out "
		    "of range 0-1000000", NULL,
		NAME ":8:18: upstreams.llama.replicas[1].weight: 101 is out of "
		    "range 1-100", NULL,
		NAME ":9:14: upstreams.llama.retries: 11 is out of range 0-10",
		    NULL,
		NAME ":11:17: upstreams.llama.health.interval: 50ms is out of "
		    "range 100ms-1h", NULL,
		NAME ":12:13: upstreams.llama.health.fall: 0 is out of range "
		    "1-100", NULL,
		NAME ":13:13: upstreams.llama.health.rise: 101 is out of range "
		    "1-100", NULL,
		NAME ":15:17: upstreams.llama.eject.failures: 1001 is out of "
		    "range 0-1000", NULL,
		NAME ":16:17: upstreams.llama.eject.duration: 500ms is out of "
		    "range 1s-5m", NULL,
		NAME ":17:20: upstreams.llama.eject.max_percent: 101 is out of "
		    "range 0-100", NULL,
	};

	expect_errors(*state,
	    POOL_HEAD
	    "    replicas:\n"                   /* 6 */
	    /* 7: weight's value at col 18, max_streams' at col 51 */
	    "      - {weight: 0, url: \"http://a\", max_streams: -1}\n"
	    "      - {weight: 101, url: \"http://b\"}\n" /* 8: value at 18 */
	    "    retries: 11\n"                 /* 9: value at col 14 */
	    "    health:\n"                     /* 10 */
	    "      interval: 50ms\n"            /* 11: value at col 17 */
	    "      fall: 0\n"                   /* 12: value at col 13 */
	    "      rise: 101\n"                 /* 13: value at col 13 */
	    "    eject:\n"                      /* 14 */
	    "      failures: 1001\n"            /* 15: value at col 17 */
	    "      duration: 500ms\n"           /* 16: value at col 17 */
	    "      max_percent: 101\n",         /* 17: value at col 20 */
	    sizeof(want) / sizeof(want[0]) / 2, want);
}

static void
test_pool_max_streams_and_duration_upper_bounds(void **state)
{
	static const char *const want[] = {
		NAME ":7:22: upstreams.llama.replicas[0].max_streams: 1000001 is "
		    "out of range 0-1000000", NULL,
		NAME ":10:23: upstreams.llama.eject.duration: 6m is out of range "
		    "1s-5m", NULL,
	};

	expect_errors(*state,
	    POOL_HEAD
	    "    replicas:\n"                   /* 6 */
	    "      - max_streams: 1000001\n"    /* 7: value at col 22 */
	    "        url: \"http://a\"\n"       /* 8 */
	    "    eject: {failures: 5,\n"        /* 9 */
	    "            duration: 6m}\n",      /* 10: value at col 23 */
	    sizeof(want) / sizeof(want[0]) / 2, want);
}

static void
test_pool_unknown_balance_and_retry_on_words_rejected(void **state)
{
	static const char *const want[] = {
		NAME ":9:14: upstreams.llama.balance: 'fastest' must be one of "
		    "least_loaded, round_robin, random, prefix_affinity", NULL,
		NAME ":10:22: upstreams.llama.retry_on: 'timeout' must be one of "
		    "connect, busy, empty", NULL,
		NAME ":13:15: upstreams.qwen.retry_on: expected a list, got a "
		    "scalar", NULL,
	};

	expect_errors(*state,
	    POOL_TWO_REPLICAS
	    "    balance: fastest\n"            /* 9: value at col 14 */
	    "    retry_on: [busy, timeout]\n"   /* 10: 'timeout' at col 22 */
	    "  qwen:\n"                         /* 11 */
	    "    url: \"http://10.0.0.9:8000\"\n" /* 12 */
	    "    retry_on: connect\n",          /* 13: value at col 15 */
	    sizeof(want) / sizeof(want[0]) / 2, want);
}

static void
test_pool_unknown_keys_rejected_everywhere(void **state)
{
	static const char *const want[] = {
		NAME ":8:9: unknown key 'wieght' in upstreams.llama.replicas[0]",
		    NULL,
		NAME ":10:7: unknown key 'intreval' in upstreams.llama.health",
		    NULL,
		NAME ":12:7: unknown key 'percent' in upstreams.llama.eject",
		    NULL,
		NAME ":13:5: unknown key 'health.path' in upstream 'llama'",
		    NULL,
	};

	expect_errors(*state,
	    POOL_HEAD
	    "    replicas:\n"                   /* 6 */
	    "      - url: \"http://10.0.0.1:8000\"\n" /* 7 */
	    "        wieght: 2\n"               /* 8: key at col 9 */
	    "    health:\n"                     /* 9 */
	    "      intreval: 2s\n"              /* 10: key at col 7 */
	    "    eject:\n"                      /* 11 */
	    "      percent: 10\n"               /* 12: key at col 7 */
	    "    health.path: /x\n",            /* 13: key at col 5 */
	    sizeof(want) / sizeof(want[0]) / 2, want);
}

static void
test_pool_replica_entry_must_be_a_mapping_with_a_url(void **state)
{
	static const char *const want[] = {
		NAME ":7:9: upstreams.llama.replicas[0]: expected a mapping, got "
		    "a scalar", NULL,
		NAME ":8:9: upstreams.llama.replicas[1]: missing required key "
		    "'url'", NULL,
		NAME ":9:9: upstreams.llama.replicas[2]: expected a mapping, got "
		    "a list", NULL,
		NAME ":10:15: upstreams.llama.replicas[3].url: 'ftp://a' must "
		    "start with http:// or https://", NULL,
	};

	expect_errors(*state,
	    POOL_HEAD
	    "    replicas:\n"                   /* 6 */
	    "      - \"http://10.0.0.1:8000\"\n" /* 7: scalar at col 9 */
	    "      - weight: 2\n"               /* 8: mapping at col 9 */
	    "      - [url]\n"                   /* 9: list at col 9 */
	    "      - {url: \"ftp://a\"}\n",     /* 10: value at col 15 */
	    sizeof(want) / sizeof(want[0]) / 2, want);
}

static void
test_pool_replicas_must_be_a_list(void **state)
{
	expect_error(*state,
	    POOL_HEAD
	    "    replicas: {url: \"http://a\"}\n", /* 6: '{' at col 15 */
	    NAME ":6:15: upstreams.llama.replicas: expected a list of "
	    "mappings, got a mapping", NULL);
}

static void
test_health_timeout_not_below_interval_rejected(void **state)
{
	/* Both written: at the timeout. */
	expect_error(*state,
	    POOL_TWO_REPLICAS
	    "    health:\n"                     /* 9 */
	    "      interval: 2s\n"              /* 10 */
	    "      timeout: 2000ms\n",          /* 11: value at col 16 */
	    NAME ":11:16: upstreams.llama.health.timeout: 2000ms must be less "
	    "than health.interval (2s)", NULL);
	/* Only the interval written, below the default timeout: at it. */
	expect_error(*state,
	    POOL_TWO_REPLICAS
	    "    health: {interval: 500ms}\n",  /* 9: value at col 24 */
	    NAME ":9:24: upstreams.llama.health.interval: 500ms must be more "
	    "than health.timeout (1s)", NULL);
}

static void
test_health_path_must_be_a_clean_absolute_path(void **state)
{
	static const char *const want[] = {
		NAME ":10:13: upstreams.llama.health.path: 'health' must start "
		    "with '/' and hold no spaces or control characters", NULL,
		NAME ":13:20: upstreams.qwen.health.path: '/he alth' must start "
		    "with '/' and hold no spaces or control characters", NULL,
	};

	expect_errors(*state,
	    POOL_TWO_REPLICAS
	    "    health:\n"                     /* 9 */
	    "      path: health\n"              /* 10: value at col 13 */
	    "  qwen:\n"                         /* 11 */
	    "    url: \"http://10.0.0.9:8000\"\n" /* 12 */
	    "    health: {path: \"/he alth\"}\n", /* 13: value at col 20 */
	    sizeof(want) / sizeof(want[0]) / 2, want);
}

static void
test_aliased_replica_is_one_error_not_a_duplicate(void **state)
{
	expect_error(*state,
	    POOL_HEAD
	    "    replicas:\n"                   /* 6 */
	    "      - &r {url: \"http://10.0.0.1:8000\"}\n" /* 7 */
	    "      - *r\n",                     /* 8: alias at col 9 */
	    NAME ":8:9: aliases are not allowed (*r)", NULL);
}

/* ---- YAML level problems ----------------------------------------------- */

static void
test_syntax_error_reports_problem_position(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "workers: 2: 3\n",                  /* 2: second ':' at col 11 */
	    NAME ":2:11: mapping values are not allowed in this context", NULL);
}

static void
test_bad_indentation_reports_problem_position(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "timeouts:\n"                       /* 2 */
	    "  client_header: 5s\n"             /* 3 */
	    " keepalive: 5s\n",                 /* 4: 'k' at col 2 */
	    NAME ":4:2: ", "did not find expected key");
}

static void
test_unclosed_flow_sequence_reports_problem_position(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "tenants:\n"                        /* 5 */
	    "  acme:\n"                         /* 6 */
	    "    keys: [\"k1\", \"k2\"\n"       /* 7 */
	    "    max_streams: 2\n",             /* 8: next token at col 5 */
	    NAME ":8:5: ", "did not find expected ',' or ']'");
}

static void
test_empty_document_rejected(void **state)
{
	expect_error(*state, "", NAME ":1:1: empty configuration", NULL);
	expect_error(*state, "# only a comment\n\n",
	    NAME ":1:1: empty configuration", NULL);
}

static void
test_non_mapping_document_rejected(void **state)
{
	expect_error(*state, "- listen\n- workers\n",
	    NAME ":1:1: ", "the configuration must be a mapping, got a list");
}

static void
test_second_document_rejected(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    MINIMAL_UPSTREAMS_TENANTS           /* 2-8 */
	    "---\n"                             /* 9 */
	    "listen: \"127.0.0.1:9999\"\n",     /* 10 */
	    NAME ":9:1: ", "only one YAML document is allowed");
}

static void
test_several_problems_all_reported(void **state)
{
	static const char *const want[] = {
		NAME ":1:9: ", "listen: 'nope' is not host:port",
		NAME ":2:10: ", "workers: '0' must be auto",
		NAME ":3:16: ", "stream_buffer: '1KB' is not a size",
		NAME ":5:18: ", "timeouts.client_header: '10' is not a duration",
		NAME ":6:1: ", "unknown key 'bogus'",
		NAME ":9:10: ", "must start with http:// or https://",
		NAME ":13:18: ", "tenants.acme.max_streams: -1 is out of range",
	};

	expect_errors(*state,
	    "listen: nope\n"                    /* 1: value col 9 */
	    "workers: 0\n"                      /* 2: value col 10 */
	    "stream_buffer: 1KB\n"              /* 3: value col 16 */
	    "timeouts:\n"                       /* 4 */
	    "  client_header: 10\n"             /* 5: value col 18 */
	    "bogus: yes\n"                      /* 6: key col 1 */
	    "upstreams:\n"                      /* 7 */
	    "  main:\n"                         /* 8 */
	    "    url: \"ftp://x\"\n"            /* 9: value col 10 */
	    "tenants:\n"                        /* 10 */
	    "  acme:\n"                         /* 11 */
	    "    keys: [\"k1\"]\n"              /* 12 */
	    "    max_streams: -1\n",            /* 13: value col 18 */
	    sizeof(want) / sizeof(want[0]) / 2, want);
}

static void
test_errors_print_one_line_each(void **state)
{
	struct fx *f = *state;
	char *out = NULL;
	size_t outlen = 0;
	FILE *fp;

	assert_int_equal(load(f, "workers: 2\n"), -1);
	assert_int_equal(f->errs.n, 3);
	fp = open_memstream(&out, &outlen);
	assert_non_null(fp);
	sl_errors_print(&f->errs, fp);
	assert_int_equal(fclose(fp), 0);
	assert_string_equal(out,
	    NAME ":1:1: missing required key 'listen'\n"
	    NAME ":1:1: missing required key 'upstreams'\n"
	    NAME ":1:1: missing required key 'tenants'\n");
	free(out);
	sl_errors_free(&f->errs);
	assert_int_equal(f->errs.n, 0);
	assert_null(f->errs.msg);
}

/* ---- issue 9: limits, positions and what a request can present ------- */

/* "listen: " then n '[' and n ']': the k-th '[' is at column 8 + k. */
static char *
nested_listen(size_t n, char open, char close)
{
	char *s = malloc(8 + 2 * n + 2);
	size_t i;

	assert_non_null(s);
	memcpy(s, "listen: ", 8);
	for (i = 0; i < n; i++) {
		s[8 + i] = open;
		s[8 + n + i] = close;
	}
	s[8 + 2 * n] = '\n';
	s[8 + 2 * n + 1] = '\0';
	return s;
}

static void
test_nesting_deeper_than_32_levels_is_rejected_where_it_starts(void **state)
{
	static const char *const want32[] = {
		NAME ":1:1: missing required key 'upstreams'", NULL,
		NAME ":1:1: missing required key 'tenants'", NULL,
		NAME ":1:9: listen: expected a value, got a list", NULL,
	};
	struct fx *f = *state;
	char *yaml;

	/*
	 * The root mapping is level 1, so the 32nd '[' opens level 33: col 40.
	 * Only that is reported: the rest of the document is not read.
	 */
	yaml = nested_listen(32, '[', ']');
	expect_error(f, yaml,
	    NAME ":1:40: nesting deeper than 32 levels (lists and mappings "
	    "inside each other)", NULL);
	free(yaml);
	yaml = nested_listen(100000, '[', ']');
	expect_error(f, yaml,
	    NAME ":1:40: nesting deeper than 32 levels (lists and mappings "
	    "inside each other)", NULL);
	free(yaml);
	yaml = nested_listen(40, '{', '}');
	expect_error(f, yaml,
	    NAME ":1:40: nesting deeper than 32 levels (lists and mappings "
	    "inside each other)", NULL);
	free(yaml);
	/* 32 levels are read as a document: then only what it says is wrong. */
	yaml = nested_listen(31, '[', ']');
	expect_errors(f, yaml, 3, want32);
	free(yaml);
}

static void
test_non_utf8_byte_reports_its_own_line_and_column(void **state)
{
	/* Columns count characters, as libyaml's marks do: "é" is one. */
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "log_level: info\n"                 /* 2 */
	    "access_log: \"/tmp/\xc3\xa9\xff.log\"\n" /* 3: 0xff at col 20 */
	    MINIMAL_UPSTREAMS_TENANTS,
	    NAME ":3:20: invalid leading UTF-8 octet (byte 0xff)", NULL);
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\r\n"    /* 1 */
	    "\r\n"                              /* 2 */
	    "# caf\xc3\n",                      /* 3: 0xc3, then '\n' at col 7 */
	    NAME ":3:7: invalid trailing UTF-8 octet (byte 0x0a)", NULL);
}

static void
test_tenant_key_with_control_character_rejected(void **state)
{
	static const char *const want[] = {
		NAME ":7:18: ", "a key must be non-empty, without spaces or "
		    "control characters",
		NAME ":7:28: ", "a key must be non-empty, without spaces or "
		    "control characters",
		NAME ":7:38: ", "a key must be non-empty, without spaces or "
		    "control characters",
	};
	struct fx *f = *state;

	expect_errors(f,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "tenants:\n"                        /* 5 */
	    "  acme:\n"                         /* 6 */
	    /* 7: items at cols 12, 18, 28, 38 */
	    "    keys: [\"ok\", \"a\\x01b\", \"a\\x7fb\", \"a\\eb\"]\n"
	    "    max_streams: 2\n",
	    sizeof(want) / sizeof(want[0]) / 2, want);
	/* Visible ASCII and UTF-8 can be sent in a Bearer token. */
	expect_ok(f,
	    "listen: \"127.0.0.1:8080\"\n"
	    "upstreams:\n"
	    "  main:\n"
	    "    url: \"http://127.0.0.1:9000\"\n"
	    "tenants:\n"
	    "  acme:\n"
	    "    keys: [\"sk-~!#$%&'*+/=?^_`{|}:;<>,.@\\\\\", \"ключ-1\"]\n"
	    "    max_streams: 2\n");
	assert_string_equal(f->cfg->tenants[0].keys[0],
	    "sk-~!#$%&'*+/=?^_`{|}:;<>,.@\\");
	assert_string_equal(f->cfg->tenants[0].keys[1], "ключ-1");
}

static void
test_empty_tenant_name_rejected(void **state)
{
	expect_error(*state,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "upstreams:\n"                      /* 2 */
	    "  main:\n"                         /* 3 */
	    "    url: \"http://127.0.0.1:9000\"\n" /* 4 */
	    "tenants:\n"                        /* 5 */
	    "  \"\":\n"                         /* 6: key at col 3 */
	    "    keys: [\"k1\"]\n"
	    "    max_streams: 2\n",
	    NAME ":6:3: tenants: a tenant name must not be empty", NULL);
}

/*
 * Many keys, some repeated: each repeat is reported once, where it is,
 * naming the tenant that listed the key first.
 */
static void
test_100k_keys_load_and_each_repeat_is_reported_once(void **state)
{
	enum { NT = 1000, PER = 100 };
	struct fx *f = *state;
	char *yaml, *p;
	size_t cap = 64 + (size_t)NT * (40 + PER * 32), t, k, line = 5;
	size_t l_dup2 = 0, l_dup3 = 0, l_same = 0;
	char want[3][64];
	const char *w[6];

	yaml = malloc(cap);
	assert_non_null(yaml);
	p = yaml;
	p += sprintf(p, "listen: \"127.0.0.1:8080\"\n"
	    "upstreams:\n  main:\n    url: \"http://127.0.0.1:9000\"\n"
	    "tenants:\n");
	for (t = 0; t < NT; t++) {
		p += sprintf(p, "  t%zu:\n    max_streams: 1\n    keys:\n", t);
		line += 3;
		for (k = 0; k < PER; k++) {
			p += sprintf(p, "      - \"sk-%zu-%zu\"\n", t, k);
			line++;
		}
	}
	assert_true((size_t)(p - yaml) < cap);
	expect_ok(f, yaml);
	assert_int_equal(f->cfg->ntenants, NT);
	assert_string_equal(f->cfg->tenants[NT - 1].keys[PER - 1], "sk-999-99");

	/* t500 lists t3's key, t998 and t999 too; t999 repeats its own. */
	p += sprintf(p, "  t500b:\n    max_streams: 1\n    keys:\n");
	line += 3;
	l_dup2 = ++line;
	p += sprintf(p, "      - \"sk-3-7\"\n");
	p += sprintf(p, "  t998b:\n    max_streams: 1\n    keys:\n");
	line += 3;
	l_dup3 = ++line;
	p += sprintf(p, "      - \"sk-3-7\"\n");
	line++;
	p += sprintf(p, "      - \"x\"\n");
	l_same = ++line;
	p += sprintf(p, "      - \"x\"\n");
	assert_true((size_t)(p - yaml) < cap);
	snprintf(want[0], sizeof(want[0]), NAME ":%zu:9: ", l_dup2);
	snprintf(want[1], sizeof(want[1]), NAME ":%zu:9: ", l_dup3);
	snprintf(want[2], sizeof(want[2]), NAME ":%zu:9: ", l_same);
	w[0] = want[0];
	w[1] = "tenants 't3' and 't500b' share a key";
	w[2] = want[1];
	w[3] = "tenants 't3' and 't998b' share a key";
	w[4] = want[2];
	w[5] = "tenant 't998b' lists the same key twice";
	expect_errors(f, yaml, 3, w);
	free(yaml);
}

/* Write text to f->tmp (mode 0600) and return the path. */
static const char *
write_tmp(struct fx *f, const char *text)
{
	FILE *fp;
	int fd;

	snprintf(f->tmp, sizeof(f->tmp), "/tmp/sl-test-config-XXXXXX");
	fd = mkstemp(f->tmp);
	assert_true(fd >= 0);
	fp = fdopen(fd, "w");
	assert_non_null(fp);
	assert_int_equal(fwrite(text, 1, strlen(text), fp), strlen(text));
	assert_int_equal(fclose(fp), 0);
	return f->tmp;
}

static void
test_load_file_refuses_what_is_not_a_regular_file(void **state)
{
	struct fx *f = *state;

	assert_int_equal(sl_config_load_file("/tmp", &f->cfg, &f->errs), -1);
	assert_null(f->cfg);
	assert_int_equal(f->errs.n, 1);
	assert_string_equal(f->errs.msg[0],
	    "/tmp:1:1: not a regular file (a directory)");
	sl_errors_free(&f->errs);
	assert_int_equal(sl_config_load_file("/dev/null", &f->cfg, &f->errs), -1);
	assert_int_equal(f->errs.n, 1);
	assert_string_equal(f->errs.msg[0],
	    "/dev/null:1:1: not a regular file (a character device)");
}

static void
test_load_file_reports_an_access_log_it_cannot_open(void **state)
{
	struct fx *f = *state;
	char want[256], log[64];
	const char *path;

	path = write_tmp(f,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    "access_log: /nonexistent-sluice-dir/access.log\n" /* 2: col 13 */
	    MINIMAL_UPSTREAMS_TENANTS);
	assert_int_equal(sl_config_load_file(path, &f->cfg, &f->errs), -1);
	assert_null(f->cfg);
	snprintf(want, sizeof(want), "%s:2:13: access_log: cannot open "
	    "'/nonexistent-sluice-dir/access.log': No such file or directory",
	    path);
	assert_int_equal(f->errs.n, 1);
	assert_string_equal(f->errs.msg[0], want);
	unlink(f->tmp);
	sl_errors_free(&f->errs);

	path = write_tmp(f,
	    "listen: \"127.0.0.1:8080\"\n"      /* 1 */
	    MINIMAL_UPSTREAMS_TENANTS           /* 2-8 */
	    "access_log: \"/tmp\"\n");          /* 9: col 13 */
	assert_int_equal(sl_config_load_file(path, &f->cfg, &f->errs), -1);
	snprintf(want, sizeof(want), "%s:9:13: access_log: cannot open "
	    "'/tmp': Is a directory", path);
	assert_int_equal(f->errs.n, 1);
	assert_string_equal(f->errs.msg[0], want);
	unlink(f->tmp);
	sl_errors_free(&f->errs);

	/* stderr and a file that can be created are fine. */
	path = write_tmp(f, "listen: \"127.0.0.1:8080\"\naccess_log: stderr\n"
	    MINIMAL_UPSTREAMS_TENANTS);
	assert_int_equal(sl_config_load_file(path, &f->cfg, &f->errs), 0);
	assert_string_equal(f->cfg->access_log, "stderr");
	sl_config_free(f->cfg);
	f->cfg = NULL;
	unlink(f->tmp);
	snprintf(log, sizeof(log), "/tmp/sl-test-access-%ld.log", (long)getpid());
	unlink(log);
	snprintf(want, sizeof(want), "listen: \"127.0.0.1:8080\"\n"
	    "access_log: %s\n" MINIMAL_UPSTREAMS_TENANTS, log);
	path = write_tmp(f, want);
	assert_int_equal(sl_config_load_file(path, &f->cfg, &f->errs), 0);
	assert_int_equal(access(log, W_OK), 0);
	unlink(log);
}

static void
test_permission_warning_names_a_file_readable_by_others(void **state)
{
	struct fx *f = *state;
	char msg[512], want[512];
	const char *path = write_tmp(f, "x: 1\n");

	assert_int_equal(chmod(path, 0644), 0);
	assert_int_equal(sl_config_permission_warning(path, msg, sizeof(msg)), 1);
	snprintf(want, sizeof(want),
	    "%s holds API keys and is readable by others (chmod o-r)", path);
	assert_string_equal(msg, want);
	assert_int_equal(chmod(path, 0604), 0);
	assert_int_equal(sl_config_permission_warning(path, msg, sizeof(msg)), 1);
	assert_int_equal(chmod(path, 0640), 0);
	assert_int_equal(sl_config_permission_warning(path, msg, sizeof(msg)), 0);
	assert_int_equal(chmod(path, 0600), 0);
	assert_int_equal(sl_config_permission_warning(path, msg, sizeof(msg)), 0);
}

/* ---- value parsers ------------------------------------------------------ */

static void
test_parse_size_valid_forms(void **state)
{
	static const struct { const char *s; uint64_t v; } ok[] = {
		{ "0", 0 }, { "512", 512 }, { "512B", 512 }, { "64KiB", 64 * KIB },
		{ "1 MiB", MIB }, { "2GiB", 2 * GIB }, { "0KiB", 0 },
		{ "1024GiB", 1024 * GIB },
	};
	size_t i;
	uint64_t v;

	for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		v = 12345;
		if (sl_parse_size(ok[i].s, &v) != 0 || v != ok[i].v) {
			print_error("sl_parse_size(\"%s\") -> %" PRIu64 ", want %" PRIu64 "\n",
			    ok[i].s, v, ok[i].v);
			fail();
		}
	}
}

static void
test_parse_size_rejects_invalid(void **state)
{
	static const char *const bad[] = {
		"", " ", "KiB", "-1", "1KB", "1.5KiB", "1kib", "1 K", "1x", "0x10",
		"99999999999999999999", "17179869184GiB", "1KiBB", "B",
	};
	size_t i;
	uint64_t v;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = 777;
		if (sl_parse_size(bad[i], &v) != -1 || v != 777) {
			print_error("sl_parse_size(\"%s\") accepted (%" PRIu64 ")\n",
			    bad[i], v);
			fail();
		}
	}
}

static void
test_parse_duration_valid_forms(void **state)
{
	static const struct { const char *s; uint64_t ms; } ok[] = {
		{ "250ms", 250 }, { "1.5s", 1500 }, { "2m", 120000 },
		{ "1h", 3600000 }, { "0s", 0 }, { "0ms", 0 }, { "30s", 30000 },
		{ "0.25s", 250 }, { "1.5m", 90000 },
	};
	size_t i;
	uint64_t v;

	for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		v = 12345;
		if (sl_parse_duration_ms(ok[i].s, &v) != 0 || v != ok[i].ms) {
			print_error("sl_parse_duration_ms(\"%s\") -> %" PRIu64
			    ", want %" PRIu64 "\n", ok[i].s, v, ok[i].ms);
			fail();
		}
	}
}

static void
test_parse_duration_rejects_invalid(void **state)
{
	static const char *const bad[] = {
		"", "10", "s", "ms", "1x", "-1s", "1.s", ".5s", "1.5", "1sec",
		"1 hour", "1d", "99999999999999999999s", "5124095576031h",
	};
	size_t i;
	uint64_t v;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = 777;
		if (sl_parse_duration_ms(bad[i], &v) != -1 || v != 777) {
			print_error("sl_parse_duration_ms(\"%s\") accepted (%" PRIu64
			    ")\n", bad[i], v);
			fail();
		}
	}
}

/* ---- the key table ------------------------------------------------------ */

static void
test_key_table_paths_unique(void **state)
{
	const struct sl_key_info *k = sl_config_keys(), *j;
	size_t n = 0;

	assert_non_null(k);
	for (; k->path != NULL; k++, n++)
		for (j = k + 1; j->path != NULL; j++)
			if (strcmp(k->path, j->path) == 0) {
				print_error("duplicate key table row '%s'\n", k->path);
				fail();
			}
	assert_true(n > 0);
}

static void
test_key_table_rows_have_help(void **state)
{
	const struct sl_key_info *k;

	for (k = sl_config_keys(); k->path != NULL; k++) {
		if (k->type == SL_KEY_MAP)
			continue;
		if (k->help == NULL || k->help[0] == '\0') {
			print_error("key '%s' has no help text\n", k->path);
			fail();
		}
	}
}

static void
test_key_table_lists_every_sample_key(void **state)
{
	static const char *const want[] = {
		"listen", "workers", "admin_listen", "stream_buffer",
		"drain_timeout", "timeouts", "timeouts.upstream_connect",
		"timeouts.upstream_first_byte", "timeouts.upstream_idle",
		"timeouts.client_header", "timeouts.client_stall",
		"timeouts.keepalive", "limits", "limits.max_header_bytes",
		"limits.max_body_bytes", "limits.max_connections", "upstreams",
		"upstreams.*.url", "upstreams.*.api_key", "tenants",
		"tenants.*.keys", "tenants.*.max_streams", "tenants.*.retry_after",
		"tenants.*.upstream", "upstreams.*.replicas",
		"upstreams.*.replicas[].url", "upstreams.*.replicas[].weight",
		"upstreams.*.replicas[].max_streams", "upstreams.*.balance",
		"upstreams.*.retries", "upstreams.*.retry_on",
		"upstreams.*.health", "upstreams.*.health.path",
		"upstreams.*.health.interval", "upstreams.*.health.timeout",
		"upstreams.*.health.fall", "upstreams.*.health.rise",
		"upstreams.*.eject", "upstreams.*.eject.failures",
		"upstreams.*.eject.duration", "upstreams.*.eject.max_percent",
	};
	size_t i;

	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		const struct sl_key_info *k;

		for (k = sl_config_keys(); k->path != NULL; k++)
			if (strcmp(k->path, want[i]) == 0)
				break;
		if (k->path == NULL) {
			print_error("key '%s' missing from the table\n", want[i]);
			fail();
		}
	}
}

static void
test_key_table_defaults_parse_as_their_type(void **state)
{
	const struct sl_key_info *k;
	uint64_t v;

	for (k = sl_config_keys(); k->path != NULL; k++) {
		if (k->def == NULL)
			continue;
		if (k->type == SL_KEY_SIZE && sl_parse_size(k->def, &v) != 0) {
			print_error("default of '%s' is not a size: %s\n", k->path, k->def);
			fail();
		}
		if (k->type == SL_KEY_DURATION &&
		    sl_parse_duration_ms(k->def, &v) != 0) {
			print_error("default of '%s' is not a duration: %s\n", k->path,
			    k->def);
			fail();
		}
	}
}

/* ---- cluster ---------------------------------------------------------- */

/* MINIMAL_UPSTREAMS_TENANTS is lines 2-8; `cluster:` is line 9. */
#define CLUSTER_HEAD "listen: \"127.0.0.1:8080\"\n" MINIMAL_UPSTREAMS_TENANTS "cluster:\n"

static void
test_cluster_section_loads_every_field(void **state)
{
	struct fx *f = *state;
	const struct sl_cluster_conf *cl;

	expect_ok(f, CLUSTER_HEAD
	    "  redis: \"127.0.0.1:6380\"\n"
	    "  password: \"s3cret\"\n"
	    "  node: \"gw-a.eu_1\"\n"
	    "  lease_ttl: 30s\n"
	    "  heartbeat: 10s\n"
	    "  timeout: 250ms\n"
	    "  on_redis_down: closed\n");
	cl = &f->cfg->cluster;
	assert_int_equal(cl->enabled, 1);
	assert_string_equal(cl->redis, "127.0.0.1:6380");
	assert_string_equal(cl->password, "s3cret");
	assert_string_equal(cl->node, "gw-a.eu_1");
	assert_int_equal(cl->lease_ttl_ms, 30000);
	assert_int_equal(cl->heartbeat_ms, 10000);
	assert_int_equal(cl->timeout_ms, 250);
	assert_int_equal(cl->on_redis_down, SL_DOWN_CLOSED);
}

static void
test_cluster_defaults_and_absence(void **state)
{
	struct fx *f = *state;
	const struct sl_cluster_conf *cl;
	size_t i;

	expect_ok(f, "listen: \"127.0.0.1:8080\"\n" MINIMAL_UPSTREAMS_TENANTS);
	assert_int_equal(f->cfg->cluster.enabled, 0);
	expect_ok(f, CLUSTER_HEAD "  redis: \"unix:/run/redis/redis.sock\"\n"
	    "  password: \"\"\n");
	cl = &f->cfg->cluster;
	assert_int_equal(cl->enabled, 1);
	assert_string_equal(cl->redis, "unix:/run/redis/redis.sock");
	assert_null(cl->password);              /* "": no AUTH */
	assert_int_equal(cl->lease_ttl_ms, 10000);
	assert_int_equal(cl->heartbeat_ms, 2000);
	assert_int_equal(cl->timeout_ms, 100);
	assert_int_equal(cl->on_redis_down, SL_DOWN_LOCAL_SHARE);
	/* The node defaults to the short host name, in the allowed characters. */
	assert_non_null(cl->node);
	assert_true(strlen(cl->node) >= 1 && strlen(cl->node) <= 64);
	for (i = 0; cl->node[i] != '\0'; i++)
		assert_non_null(strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
		    "0123456789._-", cl->node[i]));
	expect_ok(f, CLUSTER_HEAD "  redis: \"[::1]:6379\"\n"
	    "  lease_ttl: 3s\n"
	    "  heartbeat: 1s\n"
	    "  on_redis_down: local_full\n");
	assert_int_equal(f->cfg->cluster.on_redis_down, SL_DOWN_LOCAL_FULL);
}

static void
test_cluster_heartbeat_over_a_third_of_lease_ttl_reports_value(void **state)
{
	expect_error(*state, CLUSTER_HEAD
	    "  redis: \"127.0.0.1:6379\"\n"     /* 10 */
	    "  lease_ttl: 3s\n"                 /* 11 */
	    "  heartbeat: 1001ms\n",            /* 12: value at col 14 */
	    NAME ":12:14: cluster.heartbeat: 1001ms must be at most lease_ttl / 3 "
	    "(1000ms)", NULL);
	/* The default heartbeat (2s) against a short lease_ttl: at lease_ttl. */
	expect_error(*state, CLUSTER_HEAD
	    "  redis: \"127.0.0.1:6379\"\n"
	    "  lease_ttl: 5s\n",              /* 11: value at col 14 */
	    NAME ":11:14: cluster.heartbeat: 2000ms must be at most lease_ttl / 3",
	    "(1666ms)");
}

static void
test_cluster_redis_host_name_is_refused(void **state)
{
	expect_error(*state, CLUSTER_HEAD
	    "  redis: \"redis.internal:6379\"\n", /* 10: value at col 10 */
	    NAME ":10:10: cluster.redis: 'redis.internal:6379' is not IP:port, "
	    "[v6]:port or unix:/path", "host names are not resolved");
	expect_error(*state, CLUSTER_HEAD
	    "  redis: \"unix:relative.sock\"\n",
	    NAME ":10:10: cluster.redis: 'unix:relative.sock' is not", "unix:/path");
	expect_error(*state, CLUSTER_HEAD "  node: \"gw-a\"\n",
	    NAME ":10:3: cluster: missing required key 'redis' (or 'sentinels')",
	    NULL);
}

static void
test_cluster_sentinels_load(void **state)
{
	struct fx *f = *state;
	const struct sl_cluster_conf *cl;

	expect_ok(f, CLUSTER_HEAD
	    "  sentinels: [\"127.0.0.1:26379\", \"[::1]:26380\", "
	    "\"10.0.0.3:26379\"]\n"
	    "  master_name: \"sluice\"\n"
	    "  sentinel_password: \"s3\"\n"
	    "  password: \"m4\"\n");
	cl = &f->cfg->cluster;
	assert_null(cl->redis);
	assert_int_equal(cl->nsentinels, 3);
	assert_string_equal(cl->sentinels[0], "127.0.0.1:26379");
	assert_string_equal(cl->sentinels[1], "[::1]:26380");
	assert_string_equal(cl->sentinels[2], "10.0.0.3:26379");
	assert_string_equal(cl->master_name, "sluice");
	assert_string_equal(cl->sentinel_password, "s3");
	assert_string_equal(cl->password, "m4");
}

static void
test_cluster_redis_and_sentinels_exactly_one(void **state)
{
	expect_error(*state, CLUSTER_HEAD
	    "  redis: \"127.0.0.1:6379\"\n"                 /* 10 */
	    "  sentinels: [\"127.0.0.1:26379\"]\n"          /* 11: col 14 */
	    "  master_name: m\n",
	    NAME ":11:14: cluster.sentinels: give either redis or sentinels, "
	    "not both", "fixed address");
	expect_error(*state, CLUSTER_HEAD
	    "  sentinels: [\"127.0.0.1:26379\"]\n",         /* 10: col 14 */
	    NAME ":10:14: cluster: missing required key 'master_name'",
	    "with 'sentinels'");
	expect_error(*state, CLUSTER_HEAD
	    "  redis: \"127.0.0.1:6379\"\n"
	    "  master_name: m\n",                           /* 11: col 16 */
	    NAME ":11:16: cluster.master_name: only with 'sentinels'", NULL);
	expect_error(*state, CLUSTER_HEAD
	    "  redis: \"127.0.0.1:6379\"\n"
	    "  sentinel_password: pw\n",                    /* 11: col 22 */
	    NAME ":11:22: cluster.sentinel_password: only with 'sentinels'",
	    NULL);
}

static void
test_cluster_sentinels_bad_entries_report_position(void **state)
{
	static const char *const want[] = {
		NAME ":10:34: cluster.sentinels: 'sentinel.lan:26379' is not "
		"IP:port or [v6]:port", "host names are not resolved",
		NAME ":10:56: cluster.sentinels: '127.0.0.1:26379' is listed twice",
		NULL,
		NAME ":11:16: cluster.master_name: 'my master' must be 1-64 of",
		"A-Z a-z",
	};

	expect_errors(*state, CLUSTER_HEAD
	    "  sentinels: [\"127.0.0.1:26379\", \"sentinel.lan:26379\", "
	    "\"127.0.0.1:26379\"]\n"
	    "  master_name: \"my master\"\n", 3, want);
	/* The same sentinel written two ways is the same sentinel. */
	expect_error(*state, CLUSTER_HEAD
	    "  sentinels: [\"127.0.0.1:26379\", \"127.0.0.1:026379\"]\n"
	    "  master_name: m\n",
	    NAME ":10:34: cluster.sentinels: '127.0.0.1:026379' is listed twice "
	    "(as '127.0.0.1:26379')", NULL);
	expect_error(*state, CLUSTER_HEAD
	    "  sentinels: [\"[::1]:26379\", \"[0:0::1]:26379\"]\n"
	    "  master_name: m\n",
	    NAME ":10:30: cluster.sentinels: '[0:0::1]:26379' is listed twice "
	    "(as '[::1]:26379')", NULL);
	expect_error(*state, CLUSTER_HEAD
	    "  sentinels: []\n"
	    "  master_name: m\n",
	    NAME ":10:14: cluster.sentinels: 0 entries; 1-16 sentinel addresses "
	    "are allowed", NULL);
	expect_error(*state, CLUSTER_HEAD
	    "  sentinels: \"127.0.0.1:26379\"\n"
	    "  master_name: m\n",
	    NAME ":10:14: cluster.sentinels: expected a list, got a scalar", NULL);
}

static void
test_cluster_bad_on_redis_down_and_node_report_value(void **state)
{
	static const char *const want[] = {
		NAME ":11:18: cluster.on_redis_down: 'open' must be one of "
		"local_share, closed, local_full", NULL,
		NAME ":12:9: cluster.node: 'gw:a' must be 1-64 of", "A-Z a-z 0-9 . _ -",
	};

	expect_errors(*state, CLUSTER_HEAD
	    "  redis: \"127.0.0.1:6379\"\n"     /* 10 */
	    "  on_redis_down: open\n"           /* 11: value at col 18 */
	    "  node: \"gw:a\"\n",               /* 12: value at col 9 */
	    2, want);
}

/* ---- tokens (issue 13) ---- */

#define TOKENS_HEAD "listen: \"127.0.0.1:8080\"\n" MINIMAL_UPSTREAMS_TENANTS

static void
test_tokens_budget_and_usage_keys(void **state)
{
	struct fx *f = *state;

	expect_ok(f, TOKENS_HEAD "    tokens_per_minute: 200000\n");
	assert_int_equal(f->cfg->tenants[0].tokens_per_minute, 200000);
	assert_int_equal(f->cfg->usage.enabled, 1);
	assert_int_equal(f->cfg->usage.inject, 1);
	sl_config_free(f->cfg);
	f->cfg = NULL;
	expect_ok(f, TOKENS_HEAD "usage:\n  inject: false\n");
	assert_int_equal(f->cfg->tenants[0].tokens_per_minute, 0);
	assert_int_equal(f->cfg->usage.enabled, 1);
	assert_int_equal(f->cfg->usage.inject, 0);
}

static void
test_tokens_bad_values_report_position(void **state)
{
	static const char *const want[] = {
		NAME ":9:24: tenants.acme.tokens_per_minute: -1 is out of range "
		"0-1000000000", NULL,
		NAME ":11:11: usage.inject: 'yes' must be true or false", NULL,
	};

	expect_errors(*state, TOKENS_HEAD
	    "    tokens_per_minute: -1\n"        /* 9: value at col 24 */
	    "usage:\n"                           /* 10 */
	    "  inject: yes\n",                   /* 11: value at col 11 */
	    2, want);
}

static void
test_tokens_budget_without_usage_is_refused(void **state)
{
	expect_error(*state, TOKENS_HEAD
	    "    tokens_per_minute: 1000\n"      /* 9 */
	    "usage:\n"                           /* 10 */
	    "  enabled: false\n",                /* 11: value at col 12 */
	    NAME ":11:12: usage.enabled: false, but tenant 'acme' has "
	    "tokens_per_minute 1000", "budgets need usage");
}

/* ---- models (issue 23) ----------------------------------------------- */

#define MODELS_UPSTREAMS                                                \
    "listen: \"127.0.0.1:8080\"\n"                                     \
    "upstreams:\n"                                                      \
    "  big:\n"                                                          \
    "    url: \"http://127.0.0.1:9000\"\n"                              \
    "  small:\n"                                                        \
    "    url: \"http://127.0.0.1:9001\"\n"

static void
test_models_section_loads_every_field(void **state)
{
	struct fx *f = *state;
	const struct sl_model_conf *m;
	int i;

	expect_ok(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  llama-70b:\n"
	    "    aliases: [\"gpt-4o\", \"default\"]\n"
	    "    targets:\n"
	    "      - upstream: big\n"
	    "        model: \"meta-llama/Llama-3.1-70B-Instruct\"\n"
	    "        weight: 90\n"
	    "      - upstream: small\n"
	    "        weight: 10\n"
	    "  llama-8b:\n"
	    "    targets: [{upstream: small}]\n"
	    "tenants:\n"
	    "  acme:\n"
	    "    keys: [\"k1\"]\n"
	    "    max_streams: 2\n"
	    "    models: [llama-8b]\n"
	    "  beta:\n"
	    "    keys: [\"k2\"]\n"
	    "    max_streams: 2\n"
	    "    upstream: small\n");
	assert_int_equal(f->cfg->nmodels, 2);
	m = &f->cfg->models[0];
	assert_string_equal(m->name, "llama-70b");
	assert_int_equal(m->naliases, 2);
	assert_string_equal(m->aliases[0], "gpt-4o");
	assert_string_equal(m->aliases[1], "default");
	assert_int_equal(m->ntargets, 2);
	assert_string_equal(m->targets[0].upstream, "big");
	assert_int_equal(m->targets[0].upstream_idx, 0);
	assert_string_equal(m->targets[0].model,
	    "meta-llama/Llama-3.1-70B-Instruct");
	assert_int_equal(m->targets[0].weight, 90);
	assert_int_equal(m->targets[1].upstream_idx, 1);
	assert_string_equal(m->targets[1].model, "llama-70b");
	assert_int_equal(m->targets[1].weight, 10);
	m = &f->cfg->models[1];
	assert_int_equal(m->naliases, 0);
	assert_int_equal(m->targets[0].weight, 1);
	assert_string_equal(m->targets[0].model, "llama-8b");
	/* The name table: names and aliases, nothing else, bytes compared. */
	assert_int_equal(sl_config_model_find(f->cfg, "llama-70b", 9), 0);
	assert_int_equal(sl_config_model_find(f->cfg, "gpt-4o", 6), 0);
	assert_int_equal(sl_config_model_find(f->cfg, "default", 7), 0);
	assert_int_equal(sl_config_model_find(f->cfg, "llama-8b", 8), 1);
	assert_int_equal(sl_config_model_find(f->cfg, "llama-8", 7), -1);
	assert_int_equal(sl_config_model_find(f->cfg, "llama-8b\0", 9), -1);
	assert_int_equal(sl_config_model_find(f->cfg,
	    "meta-llama/Llama-3.1-70B-Instruct", 33), -1);
	/* acme: no upstream (allowed with models:), one model allowed. */
	assert_int_equal(f->cfg->tenants[0].has_upstream, 0);
	assert_non_null(f->cfg->tenants[0].allowed);
	assert_int_equal(f->cfg->tenants[0].nallowed, 1);
	assert_int_equal(f->cfg->tenants[0].allowed[0], 1);
	assert_false(sl_tenant_allows(&f->cfg->tenants[0], 0));
	assert_true(sl_tenant_allows(&f->cfg->tenants[0], 1));
	assert_true(sl_tenant_allows(&f->cfg->tenants[1], 0));
	assert_int_equal(f->cfg->tenants[1].has_upstream, 1);
	assert_int_equal(f->cfg->tenants[1].upstream_idx, 1);
	assert_null(f->cfg->tenants[1].allowed);
	for (i = 0; i < 2; i++)
		assert_true(f->cfg->loaded_at > 0);
}

static void
test_models_absent_keeps_tenant_upstream_rules(void **state)
{
	struct fx *f = *state;

	expect_ok(f, "listen: \"127.0.0.1:8080\"\n" MINIMAL_UPSTREAMS_TENANTS);
	assert_null(f->cfg->models);
	assert_int_equal(f->cfg->nmodels, 0);
	assert_int_equal(f->cfg->tenants[0].has_upstream, 1);
	assert_int_equal(sl_config_model_find(f->cfg, "x", 1), -1);
	/* Two upstreams, no models:, a tenant without upstream: refused. */
	expect_error(f, MODELS_UPSTREAMS
	    "tenants:\n"
	    "  acme:\n"                 /* line 8 */
	    "    keys: [\"k1\"]\n"      /* line 9, col 5 */
	    "    max_streams: 2\n",
	    NAME ":9:5: ", "tenant 'acme': missing key 'upstream'");
}

#define MODELS_TENANT                                                   \
    "tenants:\n"                                                        \
    "  acme:\n"                                                         \
    "    keys: [\"k1\"]\n"                                              \
    "    max_streams: 2\n"

static void
test_models_errors_report_their_position(void **state)
{
	struct fx *f = *state;

	/* Line 7 is "models:", 8 the first model. */
	expect_error(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  m1:\n"
	    "    targets: [{upstream: nope}]\n" MODELS_TENANT,
	    NAME ":9:26: ", "models.m1.targets[0].upstream: no upstream named 'nope'");
	expect_error(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  m1:\n"
	    "    targets: []\n" MODELS_TENANT,
	    NAME ":9:14: ", "models.m1.targets: must hold at least one target");
	expect_error(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  m1:\n"
	    "    aliases: [a]\n" MODELS_TENANT,
	    NAME ":9:5: ", "model 'm1': missing required key 'targets'");
	expect_error(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  m1:\n"
	    "    targets: [{upstream: big, weight: 1001}]\n" MODELS_TENANT,
	    NAME ":9:39: ", "models.m1.targets[0].weight: 1001 is out of range 1-1000");
	expect_error(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  m1:\n"
	    "    targets: [{upstream: big, weight: 0}]\n" MODELS_TENANT,
	    NAME ":9:39: ", "out of range 1-1000");
	expect_error(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  m1:\n"
	    "    targets: [{upstream: big}]\n"
	    "    fallback: [m1]\n" MODELS_TENANT,
	    NAME ":10:16: ", "models.m1.fallback: 'm1' makes a cycle of fallbacks");
	expect_error(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  m1:\n"
	    "    targets: [{upstream: big}]\n"
	    "    fallback: [m2, nope]\n"
	    "  m2:\n"
	    "    targets: [{upstream: big}]\n" MODELS_TENANT,
	    NAME ":10:20: ", "models.m1.fallback: no model named 'nope'");
	expect_error(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  m1:\n"
	    "    targets: [{upstream: big, port: 1}]\n" MODELS_TENANT,
	    NAME ":9:31: ", "unknown key 'port' in models.m1.targets[0]");
	expect_error(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  m1:\n"
	    "    targets: [{model: x}]\n" MODELS_TENANT,
	    NAME ":9:15: ", "models.m1.targets[0]: missing required key 'upstream'");
	expect_error(f, MODELS_UPSTREAMS
	    "models: {}\n" MODELS_TENANT,
	    NAME ":7:9: ", "models: at least one is required");
}

static void
test_models_alias_clash_is_reported_where_it_is(void **state)
{
	struct fx *f = *state;
	static const char *const want[] = {
		NAME ":10:21: ", "models.m1.aliases: 'm1' is already the name or an alias of model 'm1'",
		NAME ":13:15: ", "models.m2.aliases: 'a' is already the name or an alias of model 'm1'",
		NAME ":14:3: ", "models: 'b' is already the name or an alias of model 'm1'",
	};

	expect_errors(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  m1:\n"                                  /* 8 */
	    "    targets: [{upstream: big}]\n"         /* 9 */
	    "    aliases: [a, b, m1]\n"                /* 10: m1 at col 21 */
	    "  m2:\n"                                  /* 11 */
	    "    targets: [{upstream: big}]\n"         /* 12 */
	    "    aliases: [a]\n"                       /* 13: a at col 15 */
	    "  b:\n"                                   /* 14 */
	    "    targets: [{upstream: big}]\n"         /* 15 */
	    MODELS_TENANT, 3, want);
}

static void
test_models_tenant_list_names_models(void **state)
{
	struct fx *f = *state;
	static const char *const want[] = {
		NAME ":15:14: ", "tenants.acme.models: no model named 'nope'",
		NAME ":15:20: ", "tenants.acme.models: 'a' is an alias of model 'm1'",
	};

	expect_errors(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  m1:\n"
	    "    targets: [{upstream: big}]\n"
	    "    aliases: [a]\n"
	    MODELS_TENANT
	    "    models: [nope, a, m1]\n", 2, want);
	expect_error(f, "listen: \"127.0.0.1:8080\"\n" MINIMAL_UPSTREAMS_TENANTS
	    "    models: [m1]\n",
	    NAME ":9:14: ", "tenants.acme.models: no model named 'm1' (there is no models: section)");
}

static void
test_models_fallback_resolves_aliases_and_refuses_cycles(void **state)
{
	struct fx *f = *state;
	static const char *const want[] = {
		NAME ":16:16: ", "models.c.fallback: 'a' makes a cycle of fallbacks",
	};

	expect_ok(f, MODELS_UPSTREAMS
	    "models:\n"
	    "  a:\n"
	    "    targets: [{upstream: big}]\n"
	    "    fallback: [bee, c]\n"
	    "  b:\n"
	    "    aliases: [bee]\n"
	    "    targets: [{upstream: small}]\n"
	    "    fallback: [c]\n"
	    "  c:\n"
	    "    targets: [{upstream: small}]\n" MODELS_TENANT);
	assert_int_equal(f->cfg->models[0].nfallback, 2);
	assert_int_equal(f->cfg->models[0].fallback[0], 1);
	assert_int_equal(f->cfg->models[0].fallback[1], 2);
	assert_int_equal(f->cfg->models[1].nfallback, 1);
	assert_int_equal(f->cfg->models[2].nfallback, 0);
	/* a -> b -> c -> a: reported where c names a (line 16, col 16). */
	expect_errors(f, MODELS_UPSTREAMS
	    "models:\n"                          /* 7 */
	    "  a:\n"                             /* 8 */
	    "    targets: [{upstream: big}]\n"   /* 9 */
	    "    fallback: [b]\n"                /* 10 */
	    "  b:\n"                             /* 11 */
	    "    targets: [{upstream: small}]\n" /* 12 */
	    "    fallback: [c]\n"                /* 13 */
	    "  c:\n"                             /* 14 */
	    "    targets: [{upstream: small}]\n" /* 15 */
	    "    fallback: [a]\n"                /* 16 */
	    MODELS_TENANT, 1, want);
}

int
main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_sample_config_loads_every_field),
		T(test_omitted_keys_take_defaults),
		T(test_explicit_values_and_second_upstream_index),
		T(test_access_log_off_is_null),
		T(test_workers_bounds_accepted),
		T(test_load_file_reads_sample),
		T(test_load_file_missing_reports_path),
		T(test_unknown_top_level_key_reports_line),
		T(test_unknown_timeouts_key_reports_line),
		T(test_unknown_limits_key_reports_line),
		T(test_unknown_tenant_key_reports_line),
		T(test_unknown_upstream_key_reports_line),
		T(test_dotted_top_level_key_is_unknown),
		T(test_wildcard_key_path_is_unknown),
		T(test_mapping_where_scalar_expected_reports_value),
		T(test_flow_mapping_where_scalar_expected_reports_value),
		T(test_scalar_where_list_expected_reports_value),
		T(test_scalar_where_mapping_expected_reports_value),
		T(test_list_where_mapping_expected_reports_value),
		T(test_empty_value_for_required_scalar_is_null),
		T(test_bad_size_reports_value),
		T(test_bad_nested_size_reports_value),
		T(test_bad_duration_reports_value),
		T(test_duration_without_unit_is_rejected),
		T(test_non_integer_max_streams_reports_value),
		T(test_bad_log_level_reports_value),
		T(test_negative_max_streams_out_of_range),
		T(test_max_streams_above_range),
		T(test_stream_buffer_below_minimum_out_of_range),
		T(test_socket_buffer_above_range),
		T(test_workers_zero_out_of_range),
		T(test_workers_65_out_of_range),
		T(test_retry_after_zero_out_of_range),
		T(test_max_header_bytes_above_range),
		T(test_zero_client_header_timeout_out_of_range),
		T(test_duplicate_top_level_key_reports_line),
		T(test_duplicate_key_within_tenant_reports_line),
		T(test_duplicate_tenant_name_reports_line),
		T(test_alias_use_reports_alias_position),
		T(test_alias_of_tenant_keys_is_one_error),
		T(test_alias_is_rejected_even_if_otherwise_valid),
		T(test_missing_top_level_required_keys_all_reported),
		T(test_missing_listen_reported),
		T(test_missing_tenant_keys_and_max_streams),
		T(test_missing_tenant_keys_only),
		T(test_empty_upstreams_and_tenants_rejected),
		T(test_empty_tenant_key_list_rejected),
		T(test_tenant_key_with_space_rejected),
		T(test_tenant_naming_unknown_upstream),
		T(test_tenant_without_upstream_when_several),
		T(test_key_shared_by_two_tenants_reports_second_use),
		T(test_key_shared_by_two_tenants_is_rejected),
		T(test_key_repeated_within_one_tenant_is_rejected),
		T(test_invalid_listen_address_reports_value),
		T(test_valid_listen_addresses_accepted),
		T(test_invalid_admin_listen_reports_value),
		T(test_upstream_url_scheme_checked),
		T(test_upstream_url_with_query_rejected),
		T(test_queue_keys_default_and_parse),
		T(test_tenant_weight_and_priority_parse),
		T(test_queue_errors_name_file_line_col),
		T(test_tenant_weight_priority_out_of_range),
		T(test_url_alone_is_a_pool_of_one_with_defaults),
		T(test_pool_parses_every_field),
		T(test_pool_without_health_or_eject_takes_defaults),
		T(test_empty_health_mapping_enables_the_probe_with_defaults),
		T(test_balance_and_retry_on_words),
		T(test_upstream_without_url_or_replicas_rejected),
		T(test_pool_empty_replicas_list_rejected),
		T(test_pool_url_and_replicas_both_rejected_at_the_second),
		T(test_pool_more_than_64_replicas_rejected_at_the_65th),
		T(test_pool_duplicate_url_after_slash_stripping_reported_at_the_second),
		T(test_pool_same_url_in_two_upstreams_is_allowed),
		T(test_pool_values_out_of_range_rejected),
		T(test_pool_max_streams_and_duration_upper_bounds),
		T(test_pool_unknown_balance_and_retry_on_words_rejected),
		T(test_pool_unknown_keys_rejected_everywhere),
		T(test_pool_replica_entry_must_be_a_mapping_with_a_url),
		T(test_pool_replicas_must_be_a_list),
		T(test_health_timeout_not_below_interval_rejected),
		T(test_health_path_must_be_a_clean_absolute_path),
		T(test_aliased_replica_is_one_error_not_a_duplicate),
		T(test_syntax_error_reports_problem_position),
		T(test_bad_indentation_reports_problem_position),
		T(test_unclosed_flow_sequence_reports_problem_position),
		T(test_empty_document_rejected),
		T(test_non_mapping_document_rejected),
		T(test_second_document_rejected),
		T(test_several_problems_all_reported),
		T(test_errors_print_one_line_each),
		T(test_parse_size_valid_forms),
		T(test_parse_size_rejects_invalid),
		T(test_parse_duration_valid_forms),
		T(test_parse_duration_rejects_invalid),
		T(test_key_table_paths_unique),
		T(test_key_table_rows_have_help),
		T(test_key_table_lists_every_sample_key),
		T(test_key_table_defaults_parse_as_their_type),
		T(test_nesting_deeper_than_32_levels_is_rejected_where_it_starts),
		T(test_non_utf8_byte_reports_its_own_line_and_column),
		T(test_tenant_key_with_control_character_rejected),
		T(test_empty_tenant_name_rejected),
		T(test_100k_keys_load_and_each_repeat_is_reported_once),
		T(test_load_file_refuses_what_is_not_a_regular_file),
		T(test_load_file_reports_an_access_log_it_cannot_open),
		T(test_permission_warning_names_a_file_readable_by_others),
		T(test_cluster_section_loads_every_field),
		T(test_cluster_defaults_and_absence),
		T(test_cluster_heartbeat_over_a_third_of_lease_ttl_reports_value),
		T(test_cluster_redis_host_name_is_refused),
		T(test_cluster_sentinels_load),
		T(test_cluster_redis_and_sentinels_exactly_one),
		T(test_cluster_sentinels_bad_entries_report_position),
		T(test_cluster_bad_on_redis_down_and_node_report_value),
		T(test_tokens_budget_and_usage_keys),
		T(test_tokens_bad_values_report_position),
		T(test_tokens_budget_without_usage_is_refused),
		T(test_models_section_loads_every_field),
		T(test_models_absent_keeps_tenant_upstream_rules),
		T(test_models_errors_report_their_position),
		T(test_models_alias_clash_is_reported_where_it_is),
		T(test_models_tenant_list_names_models),
		T(test_models_fallback_resolves_aliases_and_refuses_cycles),
	};
#undef T

	return sl_unit_run(tests);
}
